// Derivative rules of the op registry (registry.h): the vector-Jacobian
// product of each differentiable core-ATen op, emitted as registry ops so
// that every gradient carries the metadata its shape rule gives.
//
// The formulas are libtorch's (tools/autograd/derivatives.yaml and
// torch/csrc/autograd/FunctionsManual.cpp), op for op where the op exists
// in the registry, so that gradients agree with eager autograd in float64;
// compiler/autograd/grad_check_test.cc holds every rule against libtorch.
// Where a libtorch helper has no core-ATen op (slice_backward, reshape,
// index_put), the rule spells the same values with registry ops; each such
// place says so in a one-line comment.
//
// RegisterDerivatives attaches rules to the entries RegisterShapeRules made
// and skips targets that have no entry: the grad-check test lists the
// targets that must have a rule.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/ops/derivative.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_util.h"

namespace kiln::ops {
namespace {

using ir::Argument;
using ir::kNoValue;
using ir::Ref;
using ir::ValueId;
using Ctx = DerivativeContext;
using Val = absl::StatusOr<ValueId>;

constexpr double kPi = 3.14159265358979323846;  // M_PI

// ---------------------------------------------------------------------------
// Emission helpers.

Val Mul(Ctx& c, ValueId a, ValueId b) { return c.Op("aten.mul.Tensor", {Ref(a), Ref(b)}); }
Val Div(Ctx& c, ValueId a, ValueId b) { return c.Op("aten.div.Tensor", {Ref(a), Ref(b)}); }
Val Add(Ctx& c, ValueId a, ValueId b) { return c.Op("aten.add.Tensor", {Ref(a), Ref(b)}); }
Val Sub(Ctx& c, ValueId a, ValueId b) { return c.Op("aten.sub.Tensor", {Ref(a), Ref(b)}); }
Val Neg(Ctx& c, ValueId a) { return c.Op("aten.neg.default", {Ref(a)}); }
Val MulScalar(Ctx& c, ValueId a, Argument s) {
  return c.Op("aten.mul.Scalar", {Ref(a), std::move(s)});
}
Val DivScalar(Ctx& c, ValueId a, Argument s) {
  return c.Op("aten.div.Scalar", {Ref(a), std::move(s)});
}
Val AddScalar(Ctx& c, ValueId a, Argument s) {
  return c.Op("aten.add.Scalar", {Ref(a), std::move(s)});
}
Val ZerosLike(Ctx& c, ValueId a) { return c.Op("aten.zeros_like.default", {Ref(a)}); }
// where(mask, 0, a): libtorch's where(cond, grad, zeros) with cond = !mask.
Val ZeroWhere(Ctx& c, ValueId a, ValueId mask) {
  return c.Op("aten.masked_fill.Scalar", {Ref(a), Ref(mask), ir::Float(0.0)});
}
Val Not(Ctx& c, ValueId a) { return c.Op("aten.logical_not.default", {Ref(a)}); }
Val Unsqueeze(Ctx& c, ValueId a, int64_t dim) {
  return c.Op("aten.unsqueeze.default", {Ref(a), ir::Int(dim)});
}

// A SymInt[] argument: plain ints when every entry is a constant.
Argument SizesArg(const std::vector<ir::SymInt>& sizes) {
  if (auto ints = ConstantSizes(sizes)) return ir::Ints(*ints);
  return Argument{"", sizes};
}
Argument SymIntArg(const ir::SymInt& s) {
  if (s.is_constant()) return ir::Int(s.constant());
  return Argument{"", s};
}

Val Expand(Ctx& c, ValueId a, const std::vector<ir::SymInt>& sizes) {
  return c.Op("aten.expand.default", {Ref(a), SizesArg(sizes)});
}

// The node's argument `name` as bound (defaults included), to pass on.
Argument Arg(const Ctx& c, const std::string& name) {
  const Argument* a = c.call().Find(name);
  Argument out = a != nullptr ? *a : ir::NoneArg();
  out.name.clear();
  return out;
}

absl::StatusOr<ValueId> Tensor(const Ctx& c, const std::string& name) {
  return c.call().Tensor(name);
}
// A copy: metadata the builder holds moves when a rule emits a node, so
// rules never keep references to it across Op calls.
absl::StatusOr<ir::TensorMeta> MetaOf(const Ctx& c, const std::string& name) {
  ASSIGN_OR_RETURN(const ir::TensorMeta* m, c.call().Meta(name));
  return *m;
}
int64_t Rank(const ir::TensorMeta& m) { return static_cast<int64_t>(m.sizes.size()); }

// libtorch's maybe_multiply: t itself when the scalar is 1.
Val MaybeMultiply(Ctx& c, ValueId t, const std::string& scalar_param) {
  ASSIGN_OR_RETURN(double s, c.call().Double(scalar_param));
  if (s == 1.0) return t;
  return MulScalar(c, t, Arg(c, scalar_param));
}

// Sets the gradient of `param` to `g` summed back over broadcast dimensions
// and cast to the input's dtype, as autograd's engine does (validate_outputs).
absl::Status SetReduced(Ctx& c, const std::string& param, ValueId g) {
  ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, param));
  ASSIGN_OR_RETURN(ValueId r, c.SumToSize(g, m));
  c.SetGrad(param, r);
  return absl::OkStatus();
}

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

// grad.reshape(sizes): a view when the strides allow one, else a
// contiguous copy first (reshape's own rule).
Val Reshape(Ctx& c, ValueId v, const std::vector<ir::SymInt>& sizes) {
  const ir::TensorMeta m = c.meta(v);
  if (m.sizes == sizes) return v;
  if (!ViewStrides(m.sizes, m.strides, sizes).has_value()) {
    ASSIGN_OR_RETURN(v, c.Op("aten.clone.default", {Ref(v)},
                             {ir::Kwarg("memory_format", Argument{"", v1::CONTIGUOUS_FORMAT})}));
  }
  return c.Op("aten.view.default", {Ref(v), SizesArg(sizes)});
}

// constant_pad_nd padding of dimension `dim` of a rank-`rank` tensor by
// `before`/`after` (negative values crop).
Val PadDim(Ctx& c, ValueId v, int64_t dim, int64_t rank, const ir::SymInt& before,
           const ir::SymInt& after) {
  std::vector<ir::SymInt> pad(2 * (rank - dim), ir::SymInt{int64_t{0}});
  pad[pad.size() - 2] = before;
  pad[pad.size() - 1] = after;
  return c.Op("aten.constant_pad_nd.default", {Ref(v), SizesArg(pad)});
}

