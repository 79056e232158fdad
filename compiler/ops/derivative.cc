#include "compiler/ops/derivative.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kiln::ops {

DerivativeContext::DerivativeContext(ir::GraphBuilder& builder, const Registry& registry,
                                     const OpCall& call, std::vector<ir::ValueId> outputs,
                                     std::vector<ir::ValueId> grad_outputs,
                                     std::function<bool(const std::string&)> needs_grad)
    : builder_(builder),
      registry_(registry),
      call_(call),
      outputs_(std::move(outputs)),
      grad_outputs_(std::move(grad_outputs)),
      needs_grad_(std::move(needs_grad)) {}

absl::StatusOr<std::vector<ir::ValueId>> DerivativeContext::OpN(const std::string& target,
                                                                std::vector<ir::Argument> args,
                                                                std::vector<ir::Argument> kwargs) {
  // A value the graph computes already (the forward's mean under var's
  // derivative, a product two rules both take) is read, not computed again:
  // one reduction fewer, and the partitioner sees one value. Random draws
  // are never shared.
  const OpDef* def = registry_.Find(target);
  if (def != nullptr && !def->traits.random) {
    if (const ir::Node* same = builder_.FindNode(target, args, kwargs)) return same->outputs;
  }
  auto out = Emit(builder_, registry_, target, std::move(args), std::move(kwargs));
  if (!out.ok()) {
    return absl::Status(out.status().code(), absl::StrCat("derivative of ", call_.Where(), ": ",
                                                          out.status().message()));
  }
  return out;
}

absl::StatusOr<ir::ValueId> DerivativeContext::Op(const std::string& target,
                                                  std::vector<ir::Argument> args,
                                                  std::vector<ir::Argument> kwargs) {
  ASSIGN_OR_RETURN(std::vector<ir::ValueId> out, OpN(target, std::move(args), std::move(kwargs)));
  if (out.size() != 1) {
    return absl::InternalError(absl::StrCat("derivative of ", call_.Where(), ": ", target, " has ",
                                            out.size(), " outputs, expected 1"));
  }
  return out[0];
}

absl::StatusOr<ir::ValueId> DerivativeContext::SumToSize(ir::ValueId grad, ir::TensorMeta like) {
  const ir::TensorMeta g = meta(grad);
  const size_t lead = g.sizes.size() - std::min(g.sizes.size(), like.sizes.size());
  std::vector<int64_t> dims;
  for (size_t d = 0; d < lead; ++d) dims.push_back(static_cast<int64_t>(d));
  std::vector<int64_t> keep;  // dims of `like` that were broadcast from 1
  for (size_t d = 0; d < like.sizes.size(); ++d) {
    const ir::SymInt& want = like.sizes[d];
    const ir::SymInt& have = g.sizes[lead + d];
    if (want.is_constant() && want.constant() == 1 && !(have == want)) {
      keep.push_back(static_cast<int64_t>(lead + d));
    }
  }
  ir::ValueId out = grad;
  if (!keep.empty()) {
    ASSIGN_OR_RETURN(out,
                     Op("aten.sum.dim_IntList", {ir::Ref(out), ir::Ints(keep), ir::Bool(true)}));
  }
  if (!dims.empty()) {
    ASSIGN_OR_RETURN(out,
                     Op("aten.sum.dim_IntList", {ir::Ref(out), ir::Ints(dims), ir::Bool(false)}));
  }
  if (meta(out).dtype != like.dtype) {
    ASSIGN_OR_RETURN(out, Op("aten._to_copy.default", {ir::Ref(out)},
                             {ir::Kwarg("dtype", ir::Argument{"", like.dtype})}));
  }
  return out;
}

absl::StatusOr<ir::ValueId> DerivativeContext::GradOrZeros(int i) {
  if (grad_outputs_[i] != ir::kNoValue) return grad_outputs_[i];
  return Op("aten.zeros_like.default", {ir::Ref(outputs_[i])});
}

}  // namespace kiln::ops
