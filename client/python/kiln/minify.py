"""The accuracy minifier: the smallest subgraph whose compiled code computes
a wrong value, found where a runtime runs (this process, on its CPU or GPU).

    small = kiln.minify_accuracy(graph, inputs, client, options)
    python -m kiln minify --accuracy graph.json --server=HOST:PORT -o DIR

A subgraph "fails" when kilnd compiles it and one of its outputs, run on the
values the whole graph computes at that point, is farther from a float64
reference than eager PyTorch in the graph's own dtypes is, by more than a
tolerance (see accuracy_error). For a training graph (an input whose
metadata requires grad) the gradients of its inputs for a fixed cotangent
are compared the same way. Delta debugging over the graph's nodes (as
`kilnctl minify` does for compile errors) keeps removing nodes while the
rest still fails.
"""

import os

import torch

from kiln.compiled import ArtifactFunction
from kiln.runtime import Interpreter, torch_device, torch_dtype

__all__ = ["minify_accuracy", "accuracy_error", "subgraph", "delta_debug", "random_inputs"]


def subgraph(graph, keep):
    """The kiln.v1.Graph of the nodes of `graph` at the ascending indices
    `keep`: values they read from other nodes become inputs, values no kept
    node reads become outputs (client/minify.h's Subgraph, in Python)."""
    from kiln.v1 import graph_pb2

    meta = {ph.value.name: ph.value.meta for ph in graph.inputs}
    for node in graph.nodes:
        for v in node.outputs:
            meta[v.name] = v.meta
    made = {v.name for k in keep for v in graph.nodes[k].outputs}
    reads = []
    for k in keep:
        for name in _reads(graph.nodes[k]):
            if name not in reads:
                reads.append(name)
    out = graph_pb2.Graph(name=graph.name)
    original = {ph.value.name for ph in graph.inputs}
    for ph in graph.inputs:
        if ph.value.name in reads:
            out.inputs.add().CopyFrom(ph)
    for name in reads:
        if name not in original and name not in made and name in meta:
            ph = out.inputs.add(kind=graph_pb2.Placeholder.USER_INPUT)
            ph.value.name = name
            ph.value.meta.CopyFrom(meta[name])
    for k in keep:
        out.nodes.add().CopyFrom(graph.nodes[k])
    for k in keep:
        for v in graph.nodes[k].outputs:
            if v.name not in reads:
                out.outputs.append(v.name)
    return out


def _reads(node):
    for arg in list(node.args) + list(node.kwargs):
        kind = arg.WhichOneof("kind")
        if kind == "tensor":
            yield arg.tensor
        elif kind == "tensors":
            yield from (t for t in arg.tensors.names if t)


