// The op registry's entries: traits and shape/dtype rules of every core-ATen
// op kiln knows (derivative rules are attached later, in derivatives.cc).
//
// A shape rule gives each output's dtype, sizes, strides, storage offset and
// device from the node's arguments, as PyTorch's meta functions would:
//   - broadcasting and type promotion (shape_util.h) for elementwise ops;
//   - new tensors get contiguous strides, except elementwise results shaped
//     like their first operand and preserve_format copies, which keep a
//     dense operand's layout (as TensorIterator and empty_like do);
//   - views get the view's real strides and storage offset;
//   - the device is the first tensor argument's (creation ops: the `device`
//     argument, cpu when absent); requires_grad is false throughout.
// Errors are INVALID_ARGUMENT, prefixed with OpCall::Where() and naming the
// argument at fault.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "compiler/ir/limits.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_util.h"

namespace kiln::ops {
namespace {

using ir::SymInt;
using ir::TensorMeta;
using Metas = std::vector<TensorMeta>;

// ---------------------------------------------------------------------------
// Errors and argument access.

absl::Status ArgError(const OpCall& c, absl::string_view name, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(c.Where(), ": argument '", name, "' ", what));
}

// A helper's error, prefixed with the node and what it was computing:
// "node 'add' (aten.add.Tensor): arguments 'self' and 'other': shapes ...".
absl::Status Prefixed(const OpCall& c, absl::string_view subject, const absl::Status& s) {
  return absl::InvalidArgumentError(absl::StrCat(c.Where(), ": ", subject, ": ", s.message()));
}

template <typename T>
absl::StatusOr<T> At(const OpCall& c, absl::string_view subject, absl::StatusOr<T> v) {
  if (!v.ok()) return Prefixed(c, subject, v.status());
  return v;
}

std::string ArgSubject(absl::string_view name) { return absl::StrCat("argument '", name, "'"); }

// The metadata of an optional tensor argument; nullptr for None.
absl::StatusOr<const TensorMeta*> OptMeta(const OpCall& c, const std::string& name) {
  if (c.IsNone(name)) return nullptr;
  return c.Meta(name);
}

// An int or SymInt argument.
absl::StatusOr<SymInt> SymIntArg(const OpCall& c, const std::string& name) {
  const ir::Argument* a = c.Find(name);
  if (a != nullptr) {
    if (const auto* v = std::get_if<int64_t>(&a->kind)) return SymInt{*v};
    if (const auto* v = std::get_if<SymInt>(&a->kind)) return *v;
    if (const auto* v = std::get_if<bool>(&a->kind)) return SymInt{int64_t{*v ? 1 : 0}};
  }
  return ArgError(c, name, "should be an int");
}

absl::StatusOr<std::optional<SymInt>> OptSymIntArg(const OpCall& c, const std::string& name) {
  if (c.IsNone(name)) return std::optional<SymInt>();
  ASSIGN_OR_RETURN(SymInt v, SymIntArg(c, name));
  return std::optional<SymInt>(std::move(v));
}

absl::StatusOr<std::vector<bool>> BoolsArg(const OpCall& c, const std::string& name) {
  const ir::Argument* a = c.Find(name);
  if (a != nullptr) {
    if (const auto* v = std::get_if<std::vector<bool>>(&a->kind)) return *v;
    if (const auto* v = std::get_if<bool>(&a->kind)) return std::vector<bool>(3, *v);
    if (const auto* v = std::get_if<std::vector<int64_t>>(&a->kind); v != nullptr && v->empty()) {
      return std::vector<bool>();
    }
  }
  return ArgError(c, name, "should be a bool list");
}

absl::StatusOr<int64_t> DimArg(const OpCall& c, const std::string& name, int64_t rank) {
  ASSIGN_OR_RETURN(int64_t d, c.Int(name));
  return At(c, ArgSubject(name), WrapDim(d, rank));
}

int64_t Rank(const TensorMeta& m) { return static_cast<int64_t>(m.sizes.size()); }

SymSizes StridesOf(const TensorMeta& m) {
  return m.strides.size() == m.sizes.size() ? m.strides : ContiguousStrides(m.sizes);
}

absl::Status ExpectRank(const OpCall& c, const std::string& name, const TensorMeta& m,
                        std::initializer_list<int64_t> ranks) {
  if (std::find(ranks.begin(), ranks.end(), Rank(m)) != ranks.end()) return absl::OkStatus();
  std::vector<std::string> want;
  for (int64_t r : ranks) want.push_back(absl::StrCat(r, "-D"));
  return ArgError(c, name,
                  absl::StrCat("should be a ", absl::StrJoin(want, " or "), " tensor, got sizes ",
                               SizesToString(m.sizes)));
}

// Two sizes that must agree: an error when both are constants that differ.
// "argument 'mat2' has size[0] 7, but 'self' has size[1] 8".
absl::Status ExpectSameSize(const OpCall& c, const std::string& a_name, const TensorMeta& a,
                            int64_t a_dim, const std::string& b_name, const TensorMeta& b,
                            int64_t b_dim) {
  const SymInt& x = a.sizes[a_dim];
  const SymInt& y = b.sizes[b_dim];
  if (x.is_constant() && y.is_constant() && x.constant() != y.constant()) {
    return ArgError(c, a_name,
                    absl::StrCat("has size[", a_dim, "] ", x.ToString(), ", but '", b_name,
                                 "' has size[", b_dim, "] ", y.ToString()));
  }
  return absl::OkStatus();
}

absl::Status ExpectSameDType(const OpCall& c, const std::string& a_name, const TensorMeta& a,
                             const std::string& b_name, const TensorMeta& b) {
  if (a.dtype == b.dtype) return absl::OkStatus();
  return ArgError(c, a_name,
                  absl::StrCat("has dtype ", v1::DType_Name(a.dtype), ", but '", b_name,
                               "' has dtype ", v1::DType_Name(b.dtype)));
}

// Sizes that must agree where both are constants.
bool SizesCompatible(absl::Span<const SymInt> a, absl::Span<const SymInt> b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].is_constant() && b[i].is_constant() && a[i].constant() != b[i].constant()) {
      return false;
    }
  }
  return true;
}

// ---------------------------------------------------------------------------
// Output metadata.

void SetDevice(TensorMeta* m, const TensorMeta& like) {
  m->device_type = like.device_type;
  m->device_index = like.device_index;
}

// A new tensor with contiguous strides on `like`'s device.
TensorMeta NewTensor(v1::DType dtype, SymSizes sizes, const TensorMeta& like) {
  TensorMeta m;
  m.dtype = dtype;
  m.strides = ContiguousStrides(sizes);
  m.sizes = std::move(sizes);
  SetDevice(&m, like);
  return m;
}

TensorMeta NewTensorOn(v1::DType dtype, SymSizes sizes, const ir::Device& device) {
  TensorMeta m;
  m.dtype = dtype;
  m.strides = ContiguousStrides(sizes);
  m.sizes = std::move(sizes);
  m.device_type = device.type;
  m.device_index = device.index;
  return m;
}

// A copy of `like` (its sizes, layout when dense, device) with `dtype`.
TensorMeta CopyOf(const TensorMeta& like, v1::DType dtype) {
  TensorMeta m = NewTensor(dtype, like.sizes, like);
  m.strides = PreservedStrides(like);
  return m;
}

// The result of an elementwise op: `first`'s layout when it has the result's
// sizes and is dense, contiguous otherwise.
TensorMeta ElementwiseOut(v1::DType dtype, SymSizes sizes, const TensorMeta& first) {
  if (sizes == first.sizes) return CopyOf(first, dtype);
  return NewTensor(dtype, std::move(sizes), first);
}

// A view of `base`.
TensorMeta ViewOf(const TensorMeta& base, SymSizes sizes, SymSizes strides, SymInt offset) {
  TensorMeta m;
  m.dtype = base.dtype;
  m.sizes = std::move(sizes);
  m.strides = std::move(strides);
  m.storage_offset = std::move(offset);
  SetDevice(&m, base);
  return m;
}

