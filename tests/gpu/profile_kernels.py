"""Where the GPU time of a bench row goes, kiln's against Inductor's: the
kernels of 10 steps (after warm-up) under torch.profiler, summed by name.

    KILN_SERVER=... python3 tests/gpu/profile_kernels.py ROW:DTYPE:MODE... [--top N]
        [--traces DIR] [--backends kiln,inductor,eager]

MODE is inference or training. Prints, per row and backend, the total device
time per step and the kernels that take most of it, with their launches per
step and their time per step. With --traces, kiln's compile traces of each
row (fusion decisions and kernels, by the names the profile shows) are
written under DIR/ROW.DTYPE.MODE/.
"""

import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "bench"))
import cuda_bench  # noqa: E402

import kiln  # noqa: E402

STEPS = 10


def compiled(model, which):
    """`model` compiled by `which` (itself for eager), and kiln's backend
    (None for the others)."""
    if which == "kiln":
        backend = kiln.backend(os.environ["KILN_SERVER"], on_unavailable="raise", timeout=600,
                               tiered=False)
        return torch.compile(model, backend=backend, dynamic=False), backend
    if which == "eager":
        return model, None
    return torch.compile(model, dynamic=False), None


def step(fn, xs, training):
    if training:
        fn(*xs).float().sum().backward()
    else:
        with torch.no_grad():
            fn(*xs)


def parse_row(spec):
    """ROW:DTYPE:MODE (gpt2_block:bfloat16:training) -> (row, torch dtype,
    whether training)."""
    row, dtype, mode = spec.split(":")
    return row, getattr(torch, dtype), mode == "training"


def prepared(row, dtype, training, which):
    """Bench row `row`'s model compiled by `which` (kiln or inductor), and
    random inputs for it, under the bench's float32 precision."""
    cuda_bench.full_float32()
    factory, shapes = cuda_bench.MODELS[row]
    torch.manual_seed(0)
    model = factory().to("cuda", dtype)
    if not training:
        model.eval()
    xs = [torch.randn(s, device="cuda", dtype=dtype).requires_grad_(training) for s in shapes]
    fn, backend = compiled(model, which)
    return fn, backend, xs


def write_traces(backend, directory):
    """The compile traces of the artifacts `backend` loaded, a file each."""
    os.makedirs(directory, exist_ok=True)
    for k, fn in enumerate(backend.loaded):
        for name, text in fn.artifact.trace.items():
            with open(os.path.join(directory, f"{k}.{name}"), "w") as f:
                f.write(text)


def kernels(row, dtype, training, which, traces=None):
    fn, backend, xs = prepared(row, dtype, training, which)
    for _ in range(5):
        step(fn, xs, training)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step(fn, xs, training)
        torch.cuda.synchronize()
    if traces and backend is not None:
        write_traces(backend, traces)
    totals = {}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us, count = totals.get(event.name, (0.0, 0))
        totals[event.name] = (us + event.device_time, count + 1)
    torch._dynamo.reset()
    return totals


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("rows", nargs="+")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--backends", default="kiln,inductor",
                        help="comma-separated: kiln, inductor, eager")
    parser.add_argument("--traces", help="write kiln's compile traces of each row here")
    args = parser.parse_args()
    for spec in args.rows:
        row, dtype, training = parse_row(spec)
        for which in args.backends.split(","):
            traces = os.path.join(args.traces, spec.replace(":", ".")) if args.traces else None
            totals = kernels(row, dtype, training, which, traces)
            total = sum(us for us, _ in totals.values()) / STEPS
            launches = sum(n for _, n in totals.values()) / STEPS
            print(f"\n=== {spec.replace(':', ' ')} {which}: {total:.1f} us of kernels per step, "
                  f"{launches:.0f} launches")
            ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])
            for name, (us, n) in ranked[:args.top]:
                print(f"{us / STEPS:9.1f} us {n / STEPS:5.1f}x  {name[:150]}")


if __name__ == "__main__":
    main()
