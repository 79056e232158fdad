"""torch.compile with the kiln backend against Inductor, on the CPU: cold
compile, warm start and steady-state time for six models, inference and
training, in one run.

    .venv/bin/python tests/bench/torch_compile_bench.py --kilnd=build/bin/kilnd

Each measurement runs in a fresh process (torch imported, the model built,
then the clock starts at the first call and stops when its output, and for
training its gradients, exist). With --layout=fresh (the default) that
process runs one model in one mode, as a job that starts, compiles its model
and runs; with --layout=shared one process per system runs every model in
turn, so that the later models find each compiler's one-time start-up done:
  - dynamo: backend="eager", Dynamo's own tracing and nothing else;
  - kiln cold: an empty kilnd cache and an empty client cache of lowered
    graphs (KILN_CACHE_DIR); kiln warm: a second process, every graph cached
    in both (the split: Dynamo, lowering, key, lookup, compile, load, from
    the backend's counters);
  - inductor cold: an empty TORCHINDUCTOR_CACHE_DIR; inductor warm: a second
    process on the same directory (FX-graph and AOTAutograd caches filled).
Steady state: the median of 20 calls after 3 warm-up calls, in the warm
process. Prints one table (markdown) and writes JSON with --out.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, os.pardir, "data")

MODELS = ["mlp", "rmsnorm", "attention", "conv_block", "resnet_block", "gpt2_block"]
MODES = ["inference", "training"]


def build(name):
    """(module, inputs) of model `name`, from a fixed seed."""
    import torch
    sys.path.insert(0, DATA)
    import capture_graphs as cg

    torch.manual_seed(0)

    class Attention(torch.nn.Module):
        def __init__(self, dim=64):
            super().__init__()
            self.qkv = torch.nn.Linear(dim, 3 * dim)

        def forward(self, x):
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            return cg.attention(q, k, v)

    if name == "mlp":
        return cg.MLP(64, 256), [torch.randn(256, 64)]
    if name == "rmsnorm":
        return cg.RMSNorm(256), [torch.randn(512, 256)]
    if name == "attention":
        return Attention(), [torch.randn(8, 64, 64)]
    if name == "conv_block":
        return cg.ConvBlock(3, 16), [torch.randn(8, 3, 32, 32)]
    if name == "resnet_block":
        return cg.ResNetBlock(16), [torch.randn(8, 16, 16, 16)]
    if name == "gpt2_block":
        return cg.TransformerBlock(dim=64, heads=4, hidden=256, dropout=0.0), \
            [torch.randn(4, 32, 64)]
    raise ValueError(name)


def child(system, server, threads, only=None):
    """Runs every model and mode (or only the "model:mode" `only`) once in
    this process; prints JSON lines."""
    import torch
    import torch._dynamo

    torch.set_num_threads(threads)
    if system.startswith("kiln"):
        import kiln
        backend = kiln.backend(server, timeout=600)
    elif system == "dynamo":
        backend = "eager"
    else:
        backend = "inductor"
    for name in MODELS:
        for mode in MODES:
            if only is not None and only != f"{name}:{mode}":
                continue
            torch._dynamo.reset()
            model, inputs = build(name)
            model.train(mode == "training")
            compiled = torch.compile(model, backend=backend)
            before = dict(backend.times) if system.startswith("kiln") else {}

            def step():
                if mode == "training":
                    out = compiled(*inputs)
                    out.float().pow(2).mean().backward()
                    return out
                with torch.no_grad():
                    return compiled(*inputs)

            start = time.perf_counter()
            step()
            first = time.perf_counter() - start
            for _ in range(3):
                step()
            times = []
            for _ in range(20):
                start = time.perf_counter()
                step()
                times.append(time.perf_counter() - start)
            times.sort()
            row = {"system": system, "model": name, "mode": mode, "first_call_s": first,
                   "steady_ms": times[len(times) // 2] * 1e3}
            if system.startswith("kiln"):
                row["split_s"] = {k: backend.times[k] - before.get(k, 0.0) for k in backend.times}
                row["stats"] = dict(backend.stats)
            print(json.dumps(row), flush=True)


def run_child(system, server, threads, env, only=None):
    done = subprocess.run([sys.executable, __file__, "--child", system, "--server", server or "",
                           "--threads", str(threads)] + (["--only", only] if only else []),
                          capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{system}: {done.stderr[-4000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kilnd", default=os.path.join(HERE, os.pardir, os.pardir, "build",
                                                        "bin", "kilnd"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out")
    parser.add_argument("--child")
    parser.add_argument("--server")
    parser.add_argument("--only")
    parser.add_argument("--layout", choices=["fresh", "shared"], default="fresh")
    parser.add_argument("--report", help="print the table of an earlier run's --out file")
    args = parser.parse_args()
    if args.report:
        with open(args.report) as f:
            report(json.load(f))
        return
    if args.child:
        child(args.child, args.server, args.threads, args.only)
        return

    tmp = tempfile.mkdtemp(prefix="kiln_compile_bench_")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"),
               KILN_CACHE_DIR=os.path.join(tmp, "kiln-client"))
    log = open(os.path.join(tmp, "kilnd.log"), "w")
    server = subprocess.Popen([args.kilnd, "--listen=127.0.0.1:0",
                               f"--data_dir={os.path.join(tmp, 'kiln')}"],
                              stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        address = None
        while address is None:
            line = server.stdout.readline()
            if not line:
                raise RuntimeError("kilnd exited before listening")
            found = re.search(r"listening on (\S+)", line)
            address = found.group(1) if found else None
        rows = []
        systems = ["dynamo", "kiln_cold", "kiln_warm", "inductor_cold", "inductor_warm"]
        if args.layout == "shared":
            for system in systems:
                rows += run_child(system, address, args.threads, env)
        else:
            for model in MODELS:
                for mode in MODES:
                    for system in systems:
                        rows += run_child(system, address, args.threads, env, f"{model}:{mode}")
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"layout: {args.layout}\n")
    report(rows)


def report(rows):
    by = {(r["system"], r["model"], r["mode"]): r for r in rows}
    print("| model | mode | dynamo s | kiln cold s | inductor cold s | cold ratio | kiln warm s "
          "| inductor warm s | warm ratio | kiln warm - dynamo, ms/graph "
          "| kiln's phases, ms/graph | steady kiln ms | steady inductor ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    totals = {k: 0.0 for k in ("kc", "ic", "kw", "iw")}
    for model in MODELS:
        for mode in MODES:
            d, kc, kw = (by[(s, model, mode)] for s in ("dynamo", "kiln_cold", "kiln_warm"))
            ic, iw = by[("inductor_cold", model, mode)], by[("inductor_warm", model, mode)]
            graphs = max(1, kw["stats"]["graphs"])
            beyond = (kw["first_call_s"] - d["first_call_s"]) * 1e3 / graphs
            # The backend's own time: the compile's round trip runs while
            # Dynamo finishes the frame, and only its wait counts.
            own = sum(v for k, v in kw["split_s"].items() if k not in ("dynamo", "compile"))
            totals["kc"] += kc["first_call_s"]
            totals["ic"] += ic["first_call_s"]
            totals["kw"] += kw["first_call_s"]
            totals["iw"] += iw["first_call_s"]
            print(f"| {model} | {mode} | {d['first_call_s']:.3f} | {kc['first_call_s']:.3f} | "
                  f"{ic['first_call_s']:.3f} | {kc['first_call_s'] / ic['first_call_s']:.2f} | "
                  f"{kw['first_call_s']:.3f} | {iw['first_call_s']:.3f} | "
                  f"{kw['first_call_s'] / iw['first_call_s']:.2f} | {beyond:.1f} | "
                  f"{own * 1e3 / graphs:.1f} | "
                  f"{kw['steady_ms']:.3f} | {iw['steady_ms']:.3f} |")
    print(f"\nall models: cold kiln {totals['kc']:.2f} s, inductor {totals['ic']:.2f} s "
          f"({totals['kc'] / totals['ic']:.2f}x); warm kiln {totals['kw']:.2f} s, inductor "
          f"{totals['iw']:.2f} s ({totals['kw'] / totals['iw']:.2f}x)")
    split = {}
    for r in rows:
        if r["system"] == "kiln_warm":
            for k, v in r["split_s"].items():
                split[k] = split.get(k, 0.0) + v
    print("kiln warm split over all graphs (s): " +
          ", ".join(f"{k} {v:.3f}" for k, v in split.items()))


if __name__ == "__main__":
    main()
