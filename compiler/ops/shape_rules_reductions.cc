// Shape rules of reductions (sum, mean, amax, amin, var, argmax, prod, max),
// softmax, and of the forward normalization ops (layer, batch and group
// norm), nll_loss and native_dropout; the registration of the reductions
// and of the normalization ops.
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

// prod.dim_int, max.dim, min.dim: one int dim.
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

}  // namespace

absl::StatusOr<SymInt> Channels(const OpCall& c, const TensorMeta& input) {
  if (Rank(input) < 2) {
    return ArgError(c, "input",
                    absl::StrCat("should have at least 2 dimensions (N, C, ...), got sizes ",
                                 SizesToString(input.sizes)));
  }
  return input.sizes[1];
}

namespace {

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

// native_group_norm: the mean and rstd [N, group] in the input's dtype on
// every device, float32 only for a 16-bit input with a float32 weight
// (ATen's param_scalar_type).
absl::StatusOr<Metas> GroupNorm(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* input, c.Meta("input"));
  ASSIGN_OR_RETURN(SymInt n, SymIntArg(c, "N"));
  ASSIGN_OR_RETURN(int64_t group, c.Int("group"));
  ASSIGN_OR_RETURN(const TensorMeta* weight, OptMeta(c, "weight"));
  const bool mixed = (input->dtype == v1::FLOAT16 || input->dtype == v1::BFLOAT16) &&
                     weight != nullptr && weight->dtype == v1::FLOAT32;
  const v1::DType stats = mixed ? v1::FLOAT32 : input->dtype;
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

// binary_cross_entropy(self, target, weight, reduction): the loss per
// element (reduction 0) or its mean or sum; target of self's sizes and
// dtype.
absl::StatusOr<Metas> BinaryCrossEntropy(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(const TensorMeta* target, c.Meta("target"));
  if (!SizesCompatible(target->sizes, self->sizes) || target->dtype != self->dtype) {
    return ArgError(c, "target",
                    absl::StrCat("has sizes ", SizesToString(target->sizes), " and dtype ",
                                 v1::DType_Name(target->dtype), ", but 'self' has ",
                                 SizesToString(self->sizes), " and ", v1::DType_Name(self->dtype)));
  }
  if (!IsFloating(self->dtype)) {
    return ArgError(c, "self",
                    absl::StrCat("should be floating, got ", v1::DType_Name(self->dtype)));
  }
  ASSIGN_OR_RETURN(int64_t reduction, c.Int("reduction"));
  if (reduction < 0 || reduction > 2) {
    return ArgError(c, "reduction",
                    absl::StrCat("is ", reduction, "; expected 0 (none), 1 (mean) or 2 (sum)"));
  }
  return Metas{NewTensor(self->dtype, reduction == 0 ? self->sizes : SymSizes{}, *self)};
}

}  // namespace

absl::StatusOr<Metas> NativeDropout(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* input, c.Meta("input"));
  return Metas{CopyOf(*input, input->dtype), CopyOf(*input, v1::BOOL)};
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
  def("aten.argmin.default", kReduction, Argmax);
  def("aten.prod.dim_int", kReduction, ReduceOneDim(Acc::kIntToInt64, false));
  def("aten.max.dim", kReduction, ReduceOneDim(Acc::kSame, true));
  def("aten.min.dim", kReduction, ReduceOneDim(Acc::kSame, true));
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
  def("aten.binary_cross_entropy.default", kExpensive, BinaryCrossEntropy, {"weight"});
}

}  // namespace kiln::ops::shape_rules_internal
