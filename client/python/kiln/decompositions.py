"""The decomposition table the lowering traces with (kiln.lower): torch's
core-ATen table, and the ops besides it that kiln decomposes itself into
ops kilnd fuses and differentiates. table() builds it once per process."""

import torch
from torch._decomp import core_aten_decompositions, decomposition_table

# Besides torch's core-ATen decompositions, batch norm into the reductions
# and pointwise ops it is made of (var_mean into var and mean): kilnd then
# fuses its statistics and normalization into generated kernels, and
# differentiates them itself, instead of calling ATen's batch norm kernels
# (on a GPU, ATen's bfloat16 batch norm backward alone took longer than the
# whole step's convolutions). Likewise the activations, losses and shape
# ops below that the core table keeps whole (F.elu, F.softplus, F.mish,
# F.normalize, Tensor.repeat, torch.roll, ...): their decompositions are
# pointwise ops, reductions and views that kilnd fuses and differentiates,
# where the op whole would run through ATen and refuse a gradient. (Those
# whose decompositions reach torch's prims, such as atan2 or trunc, stay
# whole; trunc is floor and ceil, below.) kilnd differentiates the ops a
# decomposition gives, not autograd's formula for the op, so a decomposition
# must not compute an infinity its where() then discards: its gradient
# would be 0 * inf, NaN. elu, softplus and the vector norm have such
# decompositions in torch and get their own below; binary_cross_entropy
# (in the core table) stays whole, differentiated by ATen's backward.
_A = torch.ops.aten
_EXTRA_DECOMPOSITIONS = (
    _A._native_batch_norm_legit_functional.default,
    _A._native_batch_norm_legit.default,
    _A._native_batch_norm_legit.no_stats,
    _A._native_batch_norm_legit_no_training.default,
    _A.repeat.default, _A.roll.default, _A.addmv.default,
    _A.addcmul.default, _A.addcdiv.default, _A.lerp.Scalar, _A.lerp.Tensor, _A.frac.default,
    _A.sgn.default, _A.logit.default, _A.nan_to_num.default, _A.tril.default,
    _A.triu.default, _A.pixel_shuffle.default, _A.reflection_pad2d.default,
    _A.replication_pad2d.default, _A.celu.default, _A.selu.default, _A.mish.default,
    _A.glu.default, _A.hardsigmoid.default, _A.hardswish.default, _A.softshrink.default,
    _A.hardshrink.default, _A.threshold.default, _A.log_sigmoid_forward.default,
    _A.mse_loss.default, _A.huber_loss.default, _A.smooth_l1_loss.default,
    _A.soft_margin_loss.default, _A.binary_cross_entropy_with_logits.default,
)
_DECOMPOSITIONS = None


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    """aten.var_mean.correction as var and mean, both of which kilnd lowers."""
    dims = list(range(x.dim())) if dim is None else dim
    return (torch.ops.aten.var.correction(x, dims, correction=correction, keepdim=keepdim),
            torch.ops.aten.mean.dim(x, dims, keepdim))


def _clamp_tensor(x, min=None, max=None):
    """aten.clamp.Tensor as maximum and minimum, which kilnd fuses and
    differentiates (at a tie with a bound the gradient splits, where
    clamp's backward gives it to x)."""
    if min is not None:
        x = torch.ops.aten.maximum.default(x, min)
    if max is not None:
        x = torch.ops.aten.minimum.default(x, max)
    return x


def _elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    """aten.elu with its exponential taken of x where x <= 0 and of 0
    elsewhere: the branch where() drops stays finite for large x."""
    positive = torch.ops.aten.gt.Scalar(x, 0)
    neg = torch.ops.aten.where.self(positive, torch.ops.aten.zeros_like.default(x), x)
    curve = torch.ops.aten.mul.Scalar(
        torch.ops.aten.expm1.default(torch.ops.aten.mul.Scalar(neg, input_scale)),
        alpha * scale)
    return torch.ops.aten.where.self(positive, torch.ops.aten.mul.Scalar(x, scale), curve)


def _softplus(x, beta=1.0, threshold=20.0):
    """aten.softplus with its exponential taken of min(beta * x,
    threshold): finite where where() keeps x itself."""
    scaled = torch.ops.aten.mul.Scalar(x, beta)
    capped = torch.ops.aten.clamp.default(scaled, None, threshold)
    curve = torch.ops.aten.div.Scalar(
        torch.ops.aten.log1p.default(torch.ops.aten.exp.default(capped)), beta)
    return torch.ops.aten.where.self(torch.ops.aten.gt.Scalar(scaled, threshold), x, curve)


