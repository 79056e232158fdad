// Shape rules of the creation ops (full, zeros, ones, empty, empty_strided,
// scalar_tensor, the *_like factories, new_zeros, arange); their
// registration.
#include <cmath>
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

}  // namespace

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

}  // namespace kiln::ops::shape_rules_internal
