// Shape rules of the expensive ops kiln runs through ATen: matmul (mm, bmm,
// addmm), fused attention, convolution, pooling, embedding and indexing (index, gather);
// their registration.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_rules_internal.h"
#include "compiler/ops/shape_util.h"

namespace kiln::ops::shape_rules_internal {
namespace {

// ---------------------------------------------------------------------------
// Matmul, convolution, pooling, embedding, indexing.

absl::StatusOr<Metas> Mm(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(const TensorMeta* mat2, c.Meta("mat2"));
  RETURN_IF_ERROR(ExpectRank(c, "self", *self, {2}));
  RETURN_IF_ERROR(ExpectRank(c, "mat2", *mat2, {2}));
  RETURN_IF_ERROR(ExpectSameSize(c, "mat2", *mat2, 0, "self", *self, 1));
  RETURN_IF_ERROR(ExpectSameDType(c, "mat2", *mat2, "self", *self));
  return Metas{NewTensor(self->dtype, {self->sizes[0], mat2->sizes[1]}, *self)};
}

absl::StatusOr<Metas> Bmm(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(const TensorMeta* mat2, c.Meta("mat2"));
  RETURN_IF_ERROR(ExpectRank(c, "self", *self, {3}));
  RETURN_IF_ERROR(ExpectRank(c, "mat2", *mat2, {3}));
  RETURN_IF_ERROR(ExpectSameSize(c, "mat2", *mat2, 0, "self", *self, 0));
  RETURN_IF_ERROR(ExpectSameSize(c, "mat2", *mat2, 1, "self", *self, 2));
  RETURN_IF_ERROR(ExpectSameDType(c, "mat2", *mat2, "self", *self));
  return Metas{NewTensor(self->dtype, {self->sizes[0], self->sizes[1], mat2->sizes[2]}, *self)};
}

// Fused attention kernels (compiler/pipeline/attention.h puts them in place
// of softmax attention), without dropout, a bias or a mask.

struct AttentionOperands {
  const TensorMeta *q, *k, *v;
};

// Query, key and value of a fused attention kernel: rank 4, one dtype, and
// no dropout (kiln runs no random kernels).
absl::StatusOr<AttentionOperands> AttentionOperandsOf(const OpCall& c) {
  AttentionOperands o;
  ASSIGN_OR_RETURN(o.q, c.Meta("query"));
  ASSIGN_OR_RETURN(o.k, c.Meta("key"));
  ASSIGN_OR_RETURN(o.v, c.Meta("value"));
  RETURN_IF_ERROR(ExpectRank(c, "query", *o.q, {4}));
  RETURN_IF_ERROR(ExpectRank(c, "key", *o.k, {4}));
  RETURN_IF_ERROR(ExpectRank(c, "value", *o.v, {4}));
  RETURN_IF_ERROR(ExpectSameDType(c, "key", *o.k, "query", *o.q));
  RETURN_IF_ERROR(ExpectSameDType(c, "value", *o.v, "query", *o.q));
  ASSIGN_OR_RETURN(const double dropout, c.Double("dropout_p"));
  if (dropout != 0) return ArgError(c, "dropout_p", "must be 0: kiln runs no random kernels");
  return o;
}

// Operands in the heads-first layout: query [B, H, L, E], key [B, H, S, E],
// value [B, H, S, Ev].
absl::Status ExpectHeadsFirst(const OpCall& c, const AttentionOperands& o) {
  for (int64_t d : {0, 1, 3}) RETURN_IF_ERROR(ExpectSameSize(c, "key", *o.k, d, "query", *o.q, d));
  for (int64_t d : {0, 1}) RETURN_IF_ERROR(ExpectSameSize(c, "value", *o.v, d, "query", *o.q, d));
  return ExpectSameSize(c, "value", *o.v, 2, "key", *o.k, 2);
}

// A fused attention backward's gradient of operand `x`: shaped and strided
// as `x` (ATen allocates it so, or as one block for chunks of one
// projection, which gives each chunk's strides again).
TensorMeta GradientOf(const TensorMeta& x) {
  TensorMeta m = CopyOf(x, x.dtype);
  m.strides = x.strides;
  return m;
}

// A fused attention backward's upstream gradient (parameter `grad`): rank 4,
// with the sizes of the forward's output (parameter "out").
absl::Status ExpectGradientOfOutput(const OpCall& c, const char* grad) {
  ASSIGN_OR_RETURN(const TensorMeta* g, c.Meta(grad));
  ASSIGN_OR_RETURN(const TensorMeta* out, c.Meta("out"));
  RETURN_IF_ERROR(ExpectRank(c, grad, *g, {4}));
  RETURN_IF_ERROR(ExpectRank(c, "out", *out, {4}));
  for (int64_t d = 0; d < 4; ++d) RETURN_IF_ERROR(ExpectSameSize(c, grad, *g, d, "out", *out, d));
  return absl::OkStatus();
}

// Memory-efficient attention: query [B, H, L, E], key [B, H, S, E] and
// value [B, H, S, Ev] give the output [B, H, L, Ev], laid out as
// [B, L, H, Ev]; the log-sum-exp, [B, H, L rounded up to 32] in float32 when
// asked for and [B, H, 0] otherwise; the dropout RNG's seed and offset, int64
// scalars that ATen keeps in host memory.
absl::StatusOr<Metas> EfficientAttention(const OpCall& c) {
  ASSIGN_OR_RETURN(const AttentionOperands ops, AttentionOperandsOf(c));
  RETURN_IF_ERROR(ExpectHeadsFirst(c, ops));
  const TensorMeta *q = ops.q, *v = ops.v;
  if (!c.IsNone("attn_bias")) return ArgError(c, "attn_bias", "is not supported");
  ASSIGN_OR_RETURN(const bool log_sumexp, c.Bool("compute_log_sumexp"));
  const SymInt &b = q->sizes[0], &h = q->sizes[1], &l = q->sizes[2], &ev = v->sizes[3];
  TensorMeta out = NewTensor(q->dtype, {b, h, l, ev}, *q);
  out.strides = {SymMul(SymMul(l, h), ev), ev, SymMul(h, ev), SymInt{int64_t{1}}};
  SymInt lse_length{int64_t{0}};
  if (log_sumexp) {
    if (!l.is_constant()) return ArgError(c, "compute_log_sumexp", "needs a constant query length");
    lse_length = SymInt{(l.constant() + 31) / 32 * 32};
  }
  const ir::Device host{"cpu", -1};
  return Metas{out, NewTensor(v1::FLOAT32, {b, h, lse_length}, *q),
               NewTensorOn(v1::INT64, {}, host), NewTensorOn(v1::INT64, {}, host)};
}

// Scaled dot-product attention, the composite op: ATen picks the kernel
// when it runs (cuDNN's on Hopper for 16-bit dtypes, flash or
// memory-efficient attention elsewhere). Query [B, H, L, E], key
// [B, H, S, E], value [B, H, S, Ev] give [B, H, L, Ev], laid out in the
// order of the query's strides as cuDNN allocates it (when they are
// constant; contiguous otherwise). A kernel that lays it out otherwise is
// copied into this layout by the runtime.
absl::StatusOr<Metas> ScaledDotProductAttention(const OpCall& c) {
  ASSIGN_OR_RETURN(const AttentionOperands ops, AttentionOperandsOf(c));
  RETURN_IF_ERROR(ExpectHeadsFirst(c, ops));
  const TensorMeta *q = ops.q, *v = ops.v;
  if (!c.IsNone("attn_mask")) return ArgError(c, "attn_mask", "is not supported");
  ASSIGN_OR_RETURN(const bool gqa, c.Bool("enable_gqa"));
  if (gqa) return ArgError(c, "enable_gqa", "is not supported");
  TensorMeta out = NewTensor(q->dtype, {q->sizes[0], q->sizes[1], q->sizes[2], v->sizes[3]}, *q);
  bool constant = q->strides.size() == 4;
  for (const SymInt& st : q->strides) constant = constant && st.is_constant();
  for (const SymInt& sz : out.sizes) constant = constant && sz.is_constant();
  if (constant) {
    // Dims from the query's largest stride to its smallest (stable), dense.
    std::vector<int> order = {0, 1, 2, 3};
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return q->strides[a].constant() > q->strides[b].constant();
    });
    int64_t stride = 1;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      out.strides[*it] = SymInt{stride};
      stride *= out.sizes[*it].constant();
    }
  }
  return Metas{out};
}