// Strides for a memory_format argument (None and preserve_format follow
// `like`).
absl::StatusOr<SymSizes> StridesFor(const OpCall& c, const TensorMeta& like) {
  const ir::Argument* a = c.Find("memory_format");
  if (a == nullptr || std::holds_alternative<ir::None>(a->kind)) return PreservedStrides(like);
  const auto* f = std::get_if<v1::MemoryFormat>(&a->kind);
  if (f == nullptr) return ArgError(c, "memory_format", "should be a memory format");
  switch (*f) {
    case v1::PRESERVE_FORMAT:
    case v1::MEMORY_FORMAT_UNSPECIFIED:
      return PreservedStrides(like);
    case v1::CHANNELS_LAST:
      if (Rank(like) == 4) {
        const auto& s = like.sizes;  // N, C, H, W -> strides C*H*W... in NHWC order
        const SymInt w_c = SymMul(s[3], s[1]);
        return SymSizes{SymMul(s[2], w_c), SymInt{int64_t{1}}, w_c, s[1]};
      }
      return ArgError(c, "memory_format", "channels_last needs a 4-D tensor");
    case v1::CHANNELS_LAST_3D:
      if (Rank(like) == 5) {
        const auto& s = like.sizes;  // N, C, D, H, W
        const SymInt w_c = SymMul(s[4], s[1]);
        const SymInt h_w_c = SymMul(s[3], w_c);
        return SymSizes{SymMul(s[2], h_w_c), SymInt{int64_t{1}}, h_w_c, w_c, s[1]};
      }
      return ArgError(c, "memory_format", "channels_last_3d needs a 5-D tensor");
    default:
      return ContiguousStrides(like.sizes);
  }
}

// The `device` argument, or `fallback` when it is absent or None.
absl::StatusOr<ir::Device> DeviceArg(const OpCall& c, ir::Device fallback) {
  const ir::Argument* a = c.Find("device");
  if (a == nullptr || std::holds_alternative<ir::None>(a->kind)) return fallback;
  if (const auto* d = std::get_if<ir::Device>(&a->kind)) return *d;
  if (const auto* s = std::get_if<std::string>(&a->kind)) return ir::Device{*s, -1};
  return ArgError(c, "device", "should be a device");
}

ir::Device DeviceOf(const TensorMeta& m) { return ir::Device{m.device_type, m.device_index}; }
ir::Device Cpu() { return ir::Device{"cpu", -1}; }

// The `dtype` argument, or `fallback`.
absl::StatusOr<v1::DType> DTypeArg(const OpCall& c, v1::DType fallback) {
  ASSIGN_OR_RETURN(std::optional<v1::DType> d, c.DType("dtype"));
  return d.value_or(fallback);
}

// The dtype of the statistics (mean, rstd) of normalizations: float32 for
// half-precision inputs, except on cpu where PyTorch keeps the input dtype.
v1::DType StatsDType(const TensorMeta& input) {
  return input.device_type == "cpu" ? input.dtype : ComputationDType(input.dtype);
}

// ---------------------------------------------------------------------------
// Elementwise ops.

enum class Out {
  kPromoted,    // torch.result_type of the promoted operands
  kIntToFloat,  // the same, ints and bools to the default float
  kRealOf,      // the same, complex to real (abs)
  kBool,        // comparisons and logical ops
  kFirst,       // the first tensor's dtype
};

struct Elementwise {
  std::vector<std::string> tensors;   // broadcast together; the first gives the device
  std::vector<std::string> promoted;  // tensor or Scalar parameters; empty: `tensors`
  Out out = Out::kPromoted;

  absl::StatusOr<Metas> operator()(const OpCall& c) const {
    std::vector<const TensorMeta*> metas;
    SymSizes sizes;
    std::vector<std::string> seen;
    for (const std::string& name : tensors) {
      ASSIGN_OR_RETURN(const TensorMeta* m, OptMeta(c, name));
      if (m == nullptr) continue;
      if (!metas.empty()) {
        auto b = BroadcastSizes(sizes, m->sizes);
        if (!b.ok()) {
          std::vector<std::string> quoted;
          for (const std::string& s : seen) quoted.push_back(absl::StrCat("'", s, "'"));
          return Prefixed(
              c, absl::StrCat("arguments ", absl::StrJoin(quoted, ", "), " and '", name, "'"),
              b.status());
        }
        sizes = *std::move(b);
      } else {
        sizes = m->sizes;
      }
      metas.push_back(m);
      seen.push_back(name);
    }
    if (metas.empty()) return ArgError(c, tensors.front(), "should be a tensor");
    v1::DType dtype = metas.front()->dtype;
    if (out != Out::kFirst) {
      std::vector<PromotionOperand> ops;
      for (const std::string& name : promoted.empty() ? tensors : promoted) {
        const ir::Argument* a = c.Find(name);
        if (a == nullptr || std::holds_alternative<ir::None>(a->kind)) continue;
        if (const auto* v = std::get_if<ir::ValueId>(&a->kind)) {
          ops.push_back(PromotionOperand::Tensor(c.MetaOf(*v)));
        } else {
          ops.push_back(PromotionOperand::Scalar(*a));
        }
      }
      dtype = ResultType(ops);
    }
    switch (out) {
      case Out::kIntToFloat:
        dtype = IntToFloat(dtype);
        break;
      case Out::kRealOf:
        dtype = ToReal(dtype);
        break;
      case Out::kBool:
        dtype = v1::BOOL;
        break;
      default:
        break;
    }
    return Metas{ElementwiseOut(dtype, std::move(sizes), *metas.front())};
  }
};

// div with a rounding mode: true division (None) promotes ints to float,
// "trunc" and "floor" keep the promoted dtype.
absl::StatusOr<Metas> DivMode(const OpCall& c) {
  const bool true_div = c.IsNone("rounding_mode");
  return Elementwise{
      {"self", "other"}, {"self", "other"}, true_div ? Out::kIntToFloat : Out::kPromoted}(c);
}

// The result keeps `self`'s sizes, dtype and layout; `other` must broadcast
// to it (copy's src).
absl::StatusOr<Metas> SelfShaped(const OpCall& c, const std::string& other) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(const TensorMeta* o, c.Meta(other));
  ASSIGN_OR_RETURN(SymSizes b, At(c, absl::StrCat("arguments 'self' and '", other, "'"),
                                  BroadcastSizes(self->sizes, o->sizes)));
  if (!SizesCompatible(b, self->sizes)) {
    return ArgError(
        c, other,
        absl::StrCat("has sizes ", SizesToString(o->sizes), ", which do not broadcast to 'self' ",
                     SizesToString(self->sizes)));
  }
  return Metas{CopyOf(*self, self->dtype)};
}

absl::StatusOr<Metas> MaskedFill(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(const TensorMeta* mask, c.Meta("mask"));
  if (mask->dtype != v1::BOOL) {
    return ArgError(c, "mask",
                    absl::StrCat("should have dtype BOOL, got ", v1::DType_Name(mask->dtype)));
  }
  ASSIGN_OR_RETURN(SymSizes b,
                   At(c, "arguments 'self' and 'mask'", BroadcastSizes(self->sizes, mask->sizes)));
  return Metas{ElementwiseOut(self->dtype, std::move(b), *self)};
}

// _to_copy and zeros_like, ones_like, empty_like, full_like: self's sizes,
// with the dtype, device and memory format the arguments ask for.
absl::StatusOr<Metas> LikeSelf(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(v1::DType dtype, DTypeArg(c, self->dtype));
  ASSIGN_OR_RETURN(ir::Device device, DeviceArg(c, DeviceOf(*self)));
  ASSIGN_OR_RETURN(SymSizes strides, StridesFor(c, *self));
  TensorMeta m = NewTensorOn(dtype, self->sizes, device);
  m.strides = std::move(strides);
  return Metas{std::move(m)};
}

absl::StatusOr<Metas> Clone(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  TensorMeta m = CopyOf(*self, self->dtype);
  if (c.Find("memory_format") != nullptr) {
    ASSIGN_OR_RETURN(m.strides, StridesFor(c, *self));
  }
  return Metas{std::move(m)};
}

// ---------------------------------------------------------------------------
// Reductions.

// The `dim` argument of a reduction: None (or absent) and [] reduce all.
absl::StatusOr<std::vector<int64_t>> ReductionDims(const OpCall& c) {
  if (c.IsNone("dim")) return std::vector<int64_t>();
  return c.Ints("dim");
}

absl::StatusOr<SymSizes> Reduced(const OpCall& c, const TensorMeta& self,
                                 const std::vector<int64_t>& dims, bool keepdim) {
  return At(c, "argument 'dim'", ReducedSizes(self.sizes, dims, keepdim));
}

enum class Acc {
  kSame,        // amax, mean
  kIntToInt64,  // sum, prod: ints and bools accumulate in int64
  kReal,        // var: complex to real
};

v1::DType AccDType(Acc acc, v1::DType t) {
  switch (acc) {
    case Acc::kIntToInt64:
      return IsIntegral(t, true) ? v1::INT64 : t;
    case Acc::kReal:
      return ToReal(t);
    default:
      return t;
  }
}

// sum.dim_IntList, mean.dim, amax, amin, var.correction: `dim` (a list),
// `keepdim`, and `dtype` when the schema has it.
ShapeRule ReduceDims(Acc acc) {
  return [acc](const OpCall& c) -> absl::StatusOr<Metas> {
    ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
    ASSIGN_OR_RETURN(std::vector<int64_t> dims, ReductionDims(c));
    ASSIGN_OR_RETURN(bool keepdim, c.Bool("keepdim"));
    ASSIGN_OR_RETURN(SymSizes sizes, Reduced(c, *self, dims, keepdim));
    ASSIGN_OR_RETURN(v1::DType dtype, DTypeArg(c, AccDType(acc, self->dtype)));
    return Metas{NewTensor(dtype, std::move(sizes), *self)};
  };
}

