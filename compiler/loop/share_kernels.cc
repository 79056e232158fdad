#include "compiler/loop/share_kernels.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kiln::loop {

int ShareIdenticalKernels(LoweredGraph* lowered) {
  std::map<std::string, std::string> first;    // code -> the first kernel with it
  std::map<std::string, std::string> renamed;  // dropped kernel -> the kernel it runs
  std::vector<Kernel> kept;
  for (Kernel& k : lowered->kernels) {
    auto [it, fresh] = first.emplace(KernelCode(k), k.name);
    if (!fresh) {
      renamed[k.name] = it->second;
      lowered->decisions.push_back(
          absl::StrCat("share: ", k.name, " runs ", it->second, "'s code"));
    }
  }
  if (renamed.empty()) return 0;
  for (Kernel& k : lowered->kernels) {
    if (renamed.count(k.name) == 0) kept.push_back(std::move(k));
  }
  lowered->kernels = std::move(kept);
  for (v1::PlanStep& step : *lowered->plan.mutable_steps()) {
    if (!step.has_launch()) continue;
    auto it = renamed.find(step.launch().symbol());
    if (it != renamed.end()) step.mutable_launch()->set_symbol(it->second);
  }
  return static_cast<int>(renamed.size());
}

}  // namespace kiln::loop