def delta_debug(items, fails):
    """Zeller's ddmin: a 1-minimal sublist of `items` on which `fails` holds,
    given that it holds on `items`."""
    items, n, tried = list(items), 2, {}

    def test(subset):
        key = tuple(subset)
        if key not in tried:
            tried[key] = fails(subset)
        return tried[key]

    while len(items) >= 2:
        size = len(items)
        chunks = [items[size * c // n:size * (c + 1) // n] for c in range(n)]
        chunks = [c for c in chunks if c]
        reduced = next((c for c in chunks if test(c)), None)
        if reduced is None and len(chunks) > 2:
            for c in range(len(chunks)):
                rest = [x for d, chunk in enumerate(chunks) if d != c for x in chunk]
                if test(rest):
                    reduced, n = rest, max(n - 1, 2)
                    break
        elif reduced is not None:
            n = 2
        if reduced is not None:
            items = reduced
            continue
        if n >= len(items):
            break
        n = min(len(items), 2 * n)
    return items


def accuracy_error(result, reference, fp64):
    """How far `result` is from the float64 reference `fp64` beyond what
    eager's own rounding (`reference`, in the graph's dtypes) explains: the
    largest |result - fp64| - (2 |reference - fp64| + 1e-5 (1 + |fp64|)),
    elementwise; positive means wrong. Integer and bool outputs must match
    exactly (any difference is 1)."""
    if not (result.is_floating_point() or result.is_complex()):
        return 0.0 if torch.equal(result, reference) else 1.0
    res, ref, exact = result.double(), reference.double(), fp64.double()
    allowed = 2 * (ref - exact).abs() + 1e-5 * (1 + exact.abs())
    excess = (res - exact).abs() - allowed
    excess = torch.nan_to_num(excess, nan=float("inf"))
    return float(excess.max()) if excess.numel() else 0.0


def random_inputs(graph, seed=0):
    """Random tensors of the graph's inputs' metadata (static sizes)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for ph in graph.inputs:
        meta = ph.value.meta
        sizes = [s.int_value for s in meta.sizes]
        strides = [s.int_value for s in meta.strides]
        dtype = torch_dtype(meta.dtype)
        t = torch.empty_strided(sizes, strides, dtype=dtype)
        if dtype.is_floating_point:
            t.copy_(torch.randn(sizes, generator=gen, dtype=torch.float64))
        elif dtype == torch.bool:
            t.copy_(torch.randint(0, 2, sizes, generator=gen).bool())
        else:
            t.copy_(torch.randint(0, 8, sizes, generator=gen))
        out.append(t.to(torch_device(meta.device)))
    return out


class Minified:
    """`graph` (kiln.v1.Graph) and `inputs`, its smallest failing subgraph and
    the values it reads; `error` (accuracy_error of its worst output);
    `compiles` (subgraphs compiled)."""

    def __init__(self, graph, inputs, error, compiles):
        self.graph, self.inputs, self.error, self.compiles = graph, inputs, error, compiles


def minify_accuracy(graph, inputs, client, options, namespace=""):
    """Minifies static graph `graph` (kiln.v1.Graph) run on `inputs`
    (None: random_inputs) whose code, compiled by kilnd
    (`client`, a kiln.Client; `options`, kiln.v1.CompileOptions) computes a
    wrong value: an output or, for a training graph (an input whose
    metadata requires grad), the gradient of an input. Returns a Minified;
    ValueError when the whole graph is accurate."""
    if inputs is None:
        inputs = random_inputs(graph)
    # Every value the graph computes, in its own dtypes and in float64.
    everything = _all_values(graph)
    values = dict(zip(everything.outputs, Interpreter(everything).run(inputs)))
    values.update((ph.value.name, t) for ph, t in zip(graph.inputs, inputs))
    compiles = 0

    def error_of(sub):
        nonlocal compiles
        sub_inputs = [values[ph.value.name].detach() for ph in sub.inputs]
        grads = [ph.value.meta.requires_grad and t.is_floating_point()
                 for ph, t in zip(sub.inputs, sub_inputs)]
        compiles += 1
        try:
            response = client.compile(sub, options=options, namespace=namespace,
                                      bypass_cache=True)
            compiled = ArtifactFunction(response.artifact, sub)
            results = _run(compiled, sub_inputs, grads)
        except Exception:  # noqa: BLE001 (another failure is not this one)
            return None
        reference = _run(Interpreter(sub).run, sub_inputs, grads)
        fp64 = _run(Interpreter(_in_float64(sub)).run, [_to_float64(t) for t in sub_inputs],
                    grads)
        return max((accuracy_error(r, e, x) for r, e, x in zip(results, reference, fp64)),
                   default=0.0)

    whole = error_of(graph)
    if whole is None or whole <= 0:
        raise ValueError(f"graph '{graph.name}' is accurate under these options "
                         f"(worst excess error {whole}): nothing to minify")
    keep = delta_debug(range(len(graph.nodes)),
                       lambda k: (error_of(subgraph(graph, k)) or 0) > 0)
    small = subgraph(graph, keep)
    return Minified(small, [values[ph.value.name] for ph in small.inputs], error_of(small),
                    compiles)


def _run(fn, inputs, grads):
    """fn's outputs on `inputs`, then, for a training graph (an input that
    requires grad), the gradients of those inputs for a fixed cotangent of
    every floating-point output (ones scaled by 1/numel, in the outputs'
    dtypes): what accuracy compares."""
    if not any(grads):
        with torch.no_grad():
            return list(fn(inputs))
    inputs = [t.detach().clone().requires_grad_(g) for t, g in zip(inputs, grads)]
    outputs = list(fn(inputs))
    pairs = [(o, torch.full_like(o, 1.0 / max(o.numel(), 1))) for o in outputs
             if o.requires_grad and (o.is_floating_point() or o.is_complex())]
    needs = [t for t in inputs if t.requires_grad]
    got = torch.autograd.grad([o for o, _ in pairs], needs, [c for _, c in pairs],
                              allow_unused=True) if pairs else [None] * len(needs)
    return ([o.detach() for o in outputs]
            + [torch.zeros_like(t) if g is None else g for t, g in zip(needs, got)])


def _all_values(graph):
    """`graph` with every node output as a graph output."""
    out = type(graph)()
    out.CopyFrom(graph)
    del out.outputs[:]
    for node in graph.nodes:
        out.outputs.extend(v.name for v in node.outputs)
    return out


def _to_float64(t):
    return t.double() if t.is_floating_point() else t


def _in_float64(graph):
    """`graph` with every floating-point value float64, for the reference."""
    from kiln.v1 import graph_pb2

    floating = {graph_pb2.FLOAT16, graph_pb2.BFLOAT16, graph_pb2.FLOAT32}
    out = type(graph)()
    out.CopyFrom(graph)
    metas = [ph.value.meta for ph in out.inputs]
    metas += [v.meta for node in out.nodes for v in node.outputs]
    for meta in metas:
        if meta.dtype in floating:
            meta.dtype = graph_pb2.FLOAT64
    for node in out.nodes:
        for arg in list(node.args) + list(node.kwargs):
            if arg.WhichOneof("kind") == "dtype" and arg.dtype in floating:
                arg.dtype = graph_pb2.FLOAT64
    return out


def main(argv=None):
    """python -m kiln minify --accuracy FILE [--server ADDR] [-o DIR]"""
    import argparse

    from google.protobuf import json_format

    from kiln.client import Client
    from kiln.v1 import service_pb2

    parser = argparse.ArgumentParser(prog="python -m kiln minify")
    parser.add_argument("--accuracy", action="store_true", required=True,
                        help="minify a graph whose compiled code computes a wrong value")
    parser.add_argument("file", help="a kiln.v1.GraphFile in protobuf JSON")
    parser.add_argument("--server", default=os.environ.get("KILN_SERVER", "127.0.0.1:50051"))
    parser.add_argument("--backend", default=None, help="overrides the file's backend")
    parser.add_argument("-o", dest="out", required=True, help="the directory to write into")
    args = parser.parse_args(argv)
    with open(args.file) as f:
        graph_file = json_format.Parse(f.read(), service_pb2.GraphFile())
    options = graph_file.options
    if args.backend:
        options.backend = args.backend
    with Client(args.server) as client:
        small = minify_accuracy(graph_file.graph, None, client, options)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "minified.json")
    with open(path, "w") as f:
        f.write(json_format.MessageToJson(service_pb2.GraphFile(graph=small.graph,
                                                                options=options)))
    print(f"minified from {len(graph_file.graph.nodes)} to {len(small.graph.nodes)} nodes in "
          f"{small.compiles} compiles; worst excess error {small.error:.3g}")
    print(path)
    return 0