// Its backward: the gradients of query, key and value, shaped and strided as
// they are (ATen allocates each with its operand's strides, or, when the
// three share a storage as the chunks of one projection do, as one
// [B, L, 3, H, E] block, which gives each chunk's strides again; where it
// picks another layout, the runtime copies into this one), and an undefined
// gradient of the bias (kiln passes none).
absl::StatusOr<Metas> EfficientAttentionBackward(const OpCall& c) {
  ASSIGN_OR_RETURN(const AttentionOperands ops, AttentionOperandsOf(c));
  RETURN_IF_ERROR(ExpectGradientOfOutput(c, "grad_out_"));
  if (!c.IsNone("attn_bias")) return ArgError(c, "attn_bias", "is not supported");
  return Metas{GradientOf(*ops.q), GradientOf(*ops.k), GradientOf(*ops.v),
               NewTensor(ops.q->dtype, {SymInt{int64_t{0}}}, *ops.q)};
}

// Flash attention (float16 and bfloat16, sm_80 and later), in its own layout:
// query [B, L, H, E], key [B, S, H, E] and value [B, S, H, E] give the
// output [B, L, H, E], laid out as the query is (ATen allocates it like the
// query); the log-sum-exp [B, H, L] in float32; the RNG state and an unused
// result (uint64 in ATen, int64 here: kiln reads neither); an empty debug
// mask.
absl::StatusOr<Metas> FlashAttention(const OpCall& c) {
  ASSIGN_OR_RETURN(const AttentionOperands ops, AttentionOperandsOf(c));
  const TensorMeta *q = ops.q, *k = ops.k, *v = ops.v;
  for (int64_t d : {0, 2, 3}) RETURN_IF_ERROR(ExpectSameSize(c, "key", *k, d, "query", *q, d));
  for (int64_t d : {0, 2, 3}) RETURN_IF_ERROR(ExpectSameSize(c, "value", *v, d, "query", *q, d));
  RETURN_IF_ERROR(ExpectSameSize(c, "value", *v, 1, "key", *k, 1));
  for (const char* unsupported : {"cum_seq_q", "cum_seq_k", "window_size_left", "window_size_right",
                                  "seqused_k", "alibi_slopes"}) {
    if (!c.IsNone(unsupported)) return ArgError(c, unsupported, "is not supported");
  }
  ASSIGN_OR_RETURN(const bool debug, c.Bool("return_debug_mask"));
  if (debug) return ArgError(c, "return_debug_mask", "is not supported");
  const SymInt &b = q->sizes[0], &l = q->sizes[1], &h = q->sizes[2];
  // ATen allocates the output like the query. A query that is a contiguous
  // [B, H, L, E] seen as [B, L, H, E] (the attention rewrite's view) is dense:
  // its strides are kept, symbolic or not.
  TensorMeta out = CopyOf(*q, q->dtype);
  TensorMeta heads_first = *q;
  std::swap(heads_first.sizes[1], heads_first.sizes[2]);
  std::swap(heads_first.strides[1], heads_first.strides[2]);
  if (IsContiguous(heads_first)) out.strides = q->strides;
  return Metas{out, NewTensor(v1::FLOAT32, {b, h, l}, *q),
               NewTensor(v1::INT64, {SymInt{int64_t{2}}}, *q), NewTensor(v1::INT64, {}, *q),
               NewTensor(q->dtype, {SymInt{int64_t{0}}}, *q)};
}

