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
    Tensor (the float reached it as a number in a Tensor argument); an op
    that takes one where only a number goes is rewritten into ops taking
    the tensor (_NumberUses: x.pow(1 / n), clamp, leaky_relu, full, ...).
    Any other use of one, or an op on floats beyond + - * / ** sqrt,
    raises Unsupported (the graph runs eagerly)."""
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
                new.meta["val"] = op(*_metas(args), **_metas(kwargs))
        return new

    numbers = _NumberUses(fx, add)

    for n in floats:
        if n.target is aten._local_scalar_dense.default:
            # A float Dynamo passed as a 0-dim tensor (a module's momentum
            # under dynamic=True): that tensor.
            tensors[n] = n.args[0]
            _replace_float_uses(n, tensors, numbers)
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
        _replace_float_uses(n, tensors, numbers)
    for n in reversed(floats):
        fx.erase_node(n)


def _metas(args):
    return torch.fx.node.map_arg(args, lambda a: a.meta["val"])


def _replace_float_uses(n, tensors, numbers):
    """Points the ATen ops that take float node `n` in a Tensor argument at
    its tensor, tensors[n], and rewrites those that take it as a number
    (numbers, a _NumberUses); the float ops that use it are rewritten in
    their turn."""
    for u in list(n.users):
        if isinstance(u.meta.get("val"), torch.SymFloat):
            continue
        schema = getattr(u.target, "_schema", None)
        if schema is None:
            raise Unsupported(f"node '{u.name}' takes the float '{n.name}' computed from sizes")
        if any(a is n and not (i < len(schema.arguments)
                               and isinstance(schema.arguments[i].type, torch.TensorType))
               for i, a in enumerate(u.args)) or any(v is n for v in u.kwargs.values()):
            if not numbers.rewrite(u, n, tensors[n]):
                raise Unsupported(f"node '{u.name}' ({u.target}) takes the float '{n.name}' "
                                  "computed from sizes as a number")
            continue
        u.args = tuple(tensors[n] if a is n else a for a in u.args)


class _NumberUses:
    """Rewrites an op that takes a float computed from sizes where ATen
    takes only a number (a Scalar) into ops that take its tensor instead,
    with the op's result dtype and device: the binary .Scalar overloads
    into their .Tensor ones, pow's exponent or base, clamp's bounds into
    where (the bound where x is beyond it: x's gradient is whole at a tie
    and NaN stays NaN, as clamp's), leaky_relu's slope into where, and
    full, full_like and scalar_tensor into zeros plus the tensor (exact,
    where multiplying ones would turn an infinite value into NaN beside a
    zero). A result on another device than the tensor is left alone."""

    def __init__(self, fx, add):
        self.fx = fx
        self.add = add  # add(node_before, op, args, kwargs) -> the new node

    def number(self, u, x, t):
        """Tensor `t` as ATen takes a number beside `x` (a node): a
        dimensioned floating x keeps its dtype beside a float64 0-dim
        tensor as beside the number, and the value keeps its precision;
        an integer or 0-dim x would be promoted by it, so t is cast first
        to the dtype the number would have given."""
        v = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if not isinstance(v, torch.Tensor) or (v.dim() > 0 and v.is_floating_point()):
            return t
        return self.add(u, torch.ops.aten._to_copy.default, [t],
                        {"dtype": torch.result_type(v, 1.0)})

    def rewrite(self, u, n, t):
        """Replaces node `u`, which takes float node `n` as a number, by ops
        on `n`'s tensor `t`; False where kiln has no such form."""
        aten = torch.ops.aten
        op, args, kwargs = u.target, list(u.args), dict(u.kwargs)
        packet = op.overloadpacket
        want = u.meta.get("val")
        if not isinstance(want, torch.Tensor) or want.device != t.meta["val"].device:
            return False
        if op is aten.pow.Tensor_Scalar and args[1] is n and not kwargs:
            new = self.add(u, aten.pow.Tensor_Tensor, [args[0], self.number(u, args[0], t)], {})
        elif op is aten.pow.Scalar and args[0] is n and not kwargs:
            new = self.add(u, aten.pow.Tensor_Tensor, [self.number(u, args[1], t), args[1]], {})
        elif op._overloadname == "Scalar" and hasattr(packet, "Tensor") and len(args) == 2 \
                and args[0] is not n and args[1] is n and not kwargs:
            new = self.add(u, packet.Tensor, [args[0], self.number(u, args[0], t)], {})
        elif op is aten.clamp.default:
            bounds = args[1:] + [None] * (3 - len(args))
            low, high = kwargs.pop("min", bounds[0]), kwargs.pop("max", bounds[1])
            if kwargs or args[0] is n:
                return False
            new = args[0]
            for bound, beyond in ((low, aten.lt.Tensor), (high, aten.gt.Tensor)):
                if bound is n:
                    b = self.number(u, args[0], t)
                    new = self.add(u, aten.where.self, [self.add(u, beyond, [new, b], {}), b, new],
                                   {})
                elif bound is not None:
                    new = self.add(u, aten.clamp.default,
                                   [new] + ([bound, None] if beyond is aten.lt.Tensor
                                            else [None, bound]), {})
        elif op is aten.leaky_relu.default and args[1:] == [n] and not kwargs:
            x = args[0]
            positive = self.add(u, aten.gt.Scalar, [x, 0], {})
            scaled = self.add(u, aten.mul.Tensor, [x, t], {})
            new = self.add(u, aten.where.self, [positive, x, scaled], {})
        elif op in (aten.full.default, aten.full_like.default) and args[1:] == [n]:
            zeros = aten.zeros.default if op is aten.full.default else aten.zeros_like.default
            base = self.add(u, zeros, [args[0]], kwargs)
            new = self.add(u, aten.add.Tensor, [base, t], {})
        elif op is aten.scalar_tensor.default and args == [n]:
            new = self.add(u, aten._to_copy.default, [t], {"dtype": want.dtype})
        else:
            return False
        if new.meta["val"].dtype != want.dtype:
            new = self.add(u, aten._to_copy.default, [new], {"dtype": want.dtype})
        u.replace_all_uses_with(new)
        self.fx.erase_node(u)
        return True
