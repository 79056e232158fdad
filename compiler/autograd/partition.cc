#include "compiler/autograd/partition.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/sym_expr.h"

namespace kiln::autograd {
namespace {

using ir::kNoValue;
using ir::ValueId;

constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;
// Views followed from an operand to the value they view, at most.
constexpr int kMaxViewDepth = 32;

// k * x for a small k, saturating far below kInf.
int64_t SaturatingTimes(int64_t x, int k) { return x > kInf / 8 ? kInf / 2 : k * x; }

// Dinic's max-flow over a small adjacency-list network.
class FlowNetwork {
 public:
  explicit FlowNetwork(int n) : adj_(n), level_(n), it_(n) {}

  void AddEdge(int from, int to, int64_t cap) {
    adj_[from].push_back(static_cast<int>(edges_.size()));
    edges_.push_back({to, cap});
    adj_[to].push_back(static_cast<int>(edges_.size()));
    edges_.push_back({from, 0});
  }

  int64_t MaxFlow(int s, int t) {
    int64_t flow = 0;
    while (Bfs(s, t)) {
      std::fill(it_.begin(), it_.end(), 0);
      while (int64_t f = Dfs(s, t, kInf)) flow += f;
    }
    return flow;
  }

  // Vertices reachable from `s` in the residual network: the source side of
  // a minimum cut once MaxFlow has run.
  std::vector<bool> SourceSide(int s) const {
    std::vector<bool> seen(adj_.size(), false);
    std::deque<int> q{s};
    seen[s] = true;
    while (!q.empty()) {
      int v = q.front();
      q.pop_front();
      for (int e : adj_[v]) {
        if (edges_[e].cap > 0 && !seen[edges_[e].to]) {
          seen[edges_[e].to] = true;
          q.push_back(edges_[e].to);
        }
      }
    }
    return seen;
  }

 private:
  struct Edge {
    int to;
    int64_t cap;
  };

  bool Bfs(int s, int t) {
    std::fill(level_.begin(), level_.end(), -1);
    std::deque<int> q{s};
    level_[s] = 0;
    while (!q.empty()) {
      int v = q.front();
      q.pop_front();
      for (int e : adj_[v]) {
        if (edges_[e].cap > 0 && level_[edges_[e].to] < 0) {
          level_[edges_[e].to] = level_[v] + 1;
          q.push_back(edges_[e].to);
        }
      }
    }
    return level_[t] >= 0;
  }

  // Iterative blocking-flow search (graphs are deep: long pointwise chains).
  int64_t Dfs(int s, int t, int64_t limit) {
    std::vector<int> path_edges;
    std::vector<int> stack{s};
    while (!stack.empty()) {
      int v = stack.back();
      if (v == t) {
        int64_t f = limit;
        for (int e : path_edges) f = std::min(f, edges_[e].cap);
        for (int e : path_edges) {
          edges_[e].cap -= f;
          edges_[e ^ 1].cap += f;
        }
        return f;
      }
      bool advanced = false;
      for (; it_[v] < static_cast<int>(adj_[v].size()); ++it_[v]) {
        int e = adj_[v][it_[v]];
        int to = edges_[e].to;
        if (edges_[e].cap > 0 && level_[to] == level_[v] + 1) {
          path_edges.push_back(e);
          stack.push_back(to);
          advanced = true;
          break;
        }
      }
      if (!advanced) {
        level_[v] = -1;  // dead end
        stack.pop_back();
        if (!path_edges.empty()) {
          path_edges.pop_back();
          ++it_[stack.back()];
        }
      }
    }
    return 0;
  }

