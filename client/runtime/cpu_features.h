// Whether this CPU can run code compiled for an ISA level (g++'s -march
// names): the runtime checks before it loads generated code, so a mismatch is
// a clear FAILED_PRECONDITION instead of an illegal instruction. Thread-safe.
#ifndef KILN_CLIENT_RUNTIME_CPU_FEATURES_H_
#define KILN_CLIENT_RUNTIME_CPU_FEATURES_H_

#include <functional>
#include <string>

#include "absl/status/status.h"

namespace kiln::runtime {

// OK when `has(feature)` holds for every feature the x86-64 level `isa`
// ("x86-64", "x86-64-v2", "-v3", "-v4") requires; FAILED_PRECONDITION naming
// the first missing feature otherwise. Other names (a CPU model, "native")
// are not checked: their requirements are the compiling machine's.
// `has` defaults to this CPU (__builtin_cpu_supports).
absl::Status CheckCpuSupports(const std::string& isa,
                              const std::function<bool(const char*)>& has = {});

}  // namespace kiln::runtime

#endif  // KILN_CLIENT_RUNTIME_CPU_FEATURES_H_
