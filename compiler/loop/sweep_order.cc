#include "compiler/loop/sweep_order.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kiln::loop {

int ReverseAfterExterns(LoweredGraph* lowered) {
  std::map<std::string, Kernel*> kernel_of;
  for (Kernel& k : lowered->kernels) kernel_of[k.name] = &k;
  // A view -> the value whose storage it is.
  std::map<std::string, std::string> root;
  auto root_of = [&root](const std::string& value) {
    auto it = root.find(value);
    return it == root.end() ? value : it->second;
  };
  // What the last launch or ATen op wrote, when it was an ATen op: its
  // outputs' storage, and its target.
  std::set<std::string> written;
  std::string writer;
  // Per kernel: its launches, and the reason of those that follow such an
  // op ("" for one that does not).
  std::map<std::string, std::vector<std::string>> reasons;
  for (const v1::PlanStep& step : lowered->plan.steps()) {
    if (step.has_view()) {
      root[step.view().value()] = root_of(step.view().base());
    } else if (step.has_extern_call()) {
      const v1::Node& node = step.extern_call().node();
      written.clear();
      for (const v1::Value& out : node.outputs()) written.insert(root_of(out.name()));
      writer = node.target();
    } else if (step.has_launch()) {
      const v1::PlanStep::Launch& launch = step.launch();
      auto it = kernel_of.find(launch.symbol());
      if (it == kernel_of.end()) continue;
      const Kernel& k = *it->second;
      std::vector<bool> loaded(k.buffers.size(), false);
      for (const Stmt& s : k.stmts) {
        if (s.kind == StmtKind::kLoad && s.buffer >= 0 &&
            s.buffer < static_cast<int>(loaded.size())) {
          loaded[s.buffer] = true;
        }
      }
      std::string reason;
      for (int b = 0; b < launch.buffers_size() && b < static_cast<int>(loaded.size()); ++b) {
        if (loaded[b] && written.count(root_of(launch.buffers(b))) > 0) {
          reason = absl::StrCat(launch.buffers(b), ", which ", writer, " wrote just before it");
          break;
        }
      }
      reasons[k.name].push_back(reason);
      written.clear();
    }
  }
  int reversed = 0;
  for (Kernel& k : lowered->kernels) {
    auto it = reasons.find(k.name);
    if (it == reasons.end() || it->second.empty()) continue;
    bool every = true;
    for (const std::string& r : it->second) every = every && !r.empty();
    if (!every) continue;
    k.reversed = true;
    ++reversed;
    lowered->decisions.push_back(absl::StrCat("reverse: ", k.name, " reads ", it->second.front()));
  }
  return reversed;
}

}  // namespace kiln::loop
