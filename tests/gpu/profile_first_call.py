"""Where the host time of a bench row's first call goes (the cold compile),
under cProfile: Dynamo's tracing, the kiln backend (lowering, kilnd, loading)
and the first run, by cumulative time.

    KILN_SERVER=... python3 tests/gpu/profile_first_call.py ROW:DTYPE:MODE... [--top N]

Each row is compiled twice, the second time after torch._dynamo.reset()
with kilnd's cache warm: the first profile is the cold compile, the second
what remains of it when kilnd compiles nothing.
"""

import argparse
import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import profile_kernels  # noqa: E402


def first_call(row, dtype, training, top):
    for label in ("cold", "warm"):
        torch._dynamo.reset()
        fn, _, xs = profile_kernels.prepared(row, dtype, training, "kiln")
        torch.cuda.synchronize()
        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.enable()
        profile_kernels.step(fn, xs, training)
        torch.cuda.synchronize()
        profiler.disable()
        ms = (time.perf_counter() - start) * 1000
        print(f"\n=== {row} {dtype} {'training' if training else 'inference'} kiln, {label}: "
              f"first call {ms:.1f} ms")
        stats = pstats.Stats(profiler)
        stats.sort_stats("cumulative").print_stats(top)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("rows", nargs="+")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    for spec in args.rows:
        first_call(*profile_kernels.parse_row(spec), args.top)


if __name__ == "__main__":
    main()
