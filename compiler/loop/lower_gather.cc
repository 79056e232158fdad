// Pass "lower" (lower.h), gathers: embedding, index_select, gather and
// advanced indexing (index.Tensor) as a GatherSpec, a load whose position in
// the gathered dimensions comes from index tensors.
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/loop/fuse_internal.h"
#include "compiler/ops/shape_util.h"

namespace kiln::loop::fuse_internal {
namespace {

using ir::SymInt;
using ir::ValueId;

SymInt Zero() { return SymInt{int64_t{0}}; }

// The strides over an output of rank `out_rank` of index tensor `m`
// broadcast (right-aligned) over the output dims [first, first + rank).
std::vector<SymInt> IndexOver(const ir::TensorMeta& m, const SymSizes& broadcast, int first,
                              int out_rank) {
  std::vector<SymInt> over(out_rank, Zero());
  const int rank = static_cast<int>(broadcast.size());
  const int lead = rank - static_cast<int>(m.sizes.size());
  for (int j = 0; j < static_cast<int>(m.sizes.size()); ++j) {
    if (ops::IsConstant(m.sizes[j], 1) && !ops::IsConstant(broadcast[lead + j], 1)) continue;
    over[first + lead + j] = m.strides[j];
  }
  return over;
}

// "why" for a gather kiln leaves to ATen, or OK with `spec` filled.
absl::Status Refuse(std::string* why, std::string text) {
  *why = std::move(text);
  return absl::OkStatus();
}

bool IndexDType(v1::DType t) { return t == v1::INT64 || t == v1::INT32; }

// Advanced indexing of a tensor `s` (`indices`: index tensors and None):
// `spec`'s positions in `s` (its source left to the caller) over the
// result, whose sizes go to `result`.
absl::Status IndexPositions(const ir::Graph& g, const ir::TensorMeta& s,
                            const std::vector<ValueId>& indices, GatherSpec* spec, SymSizes* result,
                            std::string* why) {
  int first = -1, last = -1, indexed_dims = 0;
  bool adjacent = true;
  SymSizes broadcast;
  if (indices.size() > s.sizes.size()) return Refuse(why, "it has more indices than dims");
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] == ir::kNoValue) continue;
    const ir::TensorMeta& m = g.value(indices[i]).meta;
    if (!IndexDType(m.dtype)) {
      return Refuse(why, absl::StrCat("index ", i, " has dtype ", v1::DType_Name(m.dtype)));
    }
    ++indexed_dims;
    if (first < 0) {
      broadcast = m.sizes;
      first = static_cast<int>(i);
    } else {
      if (last != static_cast<int>(i) - 1) adjacent = false;
      absl::StatusOr<SymSizes> b = ops::BroadcastSizes(broadcast, m.sizes);
      if (!b.ok()) return Refuse(why, std::string(b.status().message()));
      broadcast = *std::move(b);
    }
    last = static_cast<int>(i);
  }
  if (first < 0) return Refuse(why, "it has no index tensor");
  // Index sizes that broadcast only by assumption (a symbol against
  // another): the kernel would read past the smaller; ATen checks.
  for (ValueId v : indices) {
    if (v == ir::kNoValue) continue;
    const SymSizes& sizes = g.value(v).meta.sizes;
    const size_t lead = broadcast.size() - sizes.size();
    for (size_t j = 0; j < sizes.size(); ++j) {
      if (!ops::IsConstant(sizes[j], 1) && !(sizes[j] == broadcast[lead + j])) {
        return Refuse(why, "its index tensors' sizes are equal only by assumption");
      }
    }
  }
  spec->wraps = true;
  const int r = static_cast<int>(broadcast.size());
  const int out_rank = r + static_cast<int>(s.sizes.size()) - indexed_dims;
  // Where the broadcast index dims sit in the result, and where each of
  // the tensor's other dims does.
  const int at = adjacent ? first : 0;
  result->assign(out_rank, Zero());
  for (int j = 0; j < r; ++j) (*result)[at + j] = broadcast[j];
  spec->source_over.assign(out_rank, Zero());
  int d = adjacent ? 0 : r;
  for (int i = 0; i < static_cast<int>(s.sizes.size()); ++i) {
    const bool indexed = i < static_cast<int>(indices.size()) && indices[i] != ir::kNoValue;
    if (indexed) {
      spec->indices.push_back(indices[i]);
      spec->index_over.push_back(IndexOver(g.value(indices[i]).meta, broadcast, at, out_rank));
      spec->strides.push_back(s.strides[i]);
      spec->sizes.push_back(s.sizes[i]);
      if (adjacent && i == first) d += r;
      continue;
    }
    (*result)[d] = s.sizes[i];
    spec->source_over[d++] = s.strides[i];
  }
  return absl::OkStatus();
}

