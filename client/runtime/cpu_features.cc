#include "client/runtime/cpu_features.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kiln::runtime {
namespace {

bool ThisCpuHas(const char* feature) {
  __builtin_cpu_init();
  // __builtin_cpu_supports needs a literal: one branch per feature named below.
  const std::string f = feature;
  if (f == "sse4.2") return __builtin_cpu_supports("sse4.2");
  if (f == "ssse3") return __builtin_cpu_supports("ssse3");
  if (f == "popcnt") return __builtin_cpu_supports("popcnt");
  if (f == "avx2") return __builtin_cpu_supports("avx2");
  if (f == "fma") return __builtin_cpu_supports("fma");
  if (f == "bmi2") return __builtin_cpu_supports("bmi2");
  if (f == "avx512f") return __builtin_cpu_supports("avx512f");
  if (f == "avx512bw") return __builtin_cpu_supports("avx512bw");
  if (f == "avx512vl") return __builtin_cpu_supports("avx512vl");
  if (f == "avx512dq") return __builtin_cpu_supports("avx512dq");
  return false;
}

}  // namespace

absl::Status CheckCpuSupports(const std::string& isa, const std::function<bool(const char*)>& has) {
  static const auto* levels = new std::map<std::string, std::vector<const char*>>{
      {"x86-64", {}},
      {"x86-64-v2", {"ssse3", "sse4.2", "popcnt"}},
      {"x86-64-v3", {"ssse3", "sse4.2", "popcnt", "avx2", "fma", "bmi2"}},
      {"x86-64-v4",
       {"ssse3", "sse4.2", "popcnt", "avx2", "fma", "bmi2", "avx512f", "avx512bw", "avx512vl",
        "avx512dq"}},
  };
  auto it = levels->find(isa);
  if (it == levels->end()) return absl::OkStatus();
  for (const char* feature : it->second) {
    if (!(has ? has(feature) : ThisCpuHas(feature))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the artifact's code was compiled for ", isa, ", which needs ", feature,
          "; this CPU lacks it: compile with options.target.cpu_isa set to a level it has"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln::runtime