// sum.default, mean.default: every dimension.
ShapeRule ReduceAll(Acc acc) {
  return [acc](const OpCall& c) -> absl::StatusOr<Metas> {
    ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
    ASSIGN_OR_RETURN(v1::DType dtype, DTypeArg(c, AccDType(acc, self->dtype)));
    return Metas{NewTensor(dtype, {}, *self)};
  };
}

absl::StatusOr<Metas> VarMean(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(std::vector<int64_t> dims, ReductionDims(c));
  ASSIGN_OR_RETURN(bool keepdim, c.Bool("keepdim"));
  ASSIGN_OR_RETURN(SymSizes sizes, Reduced(c, *self, dims, keepdim));
  return Metas{NewTensor(ToReal(self->dtype), sizes, *self), NewTensor(self->dtype, sizes, *self)};
}

absl::StatusOr<Metas> Argmax(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(bool keepdim, c.Bool("keepdim"));
  std::vector<int64_t> dims;
  if (!c.IsNone("dim")) {
    ASSIGN_OR_RETURN(int64_t d, c.Int("dim"));
    dims.push_back(d);
  }
  ASSIGN_OR_RETURN(SymSizes sizes, Reduced(c, *self, dims, keepdim));
  return Metas{NewTensor(v1::INT64, std::move(sizes), *self)};
}

// prod.dim_int, max.dim: one int dim.
ShapeRule ReduceOneDim(Acc acc, bool with_indices) {
  return [acc, with_indices](const OpCall& c) -> absl::StatusOr<Metas> {
    ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
    ASSIGN_OR_RETURN(int64_t dim, c.Int("dim"));
    ASSIGN_OR_RETURN(bool keepdim, c.Bool("keepdim"));
    ASSIGN_OR_RETURN(SymSizes sizes, Reduced(c, *self, {dim}, keepdim));
    ASSIGN_OR_RETURN(v1::DType dtype, DTypeArg(c, AccDType(acc, self->dtype)));
    Metas out{NewTensor(dtype, sizes, *self)};
    if (with_indices) out.push_back(NewTensor(v1::INT64, sizes, *self));
    return out;
  };
}

absl::StatusOr<Metas> Softmax(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  RETURN_IF_ERROR(DimArg(c, "dim", Rank(*self)).status());
  ASSIGN_OR_RETURN(bool half_to_float, c.Bool("half_to_float"));
  v1::DType dtype = self->dtype;
  if (half_to_float) {
    if (dtype != v1::FLOAT16 && dtype != v1::BFLOAT16) {
      return ArgError(c, "half_to_float",
                      absl::StrCat("is true, but 'self' has dtype ", v1::DType_Name(dtype)));
    }
    dtype = v1::FLOAT32;
  }
  return Metas{NewTensor(dtype, self->sizes, *self)};
}

absl::StatusOr<Metas> SoftmaxBackward(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* grad, c.Meta("grad_output"));
  ASSIGN_OR_RETURN(const TensorMeta* output, c.Meta("output"));
  if (!SizesCompatible(grad->sizes, output->sizes)) {
    return ArgError(c, "output",
                    absl::StrCat("has sizes ", SizesToString(output->sizes),
                                 ", but 'grad_output' has ", SizesToString(grad->sizes)));
  }
  RETURN_IF_ERROR(DimArg(c, "dim", Rank(*grad)).status());
  ASSIGN_OR_RETURN(std::optional<v1::DType> dtype, c.DType("input_dtype"));
  return Metas{NewTensor(dtype.value_or(grad->dtype), grad->sizes, *grad)};
}

// ---------------------------------------------------------------------------
// Normalization, dropout, losses.

absl::StatusOr<Metas> LayerNorm(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* input, c.Meta("input"));
  ASSIGN_OR_RETURN(SymSizes normalized, c.SymInts("normalized_shape"));
  const int64_t k = static_cast<int64_t>(normalized.size());
  const int64_t axis = Rank(*input) - k;
  if (axis < 0 || !SizesCompatible(absl::MakeSpan(input->sizes).subspan(axis), normalized)) {
    return ArgError(c, "normalized_shape",
                    absl::StrCat("is ", SizesToString(normalized), ", but 'input' has sizes ",
                                 SizesToString(input->sizes)));
  }
  for (const char* name : {"weight", "bias"}) {
    ASSIGN_OR_RETURN(const TensorMeta* m, OptMeta(c, name));
    if (m != nullptr && !SizesCompatible(m->sizes, normalized)) {
      return ArgError(c, name,
                      absl::StrCat("has sizes ", SizesToString(m->sizes),
                                   ", but 'normalized_shape' is ", SizesToString(normalized)));
    }
  }
  SymSizes stat_sizes(input->sizes.begin(), input->sizes.begin() + axis);
  stat_sizes.resize(input->sizes.size(), SymInt{int64_t{1}});
  const v1::DType stats = StatsDType(*input);
  return Metas{NewTensor(input->dtype, input->sizes, *input), NewTensor(stats, stat_sizes, *input),
               NewTensor(stats, stat_sizes, *input)};
}

absl::StatusOr<Metas> LayerNormBackward(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* grad, c.Meta("grad_out"));
  ASSIGN_OR_RETURN(const TensorMeta* input, c.Meta("input"));
  ASSIGN_OR_RETURN(SymSizes normalized, c.SymInts("normalized_shape"));
  if (!SizesCompatible(grad->sizes, input->sizes)) {
    return ArgError(c, "grad_out",
                    absl::StrCat("has sizes ", SizesToString(grad->sizes), ", but 'input' has ",
                                 SizesToString(input->sizes)));
  }
  RETURN_IF_ERROR(BoolsArg(c, "output_mask").status());
  Metas out{NewTensor(input->dtype, input->sizes, *input)};
  // Unrequested outputs still get the metadata they would have.
  for (const char* name : {"weight", "bias"}) {
    ASSIGN_OR_RETURN(const TensorMeta* m, OptMeta(c, name));
    out.push_back(m != nullptr ? NewTensor(m->dtype, m->sizes, *m)
                               : NewTensor(input->dtype, normalized, *input));
  }
  return out;
}

absl::StatusOr<SymInt> Channels(const OpCall& c, const TensorMeta& input) {
  if (Rank(input) < 2) {
    return ArgError(c, "input",
                    absl::StrCat("should have at least 2 dimensions (N, C, ...), got sizes ",
                                 SizesToString(input.sizes)));
  }
  return input.sizes[1];
}

absl::Status ExpectChannelVector(const OpCall& c, const std::string& name, const SymInt& channels) {
  ASSIGN_OR_RETURN(const TensorMeta* m, OptMeta(c, name));
  if (m != nullptr && !SizesCompatible(m->sizes, {channels})) {
    return ArgError(c, name,
                    absl::StrCat("has sizes ", SizesToString(m->sizes), ", but 'input' has ",
                                 channels.ToString(), " channels"));
  }
  return absl::OkStatus();
}

// native_batch_norm and its _native_batch_norm_legit variants. The saved
// statistics are [C] when training; in evaluation PyTorch's cpu kernel
// returns empty [0] tensors and the others the running statistics' sizes.
ShapeRule BatchNorm(bool has_training, bool training_default, bool functional) {
  return [=](const OpCall& c) -> absl::StatusOr<Metas> {
    ASSIGN_OR_RETURN(const TensorMeta* input, c.Meta("input"));
    ASSIGN_OR_RETURN(SymInt channels, Channels(c, *input));
    for (const char* name : {"weight", "bias", "running_mean", "running_var"}) {
      RETURN_IF_ERROR(ExpectChannelVector(c, name, channels));
    }
    bool training = training_default;
    if (has_training) {
      ASSIGN_OR_RETURN(training, c.Bool("training"));
    }
    const SymInt stat_size =
        training || input->device_type != "cpu" ? channels : SymInt{int64_t{0}};
    const v1::DType stats = StatsDType(*input);
    Metas out{NewTensor(input->dtype, input->sizes, *input), NewTensor(stats, {stat_size}, *input),
              NewTensor(stats, {stat_size}, *input)};
    if (functional) {
      // The new statistics are computed in the input's computation dtype
      // (float32 for float16 and bfloat16) and, when training, mixed with
      // the old ones by type promotion: float32 over bfloat16 buffers.
      const v1::DType compute = ComputationDType(input->dtype);
      for (const char* name : {"running_mean", "running_var"}) {
        ASSIGN_OR_RETURN(const TensorMeta* m, c.Meta(name));
        out.push_back(
            NewTensor(training ? PromoteTypes(compute, m->dtype) : compute, m->sizes, *m));
      }
    }
    return out;
  };
}

