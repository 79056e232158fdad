"""The model zoo's models (tests/gpu/model_zoo.py) timed under the kiln
backend against Inductor and eager, at the zoo's sizes: small models whose
calls are mostly host time (Dynamo's guards, the launches), which is what
a model of that size costs its user.

    KILN_SERVER=127.0.0.1:50151 python3 tests/gpu/zoo_bench.py [--dtypes float32,bfloat16]
        [--models bert,...] [--out zoo.md]

Per row: each backend's first call less its steady state (its compile,
Dynamo's tracing included, kiln untiered so that the steady state is its
kernels), then the steady state as the bench times it: CUDA events around
each call, 10 rounds of 5 calls of Inductor's and kiln's in turns, medians.
Training calls run forward and backward.
"""

import argparse
import os
import statistics
import sys
import time

import torch

import kiln

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_zoo  # noqa: E402


def call(fn, inputs, training):
    if training:
        out = model_zoo.outputs(fn(*inputs))
        sum(o.float().sum() for o in out).backward()
    else:
        with torch.no_grad():
            fn(*inputs)


def timed(fn, inputs, training, reps):
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call(fn, inputs, training)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def first_call(fn, inputs, training):
    torch.cuda.synchronize()
    start = time.perf_counter()
    call(fn, inputs, training)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1000


def row(server, dtype, name, training):
    factory, make = model_zoo.cases("cuda", dtype)[name]
    torch.manual_seed(1)
    model = factory().to("cuda", dtype).train(training)
    inputs = make()
    if not training:
        inputs = tuple(t.detach() for t in inputs)
    for _ in range(3):
        call(model, inputs, training)
    eager = statistics.median(timed(model, inputs, training, 20))
    torch._dynamo.reset()
    inductor = torch.compile(model)
    inductor_first = first_call(inductor, inputs, training)
    torch._dynamo.reset()
    backend = kiln.backend(server, on_unavailable="raise", tiered=False)
    compiled = torch.compile(model, backend=backend)
    kiln_first = first_call(compiled, inputs, training)
    times = [[], []]
    for fn in (inductor, compiled):
        timed(fn, inputs, training, 5)
    for _ in range(10):
        for t, fn in zip(times, (inductor, compiled)):
            t.extend(timed(fn, inputs, training, 5))
    inductor_ms, kiln_ms = (statistics.median(t) for t in times)
    return {"model": name, "mode": "training" if training else "inference", "eager_ms": eager,
            "inductor_ms": inductor_ms, "kiln_ms": kiln_ms,
            "inductor_compile_s": (inductor_first - inductor_ms) / 1000,
            "kiln_compile_s": (kiln_first - kiln_ms) / 1000,
            "eager_graphs": backend.stats["eager"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_zoo.add_selection(parser)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    server = os.environ["KILN_SERVER"]
    rows_of = {}
    for dtype, name in model_zoo.selected(args, "cuda"):
        for training in (False, True):
            r = row(server, dtype, name, training)
            print(r, flush=True)
            rows_of.setdefault(dtype, []).append(r)
    lines = []
    for dtype, rows in rows_of.items():
        dtype_name = str(dtype).removeprefix("torch.")
        lines += [f"\n{dtype_name}:\n",
                  "| model | mode | eager ms | Inductor ms | kiln ms | kiln vs Inductor | "
                  "Inductor compile s | kiln compile s |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            note = f" ({r['eager_graphs']} graphs eager)" if r["eager_graphs"] else ""
            lines.append(f"| {r['model']} | {r['mode']} | {r['eager_ms']:.3f} | "
                         f"{r['inductor_ms']:.3f} | {r['kiln_ms']:.3f} | "
                         f"{r['inductor_ms'] / r['kiln_ms']:.2f}x{note} | "
                         f"{r['inductor_compile_s']:.2f} | {r['kiln_compile_s']:.2f} |")
        ratios = [r["inductor_ms"] / r["kiln_ms"] for r in rows]
        lines.append(f"\nGeomean kiln vs Inductor ({dtype_name}): "
                     f"{statistics.geometric_mean(ratios):.2f}x over {len(rows)} rows")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
