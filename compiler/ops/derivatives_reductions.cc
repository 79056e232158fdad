// Derivative rules of copies (_to_copy, clone, alias, detach, copy),
// reductions (sum, mean, amax, amin, var, var_mean, prod, max), softmax and
// log_softmax, and of the normalization ops (layer and batch norm),
// nll_loss and native_dropout.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/ops/derivative.h"
#include "compiler/ops/derivatives_internal.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_util.h"

namespace kiln::ops::derivatives_internal {
namespace {

// Sorted, non-negative reduction dims; all dims for an empty list.
absl::StatusOr<std::vector<int64_t>> ReductionDims(std::vector<int64_t> dims, int64_t rank) {
  if (dims.empty()) {
    for (int64_t d = 0; d < rank; ++d) dims.push_back(d);
    return dims;
  }
  for (int64_t& d : dims) {
    ASSIGN_OR_RETURN(d, WrapDim(d, rank));
  }
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  if (rank == 0) dims.clear();
  return dims;
}

// The reduction dims of parameter `param` (an int[1]? that may be None).
absl::StatusOr<std::vector<int64_t>> DimsParam(const Ctx& c, const std::string& param,
                                               int64_t rank) {
  std::vector<int64_t> dims;
  if (!c.call().IsNone(param)) {
    ASSIGN_OR_RETURN(dims, c.call().Ints(param));
  }
  return ReductionDims(std::move(dims), rank);
}

// restore_reduced_dims / unsqueeze_multiple: puts back the reduced dims
// (sorted, non-negative) of a keepdim=false reduction.
Val RestoreReducedDims(Ctx& c, ValueId v, const std::vector<int64_t>& dims, bool keepdim) {
  if (keepdim) return v;
  for (int64_t d : dims) {
    ASSIGN_OR_RETURN(v, Unsqueeze(c, v, d));
  }
  return v;
}

// The number of elements reduced over `dims` of `sizes`.
ir::SymInt ReducedCount(const std::vector<ir::SymInt>& sizes, const std::vector<int64_t>& dims) {
  ir::SymInt n{int64_t{1}};
  for (int64_t d : dims) n = SymMul(n, sizes[d]);
  return n;
}

// ---------------------------------------------------------------------------
// Reductions.

// sum_backward: unsqueeze the reduced dims, expand to the input's sizes.
Val SumBackward(Ctx& c, ValueId g, const ir::TensorMeta& self, const std::vector<int64_t>& dims,
                bool keepdim) {
  ASSIGN_OR_RETURN(g, RestoreReducedDims(c, g, dims, keepdim));
  return Expand(c, g, self.sizes);
}

// mean_backward: sum_backward divided by the number of elements reduced.
Val MeanBackward(Ctx& c, ValueId g, ValueId self, const std::vector<int64_t>& dims, bool keepdim) {
  const ir::TensorMeta m = c.meta(self);
  ASSIGN_OR_RETURN(g, SumBackward(c, g, m, dims, keepdim));
  return ScaleByCount(c, g, self, dims, /*divide=*/true);
}

// var_backward: (2 / dof) * grad * (self - mean(self, dims, keepdim=True)).
// `all` is a reduction over every element (dim None or empty; libtorch
// would divide an empty list by 1 - correction).
Val VarBackward(Ctx& c, ValueId g, ValueId self, const std::vector<int64_t>& dims, bool keepdim,
                bool all) {
  const ir::TensorMeta m = c.meta(self);
  double correction = 1.0;
  if (!c.call().IsNone("correction")) {
    ASSIGN_OR_RETURN(correction, c.call().Double("correction"));
  }
  const ir::SymInt count = ReducedCount(m.sizes, dims);
  ASSIGN_OR_RETURN(g, RestoreReducedDims(c, g, dims, keepdim));
  ASSIGN_OR_RETURN(ValueId mean,
                   c.Op("aten.mean.dim", {Ref(self), ir::Ints(dims), ir::Bool(true)}));
  if (!count.is_constant()) {
    // Symbolic sizes are at least 2, so dof = n - correction > 0 for a
    // correction of at most 1; the count is a tensor (CountOf).
    if (correction > 1) {
      return absl::UnimplementedError(absl::StrCat("derivative of ", c.call().Where(),
                                                   ": var over symbolic sizes with correction ",
                                                   correction, " (more than 1)"));
    }
    const v1::DType t = c.meta(g).dtype;
    const v1::DType wide = t == v1::FLOAT64 ? v1::FLOAT64 : v1::FLOAT32;
    ASSIGN_OR_RETURN(ValueId n, CountOf(c, self, dims, wide));
    ASSIGN_OR_RETURN(ValueId dof, AddScalar(c, n, ir::Float(-correction)));
    ASSIGN_OR_RETURN(ValueId twice, MulScalar(c, g, ir::Float(2.0)));
    ASSIGN_OR_RETURN(ValueId scaled, Div(c, twice, dof));
    if (t != wide) {
      ASSIGN_OR_RETURN(scaled, c.Op("aten._to_copy.default", {Ref(scaled)},
                                    {ir::Kwarg("dtype", Argument{"", t})}));
    }
    ASSIGN_OR_RETURN(ValueId centered, Sub(c, self, mean));
    return Mul(c, scaled, centered);
  }
  const double n = static_cast<double>(count.constant());
  const double dof = n - correction;
  if (all && dof <= 0) {
    // No degrees of freedom: NaN where self == mean (inf * 0), inf elsewhere.
    ASSIGN_OR_RETURN(ValueId at_mean, c.Op("aten.eq.Tensor", {Ref(self), Ref(mean)}));
    ASSIGN_OR_RETURN(ValueId inf,
                     c.Op("aten.full_like.default",
                          {Ref(self), ir::Float(std::numeric_limits<double>::infinity())}));
    ASSIGN_OR_RETURN(ValueId scale, c.Op("aten.masked_fill.Scalar",
                                         {Ref(inf), Ref(at_mean),
                                          ir::Float(std::numeric_limits<double>::quiet_NaN())}));
    return Mul(c, g, scale);
  }
  ASSIGN_OR_RETURN(ValueId centered, Sub(c, self, mean));
  ASSIGN_OR_RETURN(g, MulScalar(c, g, ir::Float(2.0 / dof)));
  return Mul(c, g, centered);
}

// Whether the reduction parameter `param` reduces every dimension.
bool ReducesAll(const Ctx& c, const std::string& param, int64_t rank) {
  if (rank == 0 || c.call().IsNone(param)) return true;
  auto dims = c.call().Ints(param);
  return dims.ok() && dims->empty();
}

// scale_grad_by_count (amax/amin): the gradient goes evenly to every
// element equal to the result.
DerivativeRule AmaxAminRule() {
  return SelfRule([](Ctx& c, ValueId g) -> Val {
    ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
    const ir::TensorMeta m = c.meta(self);
    ASSIGN_OR_RETURN(std::vector<int64_t> given, c.call().Ints("dim"));
    ASSIGN_OR_RETURN(std::vector<int64_t> dims, ReductionDims(given, Rank(m)));
    ASSIGN_OR_RETURN(bool keepdim, c.call().Bool("keepdim"));
    ASSIGN_OR_RETURN(g, RestoreReducedDims(c, g, dims, keepdim));
    ASSIGN_OR_RETURN(ValueId r, RestoreReducedDims(c, c.output(0), dims, keepdim));
    ASSIGN_OR_RETURN(ValueId mask, c.Op("aten.eq.Tensor", {Ref(r), Ref(self)}));
    ASSIGN_OR_RETURN(ValueId count,
                     c.Op("aten.sum.dim_IntList", {Ref(mask), ir::Ints(dims), ir::Bool(true)}));
    ASSIGN_OR_RETURN(g, Div(c, g, count));
    return Mul(c, g, mask);
  });
}

// ---------------------------------------------------------------------------
// Normalization.

// native_layer_norm_backward spelled as the ops it computes, so that the
// kiln backend fuses it (the input's gradient is one kernel over each row,
// the weight's and the bias's sums over the rows fold into it): with x̂ =
// (x - mean) * rstd over the N normalized elements and ĝ = grad * weight,
//   d_input  = rstd / N * (N * ĝ - sum(ĝ) - x̂ * sum(ĝ * x̂))   (row sums)
//   d_weight = sum(grad * x̂),  d_bias = sum(grad)            (over the rows)
// 16-bit tensors are computed in float32, as ATen accumulates; SetReduced
// casts each gradient back to its input's dtype. (Before the sums over the
// rows folded into the row kernel, 16-bit inputs kept ATen's kernel: kiln's
// column layout read them at 2 bytes per lane, 2.15 ms against 1.04-1.13 ms
// for [16384, 4096] in bfloat16 on an H100, docs/benchmarks.md.)
absl::Status LayerNormRule(Ctx& c) {
  if (c.grad_output(0) == kNoValue) return absl::OkStatus();
  const bool mask[3] = {c.NeedsGrad("input"), c.NeedsGrad("weight"), c.NeedsGrad("bias")};
  if (!mask[0] && !mask[1] && !mask[2]) return absl::OkStatus();
  ASSIGN_OR_RETURN(const ir::TensorMeta xm, MetaOf(c, "input"));
  ASSIGN_OR_RETURN(std::vector<ir::SymInt> shape, c.call().SymInts("normalized_shape"));
  const int64_t rank = Rank(xm);
  const int64_t axis = rank - static_cast<int64_t>(shape.size());
  if (axis < 0) {
    return absl::InvalidArgumentError(absl::StrCat("derivative of ", c.call().Where(),
                                                   ": normalized_shape has more dims than input"));
  }
  std::vector<int64_t> inner, outer;
  for (int64_t d = 0; d < rank; ++d) (d < axis ? outer : inner).push_back(d);
  auto wide = [&c](ValueId v) -> Val {
    const v1::DType t = c.meta(v).dtype;
    if (t != v1::FLOAT16 && t != v1::BFLOAT16) return v;
    return c.Op("aten._to_copy.default", {Ref(v)}, {ir::Kwarg("dtype", Argument{"", v1::FLOAT32})});
  };
  auto sum = [&c](ValueId v, const std::vector<int64_t>& dims, bool keepdim) -> Val {
    if (dims.empty()) return v;
    return c.Op("aten.sum.dim_IntList", {Ref(v), ir::Ints(dims), ir::Bool(keepdim)});
  };
  ASSIGN_OR_RETURN(ValueId x, Tensor(c, "input"));
  ASSIGN_OR_RETURN(x, wide(x));
  ASSIGN_OR_RETURN(ValueId g, wide(c.grad_output(0)));
  ASSIGN_OR_RETURN(ValueId mean, wide(c.output(1)));
  ASSIGN_OR_RETURN(ValueId rstd, wide(c.output(2)));
  ASSIGN_OR_RETURN(ValueId centered, Sub(c, x, mean));
  ASSIGN_OR_RETURN(ValueId xhat, Mul(c, centered, rstd));
  if (mask[0]) {
    ValueId ghat = g;
    if (!c.call().IsNone("weight")) {
      // float32 times a 16-bit weight is float32 (type promotion, exact):
      // no cast of the weight of its own, whose kernel would sit between the
      // sums over the rows and the row kernel they fold into.
      ASSIGN_OR_RETURN(ValueId w, Tensor(c, "weight"));
      ASSIGN_OR_RETURN(ghat, Mul(c, g, w));
    }
    ASSIGN_OR_RETURN(ValueId sum_ghat, sum(ghat, inner, true));
    ASSIGN_OR_RETURN(ValueId ghat_xhat, Mul(c, ghat, xhat));
    ASSIGN_OR_RETURN(ValueId sum_ghat_xhat, sum(ghat_xhat, inner, true));
    ASSIGN_OR_RETURN(ValueId scaled, ScaleByCount(c, ghat, x, inner, /*divide=*/false));
    ASSIGN_OR_RETURN(ValueId t, Sub(c, scaled, sum_ghat));
    ASSIGN_OR_RETURN(ValueId u, Mul(c, xhat, sum_ghat_xhat));
    ASSIGN_OR_RETURN(t, Sub(c, t, u));
    ASSIGN_OR_RETURN(ValueId k, ScaleByCount(c, rstd, x, inner, /*divide=*/true));
    ASSIGN_OR_RETURN(ValueId dx, Mul(c, k, t));
    RETURN_IF_ERROR(SetReduced(c, "input", dx));
  }
  if (mask[1]) {
    ASSIGN_OR_RETURN(ValueId g_xhat, Mul(c, g, xhat));
    ASSIGN_OR_RETURN(ValueId dw, sum(g_xhat, outer, false));
    RETURN_IF_ERROR(SetReduced(c, "weight", dw));
  }
  if (mask[2]) {
    ASSIGN_OR_RETURN(ValueId db, sum(g, outer, false));
    RETURN_IF_ERROR(SetReduced(c, "bias", db));
  }
  return absl::OkStatus();
}

// native_batch_norm and its _legit variants: native_batch_norm_backward
// with the saved mean/invstd (outputs 1 and 2).
DerivativeRule BatchNormRule(std::optional<bool> training) {
  return [training](Ctx& c) -> absl::Status {
    if (c.grad_output(0) == kNoValue) return absl::OkStatus();
    const bool mask[3] = {c.NeedsGrad("input"), c.NeedsGrad("weight"), c.NeedsGrad("bias")};
    if (!mask[0] && !mask[1] && !mask[2]) return absl::OkStatus();
    bool train = false;
    if (training.has_value()) {
      train = *training;
    } else {
      ASSIGN_OR_RETURN(train, c.call().Bool("training"));
    }
    ASSIGN_OR_RETURN(
        std::vector<ValueId> gs,
        c.OpN("aten.native_batch_norm_backward.default",
              {Ref(c.grad_output(0)), Arg(c, "input"), Arg(c, "weight"), Arg(c, "running_mean"),
               Arg(c, "running_var"), Ref(c.output(1)), Ref(c.output(2)), ir::Bool(train),
               Arg(c, "eps"), Argument{"", std::vector<bool>{mask[0], mask[1], mask[2]}}}));
    const char* params[3] = {"input", "weight", "bias"};
    for (int i = 0; i < 3; ++i) {
      if (mask[i]) c.SetGrad(params[i], gs[i]);
    }
    return absl::OkStatus();
  };
}

// max.dim and min.dim: value_selecting_reduction_backward, the scatter of
// grad to the indices spelled grad * (arange == indices).
absl::Status ValueSelectingRule(Ctx& c) {
  if (!c.NeedsGrad("self") || c.grad_output(0) == kNoValue) return absl::OkStatus();
  ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
  const int64_t rank = Rank(m);
  ValueId g = c.grad_output(0);
  ValueId indices = c.output(1);
  if (rank > 0) {
    ASSIGN_OR_RETURN(int64_t dim, c.call().Int("dim"));
    ASSIGN_OR_RETURN(dim, WrapDim(dim, rank));
    ASSIGN_OR_RETURN(bool keepdim, c.call().Bool("keepdim"));
    ASSIGN_OR_RETURN(g, RestoreReducedDims(c, g, {dim}, keepdim));
    ASSIGN_OR_RETURN(indices, RestoreReducedDims(c, indices, {dim}, keepdim));
    std::vector<Argument> kwargs = {ir::Kwarg("dtype", Argument{"", v1::INT64})};
    if (!m.device_type.empty()) {
      kwargs.push_back(
          ir::Kwarg("device", Argument{"", ir::Device{m.device_type, m.device_index}}));
    }
    ASSIGN_OR_RETURN(ValueId iota,
                     c.Op("aten.arange.default", {SymIntArg(m.sizes[dim])}, std::move(kwargs)));
    std::vector<ir::SymInt> shape(rank, ir::SymInt{int64_t{1}});
    shape[dim] = m.sizes[dim];
    ASSIGN_OR_RETURN(iota, c.Op("aten.view.default", {Ref(iota), SizesArg(shape)}));
    ASSIGN_OR_RETURN(ValueId hit, c.Op("aten.eq.Tensor", {Ref(iota), Ref(indices)}));
    ASSIGN_OR_RETURN(g, Mul(c, g, hit));
  }
  return SetReduced(c, "self", g);
}

}  // namespace

void RegisterCopiesAndReductions(Registry* r) {
  // _to_copy: the gradient cast back to the input's dtype (SetReduced casts).
  for (const char* t : {"aten._to_copy.default", "aten.clone.default", "aten.alias.default",
                        "aten.lift_fresh_copy.default"}) {
    Def(r, t, SelfRule(Identity()));
  }
  // detach: the output is cut off from autograd.
  Def(r, "aten.detach.default", [](Ctx&) { return absl::OkStatus(); }, {"self"});
  // copy(self, src): the result is src's values; self is not
  // differentiable (libtorch: the output needs no gradient for self's sake).
  Def(r, "aten.copy.default", ParamRule({{"src", Identity()}}), {"self"});
  // normal(mean, std): autograd gives mean a gradient of zeros (a draw,
  // not a reparameterization).
  Def(r, "aten.normal.Tensor_float",
      ParamRule({{"mean", [](Ctx& c, ValueId g) { return ZerosLike(c, g); }}}));
  for (const char* t :
       {"aten.zeros_like.default", "aten.ones_like.default", "aten.empty_like.default",
        "aten.full_like.default", "aten.new_zeros.default", "aten.bernoulli.p"}) {
    NoGrad(r, t, {"self"});
  }

  Def(r, "aten.sum.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
        return Expand(c, g, m.sizes);
      }));
  Def(r, "aten.sum.dim_IntList", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
        ASSIGN_OR_RETURN(std::vector<int64_t> dims, DimsParam(c, "dim", Rank(m)));
        ASSIGN_OR_RETURN(bool keepdim, c.call().Bool("keepdim"));
        return SumBackward(c, g, m, dims, keepdim);
      }));
  Def(r, "aten.mean.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(std::vector<int64_t> dims, ReductionDims({}, Rank(c.meta(self))));
        return MeanBackward(c, g, self, dims, false);
      }));
  Def(r, "aten.mean.dim", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(std::vector<int64_t> dims, DimsParam(c, "dim", Rank(c.meta(self))));
        ASSIGN_OR_RETURN(bool keepdim, c.call().Bool("keepdim"));
        return MeanBackward(c, g, self, dims, keepdim);
      }));
  Def(r, "aten.amax.default", AmaxAminRule());
  Def(r, "aten.amin.default", AmaxAminRule());
  // var: an empty dim list counts every element (libtorch would divide by
  // 1 - correction there).
  Def(r, "aten.var.correction", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(std::vector<int64_t> dims, DimsParam(c, "dim", Rank(c.meta(self))));
        ASSIGN_OR_RETURN(bool keepdim, c.call().Bool("keepdim"));
        return VarBackward(c, g, self, dims, keepdim, ReducesAll(c, "dim", Rank(c.meta(self))));
      }));
  // var_mean: the var and mean gradients, summed.
  Def(r, "aten.var_mean.correction", [](Ctx& c) -> absl::Status {
    if (!c.NeedsGrad("self")) return absl::OkStatus();
    ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
    const ir::TensorMeta m = c.meta(self);
    ASSIGN_OR_RETURN(std::vector<int64_t> dims, DimsParam(c, "dim", Rank(m)));
    ASSIGN_OR_RETURN(bool keepdim, c.call().Bool("keepdim"));
    ValueId total = kNoValue;
    if (c.grad_output(0) != kNoValue) {
      ASSIGN_OR_RETURN(total, VarBackward(c, c.grad_output(0), self, dims, keepdim,
                                          ReducesAll(c, "dim", Rank(m))));
    }
    if (c.grad_output(1) != kNoValue) {
      ASSIGN_OR_RETURN(ValueId gm, MeanBackward(c, c.grad_output(1), self, dims, keepdim));
      if (total == kNoValue) {
        total = gm;
      } else {
        ASSIGN_OR_RETURN(total, Add(c, total, gm));
      }
    }
    if (total == kNoValue) return absl::OkStatus();
    return SetReduced(c, "self", total);
  });
  // prod: grad times the product of the other elements. Where the slice
  // has no zero that is result / self; where it has one, the zero's is the
  // product of the rest and every other element's is 0; with two or more,
  // all are 0 (libtorch's cases, spelled as where()s over the slice).
  Def(r, "aten.prod.dim_int", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        const int64_t rank = Rank(c.meta(self));
        if (rank == 0) return g;
        ASSIGN_OR_RETURN(int64_t dim, c.call().Int("dim"));
        ASSIGN_OR_RETURN(dim, WrapDim(dim, rank));
        ASSIGN_OR_RETURN(bool keepdim, c.call().Bool("keepdim"));
        ASSIGN_OR_RETURN(g, RestoreReducedDims(c, g, {dim}, keepdim));
        ASSIGN_OR_RETURN(ValueId result, RestoreReducedDims(c, c.output(0), {dim}, keepdim));
        ASSIGN_OR_RETURN(ValueId zero, c.Op("aten.eq.Scalar", {Ref(self), ir::Float(0.0)}));
        ASSIGN_OR_RETURN(ValueId ones, c.Op("aten.ones_like.default", {Ref(self)}));
        ASSIGN_OR_RETURN(ValueId nonzero,
                         c.Op("aten.where.self", {Ref(zero), Ref(ones), Ref(self)}));
        ASSIGN_OR_RETURN(ValueId rest,
                         c.Op("aten.prod.dim_int", {Ref(nonzero), ir::Int(dim), ir::Bool(true)}));
        ASSIGN_OR_RETURN(ValueId zeros, c.Op("aten.sum.dim_IntList",
                                             {Ref(zero), ir::Ints({dim}), ir::Bool(true)}));
        ASSIGN_OR_RETURN(ValueId one_zero, c.Op("aten.eq.Scalar", {Ref(zeros), ir::Int(1)}));
        ASSIGN_OR_RETURN(ValueId none, c.Op("aten.zeros_like.default", {Ref(rest)}));
        ASSIGN_OR_RETURN(ValueId at_zero,
                         c.Op("aten.where.self", {Ref(one_zero), Ref(rest), Ref(none)}));
        ASSIGN_OR_RETURN(ValueId q, Div(c, result, self));
        ASSIGN_OR_RETURN(q, c.Op("aten.where.self", {Ref(zero), Ref(at_zero), Ref(q)}));
        return Mul(c, g, q);
      }));
  // max.dim, min.dim: value_selecting_reduction_backward.
  Def(r, "aten.max.dim", ValueSelectingRule);
  Def(r, "aten.min.dim", ValueSelectingRule);
  Def(r, "aten._softmax.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
        return c.Op("aten._softmax_backward_data.default",
                    {Ref(g), Ref(c.output(0)), Arg(c, "dim"), Argument{"", m.dtype}});
      }));
  Def(r, "aten._log_softmax.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
        return c.Op("aten._log_softmax_backward_data.default",
                    {Ref(g), Ref(c.output(0)), Arg(c, "dim"), Argument{"", m.dtype}});
      }));
}