// Its backward: the gradients of query, key and value in flash's layout,
// shaped and strided as they are (ATen allocates each like its operand).
absl::StatusOr<Metas> FlashAttentionBackward(const OpCall& c) {
  ASSIGN_OR_RETURN(const AttentionOperands ops, AttentionOperandsOf(c));
  RETURN_IF_ERROR(ExpectGradientOfOutput(c, "grad_out"));
  for (const char* unsupported :
       {"cum_seq_q", "cum_seq_k", "window_size_left", "window_size_right"}) {
    if (!c.IsNone(unsupported)) return ArgError(c, unsupported, "is not supported");
  }
  return Metas{GradientOf(*ops.q), GradientOf(*ops.k), GradientOf(*ops.v)};
}

absl::StatusOr<Metas> Addmm(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(const TensorMeta* mat1, c.Meta("mat1"));
  ASSIGN_OR_RETURN(const TensorMeta* mat2, c.Meta("mat2"));
  RETURN_IF_ERROR(ExpectRank(c, "mat1", *mat1, {2}));
  RETURN_IF_ERROR(ExpectRank(c, "mat2", *mat2, {2}));
  RETURN_IF_ERROR(ExpectSameSize(c, "mat2", *mat2, 0, "mat1", *mat1, 1));
  RETURN_IF_ERROR(ExpectSameDType(c, "mat2", *mat2, "mat1", *mat1));
  RETURN_IF_ERROR(ExpectSameDType(c, "self", *self, "mat1", *mat1));
  const SymSizes out = {mat1->sizes[0], mat2->sizes[1]};
  auto b = BroadcastSizes(self->sizes, out);
  if (!b.ok() || !SizesCompatible(*b, out)) {
    return ArgError(c, "self",
                    absl::StrCat("has sizes ", SizesToString(self->sizes),
                                 ", which do not broadcast to the product's ", SizesToString(out)));
  }
  return Metas{NewTensor(mat1->dtype, out, *mat1)};
}

// A per-spatial-dimension parameter: one value for all, or one each.
absl::StatusOr<SymSizes> PerSpatial(const OpCall& c, const std::string& name, size_t k) {
  ASSIGN_OR_RETURN(SymSizes v, c.SymInts(name));
  if (v.size() == 1 && k > 1) v.resize(k, v[0]);
  if (v.size() != k) {
    return ArgError(c, name,
                    absl::StrCat(SizesToString(v), " should have 1 or ", k,
                                 " entries, one per spatial dimension"));
  }
  return v;
}

struct ConvParams {
  SymSizes stride, padding, dilation, output_padding;
  bool transposed = false;
  int64_t groups = 1;
};

absl::StatusOr<ConvParams> ReadConvParams(const OpCall& c, size_t k) {
  ConvParams p;
  ASSIGN_OR_RETURN(p.stride, PerSpatial(c, "stride", k));
  ASSIGN_OR_RETURN(p.padding, PerSpatial(c, "padding", k));
  ASSIGN_OR_RETURN(p.dilation, PerSpatial(c, "dilation", k));
  ASSIGN_OR_RETURN(p.transposed, c.Bool("transposed"));
  ASSIGN_OR_RETURN(p.output_padding, PerSpatial(c, "output_padding", k));
  ASSIGN_OR_RETURN(p.groups, c.Int("groups"));
  if (p.groups <= 0)
    return ArgError(c, "groups", absl::StrCat("is ", p.groups, "; it must be positive"));
  for (const SymInt& s : p.stride) {
    if (s.is_constant() && s.constant() <= 0) {
      return ArgError(c, "stride", absl::StrCat(SizesToString(p.stride), " should be positive"));
    }
  }
  return p;
}

