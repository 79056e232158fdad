"""NVRTC's compile time of CUDA sources, in-process, each with the options
kiln_nvrtc passes (compiler/codegen/nvrtc_main.cc) plus any given: the
sources and variants compiled in turn, round after round, so that drift in
the machine's speed falls on all alike; prints each one's median and first
quartile in ms.

    python3 tests/bench/nvrtc_times.py [--rounds N] [--arch sm_90] FILE.cu[::OPT,OPT...]...

FILE.cu::-Xptxas,-O1 compiles FILE.cu with -Xptxas -O1 added. Sources come
from `build/bin/kiln_dump_code --target=cuda --out=DIR GRAPH.json`.
"""

import argparse
import ctypes
import os
import statistics
import time

BASE = ["--std=c++17", "-default-device", "--minimal"]


def load():
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    return ctypes.CDLL(os.path.join(cuda, "lib64", "libnvrtc.so"))


def compile_ms(nvrtc, source, options):
    prog = ctypes.c_void_p()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source, b"kernel.cu", 0, None, None):
        raise RuntimeError("nvrtcCreateProgram failed")
    argv = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    start = time.perf_counter()
    rc = nvrtc.nvrtcCompileProgram(prog, len(options), argv)
    ms = (time.perf_counter() - start) * 1000
    if rc:
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
        raise RuntimeError(f"{options}: {log.value.decode(errors='replace')[:2000]}")
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return ms


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("specs", nargs="+")
    args = parser.parse_args()
    nvrtc = load()
    variants = []
    for spec in args.specs:
        path, _, extra = spec.partition("::")
        with open(path, "rb") as f:
            source = f.read()
        options = [f"--gpu-architecture={args.arch}"] + BASE + (extra.split(",") if extra else [])
        variants.append((spec, source, options))
    for _, source, options in variants:  # the first compile in a process is slower
        compile_ms(nvrtc, source, options)
    times = {spec: [] for spec, _, _ in variants}
    for _ in range(args.rounds):
        for spec, source, options in variants:
            times[spec].append(compile_ms(nvrtc, source, options))
    for spec, ms in times.items():
        q1 = statistics.quantiles(ms, n=4)[0] if len(ms) > 1 else ms[0]
        print(f"{spec}: median {statistics.median(ms):.1f} ms, first quartile {q1:.1f} ms")


if __name__ == "__main__":
    main()
