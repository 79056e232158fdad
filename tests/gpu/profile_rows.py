"""Runs one bench row's model a few times, compiled by kiln or by Inductor,
for a profiler (ncu) to read: `python3 tests/gpu/profile_rows.py ROW DTYPE
MODE BACKEND` with MODE inference or training and BACKEND kiln or inductor.
Needs KILN_SERVER for kiln."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import profile_kernels  # noqa: E402


def main():
    name, dtype, mode, which = sys.argv[1:5]
    training = mode == "training"
    fn, _, xs = profile_kernels.prepared(name, getattr(torch, dtype), training, which)
    for _ in range(3):
        profile_kernels.step(fn, xs, training)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
