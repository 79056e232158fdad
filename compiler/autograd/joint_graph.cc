#include "compiler/autograd/joint_graph.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/dead_code.h"
#include "compiler/ops/derivative.h"
#include "compiler/ops/shape_util.h"

namespace kiln::autograd {
namespace {

using ir::kNoValue;
using ir::ValueId;

bool IsFloating(v1::DType t) {
  return t == v1::FLOAT32 || t == v1::FLOAT64 || t == v1::FLOAT16 || t == v1::BFLOAT16 ||
         t == v1::COMPLEX64 || t == v1::COMPLEX128;
}

// The forward value ids a schema parameter binds, by parameter name.
std::vector<ValueId> ParamValues(const ir::Argument* a) {
  if (a == nullptr) return {};
  if (const auto* id = std::get_if<ValueId>(&a->kind)) return {*id};
  if (const auto* ids = std::get_if<std::vector<ValueId>>(&a->kind)) return *ids;
  return {};
}

}  // namespace

absl::StatusOr<JointGraph> BuildJointGraph(const ir::Graph& fwd, const JointOptions& options,
                                           const ops::Registry& registry) {
  JointGraph jg;
  const int n_in = static_cast<int>(fwd.inputs().size());
  const int n_out = static_cast<int>(fwd.outputs().size());
  if (!options.inputs_need_grad.empty() &&
      static_cast<int>(options.inputs_need_grad.size()) != n_in) {
    return absl::InvalidArgumentError(absl::StrCat("inputs_need_grad has ",
                                                   options.inputs_need_grad.size(), " entries for ",
                                                   n_in, " inputs"));
  }
  if (!options.outputs_receive_grad.empty() &&
      static_cast<int>(options.outputs_receive_grad.size()) != n_out) {
    return absl::InvalidArgumentError(absl::StrCat("outputs_receive_grad has ",
                                                   options.outputs_receive_grad.size(),
                                                   " entries for ", n_out, " outputs"));
  }

  // Which forward values carry gradients: inputs that need them, and node
  // outputs of floating type computed from such values through
  // differentiable parameters.
  std::vector<bool> req(fwd.values().size(), false);
  for (int i = 0; i < n_in; ++i) {
    const ir::Value& v = fwd.value(fwd.inputs()[i].value);
    bool need =
        options.inputs_need_grad.empty() ? v.meta.requires_grad : options.inputs_need_grad[i];
    need = need && IsFloating(v.meta.dtype);
    jg.inputs_need_grad.push_back(need);
    req[fwd.inputs()[i].value] = need;
  }
  for (const ir::Node& node : fwd.nodes()) {
    const ops::OpDef* def = registry.Find(node.target);
    bool any = false;
    for (size_t k = 0; k < node.args.size() + node.kwargs.size(); ++k) {
      const ir::Argument& a =
          k < node.args.size() ? node.args[k] : node.kwargs[k - node.args.size()];
      std::string param = a.name;
      if (param.empty() && def != nullptr) {
        const ir::OpSchema* schema = ir::FindSchema(node.target);
        if (schema != nullptr && k < schema->params.size()) param = schema->params[k].name;
      }
      if (def != nullptr &&
          std::count(def->nondifferentiable.begin(), def->nondifferentiable.end(), param)) {
        continue;
      }
      for (ValueId id : ParamValues(&a)) any = any || (id != kNoValue && req[id]);
    }
    for (ValueId id : node.outputs) req[id] = any && IsFloating(fwd.value(id).meta.dtype);
  }

  ir::GraphBuilder b(absl::StrCat(fwd.name(), "_joint"));
  std::vector<ValueId> map = b.CopyInputs(fwd);
  // The forward nodes, then the arguments each was copied with (derivative
  // rules bind them).
  for (const ir::Node& node : fwd.nodes()) {
    b.CopyNode(fwd, node, &map);
    jg.forward_nodes.insert(b.nodes().back().name);
  }

  // Tangents, and the gradient accumulated so far for each forward value.
  std::vector<ValueId> grad(fwd.values().size(), kNoValue);
  auto accumulate = [&](ValueId fwd_value, ValueId g) -> absl::Status {
    if (g == kNoValue || !req[fwd_value]) return absl::OkStatus();
    if (grad[fwd_value] == kNoValue) {
      grad[fwd_value] = g;
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(std::vector<ValueId> sum, ops::Emit(b, registry, "aten.add.Tensor",
                                                         {ir::Ref(grad[fwd_value]), ir::Ref(g)}));
    grad[fwd_value] = sum[0];
    return absl::OkStatus();
  };
  for (int i = 0; i < n_out; ++i) {
    const ValueId out = fwd.outputs()[i];
    bool receives =
        options.outputs_receive_grad.empty() ? req[out] : options.outputs_receive_grad[i];
    receives = receives && req[out];
    jg.outputs_receive_grad.push_back(receives);
    if (!receives) continue;
    // Tangents arrive contiguous, whatever the layout of their output.
    ir::TensorMeta tangent = fwd.value(out).meta;
    tangent.strides = ops::ContiguousStrides(tangent.sizes);
    tangent.storage_offset = ir::SymInt{int64_t{0}};
    tangent.requires_grad = false;
    ValueId t = b.AddInput(tangent, v1::Placeholder::USER_INPUT, absl::StrCat("tangent_", i));
    ++jg.num_tangents;
    RETURN_IF_ERROR(accumulate(out, t));
  }

  // Backward, in reverse topological order.
  for (int i = static_cast<int>(fwd.nodes().size()) - 1; i >= 0; --i) {
    const ir::Node& node = fwd.nodes()[i];
    bool flows = false;
    for (ValueId id : node.outputs) flows = flows || grad[id] != kNoValue;
    if (!flows) continue;
    const ops::OpDef* def = registry.Find(node.target);
    if (def == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("node '", node.name, "': ", node.target,
                       " is not in the op registry, and a gradient must flow through it"));
    }
    if (!def->derivative) {
      return absl::InvalidArgumentError(absl::StrCat("node '", node.name, "': ", node.target,
                                                     " has no derivative rule, and a gradient "
                                                     "must flow through it"));
    }
    auto meta_of = [&b](ValueId v) -> const ir::TensorMeta& { return b.value(v).meta; };
    const ir::Node& copy = b.nodes()[i];  // forward node i, copied first and in order
    auto call = ops::OpCall::Bind(node.target, copy.args, copy.kwargs, meta_of);
    if (!call.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("node '", node.name, "': ", call.status().message()));
    }
    call->set_node_name(node.name);
    // The forward values each parameter binds (for accumulation).
    auto fwd_call =
        ops::OpCall::Bind(node.target, node.args, node.kwargs,
                          [&fwd](ValueId v) -> const ir::TensorMeta& { return fwd.value(v).meta; });
    if (!fwd_call.ok()) return fwd_call.status();
    auto needs_grad = [&](const std::string& param) {
      if (std::count(def->nondifferentiable.begin(), def->nondifferentiable.end(), param))
        return false;
      for (ValueId id : ParamValues(fwd_call->Find(param))) {
        if (id != kNoValue && req[id]) return true;
      }
      return false;
    };
    std::vector<ValueId> outs, grads;
    for (ValueId id : node.outputs) {
      outs.push_back(map[id]);
      grads.push_back(grad[id]);
    }
    ops::DerivativeContext ctx(b, registry, *call, outs, grads, needs_grad);
    RETURN_IF_ERROR(def->derivative(ctx));
    for (const auto& [param, gs] : ctx.grads()) {
      std::vector<ValueId> targets = ParamValues(fwd_call->Find(param));
      if (targets.size() != gs.size()) {
        return absl::InternalError(absl::StrCat("derivative of ", call->Where(), " gave ",
                                                gs.size(), " gradients for '", param,
                                                "', which binds ", targets.size(), " tensors"));
      }
      for (size_t k = 0; k < gs.size(); ++k) {
        if (targets[k] != kNoValue) RETURN_IF_ERROR(accumulate(targets[k], gs[k]));
      }
    }
  }

  for (ValueId out : fwd.outputs()) b.AddOutput(map[out]);
  jg.num_forward_outputs = n_out;
  jg.num_primals = n_in;
  int next = n_out;
  for (int i = 0; i < n_in; ++i) {
    const ValueId in = fwd.inputs()[i].value;
    if (jg.inputs_need_grad[i] && grad[in] != kNoValue) {
      b.AddOutput(grad[in]);
      jg.grad_output_index.push_back(next++);
    } else {
      jg.grad_output_index.push_back(-1);
    }
  }
  jg.graph = std::move(b).Build();
  ir::EliminateDeadCode(&jg.graph);
  return jg;
}

}  // namespace kiln::autograd
