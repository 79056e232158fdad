"""Capture a PyTorch function or module as a kiln.v1.Graph of core ATen ops.

capture() traces with torch.fx's make_fx (torch 1.13), so the graph holds
ATen overloads (`aten.addmm.default`, `aten.native_layer_norm.default`) after
a small decomposition table has rewritten a few non-core ops (`aten.t`,
`aten.transpose.int`, `aten.silu`...) into core ones. A call that passes a
Python number where its schema wants a Tensor moves to the overload taking a
Scalar (`x + 1e-6` is `aten.add.Scalar`). Ops with several results are one
node with several outputs. The traced graph is then run once on the example
inputs to record the metadata (dtype, sizes, strides, device, requires_grad,
storage offset) of every value.

The graph's inputs come in this order:
  - for an nn.Module: its parameters (kind PARAMETER), then its buffers (kind
    BUFFER), in named_parameters() / named_buffers() order (see
    module_tensors());
  - the tensors among the example inputs (kind USER_INPUT). Example inputs
    that are not tensors (ints, floats, ...) are constants baked into the
    graph.

The graph is functional: no node writes to its arguments.
  - An in-place op (`x.add_(y)`, `torch.empty_like(x).bernoulli_()`)
    becomes its out-of-place overload (`aten.add.Tensor`), whose result
    takes the in-place result's place. This is exact when nothing reads the
    mutated tensor, or a tensor aliasing it, after the write through another
    name; capture refuses (ValueError naming the node) when something does.
  - An in-place update of a graph input is therefore dropped: its functional
    result is unused and removed. The one such update in common models is
    batch norm's `num_batches_tracked += 1` in training mode, so a compiled
    training-mode BatchNorm does not advance num_batches_tracked (it only
    matters for momentum=None). The running mean and variance are updated by
    aten.native_batch_norm itself, whose torch 1.13 schema declares no write:
    running the graph through ATen updates the buffers it is given, as eager
    does.
  - Dropout in training mode (F.dropout, nn.Dropout, torch.dropout, not
    in-place, 0 <= p < 1) is captured as one aten.native_dropout node, which
    draws the same random numbers as eager dropout (same mask for the same
    seed), instead of the empty_like / bernoulli_ / div_ / mul that torch
    1.13 decomposes it into.
Capture leaves the module's buffers as they were: tracing runs the function
twice, on copies of the buffers.

Every value's requires_grad is what autograd gives with gradients enabled:
inputs keep their own flag (a module's parameters usually require grad), and
a value computed from them through a differentiable op requires grad.
"""

import collections
import inspect
import operator

import torch
import torch.fx
from torch._decomp import get_decompositions
from torch.fx.experimental.proxy_tensor import make_fx
from torch.overrides import TorchFunctionMode

from kiln.v1 import graph_pb2, guards_pb2

__all__ = ["capture", "capture_with_structure", "Capture", "signature", "module_tensors",
           "tensor_meta"]

_aten = torch.ops.aten

# Non-core ATen ops that torch 1.13 can decompose into core ones. The rest of
# what make_fx records (CompositeImplicit ops such as linear, matmul, softmax)
# is already decomposed by the dispatcher.
_DECOMPOSITIONS = get_decompositions([
    _aten.t,
    _aten.transpose.int,
    _aten._unsafe_view,
    _aten._reshape_alias,
    _aten.silu,
    _aten.hardswish,
    _aten.hardsigmoid,
    _aten.hardtanh,
    _aten.softplus,
    _aten.mish,
    _aten.addcmul,
    _aten.addcdiv,
    _aten.stack,
    _aten.narrow,
    _aten.logsumexp,
    _aten.std.correction,
    _aten.new_zeros,
    _aten.new_ones,
    _aten.new_full,
    _aten.new_empty,
])

