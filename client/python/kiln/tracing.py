"""Traces Dynamo's graph into functional core ATen for kiln.lower: make_fx
over Dynamo's calls with torch's functionalization and kiln's
decomposition table, where autograd stops gradients marked for kilnd
(kiln::stop_gradient), and the repeated blocks of deep models traced once
each."""

import operator

import torch
import torch.fx
from torch._dispatch.python import enable_python_dispatcher
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import decompositions

__all__ = ["Unsupported", "stop_gradient", "trace", "functional_graph"]


class Unsupported(Exception):
    """The graph has no kiln.v1.Graph form; the message says why."""



# Where eager's autograd stops a gradient, the trace must say so: below
# autograd, where make_fx records, `detach()` is an alias, and what a
# no_grad region computes is an ordinary op, so kilnd, which differentiates
# the ATen graph, would send gradients through both. The trace therefore
# runs Dynamo's graph through _GradientCuts, which follows autograd's rules
# (functionalization's tensors carry no autograd state of their own): a
# value that does not require grad (detached, `.data`, computed under
# no_grad or inference mode) but is computed from one that does passes
# through kiln::stop_gradient wherever a grad-mode call or the graph's
# output uses it; kilnd reads that op as `aten.detach.default`, which it
# does not differentiate.


@torch.library.custom_op("kiln::stop_gradient", mutates_args=())
def stop_gradient(x: torch.Tensor) -> torch.Tensor:
    """A copy of `x` that no gradient crosses (kilnd's aten.detach)."""
    return x.clone()


@stop_gradient.register_fake
def _(x):
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)


_DETACHING_CALLS = (torch._C._autograd._get_data_attr, torch.detach, torch.Tensor.detach,
                    torch.Tensor.detach_)
_GRAD_MODE_CALLS = _DETACHING_CALLS + (torch._C._set_grad_enabled,
                                       torch.autograd.grad_mode._enter_inference_mode)


def _may_cut_gradients(gm):
    """Whether Dynamo's graph `gm` has a call after which autograd may stop
    a gradient (a detach, `.data`, a grad-mode switch)."""
    return any(
        (n.op == "call_function" and n.target in _GRAD_MODE_CALLS)
        or (n.op == "call_method" and n.target in ("detach", "detach_", "requires_grad_"))
        for n in gm.graph.nodes)


def _detaches(node):
    return (node.op == "call_function" and node.target in _DETACHING_CALLS) or (
        node.op == "call_method" and node.target in ("detach", "detach_"))


def _differentiable(t):
    return t.is_floating_point() or t.is_complex()


class _TensorSet:
    """A set of tensors by identity (a tensor's == is elementwise); it
    holds them, so that no identity is reused while it lives."""

    def __init__(self):
        self._tensors = {}

    def add(self, t):
        self._tensors[id(t)] = t

    def discard(self, t):
        self._tensors.pop(id(t), None)

    def __contains__(self, t):
        return id(t) in self._tensors


class _Tracing(torch.fx.Interpreter):
    """Runs Dynamo's graph for the trace."""

    def call_function(self, target, args, kwargs):
        # ATen's linear with a bias flattens an input of 3 or more dims by
        # its concrete sizes, which specializes symbolic ones (a dynamic
        # batch or sequence compiled again at every size): the same addmm
        # over the input flattened by its symbolic sizes.
        if target is torch._C._nn.linear and not kwargs and len(args) == 3 \
                and isinstance(args[0], torch.Tensor) and args[0].dim() >= 3 \
                and isinstance(args[2], torch.Tensor) and not _static_tensor(args[0]):
            x, weight, bias = args
            out = torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight.t())
            return out.view(*x.shape[:-1], out.shape[-1])
        return super().call_function(target, args, kwargs)


