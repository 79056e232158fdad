"""Where a bench row's time per call goes besides its kernels, kiln's against
Inductor's: per call (the GPU idle when it starts, as the bench times it),
the host's time to the first kernel, the GPU's idle gaps between the first
kernel and the last, the kernels' own time, and the host's time for the
whole call.

    KILN_SERVER=... python3 tests/gpu/profile_latency.py ROW:DTYPE:MODE... [--calls N]

The times come from one torch.profiler trace (CPU and CUDA activity) of N
calls, each under a record_function of its own and synchronized after it;
the medians over the calls are printed.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import profile_kernels  # noqa: E402

GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


def calls(trace, n):
    """Per call: (host us to the first GPU work, GPU idle us between the first
    work and the last, GPU work us, host us for the call)."""
    events = trace["traceEvents"]
    marks = sorted((e for e in events if e.get("cat") == "user_annotation"
                    and e.get("name", "").startswith("kiln_call_")), key=lambda e: e["ts"])
    work = sorted((e for e in events if e.get("cat") in GPU_WORK), key=lambda e: e["ts"])
    out = []
    for k, mark in enumerate(marks[:n]):
        begin = mark["ts"]
        end = marks[k + 1]["ts"] if k + 1 < len(marks) else float("inf")
        mine = [e for e in work if begin <= e["ts"] < end]
        if not mine:
            continue
        busy = sum(e.get("dur", 0) for e in mine)
        span = max(e["ts"] + e.get("dur", 0) for e in mine) - mine[0]["ts"]
        out.append((mine[0]["ts"] - begin, span - busy, busy, mark.get("dur", 0)))
    return out


def latency(row, dtype, training, which, n):
    fn, _, xs = profile_kernels.prepared(row, dtype, training, which)
    for _ in range(5):
        profile_kernels.step(fn, xs, training)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for k in range(n):
            with record_function(f"kiln_call_{k}"):
                profile_kernels.step(fn, xs, training)
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    torch._dynamo.reset()
    return calls(trace, n)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("rows", nargs="+")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    print("row | backend | host to first GPU work us | GPU idle between us | GPU work us | "
          "host per call us")
    for spec in args.rows:
        row, dtype, training = profile_kernels.parse_row(spec)
        for which in ("kiln", "inductor"):
            per_call = latency(row, dtype, training, which, args.calls)
            medians = [statistics.median(c[i] for c in per_call) for i in range(4)]
            print(f"{spec} | {which} | " + " | ".join(f"{m:.1f}" for m in medians))


if __name__ == "__main__":
    main()
