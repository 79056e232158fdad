"""Where the host's time goes when the kiln backend runs a model on the GPU:
cProfile over 20 steps (after warm-up) of one model of tests/bench/cuda_bench.py.

    KILN_SERVER=... python3 tests/gpu/profile_overhead.py [MODEL] [inference|training] [dtype]
"""

import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "bench"))
import cuda_bench  # noqa: E402

import kiln  # noqa: E402


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "mlp_gelu"
    training = (sys.argv[2] if len(sys.argv) > 2 else "training") == "training"
    dtype = getattr(torch, sys.argv[3] if len(sys.argv) > 3 else "bfloat16")
    factory, shapes = cuda_bench.MODELS[name]
    model = factory().to("cuda", dtype)
    if not training:
        model.eval()  # as the bench's inference rows
    inputs = [torch.randn(s, device="cuda", dtype=dtype).requires_grad_(training) for s in shapes]
    backend = kiln.backend(os.environ.get("KILN_SERVER"), on_unavailable="raise", timeout=600,
                           tiered=False)
    fn = torch.compile(model, backend=backend)

    def step():
        if training:
            fn(*inputs).float().sum().backward()
        else:
            with torch.no_grad():
                fn(*inputs)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        step()
    host = (time.perf_counter() - start) / 20
    torch.cuda.synchronize()
    total = (time.perf_counter() - start) / 20
    print(f"{name} {'training' if training else 'inference'} {dtype}: host {host * 1e3:.3f} ms "
          f"per step, with the GPU's tail {total * 1e3:.3f} ms")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    if os.environ.get("KILN_TRACE"):
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        prof.export_chrome_trace(os.environ["KILN_TRACE"])


if __name__ == "__main__":
    main()
