"""Bytes saved between forward and backward: functorch's min-cut partitioner
(torch.compile's AOTAutograd) against kiln's, on the functions that
tests/data/capture_graphs.py captures.

Run where a recent torch is installed (torch 2.x; the numbers in
docs/benchmarks.md come from the GPU machine's torch 2.11), from the
repository root, with a bundle of kiln_saved_bytes (deploy/bundle.sh):

    PYTHONPATH=client/python:build/python:tests/data python3 \
        tests/bench/gpu/partition_vs_functorch.py --kiln=bundle/bin/kiln_saved_bytes --out=DIR

For each function it reports, on CPU tensors:
  functorch_min_cut   the backward graph's non-tangent inputs under
                      min_cut_rematerialization_partition
  functorch_default   the same under default_partition (saves what is read)
  kiln_min_cut        kiln's partitioner on the graph kiln.capture takes
                      under this same torch (if the capture works here)
Sizes are bytes: numel * element size of each saved tensor.
"""

import argparse
import json
import os
import subprocess
import sys

import torch
from torch._functorch.aot_autograd import aot_function
from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition
from torch.func import functional_call

import capture_graphs


def saved_bytes(fn, inputs, partition_fn):
    """Bytes of the backward graph's inputs that are not tangents."""
    seen = {}

    def fw_compiler(gm, example_inputs):
        return gm

    def bw_compiler(gm, example_inputs):
        total = 0
        for node in gm.graph.nodes:
            if node.op != "placeholder" or node.name.startswith("tangents"):
                continue
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                total += val.numel() * val.element_size()
        seen["bytes"] = total
        return gm

    compiled = aot_function(fn, fw_compiler=fw_compiler, bw_compiler=bw_compiler,
                            partition_fn=partition_fn)
    out = compiled(*inputs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    loss = sum(o.float().sum() for o in outs if o.requires_grad)
    if not isinstance(loss, torch.Tensor):
        return None  # nothing needs a gradient
    loss.backward()
    return seen.get("bytes")


def functional(fn, inputs):
    """(function of tensors only, its inputs): a module's parameters and
    buffers become leading inputs, parameters requiring grad."""
    if not isinstance(fn, torch.nn.Module):
        return fn, list(inputs)
    params = dict(fn.named_parameters())
    buffers = dict(fn.named_buffers())
    names = list(params) + list(buffers)

    def call(*args):
        state = dict(zip(names, args[:len(names)]))
        return functional_call(fn, state, tuple(args[len(names):]))

    tensors = [p.detach().clone().requires_grad_(p.requires_grad) for p in params.values()]
    tensors += [b.detach().clone() for b in buffers.values()]
    return call, tensors + list(inputs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", help="kiln_saved_bytes binary")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(os.path.join(args.out, "graphs"), exist_ok=True)

    rows = []
    for name, fn, inputs in capture_graphs.cases():
        row = {"graph": name}
        f, tensors = functional(fn, inputs)
        for label, part in (("functorch_min_cut", min_cut_rematerialization_partition),
                            ("functorch_default", default_partition)):
            try:
                fresh = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
                row[label] = saved_bytes(f, fresh, part)
            except Exception as e:  # report, keep going
                row[label] = f"error: {type(e).__name__}: {e}"[:200]
        try:
            import kiln
            from google.protobuf import json_format
            from kiln.v1 import service_pb2
            graph = kiln.capture(fn, *inputs)
            with open(os.path.join(args.out, "graphs", name), "w") as fh:
                fh.write(json_format.MessageToJson(service_pb2.GraphFile(graph=graph)))
        except Exception as e:
            row["kiln_capture"] = f"error: {type(e).__name__}: {e}"[:200]
        rows.append(row)

    if args.kiln:
        res = subprocess.run([args.kiln, "--json", os.path.join(args.out, "graphs")],
                             capture_output=True, text=True)
        if res.returncode == 0:
            for entry in json.loads(res.stdout):
                for row in rows:
                    if row["graph"] == entry["graph"]:
                        row["kiln_min_cut"] = entry["min_cut_bytes"]
                        row["kiln_save_all"] = entry["save_all_bytes"]
        else:
            print("kiln_saved_bytes failed:", res.stderr[-2000:], file=sys.stderr)

    print(f"torch {torch.__version__}")
    print(json.dumps(rows, indent=1))
    with open(os.path.join(args.out, "partition_vs_functorch.json"), "w") as fh:
        json.dump({"torch": torch.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
