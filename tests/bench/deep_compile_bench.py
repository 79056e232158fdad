"""What compiling kernels of the same code once saves: the cuda compile of
GPT-2-style stacks of N blocks (inference and training), with kernel
sharing and without, NVRTC included, on a machine with no GPU.

    .venv/bin/python tests/bench/deep_compile_bench.py [--layers 1,4,12]
        [--jobs 1,2] [--dump build/bin/kiln_dump_code]

Per stack and setting, kiln_dump_code --target=cuda --compile runs the
kiln backend's whole compile as kilnd does (lower, fuse, plan, generate,
NVRTC into sm_90 CUBINs; a training graph's two halves), in a fresh process
each time; the table gives its wall time (the median of --repeats runs),
the native-compile phase summed over the graph's halves, and the kernels
launched and compiled. Graphs are captured here on the CPU; kiln_dump_code
moves them to the GPU device type.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from google.protobuf import json_format

import kiln
from kiln.v1 import service_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "gpu"))
from test_cuda import Block  # noqa: E402


def capture(layers, training, out_dir):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block(256) for _ in range(layers)])
    model.requires_grad_(training)
    x = torch.randn(2, 128, 256, requires_grad=training)
    graph = kiln.capture(model, x)
    path = os.path.join(out_dir, f"gpt2_{layers}_{'training' if training else 'inference'}.json")
    with open(path, "w") as f:
        f.write(json_format.MessageToJson(service_pb2.GraphFile(graph=graph)))
    return path


def compile_once(dump, path, jobs, share, out_dir):
    cmd = [dump, "--target=cuda", "--compile", "--times", f"--compile_jobs={jobs}",
           f"--share_kernels={'true' if share else 'false'}", f"--out={out_dir}", path]
    start = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    native = sum(float(m) for m in re.findall(r"phase \S*native-compile ([\d.]+) ms", run.stdout))
    counts = [tuple(map(int, m)) for m in
              re.findall(r"kernels launched (\d+) compiled (\d+)", run.stdout)]
    launched = sum(c[0] for c in counts)
    compiled = sum(c[1] for c in counts)
    return wall, native / 1000, launched, compiled


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", default="1,4,12")
    parser.add_argument("--jobs", default="1,2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dump", default=os.path.join(HERE, os.pardir, os.pardir, "build", "bin",
                                                       "kiln_dump_code"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # NVRTC and the binary from a cold disk, before anything is timed.
        compile_once(args.dump, capture(1, False, tmp), 1, True, tmp)
        for layers in [int(n) for n in args.layers.split(",")]:
            for training in (False, True):
                path = capture(layers, training, tmp)
                for jobs in [int(j) for j in args.jobs.split(",")]:
                    for share in (True, False):
                        runs = [compile_once(args.dump, path, jobs, share, tmp)
                                for _ in range(args.repeats)]
                        wall = statistics.median(r[0] for r in runs)
                        native = statistics.median(r[1] for r in runs)
                        _, _, launched, compiled = runs[0]
                        rows.append((layers, "training" if training else "inference", jobs,
                                     "on" if share else "off", launched, compiled, wall, native))
                        print(rows[-1], flush=True)
    print("\n| blocks | mode | jobs | sharing | kernels launched | kernels compiled "
          "| compile wall s | of it NVRTC s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %d | %s | %d | %s | %d | %d | %.2f | %.2f |" % r)


if __name__ == "__main__":
    main()
