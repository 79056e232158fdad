#include "compiler/ir/verify.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "compiler/ir/limits.h"
#include "compiler/ir/schema.h"
#include "compiler/ir/sym_expr.h"

namespace kiln::ir {
namespace {

// Why the symbolic integer `s` is refused, or "" when it is fine: an
// expression over the length limit, or one that does not parse
// (compiler/ir/sym_expr.h).
std::string ExprProblem(const SymInt& s, const GraphLimits& limits) {
  if (s.is_constant()) return "";
  if (static_cast<int64_t>(s.expr().size()) > limits.max_expr_length) {
    return absl::StrCat("is an expression of ", s.expr().size(), " characters, over the limit of ",
                        limits.max_expr_length, " (max_expr_length)");
  }
  absl::StatusOr<SymExpr> e = SymExpr::Parse(s.expr());
  if (!e.ok()) return absl::StrCat("is a ", e.status().message());
  return "";
}

absl::Status VerifyMeta(const Value& v, const std::string& where, const GraphLimits& limits) {
  const TensorMeta& m = v.meta;
  auto err = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(where, " '", v.name, "': ", what));
  };
  for (size_t d = 0; d < m.sizes.size(); ++d) {
    std::string problem = ExprProblem(m.sizes[d], limits);
    if (!problem.empty()) return err(absl::StrCat("size[", d, "] ", problem));
  }
  for (size_t d = 0; d < m.strides.size(); ++d) {
    std::string problem = ExprProblem(m.strides[d], limits);
    if (!problem.empty()) return err(absl::StrCat("stride[", d, "] ", problem));
  }
  if (std::string problem = ExprProblem(m.storage_offset, limits); !problem.empty()) {
    return err(absl::StrCat("storage offset ", problem));
  }
  if (m.dtype == v1::DTYPE_UNSPECIFIED) return err("metadata has no dtype");
  if (m.device_type.empty()) return err("metadata has no device");
  if (m.strides.size() != m.sizes.size()) {
    return err(
        absl::StrCat("metadata has ", m.sizes.size(), " sizes but ", m.strides.size(), " strides"));
  }
  if (static_cast<int64_t>(m.sizes.size()) > limits.max_rank) {
    return err(absl::StrCat("rank ", m.sizes.size(), " is over the limit of ", limits.max_rank,
                            " (max_rank)"));
  }
  const int64_t max_elements = limits.max_elements;
  int64_t elements = 1;
  for (size_t d = 0; d < m.sizes.size(); ++d) {
    const SymInt& s = m.sizes[d];
    if (s.is_constant() ? s.constant() < 0 : s.expr().empty()) {
      return err(absl::StrCat("size[", d, "] is ", s.is_constant() ? s.ToString() : "empty"));
    }
    if (s.is_constant() &&
        (__builtin_mul_overflow(elements, s.constant(), &elements) || elements > max_elements)) {
      return err(absl::StrCat("the sizes multiply to more than ", max_elements,
                              " elements (the limit per tensor, max_elements) at size[", d, "]"));
    }
  }
  for (size_t d = 0; d < m.strides.size(); ++d) {
    const SymInt& s = m.strides[d];
    if (s.is_constant() && (s.constant() > max_elements || s.constant() < -max_elements)) {
      return err(absl::StrCat("stride[", d, "] is ", s.constant(), ", beyond the limit of +-",
                              max_elements, " (max_elements)"));
    }
  }
  const SymInt& offset = m.storage_offset;
  if (offset.is_constant() && (offset.constant() < 0 || offset.constant() > max_elements)) {
    return err(absl::StrCat("storage offset ", offset.constant(), " is outside [0, ", max_elements,
                            "] (max_elements)"));
  }
  return absl::OkStatus();
}

absl::Status VerifySymbolicArguments(const Node& node, const GraphLimits& limits) {
  auto check = [&](const Argument& a, const std::string& which) -> absl::Status {
    std::vector<SymInt> syms;
    if (const auto* s = std::get_if<SymInt>(&a.kind)) syms.push_back(*s);
    if (const auto* v = std::get_if<std::vector<SymInt>>(&a.kind)) syms = *v;
    for (const SymInt& s : syms) {
      std::string problem = ExprProblem(s, limits);
      if (!problem.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("node '", node.name, "' argument ", which, " ", problem));
      }
    }
    return absl::OkStatus();
  };
  for (size_t i = 0; i < node.args.size(); ++i) {
    RETURN_IF_ERROR(check(node.args[i], absl::StrCat(i)));
  }
  for (const Argument& a : node.kwargs) RETURN_IF_ERROR(check(a, absl::StrCat("'", a.name, "'")));
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckNodeCount(int64_t nodes, const GraphLimits& limits) {
  if (nodes <= limits.max_nodes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("graph has ", nodes, " nodes, over the limit of ",
                                                 limits.max_nodes, " (max_nodes)"));
}

absl::Status Verify(const Graph& g, const GraphLimits& limits) {
  RETURN_IF_ERROR(CheckNodeCount(static_cast<int64_t>(g.nodes().size()), limits));
  if (g.nodes().empty() && g.outputs().empty()) {
    return absl::InvalidArgumentError("graph is empty: it has no nodes and no outputs");
  }
  if (g.outputs().empty()) return absl::InvalidArgumentError("graph has no outputs");
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    RETURN_IF_ERROR(VerifyMeta(g.value(g.inputs()[i].value), absl::StrCat("input ", i), limits));
  }
  for (const Node& node : g.nodes()) {
    std::vector<absl::string_view> parts = absl::StrSplit(node.target, '.');
    if (parts.size() != 3 || parts[0].empty() || parts[1].empty() || parts[2].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("node '", node.name, "': target '", node.target,
                       "' is not of the form 'namespace.op.overload' (e.g. 'aten.add.Tensor')"));
    }
    if (node.outputs.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("node '", node.name, "' has no outputs"));
    }
    if (static_cast<int64_t>(node.outputs.size()) > limits.max_outputs_per_node) {
      return absl::InvalidArgumentError(absl::StrCat(
          "node '", node.name, "' has ", node.outputs.size(), " outputs, over the limit of ",
          limits.max_outputs_per_node, " per node (max_outputs_per_node)"));
    }
    for (ValueId id : node.outputs) {
      RETURN_IF_ERROR(
          VerifyMeta(g.value(id), absl::StrCat("node '", node.name, "' output"), limits));
    }
    RETURN_IF_ERROR(VerifySymbolicArguments(node, limits));
    RETURN_IF_ERROR(CheckArguments(node, g));
  }
  return absl::OkStatus();
}

}  // namespace kiln::ir
