#include "compiler/codegen/modules.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <thread>
#include <utility>

#include "common/status_macros.h"

namespace kiln::codegen {

std::vector<int> DealByCost(const std::vector<int64_t>& costs, int parts) {
  const int n = static_cast<int>(costs.size());
  parts = std::max(1, std::min(parts, n));
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return costs[a] > costs[b]; });
  std::vector<int64_t> load(parts, 0);
  std::vector<int> part(n, 0);
  for (int k = 0; k < n; ++k) {
    // The first `parts` items open one part each, so that none is empty.
    const int p =
        k < parts ? k : static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    part[order[k]] = p;
    load[p] += costs[order[k]];
  }
  return part;
}

void CompileSlots::Acquire() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* free) { return *free > 0; }, &free_));
  --free_;
}

void CompileSlots::Release() {
  absl::MutexLock lock(&mu_);
  ++free_;
}

absl::StatusOr<CompiledModules> CompileModules(const CodegenBackend& backend,
                                               const std::vector<loop::Kernel>& kernels,
                                               const std::vector<std::string>& symbols, int jobs,
                                               CompileSlots* slots) {
  std::vector<int> part(kernels.size(), 0);
  if (jobs > 1 && kernels.size() > 1) {
    // What each kernel adds to a translation unit's text (the prelude is
    // in every part alike).
    const absl::StatusOr<std::string> empty = backend.Generate({}, symbols);
    const size_t prelude = empty.ok() ? empty->size() : 0;
    std::vector<int64_t> costs;
    for (const loop::Kernel& k : kernels) {
      ASSIGN_OR_RETURN(const std::string alone, backend.Generate({k}, symbols));
      costs.push_back(static_cast<int64_t>(alone.size() - std::min(alone.size(), prelude)));
    }
    part = DealByCost(costs, jobs);
  }
  const int parts = kernels.empty() ? 1 : *std::max_element(part.begin(), part.end()) + 1;
  std::vector<std::vector<loop::Kernel>> dealt(parts);
  CompiledModules out;
  for (size_t i = 0; i < kernels.size(); ++i) {
    dealt[part[i]].push_back(kernels[i]);
    out.module_of[kernels[i].name] = part[i];
  }

  std::vector<std::string> sources(parts);
  for (int p = 0; p < parts; ++p) {
    ASSIGN_OR_RETURN(sources[p], backend.Generate(dealt[p], symbols));
  }
  std::vector<std::optional<absl::StatusOr<v1::CompiledModule>>> compiled(parts);
  auto compile = [&](int p) {
    if (slots != nullptr) slots->Acquire();
    compiled[p] = backend.Compile(sources[p]);
    if (slots != nullptr) slots->Release();
  };
  {
    std::vector<std::thread> threads;
    for (int p = 1; p < parts; ++p) threads.emplace_back(compile, p);
    compile(0);
    for (std::thread& t : threads) t.join();
  }
  for (int p = 0; p < parts; ++p) {
    if (!compiled[p]->ok()) return compiled[p]->status();
    out.modules.push_back(*std::move(*compiled[p]));
  }
  return out;
}

}  // namespace kiln::codegen
