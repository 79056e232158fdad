// What a derivative rule sees and emits with. The joint-graph pass
// (compiler/autograd/joint_graph.h) makes one DerivativeContext per forward
// node that needs gradients, in reverse topological order; the rule reads
// the node's arguments, outputs and output gradients, emits backward ops
// into the joint graph, and sets the gradient of each tensor input that needs
// one. Value ids are those of the joint graph.
//
// Not thread-safe (it writes into one GraphBuilder).
#ifndef KILN_COMPILER_OPS_DERIVATIVE_H_
#define KILN_COMPILER_OPS_DERIVATIVE_H_

#include <map>
#include <string>
#include <vector>

#include "compiler/ops/registry.h"

namespace kiln::ops {

class DerivativeContext {
 public:
  // `needs_grad(name)`: whether schema parameter `name` is a tensor (or
  // tensor list) input that needs a gradient.
  DerivativeContext(ir::GraphBuilder& builder, const Registry& registry, const OpCall& call,
                    std::vector<ir::ValueId> outputs, std::vector<ir::ValueId> grad_outputs,
                    std::function<bool(const std::string&)> needs_grad);

  const OpCall& call() const { return call_; }
  ir::ValueId output(int i) const { return outputs_[i]; }
  // ir::kNoValue when no gradient flows into output i.
  ir::ValueId grad_output(int i) const { return grad_outputs_[i]; }
  int num_outputs() const { return static_cast<int>(outputs_.size()); }
  // Valid only until the next emitted op (the builder's storage may move):
  // copy what must outlive an Op call.
  const ir::TensorMeta& meta(ir::ValueId v) const { return builder_.value(v).meta; }

  bool NeedsGrad(const std::string& param) const { return needs_grad_(param); }
  void SetGrad(const std::string& param, ir::ValueId grad) { grads_[param] = {grad}; }
  // For a Tensor[] parameter (cat, stack): one gradient per element.
  void SetGrads(const std::string& param, std::vector<ir::ValueId> grads) {
    grads_[param] = std::move(grads);
  }
  const std::map<std::string, std::vector<ir::ValueId>>& grads() const { return grads_; }

  // Emits a registry op; its outputs get metadata from the op's shape rule.
  absl::StatusOr<ir::ValueId> Op(const std::string& target, std::vector<ir::Argument> args,
                                 std::vector<ir::Argument> kwargs = {});
  absl::StatusOr<std::vector<ir::ValueId>> OpN(const std::string& target,
                                               std::vector<ir::Argument> args,
                                               std::vector<ir::Argument> kwargs = {});

  // Sums `grad` over the dimensions broadcasting added or expanded, so it
  // has `like`'s sizes (the reverse of broadcasting); casts to `like`'s
  // dtype when they differ. Returns `grad` itself when nothing is needed.
  absl::StatusOr<ir::ValueId> SumToSize(ir::ValueId grad, ir::TensorMeta like);
  // The grad_output of output i, or zeros shaped like output i when none
  // flows into it (multi-output ops whose other outputs carry gradients).
  absl::StatusOr<ir::ValueId> GradOrZeros(int i);

 private:
  ir::GraphBuilder& builder_;
  const Registry& registry_;
  const OpCall& call_;
  std::vector<ir::ValueId> outputs_;
  std::vector<ir::ValueId> grad_outputs_;
  std::function<bool(const std::string&)> needs_grad_;
  std::map<std::string, std::vector<ir::ValueId>> grads_;
};

}  // namespace kiln::ops

#endif  // KILN_COMPILER_OPS_DERIVATIVE_H_