  std::vector<std::vector<int>> adj_;
  std::vector<Edge> edges_;
  std::vector<int> level_;
  std::vector<int> it_;
};

int64_t DTypeBytes(v1::DType t) {
  switch (t) {
    case v1::FLOAT64:
    case v1::INT64:
    case v1::COMPLEX64:
      return 8;
    case v1::COMPLEX128:
      return 16;
    case v1::FLOAT16:
    case v1::BFLOAT16:
    case v1::INT16:
      return 2;
    case v1::INT8:
    case v1::UINT8:
    case v1::BOOL:
      return 1;
    default:
      return 4;
  }
}

// Whether `v` is a boolean computed from floating-point values (relu's
// mask, a comparison of its result with 0). Saved, it costs a byte an
// element once; recomputed, every backward kernel that needs it reads
// what it is computed from again, two to eight bytes an element of each
// (a conv net's residual relu: the block's input and the convolution's
// result, both saved anyway, read by each of four batch norm kernels).
// The cut does not see those reads, so such a mask the backward reads is
// always saved.
bool NarrowMask(const ir::Graph& g, ValueId v) {
  const ir::Value& val = g.value(v);
  if (val.meta.dtype != v1::BOOL || val.producer < 0) return false;
  bool any = false;
  for (ValueId u : ir::Graph::Operands(g.nodes()[val.producer])) {
    if (u == kNoValue) continue;
    switch (g.value(u).meta.dtype) {
      case v1::FLOAT16:
      case v1::BFLOAT16:
      case v1::FLOAT32:
      case v1::FLOAT64:
        any = true;
        break;
      default:
        return false;
    }
  }
  return any;
}

// A subgraph of `g` computing `outputs` from `inputs` (which become its
// placeholders), with every node they need and no other.
absl::StatusOr<ir::Graph> Extract(const ir::Graph& g, const std::string& name,
                                  const std::vector<ValueId>& inputs,
                                  const std::vector<ValueId>& outputs,
                                  std::vector<int>* included_nodes) {
  std::vector<bool> is_input(g.values().size(), false);
  for (ValueId v : inputs) is_input[v] = true;
  std::vector<bool> needed(g.values().size(), false);
  for (ValueId v : outputs) needed[v] = true;
  std::vector<bool> include(g.nodes().size(), false);
  for (int i = static_cast<int>(g.nodes().size()) - 1; i >= 0; --i) {
    const ir::Node& node = g.nodes()[i];
    for (ValueId v : node.outputs) include[i] = include[i] || (needed[v] && !is_input[v]);
    if (!include[i]) continue;
    for (ValueId u : ir::Graph::Operands(node)) needed[u] = true;
  }
  for (size_t v = 0; v < g.values().size(); ++v) {
    if (needed[v] && !is_input[v] && g.value(static_cast<ValueId>(v)).producer < 0) {
      return absl::InternalError(absl::StrCat("partition: graph '", name, "' needs '",
                                              g.value(static_cast<ValueId>(v)).name,
                                              "', which it neither computes nor receives"));
    }
  }
  ir::GraphBuilder b(name);
  std::vector<ValueId> map(g.values().size(), kNoValue);
  for (ValueId v : inputs) {
    const ir::Value& val = g.value(v);
    v1::Placeholder::Kind kind = v1::Placeholder::USER_INPUT;
    if (val.producer < 0) kind = g.inputs()[val.index].kind;
    map[v] = b.AddInput(val.meta, kind, val.name);
  }
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (!include[i]) continue;
    if (included_nodes != nullptr) included_nodes->push_back(static_cast<int>(i));
    b.CopyNode(g, g.nodes()[i], &map);
  }
  for (ValueId v : outputs) b.AddOutput(map[v]);
  return std::move(b).Build();
}

}  // namespace

int64_t ValueBytes(const ir::TensorMeta& meta, int64_t hint) {
  // Saturates at 1 TiB, far below kInf, so that a huge value (many
  // symbolic dimensions at the hint) is an expensive cut, never an infinite
  // or a negative one, and the flow's sum of cuts cannot overflow.
  constexpr int64_t kMaxBytes = int64_t{1} << 40;
  int64_t n = DTypeBytes(meta.dtype);
  for (const auto& s : meta.sizes) {
    const int64_t d = s.is_constant() ? s.constant() : hint;
    if (d <= 0) return 0;
    if (__builtin_mul_overflow(n, d, &n) || n > kMaxBytes) return kMaxBytes;
  }
  return n;
}