absl::StatusOr<Metas> BatchNormBackward(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* input, c.Meta("input"));
  ASSIGN_OR_RETURN(SymInt channels, Channels(c, *input));
  RETURN_IF_ERROR(BoolsArg(c, "output_mask").status());
  ASSIGN_OR_RETURN(const TensorMeta* weight, OptMeta(c, "weight"));
  const TensorMeta param = weight != nullptr ? NewTensor(weight->dtype, weight->sizes, *weight)
                                             : NewTensor(input->dtype, {channels}, *input);
  return Metas{NewTensor(input->dtype, input->sizes, *input), param, param};
}

absl::StatusOr<Metas> GroupNorm(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* input, c.Meta("input"));
  ASSIGN_OR_RETURN(SymInt n, SymIntArg(c, "N"));
  ASSIGN_OR_RETURN(int64_t group, c.Int("group"));
  const v1::DType stats = StatsDType(*input);
  return Metas{NewTensor(input->dtype, input->sizes, *input),
               NewTensor(stats, {n, SymInt{group}}, *input),
               NewTensor(stats, {n, SymInt{group}}, *input)};
}

absl::StatusOr<Metas> NllLossForward(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(const TensorMeta* target, c.Meta("target"));
  RETURN_IF_ERROR(ExpectRank(c, "self", *self, {1, 2}));
  if (Rank(*target) != Rank(*self) - 1) {
    return ArgError(c, "target",
                    absl::StrCat("has sizes ", SizesToString(target->sizes), ", but 'self' has ",
                                 SizesToString(self->sizes), " (expected one dimension fewer)"));
  }
  if (Rank(*self) == 2) RETURN_IF_ERROR(ExpectSameSize(c, "target", *target, 0, "self", *self, 0));
  if (IsFloating(target->dtype) || IsComplex(target->dtype)) {
    return ArgError(
        c, "target",
        absl::StrCat("should have an integer dtype, got ", v1::DType_Name(target->dtype)));
  }
  ASSIGN_OR_RETURN(int64_t reduction, c.Int("reduction"));
  if (reduction < 0 || reduction > 2) {
    return ArgError(c, "reduction",
                    absl::StrCat("is ", reduction, "; expected 0 (none), 1 (mean) or 2 (sum)"));
  }
  SymSizes sizes;
  if (reduction == 0 && Rank(*self) == 2) sizes.push_back(self->sizes[0]);
  return Metas{NewTensor(self->dtype, std::move(sizes), *self), NewTensor(self->dtype, {}, *self)};
}

absl::StatusOr<Metas> NativeDropout(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* input, c.Meta("input"));
  return Metas{CopyOf(*input, input->dtype), CopyOf(*input, v1::BOOL)};
}

// Backward ops whose result is shaped like one argument.
ShapeRule Like(std::string name) {
  return [name](const OpCall& c) -> absl::StatusOr<Metas> {
    ASSIGN_OR_RETURN(const TensorMeta* m, c.Meta(name));
    return Metas{NewTensor(m->dtype, m->sizes, *m)};
  };
}

// ---------------------------------------------------------------------------
// Views and shape manipulation.

absl::StatusOr<Metas> View(const OpCall& c, bool unsafe) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(SymSizes requested, c.SymInts("size"));
  ASSIGN_OR_RETURN(SymSizes sizes,
                   At(c, "argument 'size'", InferViewSizes(self->sizes, requested)));
  std::optional<SymSizes> strides = ViewStrides(self->sizes, StridesOf(*self), sizes);
  if (!strides.has_value()) {
    if (!unsafe) {
      return ArgError(
          c, "size",
          absl::StrCat(SizesToString(sizes), " is not a view of 'self' (sizes ",
                       SizesToString(self->sizes), ", strides ", SizesToString(StridesOf(*self)),
                       "): a dimension spans two non-contiguous subspaces; "
                       "reshape would copy"));
    }
    strides = ContiguousStrides(sizes);
  }
  return Metas{ViewOf(*self, std::move(sizes), *std::move(strides), self->storage_offset)};
}

absl::StatusOr<Metas> Permute(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(std::vector<int64_t> dims, c.Ints("dims"));
  const int64_t rank = Rank(*self);
  std::vector<bool> used(rank, false);
  auto not_a_permutation = [&] {
    return ArgError(c, "dims",
                    absl::StrCat("[", absl::StrJoin(dims, ", "), "] is not a permutation of the ",
                                 rank, " dimensions of 'self'"));
  };
  if (static_cast<int64_t>(dims.size()) != rank) return not_a_permutation();
  const SymSizes in_strides = StridesOf(*self);
  SymSizes sizes, strides;
  for (int64_t d : dims) {
    ASSIGN_OR_RETURN(int64_t w, At(c, "argument 'dims'", WrapDim(d, rank)));
    if (used[w]) return not_a_permutation();
    used[w] = true;
    sizes.push_back(self->sizes[w]);
    strides.push_back(in_strides[w]);
  }
  return Metas{ViewOf(*self, std::move(sizes), std::move(strides), self->storage_offset)};
}

absl::StatusOr<Metas> Expand(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(SymSizes target, c.SymInts("size"));
  const int64_t rank = Rank(*self);
  const int64_t n = static_cast<int64_t>(target.size());
  if (n < rank) {
    return ArgError(c, "size",
                    absl::StrCat(SizesToString(target), " has fewer dimensions than 'self' ",
                                 SizesToString(self->sizes)));
  }
  const SymSizes in_strides = StridesOf(*self);
  SymSizes sizes(n), strides(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = i - (n - rank);  // dimension of self, or negative for a new one
    const SymInt& t = target[i];
    if (j < 0) {
      if (IsConstant(t, -1)) {
        return ArgError(c, "size", absl::StrCat("has -1 at the new leading dimension ", i));
      }
      sizes[i] = t;
      strides[i] = SymInt{int64_t{0}};
      continue;
    }
    const SymInt& s = self->sizes[j];
    if (IsConstant(t, -1) || t == s) {
      sizes[i] = s;
      strides[i] = in_strides[j];
    } else if (IsConstant(s, 1)) {
      sizes[i] = t;
      strides[i] = SymInt{int64_t{0}};
    } else if (s.is_constant() && t.is_constant()) {
      return ArgError(
          c, "size",
          absl::StrCat(SizesToString(target), " expands 'self' ", SizesToString(self->sizes),
                       " at dimension ", i, ", whose size is ", s.ToString(), ", not 1"));
    } else {
      // A symbol the trace guarded equal to the other side.
      sizes[i] = t.is_constant() ? t : s;
      strides[i] = in_strides[j];
    }
  }
  return Metas{ViewOf(*self, std::move(sizes), std::move(strides), self->storage_offset)};
}

absl::StatusOr<Metas> SqueezeDims(const OpCall& c, const std::vector<int64_t>& dims) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  const int64_t rank = Rank(*self);
  std::vector<bool> drop(rank, false);
  for (int64_t d : dims) {
    ASSIGN_OR_RETURN(int64_t w, At(c, "argument 'dim'", WrapDim(d, rank)));
    if (rank > 0 && IsConstant(self->sizes[w], 1)) drop[w] = true;
  }
  const SymSizes in_strides = StridesOf(*self);
  SymSizes sizes, strides;
  for (int64_t i = 0; i < rank; ++i) {
    if (drop[i]) continue;
    sizes.push_back(self->sizes[i]);
    strides.push_back(in_strides[i]);
  }
  return Metas{ViewOf(*self, std::move(sizes), std::move(strides), self->storage_offset)};
}

absl::StatusOr<Metas> Unsqueeze(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  const int64_t rank = Rank(*self);
  ASSIGN_OR_RETURN(int64_t dim, DimArg(c, "dim", rank + 1));
  SymSizes sizes = self->sizes;
  SymSizes strides = StridesOf(*self);
  const SymInt stride = dim >= rank ? SymInt{int64_t{1}} : SymMul(sizes[dim], strides[dim]);
  sizes.insert(sizes.begin() + dim, SymInt{int64_t{1}});
  strides.insert(strides.begin() + dim, stride);
  return Metas{ViewOf(*self, std::move(sizes), std::move(strides), self->storage_offset)};
}

