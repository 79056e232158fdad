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

absl::Status IndexTensor(const ir::Graph& g, const ops::OpCall& call, const ir::TensorMeta& out,
                         GatherSpec* spec, std::string* why) {
  ASSIGN_OR_RETURN(ValueId self, call.Tensor("self"));
  ASSIGN_OR_RETURN(std::vector<ValueId> indices, call.Tensors("indices"));
  const ir::TensorMeta& s = g.value(self).meta;
  int first = -1, last = -1;
  bool adjacent = true;
  SymSizes broadcast;
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] == ir::kNoValue) continue;
    const ir::TensorMeta& m = g.value(indices[i]).meta;
    if (!IndexDType(m.dtype)) {
      return Refuse(why, absl::StrCat("index ", i, " has dtype ", v1::DType_Name(m.dtype)));
    }
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
  spec->wraps = true;
  const int out_rank = static_cast<int>(out.sizes.size());
  const int r = static_cast<int>(broadcast.size());
  // Where the broadcast index dims sit in the output, and where each of
  // self's other dims does.
  const int at = adjacent ? first : 0;
  spec->source = self;
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
    if (d >= out_rank) return absl::InternalError("index: more dims than its output has");
    spec->source_over[d++] = s.strides[i];
  }
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
  spec->source = self;
  spec->source_over = s.strides;
  spec->source_over[dim] = Zero();
  std::vector<SymInt> over(out.sizes.size(), Zero());
  if (!m.sizes.empty()) over[dim] = m.strides[0];
  spec->indices = {index};
  spec->index_over = {std::move(over)};
  spec->strides = {s.strides[dim]};
  spec->sizes = {s.sizes[dim]};
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
  spec->source = self;
  spec->source_over = s.strides;
  spec->source_over[dim] = Zero();
  spec->indices = {index};
  spec->index_over = {m.strides};
  for (int d = 0; d < rank; ++d) {
    if (ops::IsConstant(m.sizes[d], 1)) spec->index_over[0][d] = Zero();
  }
  spec->strides = {s.strides[dim]};
  spec->sizes = {s.sizes[dim]};
  (void)out;
  return absl::OkStatus();
}

}  // namespace

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
