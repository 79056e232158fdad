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

void CompileSlots::Acquire(bool urgent) {
  absl::MutexLock lock(&mu_);
  if (urgent) {
    ++urgent_waiting_;
    mu_.Await(absl::Condition(
        +[](int* free) { return *free > 0; }, &free_));
    --urgent_waiting_;
  } else {
    mu_.Await(absl::Condition(this, &CompileSlots::FreeForOrdinary));
  }
  --free_;
}

void CompileSlots::Release() {
  absl::MutexLock lock(&mu_);
  ++free_;
}

absl::StatusOr<CompiledModules> CompileModules(const CodegenBackend& backend,
                                               const std::vector<loop::Kernel>& all,
                                               const std::vector<std::string>& symbols, int jobs,
                                               CompileSlots* slots, KernelCache* cache,
                                               bool urgent) {
  CompiledModules out;
  // What the cache holds is served from it; `kernels` are the rest.
  std::vector<loop::Kernel> kernels;
  std::vector<std::string> keys;  // of `kernels`, where there is a cache
  std::vector<KernelCache::Entry> served;
  for (const loop::Kernel& k : all) {
    if (cache == nullptr) {
      kernels.push_back(k);
      continue;
    }
    ASSIGN_OR_RETURN(std::string key, KernelKey(backend, k, symbols));
    if (std::optional<KernelCache::Entry> hit = cache->Find(key)) {
      if (hit->symbol != k.name) out.symbol_of[k.name] = hit->symbol;
      out.module_of[k.name] = -1 - static_cast<int>(served.size());  // numbered below
      out.reused.push_back(k.name);
      served.push_back(*std::move(hit));
    } else {
      kernels.push_back(k);
      keys.push_back(std::move(key));
    }
  }

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
  // No part at all when every kernel was served; one (perhaps empty) when
  // there is no kernel.
  const int parts =
      kernels.empty() ? (served.empty() ? 1 : 0) : *std::max_element(part.begin(), part.end()) + 1;
  std::vector<std::vector<loop::Kernel>> dealt(parts);
  std::vector<std::vector<int>> dealt_index(parts);
  for (size_t i = 0; i < kernels.size(); ++i) {
    dealt[part[i]].push_back(kernels[i]);
    dealt_index[part[i]].push_back(static_cast<int>(i));
    out.module_of[kernels[i].name] = part[i];
  }

  std::vector<std::string> sources(parts);
  for (int p = 0; p < parts; ++p) {
    ASSIGN_OR_RETURN(sources[p], backend.Generate(dealt[p], symbols));
  }
  std::vector<std::optional<absl::StatusOr<v1::CompiledModule>>> compiled(parts);
  auto compile = [&](int p) {
    if (slots != nullptr) slots->Acquire(urgent);
    compiled[p] = backend.Compile(sources[p]);
    if (slots != nullptr) slots->Release();
  };
  if (parts > 0) {
    std::vector<std::thread> threads;
    for (int p = 1; p < parts; ++p) threads.emplace_back(compile, p);
    compile(0);
    for (std::thread& t : threads) t.join();
  }
  for (int p = 0; p < parts; ++p) {
    if (!compiled[p]->ok()) return compiled[p]->status();
    if (cache != nullptr && dealt[p].size() == 1) {
      cache->Insert(keys[dealt_index[p][0]], {**compiled[p], dealt[p][0].name});
    }
    out.modules.push_back(*std::move(*compiled[p]));
  }
  for (auto& [name, module] : out.module_of) {
    if (module < 0) module = parts + (-1 - module);
  }
  for (KernelCache::Entry& e : served) out.modules.push_back(std::move(e.module));
  return out;
}

}  // namespace kiln::codegen