// A slice [start, end) by `step` of dimension `dim` of `self`; start and
// end follow Python (negative from the end, clamped to the size).
absl::StatusOr<TensorMeta> SliceOf(const OpCall& c, const TensorMeta& self, int64_t dim,
                                   std::optional<SymInt> start, std::optional<SymInt> end,
                                   int64_t step) {
  if (step <= 0) return ArgError(c, "step", absl::StrCat("is ", step, "; it must be positive"));
  const SymInt& size = self.sizes[dim];
  SymSizes sizes = self.sizes;
  SymSizes strides = StridesOf(self);
  constexpr int64_t kBig = std::numeric_limits<int64_t>::max() / 2;
  SymInt s = start.value_or(SymInt{int64_t{0}});
  SymInt e = end.value_or(SymInt{std::numeric_limits<int64_t>::max()});
  SymInt len;
  if (size.is_constant() && s.is_constant() && e.is_constant()) {
    const int64_t n = size.constant();
    int64_t a = s.constant(), b = e.constant();
    if (a < 0) a += n;
    if (b < 0) b += n;
    a = std::clamp<int64_t>(a, 0, n);
    b = std::clamp<int64_t>(b, a, n);
    s = SymInt{a};
    len = SymInt{(b - a + step - 1) / step};
  } else {
    if (s.is_constant() && s.constant() < 0) s = SymAdd(size, s);
    if (e.is_constant() && e.constant() >= kBig) {
      e = size;
    } else if (e.is_constant() && e.constant() < 0) {
      e = SymAdd(size, e);
    }
    len = SymFloorDiv(SymAdd(SymSub(e, s), SymInt{step - 1}), SymInt{step});
  }
  sizes[dim] = len;
  const SymInt offset = SymAdd(self.storage_offset, SymMul(s, strides[dim]));
  strides[dim] = SymMul(strides[dim], SymInt{step});
  return ViewOf(self, std::move(sizes), std::move(strides), offset);
}

absl::StatusOr<Metas> Slice(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  if (Rank(*self) == 0) return ArgError(c, "self", "cannot be sliced: it has no dimensions");
  ASSIGN_OR_RETURN(int64_t dim, DimArg(c, "dim", Rank(*self)));
  ASSIGN_OR_RETURN(std::optional<SymInt> start, OptSymIntArg(c, "start"));
  ASSIGN_OR_RETURN(std::optional<SymInt> end, OptSymIntArg(c, "end"));
  ASSIGN_OR_RETURN(int64_t step, c.Int("step"));
  ASSIGN_OR_RETURN(TensorMeta m, SliceOf(c, *self, dim, start, end, step));
  return Metas{std::move(m)};
}

absl::StatusOr<TensorMeta> SelectOf(const OpCall& c, const TensorMeta& self, int64_t dim,
                                    SymInt index) {
  const SymInt& size = self.sizes[dim];
  if (index.is_constant() && size.is_constant()) {
    const int64_t n = size.constant();
    int64_t i = index.constant();
    if (i < -n || i >= n) {
      return ArgError(c, "index",
                      absl::StrCat("is ", i, ", out of range for dimension ", dim, " of size ", n));
    }
    if (i < 0) i += n;
    index = SymInt{i};
  } else if (index.is_constant() && index.constant() < 0) {
    index = SymAdd(size, index);
  }
  SymSizes sizes = self.sizes;
  SymSizes strides = StridesOf(self);
  const SymInt offset = SymAdd(self.storage_offset, SymMul(index, strides[dim]));
  sizes.erase(sizes.begin() + dim);
  strides.erase(strides.begin() + dim);
  return ViewOf(self, std::move(sizes), std::move(strides), offset);
}

absl::StatusOr<Metas> Select(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  if (Rank(*self) == 0) return ArgError(c, "self", "cannot be indexed: it has no dimensions");
  ASSIGN_OR_RETURN(int64_t dim, DimArg(c, "dim", Rank(*self)));
  ASSIGN_OR_RETURN(SymInt index, SymIntArg(c, "index"));
  ASSIGN_OR_RETURN(TensorMeta m, SelectOf(c, *self, dim, index));
  return Metas{std::move(m)};
}

absl::StatusOr<Metas> SplitWithSizes(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  if (Rank(*self) == 0) return ArgError(c, "self", "cannot be split: it has no dimensions");
  ASSIGN_OR_RETURN(int64_t dim, DimArg(c, "dim", Rank(*self)));
  ASSIGN_OR_RETURN(SymSizes split_sizes, c.SymInts("split_sizes"));
  SymInt total{int64_t{0}};
  for (const SymInt& s : split_sizes) total = SymAdd(total, s);
  const SymInt& size = self->sizes[dim];
  if (total.is_constant() && size.is_constant() && total.constant() != size.constant()) {
    return ArgError(c, "split_sizes",
                    absl::StrCat(SizesToString(split_sizes), " sums to ", total.constant(),
                                 ", but dimension ", dim, " of 'self' has size ", size.constant()));
  }
  Metas out;
  SymInt start{int64_t{0}};
  for (const SymInt& s : split_sizes) {
    ASSIGN_OR_RETURN(TensorMeta m, SliceOf(c, *self, dim, start, SymAdd(start, s), 1));
    m.sizes[dim] = s;  // exact even where the slice is symbolic
    out.push_back(std::move(m));
    start = SymAdd(start, s);
  }
  return out;
}

absl::StatusOr<Metas> Split(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  if (Rank(*self) == 0) return ArgError(c, "self", "cannot be split: it has no dimensions");
  ASSIGN_OR_RETURN(int64_t dim, DimArg(c, "dim", Rank(*self)));
  ASSIGN_OR_RETURN(SymInt split_size, SymIntArg(c, "split_size"));
  const SymInt& size = self->sizes[dim];
  if (!split_size.is_constant() || !size.is_constant()) {
    if (split_size == size) {
      ASSIGN_OR_RETURN(TensorMeta m, SliceOf(c, *self, dim, std::nullopt, std::nullopt, 1));
      return Metas{std::move(m)};
    }
    return ArgError(
        c, "split_size",
        absl::StrCat("is ", split_size.ToString(), " and dimension ", dim, " of 'self' has size ",
                     size.ToString(), ": the number of outputs is not a constant"));
  }
  const int64_t n = size.constant(), k = split_size.constant();
  if (k < 0 || (k == 0 && n > 0)) {
    return ArgError(c, "split_size", absl::StrCat("is ", k, "; it must be positive"));
  }
  const int64_t chunks = k == 0 ? 1 : std::max<int64_t>(n / k + (n % k != 0), 1);
  if (chunks > ir::kMaxOutputsPerNode) {
    return ArgError(
        c, "split_size",
        absl::StrCat("is ", k, " over a dimension of size ", n, ": ", chunks,
                     " outputs, over the limit of ", ir::kMaxOutputsPerNode, " per node"));
  }
  Metas out;
  for (int64_t i = 0; i < chunks; ++i) {
    ASSIGN_OR_RETURN(TensorMeta m,
                     SliceOf(c, *self, dim, SymInt{i * k}, SymInt{std::min(n, (i + 1) * k)}, 1));
    out.push_back(std::move(m));
  }
  return out;
}

absl::StatusOr<Metas> Unbind(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  if (Rank(*self) == 0) return ArgError(c, "self", "cannot be unbound: it has no dimensions");
  ASSIGN_OR_RETURN(int64_t dim, DimArg(c, "dim", Rank(*self)));
  const SymInt& size = self->sizes[dim];
  if (!size.is_constant()) {
    return ArgError(c, "dim",
                    absl::StrCat("is a dimension of symbolic size ", size.ToString(),
                                 ": the number of outputs is not a constant"));
  }
  if (size.constant() > ir::kMaxOutputsPerNode) {
    return ArgError(c, "dim",
                    absl::StrCat("is a dimension of size ", size.constant(),
                                 ": as many outputs, "
                                 "over the limit of ",
                                 ir::kMaxOutputsPerNode, " per node"));
  }
  Metas out;
  for (int64_t i = 0; i < size.constant(); ++i) {
    ASSIGN_OR_RETURN(TensorMeta m, SelectOf(c, *self, dim, SymInt{i}));
    out.push_back(std::move(m));
  }
  return out;
}

absl::StatusOr<std::vector<const TensorMeta*>> TensorList(const OpCall& c) {
  ASSIGN_OR_RETURN(std::vector<ir::ValueId> ids, c.Tensors("tensors"));
  if (ids.empty()) return ArgError(c, "tensors", "is empty");
  std::vector<const TensorMeta*> metas;
  for (ir::ValueId v : ids) {
    if (v == ir::kNoValue) return ArgError(c, "tensors", "has a None element");
    metas.push_back(&c.MetaOf(v));
  }
  return metas;
}

v1::DType ListDType(const std::vector<const TensorMeta*>& metas) {
  std::vector<PromotionOperand> ops;
  for (const TensorMeta* m : metas) ops.push_back({m->dtype, PromotionOperand::Priority::kTensor});
  return ResultType(ops);
}

