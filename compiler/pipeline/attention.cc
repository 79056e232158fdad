#include "compiler/pipeline/attention.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/dead_code.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_util.h"

namespace kiln::pipeline {
namespace {

constexpr char kEfficientAttention[] = "aten._scaled_dot_product_efficient_attention.default";
constexpr char kScaledDotProductAttention[] = "aten.scaled_dot_product_attention.default";
constexpr char kFlashAttention[] = "aten._flash_attention_forward.default";
constexpr int64_t kMaxHeadDim = 256;
// Beyond this head dim memory-efficient attention is slower than the
// matmuls it replaces: its backward (bfloat16 on an H100, a GPT-2 block
// with heads of 192: 2x slower than unfused), and its forward, whose only
// kernel for such heads keeps the output in global memory (float32 on an
// H100, heads of 192: 397 us per block against 369 us for the matmuls and
// the softmax). 16-bit training stays with the matmuls too: flash
// attention's forward and backward for heads of 192 (bfloat16, H100) made a
// GPT-2 block's training step 1523 us of kernels against 1481 us.
// float32 training stays with them at any head dim: memory-efficient
// attention's forward and backward took as long as the matmuls and the
// softmax kernels (2646 us against 2686 us for [8, 12, 1024, 64] on an
// H100), and its layouts cost copies on top (the output gradient made
// contiguous along [B, L, H, D], the input gradients made contiguous along
// [B, H, L, D], its backward's own row sums of dO * O): 2923 us of kernels
// per step against Inductor's 2804 us, which keeps the matmuls.
constexpr int64_t kMaxEfficientHeadDim = 128;

// Who makes each value, and how many times it is read (graph outputs count).
struct Uses {
  std::vector<int> producer;  // node index, -1 for inputs
  std::vector<int> readers;
};

Uses CountUses(const ir::Graph& g) {
  Uses u{std::vector<int>(g.values().size(), -1), std::vector<int>(g.values().size(), 0)};
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    for (ir::ValueId out : g.nodes()[i].outputs) u.producer[out] = static_cast<int>(i);
    for (ir::ValueId in : ir::Graph::Operands(g.nodes()[i])) ++u.readers[in];
  }
  for (ir::ValueId out : g.outputs()) ++u.readers[out];
  return u;
}

// The node making `v` when its target is `target` (and `v` is its first
// output), else null.
const ir::Node* MadeBy(const ir::Graph& g, const Uses& u, ir::ValueId v, const char* target) {
  const int p = u.producer[v];
  if (p < 0) return nullptr;
  const ir::Node& n = g.nodes()[p];
  return n.target == target && n.outputs[0] == v ? &n : nullptr;
}

std::optional<ir::ValueId> TensorArg(const ir::Node& n, size_t i) {
  if (i >= n.args.size()) return std::nullopt;
  const auto* v = std::get_if<ir::ValueId>(&n.args[i].kind);
  return v != nullptr ? std::optional<ir::ValueId>(*v) : std::nullopt;
}

// Walks back from `v` over reshapes that keep every element where it is
// logically: view, clone, and expand to its operand's own sizes, each read
// by the chain alone. Returns the value they start from.
ir::ValueId Peel(const ir::Graph& g, const Uses& u, ir::ValueId v) {
  while (u.readers[v] == 1 && u.producer[v] >= 0) {
    const ir::Node& n = g.nodes()[u.producer[v]];
    std::optional<ir::ValueId> in = TensorArg(n, 0);
    if (!in || n.outputs.size() != 1) break;
    const bool reshape = n.target == "aten.view.default" ||
                         n.target == "aten._unsafe_view.default" ||
                         n.target == "aten.clone.default";
    const bool same_expand =
        n.target == "aten.expand.default" && g.value(*in).meta.sizes == g.value(v).meta.sizes;
    if (!reshape && !same_expand) break;
    v = *in;
  }
  return v;
}

struct Match {
  ir::ValueId q, k, v, out;
  double scale;
  int rank;
};

// Whether a batched matmul operand of sizes [BH, rows, cols] is `source`
// ([B, H, rows, cols] or [BH, rows, cols]) reshaped. The verified graph's
// views keep the element count, so equal trailing dims make BH = B * H.
bool ReshapeOf(const ir::Graph& g, ir::ValueId operand, ir::ValueId source) {
  const std::vector<ir::SymInt>& op = g.value(operand).meta.sizes;
  const std::vector<ir::SymInt>& src = g.value(source).meta.sizes;
  if (op.size() != 3 || (src.size() != 3 && src.size() != 4)) return false;
  const size_t r = src.size();
  return op[1] == src[r - 2] && op[2] == src[r - 1] && (r == 4 || op[0] == src[0]);
}

// Whether `v` can feed the fused kernel: a CUDA tensor of `dtype` with a
// last stride of 1 and a constant last dimension the kernel handles (the
// other sizes may be symbolic: they are the kernel's arguments).
bool Fits(const ir::TensorMeta& m, v1::DType dtype) {
  if (m.device_type != "cuda" || m.dtype != dtype || m.strides.empty()) return false;
  const ir::SymInt& last_stride = m.strides.back();
  const ir::SymInt& last = m.sizes.back();
  return last_stride.is_constant() && last_stride.constant() == 1 && last.is_constant() &&
         last.constant() % 8 == 0 && last.constant() <= kMaxHeadDim;
}

// The match whose `out` is the output of the view node `anchor`.
std::optional<Match> MatchAt(const ir::Graph& g, const Uses& u, const ir::Node& anchor) {
  if (anchor.target != "aten.view.default" && anchor.target != "aten._unsafe_view.default") {
    return std::nullopt;
  }
  std::optional<ir::ValueId> o3 = TensorArg(anchor, 0);
  if (!o3 || u.readers[*o3] != 1) return std::nullopt;
  const ir::Node* bmm2 = MadeBy(g, u, *o3, "aten.bmm.default");
  if (bmm2 == nullptr) return std::nullopt;
  std::optional<ir::ValueId> p3 = TensorArg(*bmm2, 0), v3 = TensorArg(*bmm2, 1);
  if (!p3 || !v3) return std::nullopt;
  const ir::ValueId p = Peel(g, u, *p3);
  const ir::Node* softmax = MadeBy(g, u, p, "aten._softmax.default");
  if (softmax == nullptr || u.readers[p] != 1 || softmax->args.size() != 3) return std::nullopt;
  const auto* half_to_float = std::get_if<bool>(&softmax->args[2].kind);
  const auto* dim = std::get_if<int64_t>(&softmax->args[1].kind);
  const int rank = static_cast<int>(g.value(p).meta.sizes.size());
  if (half_to_float == nullptr || *half_to_float || dim == nullptr ||
      (*dim != -1 && *dim != rank - 1)) {
    return std::nullopt;
  }
  std::optional<ir::ValueId> scaled = TensorArg(*softmax, 0);
  if (!scaled || u.readers[*scaled] != 1) return std::nullopt;
  const ir::Node* scaling = MadeBy(g, u, *scaled, "aten.div.Scalar");
  const bool divides = scaling != nullptr;
  if (scaling == nullptr) scaling = MadeBy(g, u, *scaled, "aten.mul.Scalar");
  if (scaling == nullptr || scaling->args.size() != 2) return std::nullopt;
  double c = 0;
  if (const auto* d = std::get_if<double>(&scaling->args[1].kind)) {
    c = *d;
  } else if (const auto* i = std::get_if<int64_t>(&scaling->args[1].kind)) {
    c = static_cast<double>(*i);
  } else {
    return std::nullopt;
  }
  if (!std::isfinite(c) || c <= 0) return std::nullopt;
  std::optional<ir::ValueId> scores = TensorArg(*scaling, 0);
  if (!scores) return std::nullopt;
  const ir::ValueId s3 = Peel(g, u, *scores);
  const ir::Node* bmm1 = MadeBy(g, u, s3, "aten.bmm.default");
  if (bmm1 == nullptr || u.readers[s3] != 1) return std::nullopt;
  std::optional<ir::ValueId> q3 = TensorArg(*bmm1, 0), kt3 = TensorArg(*bmm1, 1);
  if (!q3 || !kt3) return std::nullopt;
  const ir::ValueId q = Peel(g, u, *q3), kt = Peel(g, u, *kt3), v = Peel(g, u, *v3);
  const ir::Node* transpose = MadeBy(g, u, kt, "aten.permute.default");
  if (transpose == nullptr) return std::nullopt;
  const auto* dims = std::get_if<std::vector<int64_t>>(&transpose->args[1].kind);
  const std::vector<int64_t> swap4 = {0, 1, 3, 2}, swap3 = {0, 2, 1};
  if (dims == nullptr || *dims != (rank == 4 ? swap4 : swap3)) return std::nullopt;
  const ir::ValueId k = *TensorArg(*transpose, 0);

  // Shapes: q [.., L, D], k [.., S, D], v [.., S, Dv], out [.., L, Dv].
  const ir::TensorMeta &qm = g.value(q).meta, &km = g.value(k).meta, &vm = g.value(v).meta;
  const ir::TensorMeta& om = g.value(anchor.outputs[0]).meta;
  if ((rank != 3 && rank != 4) || !Fits(qm, qm.dtype) || !Fits(km, qm.dtype) ||
      !Fits(vm, qm.dtype) || om.dtype != qm.dtype) {
    return std::nullopt;
  }
  if (qm.dtype != v1::FLOAT32 && qm.dtype != v1::FLOAT16 && qm.dtype != v1::BFLOAT16) {
    return std::nullopt;
  }
  const std::vector<ir::SymInt>&qs = qm.sizes, &ks = km.sizes, &vs = vm.sizes, &os = om.sizes;
  if (qs.size() != static_cast<size_t>(rank) || ks.size() != qs.size() || vs.size() != qs.size() ||
      os.size() != qs.size()) {
    return std::nullopt;
  }
  for (int d = 0; d < rank - 2; ++d) {
    if (!(ks[d] == qs[d]) || !(vs[d] == qs[d]) || !(os[d] == qs[d])) return std::nullopt;
  }
  if (!(ks[rank - 1] == qs[rank - 1]) || !(vs[rank - 2] == ks[rank - 2]) ||
      !(os[rank - 2] == qs[rank - 2]) || !(os[rank - 1] == vs[rank - 1])) {
    return std::nullopt;
  }
  if (!ReshapeOf(g, *q3, q) || !ReshapeOf(g, *v3, v) || !ReshapeOf(g, *p3, p)) return std::nullopt;
  // The out must be contiguous: the copy after the fused kernel writes it so.
  if (!ops::IsContiguous(om)) return std::nullopt;
  return Match{q, k, v, anchor.outputs[0], divides ? 1.0 / c : c, rank};
}

// Emits the fused kernel for `m` (operands already mapped into `b`) and
// the copy into out's layout; returns the new out.
// Whether the composite (inference) or flash attention (training) runs a
// match with this query and value, rather than memory-efficient attention:
// 16-bit on a target with fused 16-bit kernels, head dims equal.
bool Fused16Bit(const ir::TensorMeta& q, const ir::TensorMeta& v, const AttentionOptions& options) {
  return options.flash && q.dtype != v1::FLOAT32 && q.sizes.back() == v.sizes.back();
}

absl::StatusOr<ir::ValueId> EmitFused(ir::GraphBuilder& b, const Match& m,
                                      const std::vector<ir::ValueId>& map,
                                      const ir::TensorMeta& out_meta,
                                      const AttentionOptions& options) {
  const ops::Registry& registry = ops::DefaultRegistry();
  auto emit = [&](const char* target, std::vector<ir::Argument> args,
                  std::vector<ir::Argument> kwargs = {}) -> absl::StatusOr<ir::ValueId> {
    ASSIGN_OR_RETURN(std::vector<ir::ValueId> out,
                     ops::Emit(b, registry, target, std::move(args), std::move(kwargs)));
    return out[0];
  };
  ir::ValueId q = map[m.q], k = map[m.k], v = map[m.v];
  if (m.rank == 3) {  // a head dimension of 1
    for (ir::ValueId* x : {&q, &k, &v}) {
      ASSIGN_OR_RETURN(
          *x, emit("aten.unsqueeze.default", {ir::Positional(*x), ir::Positional(int64_t{1})}));
    }
  }
  const ir::Argument scale{"scale", m.scale};
  ir::ValueId o = ir::kNoValue;
  const bool fused_16bit = Fused16Bit(b.value(q).meta, b.value(v).meta, options);
  if (fused_16bit && options.training) {
    // Flash attention, whose backward the registry has; it reads and writes
    // [B, L, H, D]: views both ways.
    const std::vector<int64_t> swap_heads = {0, 2, 1, 3};
    for (ir::ValueId* x : {&q, &k, &v}) {
      ASSIGN_OR_RETURN(
          *x, emit("aten.permute.default", {ir::Positional(*x), ir::Positional(swap_heads)}));
    }
    const ir::SymInt max_q = b.value(q).meta.sizes[1], max_k = b.value(k).meta.sizes[1];
    ASSIGN_OR_RETURN(o, emit(kFlashAttention,
                             {ir::Positional(q), ir::Positional(k), ir::Positional(v),
                              ir::Positional(ir::None{}), ir::Positional(ir::None{}),
                              ir::Positional(max_q), ir::Positional(max_k), ir::Positional(0.0),
                              ir::Positional(false), ir::Positional(false)},
                             {scale}));
    ASSIGN_OR_RETURN(o,
                     emit("aten.permute.default", {ir::Positional(o), ir::Positional(swap_heads)}));
  } else if (fused_16bit) {
    ASSIGN_OR_RETURN(o, emit(kScaledDotProductAttention,
                             {ir::Positional(q), ir::Positional(k), ir::Positional(v)}, {scale}));
  } else {
    ASSIGN_OR_RETURN(o, emit(kEfficientAttention,
                             {ir::Positional(q), ir::Positional(k), ir::Positional(v),
                              ir::Positional(ir::None{}), ir::Positional(options.training)},
                             {scale}));
  }
  auto copy = [&](ir::ValueId x) {
    return emit("aten.clone.default", {ir::Positional(x)},
                {ir::Argument{"memory_format", v1::CONTIGUOUS_FORMAT}});
  };
  if (m.rank == 3) {  // drop the head dimension of 1 from a contiguous result
    if (!ops::IsContiguous(b.value(o).meta)) {
      ASSIGN_OR_RETURN(o, copy(o));
    }
    std::vector<ir::SymInt> sizes(out_meta.sizes.begin(), out_meta.sizes.end());
    return emit("aten.view.default", {ir::Positional(o), ir::Positional(std::move(sizes))});
  }
  if (b.value(o).meta.strides == out_meta.strides) return o;  // laid out as out already
  return copy(o);
}

}  // namespace