// The output sizes of a convolution of `input` by `weight`:
//   [N, C_out, out_1, ..., out_k] with, per spatial dimension,
//   out = (in + 2*padding - dilation*(kernel-1) - 1) // stride + 1
//   transposed: out = (in-1)*stride - 2*padding + dilation*(kernel-1) + output_padding + 1
absl::StatusOr<SymSizes> ConvOutputSizes(const OpCall& c, const TensorMeta& input,
                                         const TensorMeta& weight, const ConvParams& p) {
  const size_t k = input.sizes.size() - 2;
  const SymInt groups{p.groups};
  const SymInt c_in = p.transposed ? weight.sizes[0] : SymMul(weight.sizes[1], groups);
  if (input.sizes[1].is_constant() && c_in.is_constant() &&
      input.sizes[1].constant() != c_in.constant()) {
    return ArgError(c, "weight",
                    absl::StrCat("has sizes ", SizesToString(weight.sizes),
                                 ", which with groups=", p.groups, " expect ", c_in.constant(),
                                 " input channels, but 'input' has ", input.sizes[1].ToString()));
  }
  SymSizes out{input.sizes[0], p.transposed ? SymMul(weight.sizes[1], groups) : weight.sizes[0]};
  const SymInt one{int64_t{1}};
  for (size_t i = 0; i < k; ++i) {
    const SymInt& in = input.sizes[2 + i];
    const SymInt extent = SymMul(p.dilation[i], SymSub(weight.sizes[2 + i], one));
    SymInt o;
    if (p.transposed) {
      o = SymAdd(SymAdd(SymSub(SymMul(SymSub(in, one), p.stride[i]),
                               SymMul(SymInt{int64_t{2}}, p.padding[i])),
                        extent),
                 SymAdd(p.output_padding[i], one));
    } else {
      o = SymAdd(SymFloorDiv(SymSub(SymAdd(in, SymMul(SymInt{int64_t{2}}, p.padding[i])),
                                    SymAdd(extent, one)),
                             p.stride[i]),
                 one);
    }
    if (o.is_constant() && o.constant() <= 0) {
      return ArgError(c, "input",
                      absl::StrCat("has sizes ", SizesToString(input.sizes),
                                   ", too small for the kernel ", SizesToString(weight.sizes),
                                   ": output size ", o.constant(), " at spatial dimension ", i));
    }
    out.push_back(o);
  }
  return out;
}

absl::StatusOr<Metas> Convolution(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* input, c.Meta("input"));
  ASSIGN_OR_RETURN(const TensorMeta* weight, c.Meta("weight"));
  if (Rank(*input) < 3) {
    return ArgError(
        c, "input",
        absl::StrCat("should be [N, C, spatial...], got sizes ", SizesToString(input->sizes)));
  }
  if (Rank(*weight) != Rank(*input)) {
    return ArgError(c, "weight",
                    absl::StrCat("has sizes ", SizesToString(weight->sizes), ", but 'input' has ",
                                 SizesToString(input->sizes), " (ranks differ)"));
  }
  ASSIGN_OR_RETURN(ConvParams p, ReadConvParams(c, input->sizes.size() - 2));
  ASSIGN_OR_RETURN(SymSizes sizes, ConvOutputSizes(c, *input, *weight, p));
  ASSIGN_OR_RETURN(const TensorMeta* bias, OptMeta(c, "bias"));
  if (bias != nullptr && !SizesCompatible(bias->sizes, {sizes[1]})) {
    return ArgError(c, "bias",
                    absl::StrCat("has sizes ", SizesToString(bias->sizes),
                                 ", but the "
                                 "convolution has ",
                                 sizes[1].ToString(), " output channels"));
  }
  RETURN_IF_ERROR(ExpectSameDType(c, "weight", *weight, "input", *input));
  TensorMeta out = NewTensor(input->dtype, std::move(sizes), *input);
  if (CudnnChannelsLast(*input, *weight, p.groups)) out.strides = ChannelsLastStrides(out.sizes);
  return Metas{std::move(out)};
}

