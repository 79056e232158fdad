// Private to the op registry's shape rules (shape_rules*.cc): the argument
// access, error and output-metadata helpers the rule families share, the
// elementwise rule, the registration helpers, and one registration function
// per family. RegisterShapeRules (shape_rules.cc) calls the families in a
// fixed order.
//
//   shape_rules.cc            shared helpers, RegisterShapeRules
//   shape_rules_pointwise.cc  elementwise ops, copies
//   shape_rules_reductions.cc reductions, softmax, normalization, losses
//   shape_rules_views.cc      views and shape manipulation
//   shape_rules_creation.cc   factories
//   shape_rules_extern.cc     matmul, convolution, pooling, embedding, indexing
//   shape_rules_backward.cc   backward ops
//
// Pure functions; thread-safe.
#ifndef KILN_COMPILER_OPS_SHAPE_RULES_INTERNAL_H_
#define KILN_COMPILER_OPS_SHAPE_RULES_INTERNAL_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_util.h"

namespace kiln::ops::shape_rules_internal {

using ir::SymInt;
using ir::TensorMeta;
using Metas = std::vector<TensorMeta>;

// ---------------------------------------------------------------------------
// Errors and argument access.

absl::Status ArgError(const OpCall& c, absl::string_view name, absl::string_view what);

// A helper's error, prefixed with the node and what it was computing:
// "node 'add' (aten.add.Tensor): arguments 'self' and 'other': shapes ...".
absl::Status Prefixed(const OpCall& c, absl::string_view subject, const absl::Status& s);

template <typename T>
absl::StatusOr<T> At(const OpCall& c, absl::string_view subject, absl::StatusOr<T> v) {
  if (!v.ok()) return Prefixed(c, subject, v.status());
  return v;
}

// The metadata of an optional tensor argument; nullptr for None.
absl::StatusOr<const TensorMeta*> OptMeta(const OpCall& c, const std::string& name);

// An int or SymInt argument.
absl::StatusOr<SymInt> SymIntArg(const OpCall& c, const std::string& name);
absl::StatusOr<std::optional<SymInt>> OptSymIntArg(const OpCall& c, const std::string& name);
absl::StatusOr<std::vector<bool>> BoolsArg(const OpCall& c, const std::string& name);
absl::StatusOr<int64_t> DimArg(const OpCall& c, const std::string& name, int64_t rank);

int64_t Rank(const TensorMeta& m);
SymSizes StridesOf(const TensorMeta& m);

absl::Status ExpectRank(const OpCall& c, const std::string& name, const TensorMeta& m,
                        std::initializer_list<int64_t> ranks);

// Two sizes that must agree: an error when both are constants that differ.
// "argument 'mat2' has size[0] 7, but 'self' has size[1] 8".
absl::Status ExpectSameSize(const OpCall& c, const std::string& a_name, const TensorMeta& a,
                            int64_t a_dim, const std::string& b_name, const TensorMeta& b,
                            int64_t b_dim);

absl::Status ExpectSameDType(const OpCall& c, const std::string& a_name, const TensorMeta& a,
                             const std::string& b_name, const TensorMeta& b);

// Sizes that must agree where both are constants.
bool SizesCompatible(absl::Span<const SymInt> a, absl::Span<const SymInt> b);

// ---------------------------------------------------------------------------
// Output metadata.

// A new tensor with contiguous strides on `like`'s device.
TensorMeta NewTensor(v1::DType dtype, SymSizes sizes, const TensorMeta& like);
TensorMeta NewTensorOn(v1::DType dtype, SymSizes sizes, const ir::Device& device);

// A copy of `like` (its sizes, layout when dense, device) with `dtype`.
TensorMeta CopyOf(const TensorMeta& like, v1::DType dtype);

// The result of an elementwise op: `first`'s layout when it has the result's
// sizes and is dense, contiguous otherwise.
TensorMeta ElementwiseOut(v1::DType dtype, SymSizes sizes, const TensorMeta& first);

// Whether ATen's CUDA convolution of `input` by `weight`, and its backward,
// run channels-last: cuDNN's choice for 4-D tensors when either is
// channels-last (cudnn_conv_suggest_memory_format); their outputs are then
// channels-last. Claimed only for ungrouped convolutions (grouped ones may
// take ATen's depthwise kernels, which write contiguous outputs) on CUDA. A
// wrong claim costs a copy, not a result: the runtime gives an extern
// output the strides its metadata says.
bool CudnnChannelsLast(const TensorMeta& input, const TensorMeta& weight, int64_t groups);

// A pooling's output (or its backward's) of `sizes`: channels-last when
// `self` is (ATen pools in self.suggest_memory_format()), else contiguous.
TensorMeta PoolOut(v1::DType dtype, const SymSizes& sizes, const TensorMeta& self);

// A view of `base`.
TensorMeta ViewOf(const TensorMeta& base, SymSizes sizes, SymSizes strides, SymInt offset);

// Strides for a memory_format argument (None and preserve_format follow
// `like`).
absl::StatusOr<SymSizes> StridesFor(const OpCall& c, const TensorMeta& like);

// The `device` argument, or `fallback` when it is absent or None.
absl::StatusOr<ir::Device> DeviceArg(const OpCall& c, ir::Device fallback);

ir::Device DeviceOf(const TensorMeta& m);
ir::Device Cpu();

// The `dtype` argument, or `fallback`.
absl::StatusOr<v1::DType> DTypeArg(const OpCall& c, v1::DType fallback);

// The dtype of the statistics (mean, rstd) of normalizations: float32 for
// half-precision inputs, except on cpu where PyTorch keeps the input dtype.
v1::DType StatsDType(const TensorMeta& input);

// ---------------------------------------------------------------------------
// Rules more than one family uses.

enum class Out {
  kPromoted,    // torch.result_type of the promoted operands
  kIntToFloat,  // the same, ints and bools to the default float
  kRealOf,      // the same, complex to real (abs)
  kBool,        // comparisons and logical ops
  kFirst,       // the first tensor's dtype
};

// An elementwise op (shape_rules_pointwise.cc).
struct Elementwise {
  std::vector<std::string> tensors;   // broadcast together; the first gives the device
  std::vector<std::string> promoted;  // tensor or Scalar parameters; empty: `tensors`
  Out out = Out::kPromoted;