// ---------------------------------------------------------------------------
// Rule shapes.

using GradFn = std::function<Val(Ctx& c, ValueId grad)>;

// An op whose only differentiable tensor is `self` and whose gradient comes
// from output 0.
DerivativeRule SelfRule(GradFn f) {
  return [f = std::move(f)](Ctx& c) -> absl::Status {
    if (!c.NeedsGrad("self") || c.grad_output(0) == kNoValue) return absl::OkStatus();
    ASSIGN_OR_RETURN(ValueId g, f(c, c.grad_output(0)));
    return SetReduced(c, "self", g);
  };
}

// One gradient function per differentiable parameter, each from output 0.
DerivativeRule ParamRule(std::vector<std::pair<std::string, GradFn>> fs) {
  return [fs = std::move(fs)](Ctx& c) -> absl::Status {
    if (c.grad_output(0) == kNoValue) return absl::OkStatus();
    for (const auto& [param, f] : fs) {
      if (!c.NeedsGrad(param)) continue;
      ASSIGN_OR_RETURN(ValueId g, f(c, c.grad_output(0)));
      RETURN_IF_ERROR(SetReduced(c, param, g));
    }
    return absl::OkStatus();
  };
}

GradFn Identity() {
  return [](Ctx&, ValueId g) -> Val { return g; };
}
GradFn ZerosLikeGrad() {
  return [](Ctx& c, ValueId g) { return ZerosLike(c, g); };
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
Val MeanBackward(Ctx& c, ValueId g, const ir::TensorMeta& self, const std::vector<int64_t>& dims,
                 bool keepdim) {
  ASSIGN_OR_RETURN(g, SumBackward(c, g, self, dims, keepdim));
  return DivScalar(c, g, SymIntArg(ReducedCount(self.sizes, dims)));
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
  std::optional<std::vector<int64_t>> sizes = ConstantSizes(m.sizes);
  if (!sizes.has_value()) {
    return absl::UnimplementedError(
        absl::StrCat("derivative of ", c.call().Where(), ": var over symbolic sizes"));
  }
  double n = 1;
  for (int64_t d : dims) n *= static_cast<double>((*sizes)[d]);
  const double dof = n - correction;
  ASSIGN_OR_RETURN(g, RestoreReducedDims(c, g, dims, keepdim));
  ASSIGN_OR_RETURN(ValueId mean,
                   c.Op("aten.mean.dim", {Ref(self), ir::Ints(dims), ir::Bool(true)}));
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
// Views.

// slice_backward(grad, input_sizes, dim, start, end, step): zeros with grad
// written into the slice, spelled as constant padding (step 1) or as
// padding each element to `step` elements first (step > 1).
absl::Status SliceRule(Ctx& c) {
  if (!c.NeedsGrad("self") || c.grad_output(0) == kNoValue) return absl::OkStatus();
  ValueId g = c.grad_output(0);
  ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
  const int64_t rank = Rank(m);
  ASSIGN_OR_RETURN(int64_t dim, c.call().Int("dim"));
  ASSIGN_OR_RETURN(dim, WrapDim(dim, rank));
  ASSIGN_OR_RETURN(int64_t step, c.call().Int("step"));
  const ir::SymInt size = m.sizes[dim];
  const ir::SymInt out_size = c.meta(g).sizes[dim];
  // The start as the forward clamped it (Python slice semantics).
  ir::SymInt start{int64_t{0}};
  const Argument* given = c.call().Find("start");
  if (const auto* s = given == nullptr ? nullptr : std::get_if<ir::SymInt>(&given->kind);
      s != nullptr && !s->is_constant()) {
    start = *s;
  } else if (!c.call().IsNone("start")) {
    ASSIGN_OR_RETURN(int64_t s0, c.call().Int("start"));
    if (size.is_constant()) {
      if (s0 < 0) s0 += size.constant();
      start = ir::SymInt{std::clamp<int64_t>(s0, 0, size.constant())};
    } else if (s0 >= 0) {
      start = ir::SymInt{s0};
    } else {
      return absl::UnimplementedError(absl::StrCat("derivative of ", c.call().Where(),
                                                   ": negative start over a symbolic size"));
    }
  }
  ir::SymInt covered = SymMul(out_size, ir::SymInt{step});
  if (step > 1) {
    // [.., m, ..] -> [.., m, step, ..] (grad first, zeros after) -> [.., m*step, ..].
    ASSIGN_OR_RETURN(g, Unsqueeze(c, g, dim + 1));
    ASSIGN_OR_RETURN(g,
                     PadDim(c, g, dim + 1, rank + 1, ir::SymInt{int64_t{0}}, ir::SymInt{step - 1}));
    std::vector<ir::SymInt> sizes = c.meta(g).sizes;
    sizes[dim] = covered;
    sizes.erase(sizes.begin() + dim + 1);
    ASSIGN_OR_RETURN(g, Reshape(c, g, sizes));
  }
  ASSIGN_OR_RETURN(g, PadDim(c, g, dim, rank, start, SymSub(SymSub(size, start), covered)));
  c.SetGrad("self", g);
  return absl::OkStatus();
}

// select_backward: unsqueeze, then pad with zeros around the index.
absl::Status SelectRule(Ctx& c) {
  if (!c.NeedsGrad("self") || c.grad_output(0) == kNoValue) return absl::OkStatus();
  ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
  const int64_t rank = Rank(m);
  ASSIGN_OR_RETURN(int64_t dim, c.call().Int("dim"));
  ASSIGN_OR_RETURN(dim, WrapDim(dim, rank));
  const ir::SymInt size = m.sizes[dim];
  ir::SymInt index;
  const Argument* a = c.call().Find("index");
  if (const auto* s = std::get_if<ir::SymInt>(&a->kind); s != nullptr && !s->is_constant()) {
    index = *s;
  } else {
    ASSIGN_OR_RETURN(int64_t i, c.call().Int("index"));
    if (i < 0) {
      if (!size.is_constant()) {
        return absl::UnimplementedError(absl::StrCat("derivative of ", c.call().Where(),
                                                     ": negative index over a symbolic size"));
      }
      i += size.constant();
    }
    index = ir::SymInt{i};
  }
  ASSIGN_OR_RETURN(ValueId g, Unsqueeze(c, c.grad_output(0), dim));
  ASSIGN_OR_RETURN(
      g, PadDim(c, g, dim, rank, index, SymSub(SymSub(size, index), ir::SymInt{int64_t{1}})));
  c.SetGrad("self", g);
  return absl::OkStatus();
}

// split_backward / split_with_sizes_backward: cat of the output gradients,
// zeros for outputs without one.
absl::Status SplitRule(Ctx& c) {
  if (!c.NeedsGrad("self")) return absl::OkStatus();
  std::vector<ValueId> parts;
  for (int i = 0; i < c.num_outputs(); ++i) {
    ASSIGN_OR_RETURN(ValueId g, c.GradOrZeros(i));
    parts.push_back(g);
  }
  ASSIGN_OR_RETURN(ValueId g, c.Op("aten.cat.default", {Argument{"", parts}, Arg(c, "dim")}));
  return SetReduced(c, "self", g);
}

// cat_tensors_backward: the slice of grad each input became.
absl::Status CatRule(Ctx& c) {
  if (!c.NeedsGrad("tensors") || c.grad_output(0) == kNoValue) return absl::OkStatus();
  const ValueId g = c.grad_output(0);
  ASSIGN_OR_RETURN(std::vector<ValueId> tensors, c.call().Tensors("tensors"));
  ASSIGN_OR_RETURN(int64_t dim, c.call().Int("dim"));
  ASSIGN_OR_RETURN(dim, WrapDim(dim, Rank(c.meta(g))));
  std::vector<ValueId> grads;
  ir::SymInt offset{int64_t{0}};
  for (ValueId t : tensors) {
    const ir::TensorMeta m = c.meta(t);
    if (m.sizes.size() == 1 && IsConstant(m.sizes[0], 0)) {
      // Legacy empty inputs take no part in cat; libtorch gives zeros({0}).
      ASSIGN_OR_RETURN(ValueId z, c.Op("aten.new_zeros.default", {Ref(g), ir::Ints({0})}));
      grads.push_back(z);
      continue;
    }
    ir::SymInt end = SymAdd(offset, m.sizes[dim]);
    ASSIGN_OR_RETURN(ValueId part,
                     c.Op("aten.slice.Tensor",
                          {Ref(g), ir::Int(dim), SymIntArg(offset), SymIntArg(end), ir::Int(1)}));
    ASSIGN_OR_RETURN(part, c.SumToSize(part, m));
    grads.push_back(part);
    offset = end;
  }
  c.SetGrads("tensors", std::move(grads));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Matmul.

bool ColumnMajor(const ir::TensorMeta& m) {
  return m.sizes.size() == 2 && IsConstant(m.strides[0], 1) && m.strides[1] == m.sizes[0];
}

// mm_mat1_backward: grad.mm(mat2.t()), or (mat2.mm(grad.t())).t() for a
// column-major mat1 (so the gradient is column-major too).
Val MmMat1Backward(Ctx& c, ValueId g, ValueId mat1, ValueId mat2) {
  if (ColumnMajor(c.meta(mat1))) {
    ASSIGN_OR_RETURN(ValueId gt, c.Op("aten.t.default", {Ref(g)}));
    ASSIGN_OR_RETURN(ValueId p, c.Op("aten.mm.default", {Ref(mat2), Ref(gt)}));
    return c.Op("aten.t.default", {Ref(p)});
  }
  ASSIGN_OR_RETURN(ValueId m2t, c.Op("aten.t.default", {Ref(mat2)}));
  return c.Op("aten.mm.default", {Ref(g), Ref(m2t)});
}

// mm_mat2_backward: mat1.t().mm(grad), or (grad.t().mm(mat1)).t() for a
// column-major mat2.
Val MmMat2Backward(Ctx& c, ValueId g, ValueId mat1, ValueId mat2) {
  if (ColumnMajor(c.meta(mat2))) {
    ASSIGN_OR_RETURN(ValueId gt, c.Op("aten.t.default", {Ref(g)}));
    ASSIGN_OR_RETURN(ValueId p, c.Op("aten.mm.default", {Ref(gt), Ref(mat1)}));
    return c.Op("aten.t.default", {Ref(p)});
  }
  ASSIGN_OR_RETURN(ValueId m1t, c.Op("aten.t.default", {Ref(mat1)}));
  return c.Op("aten.mm.default", {Ref(m1t), Ref(g)});
}

// ---------------------------------------------------------------------------
// Normalization.

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

// ---------------------------------------------------------------------------
// Registration.

void Def(Registry* registry, const std::string& target, DerivativeRule rule,
         std::vector<std::string> nondifferentiable = {}) {
  OpDef* def = registry->Mutable(target);
  if (def == nullptr) return;  // no shape rule yet: the grad-check test reports it
  def->derivative = std::move(rule);
  def->nondifferentiable = std::move(nondifferentiable);
}

// Ops whose output carries no gradient from these tensor parameters
// (factories that read only an input's metadata; bernoulli, which libtorch
// does not differentiate), without a rule.
void NoGrad(Registry* registry, const std::string& target, std::vector<std::string> params) {
  OpDef* def = registry->Mutable(target);
  if (def == nullptr) return;
  def->nondifferentiable = std::move(params);
}

void RegisterPointwise(Registry* r) {
  // abs: grad * sgn(self); sgn is sign for real dtypes.
  Def(r, "aten.abs.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(ValueId s, c.Op("aten.sign.default", {Ref(self)}));
        return Mul(c, g, s);
      }));
  Def(r, "aten.neg.default", SelfRule([](Ctx& c, ValueId g) { return Neg(c, g); }));
  Def(r, "aten.exp.default", SelfRule([](Ctx& c, ValueId g) { return Mul(c, g, c.output(0)); }));
  Def(r, "aten.log.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        return Div(c, g, self);
      }));
  Def(r, "aten.log1p.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(ValueId p, AddScalar(c, self, ir::Int(1)));
        return Div(c, g, p);
      }));
  Def(r, "aten.expm1.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId p, AddScalar(c, c.output(0), ir::Int(1)));
        return Mul(c, g, p);
      }));
  Def(r, "aten.sqrt.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId twice, MulScalar(c, c.output(0), ir::Int(2)));
        return Div(c, g, twice);
      }));
  // rsqrt: -0.5 * grad * result^3.
  Def(r, "aten.rsqrt.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId cube,
                         c.Op("aten.pow.Tensor_Scalar", {Ref(c.output(0)), ir::Int(3)}));
        ASSIGN_OR_RETURN(ValueId h, MulScalar(c, g, ir::Float(-0.5)));
        return Mul(c, h, cube);
      }));
  // reciprocal: -grad * result^2.
  Def(r, "aten.reciprocal.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId sq, Mul(c, c.output(0), c.output(0)));
        ASSIGN_OR_RETURN(ValueId n, Neg(c, g));
        return Mul(c, n, sq);
      }));
  Def(r, "aten.sin.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(ValueId cos, c.Op("aten.cos.default", {Ref(self)}));
        return Mul(c, g, cos);
      }));
  Def(r, "aten.cos.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(ValueId sin, c.Op("aten.sin.default", {Ref(self)}));
        ASSIGN_OR_RETURN(ValueId n, Neg(c, sin));
        return Mul(c, g, n);
      }));
  Def(r, "aten.tanh.default", SelfRule([](Ctx& c, ValueId g) {
        return c.Op("aten.tanh_backward.default", {Ref(g), Ref(c.output(0))});
      }));
  Def(r, "aten.sigmoid.default", SelfRule([](Ctx& c, ValueId g) {
        return c.Op("aten.sigmoid_backward.default", {Ref(g), Ref(c.output(0))});
      }));
  // relu: threshold_backward on the result (grad is 0 where result <= 0).
  Def(r, "aten.relu.default", SelfRule([](Ctx& c, ValueId g) {
        return c.Op("aten.threshold_backward.default", {Ref(g), Ref(c.output(0)), ir::Int(0)});
      }));
  Def(r, "aten.gelu.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        return c.Op("aten.gelu_backward.default", {Ref(g), Ref(self)},
                    {ir::Kwarg("approximate", Arg(c, "approximate"))});
      }));
  // silu_backward: grad * s * (1 + self * (1 - s)), s = sigmoid(self).
  Def(r, "aten.silu.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(ValueId s, c.Op("aten.sigmoid.default", {Ref(self)}));
        ASSIGN_OR_RETURN(ValueId one_minus, c.Op("aten.rsub.Scalar", {Ref(s), ir::Int(1)}));
        ASSIGN_OR_RETURN(ValueId t, Mul(c, self, one_minus));
        ASSIGN_OR_RETURN(t, AddScalar(c, t, ir::Int(1)));
        ASSIGN_OR_RETURN(ValueId gs, Mul(c, g, s));
        return Mul(c, gs, t);
      }));
  // erf: 2 / sqrt(pi) * exp(-self^2) * grad.
  Def(r, "aten.erf.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(ValueId sq, c.Op("aten.pow.Tensor_Scalar", {Ref(self), ir::Int(2)}));
        ASSIGN_OR_RETURN(ValueId n, Neg(c, sq));
        ASSIGN_OR_RETURN(ValueId e, c.Op("aten.exp.default", {Ref(n)}));
        ASSIGN_OR_RETURN(ValueId k, MulScalar(c, e, ir::Float(2.0 / std::sqrt(kPi))));
        return Mul(c, k, g);
      }));
  // Piecewise constant: a defined zero gradient, as libtorch gives.
  for (const char* t :
       {"aten.sign.default", "aten.floor.default", "aten.ceil.default", "aten.fill.Scalar"}) {
    Def(r, t, SelfRule(ZerosLikeGrad()));
  }
  // leaky_relu_backward: grad where self > 0, grad * negative_slope elsewhere.
  Def(r, "aten.leaky_relu.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(ValueId pos, c.Op("aten.gt.Scalar", {Ref(self), ir::Int(0)}));
        ASSIGN_OR_RETURN(ValueId scaled, MulScalar(c, g, Arg(c, "negative_slope")));
        return c.Op("aten.where.self", {Ref(pos), Ref(g), Ref(scaled)});
      }));
  // hardtanh_backward: zero where self <= min_val or self >= max_val.
  Def(r, "aten.hardtanh.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(ValueId lo, c.Op("aten.le.Scalar", {Ref(self), Arg(c, "min_val")}));
        ASSIGN_OR_RETURN(ValueId hi, c.Op("aten.ge.Scalar", {Ref(self), Arg(c, "max_val")}));
        ASSIGN_OR_RETURN(ValueId out, c.Op("aten.logical_or.default", {Ref(lo), Ref(hi)}));
        return ZeroWhere(c, g, out);
      }));
  // clamp_backward: grad where min <= self <= max (NaN self gets 0), else 0.
  Def(r, "aten.clamp.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        std::optional<ValueId> in;
        if (!c.call().IsNone("min")) {
          ASSIGN_OR_RETURN(ValueId ge, c.Op("aten.ge.Scalar", {Ref(self), Arg(c, "min")}));
          in = ge;
        }
        if (!c.call().IsNone("max")) {
          ASSIGN_OR_RETURN(ValueId le, c.Op("aten.le.Scalar", {Ref(self), Arg(c, "max")}));
          if (in.has_value()) {
            ASSIGN_OR_RETURN(le, c.Op("aten.logical_and.default", {Ref(*in), Ref(le)}));
          }
          in = le;
        }
        if (!in.has_value()) return g;
        ASSIGN_OR_RETURN(ValueId out, Not(c, *in));
        return ZeroWhere(c, g, out);
      }));

  // pow(self, exponent): 0 for exponent 0, else grad * exponent * self^(exponent - 1).
  Def(r, "aten.pow.Tensor_Scalar", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(double e, c.call().Double("exponent"));
        if (e == 0.0) return ZerosLike(c, self);
        ASSIGN_OR_RETURN(ValueId p, c.Op("aten.pow.Tensor_Scalar", {Ref(self), ir::Float(e - 1)}));
        ASSIGN_OR_RETURN(p, MulScalar(c, p, ir::Float(e)));
        return Mul(c, g, p);
      }));
  Def(r, "aten.pow.Tensor_Tensor",
      ParamRule(
          {{"self",
            // pow_backward_self: where(exponent == 0, 0, grad * exponent * self^(exponent - 1)).
            [](Ctx& c, ValueId g) -> Val {
              ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
              ASSIGN_OR_RETURN(ValueId e, Tensor(c, "exponent"));
              ASSIGN_OR_RETURN(ValueId e1, c.Op("aten.sub.Scalar", {Ref(e), ir::Int(1)}));
              ASSIGN_OR_RETURN(ValueId p, c.Op("aten.pow.Tensor_Tensor", {Ref(self), Ref(e1)}));
              ASSIGN_OR_RETURN(p, Mul(c, e, p));
              ASSIGN_OR_RETURN(p, Mul(c, g, p));
              ASSIGN_OR_RETURN(ValueId zero, c.Op("aten.eq.Scalar", {Ref(e), ir::Float(0.0)}));
              return ZeroWhere(c, p, zero);
            }},
           {"exponent",
            // pow_backward_exponent: grad * where(self == 0 & exponent >= 0, 0, result *
            // log(self)).
            [](Ctx& c, ValueId g) -> Val {
              ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
              ASSIGN_OR_RETURN(ValueId e, Tensor(c, "exponent"));
              ASSIGN_OR_RETURN(ValueId lg, c.Op("aten.log.default", {Ref(self)}));
              ASSIGN_OR_RETURN(ValueId p, Mul(c, c.output(0), lg));
              ASSIGN_OR_RETURN(ValueId z, c.Op("aten.eq.Scalar", {Ref(self), ir::Float(0.0)}));
              ASSIGN_OR_RETURN(ValueId nn, c.Op("aten.ge.Scalar", {Ref(e), ir::Float(0.0)}));
              ASSIGN_OR_RETURN(ValueId cond, c.Op("aten.logical_and.default", {Ref(z), Ref(nn)}));
              ASSIGN_OR_RETURN(p, ZeroWhere(c, p, cond));
              return Mul(c, g, p);
            }}}));
  // pow(Scalar base, exponent): grad * result * log(base); 0 where base == 0
  // and exponent >= 0.
  Def(r, "aten.pow.Scalar", [](Ctx& c) -> absl::Status {
    if (!c.NeedsGrad("exponent") || c.grad_output(0) == kNoValue) return absl::OkStatus();
    ASSIGN_OR_RETURN(double base, c.call().Double("self"));
    ASSIGN_OR_RETURN(ValueId e, Tensor(c, "exponent"));
    ASSIGN_OR_RETURN(ValueId p, MulScalar(c, c.output(0), ir::Float(std::log(base))));
    if (base == 0.0) {
      ASSIGN_OR_RETURN(ValueId nn, c.Op("aten.ge.Scalar", {Ref(e), ir::Float(0.0)}));
      ASSIGN_OR_RETURN(p, ZeroWhere(c, p, nn));
    }
    ASSIGN_OR_RETURN(p, Mul(c, c.grad_output(0), p));
    return SetReduced(c, "exponent", p);
  });

  // Arithmetic. Gradients of broadcast operands are summed back (SetReduced).
  auto alpha_times = [](bool negate) {
    return [negate](Ctx& c, ValueId g) -> Val {
      if (negate) {
        ASSIGN_OR_RETURN(g, Neg(c, g));
      }
      return MaybeMultiply(c, g, "alpha");
    };
  };
  Def(r, "aten.add.Tensor", ParamRule({{"self", Identity()}, {"other", alpha_times(false)}}));
  Def(r, "aten.add.Scalar", SelfRule(Identity()));
  Def(r, "aten.sub.Tensor", ParamRule({{"self", Identity()}, {"other", alpha_times(true)}}));
  Def(r, "aten.sub.Scalar", SelfRule(Identity()));
  // rsub(self, other) = other - alpha * self.
  Def(r, "aten.rsub.Tensor", ParamRule({{"self", alpha_times(true)}, {"other", Identity()}}));
  Def(r, "aten.rsub.Scalar", SelfRule(alpha_times(true)));
  auto times = [](const char* param) {
    return [param](Ctx& c, ValueId g) -> Val {
      ASSIGN_OR_RETURN(ValueId t, Tensor(c, param));
      return Mul(c, g, t);
    };
  };
  Def(r, "aten.mul.Tensor", ParamRule({{"self", times("other")}, {"other", times("self")}}));
  Def(r, "aten.mul.Scalar",
      SelfRule([](Ctx& c, ValueId g) { return MulScalar(c, g, Arg(c, "other")); }));
  auto div_self = [](Ctx& c, ValueId g) -> Val {
    ASSIGN_OR_RETURN(ValueId other, Tensor(c, "other"));
    return Div(c, g, other);
  };
  // div_tensor_other_backward: -grad * ((self / other) / other).
  auto div_other = [](Ctx& c, ValueId g) -> Val {
    ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
    ASSIGN_OR_RETURN(ValueId other, Tensor(c, "other"));
    ASSIGN_OR_RETURN(ValueId q, Div(c, self, other));
    ASSIGN_OR_RETURN(q, Div(c, q, other));
    ASSIGN_OR_RETURN(ValueId n, Neg(c, g));
    return Mul(c, n, q);
  };
  Def(r, "aten.div.Tensor", ParamRule({{"self", div_self}, {"other", div_other}}));
  // div with a rounding mode is piecewise constant: zeros.
  auto unless_rounding = [](const char* param, GradFn f) {
    return [param, f](Ctx& c, ValueId g) -> Val {
      if (c.call().IsNone("rounding_mode")) return f(c, g);
      ASSIGN_OR_RETURN(ValueId t, Tensor(c, param));
      return ZerosLike(c, t);
    };
  };
  Def(r, "aten.div.Tensor_mode",
      ParamRule({{"self", unless_rounding("self", div_self)},
                 {"other", unless_rounding("other", div_other)}}));
  auto div_scalar = [](Ctx& c, ValueId g) { return DivScalar(c, g, Arg(c, "other")); };
  Def(r, "aten.div.Scalar", SelfRule(div_scalar));
  Def(r, "aten.div.Scalar_mode", SelfRule(unless_rounding("self", div_scalar)));

  // maximum/minimum: the gradient goes to the larger (smaller) operand;
  // ties split it half to each.
  auto select_grad = [](const char* losing_cmp) {
    return [losing_cmp](Ctx& c, ValueId g) -> Val {
      ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
      ASSIGN_OR_RETURN(ValueId other, Tensor(c, "other"));
      ASSIGN_OR_RETURN(ValueId tie, c.Op("aten.eq.Tensor", {Ref(self), Ref(other)}));
      ASSIGN_OR_RETURN(ValueId half, DivScalar(c, g, ir::Int(2)));
      ASSIGN_OR_RETURN(ValueId w, c.Op("aten.where.self", {Ref(tie), Ref(half), Ref(g)}));
      ASSIGN_OR_RETURN(ValueId lose, c.Op(losing_cmp, {Ref(self), Ref(other)}));
      return ZeroWhere(c, w, lose);
    };
  };
  Def(r, "aten.maximum.default",
      ParamRule(
          {{"self", select_grad("aten.lt.Tensor")}, {"other", select_grad("aten.gt.Tensor")}}));
  Def(r, "aten.minimum.default",
      ParamRule(
          {{"self", select_grad("aten.gt.Tensor")}, {"other", select_grad("aten.lt.Tensor")}}));

  Def(r, "aten.where.self",
      ParamRule({{"self",
                  [](Ctx& c, ValueId g) -> Val {
                    ASSIGN_OR_RETURN(ValueId cond, Tensor(c, "condition"));
                    ASSIGN_OR_RETURN(ValueId no, Not(c, cond));
                    return ZeroWhere(c, g, no);
                  }},
                 {"other",
                  [](Ctx& c, ValueId g) -> Val {
                    ASSIGN_OR_RETURN(ValueId cond, Tensor(c, "condition"));
                    return ZeroWhere(c, g, cond);
                  }}}),
      {"condition"});
  Def(r, "aten.masked_fill.Scalar", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId mask, Tensor(c, "mask"));
        return ZeroWhere(c, g, mask);
      }),
      {"mask"});
}

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
        ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
        ASSIGN_OR_RETURN(std::vector<int64_t> dims, ReductionDims({}, Rank(m)));
        return MeanBackward(c, g, m, dims, false);
      }));
  Def(r, "aten.mean.dim", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
        ASSIGN_OR_RETURN(std::vector<int64_t> dims, DimsParam(c, "dim", Rank(m)));
        ASSIGN_OR_RETURN(bool keepdim, c.call().Bool("keepdim"));
        return MeanBackward(c, g, m, dims, keepdim);
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
      ASSIGN_OR_RETURN(ValueId gm, MeanBackward(c, c.grad_output(1), m, dims, keepdim));
      if (total == kNoValue) {
        total = gm;
      } else {
        ASSIGN_OR_RETURN(total, Add(c, total, gm));
      }
    }
    if (total == kNoValue) return absl::OkStatus();
    return SetReduced(c, "self", total);
  });
  // prod: grad * result / self, libtorch's formula for inputs without
  // zeros (with a zero it takes another path; this one gives NaN there).
  Def(r, "aten.prod.dim_int", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        const int64_t rank = Rank(c.meta(self));
        if (rank == 0) return g;
        ASSIGN_OR_RETURN(int64_t dim, c.call().Int("dim"));
        ASSIGN_OR_RETURN(dim, WrapDim(dim, rank));
        ASSIGN_OR_RETURN(bool keepdim, c.call().Bool("keepdim"));
        ASSIGN_OR_RETURN(g, RestoreReducedDims(c, g, {dim}, keepdim));
        ASSIGN_OR_RETURN(ValueId result, RestoreReducedDims(c, c.output(0), {dim}, keepdim));
        ASSIGN_OR_RETURN(ValueId q, Div(c, result, self));
        return Mul(c, g, q);
      }));
  // max.dim: value_selecting_reduction_backward; the scatter of grad to the
  // indices is spelled grad * (arange == indices).
  Def(r, "aten.max.dim", [](Ctx& c) -> absl::Status {
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
  });
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
  Def(r, "aten.native_layer_norm.default", [](Ctx& c) -> absl::Status {
    if (c.grad_output(0) == kNoValue) return absl::OkStatus();
    const bool mask[3] = {c.NeedsGrad("input"), c.NeedsGrad("weight"), c.NeedsGrad("bias")};
    if (!mask[0] && !mask[1] && !mask[2]) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::vector<ValueId> gs,
                     c.OpN("aten.native_layer_norm_backward.default",
                           {Ref(c.grad_output(0)), Arg(c, "input"), Arg(c, "normalized_shape"),
                            Ref(c.output(1)), Ref(c.output(2)), Arg(c, "weight"), Arg(c, "bias"),
                            Argument{"", std::vector<bool>{mask[0], mask[1], mask[2]}}}));
    const char* params[3] = {"input", "weight", "bias"};
    for (int i = 0; i < 3; ++i) {
      if (mask[i]) c.SetGrad(params[i], gs[i]);
    }
    return absl::OkStatus();
  });
  const std::vector<std::string> stats = {"running_mean", "running_var"};
  Def(r, "aten.native_batch_norm.default", BatchNormRule(std::nullopt), stats);
  Def(r, "aten._native_batch_norm_legit_functional.default", BatchNormRule(std::nullopt), stats);
  Def(r, "aten._native_batch_norm_legit_no_training.default", BatchNormRule(false), stats);

  Def(r, "aten.nll_loss_forward.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        return c.Op("aten.nll_loss_backward.default",
                    {Ref(g), Arg(c, "self"), Arg(c, "target"), Arg(c, "weight"),
                     Arg(c, "reduction"), Arg(c, "ignore_index"), Ref(c.output(1))});
      }),
      {"target", "weight"});
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