// max_pool2d_with_indices and avg_pool2d: [N, C, H, W] or [C, H, W].
absl::StatusOr<SymSizes> PoolSizes(const OpCall& c, const TensorMeta& self, int spatial,
                                   bool has_dilation) {
  RETURN_IF_ERROR(ExpectRank(c, "self", self, {spatial + 1, spatial + 2}));
  ASSIGN_OR_RETURN(std::vector<int64_t> kernel, c.Ints("kernel_size"));
  ASSIGN_OR_RETURN(std::vector<int64_t> stride, c.Ints("stride"));
  ASSIGN_OR_RETURN(std::vector<int64_t> padding, c.Ints("padding"));
  std::vector<int64_t> dilation(spatial, 1);
  if (has_dilation) {
    ASSIGN_OR_RETURN(dilation, c.Ints("dilation"));
  }
  ASSIGN_OR_RETURN(bool ceil_mode, c.Bool("ceil_mode"));
  if (stride.empty()) stride = kernel;
  // One entry stands for every spatial dimension.
  auto fill = [&](std::vector<int64_t>& v, const char* name) -> absl::Status {
    if (v.size() == 1) v.assign(spatial, v[0]);
    if (v.size() != static_cast<size_t>(spatial)) {
      return ArgError(c, name,
                      absl::StrCat("should have 1 or ", spatial, " entries, got ", v.size()));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(fill(kernel, "kernel_size"));
  RETURN_IF_ERROR(fill(stride, "stride"));
  RETURN_IF_ERROR(fill(padding, "padding"));
  RETURN_IF_ERROR(fill(dilation, "dilation"));
  SymSizes sizes = self.sizes;
  const size_t h = sizes.size() - spatial;
  for (size_t i = 0; i < static_cast<size_t>(spatial); ++i) {
    if (kernel[i] <= 0 || stride[i] <= 0 || dilation[i] <= 0) {
      return ArgError(c,
                      kernel[i] <= 0   ? "kernel_size"
                      : stride[i] <= 0 ? "stride"
                                       : "dilation",
                      "should be positive");
    }
    if (padding[i] < 0 || padding[i] > kernel[i] / 2) {
      return ArgError(c, "padding",
                      absl::StrCat("is ", padding[i],
                                   "; it should be at most half the kernel size ", kernel[i]));
    }
    const SymInt& in = sizes[h + i];
    const int64_t extra =
        2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1 + (ceil_mode ? stride[i] - 1 : 0);
    SymInt o =
        SymAdd(SymFloorDiv(SymAdd(in, SymInt{extra}), SymInt{stride[i]}), SymInt{int64_t{1}});
    // With ceil_mode the last window must start inside the input or its
    // left padding.
    if (ceil_mode && o.is_constant() && in.is_constant() &&
        (o.constant() - 1) * stride[i] >= in.constant() + padding[i]) {
      o = SymInt{o.constant() - 1};
    }
    if (o.is_constant() && o.constant() <= 0) {
      return ArgError(c, "self",
                      absl::StrCat("has sizes ", SizesToString(self.sizes),
                                   ", too small for the kernel size ", kernel[i]));
    }
    sizes[h + i] = o;
  }
  return sizes;
}

// max_pool2d_with_indices and max_pool3d_with_indices: values and indices.
ShapeRule MaxPool(int spatial) {
  return [spatial](const OpCall& c) -> absl::StatusOr<Metas> {
    ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
    ASSIGN_OR_RETURN(SymSizes sizes, PoolSizes(c, *self, spatial, /*has_dilation=*/true));
    return Metas{PoolOut(self->dtype, sizes, *self), PoolOut(v1::INT64, sizes, *self)};
  };
}

// avg_pool2d and avg_pool3d.
ShapeRule AvgPool(int spatial) {
  return [spatial](const OpCall& c) -> absl::StatusOr<Metas> {
    ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
    ASSIGN_OR_RETURN(SymSizes sizes, PoolSizes(c, *self, spatial, /*has_dilation=*/false));
    return Metas{PoolOut(self->dtype, sizes, *self)};
  };
}

// The adaptive poolings: [N,] C and `spatial` dims pooled to `output_size`.
absl::StatusOr<SymSizes> AdaptivePoolSizes(const OpCall& c, const TensorMeta& self, int spatial) {
  RETURN_IF_ERROR(ExpectRank(c, "self", self, {spatial + 1, spatial + 2}));
  ASSIGN_OR_RETURN(SymSizes out, c.SymInts("output_size"));
  if (out.size() != static_cast<size_t>(spatial)) {
    return ArgError(c, "output_size",
                    absl::StrCat("should have ", spatial, " sizes, got ", out.size()));
  }
  for (const SymInt& s : out) {
    if (s.is_constant() && s.constant() <= 0) {
      return ArgError(c, "output_size",
                      absl::StrCat("should be positive, got ", SizesToString(out)));
    }
  }
  SymSizes sizes(self.sizes.begin(), self.sizes.end() - spatial);
  sizes.insert(sizes.end(), out.begin(), out.end());
  return sizes;
}

// _adaptive_avg_pool2d and _adaptive_avg_pool3d.
ShapeRule AdaptiveAvgPool(int spatial) {
  return [spatial](const OpCall& c) -> absl::StatusOr<Metas> {
    ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
    ASSIGN_OR_RETURN(SymSizes sizes, AdaptivePoolSizes(c, *self, spatial));
    return Metas{PoolOut(self->dtype, sizes, *self)};
  };
}

absl::StatusOr<Metas> AdaptiveMaxPool2d(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(SymSizes sizes, AdaptivePoolSizes(c, *self, 2));
  return Metas{PoolOut(self->dtype, sizes, *self), PoolOut(v1::INT64, sizes, *self)};
}

absl::Status ExpectIndexDType(const OpCall& c, const std::string& name, const TensorMeta& m) {
  if (m.dtype == v1::INT64 || m.dtype == v1::INT32) return absl::OkStatus();
  return ArgError(c, name,
                  absl::StrCat("should have dtype INT64 or INT32, got ", v1::DType_Name(m.dtype)));
}

absl::StatusOr<Metas> Embedding(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* weight, c.Meta("weight"));
  ASSIGN_OR_RETURN(const TensorMeta* indices, c.Meta("indices"));
  RETURN_IF_ERROR(ExpectRank(c, "weight", *weight, {2}));
  RETURN_IF_ERROR(ExpectIndexDType(c, "indices", *indices));
  SymSizes sizes = indices->sizes;
  sizes.push_back(weight->sizes[1]);
  return Metas{NewTensor(weight->dtype, std::move(sizes), *weight)};
}

// Advanced indexing with integer index tensors (None entries skip a
// dimension). The broadcast index shape replaces the indexed dimensions:
// in place when they are adjacent, in front otherwise.
absl::StatusOr<Metas> Index(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(std::vector<ir::ValueId> indices, c.Tensors("indices"));
  if (static_cast<int64_t>(indices.size()) > Rank(*self)) {
    return ArgError(c, "indices",
                    absl::StrCat("has ", indices.size(), " entries, but 'self' has sizes ",
                                 SizesToString(self->sizes)));
  }
  SymSizes index_sizes;
  int first = -1, last = -1;
  bool adjacent = true;
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] == ir::kNoValue) continue;
    const TensorMeta& m = c.MetaOf(indices[i]);
    if (m.dtype == v1::BOOL || m.dtype == v1::UINT8) {
      return ArgError(c, "indices",
                      absl::StrCat("entry ", i, " is a mask (dtype ", v1::DType_Name(m.dtype),
                                   "): the result's size depends on its values"));
    }
    RETURN_IF_ERROR(ExpectIndexDType(c, "indices", m));
    if (first < 0) {
      index_sizes = m.sizes;
      first = static_cast<int>(i);
    } else {
      if (last != static_cast<int>(i) - 1) adjacent = false;
      ASSIGN_OR_RETURN(index_sizes,
                       At(c, "argument 'indices'", BroadcastSizes(index_sizes, m.sizes)));
    }
    last = static_cast<int>(i);
  }
  if (first < 0) return Metas{NewTensor(self->dtype, self->sizes, *self)};
  SymSizes sizes;
  if (adjacent) {
    sizes.assign(self->sizes.begin(), self->sizes.begin() + first);
    sizes.insert(sizes.end(), index_sizes.begin(), index_sizes.end());
  } else {
    sizes = index_sizes;
    for (int i = 0; i < last; ++i) {
      if (i < static_cast<int>(indices.size()) && indices[i] == ir::kNoValue) {
        sizes.push_back(self->sizes[i]);
      }
    }
  }
  sizes.insert(sizes.end(), self->sizes.begin() + last + 1, self->sizes.end());
  return Metas{NewTensor(self->dtype, std::move(sizes), *self)};
}