// The value that `u` is a view of, through views of views (at most
// kMaxViewDepth); `u` itself when it is no view.
ValueId ViewBase(const ir::Graph& g, const ops::Registry& registry, ValueId u) {
  for (int depth = 0; depth < kMaxViewDepth; ++depth) {
    const int p = g.value(u).producer;
    const ops::OpDef* d = p >= 0 ? registry.Find(g.nodes()[p].target) : nullptr;
    if (d == nullptr || !d->traits.view) break;
    const ValueId base = ir::Graph::Operands(g.nodes()[p])[0];
    if (base == kNoValue) break;
    u = base;
  }
  return u;
}

// The forward values (`backward` false) that a forward node reads after a
// matmul or a convolution that depends on them: a transformer's residual
// stream, which a layer norm reads before the block's matmuls and the
// residual add after them. No kernel holds both readers, so the forward
// writes such a value (or computes it again after the matmul, from values
// that are in memory). A value read through views marks the views' base.
std::vector<bool> ReadAcrossMatmuls(const ir::Graph& g, const std::vector<bool>& backward,
                                    const ops::Registry& registry) {
  const int nv = static_cast<int>(g.values().size());
  std::vector<bool> out(nv, false);
  auto forward = [&](const ir::Node& n) { return !n.outputs.empty() && !backward[n.outputs[0]]; };
  auto expensive = [&](const ir::Node& n) {
    const ops::OpDef* d = registry.Find(n.target);
    return d != nullptr && d->traits.expensive && forward(n);
  };
  // Bit k: the k-th forward matmul or convolution. The two sets per value
  // below take at most kMaxSetBytes, and at most 4096 bits each; later
  // matmuls are not told apart (a value read across them only is not
  // found: a cost left out, never a wrong graph).
  constexpr size_t kMaxSetBytes = size_t{32} << 20;
  const int max_bits = static_cast<int>(
      std::clamp<size_t>(kMaxSetBytes / (2 * sizeof(uint64_t) * std::max(nv, 1)) * 64, 64, 4096));
  std::vector<int> bit(g.nodes().size(), -1);
  int bits = 0;
  for (size_t i = 0; i < g.nodes().size() && bits < max_bits; ++i) {
    if (expensive(g.nodes()[i])) bit[i] = bits++;
  }
  if (bits == 0) return out;
  const size_t words = (bits + 63) / 64;
  // before[v]: the matmuls v depends on; after[v]: the matmuls that depend
  // on v (nodes are in topological order).
  std::vector<uint64_t> before(nv * words, 0), after(nv * words, 0);
  auto row = [&](std::vector<uint64_t>& set, ValueId v) { return set.data() + v * words; };
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const ir::Node& n = g.nodes()[i];
    if (!forward(n)) continue;
    for (ValueId o : n.outputs) {
      uint64_t* dst = row(before, o);
      for (ValueId u : ir::Graph::Operands(n)) {
        if (u == kNoValue) continue;
        const uint64_t* src = row(before, u);
        for (size_t w = 0; w < words; ++w) dst[w] |= src[w];
      }
      if (bit[i] >= 0) dst[bit[i] / 64] |= uint64_t{1} << (bit[i] % 64);
    }
  }
  for (int i = static_cast<int>(g.nodes().size()) - 1; i >= 0; --i) {
    const ir::Node& n = g.nodes()[i];
    if (!forward(n)) continue;
    for (ValueId u : ir::Graph::Operands(n)) {
      if (u == kNoValue) continue;
      uint64_t* dst = row(after, u);
      for (ValueId o : n.outputs) {
        const uint64_t* src = row(after, o);
        for (size_t w = 0; w < words; ++w) dst[w] |= src[w];
      }
      if (bit[i] >= 0) dst[bit[i] / 64] |= uint64_t{1} << (bit[i] % 64);
    }
  }
  std::vector<uint64_t> reached(words);
  for (const ir::Node& n : g.nodes()) {
    if (!forward(n) || bit[&n - g.nodes().data()] >= 0) continue;
    // The matmuls n depends on; one of them that depends on an operand u
    // (none can depend on u through u itself: before(u) and after(u) are
    // disjoint).
    std::fill(reached.begin(), reached.end(), 0);
    for (ValueId w : ir::Graph::Operands(n)) {
      if (w == kNoValue) continue;
      const uint64_t* a = row(before, w);
      for (size_t k = 0; k < words; ++k) reached[k] |= a[k];
    }
    for (ValueId u : ir::Graph::Operands(n)) {
      if (u == kNoValue) continue;
      const uint64_t* b = row(after, u);
      bool across = false;
      for (size_t k = 0; k < words && !across; ++k) across = (reached[k] & b[k]) != 0;
      if (!across) continue;
      out[ViewBase(g, registry, u)] = true;
    }
  }
  return out;
}

