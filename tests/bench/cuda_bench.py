"""The kiln backend against Inductor and eager on a CUDA GPU: steady-state
time, cold compile and warm start for seven models, inference and training,
float32 and bfloat16, in one run.

    KILN_SERVER=127.0.0.1:50151 python3 tests/bench/cuda_bench.py [--dtypes float32,bfloat16]
        [--models layernorm,...] [--out bench.md]

(tests/gpu/run.sh --bench starts kilnd and runs this.) Every backend
compiles with static shapes (dynamic=False): the kernel families share one
forward, and Dynamo would otherwise mark a later family's sizes dynamic
after the earlier ones. Per row, in this process:
  - steady state: CUDA events around each call, each on one of 4 sets of
    fresh random inputs (never zeros); training calls run forward and
    backward. The table's Inductor and kiln columns, and their ratio, are
    the medians of 10 rounds of 5 calls of each, Inductor's and kiln's in
    turns (both see the same state of the machine); eager's, and the
    steady state the cold compile subtracts, the median of 50 calls after
    5 warm-up calls;
  - cold compile: the first call's time less the steady-state time
    (Inductor: its caches are empty on a fresh machine; kiln: kilnd's cache
    is empty, so kilnd lowers, generates and runs NVRTC; its compiles are
    tiered, so the first call runs kilnd's quick artifact (the graph through
    ATen), and "until optimized" is the time until the optimized kernels
    arrived, less the same steady state, which is timed on them);
  - kiln warm start: after torch._dynamo.reset(), a new backend on the same
    kilnd (every graph cached): the first call less the steady-state time,
    less the same for backend="eager" (Dynamo's tracing alone), per graph,
    and the backend's own time within it (lowering, the wait for kilnd's reply, loading);
  - bandwidth: for the memory-bound models (layernorm, rmsnorm, softmax),
    the bytes the operation must move (inputs read and outputs written once)
    over the time per call of 20 calls issued back to back between two
    events (as the copy is timed: the kernels' throughput, not each call's
    host time), the median of 7 such runs, against a device-to-device copy
    measured in the same run.
With `--models families --modes inference`, one row per kernel family
(pointwise chains, broadcasting through a transpose, row and column sums,
softmax, the norms, Welford over long rows) with its bandwidth. Prints one
markdown table per dtype, and writes them to --out.
"""

import argparse
import gc
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import kiln

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "gpu"))
from test_cuda import MLP, Block, ConvNet  # noqa: E402

DEVICE = "cuda"


class LayerNorm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(x)


class RMSNorm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) \
            * self.weight


class Softmax(torch.nn.Module):
    """Softmax attention: scores, softmax, weighted sum (matmuls through ATen)."""

    def forward(self, q, k, v):
        s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
        return torch.softmax(s, -1) @ v


