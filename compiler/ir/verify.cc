#include "compiler/ir/verify.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "compiler/ir/schema.h"

namespace kiln::ir {
namespace {

absl::Status VerifyMeta(const Value& v, const std::string& where) {
  const TensorMeta& m = v.meta;
  auto err = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(where, " '", v.name, "': ", what));
  };
  if (m.dtype == v1::DTYPE_UNSPECIFIED) return err("metadata has no dtype");
  if (m.device_type.empty()) return err("metadata has no device");
  if (m.strides.size() != m.sizes.size()) {
    return err(absl::StrCat("metadata has ", m.sizes.size(), " sizes but ", m.strides.size(),
                            " strides"));
  }
  for (size_t d = 0; d < m.sizes.size(); ++d) {
    const SymInt& s = m.sizes[d];
    if (s.is_constant() ? s.constant() < 0 : s.expr().empty()) {
      return err(absl::StrCat("size[", d, "] is ", s.is_constant() ? s.ToString() : "empty"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Verify(const Graph& g) {
  if (g.nodes().empty() && g.outputs().empty()) {
    return absl::InvalidArgumentError("graph is empty: it has no nodes and no outputs");
  }
  if (g.outputs().empty()) return absl::InvalidArgumentError("graph has no outputs");
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    RETURN_IF_ERROR(VerifyMeta(g.value(g.inputs()[i].value), absl::StrCat("input ", i)));
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
    for (ValueId id : node.outputs) {
      RETURN_IF_ERROR(VerifyMeta(g.value(id), absl::StrCat("node '", node.name, "' output")));
    }
    RETURN_IF_ERROR(CheckArguments(node, g));
  }
  return absl::OkStatus();
}

}  // namespace kiln::ir
