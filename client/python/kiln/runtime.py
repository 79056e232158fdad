"""The Python reference runner: runs a kiln.v1.Graph op by op through torch.ops.

    outputs = kiln.run_graph(graph, inputs)      # one tensor per graph output

    runner = kiln.Interpreter(graph)             # resolves the ops once
    outputs = runner.run(inputs)                 # ... then runs many times

Each node's target ("aten.add.Tensor") names an operator overload, called as
torch.ops.aten.add.Tensor ("default" is .default). Its arguments become the
Python values the overload takes: tensor references are looked up by name
among the values computed so far, lists of tensors may hold None (an empty
name), enums become torch.dtype / torch.device / torch.memory_format /
torch.layout, and a symbolic SymInt ("s0", "2*s0", see SymExpr) is evaluated
with the symbols bound from the input sizes (an input whose metadata has the
size "s0" binds s0). Positional arguments are passed positionally, keyword
arguments by name. A node with several outputs (native_layer_norm, split)
takes the returned tuple or list in order.

Autograd is left as the caller has it: inputs that require grad give outputs
with a grad_fn, as eager PyTorch would. This is the runtime of the `eager`
artifact and the reference the tests compare the other backends with; it is
the Python counterpart of the C++ client/runtime/interpreter.h. BoundNode is
one node bound to its op.

An Interpreter is immutable after construction and may be run from several
threads at once. run_graph() builds a fresh one per call.
"""

import torch

from kiln import _executor, tracer
from kiln.v1 import graph_pb2

__all__ = ["Interpreter", "BoundNode", "SymExpr", "run_graph", "resolve_op", "torch_dtype",
           "torch_device"]

_DTYPES = {v: k for k, v in tracer._DTYPES.items()}
_MEMORY_FORMATS = {v: k for k, v in tracer._MEMORY_FORMATS.items()}
_LAYOUTS = {v: k for k, v in tracer._LAYOUTS.items()}


def _define_fault_op():
    """kiln.injected_fault(x, message): what kilnd's inject_fault=
    runtime_error:OP puts after OP (compiler/pipeline/fault.h). Running it
    raises RuntimeError(message)."""
    lib = torch.library.Library("kiln", "DEF")
    lib.define("injected_fault(Tensor x, str message) -> Tensor")

    def injected_fault(x, message):
        raise RuntimeError(message)

    lib.impl("injected_fault", injected_fault, "CompositeExplicitAutograd")
    return lib


_FAULT_LIBRARY = _define_fault_op()


def resolve_op(target):
    """The torch.ops overload for `target` ("aten.add.Tensor"); ValueError if
    there is none."""
    parts = target.split(".")
    if len(parts) != 3:
        raise ValueError(f"target '{target}' is not of the form namespace.op.overload")
    namespace, name, overload = parts
    try:
        return getattr(getattr(getattr(torch.ops, namespace), name), overload)
    except (AttributeError, RuntimeError):
        raise ValueError(f"torch has no operator {target}") from None


# Placeholders for what is known only when the graph runs.

class _Ref:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name


class _RefList:
    __slots__ = ("names",)

    def __init__(self, names):
        self.names = names


class _Sym:
    __slots__ = ("expr",)

    def __init__(self, expr):
        self.expr = expr  # a SymExpr


class _SymList:
    __slots__ = ("items",)

    def __init__(self, items):
        self.items = items  # ints and _Syms


class SymExpr:
    """A symbolic size expression ("s0", "2*s0", "Max(s0 - 1, 0) // 4 + 1"),
    parsed once and evaluated for given symbol values.

    It is the C++ one (compiler/ir/sym_expr.h), reached through kiln's
    runtime library: one grammar and one arithmetic (Python's floor division
    and modulo, sympy's Mod, FloorDiv, CeilDiv, Min, Max, ...) for the
    server, the C++ runtime and this package. Immutable.

    SymExpr(text) raises ValueError for malformed text; evaluate() raises
    ValueError for an unbound symbol, a division or modulo by zero, and a
    value outside int64."""

    __slots__ = ("text", "symbols", "_expr")

    def __init__(self, text):
        self._expr = _executor.sym_expr(text)
        self.text = text
        self.symbols = tuple(self._expr.symbols())  # distinct, in order of first appearance

    def evaluate(self, values):
        """The value with `values` (symbol name -> int) bound."""
        names = [s for s in self.symbols if s in values]
        bound = [int(values[s]) for s in names]
        for name, v in zip(names, bound):
            if not -2 ** 63 <= v < 2 ** 63:
                raise ValueError(f"cannot evaluate '{self.text}': {name} = {v} is outside int64")
        return self._expr.evaluate(names, bound)

    def to_text(self):
        """The canonical text (SymExpr::ToText)."""
        return self._expr.to_text()

    def to_python(self):
        """A Python expression of the same value, given the symbols as
        variables (SymExpr::ToPython)."""
        return self._expr.to_python()

    def __repr__(self):
        return f"SymExpr({self.text!r})"


