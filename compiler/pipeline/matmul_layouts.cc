#include "compiler/pipeline/matmul_layouts.h"

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/status_macros.h"
#include "compiler/ir/builder.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_util.h"

namespace kiln::pipeline {
namespace {

constexpr char kClone[] = "aten.clone.default";
constexpr char kPermute[] = "aten.permute.default";

// Whether the node multiplies `v` as a matrix (not adds it as a bias).
bool MultipliesAsMatrix(const ir::Node& n, ir::ValueId v) {
  if (n.target == "aten.bmm.default" || n.target == "aten.mm.default") return true;
  if (n.target == "aten.addmm.default" || n.target == "aten.baddbmm.default") {
    const std::vector<ir::ValueId> operands = ir::Graph::Operands(n);
    return !operands.empty() && operands[0] != v;  // the bias comes first
  }
  return false;
}

bool IsOne(const ir::SymInt& s) { return s.is_constant() && s.constant() == 1; }

// Whether the last two dims of `m` are laid out transposed: the second to
// last is the one along memory, and neither has size 1 (with a size of 1
// either layout is row-major).
bool TransposedLastTwo(const ir::TensorMeta& m) {
  const size_t r = m.sizes.size();
  if (r < 2 || m.strides.size() != r) return false;
  for (size_t d : {r - 2, r - 1}) {
    if (m.sizes[d].is_constant() && m.sizes[d].constant() <= 1) return false;
  }
  return IsOne(m.strides[r - 2]) && !IsOne(m.strides[r - 1]);
}

class Matcher {
 public:
  explicit Matcher(const ir::Graph& g) : g_(g), readers_(g.values().size()) {
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      for (ir::ValueId v : ir::Graph::Operands(g.nodes()[i])) {
        if (v != ir::kNoValue) readers_[v].push_back(static_cast<int>(i));
      }
    }
    outputs_.insert(g.outputs().begin(), g.outputs().end());
  }

  // The clone node's views to re-derive when it matches, else nullopt.
  std::optional<std::vector<int>> Match(const ir::Node& n) const {
    if (n.target != kClone || n.outputs.size() != 1) return std::nullopt;
    const std::vector<ir::ValueId> operands = ir::Graph::Operands(n);
    if (operands.size() != 1) return std::nullopt;
    const ir::TensorMeta& in = g_.value(operands[0]).meta;
    const ir::ValueId c = n.outputs[0];
    const ir::TensorMeta& out = g_.value(c).meta;
    if (!TransposedLastTwo(in) || !ops::IsContiguous(out) || outputs_.contains(c)) {
      return std::nullopt;
    }
    std::vector<int> views;
    for (int r : readers_[c]) {
      const ir::Node& reader = g_.nodes()[r];
      if (MultipliesAsMatrix(reader, c)) continue;
      if (!KeepsLastTwo(reader, out)) return std::nullopt;
      for (int rr : readers_[reader.outputs[0]]) {
        if (!MultipliesAsMatrix(g_.nodes()[rr], reader.outputs[0])) return std::nullopt;
      }
      views.push_back(r);
    }
    return views;
  }

 private:
  // A view of the copy that keeps its last two dims (Dynamo's [B, H, M, N]
  // -> [B * H, M, N] for bmm) and is no graph output.
  bool KeepsLastTwo(const ir::Node& n, const ir::TensorMeta& in) const {
    if ((n.target != "aten.view.default" && n.target != "aten._unsafe_view.default") ||
        n.outputs.size() != 1 || outputs_.contains(n.outputs[0])) {
      return false;
    }
    const ir::TensorMeta& m = g_.value(n.outputs[0]).meta;
    const size_t r = m.sizes.size(), q = in.sizes.size();
    return r >= 2 && m.sizes[r - 1] == in.sizes[q - 1] && m.sizes[r - 2] == in.sizes[q - 2];
  }

  const ir::Graph& g_;
  std::vector<std::vector<int>> readers_;
  absl::flat_hash_set<ir::ValueId> outputs_;
};

// Adds `target` over `args` with its metadata inferred.
absl::StatusOr<ir::ValueId> Add(ir::GraphBuilder& b, const std::string& target,
                                std::vector<ir::Argument> args, std::vector<ir::Argument> kwargs,
                                std::string name, std::string value_name) {
  ASSIGN_OR_RETURN(std::vector<ir::ValueId> out,
                   ops::Emit(b, ops::DefaultRegistry(), target, std::move(args), std::move(kwargs),
                             std::move(name), {std::move(value_name)}));
  return out[0];
}

// `n` again over the builder's operands, its metadata inferred from them
// (a view of a value whose strides changed).
absl::Status Rederive(ir::GraphBuilder& b, const ir::Graph& g, const ir::Node& n,
                      std::vector<ir::ValueId>* map) {
  ASSIGN_OR_RETURN((*map)[n.outputs[0]],
                   Add(b, n.target, ir::MapArguments(n.args, *map),
                       ir::MapArguments(n.kwargs, *map), n.name, g.value(n.outputs[0]).name));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> TransposeMatmulCopies(const ir::Graph& g, ir::Graph* out) {
  const Matcher matcher(g);
  std::vector<bool> clone(g.nodes().size(), false), rederive(g.nodes().size(), false);
  int found = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    std::optional<std::vector<int>> views = matcher.Match(g.nodes()[i]);
    if (!views) continue;
    clone[i] = true;
    for (int v : *views) rederive[v] = true;
    ++found;
  }
  if (found == 0) return 0;
  ir::GraphBuilder b(g.name());
  std::vector<ir::ValueId> map = b.CopyInputs(g);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const ir::Node& n = g.nodes()[i];
    if (rederive[i]) {
      RETURN_IF_ERROR(Rederive(b, g, n, &map));
      continue;
    }
    if (!clone[i]) {
      b.CopyNode(g, n, &map);
      continue;
    }
    // permute(clone(permute(x))): the copy keeps the clone's name, so that
    // the plan and the trace show it as before.
    const ir::ValueId x = map[ir::Graph::Operands(n)[0]];
    const ir::Value& result = g.value(n.outputs[0]);
    std::vector<int64_t> swap(result.meta.sizes.size());
    for (size_t d = 0; d < swap.size(); ++d) swap[d] = static_cast<int64_t>(d);
    std::swap(swap[swap.size() - 1], swap[swap.size() - 2]);
    ASSIGN_OR_RETURN(const ir::ValueId row_major,
                     Add(b, kPermute, {ir::Positional(x), ir::Positional(swap)}, {}, n.name + "_in",
                         result.name + "_in"));
    ASSIGN_OR_RETURN(
        const ir::ValueId copy,
        Add(b, kClone, {ir::Positional(row_major)},
            {ir::Argument{"memory_format", v1::CONTIGUOUS_FORMAT}}, n.name, result.name));
    ASSIGN_OR_RETURN(map[n.outputs[0]],
                     Add(b, kPermute, {ir::Positional(copy), ir::Positional(swap)}, {},
                         n.name + "_t", result.name + "_t"));
  }
  for (ir::ValueId id : g.outputs()) b.AddOutput(map[id]);
  *out = std::move(b).Build();  // the last use of `g`, which may be *out
  return found;
}

}  // namespace kiln::pipeline
