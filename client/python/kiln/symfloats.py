"""Floats computed from symbolic sizes (torch.SymFloat) in a traced graph,
rewritten into float64 0-dim tensors (kiln.lower runs as_tensors after
tracing): kilnd's size expressions are integers."""

import operator

import torch
import torch.fx

from kiln.tracing import Unsupported

__all__ = ["as_tensors"]


_FLOAT_OPS = {operator.truediv: torch.ops.aten.div.Tensor,
              operator.mul: torch.ops.aten.mul.Tensor,
              operator.add: torch.ops.aten.add.Tensor,
              operator.sub: torch.ops.aten.sub.Tensor,
              operator.pow: torch.ops.aten.pow.Tensor_Tensor,
              operator.neg: torch.ops.aten.neg.default,
              torch._sym_sqrt: torch.ops.aten.sqrt.default,
              torch.sym_float: None}  # the operand itself, as a float64 tensor


def as_tensors(fx, fake_mode):
    """Rewrites float arithmetic on sizes (a SymFloat: x / math.sqrt(
    x.shape[-1]), batch norm's n / (n - 1) over a dynamic batch) into
    float64 0-dim tensors of ATen ops on aten.scalar_tensor of the sizes,
    whose values the plan evaluates at each call: kilnd's size expressions
    are integers. The tensors replace the floats where an ATen op takes a
    Tensor (the float reached it as a number in a Tensor argument); any
    other use of one, or an op on floats beyond + - * / ** sqrt, raises
    Unsupported (the graph runs eagerly)."""
    floats = [n for n in fx.nodes if isinstance(n.meta.get("val"), torch.SymFloat)]
    if not floats:
        return
    aten = torch.ops.aten
    tensors = {}
    # One device for every float: the inputs', CUDA where any is.
    devices = [n.meta["val"].device for n in fx.nodes
               if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)]
    device = next((d for d in devices if d.type != "cpu"), torch.device("cpu"))

    def add(node_before, op, args, kwargs):
        with fx.inserting_before(node_before):
            new = fx.call_function(op, tuple(args), kwargs)
        with fake_mode:
            if op is aten.scalar_tensor.default:  # its value would guard the size
                new.meta["val"] = torch.empty((), dtype=torch.float64, device=device)
            else:
                new.meta["val"] = op(*(a.meta["val"] for a in args))
        return new

    for n in floats:
        if n.target is aten._local_scalar_dense.default:
            # A float Dynamo passed as a 0-dim tensor (a module's momentum
            # under dynamic=True): that tensor.
            tensors[n] = n.args[0]
            _replace_float_uses(n, tensors)
            continue
        if n.target not in _FLOAT_OPS or n.kwargs:
            raise Unsupported(f"node '{n.name}' computes a float from sizes with "
                              f"{getattr(n.target, '__name__', n.target)}, which kiln does "
                              "not spell")

        def operand(a, before):
            if isinstance(a, torch.fx.Node) and a in tensors:
                return tensors[a]
            value = a.meta.get("val") if isinstance(a, torch.fx.Node) else a
            if not isinstance(value, (int, float, torch.SymInt)) or isinstance(value, bool):
                raise Unsupported(f"node '{n.name}' computes a float from {a!r}")
            return add(before, aten.scalar_tensor.default, [a],
                       {"dtype": torch.float64, "device": device})

        operands = [operand(a, n) for a in n.args]
        op = _FLOAT_OPS[n.target]
        tensors[n] = operands[0] if op is None else add(n, op, operands, {})
        _replace_float_uses(n, tensors)
    for n in reversed(floats):
        fx.erase_node(n)


def _replace_float_uses(n, tensors):
    """Points the ATen ops that take float node `n` in a Tensor argument at
    its tensor, tensors[n]; the float ops that use it are rewritten in
    their turn."""
    for u in list(n.users):
        if isinstance(u.meta.get("val"), torch.SymFloat):
            continue
        schema = getattr(u.target, "_schema", None)
        if schema is None:
            raise Unsupported(f"node '{u.name}' takes the float '{n.name}' computed from sizes")
        for i, a in enumerate(u.args):
            if a is n and not (i < len(schema.arguments)
                               and isinstance(schema.arguments[i].type, torch.TensorType)):
                raise Unsupported(f"node '{u.name}' ({u.target}) takes the float '{n.name}' "
                                  "computed from sizes as a number")
        if any(v is n for v in u.kwargs.values()):
            raise Unsupported(f"node '{u.name}' ({u.target}) takes the float '{n.name}' "
                              "computed from sizes as a keyword")
        u.args = tuple(tensors[n] if a is n else a for a in u.args)
