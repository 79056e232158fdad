// Pass "memory-plan" (memory_plan.h): frees after last use, and reuse of
// freed storage.
#include "compiler/loop/memory_plan.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/ir/graph.h"

namespace kiln::loop {
namespace {

std::optional<int64_t> ConstantNumel(const google::protobuf::RepeatedPtrField<v1::SymInt>& sizes) {
  int64_t n = 1;
  for (const auto& s : sizes) {
    if (s.value_case() != v1::SymInt::kIntValue) return std::nullopt;
    n *= s.int_value();
  }
  return n;
}

std::string SizesText(const google::protobuf::RepeatedPtrField<v1::SymInt>& sizes) {
  std::vector<std::string> dims;
  for (const v1::SymInt& s : sizes) dims.push_back(ir::SymIntFromProto(s).ToString());
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

}  // namespace

void PlanMemory(v1::ExecutionPlan* out) {
  // What an earlier run planned goes: the plan is planned whole again.
  v1::ExecutionPlan plan = *out;
  plan.clear_steps();
  for (const v1::PlanStep& s : out->steps()) {
    if (s.has_free()) continue;
    v1::PlanStep* step = plan.add_steps();
    *step = s;
    if (step->has_alloc()) step->mutable_alloc()->clear_reuse();
  }

  // Free each allocated value after its last reader; allocations reuse
  // freed storage of the same dtype and constant size.
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
  *out = std::move(planned);
}

std::string PrintSteps(const v1::ExecutionPlan& plan) {
  std::string out;
  for (const v1::PlanStep& s : plan.steps()) {
    if (s.has_alloc()) {
      const v1::PlanStep::Alloc& a = s.alloc();
      absl::StrAppend(&out, "alloc ", a.value(), " ", SizesText(a.sizes()), " ",
                      absl::AsciiStrToLower(v1::DType_Name(a.dtype())),
                      a.reuse().empty() ? "" : absl::StrCat(" (reuses ", a.reuse(), ")"), "\n");
    } else if (s.has_launch()) {
      absl::StrAppend(&out, "launch ", s.launch().symbol(), " (",
                      absl::StrJoin(s.launch().buffers(), ", "), ")\n");
    } else if (s.has_extern_call()) {
      const v1::Node& node = s.extern_call().node();
      std::vector<std::string> results;
      for (const auto& o : node.outputs()) results.push_back(o.name());
      absl::StrAppend(&out, "extern ", node.target(), " -> ", absl::StrJoin(results, ", "), "\n");
    } else if (s.has_view()) {
      absl::StrAppend(&out, "view ", s.view().value(), " of ", s.view().base(), " ",
                      SizesText(s.view().sizes()), "\n");
    } else if (s.has_free()) {
      absl::StrAppend(&out, "free ", s.free().value(), "\n");
    } else {
      absl::StrAppend(&out, "step ", s.ShortDebugString(), "\n");
    }
  }
  return out;
}

}  // namespace kiln::loop