absl::Status IndexTensor(const ir::Graph& g, const ops::OpCall& call, const ir::TensorMeta& out,
                         GatherSpec* spec, std::string* why) {
  ASSIGN_OR_RETURN(ValueId self, call.Tensor("self"));
  ASSIGN_OR_RETURN(std::vector<ValueId> indices, call.Tensors("indices"));
  SymSizes result;
  RETURN_IF_ERROR(IndexPositions(g, g.value(self).meta, indices, spec, &result, why));
  if (why->empty() && !(result == out.sizes)) {
    return Refuse(why, "its positions' shape is not its output's as the graph states it");
  }
  spec->source = self;
  return absl::OkStatus();
}

absl::Status Embedding(const ir::Graph& g, const ops::OpCall& call, const ir::TensorMeta& out,
                       GatherSpec* spec, std::string* why) {
  ASSIGN_OR_RETURN(ValueId weight, call.Tensor("weight"));
  ASSIGN_OR_RETURN(ValueId indices, call.Tensor("indices"));
  const ir::TensorMeta& w = g.value(weight).meta;
  const ir::TensorMeta& m = g.value(indices).meta;
  if (w.sizes.size() != 2) return Refuse(why, "its weight is not 2-d");
  if (!IndexDType(m.dtype)) {
    return Refuse(why, absl::StrCat("its indices have dtype ", v1::DType_Name(m.dtype)));
  }
  const int out_rank = static_cast<int>(out.sizes.size());
  spec->source = weight;
  spec->source_over.assign(out_rank, Zero());
  spec->source_over[out_rank - 1] = w.strides[1];
  spec->indices = {indices};
  spec->index_over = {IndexOver(m, m.sizes, 0, out_rank)};
  spec->strides = {w.strides[0]};
  spec->sizes = {w.sizes[0]};
  return absl::OkStatus();
}

// `source` (of metadata `s`) read at its own strides but along `dim`,
// which `index` (read with `index_over`) names.
void AlongDim(ValueId source, const ir::TensorMeta& s, int64_t dim, ValueId index,
              std::vector<SymInt> index_over, GatherSpec* spec) {
  spec->source = source;
  spec->source_over = s.strides;
  spec->source_over[dim] = Zero();
  spec->indices = {index};
  spec->index_over = {std::move(index_over)};
  spec->strides = {s.strides[dim]};
  spec->sizes = {s.sizes[dim]};
}

absl::Status IndexSelect(const ir::Graph& g, const ops::OpCall& call, const ir::TensorMeta& out,
                         GatherSpec* spec, std::string* why) {
  ASSIGN_OR_RETURN(ValueId self, call.Tensor("self"));
  ASSIGN_OR_RETURN(ValueId index, call.Tensor("index"));
  ASSIGN_OR_RETURN(int64_t dim, call.Int("dim"));
  const ir::TensorMeta& s = g.value(self).meta;
  const ir::TensorMeta& m = g.value(index).meta;
  const int rank = static_cast<int>(s.sizes.size());
  if (rank == 0) return Refuse(why, "its input is 0-d");
  if (dim < 0) dim += rank;
  if (!IndexDType(m.dtype) || m.sizes.size() > 1) {
    return Refuse(why, "its index is not a vector of integers");
  }
  std::vector<SymInt> over(out.sizes.size(), Zero());
  if (!m.sizes.empty()) over[dim] = m.strides[0];
  AlongDim(self, s, dim, index, std::move(over), spec);
  return absl::OkStatus();
}

