// Fault injection, for testing the troubleshooting tools (the minifiers,
// record and replay) on faults of a known place. Never on by default: kilnd's
// --inject_fault=KIND:TARGET, or the request option inject_fault, turns it on
// for the `kiln` backend, and the option is part of the cache key.
//
//   compile_error:T  lowering a graph (the inference graph, or the forward or
//                    backward graph of a training one) that has a node of op T
//                    fails: INTERNAL "injected compile error
//                    (inject_fault=compile_error:T) at node 'N'".
//   accuracy:T       every output of a node of op T that is not bool is
//                    followed by aten.add.Scalar(., 1) before lowering, so
//                    the generated code computes a wrong value for it.
//   runtime_error:T  every output of a node of op T goes through
//                    kiln.injected_fault.default(., message), an extern call
//                    that the runtimes resolve when they load the plan and
//                    that raises when it runs: RuntimeError "injected runtime
//                    error (inject_fault=runtime_error:T) at node 'N'". (The
//                    Python runtime defines the op; the C++ runtime has none
//                    and refuses the plan, naming the node.)
//
// Pure functions; thread-safe.
#ifndef KILN_COMPILER_PIPELINE_FAULT_H_
#define KILN_COMPILER_PIPELINE_FAULT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "compiler/ir/graph.h"

namespace kiln::pipeline {

struct Fault {
  enum Kind { kNone, kCompileError, kAccuracy, kRuntimeError };
  Kind kind = kNone;
  std::string target;  // "aten.relu.default"
};

// Parses "KIND:TARGET"; "" is no fault. INVALID_ARGUMENT naming what is
// wrong: an unknown kind, an empty or over-long target.
absl::StatusOr<Fault> ParseFault(absl::string_view text);

// `graph` with the fault applied: an error for compile_error when the graph
// has the op, the rewritten graph for accuracy and runtime_error, the graph
// itself otherwise.
absl::StatusOr<ir::Graph> ApplyFault(const ir::Graph& graph, const Fault& fault);

}  // namespace kiln::pipeline

#endif  // KILN_COMPILER_PIPELINE_FAULT_H_
