#include "compiler/pipeline/unfuse_addmm.h"

#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/status_macros.h"
#include "compiler/ir/builder.h"
#include "compiler/ops/registry.h"
#include "compiler/pipeline/rewrite_util.h"

namespace kiln::pipeline {
namespace {

constexpr char kAddmm[] = "aten.addmm.default";

// Whether a pointwise op reads `v`, directly or through views of it.
bool ReadByPointwise(const ir::Graph& g, const std::vector<std::vector<int>>& readers,
                     ir::ValueId v, int depth = 0) {
  if (depth > 8) return false;
  const ops::Registry& registry = ops::DefaultRegistry();
  for (int i : readers[v]) {
    const ir::Node& n = g.nodes()[i];
    const ops::OpDef* def = registry.Find(n.target);
    if (def == nullptr) continue;
    if (def->traits.pointwise) return true;
    if (def->traits.view && n.outputs.size() == 1 &&
        ReadByPointwise(g, readers, n.outputs[0], depth + 1)) {
      return true;
    }
  }
  return false;
}

bool Unfusable(const ir::Graph& g, const std::vector<std::vector<int>>& readers,
               const ir::Node& n) {
  if (n.target != kAddmm || n.outputs.size() != 1) return false;
  const ir::TensorMeta& m = g.value(n.outputs[0]).meta;
  if (m.device_type != "cuda" || (m.dtype != v1::FLOAT32 && m.dtype != v1::FLOAT64)) return false;
  absl::StatusOr<ops::OpCall> call = BindNode(g, n);
  if (!call.ok() || !IsOneOrAbsent(*call, "beta") || !IsOneOrAbsent(*call, "alpha")) return false;
  absl::StatusOr<const ir::TensorMeta*> bias = call->Meta("self");
  if (!bias.ok() || (*bias)->dtype != m.dtype || (*bias)->sizes.empty() ||
      (*bias)->sizes.size() > 2) {
    return false;
  }
  if ((*bias)->sizes.size() == 2 && !((*bias)->sizes[0] == ir::SymInt{int64_t{1}})) return false;
  return ReadByPointwise(g, readers, n.outputs[0]);
}

// The node that is the only reader of the addmm `n`'s result, when it is a
// view of it with the same last dim (the product's rows split into [B, L]),
// and the result is no graph output: -1 otherwise. The bias is then added
// to the product's view, so that the sum has the shape its readers (the
// GELU, and its recomputation and gradient in the backward) have.
int OnlyView(const ir::Graph& g, const std::vector<std::vector<int>>& readers,
             const std::vector<bool>& is_output, const ir::Node& n) {
  const ir::ValueId out = n.outputs[0];
  if (readers[out].size() != 1 || is_output[out]) return -1;
  const int r = readers[out][0];
  const ir::Node& view = g.nodes()[r];
  if (view.target != "aten.view.default" || view.outputs.size() != 1 ||
      ir::Graph::Operands(view)[0] != out) {
    return -1;
  }
  const ir::TensorMeta& from = g.value(out).meta;
  const ir::TensorMeta& to = g.value(view.outputs[0]).meta;
  if (to.sizes.size() < 2 || !(to.sizes.back() == from.sizes.back()) ||
      !(to.strides.back() == ir::SymInt{int64_t{1}})) {
    return -1;
  }
  return r;
}

}  // namespace

absl::StatusOr<int> UnfuseAddmm(const ir::Graph& g, ir::Graph* out) {
  std::vector<std::vector<int>> readers(g.values().size());
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    for (ir::ValueId v : ir::Graph::Operands(g.nodes()[i])) {
      if (v != ir::kNoValue) readers[v].push_back(static_cast<int>(i));
    }
  }
  std::vector<bool> match(g.nodes().size(), false);
  int found = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    match[i] = Unfusable(g, readers, g.nodes()[i]);
    found += match[i];
  }
  if (found == 0) return 0;
  std::vector<bool> is_output(g.values().size(), false);
  for (ir::ValueId v : g.outputs()) is_output[v] = true;
  const ops::Registry& registry = ops::DefaultRegistry();
  ir::GraphBuilder b(g.name());
  std::vector<ir::ValueId> map = b.CopyInputs(g);
  // A view node that reads a product (mapped to the product) -> the bias.
  absl::flat_hash_map<int, ir::ValueId> viewed;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const ir::Node& n = g.nodes()[i];
    if (auto v = viewed.find(static_cast<int>(i)); v != viewed.end()) {
      // The product viewed as the view was, then the bias added: the sum
      // takes the view's name and metadata.
      const ir::Value& result = g.value(n.outputs[0]);
      const ir::ValueId shaped =
          b.AddNode(n.target, ir::MapArguments(n.args, map), ir::MapArguments(n.kwargs, map),
                    {result.meta}, n.name + "_mm", {result.name + "_mm"})[0];
      map[n.outputs[0]] = b.AddNode("aten.add.Tensor", {ir::Ref(shaped), ir::Ref(map[v->second])},
                                    {}, {result.meta}, n.name, {result.name})[0];
      continue;
    }
    if (!match[i]) {
      b.CopyNode(g, n, &map);
      continue;
    }
    ASSIGN_OR_RETURN(ops::OpCall call, BindNode(g, n));
    ASSIGN_OR_RETURN(ir::ValueId bias, call.Tensor("self"));
    ASSIGN_OR_RETURN(ir::ValueId mat1, call.Tensor("mat1"));
    ASSIGN_OR_RETURN(ir::ValueId mat2, call.Tensor("mat2"));
    // The sum keeps the addmm's name and metadata: what reads it by name
    // (the plan's outputs, the trace) reads the same value.
    const ir::Value& result = g.value(n.outputs[0]);
    std::vector<ir::Argument> args = {ir::Ref(map[mat1]), ir::Ref(map[mat2])};
    ASSIGN_OR_RETURN(
        std::vector<ir::TensorMeta> metas,
        ops::InferMetas(registry, "aten.mm.default", args, {},
                        [&b](ir::ValueId v) -> const ir::TensorMeta& { return b.value(v).meta; }));
    const ir::ValueId product = b.AddNode("aten.mm.default", std::move(args), {}, std::move(metas),
                                          n.name + "_mm", {result.name + "_mm"})[0];
    if (const int view = OnlyView(g, readers, is_output, n); view >= 0) {
      map[n.outputs[0]] = product;
      viewed[view] = bias;
      continue;
    }
    map[n.outputs[0]] = b.AddNode("aten.add.Tensor", {ir::Ref(product), ir::Ref(map[bias])}, {},
                                  {result.meta}, n.name, {result.name})[0];
  }
  for (ir::ValueId id : g.outputs()) b.AddOutput(map[id]);
  *out = std::move(b).Build();  // the last use of `g`, which may be *out
  return found;
}

}  // namespace kiln::pipeline
