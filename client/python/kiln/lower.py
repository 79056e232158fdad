"""Lowers a graph from torch 2's Dynamo to a kiln.v1.Graph of core ATen ops.

lower(gm) traces Dynamo's FX graph again with the fake tensors Dynamo made
for its inputs (no real computation, no copy of weights), functionalized and
decomposed into core ATen by torch's own tables. The fake tensors carry
Dynamo's shape environment, so a dimension Dynamo made dynamic stays a symbol
("s77") in the graph's metadata; sym_size nodes and SymInt arithmetic are
folded into the arguments that use them, as expressions ("8*s77").

What the graph keeps of Dynamo's graph:
  - Inputs: Dynamo's tensor placeholders, in its order (parameters are inputs
    read at every call, never constants of the graph); SymInt placeholders
    are not graph inputs: their values are sizes of the tensor inputs.
  - Outputs: Dynamo's outputs, then one per input that the graph writes in
    place (batch norm's running statistics, num_batches_tracked): the new
    value, which the caller copies back into the input (Lowered.mutations).
An in-place op whose functional form exists (`_native_batch_norm_legit` ->
`_native_batch_norm_legit_functional`) is replaced by it.

A tensor the function makes from a literal is a graph input after Dynamo's,
which the call passes (Lowered.constants). Anything that has no
kiln.v1.Graph form (an output that is not a tensor, a size expression beyond
+ and *, a tensor constant on another device than the inputs) raises
Unsupported, and the backend runs that graph eagerly.

Lowering a static graph is cached on disk, as Inductor caches its FX graphs:
under $KILN_CACHE_DIR (default ~/.cache/kiln), keyed by Dynamo's graph code,
its inputs' metadata, the grad mode and the versions of torch and of this
module. A later process that meets the same graph skips the re-trace (the
warm start). Graphs with symbolic sizes are always lowered: lowering may add
guards to Dynamo's shape environment. KILN_LOWER_CACHE=0 turns the cache off.
"""

import base64
import collections
import contextlib
import hashlib
import json
import operator
import os
import re
import tempfile

import torch
import torch.fx
from torch._dispatch.python import enable_python_dispatcher

from kiln import decompositions, symfloats, tracer, tracing
from kiln.v1 import graph_pb2, guards_pb2

__all__ = ["Unsupported", "Lowered", "lower", "size_expr"]


# Raised where a graph has no kiln.v1.Graph form (kiln.tracing raises it too).
Unsupported = tracing.Unsupported

Lowered = collections.namedtuple("Lowered", [
    "graph",           # kiln.v1.Graph
    "guards",          # kiln.v1.GuardSet
    "tensor_args",     # positions of Dynamo's arguments that are graph inputs
    "num_outputs",     # Dynamo's outputs (the first outputs of the graph)
    "mutations",       # [(argument position, graph output index)]: copy back
    "shape_env",       # Dynamo's ShapeEnv, or None
    "constants",       # tensors the graph made from literals: its last inputs
], defaults=((),))


# Functions of sizes, as sympy and torch's ShapeEnv spell them, that kilnd's
# grammar (compiler/ir/sym_expr.h) reads by the same names: a slice of a
# symbolic size is Max(1, s0 - 1), a strided one FloorDiv(s0 + 1, 2).
_SIZE_FUNCTIONS = frozenset((
    "Max", "Min", "Mod", "PythonMod", "FloorDiv", "CeilDiv", "Abs", "floor", "ceiling",
    "FloorToInt", "CeilToInt"))


def _size_term(a):
    import sympy

    if isinstance(a, (sympy.Symbol, sympy.Integer, sympy.Add, sympy.Mul)):
        return True
    if isinstance(a, sympy.Pow):
        return a.exp.is_Integer and int(a.exp) >= 0
    return type(a).__name__ in _SIZE_FUNCTIONS