class GeluMLP(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.mlp = MLP(d)

    def forward(self, x):
        return self.mlp(x)


# name -> (module factory, input shapes, memory-bound bytes per element count)
MODELS = {
    "layernorm": (lambda: LayerNorm(4096), [(16384, 4096)]),
    "rmsnorm": (lambda: RMSNorm(4096), [(16384, 4096)]),
    "softmax_attention": (lambda: Softmax(), [(8, 12, 1024, 64)] * 3),
    "mlp_gelu": (lambda: GeluMLP(1024), [(8192, 1024)]),
    "convnet": (lambda: ConvNet(), [(128, 3, 64, 64)]),
    "gpt2_block": (lambda: Block(768), [(8, 1024, 768)]),
    # Six blocks in one graph: the cold compile of a deep model, whose
    # middle blocks share their kernels (compiler/loop/share_kernels.h).
    "gpt2_6_blocks": (lambda: torch.nn.Sequential(*[Block(768) for _ in range(6)]),
                      [(4, 1024, 768)]),
}
class Fn(torch.nn.Module):
    """A kernel family: one function of its inputs."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


# One kernel family per row, at sizes where the copy bandwidth is reached:
# `--models families` runs them (inference).
FAMILIES = {
    "pointwise_chain": (lambda: Fn(lambda x, y: torch.sigmoid(F.gelu(x) * y + 1.0)),
                        [(8192, 8192)] * 2),
    "broadcast_transpose": (lambda: Fn(lambda x, b: x.t() * 2.0 + b), [(8192, 8192), (8192,)]),
    "sum_rows": (lambda: Fn(lambda x: x.sum(-1)), [(8192, 8192)]),
    "sum_columns": (lambda: Fn(lambda x: x.sum(0)), [(8192, 8192)]),
    "softmax": (lambda: Fn(lambda x: torch.softmax(x, -1)), [(16384, 4096)]),
    "layer_norm": (lambda: LayerNorm(4096), [(16384, 4096)]),
    "rms_norm": (lambda: RMSNorm(4096), [(16384, 4096)]),
    "welford_long_rows": (lambda: Fn(lambda x: x.var(-1) + x.mean(-1)), [(64, 1 << 20)]),
}
MODELS.update(FAMILIES)
# Rows whose bytes (inputs read and outputs written once) give a bandwidth.
MEMORY_BOUND = {"layernorm", "rmsnorm", *FAMILIES}
PROFILE = False
CUDA_GRAPHS = False
TUNE_LINES = False


def full_float32():
    """float32 matmuls and convolutions in float32, not TF32: every backend
    computes the same thing (the bench's setting, and its profiles')."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def time_calls(fn, input_sets, training, reps=50, warmup=5):
    """Median milliseconds of fn over `reps` calls (after `warmup`)."""
    return statistics.median(call_times(fn, input_sets, training, reps, warmup))


def call_times(fn, input_sets, training, reps, warmup):
    """Milliseconds of each of `reps` calls of fn (after `warmup`)."""
    def call(inputs):
        if training:
            out = fn(*inputs)
            out.float().sum().backward()
        else:
            with torch.no_grad():
                fn(*inputs)

    for i in range(warmup):
        call(input_sets[i % len(input_sets)])
    times = []
    for i in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call(input_sets[i % len(input_sets)])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def time_interleaved(fns, input_sets, training, rounds=10, reps=5):
    """Median milliseconds per call of each of `fns`, timed in turns: `rounds`
    rounds of `reps` calls of each, one function after the other, so that
    all see the same state of the machine (a row timed minutes apart moved
    by up to 30%)."""
    times = [[] for _ in fns]
    for fn in fns:
        call_times(fn, input_sets, training, reps=1, warmup=5)
    for _ in range(rounds):
        for t, fn in zip(times, fns):
            t.extend(call_times(fn, input_sets, training, reps, warmup=1))
    return [statistics.median(t) for t in times]


def time_stream(fn, input_sets, calls=20, runs=7):
    """Milliseconds per inference call of fn over `calls` calls issued back
    to back between two CUDA events (the median of `runs` such runs: the
    same code's bandwidth moved by up to 30 points between runs of 3)."""
    times = []
    with torch.no_grad():
        for _ in range(runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for i in range(calls):
                fn(*input_sets[i % len(input_sets)])
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def kernel_ms(fn, input_sets, calls=20):
    """Milliseconds per inference call of the GPU work fn launches, summed
    over its kernels under the profiler: the host's time between launches is
    left out, which time_stream counts wherever the kernels are shorter
    than the host's time per call."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        fn(*input_sets[0])
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for i in range(calls):
                fn(*input_sets[i % len(input_sets)])
            torch.cuda.synchronize()
    us = sum(e.device_time for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA)
    return us / calls / 1000


def first_call(fn, inputs, training, label):
    """Milliseconds of fn's first call (its compile). The garbage of what
    ran before is collected first, for every backend: a full collection
    traverses every object the interpreter tracks (hundreds of thousands
    once Dynamo and Inductor have run; 0.2 s for 320,000 on the build
    machine), and would fall into whichever first call allocated the most
    when it came due. Collections of 50 ms or more within the call are
    printed."""
    gc.collect()
    pauses = []
    gc.callbacks.append(_gc_timer(pauses))
    try:
        return _first_call(fn, inputs, training)
    finally:
        gc.callbacks.pop()
        long = [p for p in pauses if p[1] > 50]
        if long:
            print(f"  collections of 50 ms or more in {label}'s first call: "
                  + ", ".join(f"generation {g} {ms:.0f} ms" for g, ms in long), flush=True)


def _gc_timer(pauses):
    """A gc callback appending (generation, ms) of every collection."""
    began = {}

    def callback(phase, info):
        if phase == "start":
            began["t"] = time.perf_counter()
        elif "t" in began:
            pauses.append((info["generation"], (time.perf_counter() - began.pop("t")) * 1000))
    return callback


def _first_call(fn, inputs, training):
    torch.cuda.synchronize()
    start = time.perf_counter()
    if training:
        fn(*inputs).float().sum().backward()
    else:
        with torch.no_grad():
            fn(*inputs)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1000


def cold_split(backend):
    """Where the kiln backend's first call went, in ms, summed over its
    graphs: Dynamo's tracing before the backend was called, the client's
    lowering, the round trips to kilnd (its compile included), what the
    first call waited for them (they run while Dynamo finishes the frame),
    and loading the artifacts; and of kilnd's compile, the autotuning and the native
    compile (NVRTC), each summed over a training graph's two halves, which
    kilnd compiles at once."""
    split = dict.fromkeys(("dynamo", "lower", "kilnd", "wait", "load", "tune", "nvrtc"), 0.0)
    for record in backend.graph_times:
        for phase, seconds in record["server"]:
            if phase.endswith("autotune"):
                split["tune"] += seconds * 1000
            elif phase.endswith("native-compile"):
                split["nvrtc"] += seconds * 1000
        split["dynamo"] += record["dynamo"] * 1000
        split["lower"] += record["lower"] * 1000
        split["kilnd"] += (record["key"] + record["lookup"] + record["compile"]) * 1000
        split["wait"] += record.get("wait", 0.0) * 1000
        split["load"] += record["load"] * 1000
    return split


def copy_bandwidth():
    x = torch.randn(256 * 1024 * 1024, device=DEVICE)  # 1 GiB
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        y.copy_(x)
    end.record()
    end.synchronize()
    return 2 * x.numel() * 4 * 10 / (start.elapsed_time(end) / 1000) / 1e9


def bench_row(name, dtype, training, server):
    factory, shapes = MODELS[name]
    torch.manual_seed(0)
    model = factory().to(DEVICE, dtype)
    if not training:
        model.eval()
    input_sets = [[torch.randn(s, device=DEVICE, dtype=dtype).requires_grad_(training)
                   for s in shapes] for _ in range(4)]
    row = {"model": name, "mode": "training" if training else "inference"}
    row["eager_ms"] = time_calls(model, input_sets, training)

    torch._dynamo.reset()
    inductor = torch.compile(model, dynamic=False)
    cold = first_call(inductor, input_sets[0], training, f"{name} Inductor")
    row["inductor_steady_ms"] = time_calls(inductor, input_sets, training)
    row["inductor_compile_ms"] = cold - row["inductor_steady_ms"]
    # Bandwidth is timed as the copy is: calls back to back between two
    # events, the kernels' throughput rather than each call's host time.
    streamed = name in MEMORY_BOUND and not training
    if streamed:
        row["inductor_stream_ms"] = time_stream(inductor, input_sets)
        row["inductor_kernel_ms"] = kernel_ms(inductor, input_sets)

    torch._dynamo.reset()
    dynamo = torch.compile(model, backend="eager", dynamic=False)
    dynamo_first = first_call(dynamo, input_sets[0], training, f"{name} Dynamo")
    dynamo_ms = time_calls(dynamo, input_sets, training, reps=5, warmup=2)

    torch._dynamo.reset()
    backend = kiln.backend(server, on_unavailable="raise", timeout=600)
    compiled = torch.compile(model, backend=backend, dynamic=False,
                             mode="max-autotune-no-cudagraphs" if TUNE_LINES else None)
    cold = first_call(compiled, input_sets[0], training, f"{name} kiln")
    ended = time.perf_counter()
    # Tiered: the first call ran kernels at kilnd's quick level; the
    # optimized ones arrive after (or during) it, and the steady state is
    # timed on them.
    if not backend.wait_for_upgrades(timeout=600):
        raise RuntimeError("the optimized artifacts did not arrive within 600 s")
    arrived = max((u.arrived for u in backend.upgrades), default=ended)
    row["quick_graphs"] = backend.stats["quick"]
    row["kiln_steady_ms"] = time_calls(compiled, input_sets, training)
    row["kiln_compile_ms"] = cold - row["kiln_steady_ms"]
    # Until the optimized kernels could run: from the first call's start to
    # their arrival, or to the first call's end if they came before it.
    row["kiln_optimized_ms"] = cold + max(arrived - ended, 0.0) * 1000 - row["kiln_steady_ms"]
    if backend.stats["upgrades"] != backend.stats["quick"]:
        raise RuntimeError(f"quick artifacts not replaced: {backend.stats}")
    if streamed:
        row["kiln_stream_ms"] = time_stream(compiled, input_sets)
        row["kiln_kernel_ms"] = kernel_ms(compiled, input_sets)
    row["graphs"] = backend.stats["graphs"]
    row["dynamo_ms"] = dynamo_first - dynamo_ms
    row["kiln_split_ms"] = cold_split(backend)
    row["kernels"] = sum(g.plan.kernels for fn in backend.loaded
                         if not getattr(fn, "superseded", False)
                         for g in (fn.artifact.compiled, fn.artifact.compiled_forward,
                                   fn.artifact.compiled_backward))
    if backend.stats["eager"]:
        row["note"] = f"{backend.stats['eager']} graphs ran eagerly"

    if TUNE_LINES:
        for fn in backend.loaded:
            for part, text in sorted(fn.artifact.trace.items()):
                if part.endswith("ir_after_fusion.txt"):
                    for line in text.splitlines():
                        if line.startswith("tune: "):
                            print(f"  {name} {row['mode']} {dtype} {part[:-20]}{line}")

    # The warm start, before the CUDA-graph rows: the memory pools those
    # leave behind must not land in the first call of a later compile.
    torch._dynamo.reset()
    warm_backend = kiln.backend(server, on_unavailable="raise", timeout=600)
    warm = torch.compile(model, backend=warm_backend, dynamic=False)
    warm_first = first_call(warm, input_sets[0], training, f"{name} kiln warm")
    graphs = max(warm_backend.stats["graphs"], 1)
    row["kiln_warm_ms_per_graph"] = ((warm_first - row["kiln_steady_ms"]) -
                                     (dynamo_first - dynamo_ms)) / graphs
    row["warm_hits"] = warm_backend.stats["hits"]
    # The backend's own part of that (lowering or its cache, what the first
    # call waited for kilnd's reply, a lookup made before returning to
    # Dynamo, loading), timed inside it: free of the noise of subtracting a
    # Dynamo time taken in another compile. The round trip itself runs
    # while Dynamo finishes the frame, and only its wait counts.
    row["kiln_warm_own_ms"] = sum(
        (r["lower"] + r["key"] + r["lookup"] + r["wait"] + r["load"]) * 1000
        for r in warm_backend.graph_times) / graphs

    if CUDA_GRAPHS and not training:
        # mode="reduce-overhead" for both: kiln's plans and Inductor's code
        # replayed as CUDA graphs (their warm-up calls capture them).
        torch._dynamo.reset()
        cg_backend = kiln.backend(server, on_unavailable="raise", timeout=600)
        kiln_cg = torch.compile(model, backend=cg_backend, mode="reduce-overhead",
                                dynamic=False)
        row["kiln_cg_ms"] = time_calls(kiln_cg, input_sets, training)
        row["kiln_cg_replays"] = sum(g.replays for g in cg_backend.cuda_graphed)
        torch._dynamo.reset()
        inductor_cg = torch.compile(model, mode="reduce-overhead", dynamic=False)
        row["inductor_cg_ms"] = time_calls(inductor_cg, input_sets, training)

    # The steady state the table compares: Inductor's code (recompiled from
    # its caches) and kiln's warm backend timed in turns.
    row["inductor_ms"], row["kiln_ms"] = time_interleaved([inductor, warm], input_sets, training)

    if PROFILE:
        from torch.profiler import ProfilerActivity, profile
        for label, fn in (("inductor", inductor), ("kiln", compiled)):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for i in range(5):
                    if training:
                        fn(*input_sets[i % 4]).float().sum().backward()
                    else:
                        with torch.no_grad():
                            fn(*input_sets[i % 4])
                torch.cuda.synchronize()
            print(f"--- {name} {row['mode']} {dtype} {label}: CUDA time per kernel, 5 calls")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12,
                                            max_name_column_width=60))

    if name in MEMORY_BOUND and not training:
        with torch.no_grad():
            out = model(*input_sets[0])
        row["bytes"] = sum(t.numel() * t.element_size() for t in input_sets[0]) + \
            out.numel() * out.element_size()
        row["kiln_gbps"] = row["bytes"] / (row["kiln_stream_ms"] / 1000) / 1e9
        row["inductor_gbps"] = row["bytes"] / (row["inductor_stream_ms"] / 1000) / 1e9
        for who in ("kiln", "inductor"):
            row[f"{who}_kernel_gbps"] = row["bytes"] / (row[f"{who}_kernel_ms"] / 1000) / 1e9
    return row


def table(rows, dtype, copy_gbps):
    lines = [f"### {dtype} (copy bandwidth {copy_gbps:.0f} GB/s)", "",
             "| model | mode | eager ms | Inductor ms | kiln ms | kiln vs Inductor | "
             "Inductor compile s | kiln cold compile s | kiln warm ms/graph beyond Dynamo "
             "(the backend's own) | "
             "graphs | kernels | kiln GB/s (of copy), calls back to back | kernels' own "
             "GB/s (of copy) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['mode']} | error: {r['error'][:120]} |"
                         + " |" * 10)
            continue
        bw = (f"{r['kiln_gbps']:.0f} ({100 * r['kiln_gbps'] / copy_gbps:.0f}%; Inductor "
              f"{100 * r['inductor_gbps'] / copy_gbps:.0f}%)" if "kiln_gbps" in r else "")
        own = (f"{r['kiln_kernel_gbps']:.0f} ({100 * r['kiln_kernel_gbps'] / copy_gbps:.0f}%; "
               f"Inductor {100 * r['inductor_kernel_gbps'] / copy_gbps:.0f}%)"
               if "kiln_kernel_gbps" in r else "")
        lines.append(
            f"| {r['model']} | {r['mode']} | {r['eager_ms']:.3f} | {r['inductor_ms']:.3f} | "
            f"{r['kiln_ms']:.3f} | {r['inductor_ms'] / r['kiln_ms']:.2f}x | "
            f"{r['inductor_compile_ms'] / 1000:.2f} | {r['kiln_compile_ms'] / 1000:.2f} | "
            f"{r['kiln_warm_ms_per_graph']:.1f} (own {r['kiln_warm_own_ms']:.1f}) | "
            f"{r['graphs']} | {r['kernels']} | {bw} | {own} |"
            + (f" {r['note']}" if "note" in r else ""))
    ratios = [r["inductor_ms"] / r["kiln_ms"] for r in rows if "error" not in r]
    if ratios:
        geo = statistics.geometric_mean(ratios)
        ok = [r for r in rows if "error" not in r]
        inductor_s = sum(r["inductor_compile_ms"] for r in ok) / 1000
        kiln_s = sum(r["kiln_compile_ms"] for r in ok) / 1000
        lines += ["", f"Geomean kiln vs Inductor ({dtype}): {geo:.2f}x over {len(ratios)} rows; "
                  f"sum of cold compile: Inductor {inductor_s:.1f} s, kiln {kiln_s:.1f} s"]
    lines += ["", f"Cold compile beyond Dynamo's tracing ({dtype}): the first call less "
              "the steady state less Dynamo's own first call (backend=\"eager\"). Kiln's "
              "split in ms: the client's lowering, the round trips to kilnd with its compile, "
              "of that kilnd's autotuning and NVRTC (each summed over the two halves of a "
              "training graph, which kilnd compiles at once), what the first call waited for "
              "them (they run while Dynamo finishes the frame), loading, and the rest (Dynamo "
              "after the backend returned, and the first run). Tiered compiles (kiln's "
              "default on CUDA): the first call runs kilnd's quick artifact (the graph "
              "op by op through ATen) while it compiles the optimized kernels; "
              "\"until optimized\" is the time from the first call's start until those "
              "arrived (or the first call's end, if later), less the same steady state and "
              "Dynamo's first call.",
              "", "| model | mode | Dynamo s | Inductor beyond s | kiln beyond s | ratio | "
              "kiln until optimized s | ratio | quick graphs | "
              "lower | kilnd | of it tune | of it NVRTC | waited | load | rest |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            continue
        inductor = r["inductor_compile_ms"] - r["dynamo_ms"]
        kiln_beyond = r["kiln_compile_ms"] - r["dynamo_ms"]
        split = r["kiln_split_ms"]
        rest = r["kiln_compile_ms"] - sum(split[k] for k in ("dynamo", "lower", "wait", "load"))
        lines.append(
            f"| {r['model']} | {r['mode']} | {r['dynamo_ms'] / 1000:.2f} | {inductor / 1000:.2f} | "
            f"{kiln_beyond / 1000:.2f} | {kiln_beyond / inductor:.2f} | "
            f"{(r['kiln_optimized_ms'] - r['dynamo_ms']) / 1000:.2f} | "
            f"{(r['kiln_optimized_ms'] - r['dynamo_ms']) / inductor:.2f} | "
            f"{r['quick_graphs']} | " +
            " | ".join(f"{split[k]:.0f}"
                       for k in ("lower", "kilnd", "tune", "nvrtc", "wait", "load"))
            + f" | {rest:.0f} |")
    ok = [r for r in rows if "error" not in r]
    if ok:
        inductor_s = sum(r["inductor_compile_ms"] - r["dynamo_ms"] for r in ok) / 1000
        kiln_s = sum(r["kiln_compile_ms"] - r["dynamo_ms"] for r in ok) / 1000
        optimized_s = sum(r["kiln_optimized_ms"] - r["dynamo_ms"] for r in ok) / 1000
        lines += ["", f"Sum beyond Dynamo ({dtype}): Inductor {inductor_s:.1f} s, kiln "
                  f"{kiln_s:.1f} s ({kiln_s / inductor_s:.2f}x), kiln until optimized "
                  f"{optimized_s:.1f} s ({optimized_s / inductor_s:.2f}x)"]
        lines += ["", f"Per model, inference and training summed ({dtype}), beyond Dynamo:", "",
                  "| model | Inductor s | kiln s | ratio | kiln until optimized s | ratio |",
                  "|---|---|---|---|---|---|"]
        for model in dict.fromkeys(r["model"] for r in ok):
            mine = [r for r in ok if r["model"] == model]
            ind = sum(r["inductor_compile_ms"] - r["dynamo_ms"] for r in mine) / 1000
            first = sum(r["kiln_compile_ms"] - r["dynamo_ms"] for r in mine) / 1000
            opt = sum(r["kiln_optimized_ms"] - r["dynamo_ms"] for r in mine) / 1000
            lines.append(f"| {model} | {ind:.2f} | {first:.2f} | {first / ind:.3f} | "
                         f"{opt:.2f} | {opt / ind:.3f} |")
    graphed = [r for r in rows if "kiln_cg_ms" in r]
    if graphed:
        lines += ["", f"mode=\"reduce-overhead\" (CUDA graphs), {dtype}, inference:", "",
                  "| model | Inductor ms | kiln ms | kiln vs Inductor | kiln replays |",
                  "|---|---|---|---|---|"]
        for r in graphed:
            lines.append(f"| {r['model']} | {r['inductor_cg_ms']:.3f} | {r['kiln_cg_ms']:.3f} | "
                         f"{r['inductor_cg_ms'] / r['kiln_cg_ms']:.2f}x | {r['kiln_cg_replays']} |")
        geo = statistics.geometric_mean([r["inductor_cg_ms"] / r["kiln_cg_ms"] for r in graphed])
        lines += ["", f"Geomean with CUDA graphs ({dtype}): {geo:.2f}x over {len(graphed)} rows"]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--models", default=",".join(m for m in MODELS if m not in FAMILIES),
                        help="comma-separated; 'families' for the kernel-family rows")
    parser.add_argument("--modes", default="inference,training")
    parser.add_argument("--out", default="")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="also time inference rows under mode=\"reduce-overhead\"")
    parser.add_argument("--autotune", action="store_true",
                        help="compile kiln's rows with mode=\"max-autotune-no-cudagraphs\" "
                             "(kilnd times block sizes) and print the tuner's decisions")
    parser.add_argument("--profile", action="store_true",
                        help="print torch.profiler's kernel table of Inductor and kiln per row")
    args = parser.parse_args()
    global PROFILE, CUDA_GRAPHS, TUNE_LINES
    PROFILE = args.profile
    TUNE_LINES = args.autotune
    CUDA_GRAPHS = args.cuda_graphs
    server = os.environ.get("KILN_SERVER", "127.0.0.1:50051")
    full_float32()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    copy_gbps = copy_bandwidth()
    out = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        rows = []
        names = args.models.split(",")
        if "families" in names:
            names = [n for n in names if n != "families"] + list(FAMILIES)
        for name in names:
            for mode in args.modes.split(","):
                try:
                    rows.append(bench_row(name, dtype, mode == "training", server))
                except Exception as e:  # a failing row is reported, the others still run
                    rows.append({"model": name, "mode": mode, "error": f"{type(e).__name__}: {e}"})
                print(rows[-1], flush=True)
        out.append(table(rows, dtype_name, copy_gbps))
        print(out[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n\n".join(out) + "\n")


if __name__ == "__main__":
    main()