class _GradientCuts(_Tracing):
    """Runs Dynamo's graph for the trace with kiln::stop_gradient where
    eager's autograd stops gradients (above). `_grad` holds the tensors that
    require grad by autograd's rules, from the inputs' `requires_grad`;
    `_derived` those computed from one of them, whether or not autograd
    follows them."""

    def __init__(self, gm, requires_grad):
        super().__init__(gm)
        self._requires_grad = requires_grad
        self._grad = _TensorSet()
        self._derived = _TensorSet()

    def run(self, *args, **kwargs):
        for a, grad in zip(args, self._requires_grad):
            if isinstance(a, torch.Tensor) and grad:
                self._grad.add(a)
                self._derived.add(a)
        return super().run(*args, **kwargs)

    def _cut(self, value):
        if isinstance(value, torch.Tensor) and value in self._derived \
                and value not in self._grad and _differentiable(value):
            return stop_gradient(value.detach())
        return value

    def run_node(self, n):
        with self._set_current_node(n):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            if n.op == "output":
                return self.output(n.target, *torch.utils._pytree.tree_map(self._cut,
                                                                           (args, kwargs)))
            leaves = [a for a in torch.utils._pytree.tree_leaves((args, kwargs))
                      if isinstance(a, torch.Tensor)]
            counts = [torch._functionalize_mutation_counter(a) if torch._is_functional_tensor(a)
                      else None for a in leaves]
            grad_mode = torch.is_grad_enabled()
            calls = n.op in ("call_function", "call_method")
            declared = _written(n, args, kwargs) if calls else []
            if grad_mode and calls:
                # What the call writes to stays itself (a cut is a copy).
                args, kwargs = torch.utils._pytree.tree_map(
                    lambda a: a if any(a is w for w in declared) else self._cut(a),
                    (args, kwargs))
            result = getattr(self, n.op)(n.target, args, kwargs)

            grad = grad_mode and not _detaches(n) and any(a in self._grad for a in leaves)
            derived = any(a in self._derived for a in leaves)
            for a, count in zip(leaves, counts):
                if count is None or torch._functionalize_mutation_counter(a) == count:
                    continue
                if a in self._grad and not (grad_mode and any(a is w for w in declared)):
                    raise Unsupported(
                        f"node '{n.name}' writes in place to a tensor that requires grad "
                        "where autograd does not see the write (under no_grad); autograd "
                        "then differentiates as if the tensor were unwritten, which kiln's "
                        "graph cannot say")
                if derived:
                    self._derived.add(a)
                if grad and _differentiable(a):
                    self._grad.add(a)
            if n.op == "call_method" and n.target == "requires_grad_" and leaves:
                flag = args[1] if len(args) > 1 else kwargs.get("requires_grad", True)
                (self._grad.add if flag else self._grad.discard)(leaves[0])
            if n.op == "call_method" and n.target == "detach_" and leaves:
                self._grad.discard(leaves[0])
            for r in torch.utils._pytree.tree_leaves(result):
                if isinstance(r, torch.Tensor) and not any(r is a for a in leaves):
                    if derived:
                        self._derived.add(r)
                    if grad and _differentiable(r):
                        self._grad.add(r)
            return result


_IN_PLACE_OPERATORS = {operator.setitem, operator.iadd, operator.isub, operator.imul,
                       operator.itruediv, operator.ifloordiv, operator.imod, operator.ipow,
                       operator.iand, operator.ior, operator.ixor, operator.ilshift,
                       operator.irshift, operator.imatmul}


def _written(node, args, kwargs):
    """The tensors that call `node` may write to: an in-place method's or
    function's first argument (`x.mul_(2)`, `torch.relu_(x)`, `x[i] = v`,
    `F.relu(x, inplace=True)`) and `out=`."""
    written = list(torch.utils._pytree.tree_leaves(kwargs.get("out")))
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    in_place = (isinstance(name, str) and name.endswith("_") and not name.endswith("__")) \
        or name == "__setitem__" or node.target in _IN_PLACE_OPERATORS \
        or kwargs.get("inplace") is True
    if in_place:
        first = args[0] if args else kwargs.get("input", kwargs.get("self"))
        written.append(first)
    return [w for w in written if isinstance(w, torch.Tensor)]


def functional_graph(run, args):
    """make_fx's graph of `run` on fake `args`, functionalized, in core
    ATen. `run` traces in the caller's grad mode; the writes back to the
    inputs it mutated are traced without it, as eager makes them: a leaf
    that requires grad is written where the graph wrote it under no_grad
    (Embedding's renormalization with `max_norm` writes to its weight),
    which in grad mode autograd would refuse."""
    grad = torch.is_grad_enabled()
    functional = torch.func.functionalize(
        lambda *a: _in_grad_mode(grad, run, a), remove="mutations")

    def traced(*a):
        with torch.no_grad():
            return functional(*a)

    return make_fx(traced, decomposition_table=decompositions.table())(*args).graph


def _in_grad_mode(grad, run, args):
    with torch.set_grad_enabled(grad):
        return run(*args)


def trace(gm, fakes, fake_mode):
    """The FX graph of Dynamo's graph `gm` in core ATen, functionalized."""
    grad = torch.is_grad_enabled()
    if grad:
        for n in gm.graph.nodes:
            if n.target is torch.ops.higher_order.autograd_function_apply:
                raise Unsupported(f"node '{n.name}' applies a custom autograd.Function, "
                                  "whose own backward a kiln graph cannot carry")
    if not (grad and _may_cut_gradients(gm)):
        graph = _trace_repeated_calls(gm, fakes, fake_mode)
        if graph is not None:
            return graph

    def run(*args):
        if grad:
            return _GradientCuts(gm, [getattr(f, "requires_grad", False) for f in fakes]).run(*args)
        return _Tracing(gm).run(*args)

    with fake_mode, enable_python_dispatcher():
        return functional_graph(run, fakes)