def size_expr(value):
    """An int, or the expression text of a SymInt (sympy expression) in the
    grammar kilnd reads; Unsupported beyond + - * ** and integers and the
    functions of _SIZE_FUNCTIONS."""
    if isinstance(value, int):
        return value
    if isinstance(value, torch.SymInt):
        node = value.node
        if node.is_nested_int():
            raise Unsupported("nested-int sizes")
        expr = node.expr
    else:
        expr = value
    import sympy

    if expr.is_Integer:
        return int(expr)
    for a in sympy.preorder_traversal(expr):
        if not _size_term(a):
            raise Unsupported(f"size expression {expr} uses {type(a).__name__}, which kilnd "
                              f"does not read")
    return str(expr)


_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def _bound_symbols(graph):
    """The symbols some input tensor has as a dimension of its own: those a
    plan binds (from the input's size) and kilnd's guards evaluate."""
    return {s.expr for ph in graph.inputs for s in ph.value.meta.sizes
            if s.expr and _NAME.fullmatch(s.expr)}


def _check_bound_symbols(graph):
    """Unsupported when the graph sizes a value by a symbol that no input
    tensor has as a dimension of its own (one bound only by an int
    argument, as in x[:, :n]): kilnd's plans bind symbols from input sizes
    only, and the partition of a graph that needs gradients binds each
    symbol its backward uses by saving an input that has it."""
    bound = _bound_symbols(graph)

    def check(meta, what):
        for s in list(meta.sizes) + list(meta.strides) + [meta.storage_offset]:
            for name in _NAME.findall(s.expr):
                if name not in bound and name not in _SIZE_FUNCTIONS:
                    raise Unsupported(f"symbol {name} of {what} ({s.expr}) is no input "
                                      f"tensor's dimension (an int argument's?)")

    for ph in graph.inputs:
        check(ph.value.meta, f"input '{ph.value.name}'")
    for node in graph.nodes:
        for out in node.outputs:
            check(out.meta, f"'{out.name}'")


def _sym_proto(value, out):
    e = size_expr(value)
    if isinstance(e, int):
        out.int_value = e
    else:
        out.expr = e
    return out


# Results that ATen's CUDA kernel returns on the host where the fake
# tensors put them on the device: memory-efficient attention's RNG seed and
# offset without dropout (kilnd's shape rule says where they are).
_HOST_RESULTS = {torch.ops.aten._scaled_dot_product_efficient_attention.default: (2, 3)}


def _meta(val, requires_grad):
    meta = graph_pb2.TensorMeta(dtype=tracer._dtype(val.dtype), requires_grad=requires_grad)
    for s in val.shape:
        _sym_proto(s, meta.sizes.add())
    for s in val.stride():
        _sym_proto(s, meta.strides.add())
    tracer._device(val.device, meta.device)
    _sym_proto(val.storage_offset(), meta.storage_offset)
    return meta


def _is_size(node):
    return isinstance(node, torch.fx.Node) and isinstance(
        node.meta.get("val"), (int, torch.SymInt)) and not isinstance(node.meta.get("val"), bool)


def _set_argument(arg, value, names, schema_type, where):
    """tracer._set_argument, with SymInts (values of size nodes, or SymInt
    objects) as sym_int / sym_ints."""
    if _is_size(value) or isinstance(value, torch.SymInt):
        sym = value.meta["val"] if isinstance(value, torch.fx.Node) else value
        e = size_expr(sym)
        if isinstance(e, int):
            arg.int_value = e
        else:
            arg.sym_int.expr = e
        return
    if isinstance(value, (list, tuple)) and any(
            _is_size(v) or isinstance(v, torch.SymInt) for v in value):
        for v in value:
            sym = v.meta["val"] if isinstance(v, torch.fx.Node) else v
            _sym_proto(sym, arg.sym_ints.values.add())
        return
    tracer._set_argument(arg, value, names, schema_type, where)


def _functional_variant(op):
    """(functional overload, indices of the mutated arguments) for in-place
    ATen op `op`, or None: `<name>_functional` returning op's results and
    then one new value per mutated argument."""
    schema = op._schema
    mutated = [i for i, a in enumerate(schema.arguments)
               if a.alias_info is not None and a.alias_info.is_write]
    packet = getattr(torch.ops.aten, f"{schema.name.split('::')[1]}_functional", None)
    if packet is None or not mutated:
        return None
    candidate = getattr(packet, op._overloadname, None)
    if candidate is None or len(candidate._schema.returns) != len(schema.returns) + len(mutated):
        return None
    return candidate, mutated