absl::Status Gather(const ir::Graph& g, const ops::OpCall& call, const ir::TensorMeta& out,
                    GatherSpec* spec, std::string* why) {
  ASSIGN_OR_RETURN(ValueId self, call.Tensor("self"));
  ASSIGN_OR_RETURN(ValueId index, call.Tensor("index"));
  ASSIGN_OR_RETURN(int64_t dim, call.Int("dim"));
  const ir::TensorMeta& s = g.value(self).meta;
  const ir::TensorMeta& m = g.value(index).meta;
  const int rank = static_cast<int>(s.sizes.size());
  if (rank == 0 || m.sizes.size() != s.sizes.size()) {
    return Refuse(why, "its index and input differ in rank");
  }
  if (dim < 0) dim += rank;
  // torch reads self only where index has elements, so index may be
  // smaller than self in the other dims, never larger.
  for (int d = 0; d < rank; ++d) {
    if (d != dim && !(m.sizes[d] == s.sizes[d]) &&
        !(m.sizes[d].is_constant() && s.sizes[d].is_constant() &&
          m.sizes[d].constant() <= s.sizes[d].constant())) {
      return Refuse(why, absl::StrCat("its index's size at dim ", d, " is not known to fit"));
    }
  }
  std::vector<SymInt> over = m.strides;
  for (int d = 0; d < rank; ++d) {
    if (ops::IsConstant(m.sizes[d], 1)) over[d] = Zero();
  }
  AlongDim(self, s, dim, index, std::move(over), spec);
  (void)out;
  return absl::OkStatus();
}

// Whether `v` is made by a creation op filling it with zeros.
bool Zeros(const ir::Graph& g, ValueId v) {
  const int p = g.value(v).producer;
  if (p < 0) return false;
  const ir::Node& n = g.nodes()[p];
  if (n.target == "aten.zeros.default" || n.target == "aten.zeros_like.default" ||
      n.target == "aten.new_zeros.default") {
    return true;
  }
  if (n.target != "aten.full.default" && n.target != "aten.full_like.default") return false;
  auto meta_of = [&g](ValueId u) -> const ir::TensorMeta& { return g.value(u).meta; };
  absl::StatusOr<ops::OpCall> call = ops::OpCall::Bind(n.target, n.args, n.kwargs, meta_of);
  if (!call.ok()) return false;
  absl::StatusOr<double> fill = call->Double("fill_value");
  return fill.ok() && *fill == 0.0;
}

