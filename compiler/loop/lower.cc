// Pass "lower": each node classified as a view, a pointwise expression, a
// reduction or an extern call, its arguments bound (lower.h).
#include "compiler/loop/lower.h"

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "compiler/loop/fuse_internal.h"
#include "compiler/ops/shape_util.h"

namespace kiln::loop {
namespace {

using fuse_internal::SupportedDType;

bool IsReduction(const std::string& target) {
  static const std::set<std::string> kReductions = {"aten.sum.dim_IntList",
                                                    "aten.sum.default",
                                                    "aten.mean.dim",
                                                    "aten.mean.default",
                                                    "aten.amax.default",
                                                    "aten.amin.default",
                                                    "aten.var.correction",
                                                    "aten._softmax.default",
                                                    "aten._log_softmax.default",
                                                    "aten._softmax_backward_data.default",
                                                    "aten._log_softmax_backward_data.default",
                                                    "aten.native_layer_norm.default"};
  return kReductions.count(target) > 0;
}

absl::StatusOr<ops::OpCall> BindNode(const ir::Graph& g, const ir::Node& node) {
  auto meta_of = [&g](ir::ValueId v) -> const ir::TensorMeta& { return g.value(v).meta; };
  ASSIGN_OR_RETURN(ops::OpCall call,
                   ops::OpCall::Bind(node.target, node.args, node.kwargs, meta_of));
  call.set_node_name(node.name);
  return call;
}

// A reduction node's input and dimensions; `out->why` says why it has no
// lowering instead (its kind stays kExtern).
absl::Status LowerReduction(const ir::Graph& g, const ir::Node& node, NodeLowering* out) {
  ASSIGN_OR_RETURN(ops::OpCall call, BindNode(g, node));
  const bool softmax_backward = node.target == "aten._softmax_backward_data.default" ||
                                node.target == "aten._log_softmax_backward_data.default";
  // The tensor whose rows the node reduces (a softmax's backward sums the
  // gradient over its output's rows).
  ASSIGN_OR_RETURN(ir::ValueId input,
                   call.Tensor(node.target == "aten.native_layer_norm.default" ? "input"
                               : softmax_backward                              ? "output"
                                                                               : "self"));
  const ir::TensorMeta& in = g.value(input).meta;
  const int rank = static_cast<int>(in.sizes.size());
  if (rank == 0) {
    out->why = "it reduces a 0-d tensor";
    return absl::OkStatus();
  }
  if (!SupportedDType(in.dtype) || !ops::IsFloating(in.dtype)) {
    out->why = absl::StrCat("its input has dtype ", v1::DType_Name(in.dtype));
    return absl::OkStatus();
  }
  for (ir::ValueId o : node.outputs) {
    if (!SupportedDType(g.value(o).meta.dtype)) {
      out->why = absl::StrCat("its output '", g.value(o).name, "' has dtype ",
                              v1::DType_Name(g.value(o).meta.dtype));
      return absl::OkStatus();
    }
  }
  std::vector<int> dims;
  bool keepdim = false;
  auto all_dims = [&] {
    std::vector<int> d(rank);
    for (int i = 0; i < rank; ++i) d[i] = i;
    return d;
  };
  if (node.target == "aten.sum.default" || node.target == "aten.mean.default") {
    dims = all_dims();
  } else if (node.target == "aten._softmax.default" || node.target == "aten._log_softmax.default" ||
             softmax_backward) {
    if (softmax_backward) {
      ASSIGN_OR_RETURN(ir::ValueId grad, call.Tensor("grad_output"));
      const ir::TensorMeta& gm = g.value(grad).meta;
      if (!SupportedDType(gm.dtype) || !ops::IsFloating(gm.dtype)) {
        out->why = absl::StrCat("its grad_output has dtype ", v1::DType_Name(gm.dtype));
        return absl::OkStatus();
      }
      if (gm.sizes != in.sizes) {
        out->why = "its grad_output and output differ in shape";
        return absl::OkStatus();
      }
    }
    ASSIGN_OR_RETURN(int64_t d, call.Int("dim"));
    ASSIGN_OR_RETURN(int64_t w, ops::WrapDim(d, rank));
    dims = {static_cast<int>(w)};
  } else if (node.target == "aten.native_layer_norm.default") {
    ASSIGN_OR_RETURN(std::vector<ir::SymInt> shape, call.SymInts("normalized_shape"));
    for (int i = rank - static_cast<int>(shape.size()); i < rank; ++i) dims.push_back(i);
  } else {
    const ir::Argument* dim = call.Find("dim");
    std::vector<int64_t> listed;
    if (dim != nullptr && !std::holds_alternative<ir::None>(dim->kind)) {
      ASSIGN_OR_RETURN(listed, call.Ints("dim"));
    }
    if (listed.empty()) {
      dims = all_dims();
    } else {
      for (int64_t d : listed) {
        ASSIGN_OR_RETURN(int64_t w, ops::WrapDim(d, rank));
        dims.push_back(static_cast<int>(w));
      }
      std::sort(dims.begin(), dims.end());
      dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
    }
    if (call.Find("keepdim") != nullptr) {
      ASSIGN_OR_RETURN(keepdim, call.Bool("keepdim"));
    }
  }
  if (node.target == "aten.sum.dim_IntList" && !call.IsNone("dtype")) {
    out->why = "it accumulates in a dtype of its own";
    return absl::OkStatus();
  }
  out->kind = NodeKind::kReduction;
  out->call = std::move(call);
  out->input = input;
  out->dims = std::move(dims);
  out->keepdim = keepdim;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<NodeLowering>> LowerNodes(const ir::Graph& g,
                                                     const ops::Registry& registry) {
  std::vector<NodeLowering> out(g.nodes().size());
  // The device of the graph's inputs, when they share one: a creation op
  // elsewhere (a CPU scalar beside CUDA tensors) runs through ATen, since
  // its tensor is not where the kernels run.
  std::optional<ir::TensorMeta> device;
  bool mixed = false;
  auto same_device = [](const ir::TensorMeta& a, const ir::TensorMeta& b) {
    auto type = [](const ir::TensorMeta& m) {
      return m.device_type.empty() ? std::string("cpu") : m.device_type;
    };
    return type(a) == type(b) &&
           (a.device_index < 0 || b.device_index < 0 || a.device_index == b.device_index);
  };
  for (const ir::Input& in : g.inputs()) {
    const ir::TensorMeta& m = g.value(in.value).meta;
    if (!device) device = m;
    mixed = mixed || !same_device(*device, m);
  }
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const ir::Node& node = g.nodes()[i];
    NodeLowering& l = out[i];
    const ops::OpDef* def = registry.Find(node.target);
    if (def != nullptr && def->traits.view && !node.outputs.empty() &&
        !ir::Graph::Operands(node).empty() && ir::Graph::Operands(node)[0] != ir::kNoValue) {
      l.kind = NodeKind::kView;
      continue;
    }
    if (fuse_internal::PointwiseRules().count(node.target) > 0) {
      const ir::TensorMeta* first = node.outputs.empty() ? nullptr : &g.value(node.outputs[0]).meta;
      if (def != nullptr && def->traits.creation && first != nullptr &&
          (!device || mixed || !same_device(*device, *first))) {
        l.why = "it creates a tensor on another device than the graph's inputs";
      } else if (node.outputs.size() != 1) {
        l.why = "it has more than one output";
      } else if (const v1::DType t = g.value(node.outputs[0]).meta.dtype; !SupportedDType(t)) {
        l.why = absl::StrCat("its output has dtype ", v1::DType_Name(t));
      } else {
        ASSIGN_OR_RETURN(l.call, BindNode(g, node));
        l.kind = NodeKind::kPointwise;
      }
      continue;
    }
    if (IsReduction(node.target)) {
      RETURN_IF_ERROR(LowerReduction(g, node, &l));
      continue;
    }
    if (fuse_internal::IsGather(node.target)) {
      RETURN_IF_ERROR(fuse_internal::LowerGather(g, node, &l));
      continue;
    }
    if (fuse_internal::IsScatter(node.target)) {
      RETURN_IF_ERROR(fuse_internal::LowerScatter(g, node, &l));
      continue;
    }
    l.why = "no loop lowering";
  }
  return out;
}

std::string PrintNodeLowerings(const ir::Graph& g, const std::vector<NodeLowering>& nodes) {
  std::string out;
  for (size_t i = 0; i < nodes.size() && i < g.nodes().size(); ++i) {
    const ir::Node& node = g.nodes()[i];
    const NodeLowering& l = nodes[i];
    absl::StrAppend(&out, node.name, " = ", node.target, ": ");
    switch (l.kind) {
      case NodeKind::kView:
        absl::StrAppend(&out, "view of '", g.value(ir::Graph::Operands(node)[0]).name, "'");
        break;
      case NodeKind::kPointwise:
        absl::StrAppend(&out, "pointwise over ",
                        ops::SizesToString(g.value(node.outputs[0]).meta.sizes));
        break;
      case NodeKind::kReduction:
        absl::StrAppend(&out, "reduction of '", g.value(l.input).name, "' ",
                        ops::SizesToString(g.value(l.input).meta.sizes), " over dims [",
                        absl::StrJoin(l.dims, ", "), "]", l.keepdim ? " (kept)" : "");
        break;
      case NodeKind::kGather:
        absl::StrAppend(&out, "gather from '", g.value(l.gather.source).name, "' over ",
                        ops::SizesToString(g.value(node.outputs[0]).meta.sizes));
        break;
      case NodeKind::kScatter:
        absl::StrAppend(&out, "scatter-add of '", g.value(l.values).name, "' over ",
                        ops::SizesToString(l.space));
        break;
      case NodeKind::kExtern:
        absl::StrAppend(&out, "extern (", l.why, ")");
        break;
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace kiln::loop
