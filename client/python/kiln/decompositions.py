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
# F.normalize, Tensor.repeat, torch.roll, F.grid_sample, ...): their decompositions are
# pointwise ops, reductions and views that kilnd fuses and differentiates,
# where the op whole would run through ATen and refuse a gradient. (Those
# whose decompositions reach torch's prims, such as atan2 or trunc, stay
# whole or get kiln's own below: trunc and round from floor and ceil, prod
# and cumprod as products, embedding_bag as embedding and index_add.) kilnd
# differentiates the ops a decomposition gives, not autograd's formula for
# the op, so a decomposition must not compute an infinity its where() then
# discards: its gradient would be 0 * inf, NaN. elu, softplus and the vector norm have such
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
    _A.grid_sampler_2d.default,
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


def _round(x):
    """aten.round, half to even, from floor: the fraction x - floor(x) is
    exact, and so is the parity of floor(x). Its gradient is zero, as
    round's."""
    aten = torch.ops.aten
    if not x.is_floating_point():
        return aten.clone.default(x)
    down = aten.floor.default(x)
    frac = aten.sub.Tensor(x, down)
    up = aten.add.Scalar(down, 1)
    parity = aten.sub.Tensor(
        down, aten.mul.Scalar(aten.floor.default(aten.mul.Scalar(down, 0.5)), 2))
    odd = aten.eq.Scalar(parity, 1)
    tie = aten.where.self(odd, up, down)
    return aten.where.self(aten.gt.Scalar(frac, 0.5), up,
                           aten.where.self(aten.lt.Scalar(frac, 0.5), down, tie))


def _prod(x, *, dtype=None):
    """aten.prod of every element, as prod.dim_int over the flattened
    tensor (torch's decomposition reaches a prim)."""
    flat = torch.ops.aten.reshape.default(x, [-1])
    return torch.ops.aten.prod.dim_int(flat, 0, False, dtype=dtype)


def _max(x):
    """aten.max of every element, as amax over every dim: the same value,
    and autograd's rule for both shares the gradient evenly among ties
    (where a NaN is the result, amax's gradient is NaN everywhere, max's
    goes to the NaNs)."""
    return torch.ops.aten.amax.default(x, list(range(x.dim())), False)


def _min(x):
    """aten.min of every element, as amin over every dim (see _max)."""
    return torch.ops.aten.amin.default(x, list(range(x.dim())), False)


def _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """aten._trilinear (nn.Bilinear's core): the three inputs unsqueezed at
    their `expand` dims, multiplied and summed over `sumdim`, as an einsum,
    which contracts them pairwise by matmuls; a plain broadcast product
    would hold every term (batch * out * in1 * in2 for a bilinear layer)."""
    rank = i1.dim() + len(expand1)
    letters = "abcdefghijklmnopqrstuvwxyz"[:rank]

    def subscript(expand):
        return "".join(letters[d] for d in range(rank) if d not in expand)

    out = "".join(letters[d] for d in range(rank) if d not in sumdim)
    equation = f"{subscript(expand1)},{subscript(expand2)},{subscript(expand3)}->{out}"
    return torch.einsum(equation, i1, i2, i3)


def _cdist(x1, x2, p, compute_mode=None):
    """aten._cdist_forward (torch.cdist): the p-norm of every row of x1
    against every row of x2 from their differences, a reduction kilnd
    fuses with them (nothing of batch * rows1 * rows2 * features is held).
    The root's gradient is 0 where a distance is 0, as ATen's backward
    makes it (a pair of equal rows, cdist(x, x)'s diagonal)."""
    aten = torch.ops.aten
    diff = aten.sub.Tensor(aten.unsqueeze.default(x1, -2), aten.unsqueeze.default(x2, -3))
    if p == 0:
        return aten.sum.dim_IntList(aten._to_copy.default(aten.ne.Scalar(diff, 0),
                                                          dtype=x1.dtype), [-1])
    magnitude = aten.abs.default(diff)
    if p == float("inf"):
        return aten.amax.default(magnitude, [-1])
    if p == 1:
        return aten.sum.dim_IntList(magnitude, [-1])
    if p == 2:
        powered = aten.mul.Tensor(diff, diff)
    elif p > 1:
        powered = aten.pow.Tensor_Scalar(magnitude, p)
    else:  # |d|^p's gradient is infinite at d = 0, where ATen's is 0
        flat = aten.eq.Scalar(magnitude, 0)
        lifted = aten.pow.Tensor_Scalar(
            aten.where.self(flat, aten.full_like.default(magnitude, 1), magnitude), p)
        powered = aten.where.self(flat, aten.full_like.default(magnitude, 0), lifted)
    total = aten.sum.dim_IntList(powered, [-1])
    zero = aten.eq.Scalar(total, 0)
    safe = aten.where.self(zero, aten.full_like.default(total, 1), total)
    root = aten.sqrt.default(safe) if p == 2 else aten.pow.Tensor_Scalar(safe, 1.0 / p)
    return aten.where.self(zero, aten.full_like.default(total, 0), root)


