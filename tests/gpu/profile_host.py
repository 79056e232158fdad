"""Where a bench row's time per call goes on the host side: each way of
calling the row's inference graph timed two ways, the GPU idle when a call
starts (CUDA events around one call, synchronized after it, as the bench
times a row) and the host's own time for the call; and the kernels' time
with calls back to back (the host ahead of the GPU).

    KILN_SERVER=... python3 tests/gpu/profile_host.py ROW:DTYPE:inference...

The ways: kiln's compiled module (Dynamo's guards and frame, kiln's
callable, the plan), Inductor's, Dynamo with backend="eager", the module
itself, and kiln's graph callable and its plan runner called directly with
the plan's inputs. Medians over 200 calls.
"""

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "bench"))
import cuda_bench  # noqa: E402

import kiln  # noqa: E402


def event_time(fn, reps=200):
    """(median us between CUDA events around one call, median host us)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    gpu, host = [], []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t) * 1e6)
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end) * 1000)
    return statistics.median(gpu), statistics.median(host)


def back_to_back(fn, calls=50):
    """Microseconds per call of `calls` calls issued back to back (best of 5)."""
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return min(times)


def row(spec):
    name, dtype_name, _ = spec.split(":")
    dtype = getattr(torch, dtype_name)
    factory, shapes = cuda_bench.MODELS[name]
    torch.manual_seed(0)
    model = factory().to("cuda", dtype).eval()
    xs = [torch.randn(s, device="cuda", dtype=dtype) for s in shapes]
    with torch.no_grad():
        backend = kiln.backend(os.environ["KILN_SERVER"], on_unavailable="raise", timeout=600,
                               tiered=False)
        torch._dynamo.reset()
        kiln_fn = torch.compile(model, backend=backend, dynamic=False)
        kiln_fn(*xs)
        graph = backend.loaded[0]
        runner = graph._forward
        inductor = torch.compile(model, dynamic=False)
        inductor(*xs)
        dynamo = torch.compile(model, backend="eager", dynamic=False)
        dynamo(*xs)
        # The plan's inputs as kiln's callable passes them.
        primals = []
        run = runner._run

        def keep(inputs):
            primals[:] = list(inputs)
            return run(inputs)

        runner._run = keep
        kiln_fn(*xs)
        runner._run = run
        ways = {"kiln": lambda: kiln_fn(*xs), "inductor": lambda: inductor(*xs),
                "dynamo eager": lambda: dynamo(*xs), "module eager": lambda: model(*xs),
                "kiln graph callable": lambda: graph(primals),
                "kiln plan runner": lambda: runner._run(primals)}
        ours, theirs = back_to_back(ways["kiln"]), back_to_back(ways["inductor"])
        print(f"== {spec}: {len(primals)} plan inputs; kernels back to back: kiln "
              f"{ours:.1f} us, Inductor {theirs:.1f} us")
        for label, fn in ways.items():
            gpu, host = event_time(fn)
            print(f"  {label:20s} call (events) {gpu:8.1f} us   host {host:7.1f} us")


def main():
    cuda_bench.full_float32()
    for spec in sys.argv[1:]:
        row(spec)


if __name__ == "__main__":
    main()