absl::StatusOr<Metas> Gather(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(const TensorMeta* index, c.Meta("index"));
  RETURN_IF_ERROR(DimArg(c, "dim", Rank(*self)).status());
  if (index->dtype != v1::INT64) {
    return ArgError(c, "index",
                    absl::StrCat("should have dtype INT64, got ", v1::DType_Name(index->dtype)));
  }
  if (Rank(*index) != Rank(*self) && !(Rank(*self) == 0 && Rank(*index) <= 1) &&
      !(Rank(*index) == 0 && Rank(*self) <= 1)) {
    return ArgError(c, "index",
                    absl::StrCat("has sizes ", SizesToString(index->sizes), ", but 'self' has ",
                                 SizesToString(self->sizes), " (ranks differ)"));
  }
  return Metas{NewTensor(self->dtype, index->sizes, *self)};
}

// scatter_add, scatter_reduce and scatter (src, or a Scalar value): self's
// metadata; `src` (or the value) goes into it at `index` along `dim`, so
// index is int64 of self's rank, and src (where there is one) has self's
// rank and dtype.
absl::StatusOr<Metas> ScatterAdd(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(const TensorMeta* index, c.Meta("index"));
  RETURN_IF_ERROR(DimArg(c, "dim", Rank(*self)).status());
  if (index->dtype != v1::INT64) {
    return ArgError(c, "index",
                    absl::StrCat("should have dtype INT64, got ", v1::DType_Name(index->dtype)));
  }
  std::vector<std::pair<const char*, const TensorMeta*>> ranked = {{"index", index}};
  if (c.Find("src") != nullptr) {
    ASSIGN_OR_RETURN(const TensorMeta* src, c.Meta("src"));
    if (src->dtype != self->dtype) {
      return ArgError(c, "src",
                      absl::StrCat("has dtype ", v1::DType_Name(src->dtype), ", but 'self' has ",
                                   v1::DType_Name(self->dtype)));
    }
    ranked.emplace_back("src", src);
  }
  for (const auto& [name, m] : ranked) {
    if (Rank(*m) != Rank(*self)) {
      return ArgError(c, name,
                      absl::StrCat("has sizes ", SizesToString(m->sizes), ", but 'self' has ",
                                   SizesToString(self->sizes), " (ranks differ)"));
    }
  }
  return Metas{NewTensor(self->dtype, self->sizes, *self)};
}

// slice_scatter(self, src, dim, start, end, step): a copy of self (ATen
// clones it, keeping its layout), src written over the slice; src has
// self's rank and dtype.
absl::StatusOr<Metas> SliceScatter(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(const TensorMeta* src, c.Meta("src"));
  RETURN_IF_ERROR(DimArg(c, "dim", Rank(*self)).status());
  if (Rank(*src) != Rank(*self)) {
    return ArgError(c, "src",
                    absl::StrCat("has sizes ", SizesToString(src->sizes), ", but 'self' has ",
                                 SizesToString(self->sizes), " (ranks differ)"));
  }
  if (src->dtype != self->dtype) {
    return ArgError(c, "src",
                    absl::StrCat("has dtype ", v1::DType_Name(src->dtype), ", but 'self' has ",
                                 v1::DType_Name(self->dtype)));
  }
  return Metas{CopyOf(*self, self->dtype)};
}

