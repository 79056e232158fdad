"""Times variants of one generated kernel on the GPU, without kilnd: CUBINs
built elsewhere (kiln_dump_code --target=cuda, then kiln_nvrtc), loaded
through the driver API and launched on the same random inputs.

    python3 tests/gpu/time_cubins.py SPEC.json

SPEC: {"buffers": [[shape, dtype, "in"|"out"], ...] (the kernel's a.b[],
in order), "grid": N, "variants": [{"name", "cubin", "block", "kernel"
(default kernel_0), "grid" (default the spec's)}, ...]}. Every variant's
outputs are compared with the first's; each is timed with CUDA events over
20 launches back to back, the median of 7 such runs, and reported in
microseconds and in GB/s of the bytes its buffers hold (each read or
written once), with its registers per thread and local memory.

With "after_mm": {"out": INDEX, "k": K} every launch follows a matmul that
writes buffer INDEX (its last dim N, the rest M, from random [M, K] and
[K, N] operands), and only the kernel is timed, launch by launch: a kernel
that reads a matmul's output as a model's does, part of it in L2."""

import ctypes
import json
import statistics
import sys

import torch

cuda = ctypes.CDLL("libcuda.so.1")


def check(rc, what):
    if rc != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError(f"{what}: {name.value.decode() if name.value else rc}")


def load(cubin, kernel):
    data = open(cubin, "rb").read()
    module, fn = ctypes.c_void_p(), ctypes.c_void_p()
    check(cuda.cuModuleLoadData(ctypes.byref(module), data), f"cuModuleLoadData {cubin}")
    check(cuda.cuModuleGetFunction(ctypes.byref(fn), module, kernel.encode()),
          f"cuModuleGetFunction {kernel}")
    return fn


def attribute(fn, which):
    value = ctypes.c_int()
    check(cuda.cuFuncGetAttribute(ctypes.byref(value), which, fn), "cuFuncGetAttribute")
    return value.value


def launcher(fn, grid, block, tensors):
    args = (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(args), ctypes.c_void_p))

    def launch():
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        check(cuda.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, params, None),
              "cuLaunchKernel")
    launch.keep = (args, params)
    return launch


def time_us(launch, calls=20, runs=7):
    for _ in range(3):
        launch()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            launch()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def time_after_us(launch, before, calls=20, runs=7):
    for _ in range(3):
        before()
        launch()
    times = []
    for _ in range(runs):
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(calls)]
        for start, end in events:
            before()
            start.record()
            launch()
            end.record()
        events[-1][1].synchronize()
        times.append(sum(s.elapsed_time(e) for s, e in events) * 1000 / calls)
    return statistics.median(times)


def matmul_into(spec, buffers):
    """The matmul "after_mm" names, writing its buffer, or None."""
    if "after_mm" not in spec:
        return None
    out = buffers[spec["after_mm"]["out"]][0]
    n = out.shape[-1]
    m = out.numel() // n
    k = spec["after_mm"]["k"]
    a = torch.randn(m, k, device="cuda", dtype=out.dtype)
    b = torch.randn(k, n, device="cuda", dtype=out.dtype) / k ** 0.5
    view = out.view(m, n)
    return lambda: torch.mm(a, b, out=view)


def main():
    spec = json.load(open(sys.argv[1]))
    torch.manual_seed(0)
    torch.cuda.init()
    buffers = []
    for shape, dtype, role in spec["buffers"]:
        dt = getattr(torch, dtype)
        t = (torch.randn(shape, device="cuda", dtype=dt) if role == "in"
             else torch.full(shape, float("nan"), device="cuda", dtype=dt))
        buffers.append((t, role))
    nbytes = sum(t.numel() * t.element_size() for t, _ in buffers)
    before = matmul_into(spec, buffers)
    if before is not None:
        before()
    reference = None
    print(f"{'variant':<28} {'us':>9} {'GB/s':>8} {'max |diff|':>11} {'regs':>5} {'local B':>8}")
    for v in spec["variants"]:
        fn = load(v["cubin"], v.get("kernel", "kernel_0"))
        tensors = [t for t, _ in buffers]
        for t, role in buffers:
            if role == "out":
                t.fill_(float("nan"))
        launch = launcher(fn, v.get("grid", spec["grid"]), v["block"], tensors)
        launch()
        torch.cuda.synchronize()
        outs = [t.clone() for t, role in buffers if role == "out"]
        if reference is None:
            reference = outs
        diff = max((o.float() - r.float()).abs().nan_to_num(float("inf")).max().item()
                   for o, r in zip(outs, reference))
        us = time_us(launch) if before is None else time_after_us(launch, before)
        regs, local = attribute(fn, 4), attribute(fn, 3)  # NUM_REGS, LOCAL_SIZE_BYTES
        print(f"{v['name']:<28} {us:9.1f} {nbytes / us / 1e3:8.0f} {diff:11.3g} {regs:5d} "
              f"{local:8d}", flush=True)


if __name__ == "__main__":
    main()