  absl::StatusOr<Metas> operator()(const OpCall& c) const;
};

// _to_copy and zeros_like, ones_like, empty_like, full_like: self's sizes,
// with the dtype, device and memory format the arguments ask for
// (shape_rules_pointwise.cc).
absl::StatusOr<Metas> LikeSelf(const OpCall& c);

// native_dropout (shape_rules_reductions.cc).
absl::StatusOr<Metas> NativeDropout(const OpCall& c);

// The channel count (size[1]) of an [N, C, ...] input
// (shape_rules_reductions.cc).
absl::StatusOr<SymInt> Channels(const OpCall& c, const TensorMeta& input);

// detach, alias: a view of all of self (shape_rules_views.cc).
absl::StatusOr<Metas> Alias(const OpCall& c);

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

// One per family, in the order RegisterShapeRules calls them.
void RegisterPointwise(Definer& def);      // shape_rules_pointwise.cc
void RegisterReductions(Definer& def);     // shape_rules_reductions.cc
void RegisterNormalization(Definer& def);  // shape_rules_reductions.cc
void RegisterViews(Definer& def);          // shape_rules_views.cc
void RegisterCreation(Definer& def);       // shape_rules_creation.cc
void RegisterExtern(Definer& def);         // shape_rules_extern.cc
void RegisterBackward(Definer& def);       // shape_rules_backward.cc

}  // namespace kiln::ops::shape_rules_internal

#endif  // KILN_COMPILER_OPS_SHAPE_RULES_INTERNAL_H_
