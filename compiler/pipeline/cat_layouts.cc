#include "compiler/pipeline/cat_layouts.h"

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/ir/builder.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_util.h"

namespace kiln::pipeline {
namespace {

constexpr char kCat[] = "aten.cat.default";

// Whether reading `m` in row-major order steps through memory by more than
// one element along its last dim (of size over 1): a transposed view.
bool StridedLastDim(const ir::TensorMeta& m) {
  if (m.sizes.empty() || m.strides.size() != m.sizes.size()) return false;
  const ir::SymInt& size = m.sizes.back();
  const ir::SymInt& stride = m.strides.back();
  if (!size.is_constant() || size.constant() <= 1) return false;
  return !(stride.is_constant() && stride.constant() == 1);
}

// The operands of cat node `n` to copy first (their positions in its list).
std::vector<size_t> StridedOperands(const ir::Graph& g, const ir::Node& n) {
  std::vector<size_t> out;
  if (n.target != kCat || n.args.empty()) return out;
  const auto* list = std::get_if<std::vector<ir::ValueId>>(&n.args[0].kind);
  if (list == nullptr) return out;
  for (size_t k = 0; k < list->size(); ++k) {
    const ir::ValueId v = (*list)[k];
    if (v != ir::kNoValue && StridedLastDim(g.value(v).meta)) out.push_back(k);
  }
  return out;
}

}  // namespace

absl::StatusOr<int> ContiguousCatOperands(const ir::Graph& g, ir::Graph* out) {
  int found = 0;
  for (const ir::Node& n : g.nodes()) found += static_cast<int>(StridedOperands(g, n).size());
  if (found == 0) return 0;
  ir::GraphBuilder b(g.name());
  std::vector<ir::ValueId> map = b.CopyInputs(g);
  for (const ir::Node& n : g.nodes()) {
    const std::vector<size_t> strided = StridedOperands(g, n);
    if (strided.empty()) {
      b.CopyNode(g, n, &map);
      continue;
    }
    std::vector<ir::Argument> args = n.args;
    auto& list = std::get<std::vector<ir::ValueId>>(args[0].kind);
    for (ir::ValueId& v : list) {
      if (v != ir::kNoValue) v = map[v];
    }
    for (ir::Argument& a : args) {
      if (const ir::ValueId* v = std::get_if<ir::ValueId>(&a.kind)) a.kind = map[*v];
    }
    for (size_t k : strided) {
      const std::vector<ir::Argument> clone_args = {ir::Argument{"", list[k]}};
      const std::vector<ir::Argument> clone_kwargs = {
          ir::Argument{"memory_format", v1::CONTIGUOUS_FORMAT}};
      ASSIGN_OR_RETURN(std::vector<ir::TensorMeta> metas,
                       ops::InferMetas(ops::DefaultRegistry(), "aten.clone.default", clone_args,
                                       clone_kwargs, [&b](ir::ValueId v) -> const ir::TensorMeta& {
                                         return b.value(v).meta;
                                       }));
      const std::string name = absl::StrCat(n.name, "_in", k);
      list[k] = b.AddNode("aten.clone.default", clone_args, clone_kwargs, std::move(metas), name,
                          {absl::StrCat(g.value(n.outputs[0]).name, "_in", k)})[0];
    }
    ASSIGN_OR_RETURN(
        std::vector<ir::TensorMeta> metas,
        ops::InferMetas(ops::DefaultRegistry(), n.target, args, n.kwargs,
                        [&b](ir::ValueId v) -> const ir::TensorMeta& { return b.value(v).meta; }));
    std::vector<std::string> names;
    for (ir::ValueId o : n.outputs) names.push_back(g.value(o).name);
    std::vector<ir::ValueId> outs =
        b.AddNode(n.target, std::move(args), n.kwargs, std::move(metas), n.name, std::move(names));
    for (size_t k = 0; k < outs.size(); ++k) map[n.outputs[k]] = outs[k];
  }
  for (ir::ValueId id : g.outputs()) b.AddOutput(map[id]);
  *out = std::move(b).Build();  // the last use of `g`, which may be *out
  return found;
}

}  // namespace kiln::pipeline