void RegisterNormalization(Registry* r) {
  // native_layer_norm: outputs 1 and 2 (mean, rstd) carry no gradient.
  Def(r, "aten.native_layer_norm.default", LayerNormRule);
  const std::vector<std::string> stats = {"running_mean", "running_var"};
  Def(r, "aten.native_batch_norm.default", BatchNormRule(std::nullopt), stats);
  Def(r, "aten._native_batch_norm_legit_functional.default", BatchNormRule(std::nullopt), stats);
  Def(r, "aten._native_batch_norm_legit_no_training.default", BatchNormRule(false), stats);
  // native_group_norm: native_group_norm_backward with the saved mean and
  // rstd (outputs 1 and 2), which carry no gradient of their own.
  Def(r, "aten.native_group_norm.default", [](Ctx& c) -> absl::Status {
    if (c.grad_output(1) != kNoValue || c.grad_output(2) != kNoValue) {
      return absl::UnimplementedError(
          absl::StrCat("derivative of ", c.call().Where(),
                       ": a gradient through the mean or rstd (outputs 1 and 2) is not supported"));
    }
    if (c.grad_output(0) == kNoValue) return absl::OkStatus();
    const bool mask[3] = {c.NeedsGrad("input"), c.NeedsGrad("weight"), c.NeedsGrad("bias")};
    if (!mask[0] && !mask[1] && !mask[2]) return absl::OkStatus();
    ASSIGN_OR_RETURN(
        std::vector<ValueId> gs,
        c.OpN("aten.native_group_norm_backward.default",
              {Ref(c.grad_output(0)), Arg(c, "input"), Ref(c.output(1)), Ref(c.output(2)),
               Arg(c, "weight"), Arg(c, "N"), Arg(c, "C"), Arg(c, "HxW"), Arg(c, "group"),
               Argument{"", std::vector<bool>{mask[0], mask[1], mask[2]}}}));
    const char* params[3] = {"input", "weight", "bias"};
    for (int i = 0; i < 3; ++i) {
      if (mask[i]) RETURN_IF_ERROR(SetReduced(c, params[i], gs[i]));
    }
    return absl::OkStatus();
  });

  Def(r, "aten.nll_loss_forward.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        return c.Op("aten.nll_loss_backward.default",
                    {Ref(g), Arg(c, "self"), Arg(c, "target"), Arg(c, "weight"),
                     Arg(c, "reduction"), Arg(c, "ignore_index"), Ref(c.output(1))});
      }),
      {"target", "weight"});
  // binary_cross_entropy: ATen's backward, (self - target) / max(self (1 -
  // self), eps) scaled, which a decomposition's log would make NaN at 0
  // and 1. The target's gradient is not supported.
  Def(r, "aten.binary_cross_entropy.default",
      [](Ctx& c) -> absl::Status {
        if (c.NeedsGrad("target")) {
          return absl::UnimplementedError(absl::StrCat(
              "derivative of ", c.call().Where(), ": a gradient for 'target' is not supported"));
        }
        if (!c.NeedsGrad("self") || c.grad_output(0) == kNoValue) return absl::OkStatus();
        ASSIGN_OR_RETURN(ValueId g, c.Op("aten.binary_cross_entropy_backward.default",
                                         {Ref(c.grad_output(0)), Arg(c, "self"), Arg(c, "target"),
                                          Arg(c, "weight"), Arg(c, "reduction")}));
        return SetReduced(c, "self", g);
      },
      {"weight"});
  // native_dropout: scale 1/(1-p) when training; libtorch uses scale 1 when
  // `train` is None, though the forward then drops (kept for agreement).
  Def(r, "aten.native_dropout.default", [](Ctx& c) -> absl::Status {
    if (!c.NeedsGrad("input") || c.grad_output(0) == kNoValue) return absl::OkStatus();
    ASSIGN_OR_RETURN(double p, c.call().Double("p"));
    double scale = 1.0;
    if (!c.call().IsNone("train")) {
      ASSIGN_OR_RETURN(bool train, c.call().Bool("train"));
      if (train) scale = p == 1.0 ? 0.0 : 1.0 / (1.0 - p);
    }
    ASSIGN_OR_RETURN(ValueId g, c.Op("aten.native_dropout_backward.default",
                                     {Ref(c.grad_output(0)), Ref(c.output(1)), ir::Float(scale)}));
    return SetReduced(c, "input", g);
  });
}

}  // namespace kiln::ops::derivatives_internal