def _vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """aten.linalg_vector_norm as a reduction, 16-bit inputs in float32.
    A zero vector's norm of order 2 (or p) takes its root of 1 and is set
    to 0 after, so that its gradient is 0, as ATen's backward gives, and
    not 0 * inf."""
    if x.is_complex():
        return decomposition_table[torch.ops.aten.linalg_vector_norm.default](
            x, ord, dim, keepdim, dtype=dtype)
    aten = torch.ops.aten
    out_dtype = dtype or x.dtype
    acc = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else out_dtype
    if x.dtype != acc:
        x = aten._to_copy.default(x, dtype=acc)
    dims = list(range(x.dim())) if not dim else list(dim)
    if ord == 0:
        r = aten.sum.dim_IntList(aten._to_copy.default(aten.ne.Scalar(x, 0), dtype=acc), dims,
                                 keepdim)
    elif ord in (float("inf"), float("-inf")):
        reduce = aten.amax.default if ord > 0 else aten.amin.default
        r = reduce(aten.abs.default(x), dims, keepdim)
    elif ord == 1:
        r = aten.sum.dim_IntList(aten.abs.default(x), dims, keepdim)
    else:
        powered = aten.mul.Tensor(x, x) if ord == 2 else aten.pow.Tensor_Scalar(
            aten.abs.default(x), ord)
        total = aten.sum.dim_IntList(powered, dims, keepdim)
        zero = aten.eq.Scalar(total, 0)
        safe = aten.where.self(zero, aten.ones_like.default(total), total)
        root = aten.sqrt.default(safe) if ord == 2 else aten.pow.Tensor_Scalar(safe, 1.0 / ord)
        r = aten.where.self(zero, aten.zeros_like.default(root), root)
    return r if r.dtype == out_dtype else aten._to_copy.default(r, dtype=out_dtype)


def _trunc(x):
    """aten.trunc as floor and ceil (torch's own decomposition reaches a
    prim)."""
    if not x.is_floating_point():
        return torch.ops.aten.clone.default(x)
    return torch.ops.aten.where.self(torch.ops.aten.lt.Scalar(x, 0),
                                     torch.ops.aten.ceil.default(x),
                                     torch.ops.aten.floor.default(x))


# torch.export's core-ATen table is the post-autograd table plus an entry per
# CompositeImplicitAutograd op of every namespace, whose collection costs
# 70-150 ms per process (the first graph's warm start). Tracing below runs
# those ops' composite kernels anyway; only these, registered as composite in
# Python alone, need their entries.
_PYTHON_COMPOSITE = (
    torch.ops.aten.upsample_nearest1d.default,
    torch.ops.aten.upsample_nearest2d.default,
    torch.ops.aten.upsample_nearest3d.default,
    torch.ops.aten._upsample_nearest_exact1d.default,
    torch.ops.aten._upsample_nearest_exact2d.default,
    torch.ops.aten._upsample_nearest_exact3d.default,
)


def _core_table():
    try:
        from torch._decomp import _core_aten_decompositions_post_autograd
    except ImportError:  # another torch: its public table, whatever it costs
        return dict(core_aten_decompositions())
    table = dict(_core_aten_decompositions_post_autograd())
    for op in _PYTHON_COMPOSITE:
        if op in decomposition_table:
            table[op] = decomposition_table[op]
    return table


def table():
    """The table, built on first use."""
    global _DECOMPOSITIONS
    if _DECOMPOSITIONS is None:
        table = _core_table()
        for op in _EXTRA_DECOMPOSITIONS:
            if op in decomposition_table:
                table[op] = decomposition_table[op]
        table[torch.ops.aten.var_mean.correction] = _var_mean
        table[torch.ops.aten.clamp.Tensor] = _clamp_tensor
        table[torch.ops.aten.trunc.default] = _trunc
        table[torch.ops.aten.elu.default] = _elu
        table[torch.ops.aten.softplus.default] = _softplus
        table[torch.ops.aten.linalg_vector_norm.default] = _vector_norm
        # kilnd differentiates it with ATen's backward (see above).
        table.pop(torch.ops.aten.binary_cross_entropy.default, None)
        _DECOMPOSITIONS = table
    return _DECOMPOSITIONS
