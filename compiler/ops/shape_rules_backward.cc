// Shape rules of the backward ops that derivative rules emit (activation,
// dropout, softmax, normalization, convolution, pooling, embedding and
// nll_loss backward); their registration.
#include <optional>
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

absl::StatusOr<Metas> BatchNormBackward(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* input, c.Meta("input"));
  ASSIGN_OR_RETURN(SymInt channels, Channels(c, *input));
  RETURN_IF_ERROR(BoolsArg(c, "output_mask").status());
  ASSIGN_OR_RETURN(const TensorMeta* weight, OptMeta(c, "weight"));
  const TensorMeta param = weight != nullptr ? NewTensor(weight->dtype, weight->sizes, *weight)
                                             : NewTensor(input->dtype, {channels}, *input);
  return Metas{NewTensor(input->dtype, input->sizes, *input), param, param};
}

// native_group_norm_backward: the input's gradient, and the weight's and
// the bias's of [C] (unrequested ones keep the metadata they would have).
absl::StatusOr<Metas> GroupNormBackward(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* grad, c.Meta("grad_out"));
  ASSIGN_OR_RETURN(const TensorMeta* input, c.Meta("input"));
  if (!SizesCompatible(grad->sizes, input->sizes)) {
    return ArgError(c, "grad_out",
                    absl::StrCat("has sizes ", SizesToString(grad->sizes), ", but 'input' has ",
                                 SizesToString(input->sizes)));
  }
  RETURN_IF_ERROR(BoolsArg(c, "output_mask").status());
  ASSIGN_OR_RETURN(std::vector<SymInt> channels, c.SymInts("C"));
  ASSIGN_OR_RETURN(const TensorMeta* weight, OptMeta(c, "weight"));
  const TensorMeta param = weight != nullptr ? NewTensor(weight->dtype, weight->sizes, *weight)
                                             : NewTensor(input->dtype, channels, *input);
  return Metas{NewTensor(input->dtype, input->sizes, *input), param, param};
}

// Backward ops whose result is shaped like one argument.
ShapeRule Like(std::string name) {
  return [name](const OpCall& c) -> absl::StatusOr<Metas> {
    ASSIGN_OR_RETURN(const TensorMeta* m, c.Meta(name));
    return Metas{NewTensor(m->dtype, m->sizes, *m)};
  };
}

// A pooling's backward: the gradient of `self`, in its layout.
absl::StatusOr<Metas> PoolBackward(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  return Metas{PoolOut(self->dtype, self->sizes, *self)};
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
  ASSIGN_OR_RETURN(const int64_t groups, c.Int("groups"));
  Metas out{NewTensor(input->dtype, input->sizes, *input),
            NewTensor(weight->dtype, weight->sizes, *weight),
            NewTensor(grad->dtype, std::move(bias_sizes), *grad)};
  // cuDNN's backward runs in the forward's layout (ATen makes the input and
  // the output gradient that layout first): both gradients come out in it.
  if (CudnnChannelsLast(*input, *weight, groups)) {
    out[0].strides = ChannelsLastStrides(out[0].sizes);
    out[1].strides = ChannelsLastStrides(out[1].sizes);
  }
  return out;
}

absl::StatusOr<Metas> EmbeddingDenseBackward(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* grad, c.Meta("grad_output"));
  ASSIGN_OR_RETURN(SymInt num_weights, SymIntArg(c, "num_weights"));
  if (Rank(*grad) == 0) {
    return ArgError(c, "grad_output", "should have the embedding dimension last, got a scalar");
  }
  return Metas{NewTensor(grad->dtype, {num_weights, grad->sizes.back()}, *grad)};
}

}  // namespace

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
  def("aten.native_group_norm_backward.default", kExpensive, GroupNormBackward);
  def("aten.native_batch_norm_backward.default", kReduction, BatchNormBackward,
      {"running_mean", "running_var"});
  def("aten.convolution_backward.default", kExpensive, ConvolutionBackward);
  def("aten.max_pool2d_with_indices_backward.default", kExpensive, PoolBackward, {"indices"});
  def("aten.avg_pool2d_backward.default", kExpensive, PoolBackward);
  def("aten.max_pool3d_with_indices_backward.default", kExpensive, PoolBackward, {"indices"});
  def("aten._adaptive_avg_pool2d_backward.default", kExpensive, PoolBackward);
  def("aten.avg_pool3d_backward.default", kExpensive, PoolBackward);
  def("aten._adaptive_avg_pool3d_backward.default", kExpensive, PoolBackward);
  def("aten.binary_cross_entropy_backward.default", kExpensive, Like("self"), {"weight"});
  def("aten.adaptive_max_pool2d_backward.default", kExpensive, PoolBackward, {"indices"});
  def("aten.embedding_dense_backward.default", kExpensive, EmbeddingDenseBackward, {"indices"});
  def("aten.nll_loss_backward.default", kNone, Like("self"), {"target", "weight", "total_weight"});
}

}  // namespace kiln::ops::shape_rules_internal