def _cumprod(x, dim, *, dtype=None):
    """aten.cumprod as a scan by doubling: after step k each element holds
    the product of the 2^k before it and itself, the shifted operand padded
    with ones. Only multiplications, so that the gradient is exact where
    inputs are zero (dividing the result by the input is not); log2(n)
    steps. Sizes that are symbolic keep the op whole."""
    aten = torch.ops.aten
    if dtype is not None:
        x = aten._to_copy.default(x, dtype=dtype)
    elif not (x.is_floating_point() or x.is_complex()):
        x = aten._to_copy.default(x, dtype=torch.int64)
    if x.dim() == 0:
        return aten.clone.default(x)
    dim = dim % x.dim()
    n = x.shape[dim]
    if not isinstance(n, int):
        return NotImplemented
    pad_before = 2 * (x.dim() - 1 - dim)
    y, k = x, 1
    if n <= 1:
        return aten.clone.default(y)
    while k < n:
        head = aten.slice.Tensor(y, dim, 0, n - k)
        pad = [0] * pad_before + [k, 0]
        y = aten.mul.Tensor(y, aten.constant_pad_nd.default(head, pad, 1))
        k *= 2
    return y


def _diagonal(x, offset=0, dim1=0, dim2=1):
    """aten.diagonal as a strided slice of the two dims flattened, moved
    last (torch's decomposition is an as_strided of the input's own
    strides, which a value kilnd lays out anew does not keep)."""
    aten = torch.ops.aten
    nd = x.dim()
    d1, d2 = dim1 % nd, dim2 % nd
    n, m = x.shape[d1], x.shape[d2]
    if not isinstance(n, int) or not isinstance(m, int) or d1 == d2:
        return NotImplemented
    rest = [d for d in range(nd) if d not in (d1, d2)]
    flat = aten.reshape.default(aten.permute.default(x, rest + [d1, d2]),
                                [x.shape[d] for d in rest] + [n * m])
    if offset >= 0:
        start, count = offset, min(n, m - offset)
    else:
        start, count = -offset * m, min(n + offset, m)
    if count <= 0:
        return aten.slice.Tensor(flat, -1, 0, 0)
    return aten.slice.Tensor(flat, -1, start, start + (count - 1) * (m + 1) + 1, m + 1)


def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """aten._embedding_bag in sum (mode 0) and mean (mode 1) as embedding
    and index_add into the bags, which kilnd differentiates: each index's
    bag is the count of offsets at or before it, less one. Max (mode 2),
    scale_grad_by_freq and sparse gradients keep the op whole."""
    aten = torch.ops.aten
    if mode not in (0, 1) or scale_grad_by_freq or sparse or indices.dim() != 1 \
            or offsets.dim() != 1:
        return NotImplemented
    n, bags = indices.shape[0], offsets.shape[0] - (1 if include_last_offset else 0)
    if not isinstance(n, int) or not isinstance(bags, int):
        return NotImplemented
    index_dtype = indices.dtype if indices.device.type != "cpu" else offsets.dtype
    starts = aten.slice.Tensor(offsets, 0, 0, bags)
    marks = aten.index_add.default(
        aten.zeros.default([n + 1], dtype=index_dtype, device=indices.device), 0, starts,
        aten.ones.default([bags], dtype=index_dtype, device=indices.device))
    bag = aten.sub.Scalar(aten.slice.Tensor(aten.cumsum.default(marks, 0), 0, 0, n), 1)
    rows = aten.embedding.default(weight, indices, padding_idx)
    keep = None
    if padding_idx is not None and padding_idx >= 0:
        keep = aten.ne.Scalar(indices, padding_idx)
        rows = aten.mul.Tensor(rows, aten.unsqueeze.default(
            aten._to_copy.default(keep, dtype=weight.dtype), 1))
    if per_sample_weights is not None:
        rows = aten.mul.Tensor(rows, aten.unsqueeze.default(per_sample_weights, 1))
    out = aten.index_add.default(
        aten.zeros.default([bags, weight.shape[1]], dtype=weight.dtype, device=weight.device),
        0, bag, rows)
    counted = aten.ones.default([n], dtype=index_dtype, device=indices.device) if keep is None \
        else aten._to_copy.default(keep, dtype=index_dtype)
    size = aten.index_add.default(
        aten.zeros.default([bags], dtype=index_dtype, device=indices.device), 0, bag, counted)
    if mode == 1:
        divisor = aten.clamp.default(aten._to_copy.default(size, dtype=weight.dtype), 1)
        out = aten.div.Tensor(out, aten.unsqueeze.default(divisor, 1))
    # The other results have the sizes ATen's kernels give them (its meta
    # function): offset2bag each index's bag, bag_size the counts.
    if indices.device.type != "cpu":
        size = aten.constant_pad_nd.default(size, [0, offsets.shape[0] - bags], 0)
        return out, bag, size, aten.zeros.default([0], dtype=index_dtype, device=indices.device)
    fast = weight.dtype in (torch.float32, torch.float16) and weight.stride(1) == 1 \
        and (padding_idx is None or padding_idx < 0) \
        and (per_sample_weights is None or per_sample_weights.stride(0) == 1)
    offset2bag = bag if mode == 1 or not fast else \
        aten.zeros.default([0], dtype=index_dtype, device=indices.device)
    max_indices = aten.zeros.default([bags], dtype=index_dtype, device=indices.device)
    return out, offset2bag, size, max_indices