// The integer index of index_select and index_add: one dimension at most.
absl::Status VectorIndex(const OpCall& c, const TensorMeta& index) {
  RETURN_IF_ERROR(ExpectIndexDType(c, "index", index));
  if (Rank(index) > 1) {
    return ArgError(
        c, "index",
        absl::StrCat("should have at most one dimension, got sizes ", SizesToString(index.sizes)));
  }
  return absl::OkStatus();
}

// index_select(self, dim, index): `dim` takes the index's length.
absl::StatusOr<Metas> IndexSelect(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(const TensorMeta* index, c.Meta("index"));
  ASSIGN_OR_RETURN(int64_t dim, DimArg(c, "dim", Rank(*self)));
  RETURN_IF_ERROR(VectorIndex(c, *index));
  SymSizes sizes = self->sizes;
  if (!sizes.empty()) sizes[dim] = index->sizes.empty() ? SymInt{int64_t{1}} : index->sizes[0];
  return Metas{NewTensor(self->dtype, std::move(sizes), *self)};
}

// index_add(self, dim, index, source, alpha): self's metadata; `source` is
// self with `dim` of the index's length.
absl::StatusOr<Metas> IndexAdd(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(const TensorMeta* index, c.Meta("index"));
  ASSIGN_OR_RETURN(const TensorMeta* source, c.Meta("source"));
  RETURN_IF_ERROR(DimArg(c, "dim", Rank(*self)).status());
  RETURN_IF_ERROR(VectorIndex(c, *index));
  if (source->dtype != self->dtype || Rank(*source) != Rank(*self)) {
    return ArgError(c, "source",
                    absl::StrCat("has dtype ", v1::DType_Name(source->dtype), " and sizes ",
                                 SizesToString(source->sizes), ", but 'self' has ",
                                 v1::DType_Name(self->dtype), " and ", SizesToString(self->sizes)));
  }
  return Metas{NewTensor(self->dtype, self->sizes, *self)};
}

// index_put(self, indices, values, accumulate): self's metadata; `values`
// (of self's dtype) broadcast to the indexed shape, which Index checks.
absl::StatusOr<Metas> IndexPut(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(const TensorMeta* values, c.Meta("values"));
  RETURN_IF_ERROR(Index(c).status());
  if (values->dtype != self->dtype) {
    return ArgError(c, "values",
                    absl::StrCat("has dtype ", v1::DType_Name(values->dtype), ", but 'self' has ",
                                 v1::DType_Name(self->dtype)));
  }
  return Metas{NewTensor(self->dtype, self->sizes, *self)};
}

// flip(self, dims): self's sizes, each of `dims` reversed, a new tensor.
absl::StatusOr<Metas> Flip(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(std::vector<int64_t> dims, c.Ints("dims"));
  std::vector<bool> seen(std::max<int64_t>(Rank(*self), 1), false);
  for (int64_t d : dims) {
    ASSIGN_OR_RETURN(int64_t w, At(c, "argument 'dims'", WrapDim(d, Rank(*self))));
    if (seen[w]) return ArgError(c, "dims", absl::StrCat("names dimension ", d, " twice"));
    seen[w] = true;
  }
  return Metas{NewTensor(self->dtype, self->sizes, *self)};
}

// cumsum(self, dim, dtype): self's sizes in `dtype`, else self's dtype
// (integers and bools as INT64, as ATen sums them).
absl::StatusOr<Metas> Cumsum(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  RETURN_IF_ERROR(DimArg(c, "dim", Rank(*self)).status());
  ASSIGN_OR_RETURN(std::optional<v1::DType> dtype, c.DType("dtype"));
  v1::DType out = self->dtype;
  if (dtype.has_value()) {
    out = *dtype;
  } else if (out != v1::FLOAT32 && out != v1::FLOAT64 && out != v1::FLOAT16 &&
             out != v1::BFLOAT16) {
    out = v1::INT64;
  }
  return Metas{NewTensor(out, self->sizes, *self)};
}

// median.dim and kthvalue: `dim` reduced (kept as 1 with keepdim); the
// indices INT64.
absl::StatusOr<Metas> SelectAlongDim(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(int64_t dim, DimArg(c, "dim", Rank(*self)));
  ASSIGN_OR_RETURN(bool keepdim, c.Bool("keepdim"));
  SymSizes sizes = self->sizes;
  if (!sizes.empty()) {
    if (keepdim) {
      sizes[dim] = SymInt{int64_t{1}};
    } else {
      sizes.erase(sizes.begin() + dim);
    }
  }
  return Metas{NewTensor(self->dtype, sizes, *self), NewTensor(v1::INT64, sizes, *self)};
}

// sort(self, dim, descending) and cummax(self, dim) -> (values, indices):
// self's sizes; the indices INT64.
absl::StatusOr<Metas> ValuesAndIndicesAlongDim(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  RETURN_IF_ERROR(DimArg(c, "dim", Rank(*self)).status());
  return Metas{NewTensor(self->dtype, self->sizes, *self),
               NewTensor(v1::INT64, self->sizes, *self)};
}