absl::StatusOr<Metas> Cat(const OpCall& c) {
  ASSIGN_OR_RETURN(std::vector<const TensorMeta*> all, TensorList(c));
  // PyTorch skips legacy empty 1-D tensors of size [0].
  std::vector<std::pair<size_t, const TensorMeta*>> parts;
  for (size_t i = 0; i < all.size(); ++i) {
    const TensorMeta* m = all[i];
    if (!(Rank(*m) == 1 && IsConstant(m->sizes[0], 0))) parts.emplace_back(i, m);
  }
  if (parts.empty()) return Metas{NewTensor(ListDType(all), all[0]->sizes, *all[0])};
  const TensorMeta& first = *parts[0].second;
  if (Rank(first) == 0) return ArgError(c, "tensors", "has a zero-dimensional element");
  ASSIGN_OR_RETURN(int64_t dim, DimArg(c, "dim", Rank(first)));
  SymSizes sizes = first.sizes;
  for (size_t p = 1; p < parts.size(); ++p) {
    const auto& [i, m] = parts[p];
    if (Rank(*m) != Rank(first)) {
      return ArgError(
          c, "tensors",
          absl::StrCat("element ", i, " has sizes ", SizesToString(m->sizes), ", but element ",
                       parts[0].first, " has ", SizesToString(first.sizes), " (ranks differ)"));
    }
    for (int64_t d = 0; d < Rank(first); ++d) {
      if (d == dim) continue;
      const SymInt& x = m->sizes[d];
      const SymInt& y = first.sizes[d];
      if (x.is_constant() && y.is_constant() && x.constant() != y.constant()) {
        return ArgError(
            c, "tensors",
            absl::StrCat("element ", i, " has size[", d, "] ", x.constant(), ", but element ",
                         parts[0].first, " has size[", d, "] ", y.constant()));
      }
    }
    sizes[dim] = SymAdd(sizes[dim], m->sizes[dim]);
  }
  return Metas{NewTensor(ListDType(all), std::move(sizes), first)};
}

absl::StatusOr<Metas> Stack(const OpCall& c) {
  ASSIGN_OR_RETURN(std::vector<const TensorMeta*> all, TensorList(c));
  const TensorMeta& first = *all[0];
  for (size_t i = 1; i < all.size(); ++i) {
    if (!SizesCompatible(all[i]->sizes, first.sizes)) {
      return ArgError(c, "tensors",
                      absl::StrCat("element ", i, " has sizes ", SizesToString(all[i]->sizes),
                                   ", but element 0 has ", SizesToString(first.sizes)));
    }
  }
  ASSIGN_OR_RETURN(int64_t dim, DimArg(c, "dim", Rank(first) + 1));
  SymSizes sizes = first.sizes;
  sizes.insert(sizes.begin() + dim, SymInt{static_cast<int64_t>(all.size())});
  return Metas{NewTensor(ListDType(all), std::move(sizes), first)};
}

absl::StatusOr<Metas> AsStrided(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(SymSizes sizes, c.SymInts("size"));
  ASSIGN_OR_RETURN(SymSizes strides, c.SymInts("stride"));
  if (sizes.size() != strides.size()) {
    return ArgError(
        c, "stride",
        absl::StrCat("has ", strides.size(), " entries, but 'size' has ", sizes.size()));
  }
  ASSIGN_OR_RETURN(std::optional<SymInt> offset, OptSymIntArg(c, "storage_offset"));
  return Metas{
      ViewOf(*self, std::move(sizes), std::move(strides), offset.value_or(self->storage_offset))};
}

absl::StatusOr<Metas> Transpose(const OpCall& c, int64_t dim0, int64_t dim1) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  SymSizes sizes = self->sizes;
  SymSizes strides = StridesOf(*self);
  if (!sizes.empty()) {
    ASSIGN_OR_RETURN(int64_t a, At(c, "argument 'dim0'", WrapDim(dim0, Rank(*self))));
    ASSIGN_OR_RETURN(int64_t b, At(c, "argument 'dim1'", WrapDim(dim1, Rank(*self))));
    std::swap(sizes[a], sizes[b]);
    std::swap(strides[a], strides[b]);
  }
  return Metas{ViewOf(*self, std::move(sizes), std::move(strides), self->storage_offset)};
}

absl::StatusOr<Metas> T(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  if (Rank(*self) > 2) {
    return ArgError(
        c, "self",
        absl::StrCat("should have at most 2 dimensions, got sizes ", SizesToString(self->sizes)));
  }
  return Transpose(c, 0, Rank(*self) == 2 ? 1 : 0);
}

absl::StatusOr<Metas> Alias(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  return Metas{ViewOf(*self, self->sizes, StridesOf(*self), self->storage_offset)};
}

absl::StatusOr<Metas> ConstantPadNd(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(SymSizes pad, c.SymInts("pad"));
  if (pad.size() % 2 != 0 || static_cast<int64_t>(pad.size()) / 2 > Rank(*self)) {
    return ArgError(c, "pad",
                    absl::StrCat(SizesToString(pad),
                                 " should hold one (before, after) pair per "
                                 "padded dimension, at most ",
                                 Rank(*self)));
  }
  SymSizes sizes = self->sizes;
  for (size_t i = 0; i < pad.size() / 2; ++i) {
    SymInt& s = sizes[sizes.size() - 1 - i];
    s = SymAdd(SymAdd(s, pad[2 * i]), pad[2 * i + 1]);
  }
  return Metas{NewTensor(self->dtype, std::move(sizes), *self)};
}

// ---------------------------------------------------------------------------
// Creation.

// The dtype torch.full infers from its fill value.
v1::DType ScalarDefaultDType(const ir::Argument* a) {
  if (a == nullptr) return kDefaultFloat;
  const PromotionOperand p = PromotionOperand::Scalar(*a);
  return p.dtype == v1::DTYPE_UNSPECIFIED ? kDefaultFloat : p.dtype;
}

// zeros, ones, full, empty.memory_format, empty_strided, scalar_tensor.
ShapeRule Factory(const char* size_param, const char* fill_param) {
  return [size_param, fill_param](const OpCall& c) -> absl::StatusOr<Metas> {
    SymSizes sizes;
    if (size_param != nullptr) {
      ASSIGN_OR_RETURN(sizes, c.SymInts(size_param));
      for (const SymInt& s : sizes) {
        if (s.is_constant() && s.constant() < 0) {
          return ArgError(c, size_param,
                          absl::StrCat(SizesToString(sizes), " has a negative size"));
        }
      }
    }
    const v1::DType fallback =
        fill_param != nullptr ? ScalarDefaultDType(c.Find(fill_param)) : kDefaultFloat;
    ASSIGN_OR_RETURN(v1::DType dtype, DTypeArg(c, fallback));
    ASSIGN_OR_RETURN(ir::Device device, DeviceArg(c, Cpu()));
    TensorMeta m = NewTensorOn(dtype, std::move(sizes), device);
    if (c.schema().FindParam("stride") >= 0) {
      ASSIGN_OR_RETURN(SymSizes strides, c.SymInts("stride"));
      if (strides.size() != m.sizes.size()) {
        return ArgError(
            c, "stride",
            absl::StrCat("has ", strides.size(), " entries, but 'size' has ", m.sizes.size()));
      }
      m.strides = std::move(strides);
    }
    return Metas{std::move(m)};
  };
}

absl::StatusOr<Metas> NewZeros(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(SymSizes sizes, c.SymInts("size"));
  ASSIGN_OR_RETURN(v1::DType dtype, DTypeArg(c, self->dtype));
  ASSIGN_OR_RETURN(ir::Device device, DeviceArg(c, DeviceOf(*self)));
  return Metas{NewTensorOn(dtype, std::move(sizes), device)};
}

