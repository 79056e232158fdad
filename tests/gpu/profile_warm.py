"""Where a bench row's warm start goes: the row compiled once (kilnd's cache
filled), then started again REPS times, each after torch._dynamo.reset()
with a new backend on the same kilnd, as cuda_bench.py's warm start is. For
each start: the first call's time, and the backend's own phases per graph
(lowering, kilnd's verification and key of the graph, the rest of the
lookup round trip, loading) in milliseconds.

    KILN_SERVER=... python3 tests/gpu/profile_warm.py ROW:DTYPE:MODE... [--reps N]

The first start after the compile is the bench's warm start; the later ones
show what a job's further processes see.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import profile_kernels  # noqa: E402
from profile_kernels import cuda_bench  # noqa: E402

import kiln  # noqa: E402

PHASES = ("lower", "key", "lookup", "load")


def warm_starts(row, dtype, training, reps):
    fn, _, xs = profile_kernels.prepared(row, dtype, training, "kiln")
    cuda_bench.first_call(fn, xs, training)
    model = fn._orig_mod
    server = os.environ["KILN_SERVER"]
    for rep in range(reps):
        torch._dynamo.reset()
        backend = kiln.backend(server, on_unavailable="raise", timeout=600)
        warm = torch.compile(model, backend=backend, dynamic=False)
        ms = cuda_bench.first_call(warm, xs, training)
        graphs = max(len(backend.graph_times), 1)
        own = {p: sum(r[p] for r in backend.graph_times) * 1000 / graphs for p in PHASES}
        print(f"{row} {dtype} {'training' if training else 'inference'} start {rep}: "
              f"first call {ms:.0f} ms; per graph: own {sum(own.values()):.1f} ms (" +
              ", ".join(f"{p} {v:.1f}" for p, v in own.items()) + ")", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="+",
                        help="ROW:DTYPE:MODE, e.g. gpt2_6_blocks:float32:training")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    for spec in args.rows:
        warm_starts(*profile_kernels.parse_row(spec), args.reps)


if __name__ == "__main__":
    main()