// The symbols the sizes, strides and offsets of `g`'s values use that no
// dimension of its inputs binds (is the symbol alone).
std::set<std::string> UnboundSymbols(const ir::Graph& g) {
  std::set<std::string> bound, used;
  for (const auto& in : g.inputs()) {
    for (const ir::SymInt& s : g.value(in.value).meta.sizes) {
      if (!s.is_constant() && ir::IsSymbolName(s.expr())) bound.insert(s.expr());
    }
  }
  std::vector<std::string> symbols;
  auto collect = [&](const ir::SymInt& s) {
    if (s.is_constant()) return;
    absl::StatusOr<ir::SymExpr> e = ir::SymExpr::Parse(s.expr());
    if (e.ok()) e->CollectSymbols(&symbols);
  };
  for (const ir::Value& v : g.values()) {
    for (const ir::SymInt& s : v.meta.sizes) collect(s);
    for (const ir::SymInt& s : v.meta.strides) collect(s);
    collect(v.meta.storage_offset);
  }
  for (const std::string& s : symbols) {
    if (bound.count(s) == 0) used.insert(s);
  }
  return used;
}

absl::StatusOr<Partition> PartitionJointGraph(const JointGraph& joint,
                                              const PartitionOptions& options) {
  const ir::Graph& g = joint.graph;
  const int nv = static_cast<int>(g.values().size());
  const ops::Registry& registry = ops::DefaultRegistry();

  // Tangent-dependent values belong to the backward.
  std::vector<bool> backward(nv, false);
  for (size_t i = joint.num_primals; i < g.inputs().size(); ++i)
    backward[g.inputs()[i].value] = true;
  for (const ir::Node& node : g.nodes()) {
    bool td = false;
    for (ValueId u : ir::Graph::Operands(node)) td = td || backward[u];
    for (ValueId v : node.outputs) backward[v] = td;
  }
  // What the forward outputs need. A node the forward runs yields all of
  // its outputs there (layer norm's mean and rstd come with its result).
  std::vector<bool> fwd_needed(nv, false);
  for (int i = 0; i < joint.num_forward_outputs; ++i) fwd_needed[g.outputs()[i]] = true;
  for (int i = static_cast<int>(g.nodes().size()) - 1; i >= 0; --i) {
    const ir::Node& node = g.nodes()[i];
    bool any = false;
    for (ValueId v : node.outputs) any = any || fwd_needed[v];
    if (!any) continue;
    for (ValueId v : node.outputs) fwd_needed[v] = true;
    for (ValueId u : ir::Graph::Operands(node)) fwd_needed[u] = true;
  }
  // Forward values the backward reads.
  std::vector<bool> bw_read(nv, false);
  for (const ir::Node& node : g.nodes()) {
    if (node.outputs.empty() || !backward[node.outputs[0]]) continue;
    for (ValueId u : ir::Graph::Operands(node)) bw_read[u] = bw_read[u] || !backward[u];
  }
  for (size_t i = joint.num_forward_outputs; i < g.outputs().size(); ++i) {
    ValueId v = g.outputs()[i];
    if (!backward[v]) bw_read[v] = true;
  }
  // Values compared for equality (amax's gradient goes where self equals
  // the max) are never recomputed: recomputed by other code (another
  // kernel, another backend, another vector width), one could differ in the
  // last bit from what the forward reduced, and the gradient would be lost
  // or NaN.
  std::vector<bool> compared(nv, false);
  for (const ir::Node& node : g.nodes()) {
    if (node.target != "aten.eq.Tensor" && node.target != "aten.ne.Tensor") continue;
    for (ValueId u : ir::Graph::Operands(node)) compared[u] = true;
  }

  // The values a matmul or a convolution reads, directly or through views
  // (the views' base), in the forward and in the backward: ATen's kernels
  // read their operands from memory, so such a value is written there.
  std::vector<bool> fwd_in_memory(nv, false), bwd_in_memory(nv, false);
  for (const ir::Node& node : g.nodes()) {
    const ops::OpDef* def = registry.Find(node.target);
    if (def == nullptr || !def->traits.expensive || node.outputs.empty()) continue;
    std::vector<bool>& in_memory = backward[node.outputs[0]] ? bwd_in_memory : fwd_in_memory;
    for (ValueId u : ir::Graph::Operands(node)) {
      if (u != kNoValue) in_memory[ViewBase(g, registry, u)] = true;
    }
  }

  const std::vector<bool> across = ReadAcrossMatmuls(g, backward, registry);

  std::vector<bool> saved(nv, false);
  if (!options.min_cut) {
    saved = bw_read;
  } else {
    const int S = 2 * nv, T = 2 * nv + 1;
    FlowNetwork net(2 * nv + 2);
    // Saving a value costs the backward's read of it, and for a value that
    // exists only because it is saved, the forward's write too: a primal, a
    // forward output or what a matmul or a convolution writes (ATen's
    // kernels materialize it) costs its bytes once, anything else twice.
    // (RMS norm's backward then reads x and the per-row rstd rather than a
    // saved x * rstd that the forward would have to write; a batch norm's
    // backward reads the convolution's output rather than a saved x - mean.)
    // A forward matmul's operand is written anyway too, and so is a value
    // read on both sides of a matmul (ReadAcrossMatmuls). Recomputing a value
    // that a backward matmul reads costs three times its bytes: the backward
    // reads what it is computed from (about its size, for a pointwise op),
    // writes it, and the matmul reads it back, where saving it costs that
    // last read (and the forward's write, if it was not written anyway). So
    // attention's heads copied into the batched matmuls' layout are saved
    // rather than copied again from the projection they came from, and so is
    // an MLP's activation, which the forward writes for its second matmul,
    // rather than computed again for the weight's gradient.
    std::vector<bool> exists(nv, false);
    for (int i = 0; i < joint.num_forward_outputs; ++i) exists[g.outputs()[i]] = true;
    for (ValueId v = 0; v < nv; ++v) {
      if (backward[v]) continue;
      const ir::Value& val = g.value(v);
      const ops::OpDef* def =
          val.producer >= 0 ? registry.Find(g.nodes()[val.producer].target) : nullptr;
      const bool materialized = val.producer < 0 || exists[v] || fwd_in_memory[v] || across[v] ||
                                (def != nullptr && def->traits.expensive);
      const int64_t bytes = std::max<int64_t>(1, ValueBytes(val.meta, options.symbolic_size_hint));
      net.AddEdge(2 * v, 2 * v + 1, materialized ? bytes : SaturatingTimes(bytes, 2));
      bool recomputable = false;
      if (val.producer >= 0) {
        const ir::Node& node = g.nodes()[val.producer];
        recomputable = def != nullptr && (def->traits.pointwise || def->traits.view) &&
                       !def->traits.random && !def->traits.expensive && !compared[v];
        for (ValueId u : ir::Graph::Operands(node)) net.AddEdge(2 * u + 1, 2 * v, kInf);
      }
      // Primals exist before the forward runs; a value the forward computes
      // anyway and the backward may not recompute is on the forward's side,
      // and so is a mask the backward reads (NarrowMask). Everything else
      // may land on either side of the cut.
      if (val.producer < 0 || (fwd_needed[v] && !recomputable) ||
          (recomputable && bw_read[v] && NarrowMask(g, v))) {
        net.AddEdge(S, 2 * v, kInf);
      } else if (bwd_in_memory[v]) {
        net.AddEdge(S, 2 * v, SaturatingTimes(bytes, 3));
      }
      if (bw_read[v]) net.AddEdge(2 * v + 1, T, kInf);
    }
    net.MaxFlow(S, T);
    std::vector<bool> side = net.SourceSide(S);
    for (ValueId v = 0; v < nv; ++v) {
      if (!backward[v] && side[2 * v] && !side[2 * v + 1]) saved[v] = true;
    }
  }

  Partition p;
  std::vector<int> bw_nodes;
  // Twice at most: a symbol the backward's sizes use (Max(1, s0 - 1) of a
  // slice) that no saved value's or tangent's dimension binds is bound by
  // saving a primal that has it as a dimension (a reference: primals exist
  // anyway), and the graphs are extracted again.
  for (int attempt = 0;; ++attempt) {
    p = Partition();
    p.num_forward_outputs = joint.num_forward_outputs;
    std::vector<ValueId> primals, fwd_outputs, saved_values, bw_inputs, grads;
    for (int i = 0; i < joint.num_primals; ++i) primals.push_back(g.inputs()[i].value);
    for (int i = 0; i < joint.num_forward_outputs; ++i) fwd_outputs.push_back(g.outputs()[i]);
    for (ValueId v = 0; v < nv; ++v) {
      if (!saved[v]) continue;
      saved_values.push_back(v);
      p.saved.push_back(g.value(v).name);
      p.saved_bytes += ValueBytes(g.value(v).meta, options.symbolic_size_hint);
    }
    fwd_outputs.insert(fwd_outputs.end(), saved_values.begin(), saved_values.end());
    ASSIGN_OR_RETURN(p.forward,
                     Extract(g, absl::StrCat(g.name(), "_forward"), primals, fwd_outputs, nullptr));
    bw_inputs = saved_values;
    for (size_t i = joint.num_primals; i < g.inputs().size(); ++i)
      bw_inputs.push_back(g.inputs()[i].value);
    for (size_t i = joint.num_forward_outputs; i < g.outputs().size(); ++i)
      grads.push_back(g.outputs()[i]);
    bw_nodes.clear();
    ASSIGN_OR_RETURN(p.backward,
                     Extract(g, absl::StrCat(g.name(), "_backward"), bw_inputs, grads, &bw_nodes));
    if (attempt > 0) break;
    const std::set<std::string> unbound = UnboundSymbols(p.backward);
    bool more = false;
    for (ValueId v : primals) {
      for (const ir::SymInt& s : g.value(v).meta.sizes) {
        if (saved[v] || s.is_constant() || unbound.count(s.expr()) == 0) continue;
        saved[v] = more = true;
      }
    }
    if (!more) break;
  }
  for (int i : bw_nodes) {
    const ir::Node& node = g.nodes()[i];
    if (joint.forward_nodes.contains(node.name) && !node.outputs.empty()) {
      p.recomputed.push_back(g.value(node.outputs[0]).name);
    }
  }
  return p;
}

}  // namespace kiln::autograd