_DTYPES = {
    torch.float32: graph_pb2.FLOAT32,
    torch.float64: graph_pb2.FLOAT64,
    torch.float16: graph_pb2.FLOAT16,
    torch.bfloat16: graph_pb2.BFLOAT16,
    torch.int64: graph_pb2.INT64,
    torch.int32: graph_pb2.INT32,
    torch.int16: graph_pb2.INT16,
    torch.int8: graph_pb2.INT8,
    torch.uint8: graph_pb2.UINT8,
    torch.bool: graph_pb2.BOOL,
    torch.complex64: graph_pb2.COMPLEX64,
    torch.complex128: graph_pb2.COMPLEX128,
}

_MEMORY_FORMATS = {
    torch.contiguous_format: graph_pb2.CONTIGUOUS_FORMAT,
    torch.channels_last: graph_pb2.CHANNELS_LAST,
    torch.channels_last_3d: graph_pb2.CHANNELS_LAST_3D,
    torch.preserve_format: graph_pb2.PRESERVE_FORMAT,
}

_LAYOUTS = {
    torch.strided: graph_pb2.STRIDED,
    torch.sparse_coo: graph_pb2.SPARSE_COO,
}


def _dtype(dtype):
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} has no kiln.v1.DType") from None


def _device(device, out):
    device = torch.device(device)
    out.type = device.type
    out.index = -1 if device.index is None else device.index
    return out


def tensor_meta(t):
    """Returns the kiln.v1.TensorMeta of tensor `t`."""
    meta = graph_pb2.TensorMeta(dtype=_dtype(t.dtype), requires_grad=t.requires_grad)
    for s in t.shape:
        meta.sizes.add(int_value=int(s))
    for s in t.stride():
        meta.strides.add(int_value=int(s))
    _device(t.device, meta.device)
    meta.storage_offset.int_value = int(t.storage_offset())
    return meta


def signature(*tensors, client_guard_digest=b""):
    """Returns the kiln.v1.InputSignature of `tensors`, one entry per graph input.

    For a captured module, pass module_tensors(module) first, then the inputs.
    """
    sig = guards_pb2.InputSignature(client_guard_digest=client_guard_digest)
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"signature() takes tensors, got {type(t).__name__}")
        entry = sig.inputs.add(
            dtype=_dtype(t.dtype),
            sizes=[int(s) for s in t.shape],
            strides=[int(s) for s in t.stride()],
            requires_grad=t.requires_grad,
            storage_offset=int(t.storage_offset()),
        )
        _device(t.device, entry.device)
    return sig


def module_tensors(module):
    """The parameters, then the buffers, of `module`: its leading graph inputs."""
    return [p for _, p in module.named_parameters()] + [b for _, b in module.named_buffers()]


def _target_name(op):
    if not isinstance(op, torch._ops.OpOverload):
        raise ValueError(f"traced call to {op!r} is not an ATen operator overload")
    ns, name = op._schema.name.split("::")
    return f"{ns}.{name}.{op._overloadname or 'default'}"


def _list_kind(values, schema_type):
    """Picks the Argument list field for a Python list, using the schema type
    when the list is empty or mixes ints and floats."""
    kind = str(schema_type) if schema_type is not None else ""
    if any(isinstance(v, torch.fx.Node) for v in values) or "Tensor" in kind:
        return "tensors"
    if values and all(isinstance(v, bool) for v in values):
        return "bools"
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "ints"
    if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return "floats"
    if not values:
        if "bool" in kind:
            return "bools"
        if "float" in kind:
            return "floats"
        return "ints"
    raise ValueError(f"unsupported list argument {values!r}")


def _set_argument(arg, value, names, schema_type, where):
    """Fills kiln.v1.Argument `arg` from an FX argument value."""
    if value is None:
        arg.none.SetInParent()
    elif isinstance(value, torch.fx.Node):
        arg.tensor = names[value]
    elif isinstance(value, bool):
        arg.bool_value = value
    elif isinstance(value, int):
        arg.int_value = value
    elif isinstance(value, float):
        arg.float_value = value
    elif isinstance(value, str):
        arg.string_value = value
    elif isinstance(value, torch.dtype):
        arg.dtype = _dtype(value)
    elif isinstance(value, torch.device):
        _device(value, arg.device)
    elif isinstance(value, torch.memory_format):
        arg.memory_format = _MEMORY_FORMATS[value]
    elif isinstance(value, torch.layout):
        arg.layout = _LAYOUTS[value]
    elif isinstance(value, (list, tuple)):
        kind = _list_kind(list(value), schema_type)
        if kind == "tensors":
            arg.tensors.names.extend("" if v is None else names[v] for v in value)
        elif kind == "floats":
            arg.floats.values.extend(float(v) for v in value)
        else:
            getattr(arg, kind).values.extend(value)
    else:
        raise ValueError(f"{where}: unsupported argument {value!r} ({type(value).__name__})")


