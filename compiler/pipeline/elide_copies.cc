#include "compiler/pipeline/elide_copies.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/status_macros.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/dead_code.h"
#include "compiler/ops/registry.h"

namespace kiln::pipeline {
namespace {

constexpr char kClone[] = "aten.clone.default";

// Views whose result is defined for an operand of any layout (a reshape
// stays a view only for some).
bool LayoutFreeView(const std::string& target) {
  static const auto* const views = new absl::flat_hash_set<std::string>{
      "aten.permute.default",   "aten.transpose.int", "aten.t.default",     "aten.expand.default",
      "aten.slice.Tensor",      "aten.select.int",    "aten.squeeze.dim",   "aten.squeeze.dims",
      "aten.unsqueeze.default", "aten.alias.default", "aten.detach.default"};
  return views->contains(target);
}

bool IsView(const ir::Node& n) {
  const ops::OpDef* def = ops::DefaultRegistry().Find(n.target);
  return def != nullptr && def->traits.view;
}

bool SameLayout(const ir::TensorMeta& a, const ir::TensorMeta& b) {
  return a.dtype == b.dtype && a.sizes == b.sizes && a.strides == b.strides;
}

class Facts {
 public:
  explicit Facts(const ir::Graph& g)
      : g_(g), readers_(g.values().size()), from_input_(g.values().size(), false) {
    for (const auto& in : g.inputs()) from_input_[in.value] = true;
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const ir::Node& n = g.nodes()[i];
      const std::vector<ir::ValueId> operands = ir::Graph::Operands(n);
      for (ir::ValueId v : operands) {
        if (v != ir::kNoValue) readers_[v].push_back(static_cast<int>(i));
      }
      if (IsView(n) && !operands.empty() && operands[0] != ir::kNoValue) {
        for (ir::ValueId o : n.outputs) from_input_[o] = from_input_[operands[0]];
      }
    }
    outputs_.insert(g.outputs().begin(), g.outputs().end());
  }

  // The value a copy node copies, when the copy may go at all: one operand,
  // not a graph input nor a view of one, and a result that does not escape.
  std::optional<ir::ValueId> Copied(const ir::Node& n) const {
    if (n.target != kClone || n.outputs.size() != 1) return std::nullopt;
    const std::vector<ir::ValueId> operands = ir::Graph::Operands(n);
    if (operands.size() != 1 || operands[0] == ir::kNoValue || from_input_[operands[0]]) {
      return std::nullopt;
    }
    if (Escapes(n.outputs[0])) return std::nullopt;
    return operands[0];
  }

  // The views between the copy node `n` and the copies that read it, when
  // those copies are its only readers (through layout-free views); nullopt
  // otherwise.
  std::optional<std::vector<int>> OnlyRecopied(const ir::Node& n) const {
    std::vector<int> views;
    int copies = 0;
    std::vector<ir::ValueId> work = {n.outputs[0]};
    while (!work.empty()) {
      const ir::ValueId v = work.back();
      work.pop_back();
      for (int r : readers_[v]) {
        const ir::Node& reader = g_.nodes()[r];
        if (reader.target == kClone) {
          ++copies;
          continue;
        }
        if (!LayoutFreeView(reader.target) || reader.outputs.size() != 1) return std::nullopt;
        views.push_back(r);
        work.push_back(reader.outputs[0]);
      }
    }
    if (copies == 0) return std::nullopt;
    return views;
  }

 private:
  // Whether `v`, or a view of it (at any depth), is a graph output.
  bool Escapes(ir::ValueId v) const {
    absl::flat_hash_set<ir::ValueId> seen = {v};
    std::vector<ir::ValueId> work = {v};
    while (!work.empty()) {
      const ir::ValueId u = work.back();
      work.pop_back();
      if (outputs_.contains(u)) return true;
      for (int r : readers_[u]) {
        const ir::Node& reader = g_.nodes()[r];
        if (!IsView(reader)) continue;
        for (ir::ValueId o : reader.outputs) {
          if (seen.insert(o).second) work.push_back(o);
        }
      }
    }
    return false;
  }

  const ir::Graph& g_;
  std::vector<std::vector<int>> readers_;
  std::vector<bool> from_input_;  // a graph input or a view of one
  absl::flat_hash_set<ir::ValueId> outputs_;
};

// `n` again over the builder's operands, its outputs' metadata inferred
// from them (a view of a value whose layout changed).
absl::Status Rederive(ir::GraphBuilder& b, const ir::Graph& g, const ir::Node& n,
                      std::vector<ir::ValueId>* map) {
  std::vector<std::string> names;
  for (ir::ValueId o : n.outputs) names.push_back(g.value(o).name);
  ASSIGN_OR_RETURN(std::vector<ir::ValueId> out,
                   ops::Emit(b, ops::DefaultRegistry(), n.target, ir::MapArguments(n.args, *map),
                             ir::MapArguments(n.kwargs, *map), n.name, std::move(names)));
  for (size_t k = 0; k < n.outputs.size() && k < out.size(); ++k) (*map)[n.outputs[k]] = out[k];
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> ElideCopies(const ir::Graph& g, ir::Graph* out) {
  const Facts facts(g);
  const size_t count = g.nodes().size();
  // Copies only copied again, and the views between, taken again of the
  // first copy's input.
  std::vector<bool> recopied(count, false), rederive(count, false);
  // What each copy node that may go copies (Facts::Copied, asked once).
  std::vector<std::optional<ir::ValueId>> copies(count);
  for (size_t i = 0; i < count; ++i) {
    const ir::Node& n = g.nodes()[i];
    copies[i] = facts.Copied(n);
    if (!copies[i]) continue;
    std::optional<std::vector<int>> views = facts.OnlyRecopied(n);
    if (!views) continue;
    recopied[i] = true;
    for (int v : *views) rederive[v] = true;
  }

  ir::GraphBuilder b(g.name());
  std::vector<ir::ValueId> map = b.CopyInputs(g);
  int found = 0;
  for (size_t i = 0; i < count; ++i) {
    const ir::Node& n = g.nodes()[i];
    const std::optional<ir::ValueId>& copied = copies[i];
    if (recopied[i]) {
      map[n.outputs[0]] = map[*copied];
      ++found;
      continue;
    }
    bool moved = false;  // an operand whose layout or offset changed
    for (ir::ValueId v : ir::Graph::Operands(n)) {
      if (v == ir::kNoValue) continue;
      const ir::TensorMeta& before = g.value(v).meta;
      const ir::TensorMeta& now = b.value(map[v]).meta;
      moved |= !SameLayout(before, now) || !(before.storage_offset == now.storage_offset);
    }
    if (IsView(n) && (rederive[i] || moved)) {
      RETURN_IF_ERROR(Rederive(b, g, n, &map));
    } else {
      b.CopyNode(g, n, &map);
    }
    // A copy laid out as what it copies (its result's layout is the one the
    // node was given).
    if (copied && SameLayout(b.value(map[*copied]).meta, g.value(n.outputs[0]).meta)) {
      map[n.outputs[0]] = map[*copied];
      ++found;
    }
  }
  if (found == 0) return 0;
  for (ir::ValueId id : g.outputs()) b.AddOutput(map[id]);
  *out = std::move(b).Build();  // the last use of `g`, which may be *out
  ir::EliminateDeadCode(out);
  return found;
}

}  // namespace kiln::pipeline