// topk(self, k, dim, largest, sorted) -> (values, indices): self's sizes
// with `dim` of size k, at most its size.
absl::StatusOr<Metas> Topk(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(int64_t dim, DimArg(c, "dim", Rank(*self)));
  ASSIGN_OR_RETURN(std::vector<ir::SymInt> k, c.SymInts("k"));
  if (k.size() != 1) return ArgError(c, "k", "should be one size");
  SymSizes sizes = self->sizes;
  if (k[0].is_constant() && k[0].constant() < 0) {
    return ArgError(c, "k", absl::StrCat("is ", k[0].constant(), ", below 0"));
  }
  if (!sizes.empty()) {
    if (k[0].is_constant() && sizes[dim].is_constant() && k[0].constant() > sizes[dim].constant()) {
      return ArgError(c, "k",
                      absl::StrCat("is ", k[0].constant(), ", more than dimension ", dim,
                                   " of 'self' ", SizesToString(self->sizes), " holds"));
    }
    sizes[dim] = k[0];
  }
  return Metas{NewTensor(self->dtype, sizes, *self), NewTensor(v1::INT64, sizes, *self)};
}

}  // namespace

void RegisterExtern(Definer& def) {
  def("aten.mm.default", kExpensive, Mm);
  def("aten.bmm.default", kExpensive, Bmm);
  def("aten._scaled_dot_product_efficient_attention.default", kExpensive, EfficientAttention);
  def("aten.scaled_dot_product_attention.default", kExpensive, ScaledDotProductAttention);
  def("aten._scaled_dot_product_efficient_attention_backward.default", kExpensive,
      EfficientAttentionBackward);
  def("aten._flash_attention_forward.default", kExpensive, FlashAttention);
  def("aten._flash_attention_backward.default", kExpensive, FlashAttentionBackward);
  def("aten.addmm.default", kExpensive, Addmm);
  // addmm with a ReLU or (tanh) GELU epilogue: cuBLASLt applies it as the
  // product is written (compiler/pipeline/addmm_activation.h makes it of a
  // tanh GELU).
  def("aten._addmm_activation.default", kExpensive, Addmm);
  def("aten.convolution.default", kExpensive, Convolution);
  def("aten.max_pool2d_with_indices.default", kExpensive, MaxPool(2));
  def("aten.avg_pool2d.default", kExpensive, AvgPool(2));
  def("aten.avg_pool3d.default", kExpensive, AvgPool(3));
  def("aten.max_pool3d_with_indices.default", kExpensive, MaxPool(3));
  def("aten._adaptive_avg_pool2d.default", kExpensive, AdaptiveAvgPool(2));
  def("aten._adaptive_avg_pool3d.default", kExpensive, AdaptiveAvgPool(3));
  def("aten.adaptive_max_pool2d.default", kExpensive, AdaptiveMaxPool2d);
  def("aten.embedding.default", kExpensive, Embedding, {"indices"});
  def("aten.index.Tensor", kExpensive, Index, {"indices"});
  def("aten.gather.default", kExpensive, Gather, {"index"});
  def("aten.scatter_add.default", kExpensive, ScatterAdd, {"index"});
  def("aten.scatter_reduce.two", kExpensive, ScatterAdd, {"index"});
  def("aten.scatter.src", kExpensive, ScatterAdd, {"index"});
  def("aten.scatter.value", kExpensive, ScatterAdd, {"index"});
  def("aten.slice_scatter.default", kExpensive, SliceScatter);
  def("aten.index_put.default", kExpensive, IndexPut, {"indices"});
  def("aten.index_select.default", kExpensive, IndexSelect, {"index"});
  def("aten.index_add.default", kExpensive, IndexAdd, {"index"});
  def("aten.flip.default", kExpensive, Flip);
  def("aten.cumsum.default", kExpensive, Cumsum);
  // Elementwise math that runs through ATen (no generated form): the
  // transcendental ones give floats, fmod and remainder the promoted dtype.
  const Elementwise to_float{{"self"}, {}, Out::kIntToFloat};
  for (const char* op :
       {"sinh",    "cosh",  "tan",           "atan",          "asin", "acos",      "asinh",
        "acosh",   "atanh", "log2",          "log10",         "exp2", "erfinv",    "lgamma",
        "digamma", "erfc",  "special_erfcx", "special_ndtri", "i0",   "special_i1"}) {
    def(absl::StrCat("aten.", op, ".default"), kExpensive, to_float);
  }
  def("aten.polygamma.default", kExpensive, to_float);
  for (const char* op : {"atan2", "hypot"}) {
    def(absl::StrCat("aten.", op, ".default"), kExpensive,
        Elementwise{{"self", "other"}, {}, Out::kIntToFloat});
  }
  for (const char* op : {"fmod", "remainder"}) {
    def(absl::StrCat("aten.", op, ".Tensor"), kExpensive, Elementwise{{"self", "other"}, {}});
    def(absl::StrCat("aten.", op, ".Scalar"), kExpensive, Elementwise{{"self"}, {"self", "other"}});
  }
  def("aten.cummax.default", kExpensive, ValuesAndIndicesAlongDim);
  def("aten.median.dim", kExpensive, SelectAlongDim);
  def("aten.kthvalue.default", kExpensive, SelectAlongDim);
  def("aten.sort.default", kExpensive, ValuesAndIndicesAlongDim);
  def("aten.topk.default", kExpensive, Topk);
}

}  // namespace kiln::ops::shape_rules_internal