absl::StatusOr<int> RewriteAttention(const ir::Graph& g, ir::Graph* out,
                                     const AttentionOptions& options) {
  const Uses uses = CountUses(g);
  std::vector<std::optional<Match>> matches(g.nodes().size());
  int found = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    matches[i] = MatchAt(g, uses, g.nodes()[i]);
    if (!matches[i]) continue;
    const ir::TensorMeta& q = g.value(matches[i]->q).meta;
    const ir::TensorMeta& v = g.value(matches[i]->v).meta;
    const bool efficient = options.training || !Fused16Bit(q, v, options);
    if ((efficient &&
         std::max(q.sizes.back().constant(), v.sizes.back().constant()) > kMaxEfficientHeadDim) ||
        (options.training && q.dtype == v1::FLOAT32)) {
      matches[i].reset();
    }
    found += matches[i].has_value();
  }
  if (found == 0) return 0;
  ir::GraphBuilder b(g.name());
  std::vector<ir::ValueId> map = b.CopyInputs(g);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (!matches[i]) {
      b.CopyNode(g, g.nodes()[i], &map);
      continue;
    }
    ASSIGN_OR_RETURN(map[matches[i]->out],
                     EmitFused(b, *matches[i], map, g.value(matches[i]->out).meta, options));
  }
  for (ir::ValueId id : g.outputs()) b.AddOutput(map[id]);
  *out = std::move(b).Build();  // the last use of `g`, which may be *out
  ir::EliminateDeadCode(out);
  return found;
}

}  // namespace kiln::pipeline
