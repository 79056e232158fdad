// Shape rules of elementwise ops (unary and binary arithmetic, comparisons
// and logical ops, where, masked_fill), of copies (_to_copy, clone, copy,
// fill) and of the elementwise random ops; their registration.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_rules_internal.h"
#include "compiler/ops/shape_util.h"

namespace kiln::ops::shape_rules_internal {

absl::StatusOr<Metas> Elementwise::operator()(const OpCall& c) const {
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

absl::StatusOr<Metas> LikeSelf(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(v1::DType dtype, DTypeArg(c, self->dtype));
  ASSIGN_OR_RETURN(ir::Device device, DeviceArg(c, DeviceOf(*self)));
  ASSIGN_OR_RETURN(SymSizes strides, StridesFor(c, *self));
  TensorMeta m = NewTensorOn(dtype, self->sizes, device);
  m.strides = std::move(strides);
  return Metas{std::move(m)};
}

namespace {

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

absl::StatusOr<Metas> Clone(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  TensorMeta m = CopyOf(*self, self->dtype);
  if (c.Find("memory_format") != nullptr) {
    ASSIGN_OR_RETURN(m.strides, StridesFor(c, *self));
  }
  return Metas{std::move(m)};
}

}  // namespace

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
  // Draws shaped like self (VAE's reparameterization): self's values never
  // reach the result, so no gradient flows to it.
  def("aten.randn_like.default", kRandom, LikeSelf, {"self"});
  def("aten.rand_like.default", kRandom, LikeSelf, {"self"});
  def("aten.normal.Tensor_float", kRandom, Elementwise{{"mean"}, {}, Out::kFirst});
}

}  // namespace kiln::ops::shape_rules_internal
