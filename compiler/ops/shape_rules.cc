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
//
// The rules live by op family in shape_rules_*.cc (see
// shape_rules_internal.h); this file holds the helpers they share and
// RegisterShapeRules, which registers the families in a fixed order.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_rules_internal.h"
#include "compiler/ops/shape_util.h"

namespace kiln::ops {
namespace shape_rules_internal {
namespace {

std::string ArgSubject(absl::string_view name) { return absl::StrCat("argument '", name, "'"); }

void SetDevice(TensorMeta* m, const TensorMeta& like) {
  m->device_type = like.device_type;
  m->device_index = like.device_index;
}

}  // namespace

// ---------------------------------------------------------------------------
// Errors and argument access.

absl::Status ArgError(const OpCall& c, absl::string_view name, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(c.Where(), ": argument '", name, "' ", what));
}

absl::Status Prefixed(const OpCall& c, absl::string_view subject, const absl::Status& s) {
  return absl::InvalidArgumentError(absl::StrCat(c.Where(), ": ", subject, ": ", s.message()));
}

absl::StatusOr<const TensorMeta*> OptMeta(const OpCall& c, const std::string& name) {
  if (c.IsNone(name)) return nullptr;
  return c.Meta(name);
}

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

TensorMeta CopyOf(const TensorMeta& like, v1::DType dtype) {
  TensorMeta m = NewTensor(dtype, like.sizes, like);
  m.strides = PreservedStrides(like);
  return m;
}

TensorMeta ElementwiseOut(v1::DType dtype, SymSizes sizes, const TensorMeta& first) {
  if (sizes == first.sizes) return CopyOf(first, dtype);
  return NewTensor(dtype, std::move(sizes), first);
}

bool CudnnChannelsLast(const TensorMeta& input, const TensorMeta& weight, int64_t groups) {
  return input.device_type == "cuda" && groups == 1 && Rank(input) == 4 &&
         input.dtype != v1::FLOAT64 && (IsChannelsLast(input) || IsChannelsLast(weight));
}

TensorMeta PoolOut(v1::DType dtype, const SymSizes& sizes, const TensorMeta& self) {
  TensorMeta out = NewTensor(dtype, sizes, self);
  if (IsChannelsLast(self)) out.strides = ChannelsLastStrides(sizes);
  return out;
}

TensorMeta ViewOf(const TensorMeta& base, SymSizes sizes, SymSizes strides, SymInt offset) {
  TensorMeta m;
  m.dtype = base.dtype;
  m.sizes = std::move(sizes);
  m.strides = std::move(strides);
  m.storage_offset = std::move(offset);
  SetDevice(&m, base);
  return m;
}

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
      if (Rank(like) == 4) return ChannelsLastStrides(like.sizes);
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

absl::StatusOr<ir::Device> DeviceArg(const OpCall& c, ir::Device fallback) {
  const ir::Argument* a = c.Find("device");
  if (a == nullptr || std::holds_alternative<ir::None>(a->kind)) return fallback;
  if (const auto* d = std::get_if<ir::Device>(&a->kind)) return *d;
  if (const auto* s = std::get_if<std::string>(&a->kind)) return ir::Device{*s, -1};
  return ArgError(c, "device", "should be a device");
}

ir::Device DeviceOf(const TensorMeta& m) { return ir::Device{m.device_type, m.device_index}; }
ir::Device Cpu() { return ir::Device{"cpu", -1}; }

absl::StatusOr<v1::DType> DTypeArg(const OpCall& c, v1::DType fallback) {
  ASSIGN_OR_RETURN(std::optional<v1::DType> d, c.DType("dtype"));
  return d.value_or(fallback);
}

v1::DType StatsDType(const TensorMeta& input) {
  return input.device_type == "cpu" ? input.dtype : ComputationDType(input.dtype);
}

}  // namespace shape_rules_internal

void RegisterShapeRules(Registry* registry) {
  shape_rules_internal::Definer def(registry);
  shape_rules_internal::RegisterPointwise(def);
  shape_rules_internal::RegisterReductions(def);
  shape_rules_internal::RegisterNormalization(def);
  shape_rules_internal::RegisterViews(def);
  shape_rules_internal::RegisterCreation(def);
  shape_rules_internal::RegisterExtern(def);
  shape_rules_internal::RegisterBackward(def);
}

}  // namespace kiln::ops