class _Recorder(torch.fx.Interpreter):
    """Runs a traced graph and keeps every node's result."""

    def __init__(self, gm):
        super().__init__(gm)
        self.results = {}

    def run_node(self, n):
        result = super().run_node(n)
        self.results[n] = result
        return result


class _Names:
    """Hands out value names that are unique within one graph."""

    def __init__(self):
        self.taken = set()

    def reserve(self, name):
        self.taken.add(name)

    def unique(self, base):
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in base) or "v"
        name, i = base, 1
        while name in self.taken:
            name = f"{base}_{i}"
            i += 1
        self.taken.add(name)
        return name


def _user_input_names(fn, count):
    """Parameter names of `fn` for its positional inputs, "argN" beyond them."""
    names = []
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    for i in range(count):
        names.append(params[i].name if i < len(params) else f"arg{i}")
    return names


# What capture() learns about a function besides its graph: enough to call
# the graph the way the function is called.
Capture = collections.namedtuple("Capture", [
    "graph",            # kiln.v1.Graph
    "module",           # the nn.Module captured, or None
    "tensor_positions", # indices of the example inputs that are graph inputs
    "example_inputs",   # the example inputs (non-tensors are baked in)
    "out_spec",         # torch.utils._pytree spec of the function's result
])


def capture(fn, *example_inputs, name=None):
    """Traces `fn` on `example_inputs` and returns a kiln.v1.Graph.

    `fn` is a function of tensors or an nn.Module (its parameters and buffers
    become PARAMETER and BUFFER inputs ahead of the user inputs). Its result
    may be a tensor or a (nested) tuple, list or dict of tensors; the graph's
    outputs are the flattened tensors. `name` defaults to the function's
    __name__ or the module's class name.
    """
    return capture_with_structure(fn, *example_inputs, name=name).graph


def capture_with_structure(fn, *example_inputs, name=None):
    """capture(), also returning how the graph's inputs and outputs map onto
    the function's arguments and result (a Capture)."""
    if isinstance(fn, torch.nn.Module):
        module = fn
        graph_name = name or type(module).__name__
        state = ([(n, p, graph_pb2.Placeholder.PARAMETER) for n, p in module.named_parameters()]
                 + [(n, b, graph_pb2.Placeholder.BUFFER) for n, b in module.named_buffers()])
        call = module.forward
    else:
        module = None
        graph_name = name or getattr(fn, "__name__", type(fn).__name__)
        state = []
        call = fn

    # Tensors become graph inputs; anything else is a constant of the trace.
    positions = [i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor)]
    arg_names = _user_input_names(call, len(example_inputs))
    inputs = list(state)
    inputs += [(arg_names[i], example_inputs[i], graph_pb2.Placeholder.USER_INPUT)
               for i in positions]

    # make_fx tells inputs apart by identity: give every input its own tensor
    # object (sharing the same storage) so that a tensor passed twice, or a
    # parameter also passed as an input, becomes two placeholders. Buffers
    # are copied: tracing runs the function, and batch norm in training mode
    # would update the module's running statistics.
    flat = [(t.detach().clone() if kind == graph_pb2.Placeholder.BUFFER else t.detach())
            .requires_grad_(t.requires_grad) for _, t, kind in inputs]
    n_state = len(state)

    def flat_fn(*tensors):
        args = list(example_inputs)
        for pos, t in zip(positions, tensors[n_state:]):
            args[pos] = t
        if module is None:
            return fn(*args)
        values = {n: t for (n, _, _), t in zip(state, tensors[:n_state])}
        return torch.func.functional_call(module, values, tuple(args))

    with torch.enable_grad(), _DropoutAsNativeDropout():
        gm = make_fx(flat_fn, decomposition_table=_DECOMPOSITIONS)(*flat)
    _functionalize(gm.graph)
    _remove_dead_nodes(gm.graph)
    _use_number_overloads(gm.graph)
    gm.recompile()
    recorder = _Recorder(gm)
    with torch.enable_grad():
        recorder.run(*flat)
    output_node = next(n for n in gm.graph.nodes if n.op == "output")
    _, out_spec = torch.utils._pytree.tree_flatten(output_node.args[0])
    graph = _to_proto(gm.graph, recorder.results, inputs, graph_name)
    return Capture(graph, module, positions, tuple(example_inputs), out_spec)