def _mutations(fx, placeholders):
    """Rewrites in-place writes to graph inputs as extra outputs. Returns
    [(placeholder index, fx node of its new value)]."""
    index = {p: i for i, p in enumerate(placeholders)}
    writes = {}
    for node in list(fx.nodes):
        if node.op != "call_function":
            continue
        if node.target is torch.ops.aten.copy_.default and node.args[0] in index:
            writes[index[node.args[0]]] = node.args[1]
            fx.erase_node(node)
            continue
        op = node.target
        if not isinstance(op, torch._ops.OpOverload) or not op._schema.is_mutable:
            continue
        variant = _functional_variant(op)
        if variant is None:
            raise Unsupported(f"node '{node.name}' ({op}) writes to its arguments")
        functional, mutated = variant
        num_results = len(op._schema.returns)
        with fx.inserting_after(node):
            new = fx.call_function(functional, node.args, node.kwargs)
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        fx.erase_node(node)
        for k, arg_index in enumerate(mutated):
            written = new.args[arg_index] if arg_index < len(new.args) else None
            if written not in index:
                raise Unsupported(f"node '{new.name}' ({op}) writes to an intermediate value")
            with fx.inserting_after(new):
                item = fx.call_function(operator.getitem, (new, num_results + k))
            writes[index[written]] = item
        # The functional op's results after op's: its meta from a fake run.
        with new.meta["val"][0].fake_mode:
            args = torch.fx.node.map_arg(new.args, lambda n: n.meta["val"])
            kwargs = torch.fx.node.map_arg(new.kwargs, lambda n: n.meta["val"])
            new.meta["val"] = functional(*args, **kwargs)
        for user in new.users:
            user.meta["val"] = new.meta["val"][user.args[1]]
    return sorted(writes.items())


def _guards(graph, shape_env):
    """The GuardSet: every input's dtype, device, sizes (constants or
    symbols) and strides; the symbols' ranges and the shape environment's
    guards that kilnd can evaluate; the rest as a client digest."""
    guards = guards_pb2.GuardSet()
    for ph in graph.inputs:
        meta = ph.value.meta
        g = guards.tensors.add(name=ph.value.name, dtype=meta.dtype,
                               stride_check=guards_pb2.TensorGuard.EXACT,
                               check_requires_grad=True, requires_grad=meta.requires_grad)
        g.device.CopyFrom(meta.device)
        g.sizes.extend(meta.sizes)
        g.strides.extend(meta.strides)
    opaque = []
    if shape_env is not None:
        used = set()
        for ph in graph.inputs:
            for s in ph.value.meta.sizes:
                if s.WhichOneof("value") == "expr":
                    used.add(s.expr)
        bound = _bound_symbols(graph)
        for symbol, bounds in sorted(shape_env.var_to_range.items(), key=lambda kv: str(kv[0])):
            if str(symbol) not in used:
                continue
            if bounds.lower.is_Integer:
                guards.shape_guards.append(f"{symbol} >= {int(bounds.lower)}")
            if bounds.upper.is_Integer:
                guards.shape_guards.append(f"{symbol} <= {int(bounds.upper)}")
        for guard in shape_env.guards:
            text = _guard_text(guard.expr)
            # A guard on a symbol no input size binds (an int argument's,
            # as in `if n > 3`) is Dynamo's to check: kilnd cannot.
            if text is None or any(str(sym) not in bound for sym in guard.expr.free_symbols):
                opaque.append(str(guard.expr))
            else:
                guards.shape_guards.append(text)
    if opaque:
        import hashlib
        guards.client_guard_digest = hashlib.sha256("\n".join(opaque).encode()).digest()
    return guards


def _guard_text(expr):
    """A sympy relation in kilnd's guard grammar, or None."""
    import sympy

    ops = {sympy.Eq: "==", sympy.Ne: "!=", sympy.Ge: ">=", sympy.Gt: ">", sympy.Le: "<=",
           sympy.Lt: "<"}
    for kind, op in ops.items():
        if isinstance(expr, kind):
            try:
                lhs, rhs = size_expr(expr.lhs), size_expr(expr.rhs)
            except Unsupported:
                return None
            return f"{lhs} {op} {rhs}"
    return None


