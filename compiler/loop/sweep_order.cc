#include "compiler/loop/sweep_order.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/ir/graph.h"

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
        if ((s.kind == StmtKind::kLoad || s.kind == StmtKind::kGather) && s.buffer >= 0 &&
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

int MarkStreamedLoads(LoweredGraph* lowered) {
  std::map<std::string, std::string> root;  // a view -> the value whose storage it is
  auto root_of = [&root](const std::string& value) {
    auto it = root.find(value);
    return it == root.end() ? value : it->second;
  };
  std::map<std::string, Kernel*> kernel_of;
  for (Kernel& k : lowered->kernels) kernel_of[k.name] = &k;
  // The last step that reads each storage.
  std::map<std::string, int> last_read;
  const auto& steps = lowered->plan.steps();
  for (int i = 0; i < steps.size(); ++i) {
    const v1::PlanStep& step = steps.Get(i);
    if (step.has_view()) {
      root[step.view().value()] = root_of(step.view().base());
    } else if (step.has_extern_call()) {
      for (const std::string& n : ir::OperandNames(step.extern_call().node())) {
        last_read[root_of(n)] = i;
      }
    } else if (step.has_launch()) {
      auto it = kernel_of.find(step.launch().symbol());
      if (it == kernel_of.end()) continue;
      const Kernel& k = *it->second;
      for (const Stmt& s : k.stmts) {
        if ((s.kind == StmtKind::kLoad || s.kind == StmtKind::kGather) && s.buffer >= 0 &&
            s.buffer < step.launch().buffers_size()) {
          last_read[root_of(step.launch().buffers(s.buffer))] = i;
        }
      }
    }
  }
  // Per kernel and buffer: whether every launch was its last reader (a
  // view's root, from the first walk, is the same at every step: values are
  // defined once).
  std::map<std::string, std::vector<bool>> last;
  for (int i = 0; i < steps.size(); ++i) {
    const v1::PlanStep& step = steps.Get(i);
    if (!step.has_launch()) continue;
    auto it = kernel_of.find(step.launch().symbol());
    if (it == kernel_of.end()) continue;
    const Kernel& k = *it->second;
    std::vector<bool>& every = last.try_emplace(k.name, k.buffers.size(), true).first->second;
    for (int b = 0; b < static_cast<int>(k.buffers.size()); ++b) {
      if (b >= step.launch().buffers_size() || last_read[root_of(step.launch().buffers(b))] != i) {
        every[b] = false;
      }
    }
  }
  int marked = 0;
  for (Kernel& k : lowered->kernels) {
    auto it = last.find(k.name);
    if (it == last.end()) continue;
    std::vector<std::set<int>> passes(k.buffers.size());
    for (const Stmt& s : k.stmts) {
      if ((s.kind == StmtKind::kLoad || s.kind == StmtKind::kGather) && s.buffer >= 0 &&
          s.buffer < static_cast<int>(k.buffers.size())) {
        passes[s.buffer].insert(s.pass);
      }
    }
    for (size_t b = 0; b < k.buffers.size(); ++b) {
      KernelBuffer& buf = k.buffers[b];
      buf.streamed = it->second[b] && !buf.written && passes[b].size() == 1;
      marked += buf.streamed;
    }
  }
  return marked;
}

}  // namespace kiln::loop
