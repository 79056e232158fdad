// The execution plan: the graph's inputs and the symbols they bind, a launch
// per kernel, an extern call per node left to ATen, and a view step where a
// view is needed as a tensor; then the memory plan: every value freed after
// its last reader, an allocation reusing freed storage of its dtype and size.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "compiler/loop/lowering_internal.h"

namespace kiln::loop::lowering_internal {
namespace {

std::optional<int64_t> ConstantNumel(const google::protobuf::RepeatedPtrField<v1::SymInt>& sizes) {
  int64_t n = 1;
  for (const auto& s : sizes) {
    if (s.value_case() != v1::SymInt::kIntValue) return std::nullopt;
    n *= s.int_value();
  }
  return n;
}

}  // namespace

void Lowerer::BuildPlan(LoweredGraph* out) {
  v1::ExecutionPlan& plan = out->plan;
  // Symbols: bound from the first input dimension that is one alone. A
  // dimension that is an expression ("16*s0") binds nothing; the runtime
  // checks it against the bound symbols.
  auto is_symbol = [](const std::string& e) {
    return !e.empty() && !absl::ascii_isdigit(e[0]) && std::all_of(e.begin(), e.end(), [](char c) {
      return absl::ascii_isalnum(c) || c == '_';
    });
  };
  std::set<std::string> seen;
  for (size_t i = 0; i < g_.inputs().size(); ++i) {
    const ir::Value& v = g_.value(g_.inputs()[i].value);
    auto* ph = plan.add_inputs();
    ph->set_kind(g_.inputs()[i].kind);
    ph->mutable_value()->set_name(v.name);
    for (size_t d = 0; d < v.meta.sizes.size(); ++d) {
      const SymInt& s = v.meta.sizes[d];
      if (s.is_constant() || !is_symbol(s.expr()) || seen.count(s.expr())) continue;
      seen.insert(s.expr());
      auto* b = plan.add_symbols();
      b->set_symbol(s.expr());
      b->set_input(static_cast<int>(i));
      b->set_dim(static_cast<int>(d));
      out->symbols.push_back(s.expr());
    }
  }
  // Metadata of the inputs, as the graph promised them; extern nodes in
  // wire form, naming plan values.
  const v1::Graph graph_proto = g_.ToProto();
  for (int i = 0; i < plan.inputs_size(); ++i) *plan.mutable_inputs(i) = graph_proto.inputs(i);

  // Which values each step reads, to free buffers after their last use.
  auto add_alloc = [&](ValueId v) {
    const ir::TensorMeta& m = g_.value(v).meta;
    auto* a = plan.add_steps()->mutable_alloc();
    a->set_value(g_.value(v).name);
    a->set_dtype(m.dtype);
    for (const auto& s : m.sizes) *a->add_sizes() = ir::SymIntToProto(s);
    for (const auto& s : m.strides) *a->add_strides() = ir::SymIntToProto(s);
    a->mutable_device()->set_type(m.device_type.empty() ? "cpu" : m.device_type);
    a->mutable_device()->set_index(m.device_index);
  };
  std::set<std::string> materialized;
  for (const auto& in : g_.inputs()) materialized.insert(g_.value(in.value).name);
  // A view needed as a tensor (by an extern or as an output) is made with a
  // View step over its root.
  auto ensure_view = [&](ValueId v) {
    const std::string& name = g_.value(v).name;
    if (materialized.count(name)) return;
    auto a = alias_.find(v);
    if (a == alias_.end()) return;
    const ir::TensorMeta& m = g_.value(v).meta;
    auto* view = plan.add_steps()->mutable_view();
    view->set_value(name);
    view->set_base(g_.value(a->second.root).name);
    for (const auto& s : m.sizes) *view->add_sizes() = ir::SymIntToProto(s);
    for (const auto& s : m.strides) *view->add_strides() = ir::SymIntToProto(s);
    *view->mutable_storage_offset() = ir::SymIntToProto(m.storage_offset);
    materialized.insert(name);
  };
  int kernel_index = 0;
  for (const Item& item : items_) {
    if (item.kind == Item::kGroup) {
      const Kernel& k = out->kernels[kernel_index++];
      for (const KernelBuffer& b : k.buffers) {
        if (!b.written || materialized.count(b.value)) continue;
        for (const auto& [v, gi] : group_of_) {
          if (gi == item.group && g_.value(v).name == b.value) add_alloc(v);
        }
        materialized.insert(b.value);
      }
      auto* launch = plan.add_steps()->mutable_launch();
      launch->set_module(0);
      launch->set_symbol(k.name);
      for (const KernelBuffer& b : k.buffers) launch->add_buffers(b.value);
    } else {
      const ir::Node& node = g_.nodes()[item.node];
      for (ValueId v : ir::Graph::Operands(node)) ensure_view(v);
      auto* ext = plan.add_steps()->mutable_extern_call();
      *ext->mutable_node() = graph_proto.nodes(item.node);
      for (ValueId v : node.outputs) materialized.insert(g_.value(v).name);
    }
  }
  for (ValueId v : g_.outputs()) {
    ensure_view(v);
    plan.add_outputs(g_.value(v).name);
  }
  plan.set_kernels(static_cast<int>(out->kernels.size()));

  // Memory planning: free each allocated value after its last reader;
  // allocations reuse freed storage of the same dtype and constant size.
  std::map<std::string, int> last_use;
  std::set<std::string> outputs(plan.outputs().begin(), plan.outputs().end());
  auto note = [&](const std::string& name, int step) { last_use[name] = step; };
  std::map<std::string, std::string> root_of;  // view -> root
  for (int i = 0; i < plan.steps_size(); ++i) {
    const v1::PlanStep& s = plan.steps(i);
    if (s.has_launch())
      for (const auto& b : s.launch().buffers()) note(b, i);
    if (s.has_view()) {
      note(s.view().base(), i);
      root_of[s.view().value()] = s.view().base();
    }
    if (s.has_extern_call()) {
      for (const auto& a : s.extern_call().node().args()) {
        if (a.has_tensor()) note(a.tensor(), i);
        if (a.has_tensors())
          for (const auto& n : a.tensors().names())
            if (!n.empty()) note(n, i);
      }
      for (const auto& a : s.extern_call().node().kwargs()) {
        if (a.has_tensor()) note(a.tensor(), i);
      }
    }
  }
  // A view keeps its root alive.
  for (const auto& [view, root] : root_of) {
    if (last_use.count(view)) last_use[root] = std::max(last_use[root], last_use[view]);
    if (outputs.count(view)) outputs.insert(root);
  }
  // Every value a step defines (allocations, views, extern results) is
  // dropped after its last reader, so that nothing keeps a dead buffer's
  // storage alive and a later allocation can take it over.
  std::map<int, std::vector<std::string>> frees;
  auto free_after_last_use = [&](const std::string& name, int defined_at) {
    if (outputs.count(name)) return;
    auto it = last_use.find(name);
    frees[it == last_use.end() ? defined_at : it->second].push_back(name);
  };
  for (int i = 0; i < plan.steps_size(); ++i) {
    const v1::PlanStep& s = plan.steps(i);
    if (s.has_alloc()) free_after_last_use(s.alloc().value(), i);
    if (s.has_view()) free_after_last_use(s.view().value(), i);
    if (s.has_extern_call()) {
      for (const auto& o : s.extern_call().node().outputs()) free_after_last_use(o.name(), i);
    }
  }
  v1::ExecutionPlan planned = plan;
  planned.clear_steps();
  std::vector<std::pair<std::string, const v1::PlanStep::Alloc*>> dead;  // freed, reusable
  std::map<std::string, const v1::PlanStep::Alloc*> allocs;
  for (int i = 0; i < plan.steps_size(); ++i) {
    v1::PlanStep step = plan.steps(i);
    if (step.has_alloc()) {
      allocs[step.alloc().value()] = &plan.steps(i).alloc();
      const std::optional<int64_t> want = ConstantNumel(step.alloc().sizes());
      for (auto it = dead.begin(); want.has_value() && it != dead.end(); ++it) {
        const std::optional<int64_t> have = ConstantNumel(it->second->sizes());
        if (have.has_value() && it->second->dtype() == step.alloc().dtype() && *have >= *want) {
          step.mutable_alloc()->set_reuse(it->first);
          dead.erase(it);
          break;
        }
      }
    }
    *planned.add_steps() = step;
    for (const std::string& name : frees[i]) {
      planned.add_steps()->mutable_free()->set_value(name);
      if (allocs.count(name)) dead.emplace_back(name, allocs[name]);
    }
  }
  plan = std::move(planned);
}

}  // namespace kiln::loop::lowering_internal