// Scatter-adds into zeros: the positions in the output, the values and
// the space they are added over.
absl::Status Scatter(const ir::Graph& g, const ops::OpCall& call, const ir::Node& node,
                     NodeLowering* out, std::string* why) {
  const ir::TensorMeta& o = g.value(node.outputs[0]).meta;
  GatherSpec& spec = out->gather;
  if (node.target == "aten.embedding_dense_backward.default") {
    ASSIGN_OR_RETURN(ValueId grad, call.Tensor("grad_output"));
    ASSIGN_OR_RETURN(ValueId indices, call.Tensor("indices"));
    ASSIGN_OR_RETURN(bool by_freq, call.Bool("scale_grad_by_freq"));
    ASSIGN_OR_RETURN(int64_t padding, call.Int("padding_idx"));
    const ir::TensorMeta& m = g.value(indices).meta;
    const ir::TensorMeta& gm = g.value(grad).meta;
    if (by_freq) return Refuse(why, "it scales by frequency");
    if (!IndexDType(m.dtype) || o.sizes.size() != 2 || gm.sizes.size() != m.sizes.size() + 1) {
      return Refuse(why, "its indices or gradient have another form");
    }
    // Sizes equal only by assumption would index past one of them.
    for (size_t d = 0; d < m.sizes.size(); ++d) {
      if (!(m.sizes[d] == gm.sizes[d])) return Refuse(why, "its indices' sizes are not grad's");
    }
    if (!(gm.sizes.back() == o.sizes[1])) return Refuse(why, "its rows are not the output's");
    out->space = gm.sizes;
    out->values = grad;
    out->skip = padding;
    const int rank = static_cast<int>(gm.sizes.size());
    spec.source_over.assign(rank, Zero());
    spec.source_over[rank - 1] = o.strides[1];
    spec.indices = {indices};
    spec.index_over = {IndexOver(m, m.sizes, 0, rank)};
    spec.strides = {o.strides[0]};
    spec.sizes = {o.sizes[0]};
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(ValueId self, call.Tensor("self"));
  if (!Zeros(g, self)) out->base = self;
  if (node.target == "aten.index_put.default") {
    ASSIGN_OR_RETURN(bool accumulate, call.Bool("accumulate"));
    if (!accumulate) return Refuse(why, "it writes rather than adds");
    ASSIGN_OR_RETURN(std::vector<ValueId> indices, call.Tensors("indices"));
    ASSIGN_OR_RETURN(out->values, call.Tensor("values"));
    RETURN_IF_ERROR(IndexPositions(g, o, indices, &spec, &out->space, why));
  } else {  // index_add
    ASSIGN_OR_RETURN(ValueId index, call.Tensor("index"));
    ASSIGN_OR_RETURN(out->values, call.Tensor("source"));
    ASSIGN_OR_RETURN(int64_t dim, call.Int("dim"));
    if (!call.IsNone("alpha")) {
      ASSIGN_OR_RETURN(double alpha, call.Double("alpha"));
      if (alpha != 1.0) return Refuse(why, "it scales what it adds");
    }
    const ir::TensorMeta& m = g.value(index).meta;
    const ir::TensorMeta& src = g.value(out->values).meta;
    const int rank = static_cast<int>(o.sizes.size());
    if (dim < 0) dim += rank;
    if (!IndexDType(m.dtype) || m.sizes.size() > 1 || src.sizes.size() != o.sizes.size() ||
        dim < 0 || dim >= rank) {
      return Refuse(why, "its index or source have another form");
    }
    // Sizes equal only by assumption would index past one of them.
    for (int d = 0; d < rank; ++d) {
      if (d != dim && !(src.sizes[d] == o.sizes[d])) {
        return Refuse(why, absl::StrCat("its source's size at dim ", d, " is not the output's"));
      }
    }
    if (!(m.sizes.empty() ? ops::IsConstant(src.sizes[dim], 1) : m.sizes[0] == src.sizes[dim])) {
      return Refuse(why, "its index's length is not its source's");
    }
    out->space = src.sizes;
    spec.source_over = o.strides;
    spec.source_over[dim] = Zero();
    std::vector<SymInt> over(rank, Zero());
    if (!m.sizes.empty()) over[dim] = m.strides[0];
    spec.indices = {index};
    spec.index_over = {std::move(over)};
    spec.strides = {o.strides[dim]};
    spec.sizes = {o.sizes[dim]};
  }
  if (!why->empty()) return absl::OkStatus();
  // The values broadcast over the space (right-aligned).
  const ir::TensorMeta& vm = g.value(out->values).meta;
  if (vm.sizes.size() > out->space.size()) return Refuse(why, "its values have a higher rank");
  const size_t lead = out->space.size() - vm.sizes.size();
  for (size_t j = 0; j < vm.sizes.size(); ++j) {
    if (!ops::IsConstant(vm.sizes[j], 1) && !(vm.sizes[j] == out->space[lead + j])) {
      return Refuse(why, "its values do not broadcast over the positions");
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool IsScatter(const std::string& target) {
  return target == "aten.index_put.default" || target == "aten.index_add.default" ||
         target == "aten.embedding_dense_backward.default";
}

absl::Status LowerScatter(const ir::Graph& g, const ir::Node& node, NodeLowering* out) {
  const ir::TensorMeta& m = g.value(node.outputs[0]).meta;
  // Atomic additions in the output's dtype: float32, float64 and 32- and
  // 64-bit integers. A 16-bit float would round after every addition, where
  // ATen sorts the indices and sums each position's values in float32 (a
  // frequent token's embedding gradient would stall): those stay with ATen.
  if (node.outputs.size() != 1 || (m.dtype != v1::FLOAT32 && m.dtype != v1::FLOAT64 &&
                                   m.dtype != v1::INT64 && m.dtype != v1::INT32)) {
    out->why = absl::StrCat("a scatter kiln does not generate: its output has dtype ",
                            v1::DType_Name(m.dtype));
    return absl::OkStatus();
  }
  auto meta_of = [&g](ValueId v) -> const ir::TensorMeta& { return g.value(v).meta; };
  ASSIGN_OR_RETURN(ops::OpCall call,
                   ops::OpCall::Bind(node.target, node.args, node.kwargs, meta_of));
  call.set_node_name(node.name);
  std::string why;
  NodeLowering l;
  RETURN_IF_ERROR(Scatter(g, call, node, &l, &why));
  if (!why.empty()) {
    out->why = absl::StrCat("a scatter kiln does not generate: ", why);
    return absl::OkStatus();
  }
  if (m.strides.size() != m.sizes.size() || !SupportedDType(g.value(l.values).meta.dtype)) {
    out->why = "a scatter kiln does not generate: its values' dtype";
    return absl::OkStatus();
  }
  l.kind = NodeKind::kScatter;
  l.gather.source = node.outputs[0];
  l.call = std::move(call);
  *out = std::move(l);
  return absl::OkStatus();
}

bool IsGather(const std::string& target) {
  return target == "aten.index.Tensor" || target == "aten.embedding.default" ||
         target == "aten.index_select.default" || target == "aten.gather.default";
}

absl::Status LowerGather(const ir::Graph& g, const ir::Node& node, NodeLowering* out) {
  if (node.outputs.size() != 1) {
    out->why = "it has more than one output";
    return absl::OkStatus();
  }
  const ir::TensorMeta& m = g.value(node.outputs[0]).meta;
  if (!SupportedDType(m.dtype)) {
    out->why = absl::StrCat("its output has dtype ", v1::DType_Name(m.dtype));
    return absl::OkStatus();
  }
  auto meta_of = [&g](ValueId v) -> const ir::TensorMeta& { return g.value(v).meta; };
  ASSIGN_OR_RETURN(ops::OpCall call,
                   ops::OpCall::Bind(node.target, node.args, node.kwargs, meta_of));
  call.set_node_name(node.name);
  GatherSpec spec;
  std::string why;
  if (node.target == "aten.index.Tensor") {
    RETURN_IF_ERROR(IndexTensor(g, call, m, &spec, &why));
  } else if (node.target == "aten.embedding.default") {
    RETURN_IF_ERROR(Embedding(g, call, m, &spec, &why));
  } else if (node.target == "aten.index_select.default") {
    RETURN_IF_ERROR(IndexSelect(g, call, m, &spec, &why));
  } else {
    RETURN_IF_ERROR(Gather(g, call, m, &spec, &why));
  }
  if (!why.empty()) {
    out->why = absl::StrCat("a gather kiln does not generate: ", why);
    return absl::OkStatus();
  }
  const ir::TensorMeta& src = g.value(spec.source).meta;
  if (!SupportedDType(src.dtype) || src.strides.size() != src.sizes.size()) {
    out->why = absl::StrCat("its source has dtype ", v1::DType_Name(src.dtype));
    return absl::OkStatus();
  }
  out->kind = NodeKind::kGather;
  out->call = std::move(call);
  out->gather = std::move(spec);
  return absl::OkStatus();
}

}  // namespace kiln::loop::fuse_internal