absl::StatusOr<Metas> Arange(const OpCall& c) {
  const bool has_start = c.schema().FindParam("start") >= 0;
  struct Bound {
    const char* name;
    const ir::Argument* arg;
  };
  std::vector<Bound> bounds;
  if (has_start) bounds.push_back({"start", c.Find("start")});
  bounds.push_back({"end", c.Find("end")});
  if (has_start) bounds.push_back({"step", c.Find("step")});
  bool any_float = false, all_constant = true;
  for (const Bound& b : bounds) {
    if (b.arg == nullptr) return ArgError(c, b.name, "is missing");
    if (std::holds_alternative<double>(b.arg->kind)) any_float = true;
    if (std::holds_alternative<SymInt>(b.arg->kind) &&
        !std::get<SymInt>(b.arg->kind).is_constant()) {
      all_constant = false;
    }
  }
  ASSIGN_OR_RETURN(v1::DType dtype, DTypeArg(c, any_float ? kDefaultFloat : v1::INT64));
  ASSIGN_OR_RETURN(ir::Device device, DeviceArg(c, Cpu()));
  SymInt length;
  if (all_constant) {
    double start = 0, step = 1;
    if (has_start) {
      ASSIGN_OR_RETURN(start, c.Double("start"));
      ASSIGN_OR_RETURN(step, c.Double("step"));
    }
    const ir::Argument* e = c.Find("end");
    double end;
    if (const auto* s = std::get_if<SymInt>(&e->kind)) {
      end = static_cast<double>(s->constant());
    } else {
      ASSIGN_OR_RETURN(end, c.Double("end"));
    }
    if (step == 0) return ArgError(c, "step", "must be nonzero");
    if ((step > 0 && end < start) || (step < 0 && end > start)) {
      return ArgError(c, "end",
                      absl::StrCat("is ", end, ", on the wrong side of 'start' ", start,
                                   " for the step ", step));
    }
    length = SymInt{static_cast<int64_t>(std::ceil((end - start) / step))};
  } else {
    if (any_float) return ArgError(c, "end", "is symbolic while another bound is a float");
    SymInt start{int64_t{0}}, step{int64_t{1}};
    if (has_start) {
      ASSIGN_OR_RETURN(start, SymIntArg(c, "start"));
      ASSIGN_OR_RETURN(step, SymIntArg(c, "step"));
    }
    ASSIGN_OR_RETURN(SymInt end, SymIntArg(c, "end"));
    if (!step.is_constant() || step.constant() <= 0) {
      return ArgError(c, "step", "must be a positive constant when a bound is symbolic");
    }
    length = SymFloorDiv(SymAdd(SymSub(end, start), SymInt{step.constant() - 1}), step);
  }
  return Metas{NewTensorOn(dtype, {length}, device)};
}

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
  return Metas{NewTensor(input->dtype, std::move(sizes), *input)};
}

absl::StatusOr<Metas> ConvolutionBackward(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* grad, c.Meta("grad_output"));
  ASSIGN_OR_RETURN(const TensorMeta* input, c.Meta("input"));
  ASSIGN_OR_RETURN(const TensorMeta* weight, c.Meta("weight"));
  RETURN_IF_ERROR(BoolsArg(c, "output_mask").status());
  SymSizes bias_sizes;
  if (!c.IsNone("bias_sizes")) {
    ASSIGN_OR_RETURN(bias_sizes, c.SymInts("bias_sizes"));
  } else if (Rank(*grad) >= 2) {
    bias_sizes = {grad->sizes[1]};
  } else {
    return ArgError(
        c, "grad_output",
        absl::StrCat("should be [N, C_out, spatial...], got sizes ", SizesToString(grad->sizes)));
  }
  return Metas{NewTensor(input->dtype, input->sizes, *input),
               NewTensor(weight->dtype, weight->sizes, *weight),
               NewTensor(grad->dtype, std::move(bias_sizes), *grad)};
}