# Disk cache of lowered static graphs (see the module's documentation).
_CACHE_FORMAT = "kiln-lowered-2"
_CACHE_MAX_FILES = 4096
cache_stats = {"hits": 0, "misses": 0}
_SOURCE_DIGEST = None


def _source_digest():
    """What of this client shapes a lowered graph: this module, tracing,
    tracer, the floats of sizes and the decomposition table."""
    global _SOURCE_DIGEST
    if _SOURCE_DIGEST is None:
        h = hashlib.sha256()
        for module in (__file__, tracing.__file__, tracer.__file__, symfloats.__file__,
                       decompositions.__file__):
            with open(module, "rb") as f:
                h.update(f.read())
        _SOURCE_DIGEST = h.hexdigest()
    return _SOURCE_DIGEST


def _graph_text(gm):
    """The graph as text for the cache key: each node's op, name, target
    (by qualified name) and arguments, as gm.code says them, without
    generating gm's Python code (several milliseconds per hundred nodes for
    the lazily compiled modules Dynamo passes); None for a target without a
    qualified name."""
    lines = []
    for n in gm.graph.nodes:
        target = n.target
        if not isinstance(target, str):
            try:
                target = torch.fx.node._get_qualified_name(target)
            except (RuntimeError, AttributeError, TypeError):
                return None
        lines.append(f"{n.op} {n.name} {target} {n.args!r} {n.kwargs!r}")
    return "\n".join(lines)


def _cache_path(gm, placeholders, fakes, fake_mode):
    """The cache file of this static graph, or None when it is not cached."""
    if os.environ.get("KILN_LOWER_CACHE", "1") == "0":
        return None
    if fake_mode.shape_env is not None and fake_mode.shape_env.var_to_range:
        return None  # symbolic: lowering may add guards to the shape env
    if any(n.op in ("get_attr", "call_module") for n in gm.graph.nodes):
        return None  # what the code names is not in the code
    text = _graph_text(gm)
    if text is None:
        return None
    parts = [_CACHE_FORMAT, torch.__version__, _source_digest(), str(torch.is_grad_enabled()),
             str(torch.get_default_dtype()), text]
    for node, fake in zip(placeholders, fakes):
        if isinstance(fake, torch.Tensor):
            parts.append(f"tensor {node.name} {fake.dtype} {tuple(fake.shape)} {fake.stride()} "
                         f"{fake.storage_offset()} {fake.device} {fake.requires_grad} "
                         f"{isinstance(fake, torch.nn.Parameter)}")
        elif isinstance(fake, (bool, int, float, str)) or fake is None:
            parts.append(f"value {node.name} {type(fake).__name__} {fake!r}")
        else:
            return None
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    root = os.environ.get("KILN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                            "kiln")
    return os.path.join(root, "lowered", key[:2], key + ".json")


def _read_cached(path, name, shape_env):
    try:
        with open(path) as f:
            record = json.load(f)
        if record.get("format") != _CACHE_FORMAT:
            return None
        graph = graph_pb2.Graph.FromString(base64.b64decode(record["graph"]))
        guards = guards_pb2.GuardSet.FromString(base64.b64decode(record["guards"]))
        graph.name = name
        os.utime(path)  # recency, for the trim below
        return Lowered(graph, guards, list(record["tensor_args"]), int(record["num_outputs"]),
                       [tuple(m) for m in record["mutations"]], shape_env)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing or damaged: lower again, and write it anew


def _write_cached(path, lowered):
    record = {"format": _CACHE_FORMAT,
              "graph": base64.b64encode(lowered.graph.SerializeToString()).decode(),
              "guards": base64.b64encode(lowered.guards.SerializeToString()).decode(),
              "tensor_args": lowered.tensor_args, "num_outputs": lowered.num_outputs,
              "mutations": [list(m) for m in lowered.mutations]}
    try:
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)  # readers see the old file or the whole new one
        _trim(os.path.dirname(directory))
    except OSError:
        pass  # a read-only or full disk only costs the next process a re-trace