void RegisterViews(Registry* r) {
  auto reshape_back = [](Ctx& c, ValueId g) -> Val {
    ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
    return Reshape(c, g, m.sizes);
  };
  Def(r, "aten.view.default", SelfRule(reshape_back));
  Def(r, "aten._unsafe_view.default", SelfRule(reshape_back));
  Def(r, "aten.permute.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
        ASSIGN_OR_RETURN(std::vector<int64_t> dims, c.call().Ints("dims"));
        std::vector<int64_t> inverse(dims.size());
        for (size_t i = 0; i < dims.size(); ++i) {
          ASSIGN_OR_RETURN(int64_t d, WrapDim(dims[i], Rank(m)));
          inverse[d] = static_cast<int64_t>(i);
        }
        return c.Op("aten.permute.default", {Ref(g), ir::Ints(inverse)});
      }));
  // expand: sum over the expanded dimensions (SetReduced).
  Def(r, "aten.expand.default", SelfRule(Identity()));
  // squeeze: unsqueeze_to, which puts back only dimensions of size 1.
  Def(r, "aten.squeeze.dim", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
        if (m.sizes.empty()) return g;
        ASSIGN_OR_RETURN(int64_t dim, c.call().Int("dim"));
        ASSIGN_OR_RETURN(dim, WrapDim(dim, Rank(m)));
        if (!IsConstant(m.sizes[dim], 1)) return g;
        return Unsqueeze(c, g, dim);
      }));
  Def(r, "aten.squeeze.dims", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
        if (m.sizes.empty()) return g;
        ASSIGN_OR_RETURN(std::vector<int64_t> given, c.call().Ints("dim"));
        std::vector<int64_t> dims;
        for (int64_t d : given) {
          ASSIGN_OR_RETURN(d, WrapDim(d, Rank(m)));
          dims.push_back(d);
        }
        std::sort(dims.begin(), dims.end());
        dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
        for (int64_t d : dims) {
          if (!IsConstant(m.sizes[d], 1)) continue;
          ASSIGN_OR_RETURN(g, Unsqueeze(c, g, d));
        }
        return g;
      }));
  Def(r, "aten.unsqueeze.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(int64_t dim, c.call().Int("dim"));
        ASSIGN_OR_RETURN(dim, WrapDim(dim, Rank(c.meta(g))));
        return c.Op("aten.squeeze.dim", {Ref(g), ir::Int(dim)});
      }));
  Def(r, "aten.slice.Tensor", SliceRule);
  Def(r, "aten.select.int", SelectRule);
  Def(r, "aten.split.Tensor", SplitRule);
  Def(r, "aten.split_with_sizes.default", SplitRule);
  // unbind_backward: stack of the output gradients, zeros where missing.
  Def(r, "aten.unbind.int", [](Ctx& c) -> absl::Status {
    if (!c.NeedsGrad("self")) return absl::OkStatus();
    std::vector<ValueId> parts;
    for (int i = 0; i < c.num_outputs(); ++i) {
      ASSIGN_OR_RETURN(ValueId g, c.GradOrZeros(i));
      parts.push_back(g);
    }
    ASSIGN_OR_RETURN(ValueId g, c.Op("aten.stack.default", {Argument{"", parts}, Arg(c, "dim")}));
    return SetReduced(c, "self", g);
  });
  Def(r, "aten.cat.default", CatRule);
  // stack_tensors_backward: grad unbound along the stacked dimension.
  Def(r, "aten.stack.default", [](Ctx& c) -> absl::Status {
    if (!c.NeedsGrad("tensors") || c.grad_output(0) == kNoValue) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::vector<ValueId> tensors, c.call().Tensors("tensors"));
    ASSIGN_OR_RETURN(int64_t dim, c.call().Int("dim"));
    ASSIGN_OR_RETURN(dim, WrapDim(dim, Rank(c.meta(c.grad_output(0)))));
    ASSIGN_OR_RETURN(std::vector<ValueId> parts,
                     c.OpN("aten.unbind.int", {Ref(c.grad_output(0)), ir::Int(dim)}));
    if (parts.size() != tensors.size()) {
      return absl::InternalError(absl::StrCat("derivative of ", c.call().Where(), ": unbind gave ",
                                              parts.size(), " parts for ", tensors.size(),
                                              " tensors"));
    }
    for (size_t i = 0; i < parts.size(); ++i) {
      const ir::TensorMeta like = c.meta(tensors[i]);
      ASSIGN_OR_RETURN(parts[i], c.SumToSize(parts[i], like));
    }
    c.SetGrads("tensors", std::move(parts));
    return absl::OkStatus();
  });
  Def(r, "aten.t.default",
      SelfRule([](Ctx& c, ValueId g) { return c.Op("aten.t.default", {Ref(g)}); }));
  // as_strided: the gradient written into zeros through the same window.
  // Exact when the window does not overlap itself (libtorch then sums).
  Def(r, "aten.as_strided.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, c.call().Tensor("self"));
        ASSIGN_OR_RETURN(ValueId zeros, c.Op("aten.zeros_like.default", {Ref(self)}));
        return c.Op(
            "aten.as_strided_scatter.default",
            {Ref(zeros), Ref(g), Arg(c, "size"), Arg(c, "stride"), Arg(c, "storage_offset")});
      }));
  Def(r, "aten.transpose.int", SelfRule([](Ctx& c, ValueId g) {
        return c.Op("aten.transpose.int", {Ref(g), Arg(c, "dim0"), Arg(c, "dim1")});
      }));
  // constant_pad_nd: the negated padding crops the gradient back.
  Def(r, "aten.constant_pad_nd.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(std::vector<ir::SymInt> pad, c.call().SymInts("pad"));
        for (ir::SymInt& p : pad) p = SymSub(ir::SymInt{int64_t{0}}, p);
        return c.Op("aten.constant_pad_nd.default", {Ref(g), SizesArg(pad)});
      }));
  // index.Tensor with one index tensor on dimension 0: index_put's
  // accumulation is embedding_dense_backward over self viewed as [N, rest].
  Def(r, "aten.index.Tensor", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
        ASSIGN_OR_RETURN(std::vector<ValueId> indices, c.call().Tensors("indices"));
        if (indices.size() != 1 || indices[0] == kNoValue || m.sizes.empty() ||
            (c.meta(indices[0]).dtype != v1::INT64 && c.meta(indices[0]).dtype != v1::INT32)) {
          return absl::UnimplementedError(
              absl::StrCat("derivative of ", c.call().Where(),
                           ": only one integer index tensor on dimension 0 is supported"));
        }
        const std::vector<ir::SymInt> rest(m.sizes.begin() + 1, m.sizes.end());
        std::vector<ir::SymInt> flat = c.meta(indices[0]).sizes;
        flat.push_back(Numel(rest));
        ASSIGN_OR_RETURN(g, Reshape(c, g, flat));
        ASSIGN_OR_RETURN(g, c.Op("aten.embedding_dense_backward.default",
                                 {Ref(g), Ref(indices[0]), SymIntArg(m.sizes[0]), ir::Int(-1),
                                  ir::Bool(false)}));
        return Reshape(c, g, m.sizes);
      }),
      {"indices"});
}