class _DropoutAsNativeDropout(TorchFunctionMode):
    """Routes training-mode dropout to aten.native_dropout while tracing.

    torch 1.13 decomposes aten.dropout in C++, before make_fx sees it, into
    empty_like, bernoulli_, div_ and mul. native_dropout is the core ATen op
    for it (one node, a derivative rule, a mask to save) and, on the CPU, it
    draws the same random numbers as that decomposition. p == 1 is left alone:
    eager multiplies by zero there and draws nothing.
    """

    # Function -> (its parameters, their defaults); "train" is "training".
    _FUNCTIONS = {
        torch.nn.functional.dropout: (("input", "p", "training", "inplace"),
                                      {"p": 0.5, "training": True, "inplace": False}),
        torch.dropout: (("input", "p", "training"), {}),
    }

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._FUNCTIONS:
            params, defaults = self._FUNCTIONS[func]
            bound = dict(defaults)
            bound.update(zip(params, args))
            bound.update({"training" if k == "train" else k: v for k, v in kwargs.items()})
            if bound["training"] and not bound.get("inplace") and 0 <= bound["p"] < 1:
                return _aten.native_dropout.default(bound["input"], float(bound["p"]), True)[0]
        return func(*args, **kwargs)


def _is_view(node):
    """Whether FX node `node` returns an alias of its first argument."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return _is_view(node.args[0])
    op = node.target
    if not isinstance(op, torch._ops.OpOverload) or op._schema.is_mutable:
        return False
    return bool(op._schema.returns) and op._schema.returns[0].alias_info is not None


def _parameters(schema):
    return [(a.name, str(a.type), a.kwarg_only) for a in schema.arguments]


def _out_of_place(op, args, kwargs):
    """The functional overload computing what in-place `op` writes, with the
    arguments to call it with: (overload, args, kwargs), or None.

    The overload must take the same parameters (names, types, keyword-only or
    not); defaults it lacks are passed explicitly. Matching by parameters, not
    by what the call happens to bind, matters: make_fx records
    bernoulli_.float(x) without its default p=0.5, which aten.bernoulli.default
    would also accept, and draw with probabilities x instead."""
    schema = op._schema
    name = schema.name.split("::")[1]
    packet = getattr(_aten, name[:-1], None) if name.endswith("_") else None
    if packet is None:
        return None
    wanted = _parameters(schema)
    for overload in [op._overloadname] + sorted(packet.overloads()):
        candidate = getattr(packet, overload, None)
        if candidate is None or candidate._schema.is_mutable:
            continue
        if (_parameters(candidate._schema) != wanted
                or [str(r.type) for r in candidate._schema.returns] != ["Tensor"]):
            continue
        args, kwargs = list(args), dict(kwargs)
        params = list(zip(schema.arguments, candidate._schema.arguments))
        positional = [(mine, theirs) for mine, theirs in params if not mine.kwarg_only]
        missing = [i for i, (mine, theirs) in enumerate(positional)
                   if i >= len(args) and mine.name not in kwargs
                   and not theirs.has_default_value()]
        if missing:
            for mine, _ in positional[len(args):max(missing) + 1]:
                args.append(kwargs.pop(mine.name) if mine.name in kwargs else mine.default_value)
        for mine, theirs in params:
            if (mine.kwarg_only and mine.name not in kwargs and not theirs.has_default_value()
                    and mine.has_default_value()):
                kwargs[mine.name] = mine.default_value
        return candidate, tuple(args), kwargs
    return None


def _functionalize(fx_graph):
    """Rewrites in-place ops as out-of-place ones (see the module docstring).

    make_fx makes every later use of a tensor written in place refer to the
    in-place node, so the out-of-place result can stand in for it. What it
    cannot redirect are reads through another alias of the same memory (a
    view taken before the write, or the base of a view written to): if any
    such read comes after the write, the rewrite would change the result and
    capture refuses."""
    nodes = list(fx_graph.nodes)
    position = {n: i for i, n in enumerate(nodes)}
    for node in nodes:
        op = node.target
        if (node.op != "call_function" or not isinstance(op, torch._ops.OpOverload)
                or not op._schema.is_mutable):
            continue
        where = f"node '{node.name}' ({_target_name(op)})"
        functional = _out_of_place(op, node.args, node.kwargs)
        written = node.args[0] if node.args else None
        if functional is None or not isinstance(written, torch.fx.Node):
            raise ValueError(f"{where} writes to its arguments and has no out-of-place "
                             "overload: kiln graphs are functional")
        root = written
        while _is_view(root):
            root = root.args[0]
        aliases, stack = set(), [root]
        while stack:
            n = stack.pop()
            aliases.add(n)
            stack.extend(u for u in n.users if u not in aliases and _is_view(u))
        for alias in aliases:
            for user in alias.users:
                if user is not node and user not in aliases and position[user] > position[node]:
                    raise ValueError(
                        f"{where} writes to '{written.name}', and '{user.name}' reads "
                        f"'{alias.name}' afterwards: capture cannot make this in-place "
                        "update functional; write it out of place")
        node.target, node.args, node.kwargs = functional


def _remove_dead_nodes(fx_graph):
    """Drops unused results of ops that write nothing (eval-mode batch norm's
    scratch tensors, unused getitems); ops that mutate an argument stay."""
    for node in reversed(list(fx_graph.nodes)):
        if node.op != "call_function" or node.users:
            continue
        if node.target is operator.getitem or (
                isinstance(node.target, torch._ops.OpOverload)
                and not node.target._schema.is_mutable):
            fx_graph.erase_node(node)


def _accepts(param, value):
    """Whether schema argument `param` can take FX argument `value`."""
    t = param.type
    if value is None:
        return t.kind() == "OptionalType"
    if t.kind() == "OptionalType":
        t = t.getElementType()
    kind = t.kind()
    if isinstance(value, torch.fx.Node):
        return kind == "TensorType"
    if isinstance(value, bool):
        return kind in ("BoolType", "NumberType")
    if isinstance(value, int):
        return kind in ("IntType", "SymIntType", "FloatType", "NumberType")
    if isinstance(value, float):
        return kind in ("FloatType", "NumberType")
    if isinstance(value, (list, tuple)):
        return kind == "ListType"
    return kind not in ("TensorType", "ListType")


def _fits(schema, args, kwargs):
    """Whether `args` (positional) and `kwargs` (by name) bind to `schema`."""
    params = schema.arguments
    if len(args) > sum(1 for p in params if not p.kwarg_only):
        return False
    given = set()
    for p, value in zip(params, args):
        if not _accepts(p, value):
            return False
        given.add(p.name)
    by_name = {p.name: p for p in params}
    for name, value in kwargs.items():
        if name not in by_name or name in given or not _accepts(by_name[name], value):
            return False
        given.add(name)
    return all(p.name in given or p.has_default_value() for p in params)


def _use_number_overloads(fx_graph):
    """Moves calls that pass a Python number where the schema wants a Tensor
    (make_fx records `x + 1e-6` as aten.add.Tensor(x, 1e-06)) to the overload
    that takes a Scalar there (aten.add.Scalar), so that every argument has
    the kind its schema names. Both compute the same thing: ATen wraps the
    number into a tensor that promotes like a Scalar."""
    for node in fx_graph.nodes:
        op = node.target
        if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload):
            continue
        if _fits(op._schema, node.args, node.kwargs):
            continue
        returns = [str(r.type) for r in op._schema.returns]
        for overload in op.overloadpacket.overloads():
            candidate = getattr(op.overloadpacket, overload)
            schema = candidate._schema
            if (not schema.is_mutable and [str(r.type) for r in schema.returns] == returns
                    and _fits(schema, node.args, node.kwargs)):
                node.target = candidate
                break


def fill_arguments(pn, node, names, where, set_argument=_set_argument):
    """Fills kiln.v1.Node `pn`'s args and kwargs from FX call `node`, each
    with the type its schema names (`set_argument` converts one value)."""
    schema_args = node.target._schema.arguments
    for i, a in enumerate(node.args):
        schema_type = schema_args[i].type if i < len(schema_args) else None
        set_argument(pn.args.add(), a, names, schema_type, where)
    by_name = {a.name: a for a in schema_args}
    for k, a in node.kwargs.items():
        set_argument(pn.kwargs.add(name=k), a, names,
                     by_name[k].type if k in by_name else None, where)


def _to_proto(fx_graph, results, inputs, graph_name):
    graph = graph_pb2.Graph(name=graph_name)
    names = {}  # fx.Node -> value name
    taken = _Names()

    # FX node names first (a single output takes its node's name, a folded
    # getitem gives its name to an output), so that the input and output
    # names chosen below cannot collide with them.
    for node in fx_graph.nodes:
        if node.op == "call_function":
            taken.reserve(node.name)

    placeholders = [n for n in fx_graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        raise RuntimeError(f"trace has {len(placeholders)} placeholders for {len(inputs)} inputs")
    for node, (input_name, tensor, kind) in zip(placeholders, inputs):
        names[node] = taken.unique(input_name)
        ph = graph.inputs.add(kind=kind)
        ph.value.name = names[node]
        ph.value.meta.CopyFrom(tensor_meta(tensor))

    for node in fx_graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "get_attr":
            raise ValueError(
                f"the function uses a tensor constant ('{node.target}'): a tensor held "
                "outside it or made with torch.tensor(); pass it as an input (for a "
                "module, register it as a buffer)")
        if node.op != "call_function":
            raise ValueError(f"unsupported FX node {node.format_node()}")
        if node.target is operator.getitem:
            continue  # folded into the producer's outputs below
        where = f"node '{node.name}'"
        result = results[node]
        pn = graph.nodes.add(name=node.name, target=_target_name(node.target))
        fill_arguments(pn, node, names, where)

        if isinstance(result, torch.Tensor):
            names[node] = node.name
            out = pn.outputs.add(name=node.name)
            out.meta.CopyFrom(tensor_meta(result))
            continue
        if not isinstance(result, (tuple, list)) or not all(
                isinstance(r, torch.Tensor) for r in result):
            raise ValueError(f"{where} ({pn.target}) returns {type(result).__name__}, "
                             "not a tensor or a tuple of tensors (data-dependent value?)")
        # Several outputs: each getitem user names one of them.
        getitems = {}
        for user in node.users:
            if user.target is operator.getitem:
                getitems.setdefault(user.args[1], []).append(user)
        for i, r in enumerate(result):
            users = getitems.get(i, [])
            value_name = users[0].name if users else taken.unique(f"{node.name}_out{i}")
            for user in users:
                names[user] = value_name
            out = pn.outputs.add(name=value_name)
            out.meta.CopyFrom(tensor_meta(r))
        for user in node.users:
            if user.target is not operator.getitem:
                raise ValueError(f"{where}: its list of outputs is used whole by '{user.name}'")

    output_node = next(n for n in fx_graph.nodes if n.op == "output")
    leaves, _ = torch.utils._pytree.tree_flatten(output_node.args[0])
    for leaf in leaves:
        if not isinstance(leaf, torch.fx.Node):
            raise ValueError(f"the function returns a non-tensor value {leaf!r}")
        graph.outputs.append(names[leaf])
    return graph
