// What the graph rewrites that match an op's arguments share: binding a
// node's arguments to its schema, and reading a Scalar argument.
//
// Internal to compiler/pipeline.
#ifndef KILN_COMPILER_PIPELINE_REWRITE_UTIL_H_
#define KILN_COMPILER_PIPELINE_REWRITE_UTIL_H_

#include <string>

#include "absl/status/statusor.h"
#include "compiler/ir/graph.h"
#include "compiler/ops/registry.h"

namespace kiln::pipeline {

// Node `n` of `g` bound to its schema, its tensors' metadata from `g`.
inline absl::StatusOr<ops::OpCall> BindNode(const ir::Graph& g, const ir::Node& n) {
  return ops::OpCall::Bind(
      n.target, n.args, n.kwargs,
      [&g](ir::ValueId v) -> const ir::TensorMeta& { return g.value(v).meta; });
}

// Whether scalar argument `name` is absent or 1 (an addmm's beta, alpha).
inline bool IsOneOrAbsent(const ops::OpCall& call, const std::string& name) {
  if (call.IsNone(name)) return true;
  absl::StatusOr<double> x = call.Double(name);
  return x.ok() && *x == 1.0;
}

}  // namespace kiln::pipeline

#endif  // KILN_COMPILER_PIPELINE_REWRITE_UTIL_H_