def torch_dtype(dtype):
    """The torch.dtype of kiln.v1.DType `dtype`; ValueError if it has none."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {graph_pb2.DType.Name(dtype)} has no torch dtype")
    return _DTYPES[dtype]


def torch_device(device):
    """The torch.device of kiln.v1.Device `device` (index -1: none given)."""
    if device.index >= 0:
        return torch.device(device.type, device.index)
    return torch.device(device.type)


def _sym_int(s, where):
    if s.WhichOneof("value") != "expr":
        return s.int_value
    try:
        return _Sym(SymExpr(s.expr))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _convert(arg, where):
    """The Python value of kiln.v1.Argument `arg`, with _Ref/_RefList/_Sym/
    _SymList standing for what is resolved at run time."""
    kind = arg.WhichOneof("kind")
    if kind == "tensor":
        return _Ref(arg.tensor)
    if kind == "int_value":
        return arg.int_value
    if kind == "float_value":
        return arg.float_value
    if kind == "bool_value":
        return arg.bool_value
    if kind == "string_value":
        return arg.string_value
    if kind == "ints":
        return list(arg.ints.values)
    if kind == "floats":
        return list(arg.floats.values)
    if kind == "bools":
        return list(arg.bools.values)
    if kind == "tensors":
        return _RefList([name or None for name in arg.tensors.names])
    if kind == "sym_int":
        return _sym_int(arg.sym_int, where)
    if kind == "sym_ints":
        items = [_sym_int(s, where) for s in arg.sym_ints.values]
        return _SymList(items) if any(isinstance(i, _Sym) for i in items) else items
    if kind == "dtype":
        try:
            return torch_dtype(arg.dtype)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    if kind == "device":
        return torch_device(arg.device)
    if kind == "memory_format":
        if arg.memory_format not in _MEMORY_FORMATS:
            raise ValueError(f"{where}: memory format {arg.memory_format} has no torch equivalent")
        return _MEMORY_FORMATS[arg.memory_format]
    if kind == "layout":
        if arg.layout not in _LAYOUTS:
            raise ValueError(f"{where}: layout {arg.layout} has no torch equivalent")
        return _LAYOUTS[arg.layout]
    if kind == "none":
        return None
    raise ValueError(f"{where}: argument without a value")


def _names_read(value):
    if isinstance(value, _Ref):
        return [value.name]
    if isinstance(value, _RefList):
        return [n for n in value.names if n is not None]
    return []


class BoundNode:
    """One kiln.v1.Node bound to its operator: the overload is resolved and
    the constant arguments converted once, at construction (ValueError
    naming the node for a target torch does not know or an argument it
    cannot convert). call() runs it on an environment of named tensors.

    This is what the reference runner runs for every node. Immutable.

    `ops` is an optional cache (target -> overload) shared by the nodes of
    one graph."""

    __slots__ = ("name", "target", "op", "args", "kwargs", "outputs")

    def __init__(self, node, ops=None):
        where = f"node '{node.name}' ({node.target})"
        op = ops.get(node.target) if ops is not None else None
        if op is None:
            try:
                op = resolve_op(node.target)
            except ValueError as e:
                raise ValueError(f"node '{node.name}': {e}") from None
            if ops is not None:
                ops[node.target] = op
        self.name = node.name
        self.target = node.target
        self.op = op
        self.args = [_convert(a, where) for a in node.args]
        self.kwargs = {a.name: _convert(a, where) for a in node.kwargs}
        self.outputs = [o.name for o in node.outputs]
        if not self.outputs:
            raise ValueError(f"{where} has no outputs")

    @property
    def where(self):
        return f"node '{self.name}' ({self.target})"

    def reads(self):
        """The names of the values the node reads, in argument order."""
        return [name for v in self.args + list(self.kwargs.values()) for name in _names_read(v)]

    def call(self, env, symbols):
        """Runs the op on the values named in `env` (name -> tensor) with the
        size symbols `symbols` (name -> int) and stores its outputs in `env`
        under the node's output names. An error inside the op is re-raised
        as RuntimeError naming the node."""

        def value(v):
            if isinstance(v, _Ref):
                return env[v.name]
            if isinstance(v, _RefList):
                return [None if n is None else env[n] for n in v.names]
            if isinstance(v, _Sym):
                return v.expr.evaluate(symbols)
            if isinstance(v, _SymList):
                return [i.expr.evaluate(symbols) if isinstance(i, _Sym) else i for i in v.items]
            return v

        args = [value(a) for a in self.args]
        kwargs = {k: value(v) for k, v in self.kwargs.items()}
        try:
            result = self.op(*args, **kwargs)
        except Exception as e:
            raise RuntimeError(f"{self.where}: {e}") from e
        if len(self.outputs) == 1 and isinstance(result, torch.Tensor):
            env[self.outputs[0]] = result
            return
        if not isinstance(result, (tuple, list)) or len(result) != len(self.outputs):
            got = len(result) if isinstance(result, (tuple, list)) else 1
            raise RuntimeError(f"{self.where} returned {got} values for {len(self.outputs)} "
                               "outputs")
        for name, r in zip(self.outputs, result):
            env[name] = r


class Interpreter:
    """Runs one kiln.v1.Graph; resolves its ops and converts its constant
    arguments once, at construction (ValueError naming the node for a target
    torch does not know or an argument it cannot convert)."""

    def __init__(self, graph):
        self.graph = graph
        self.input_names = [ph.value.name for ph in graph.inputs]
        self.output_names = list(graph.outputs)
        # Size symbols bound by the inputs: (symbol, input index, dimension).
        self._symbol_dims = []
        for i, ph in enumerate(graph.inputs):
            for d, s in enumerate(ph.value.meta.sizes):
                if s.WhichOneof("value") == "expr" and s.expr.isidentifier():
                    self._symbol_dims.append((s.expr, i, d))
        ops = {}  # target -> overload, resolved once per graph
        self._steps = []
        defined = set(self.input_names)
        for node in graph.nodes:
            step = BoundNode(node, ops)
            for name in step.reads():
                if name not in defined:
                    raise ValueError(f"{step.where} reads '{name}', which is not defined before it")
            defined.update(step.outputs)
            self._steps.append(step)
        for name in self.output_names:
            if name not in defined:
                raise ValueError(f"graph output '{name}' is not defined")
        # Drop each value after its last reader, so memory stays as eager's.
        last_read = {}
        for i, step in enumerate(self._steps):
            for name in step.reads():
                last_read[name] = i
        kept = set(self.output_names)
        release = [[] for _ in self._steps]
        for name, i in last_read.items():
            if name not in kept:
                release[i].append(name)
        self._release = [tuple(names) for names in release]

    def _bind_symbols(self, inputs):
        symbols = {}
        for symbol, i, d in self._symbol_dims:
            size = int(inputs[i].shape[d])
            if symbols.setdefault(symbol, size) != size:
                raise ValueError(f"size symbol '{symbol}' is {symbols[symbol]} and {size} "
                                 f"(input '{self.input_names[i]}' dimension {d})")
        return symbols

    def run(self, inputs):
        """Runs the graph on `inputs` (one tensor per graph input, in order)
        and returns the list of its outputs. ValueError on a wrong count; an
        error inside an op is re-raised as RuntimeError naming the node."""
        inputs = list(inputs)
        if len(inputs) != len(self.input_names):
            raise ValueError(f"graph '{self.graph.name}' takes {len(self.input_names)} inputs, "
                             f"got {len(inputs)}")
        env = dict(zip(self.input_names, inputs))
        symbols = self._bind_symbols(inputs) if self._symbol_dims else {}
        for step, release in zip(self._steps, self._release):
            step.call(env, symbols)
            for name in release:
                del env[name]
        return [env[name] for name in self.output_names]


def run_graph(graph, inputs):
    """Runs kiln.v1.Graph `graph` on `inputs` (one tensor per graph input, in
    order) and returns the list of its outputs. See Interpreter."""
    return Interpreter(graph).run(inputs)
