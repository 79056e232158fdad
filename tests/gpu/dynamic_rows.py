"""Row kernels (and a transpose) compiled for symbolic sizes against the same
kernels compiled static: steady-state time of kiln (dynamic=True and
dynamic=False) on one GPU, CUDA events, median of 20 after warm-up.

    KILN_SERVER=... python3 tests/gpu/dynamic_rows.py [dtype]
"""

import os
import statistics
import sys

import torch

import kiln


def timed(fn, x):
    for _ in range(5):
        fn(x)
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(x)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
    cases = {
        "softmax": lambda x: torch.softmax(x, -1),
        "layer_norm": lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:]),
        "sum_rows": lambda x: x.sum(-1),
    }
    cases["broadcast_transpose"] = lambda x: x.t() * 2.0 + x[0]
    for name, fn in cases.items():
        shape = (8192, 8192) if name == "broadcast_transpose" else (16384, 4096)
        x = torch.randn(*shape, device="cuda", dtype=dtype)
        row = {}
        for dynamic in (False, True):
            torch._dynamo.reset()
            backend = kiln.backend(os.environ.get("KILN_SERVER"), on_unavailable="raise")
            compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
            with torch.no_grad():
                torch.testing.assert_close(compiled(x).float(), fn(x).float(), rtol=2e-2,
                                           atol=2e-2)
                row["dynamic" if dynamic else "static"] = timed(compiled, x)
        print(f"{name} {dtype}: static {row['static']:.3f} ms, dynamic {row['dynamic']:.3f} ms")


if __name__ == "__main__":
    main()
