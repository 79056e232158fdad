"""Runs one bench row's model a few times, compiled by kiln or by Inductor,
for a profiler (ncu) to read: `python3 tests/gpu/profile_rows.py ROW DTYPE
MODE BACKEND` with MODE inference or training and BACKEND kiln or inductor.
Needs KILN_SERVER for kiln."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import cuda_bench  # noqa: E402

import kiln  # noqa: E402


def main():
    name, dtype, mode, which = sys.argv[1:5]
    dtype = getattr(torch, dtype)
    training = mode == "training"
    factory, shapes = cuda_bench.MODELS[name]
    torch.manual_seed(0)
    model = factory().to("cuda", dtype)
    if not training:
        model.eval()
    xs = [torch.randn(s, device="cuda", dtype=dtype).requires_grad_(training) for s in shapes]
    if which == "kiln":
        backend = kiln.backend(os.environ["KILN_SERVER"], on_unavailable="raise", timeout=600)
        fn = torch.compile(model, backend=backend)
    else:
        fn = torch.compile(model)
    for _ in range(3):
        if training:
            fn(*xs).float().sum().backward()
        else:
            with torch.no_grad():
                fn(*xs)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
