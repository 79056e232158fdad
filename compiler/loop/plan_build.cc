// Pass "plan" (plan_build.h): the execution plan of a fused graph.
#include "compiler/loop/plan_build.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"

namespace kiln::loop {

LoweredGraph BuildPlan(const ir::Graph& g, FusedGraph fused) {
  LoweredGraph out;
  out.kernels = std::move(fused.kernels);
  out.decisions = std::move(fused.decisions);
  v1::ExecutionPlan& plan = out.plan;
  // Symbols: bound from the first input dimension that is one alone. A
  // dimension that is an expression ("16*s0") binds nothing; the runtime
  // checks it against the bound symbols.
  auto is_symbol = [](const std::string& e) {
    return !e.empty() && !absl::ascii_isdigit(e[0]) && std::all_of(e.begin(), e.end(), [](char c) {
      return absl::ascii_isalnum(c) || c == '_';
    });
  };
  std::set<std::string> seen;
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const ir::Value& v = g.value(g.inputs()[i].value);
    for (size_t d = 0; d < v.meta.sizes.size(); ++d) {
      const ir::SymInt& s = v.meta.sizes[d];
      if (s.is_constant() || !is_symbol(s.expr()) || seen.count(s.expr())) continue;
      seen.insert(s.expr());
      auto* b = plan.add_symbols();
      b->set_symbol(s.expr());
      b->set_input(static_cast<int>(i));
      b->set_dim(static_cast<int>(d));
      out.symbols.push_back(s.expr());
    }
  }
  // The inputs' metadata, as the graph promised them; extern nodes in wire
  // form, naming plan values.
  const v1::Graph graph_proto = g.ToProto();
  for (const v1::Placeholder& in : graph_proto.inputs()) *plan.add_inputs() = in;

  auto add_alloc = [&](ir::ValueId v) {
    const ir::TensorMeta& m = g.value(v).meta;
    auto* a = plan.add_steps()->mutable_alloc();
    a->set_value(g.value(v).name);
    a->set_dtype(m.dtype);
    for (const auto& s : m.sizes) *a->add_sizes() = ir::SymIntToProto(s);
    for (const auto& s : m.strides) *a->add_strides() = ir::SymIntToProto(s);
    a->mutable_device()->set_type(m.device_type.empty() ? "cpu" : m.device_type);
    a->mutable_device()->set_index(m.device_index);
    if (fused.zeroed.count(v)) a->set_zero(true);
  };
  std::set<std::string> materialized;
  for (const auto& in : g.inputs()) materialized.insert(g.value(in.value).name);
  // A view needed as a tensor (by an extern or as an output) is made with a
  // View step over its root.
  auto ensure_view = [&](ir::ValueId v) {
    const std::string& name = g.value(v).name;
    if (materialized.count(name)) return;
    auto root = fused.view_root.find(v);
    if (root == fused.view_root.end()) return;
    const ir::TensorMeta& m = g.value(v).meta;
    auto* view = plan.add_steps()->mutable_view();
    view->set_value(name);
    view->set_base(g.value(root->second).name);
    for (const auto& s : m.sizes) *view->add_sizes() = ir::SymIntToProto(s);
    for (const auto& s : m.strides) *view->add_strides() = ir::SymIntToProto(s);
    *view->mutable_storage_offset() = ir::SymIntToProto(m.storage_offset);
    materialized.insert(name);
  };
  for (const FusedGraph::Step& step : fused.steps) {
    if (step.kernel >= 0) {
      const Kernel& k = out.kernels[step.kernel];
      for (const KernelBuffer& b : k.buffers) {
        if (!b.written || materialized.count(b.value)) continue;
        for (ir::ValueId v : fused.computed[step.kernel]) {
          if (g.value(v).name == b.value) add_alloc(v);
        }
        materialized.insert(b.value);
      }
      auto* launch = plan.add_steps()->mutable_launch();
      launch->set_module(0);
      launch->set_symbol(k.name);
      for (const KernelBuffer& b : k.buffers) launch->add_buffers(b.value);
    } else {
      const ir::Node& node = g.nodes()[step.node];
      for (ir::ValueId v : ir::Graph::Operands(node)) ensure_view(v);
      *plan.add_steps()->mutable_extern_call()->mutable_node() = graph_proto.nodes(step.node);
      for (ir::ValueId v : node.outputs) materialized.insert(g.value(v).name);
    }
  }
  for (ir::ValueId v : g.outputs()) {
    ensure_view(v);
    plan.add_outputs(g.value(v).name);
  }
  plan.set_kernels(static_cast<int>(out.kernels.size()));
  return out;
}

}  // namespace kiln::loop