def _masked_scatter(x, mask, source):
    """aten.masked_scatter (a multimodal model's image features written
    into its text embeddings where the mask is set) as a gather of
    source's elements in order, each set position taking the element its
    count of set positions before it names (a cumsum), and a where: kilnd
    differentiates those, where the op whole ran through ATen and refused
    a gradient. Source's gradient is the output's at the positions that
    took its elements, as ATen's masked_scatter_backward gives; the counts
    are clamped to source's elements, which ATen requires to suffice."""
    aten = torch.ops.aten
    count = source.numel()
    if isinstance(count, int) and count == 0:
        return NotImplemented
    shape = list(torch.broadcast_shapes(x.shape, mask.shape))
    x, mask = aten.expand.default(x, shape), aten.expand.default(mask, shape)
    flat = aten._to_copy.default(aten.reshape.default(mask, [-1]), dtype=torch.int64)
    position = aten.clamp.default(aten.sub.Scalar(aten.cumsum.default(flat, 0), 1), 0,
                                  count - 1)
    taken = aten.index.Tensor(aten.reshape.default(source, [-1]), [position])
    return aten.where.self(mask, aten.reshape.default(taken, shape), x)


def _lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """aten._thnn_fused_lstm_cell (what nn.LSTMCell and torch.lstm_cell run
    on CUDA after their two matmuls) as the pointwise ops it fuses: gates
    i, f, g and o in that order, c' = sigmoid(f) c + sigmoid(i) tanh(g),
    h' = sigmoid(o) tanh(c'). kilnd fuses and differentiates them, where the
    op whole ran through ATen and refused a gradient. The third result, the
    activated gates ATen's backward reads, has its sizes; nothing in a
    graph reads it."""
    aten = torch.ops.aten
    gates = aten.add.Tensor(input_gates, hidden_gates)
    for bias in (input_bias, hidden_bias):
        if bias is not None:
            gates = aten.add.Tensor(gates, bias)
    i, f, g, o = aten.split.Tensor(gates, gates.shape[1] // 4, 1)
    i, f, g, o = aten.sigmoid.default(i), aten.sigmoid.default(f), aten.tanh.default(g), \
        aten.sigmoid.default(o)
    cy = aten.add.Tensor(aten.mul.Tensor(f, cx), aten.mul.Tensor(i, g))
    hy = aten.mul.Tensor(o, aten.tanh.default(cy))
    return hy, cy, aten.cat.default([i, f, g, o], 1)


def _gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """aten._thnn_fused_gru_cell (nn.GRUCell on CUDA) likewise: gates r, z
    and n, r and z the sigmoids of both halves' sums, n = tanh(in + r hn)
    with each half's bias inside, h' = n + z (h - n). Its second result has
    the sizes of ATen's saved [r, z, n, h, hn]."""
    aten = torch.ops.aten
    if input_bias is not None:
        input_gates = aten.add.Tensor(input_gates, input_bias)
    if hidden_bias is not None:
        hidden_gates = aten.add.Tensor(hidden_gates, hidden_bias)
    size = input_gates.shape[1] // 3
    ir, iz, i_n = aten.split.Tensor(input_gates, size, 1)
    hr, hz, hn = aten.split.Tensor(hidden_gates, size, 1)
    r = aten.sigmoid.default(aten.add.Tensor(ir, hr))
    z = aten.sigmoid.default(aten.add.Tensor(iz, hz))
    n = aten.tanh.default(aten.add.Tensor(i_n, aten.mul.Tensor(r, hn)))
    hy = aten.add.Tensor(n, aten.mul.Tensor(z, aten.sub.Tensor(hx, n)))
    return hy, aten.cat.default([r, z, n, hx, hn], 1)


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
        table[torch.ops.aten.round.default] = _round
        table[torch.ops.aten.prod.default] = _prod
        table[torch.ops.aten.max.default] = _max
        table[torch.ops.aten.min.default] = _min
        table[torch.ops.aten._trilinear.default] = _trilinear
        table[torch.ops.aten._cdist_forward.default] = _cdist
        table[torch.ops.aten.diagonal.default] = _diagonal
        table[torch.ops.aten.cumprod.default] = _cumprod
        table[torch.ops.aten._embedding_bag.default] = _embedding_bag
        table[torch.ops.aten.masked_scatter.default] = _masked_scatter
        table[torch.ops.aten._thnn_fused_lstm_cell.default] = _lstm_cell
        table[torch.ops.aten._thnn_fused_gru_cell.default] = _gru_cell
        table[torch.ops.aten.elu.default] = _elu
        table[torch.ops.aten.softplus.default] = _softplus
        table[torch.ops.aten.linalg_vector_norm.default] = _vector_norm
        # kilnd differentiates it with ATen's backward (see above).
        table.pop(torch.ops.aten.binary_cross_entropy.default, None)
        _DECOMPOSITIONS = table
    return _DECOMPOSITIONS