def _trim(root):
    """Keeps the newest _CACHE_MAX_FILES files, by last use."""
    files = []
    for sub in os.scandir(root):
        if sub.is_dir():
            files.extend(e for e in os.scandir(sub.path) if e.name.endswith(".json"))
    if len(files) <= _CACHE_MAX_FILES:
        return
    files.sort(key=lambda e: e.stat().st_mtime)
    for entry in files[:len(files) - _CACHE_MAX_FILES]:
        try:
            os.remove(entry.path)
        except OSError:
            pass


def lower(gm, example_inputs, name="graph"):
    """Lowers Dynamo's graph `gm` (called with `example_inputs`) to a Lowered.
    Raises Unsupported when the graph has no kiln.v1.Graph form."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fakes = [n.meta.get("example_value") for n in placeholders]
    if any(f is None for f in fakes) or len(fakes) != len(example_inputs):
        raise Unsupported("the graph's inputs carry no fake values")
    fake_mode = next((f.fake_mode for f in fakes if isinstance(f, torch._subclasses.FakeTensor)),
                     None)
    if fake_mode is None:
        raise Unsupported("the graph has no tensor inputs")
    path = _cache_path(gm, placeholders, fakes, fake_mode)
    if path is not None:
        cached = _read_cached(path, name, fake_mode.shape_env)
        if cached is not None:
            cache_stats["hits"] += 1
            return cached
        cache_stats["misses"] += 1
    lowered = _lower(gm, placeholders, fakes, fake_mode, name)
    if path is not None and not lowered.constants:  # the cache keeps no tensor data
        _write_cached(path, lowered)
    return lowered


def _writes_intermediate(fx):
    """Whether an in-place op of `fx` writes to a value that is not a graph
    input."""
    for node in fx.nodes:
        op = node.target
        if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload) \
                or not op._schema.is_mutable:
            continue
        for i, a in enumerate(op._schema.arguments):
            if a.alias_info is None or not a.alias_info.is_write:
                continue
            written = node.args[i] if i < len(node.args) else node.kwargs.get(a.name)
            if not (isinstance(written, torch.fx.Node) and written.op == "placeholder"):
                return True
    return False


def _functionalized(fx, fakes, fake_mode):
    """`fx` traced again through functionalization. The in-place ops a
    composite kernel or a decomposition runs beneath the first trace's
    functionalization (rms_norm's add_ of its epsilon, cross_entropy's
    copy_ of its smoothed loss) reach the graph as they are; called from
    the graph, they meet functionalization first and become their
    out-of-place forms, decomposed as the first trace would have."""
    module = fx.owning_module or torch.fx.GraphModule(torch.nn.Module(), fx)

    def run(*args):
        return torch.fx.Interpreter(module).run(*args)

    with fake_mode, enable_python_dispatcher():
        return tracing.functional_graph(run, fakes)


def _attention_choices(gm, fakes):
    """Where the graph's tensors are on CUDA, a context in which SDPA
    chooses between memory-efficient attention (whose results are tensors,
    and which kilnd differentiates) and the math form: the fused kernels it
    would pick for 16-bit tensors, cuDNN's and flash attention, return
    integers (the sequence lengths), which a graph cannot carry, and the
    graph would run eagerly. A graph whose attention has a mask (a padding
    mask, nn.MultiheadAttention's key_padding_mask, a learned bias) takes
    the math form alone, whose matmuls, masked softmax and gradients kilnd
    compiles: memory-efficient attention would take the mask as its bias,
    which kilnd does not pass."""
    if not any(isinstance(f, torch.Tensor) and f.is_cuda for f in fakes):
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if _masked_attention(gm):
        return sdpa_kernel([SDPBackend.MATH])
    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _masked_attention(gm):
    """Whether a call of scaled_dot_product_attention in `gm`, or of the
    multi-head attention Dynamo keeps whole (nn.MultiheadAttention), has a
    mask."""
    def argument(node, name, position):
        if name in node.kwargs:
            return node.kwargs[name]
        return node.args[position] if len(node.args) > position else None

    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target in _SDPA and argument(node, "attn_mask", 3) is not None:
            return True
        if node.target is torch.nn.functional.multi_head_attention_forward and (
                argument(node, "key_padding_mask", 14) is not None
                or argument(node, "attn_mask", 16) is not None):
            return True
    return False


_SDPA = (torch.nn.functional.scaled_dot_product_attention,
         torch.ops.aten.scaled_dot_product_attention.default)


def _complex_products_as_real(fx, fake_mode):
    """Rewrites view_as_real(view_as_complex(x) * f), rotary embeddings
    as Llama writes them (x real with pairs in its last dim, f complex or
    real), into real arithmetic on x's pairs and f's parts: kilnd has no
    complex kernels or derivative rules, so the product ran through ATen
    and a training graph, whose gradient must flow through it to x, was
    refused. What is left complex (f, made from inputs that need no
    gradient) runs through ATen."""
    aten = torch.ops.aten

    def call(op, *args):
        node = fx.call_function(op, args)
        with fake_mode:
            node.meta["val"] = op(*torch.fx.node.map_arg(args, lambda n: n.meta["val"]))
        return node

    for real in list(fx.nodes):
        if real.target is not aten.view_as_real.default:
            continue
        product = real.args[0]
        if not isinstance(product, torch.fx.Node) or product.target is not aten.mul.Tensor \
                or len(product.users) != 1 or len(product.args) != 2:
            continue
        pair, factor = product.args
        if isinstance(factor, torch.fx.Node) and factor.target is aten.view_as_complex.default:
            pair, factor = factor, pair
        if not (isinstance(pair, torch.fx.Node) and pair.target is aten.view_as_complex.default
                and isinstance(factor, torch.fx.Node)
                and isinstance(factor.meta.get("val"), torch.Tensor)):
            continue
        x = pair.args[0]
        with fx.inserting_before(real):
            xr, xi = call(aten.select.int, x, -1, 0), call(aten.select.int, x, -1, 1)
            if factor.meta["val"].is_complex():
                f = call(aten.view_as_real.default, factor)
                fr, fi = call(aten.select.int, f, -1, 0), call(aten.select.int, f, -1, 1)
                re = call(aten.sub.Tensor, call(aten.mul.Tensor, xr, fr),
                          call(aten.mul.Tensor, xi, fi))
                im = call(aten.add.Tensor, call(aten.mul.Tensor, xr, fi),
                          call(aten.mul.Tensor, xi, fr))
            else:  # a real factor scales both parts
                re, im = call(aten.mul.Tensor, xr, factor), call(aten.mul.Tensor, xi, factor)
            out = call(aten.cat.default,
                       [call(aten.unsqueeze.default, re, -1), call(aten.unsqueeze.default, im, -1)],
                       -1)
        real.replace_all_uses_with(out)
        fx.erase_node(real)
        fx.erase_node(product)
        if not pair.users:
            fx.erase_node(pair)


def _lower(gm, placeholders, fakes, fake_mode, name):
    grad = torch.is_grad_enabled()
    with _attention_choices(gm, fakes):
        fx = tracing.trace(gm, fakes, fake_mode)
    if _writes_intermediate(fx):
        fx = _functionalized(fx, fakes, fake_mode)
    _complex_products_as_real(fx, fake_mode)
    symfloats.as_tensors(fx, fake_mode)
    traced_placeholders = [n for n in fx.nodes if n.op == "placeholder"]
    writes = _mutations(fx, traced_placeholders)
    output_node = next(n for n in fx.nodes if n.op == "output")
    user_outputs, _ = torch.utils._pytree.tree_flatten(output_node.args[0])
    # The new values of written inputs are outputs too: they stay alive.
    output_node.args = (tuple(user_outputs) + tuple(value for _, value in writes),)
    fx.eliminate_dead_code()

    graph = graph_pb2.Graph(name=name)
    names = {}
    taken = tracer._Names()
    for node in fx.nodes:
        if node.op == "call_function":
            taken.reserve(node.name)
    tensor_args = []
    constants = []
    requires_grad = {}
    for i, (node, dynamo_node, fake) in enumerate(zip(traced_placeholders, placeholders, fakes)):
        if not isinstance(fake, torch.Tensor):
            continue  # a SymInt (or other scalar) argument
        tensor_args.append(i)
        kind = (graph_pb2.Placeholder.PARAMETER if isinstance(fake, torch.nn.Parameter)
                or "parameters" in dynamo_node.name else graph_pb2.Placeholder.USER_INPUT)
        names[node] = taken.unique(dynamo_node.name)
        requires_grad[node] = grad and fake.requires_grad
        ph = graph.inputs.add(kind=kind)
        ph.value.name = names[node]
        ph.value.meta.CopyFrom(_meta(node.meta["val"], requires_grad[node]))

    for node in fx.nodes:
        if node.op in ("placeholder", "output") or _is_size(node):
            continue
        if node.op == "get_attr":
            # A tensor made from a literal (torch.tensor([...])): an input
            # of the graph, which the call passes, so that its values are
            # never part of a key.
            value = getattr(fx.owning_module, node.target, None) if fx.owning_module else None
            if not isinstance(value, torch.Tensor):
                raise Unsupported(f"the graph holds a constant ('{node.target}') that is not "
                                  "a tensor")
            devices = sorted({ph.value.meta.device.type for ph in graph.inputs})
            if devices and value.device.type not in devices:
                raise Unsupported(f"the graph holds a tensor constant ('{node.target}') on "
                                  f"{value.device.type}, its inputs on {', '.join(devices)}")
            names[node] = taken.unique(node.target.lstrip("_"))
            requires_grad[node] = False
            ph = graph.inputs.add(kind=graph_pb2.Placeholder.USER_INPUT)
            ph.value.name = names[node]
            ph.value.meta.CopyFrom(_meta(value, False))
            constants.append(value)
            continue
        if node.target is operator.getitem:
            continue
        where = f"node '{node.name}'"
        if not isinstance(node.target, torch._ops.OpOverload):
            raise Unsupported(f"{where} calls {node.target}, not an ATen operator")
        result = node.meta.get("val")
        stop = node.target is torch.ops.kiln.stop_gradient.default
        pn = graph.nodes.add(name=node.name, target="aten.detach.default" if stop
                             else tracer._target_name(node.target))
        tracer.fill_arguments(pn, node, names, where, set_argument=_set_argument)
        # Autograd's rule: a floating-point result of an op with an operand
        # that requires grad requires grad.
        operands = [a for a in node.all_input_nodes if a in requires_grad]
        node_grad = grad and not stop and any(requires_grad[a] for a in operands)

        def differentiable(r):
            return node_grad and (r.is_floating_point() or r.is_complex())

        results = [result] if isinstance(result, torch.Tensor) else list(result or [])
        if not all(isinstance(r, torch.Tensor) for r in results):
            raise Unsupported(f"{where} ({pn.target}) returns a non-tensor value")
        if isinstance(result, torch.Tensor):
            names[node] = node.name
            requires_grad[node] = differentiable(result)
            pn.outputs.add(name=node.name).meta.CopyFrom(_meta(result, requires_grad[node]))
            continue
        getitems = {}
        for user in node.users:
            if user.target is operator.getitem:
                getitems.setdefault(user.args[1], []).append(user)
            else:
                raise Unsupported(f"{where}: its list of outputs is used whole")
        for i, r in enumerate(results):
            users = getitems.get(i, [])
            value_name = users[0].name if users else taken.unique(f"{node.name}_out{i}")
            for user in users:
                names[user] = value_name
                requires_grad[user] = differentiable(r)
            meta = pn.outputs.add(name=value_name).meta
            meta.CopyFrom(_meta(r, differentiable(r)))
            if i in _HOST_RESULTS.get(node.target, ()):
                meta.device.type, meta.device.index = "cpu", -1

    outputs = list(user_outputs) + [value for _, value in writes]
    for leaf in outputs:
        if not isinstance(leaf, torch.fx.Node) or leaf not in names:
            raise Unsupported(f"the graph returns a non-tensor value {leaf!r}")
        graph.outputs.append(names[leaf])
    mutations = [(tensor_args_index, len(user_outputs) + k)
                 for k, (tensor_args_index, _) in enumerate(writes)]
    _check_bound_symbols(graph)
    shape_env = fake_mode.shape_env
    return Lowered(graph, _guards(graph, shape_env), tensor_args, len(user_outputs), mutations,
                   shape_env, tuple(constants))