// max_pool2d_with_indices and avg_pool2d: [N, C, H, W] or [C, H, W].
absl::StatusOr<SymSizes> Pool2dSizes(const OpCall& c, const TensorMeta& self, bool has_dilation) {
  RETURN_IF_ERROR(ExpectRank(c, "self", self, {3, 4}));
  ASSIGN_OR_RETURN(std::vector<int64_t> kernel, c.Ints("kernel_size"));
  ASSIGN_OR_RETURN(std::vector<int64_t> stride, c.Ints("stride"));
  ASSIGN_OR_RETURN(std::vector<int64_t> padding, c.Ints("padding"));
  std::vector<int64_t> dilation = {1, 1};
  if (has_dilation) {
    ASSIGN_OR_RETURN(dilation, c.Ints("dilation"));
  }
  ASSIGN_OR_RETURN(bool ceil_mode, c.Bool("ceil_mode"));
  if (stride.empty()) stride = kernel;
  auto two = [&](std::vector<int64_t>& v, const char* name) -> absl::Status {
    if (v.size() == 1) v.push_back(v[0]);
    if (v.size() != 2) {
      return ArgError(c, name, absl::StrCat("should have 1 or 2 entries, got ", v.size()));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(two(kernel, "kernel_size"));
  RETURN_IF_ERROR(two(stride, "stride"));
  RETURN_IF_ERROR(two(padding, "padding"));
  RETURN_IF_ERROR(two(dilation, "dilation"));
  SymSizes sizes = self.sizes;
  const size_t h = sizes.size() - 2;
  for (size_t i = 0; i < 2; ++i) {
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

absl::StatusOr<Metas> MaxPool2d(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(SymSizes sizes, Pool2dSizes(c, *self, /*has_dilation=*/true));
  return Metas{NewTensor(self->dtype, sizes, *self), NewTensor(v1::INT64, sizes, *self)};
}

absl::StatusOr<Metas> AvgPool2d(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(SymSizes sizes, Pool2dSizes(c, *self, /*has_dilation=*/false));
  return Metas{NewTensor(self->dtype, std::move(sizes), *self)};
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

absl::StatusOr<Metas> EmbeddingDenseBackward(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* grad, c.Meta("grad_output"));
  ASSIGN_OR_RETURN(SymInt num_weights, SymIntArg(c, "num_weights"));
  if (Rank(*grad) == 0) {
    return ArgError(c, "grad_output", "should have the embedding dimension last, got a scalar");
  }
  return Metas{NewTensor(grad->dtype, {num_weights, grad->sizes.back()}, *grad)};
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

// ---------------------------------------------------------------------------
// Registration.

constexpr OpTraits Traits(bool OpTraits::*flag) {
  OpTraits t;
  if (flag != nullptr) t.*flag = true;
  return t;
}

constexpr OpTraits kNone = Traits(nullptr);
constexpr OpTraits kPointwise = Traits(&OpTraits::pointwise);
constexpr OpTraits kView = Traits(&OpTraits::view);
constexpr OpTraits kReduction = Traits(&OpTraits::reduction);
constexpr OpTraits kRandom = Traits(&OpTraits::random);
constexpr OpTraits kExpensive = Traits(&OpTraits::expensive);
constexpr OpTraits kCreation = Traits(&OpTraits::creation);

class Definer {
 public:
  explicit Definer(Registry* r) : r_(r) {}

  void operator()(std::string target, OpTraits traits, ShapeRule shape,
                  std::vector<std::string> nondifferentiable = {}) {
    OpDef def;
    def.target = std::move(target);
    def.traits = traits;
    def.shape = std::move(shape);
    def.nondifferentiable = std::move(nondifferentiable);
    r_->Add(std::move(def));
  }

 private:
  Registry* r_;
};

void RegisterPointwise(Definer& def) {
  const Elementwise same{{"self"}, {}, Out::kFirst};
  const Elementwise to_float{{"self"}, {}, Out::kIntToFloat};
  for (const char* op : {"neg", "sign", "relu", "floor", "ceil", "bitwise_not", "gelu", "silu"}) {
    def(absl::StrCat("aten.", op, ".default"), kPointwise, same);
  }
  def("aten.abs.default", kPointwise, Elementwise{{"self"}, {}, Out::kRealOf});
  for (const char* op : {"exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "reciprocal", "sin",
                         "cos", "tanh", "sigmoid", "erf"}) {
    def(absl::StrCat("aten.", op, ".default"), kPointwise, to_float);
  }
  def("aten.logical_not.default", kPointwise, Elementwise{{"self"}, {}, Out::kBool});
  def("aten.isnan.default", kPointwise, Elementwise{{"self"}, {}, Out::kBool});
  def("aten.leaky_relu.default", kPointwise, same);
  def("aten.hardtanh.default", kPointwise, same);
  def("aten.clamp.default", kPointwise, Elementwise{{"self"}, {"self", "min", "max"}});

  const Elementwise binary{{"self", "other"}, {}};
  const Elementwise with_scalar{{"self"}, {"self", "other"}};
  for (const char* op : {"add", "sub", "rsub", "mul"}) {
    def(absl::StrCat("aten.", op, ".Tensor"), kPointwise, binary);
    def(absl::StrCat("aten.", op, ".Scalar"), kPointwise, with_scalar);
  }
  def("aten.maximum.default", kPointwise, binary);
  def("aten.minimum.default", kPointwise, binary);
  def("aten.div.Tensor", kPointwise, Elementwise{{"self", "other"}, {}, Out::kIntToFloat});
  def("aten.div.Scalar", kPointwise, Elementwise{{"self"}, {"self", "other"}, Out::kIntToFloat});
  def("aten.div.Tensor_mode", kPointwise, DivMode);
  def("aten.div.Scalar_mode", kPointwise, [](const OpCall& c) -> absl::StatusOr<Metas> {
    return Elementwise{{"self"},
                       {"self", "other"},
                       c.IsNone("rounding_mode") ? Out::kIntToFloat : Out::kPromoted}(c);
  });
  def("aten.pow.Tensor_Tensor", kPointwise, Elementwise{{"self", "exponent"}, {}});
  def("aten.pow.Tensor_Scalar", kPointwise, Elementwise{{"self"}, {"self", "exponent"}});
  def("aten.pow.Scalar", kPointwise, Elementwise{{"exponent"}, {"self", "exponent"}});
  for (const char* op : {"eq", "ne", "lt", "le", "gt", "ge"}) {
    def(absl::StrCat("aten.", op, ".Tensor"), kPointwise,
        Elementwise{{"self", "other"}, {}, Out::kBool});
    def(absl::StrCat("aten.", op, ".Scalar"), kPointwise, Elementwise{{"self"}, {}, Out::kBool});
  }
  for (const char* op : {"logical_and", "logical_or", "logical_xor"}) {
    def(absl::StrCat("aten.", op, ".default"), kPointwise,
        Elementwise{{"self", "other"}, {}, Out::kBool});
  }
  def("aten.where.self", kPointwise, Elementwise{{"condition", "self", "other"}, {"self", "other"}},
      {"condition"});
  def("aten.masked_fill.Scalar", kPointwise, MaskedFill, {"mask"});

  def("aten._to_copy.default", kPointwise, LikeSelf);
  def("aten.clone.default", kPointwise, Clone);
  def("aten.lift_fresh_copy.default", kPointwise, Clone);
  def("aten.copy.default", kPointwise, [](const OpCall& c) { return SelfShaped(c, "src"); });
  def("aten.fill.Scalar", kPointwise, Elementwise{{"self"}, {}, Out::kFirst});
  def("aten.detach.default", kView, Alias);
  def("aten.alias.default", kView, Alias);

  def("aten.native_dropout.default", kRandom, NativeDropout);
  def("aten.bernoulli.p", kRandom, Elementwise{{"self"}, {}, Out::kFirst});
}

void RegisterReductions(Definer& def) {
  def("aten.sum.dim_IntList", kReduction, ReduceDims(Acc::kIntToInt64));
  def("aten.sum.default", kReduction, ReduceAll(Acc::kIntToInt64));
  def("aten.mean.dim", kReduction, ReduceDims(Acc::kSame));
  def("aten.mean.default", kReduction, ReduceAll(Acc::kSame));
  def("aten.amax.default", kReduction, ReduceDims(Acc::kSame));
  def("aten.amin.default", kReduction, ReduceDims(Acc::kSame));
  def("aten.var.correction", kReduction, ReduceDims(Acc::kReal));
  def("aten.var_mean.correction", kReduction, VarMean);
  def("aten.argmax.default", kReduction, Argmax);
  def("aten.prod.dim_int", kReduction, ReduceOneDim(Acc::kIntToInt64, false));
  def("aten.max.dim", kReduction, ReduceOneDim(Acc::kSame, true));
  def("aten._softmax.default", kReduction, Softmax);
  def("aten._log_softmax.default", kReduction, Softmax);
}

void RegisterNormalization(Definer& def) {
  def("aten.native_layer_norm.default", kReduction, LayerNorm);
  def("aten.native_group_norm.default", kReduction, GroupNorm);
  const std::vector<std::string> buffers = {"running_mean", "running_var"};
  def("aten.native_batch_norm.default", kReduction,
      BatchNorm(/*has_training=*/true, false, /*functional=*/false), buffers);
  def("aten._native_batch_norm_legit_functional.default", kReduction,
      BatchNorm(/*has_training=*/true, false, /*functional=*/true), buffers);
  def("aten._native_batch_norm_legit_no_training.default", kReduction,
      BatchNorm(/*has_training=*/false, false, /*functional=*/false), buffers);
  def("aten.nll_loss_forward.default", kReduction, NllLossForward, {"target", "weight"});
}

void RegisterViews(Definer& def) {
  def("aten.view.default", kView, [](const OpCall& c) { return View(c, false); });
  def("aten._unsafe_view.default", kView, [](const OpCall& c) { return View(c, true); });
  def("aten.permute.default", kView, Permute);
  def("aten.expand.default", kView, Expand);
  def("aten.squeeze.dim", kView, [](const OpCall& c) -> absl::StatusOr<Metas> {
    ASSIGN_OR_RETURN(int64_t dim, c.Int("dim"));
    return SqueezeDims(c, {dim});
  });
  def("aten.squeeze.dims", kView, [](const OpCall& c) -> absl::StatusOr<Metas> {
    ASSIGN_OR_RETURN(std::vector<int64_t> dims, c.Ints("dim"));
    return SqueezeDims(c, dims);
  });
  def("aten.unsqueeze.default", kView, Unsqueeze);
  def("aten.slice.Tensor", kView, Slice);
  def("aten.select.int", kView, Select);
  def("aten.split.Tensor", kView, Split);
  def("aten.split_with_sizes.default", kView, SplitWithSizes);
  def("aten.unbind.int", kView, Unbind);
  def("aten.as_strided.default", kView, AsStrided);
  // A copy of self with the strided window written from src: self's shape.
  def("aten.as_strided_scatter.default", kPointwise, [](const OpCall& c) -> absl::StatusOr<Metas> {
    ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
    return Metas{NewTensor(self->dtype, self->sizes, *self)};
  });
  def("aten.t.default", kView, T);
  def("aten.transpose.int", kView, [](const OpCall& c) -> absl::StatusOr<Metas> {
    ASSIGN_OR_RETURN(int64_t dim0, c.Int("dim0"));
    ASSIGN_OR_RETURN(int64_t dim1, c.Int("dim1"));
    return Transpose(c, dim0, dim1);
  });
  def("aten.cat.default", kNone, Cat);
  def("aten.stack.default", kNone, Stack);
  def("aten.constant_pad_nd.default", kNone, ConstantPadNd);
}

void RegisterCreation(Definer& def) {
  def("aten.full.default", kCreation, Factory("size", "fill_value"));
  def("aten.zeros.default", kCreation, Factory("size", nullptr));
  def("aten.ones.default", kCreation, Factory("size", nullptr));
  def("aten.empty.memory_format", kCreation, Factory("size", nullptr));
  def("aten.empty_strided.default", kCreation, Factory("size", nullptr));
  def("aten.scalar_tensor.default", kCreation, Factory(nullptr, nullptr));
  for (const char* op : {"full_like", "zeros_like", "ones_like", "empty_like"}) {
    def(absl::StrCat("aten.", op, ".default"), kCreation, LikeSelf);
  }
  def("aten.new_zeros.default", kCreation, NewZeros);
  def("aten.arange.default", kCreation, Arange);
  def("aten.arange.start_step", kCreation, Arange);
}

void RegisterExtern(Definer& def) {
  def("aten.mm.default", kExpensive, Mm);
  def("aten.bmm.default", kExpensive, Bmm);
  def("aten.addmm.default", kExpensive, Addmm);
  def("aten.convolution.default", kExpensive, Convolution);
  def("aten.max_pool2d_with_indices.default", kExpensive, MaxPool2d);
  def("aten.avg_pool2d.default", kExpensive, AvgPool2d);
  def("aten.embedding.default", kExpensive, Embedding, {"indices"});
  def("aten.index.Tensor", kExpensive, Index, {"indices"});
  def("aten.gather.default", kExpensive, Gather, {"index"});
}

void RegisterBackward(Definer& def) {
  const Elementwise binary{{"grad_output", "self"}, {}};
  def("aten.threshold_backward.default", kPointwise, binary);
  def("aten.gelu_backward.default", kPointwise, binary);
  def("aten.tanh_backward.default", kPointwise, Elementwise{{"grad_output", "output"}, {}});
  def("aten.sigmoid_backward.default", kPointwise, Elementwise{{"grad_output", "output"}, {}});
  def("aten.native_dropout_backward.default", kPointwise,
      Elementwise{{"grad_output", "mask"}, {"grad_output"}}, {"mask"});
  def("aten._softmax_backward_data.default", kReduction, SoftmaxBackward);
  def("aten._log_softmax_backward_data.default", kReduction, SoftmaxBackward);
  def("aten.native_layer_norm_backward.default", kReduction, LayerNormBackward);
  def("aten.native_batch_norm_backward.default", kReduction, BatchNormBackward,
      {"running_mean", "running_var"});
  def("aten.convolution_backward.default", kExpensive, ConvolutionBackward);
  def("aten.max_pool2d_with_indices_backward.default", kExpensive, Like("self"), {"indices"});
  def("aten.avg_pool2d_backward.default", kExpensive, Like("self"));
  def("aten.embedding_dense_backward.default", kExpensive, EmbeddingDenseBackward, {"indices"});
  def("aten.nll_loss_backward.default", kNone, Like("self"), {"target", "weight", "total_weight"});
}

}  // namespace

void RegisterShapeRules(Registry* registry) {
  Definer def(registry);
  RegisterPointwise(def);
  RegisterReductions(def);
  RegisterNormalization(def);
  RegisterViews(def);
  RegisterCreation(def);
  RegisterExtern(def);
  RegisterBackward(def);
}

}  // namespace kiln::ops