# Deep models repeat their blocks: six GPT-2 blocks are six copies of the
# same calls on tensors of the same sizes, and make_fx costs about a
# millisecond per call (its fake dispatch, decompositions and proxies). When
# at most half of Dynamo's calls are distinct (the same function or method,
# the same constant arguments, tensors of the same metadata in the same
# places), each distinct call is traced once on its own and its ATen ops are
# copied for every occurrence: the ops the whole trace gives, in its order
# (six-block GPT-2 traces 21 calls instead of 230). A call traced alone sees
# nothing of its neighbours, so the whole graph is traced instead where that
# could differ: a call that writes to a tensor (functionalization works
# across calls), one whose results are not tensors (grad mode or autocast
# switches, which change how later calls trace), symbolic sizes (tracing
# adds guards to the shape environment), or a tensor constant.

_MEMO_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                 torch.memory_format, type(Ellipsis))


class _NotRepeatable(Exception):
    """A call whose trace may depend on more than its own arguments."""


def _static_tensor(value):
    return isinstance(value, torch.Tensor) and all(
        type(s) is int for s in (*value.shape, *value.stride(), value.storage_offset()))


def _call_key(node, values):
    """(key, tensor argument nodes in first-use order) of call `node`:
    equal keys trace to the same ATen ops. `values` maps a node to its fake
    value."""
    tensors = {}

    def key(a):
        if isinstance(a, torch.fx.Node):
            if not _static_tensor(values.get(a)):
                raise _NotRepeatable(a.name)
            return ("tensor", tensors.setdefault(a, len(tensors)))
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, tuple(key(x) for x in a))
        if isinstance(a, dict):
            return ("dict", tuple((k, key(x)) for k, x in a.items()))
        if isinstance(a, slice):
            return ("slice", key(a.start), key(a.stop), key(a.step))
        if isinstance(a, float):
            return ("float", repr(a))  # -0.0 == 0.0, and nan != nan
        if isinstance(a, _MEMO_SCALARS):
            return (type(a).__name__, a)
        raise _NotRepeatable(repr(a))

    shape = (node.op, node.target, key(node.args), key(node.kwargs))
    metas = tuple((tuple(v.shape), v.stride(), v.storage_offset(), v.dtype, v.device,
                   v.requires_grad) for v in map(values.get, tensors))
    return shape + (metas,), list(tensors)


def _trace_call(node, inputs):
    """make_fx's graph of call `node` alone, on fake `inputs` (its tensor
    arguments in first-use order), or None if it writes to one of them."""
    def run(*tensors):
        bound = dict(zip(inputs, tensors))
        args = torch.fx.node.map_arg(node.args, bound.get)
        kwargs = torch.fx.node.map_arg(node.kwargs, bound.get)
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        return node.target(*args, **kwargs)

    graph = functional_graph(run, list(inputs.values()))
    for op in graph.nodes:
        if op.op == "get_attr" or (isinstance(op.target, torch._ops.OpOverload)
                                   and op.target._schema.is_mutable):
            return None
    return graph


def _trace_repeated_calls(gm, fakes, fake_mode):
    """_trace's graph built call by call from traces of the distinct calls,
    or None where the whole graph must be traced (see above)."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if not all(_static_tensor(f) for f in fakes) or len(placeholders) != len(fakes):
        return None
    values = dict(zip(placeholders, fakes))
    keys = {}
    try:
        for node in nodes:
            if node.op in ("placeholder", "output"):
                continue
            if node.op not in ("call_function", "call_method"):
                return None
            value = node.meta.get("example_value")
            results = value if isinstance(value, (tuple, list)) else [value]
            if not results or not all(_static_tensor(r) for r in results):
                return None
            values[node] = value
            if node.target is operator.getitem and isinstance(values.get(node.args[0]),
                                                              (tuple, list)):
                continue  # an element of a call's results
            keys[node] = _call_key(node, values)
    except _NotRepeatable:
        return None
    if 2 * len({key for key, _ in keys.values()}) > len(keys):
        return None

    try:
        return _copy_traced_calls(nodes, values, keys, fake_mode)
    except Exception:  # noqa: BLE001 - the whole trace raises what is wrong
        return None


def _copy_traced_calls(nodes, values, keys, fake_mode):
    """The graph of `nodes`, each call's ops copied from the trace of the
    first call of its key; None if a call writes to a tensor."""
    graph = torch.fx.Graph()
    env = {}
    traced = {}
    with fake_mode, enable_python_dispatcher():
        for node in nodes:
            if node.op == "placeholder":
                env[node] = graph.placeholder(node.name)
                env[node].meta["val"] = values[node]
            elif node.op == "output":
                graph.output(torch.fx.node.map_arg(node.args[0], env.get))
            elif node not in keys:
                env[node] = env[node.args[0]][node.args[1]]
            else:
                key, inputs = keys[node]
                if key not in traced:
                    traced[key] = _trace_call(node, {n: values[n] for n in inputs})
                    if traced[key] is None:
                        return None
                call = traced[key]
                params = [op for op in call.nodes if op.op == "placeholder"]
                env[node] = graph.graph_copy(call, {p: env[n] for p, n in zip(params, inputs)})
    return graph