void RegisterMatmulAndConvolution(Registry* r) {
  Def(r, "aten.mm.default",
      ParamRule({{"self",
                  [](Ctx& c, ValueId g) -> Val {
                    ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
                    ASSIGN_OR_RETURN(ValueId mat2, Tensor(c, "mat2"));
                    return MmMat1Backward(c, g, self, mat2);
                  }},
                 {"mat2", [](Ctx& c, ValueId g) -> Val {
                    ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
                    ASSIGN_OR_RETURN(ValueId mat2, Tensor(c, "mat2"));
                    return MmMat2Backward(c, g, self, mat2);
                  }}}));
  Def(r, "aten.addmm.default",
      ParamRule({{"self", [](Ctx& c, ValueId g) { return MaybeMultiply(c, g, "beta"); }},
                 {"mat1",
                  [](Ctx& c, ValueId g) -> Val {
                    ASSIGN_OR_RETURN(ValueId mat1, Tensor(c, "mat1"));
                    ASSIGN_OR_RETURN(ValueId mat2, Tensor(c, "mat2"));
                    ASSIGN_OR_RETURN(ValueId p, MmMat1Backward(c, g, mat1, mat2));
                    return MaybeMultiply(c, p, "alpha");
                  }},
                 {"mat2", [](Ctx& c, ValueId g) -> Val {
                    ASSIGN_OR_RETURN(ValueId mat1, Tensor(c, "mat1"));
                    ASSIGN_OR_RETURN(ValueId mat2, Tensor(c, "mat2"));
                    ASSIGN_OR_RETURN(ValueId p, MmMat2Backward(c, g, mat1, mat2));
                    return MaybeMultiply(c, p, "alpha");
                  }}}));
  Def(r, "aten.bmm.default",
      ParamRule({{"self",
                  [](Ctx& c, ValueId g) -> Val {
                    ASSIGN_OR_RETURN(ValueId mat2, Tensor(c, "mat2"));
                    ASSIGN_OR_RETURN(
                        ValueId t, c.Op("aten.transpose.int", {Ref(mat2), ir::Int(1), ir::Int(2)}));
                    return c.Op("aten.bmm.default", {Ref(g), Ref(t)});
                  }},
                 {"mat2", [](Ctx& c, ValueId g) -> Val {
                    ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
                    ASSIGN_OR_RETURN(
                        ValueId t, c.Op("aten.transpose.int", {Ref(self), ir::Int(1), ir::Int(2)}));
                    return c.Op("aten.bmm.default", {Ref(t), Ref(g)});
                  }}}));
  Def(r, "aten.convolution.default", [](Ctx& c) -> absl::Status {
    if (c.grad_output(0) == kNoValue) return absl::OkStatus();
    const bool mask[3] = {c.NeedsGrad("input"), c.NeedsGrad("weight"), c.NeedsGrad("bias")};
    if (!mask[0] && !mask[1] && !mask[2]) return absl::OkStatus();
    Argument bias_sizes = ir::NoneArg();
    if (!c.call().IsNone("bias")) {
      ASSIGN_OR_RETURN(const ir::TensorMeta b, MetaOf(c, "bias"));
      bias_sizes = SizesArg(b.sizes);
    }
    ASSIGN_OR_RETURN(std::vector<ValueId> gs,
                     c.OpN("aten.convolution_backward.default",
                           {Ref(c.grad_output(0)), Arg(c, "input"), Arg(c, "weight"), bias_sizes,
                            Arg(c, "stride"), Arg(c, "padding"), Arg(c, "dilation"),
                            Arg(c, "transposed"), Arg(c, "output_padding"), Arg(c, "groups"),
                            Argument{"", std::vector<bool>{mask[0], mask[1], mask[2]}}}));
    const char* params[3] = {"input", "weight", "bias"};
    for (int i = 0; i < 3; ++i) {
      if (mask[i]) RETURN_IF_ERROR(SetReduced(c, params[i], gs[i]));
    }
    return absl::OkStatus();
  });
  Def(r, "aten.max_pool2d_with_indices.default", SelfRule([](Ctx& c, ValueId g) {
        return c.Op("aten.max_pool2d_with_indices_backward.default",
                    {Ref(g), Arg(c, "self"), Arg(c, "kernel_size"), Arg(c, "stride"),
                     Arg(c, "padding"), Arg(c, "dilation"), Arg(c, "ceil_mode"), Ref(c.output(1))});
      }));
  Def(r, "aten.avg_pool2d.default", SelfRule([](Ctx& c, ValueId g) {
        return c.Op(
            "aten.avg_pool2d_backward.default",
            {Ref(g), Arg(c, "self"), Arg(c, "kernel_size"), Arg(c, "stride"), Arg(c, "padding"),
             Arg(c, "ceil_mode"), Arg(c, "count_include_pad"), Arg(c, "divisor_override")});
      }));
  // embedding: the dense backward (sparse gradients are not supported).
  Def(r, "aten.embedding.default",
      [](Ctx& c) -> absl::Status {
        if (!c.NeedsGrad("weight") || c.grad_output(0) == kNoValue) return absl::OkStatus();
        ASSIGN_OR_RETURN(bool sparse, c.call().Bool("sparse"));
        if (sparse) {
          return absl::UnimplementedError(
              absl::StrCat("derivative of ", c.call().Where(), ": sparse gradients"));
        }
        ASSIGN_OR_RETURN(const ir::TensorMeta w, MetaOf(c, "weight"));
        ASSIGN_OR_RETURN(ValueId g,
                         c.Op("aten.embedding_dense_backward.default",
                              {Ref(c.grad_output(0)), Arg(c, "indices"), SymIntArg(w.sizes[0]),
                               Arg(c, "padding_idx"), Arg(c, "scale_grad_by_freq")}));
        return SetReduced(c, "weight", g);
      },
      {"indices"});
}

}  // namespace

void RegisterDerivatives(Registry* registry) {
  RegisterPointwise(registry);
  RegisterCopiesAndReductions(registry);
  RegisterNormalization(registry);
  RegisterViews(registry);
  RegisterMatmulAndConvolution(registry);
}

}  // namespace kiln::ops
