// Shape rules of views and shape manipulation: view, permute, expand,
// squeeze, unsqueeze, slice, select, split, unbind, as_strided, transpose,
// alias (views, with their real strides and storage offsets), and cat,
// stack, constant_pad_nd; their registration.
#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "compiler/ir/limits.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_rules_internal.h"
#include "compiler/ops/shape_util.h"

namespace kiln::ops::shape_rules_internal {
namespace {

// ---------------------------------------------------------------------------
// Views and shape manipulation.

absl::StatusOr<Metas> View(const OpCall& c, bool unsafe) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(SymSizes requested, c.SymInts("size"));
  ASSIGN_OR_RETURN(SymSizes sizes,
                   At(c, "argument 'size'", InferViewSizes(self->sizes, requested)));
  std::optional<SymSizes> strides = ViewStrides(self->sizes, StridesOf(*self), sizes);
  if (!strides.has_value()) {
    if (!unsafe) {
      return ArgError(
          c, "size",
          absl::StrCat(SizesToString(sizes), " is not a view of 'self' (sizes ",
                       SizesToString(self->sizes), ", strides ", SizesToString(StridesOf(*self)),
                       "): a dimension spans two non-contiguous subspaces; "
                       "reshape would copy"));
    }
    strides = ContiguousStrides(sizes);
  }
  return Metas{ViewOf(*self, std::move(sizes), *std::move(strides), self->storage_offset)};
}

absl::StatusOr<Metas> Permute(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(std::vector<int64_t> dims, c.Ints("dims"));
  const int64_t rank = Rank(*self);
  std::vector<bool> used(rank, false);
  auto not_a_permutation = [&] {
    return ArgError(c, "dims",
                    absl::StrCat("[", absl::StrJoin(dims, ", "), "] is not a permutation of the ",
                                 rank, " dimensions of 'self'"));
  };
  if (static_cast<int64_t>(dims.size()) != rank) return not_a_permutation();
  const SymSizes in_strides = StridesOf(*self);
  SymSizes sizes, strides;
  for (int64_t d : dims) {
    ASSIGN_OR_RETURN(int64_t w, At(c, "argument 'dims'", WrapDim(d, rank)));
    if (used[w]) return not_a_permutation();
    used[w] = true;
    sizes.push_back(self->sizes[w]);
    strides.push_back(in_strides[w]);
  }
  return Metas{ViewOf(*self, std::move(sizes), std::move(strides), self->storage_offset)};
}

absl::StatusOr<Metas> Expand(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(SymSizes target, c.SymInts("size"));
  const int64_t rank = Rank(*self);
  const int64_t n = static_cast<int64_t>(target.size());
  if (n < rank) {
    return ArgError(c, "size",
                    absl::StrCat(SizesToString(target), " has fewer dimensions than 'self' ",
                                 SizesToString(self->sizes)));
  }
  const SymSizes in_strides = StridesOf(*self);
  SymSizes sizes(n), strides(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = i - (n - rank);  // dimension of self, or negative for a new one
    const SymInt& t = target[i];
    if (j < 0) {
      if (IsConstant(t, -1)) {
        return ArgError(c, "size", absl::StrCat("has -1 at the new leading dimension ", i));
      }
      sizes[i] = t;
      strides[i] = SymInt{int64_t{0}};
      continue;
    }
    const SymInt& s = self->sizes[j];
    if (IsConstant(t, -1) || t == s) {
      sizes[i] = s;
      strides[i] = in_strides[j];
    } else if (IsConstant(s, 1)) {
      sizes[i] = t;
      strides[i] = SymInt{int64_t{0}};
    } else if (s.is_constant() && t.is_constant()) {
      return ArgError(
          c, "size",
          absl::StrCat(SizesToString(target), " expands 'self' ", SizesToString(self->sizes),
                       " at dimension ", i, ", whose size is ", s.ToString(), ", not 1"));
    } else {
      // A symbol the trace guarded equal to the other side.
      sizes[i] = t.is_constant() ? t : s;
      strides[i] = in_strides[j];
    }
  }
  return Metas{ViewOf(*self, std::move(sizes), std::move(strides), self->storage_offset)};
}

absl::StatusOr<Metas> SqueezeDims(const OpCall& c, const std::vector<int64_t>& dims) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  const int64_t rank = Rank(*self);
  std::vector<bool> drop(rank, false);
  for (int64_t d : dims) {
    ASSIGN_OR_RETURN(int64_t w, At(c, "argument 'dim'", WrapDim(d, rank)));
    if (rank > 0 && IsConstant(self->sizes[w], 1)) drop[w] = true;
  }
  const SymSizes in_strides = StridesOf(*self);
  SymSizes sizes, strides;
  for (int64_t i = 0; i < rank; ++i) {
    if (drop[i]) continue;
    sizes.push_back(self->sizes[i]);
    strides.push_back(in_strides[i]);
  }
  return Metas{ViewOf(*self, std::move(sizes), std::move(strides), self->storage_offset)};
}

absl::StatusOr<Metas> Unsqueeze(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  const int64_t rank = Rank(*self);
  ASSIGN_OR_RETURN(int64_t dim, DimArg(c, "dim", rank + 1));
  SymSizes sizes = self->sizes;
  SymSizes strides = StridesOf(*self);
  const SymInt stride = dim >= rank ? SymInt{int64_t{1}} : SymMul(sizes[dim], strides[dim]);
  sizes.insert(sizes.begin() + dim, SymInt{int64_t{1}});
  strides.insert(strides.begin() + dim, stride);
  return Metas{ViewOf(*self, std::move(sizes), std::move(strides), self->storage_offset)};
}

// A slice [start, end) by `step` of dimension `dim` of `self`; start and
// end follow Python (negative from the end, clamped to the size).
absl::StatusOr<TensorMeta> SliceOf(const OpCall& c, const TensorMeta& self, int64_t dim,
                                   std::optional<SymInt> start, std::optional<SymInt> end,
                                   int64_t step) {
  if (step <= 0) return ArgError(c, "step", absl::StrCat("is ", step, "; it must be positive"));
  const SymInt& size = self.sizes[dim];
  SymSizes sizes = self.sizes;
  SymSizes strides = StridesOf(self);
  constexpr int64_t kBig = std::numeric_limits<int64_t>::max() / 2;
  SymInt s = start.value_or(SymInt{int64_t{0}});
  SymInt e = end.value_or(SymInt{std::numeric_limits<int64_t>::max()});
  SymInt len;
  if (size.is_constant() && s.is_constant() && e.is_constant()) {
    const int64_t n = size.constant();
    int64_t a = s.constant(), b = e.constant();
    if (a < 0) a += n;
    if (b < 0) b += n;
    a = std::clamp<int64_t>(a, 0, n);
    b = std::clamp<int64_t>(b, a, n);
    s = SymInt{a};
    len = SymInt{(b - a + step - 1) / step};
  } else {
    if (s.is_constant() && s.constant() < 0) s = SymAdd(size, s);
    if (e.is_constant() && e.constant() >= kBig) {
      e = size;
    } else if (e.is_constant() && e.constant() < 0) {
      e = SymAdd(size, e);
    }
    len = SymFloorDiv(SymAdd(SymSub(e, s), SymInt{step - 1}), SymInt{step});
  }
  sizes[dim] = len;
  const SymInt offset = SymAdd(self.storage_offset, SymMul(s, strides[dim]));
  strides[dim] = SymMul(strides[dim], SymInt{step});
  return ViewOf(self, std::move(sizes), std::move(strides), offset);
}

absl::StatusOr<Metas> Slice(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  if (Rank(*self) == 0) return ArgError(c, "self", "cannot be sliced: it has no dimensions");
  ASSIGN_OR_RETURN(int64_t dim, DimArg(c, "dim", Rank(*self)));
  ASSIGN_OR_RETURN(std::optional<SymInt> start, OptSymIntArg(c, "start"));
  ASSIGN_OR_RETURN(std::optional<SymInt> end, OptSymIntArg(c, "end"));
  ASSIGN_OR_RETURN(int64_t step, c.Int("step"));
  ASSIGN_OR_RETURN(TensorMeta m, SliceOf(c, *self, dim, start, end, step));
  return Metas{std::move(m)};
}

absl::StatusOr<TensorMeta> SelectOf(const OpCall& c, const TensorMeta& self, int64_t dim,
                                    SymInt index) {
  const SymInt& size = self.sizes[dim];
  if (index.is_constant() && size.is_constant()) {
    const int64_t n = size.constant();
    int64_t i = index.constant();
    if (i < -n || i >= n) {
      return ArgError(c, "index",
                      absl::StrCat("is ", i, ", out of range for dimension ", dim, " of size ", n));
    }
    if (i < 0) i += n;
    index = SymInt{i};
  } else if (index.is_constant() && index.constant() < 0) {
    index = SymAdd(size, index);
  }
  SymSizes sizes = self.sizes;
  SymSizes strides = StridesOf(self);
  const SymInt offset = SymAdd(self.storage_offset, SymMul(index, strides[dim]));
  sizes.erase(sizes.begin() + dim);
  strides.erase(strides.begin() + dim);
  return ViewOf(self, std::move(sizes), std::move(strides), offset);
}

absl::StatusOr<Metas> Select(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  if (Rank(*self) == 0) return ArgError(c, "self", "cannot be indexed: it has no dimensions");
  ASSIGN_OR_RETURN(int64_t dim, DimArg(c, "dim", Rank(*self)));
  ASSIGN_OR_RETURN(SymInt index, SymIntArg(c, "index"));
  ASSIGN_OR_RETURN(TensorMeta m, SelectOf(c, *self, dim, index));
  return Metas{std::move(m)};
}

absl::StatusOr<Metas> SplitWithSizes(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  if (Rank(*self) == 0) return ArgError(c, "self", "cannot be split: it has no dimensions");
  ASSIGN_OR_RETURN(int64_t dim, DimArg(c, "dim", Rank(*self)));
  ASSIGN_OR_RETURN(SymSizes split_sizes, c.SymInts("split_sizes"));
  SymInt total{int64_t{0}};
  for (const SymInt& s : split_sizes) total = SymAdd(total, s);
  const SymInt& size = self->sizes[dim];
  if (total.is_constant() && size.is_constant() && total.constant() != size.constant()) {
    return ArgError(c, "split_sizes",
                    absl::StrCat(SizesToString(split_sizes), " sums to ", total.constant(),
                                 ", but dimension ", dim, " of 'self' has size ", size.constant()));
  }
  Metas out;
  SymInt start{int64_t{0}};
  for (const SymInt& s : split_sizes) {
    ASSIGN_OR_RETURN(TensorMeta m, SliceOf(c, *self, dim, start, SymAdd(start, s), 1));
    m.sizes[dim] = s;  // exact even where the slice is symbolic
    out.push_back(std::move(m));
    start = SymAdd(start, s);
  }
  return out;
}

absl::StatusOr<Metas> Split(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  if (Rank(*self) == 0) return ArgError(c, "self", "cannot be split: it has no dimensions");
  ASSIGN_OR_RETURN(int64_t dim, DimArg(c, "dim", Rank(*self)));
  ASSIGN_OR_RETURN(SymInt split_size, SymIntArg(c, "split_size"));
  const SymInt& size = self->sizes[dim];
  if (!split_size.is_constant() || !size.is_constant()) {
    if (split_size == size) {
      ASSIGN_OR_RETURN(TensorMeta m, SliceOf(c, *self, dim, std::nullopt, std::nullopt, 1));
      return Metas{std::move(m)};
    }
    return ArgError(
        c, "split_size",
        absl::StrCat("is ", split_size.ToString(), " and dimension ", dim, " of 'self' has size ",
                     size.ToString(), ": the number of outputs is not a constant"));
  }
  const int64_t n = size.constant(), k = split_size.constant();
  if (k < 0 || (k == 0 && n > 0)) {
    return ArgError(c, "split_size", absl::StrCat("is ", k, "; it must be positive"));
  }
  const int64_t chunks = k == 0 ? 1 : std::max<int64_t>(n / k + (n % k != 0), 1);
  if (chunks > ir::kMaxOutputsPerNode) {
    return ArgError(
        c, "split_size",
        absl::StrCat("is ", k, " over a dimension of size ", n, ": ", chunks,
                     " outputs, over the limit of ", ir::kMaxOutputsPerNode, " per node"));
  }
  Metas out;
  for (int64_t i = 0; i < chunks; ++i) {
    ASSIGN_OR_RETURN(TensorMeta m,
                     SliceOf(c, *self, dim, SymInt{i * k}, SymInt{std::min(n, (i + 1) * k)}, 1));
    out.push_back(std::move(m));
  }
  return out;
}

absl::StatusOr<Metas> Unbind(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  if (Rank(*self) == 0) return ArgError(c, "self", "cannot be unbound: it has no dimensions");
  ASSIGN_OR_RETURN(int64_t dim, DimArg(c, "dim", Rank(*self)));
  const SymInt& size = self->sizes[dim];
  if (!size.is_constant()) {
    return ArgError(c, "dim",
                    absl::StrCat("is a dimension of symbolic size ", size.ToString(),
                                 ": the number of outputs is not a constant"));
  }
  if (size.constant() > ir::kMaxOutputsPerNode) {
    return ArgError(c, "dim",
                    absl::StrCat("is a dimension of size ", size.constant(),
                                 ": as many outputs, "
                                 "over the limit of ",
                                 ir::kMaxOutputsPerNode, " per node"));
  }
  Metas out;
  for (int64_t i = 0; i < size.constant(); ++i) {
    ASSIGN_OR_RETURN(TensorMeta m, SelectOf(c, *self, dim, SymInt{i}));
    out.push_back(std::move(m));
  }
  return out;
}

absl::StatusOr<std::vector<const TensorMeta*>> TensorList(const OpCall& c) {
  ASSIGN_OR_RETURN(std::vector<ir::ValueId> ids, c.Tensors("tensors"));
  if (ids.empty()) return ArgError(c, "tensors", "is empty");
  std::vector<const TensorMeta*> metas;
  for (ir::ValueId v : ids) {
    if (v == ir::kNoValue) return ArgError(c, "tensors", "has a None element");
    metas.push_back(&c.MetaOf(v));
  }
  return metas;
}

v1::DType ListDType(const std::vector<const TensorMeta*>& metas) {
  std::vector<PromotionOperand> ops;
  for (const TensorMeta* m : metas) ops.push_back({m->dtype, PromotionOperand::Priority::kTensor});
  return ResultType(ops);
}

absl::StatusOr<Metas> Cat(const OpCall& c) {
  ASSIGN_OR_RETURN(std::vector<const TensorMeta*> all, TensorList(c));
  // PyTorch skips legacy empty 1-D tensors of size [0].
  std::vector<std::pair<size_t, const TensorMeta*>> parts;
  for (size_t i = 0; i < all.size(); ++i) {
    const TensorMeta* m = all[i];
    if (!(Rank(*m) == 1 && IsConstant(m->sizes[0], 0))) parts.emplace_back(i, m);
  }
  if (parts.empty()) return Metas{NewTensor(ListDType(all), all[0]->sizes, *all[0])};
  const TensorMeta& first = *parts[0].second;
  if (Rank(first) == 0) return ArgError(c, "tensors", "has a zero-dimensional element");
  ASSIGN_OR_RETURN(int64_t dim, DimArg(c, "dim", Rank(first)));
  SymSizes sizes = first.sizes;
  for (size_t p = 1; p < parts.size(); ++p) {
    const auto& [i, m] = parts[p];
    if (Rank(*m) != Rank(first)) {
      return ArgError(
          c, "tensors",
          absl::StrCat("element ", i, " has sizes ", SizesToString(m->sizes), ", but element ",
                       parts[0].first, " has ", SizesToString(first.sizes), " (ranks differ)"));
    }
    for (int64_t d = 0; d < Rank(first); ++d) {
      if (d == dim) continue;
      const SymInt& x = m->sizes[d];
      const SymInt& y = first.sizes[d];
      if (x.is_constant() && y.is_constant() && x.constant() != y.constant()) {
        return ArgError(
            c, "tensors",
            absl::StrCat("element ", i, " has size[", d, "] ", x.constant(), ", but element ",
                         parts[0].first, " has size[", d, "] ", y.constant()));
      }
    }
    sizes[dim] = SymAdd(sizes[dim], m->sizes[dim]);
  }
  return Metas{NewTensor(ListDType(all), std::move(sizes), first)};
}

absl::StatusOr<Metas> Stack(const OpCall& c) {
  ASSIGN_OR_RETURN(std::vector<const TensorMeta*> all, TensorList(c));
  const TensorMeta& first = *all[0];
  for (size_t i = 1; i < all.size(); ++i) {
    if (!SizesCompatible(all[i]->sizes, first.sizes)) {
      return ArgError(c, "tensors",
                      absl::StrCat("element ", i, " has sizes ", SizesToString(all[i]->sizes),
                                   ", but element 0 has ", SizesToString(first.sizes)));
    }
  }
  ASSIGN_OR_RETURN(int64_t dim, DimArg(c, "dim", Rank(first) + 1));
  SymSizes sizes = first.sizes;
  sizes.insert(sizes.begin() + dim, SymInt{static_cast<int64_t>(all.size())});
  return Metas{NewTensor(ListDType(all), std::move(sizes), first)};
}

absl::StatusOr<Metas> AsStrided(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(SymSizes sizes, c.SymInts("size"));
  ASSIGN_OR_RETURN(SymSizes strides, c.SymInts("stride"));
  if (sizes.size() != strides.size()) {
    return ArgError(
        c, "stride",
        absl::StrCat("has ", strides.size(), " entries, but 'size' has ", sizes.size()));
  }
  ASSIGN_OR_RETURN(std::optional<SymInt> offset, OptSymIntArg(c, "storage_offset"));
  return Metas{
      ViewOf(*self, std::move(sizes), std::move(strides), offset.value_or(self->storage_offset))};
}

absl::StatusOr<Metas> Transpose(const OpCall& c, int64_t dim0, int64_t dim1) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  SymSizes sizes = self->sizes;
  SymSizes strides = StridesOf(*self);
  if (!sizes.empty()) {
    ASSIGN_OR_RETURN(int64_t a, At(c, "argument 'dim0'", WrapDim(dim0, Rank(*self))));
    ASSIGN_OR_RETURN(int64_t b, At(c, "argument 'dim1'", WrapDim(dim1, Rank(*self))));
    std::swap(sizes[a], sizes[b]);
    std::swap(strides[a], strides[b]);
  }
  return Metas{ViewOf(*self, std::move(sizes), std::move(strides), self->storage_offset)};
}

absl::StatusOr<Metas> T(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  if (Rank(*self) > 2) {
    return ArgError(
        c, "self",
        absl::StrCat("should have at most 2 dimensions, got sizes ", SizesToString(self->sizes)));
  }
  return Transpose(c, 0, Rank(*self) == 2 ? 1 : 0);
}

absl::StatusOr<Metas> ConstantPadNd(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  ASSIGN_OR_RETURN(SymSizes pad, c.SymInts("pad"));
  if (pad.size() % 2 != 0 || static_cast<int64_t>(pad.size()) / 2 > Rank(*self)) {
    return ArgError(c, "pad",
                    absl::StrCat(SizesToString(pad),
                                 " should hold one (before, after) pair per "
                                 "padded dimension, at most ",
                                 Rank(*self)));
  }
  SymSizes sizes = self->sizes;
  for (size_t i = 0; i < pad.size() / 2; ++i) {
    SymInt& s = sizes[sizes.size() - 1 - i];
    s = SymAdd(SymAdd(s, pad[2 * i]), pad[2 * i + 1]);
  }
  return Metas{NewTensor(self->dtype, std::move(sizes), *self)};
}

}  // namespace

absl::StatusOr<Metas> Alias(const OpCall& c) {
  ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
  return Metas{ViewOf(*self, self->sizes, StridesOf(*self), self->storage_offset)};
}

void RegisterViews(Definer& def) {
  def("aten.view.default", kView, [](const OpCall& c) { return View(c, false); });
  def("aten._unsafe_view.default", kView, [](const OpCall& c) { return View(c, true); });
  def("aten.permute.default", kView, Permute);
  def("aten.expand.default", kView, Expand);
  def("aten.squeeze.dim", kView, [](const OpCall& c) -> absl::StatusOr<Metas> {
    ASSIGN_OR_RETURN(int64_t dim, c.Int("dim"));
    return SqueezeDims(c, {dim});
  });
  def("aten.squeeze.dims", kView, [](const OpCall& c) -> absl::StatusOr<Metas> {
    ASSIGN_OR_RETURN(std::vector<int64_t> dims, c.Ints("dim"));
    return SqueezeDims(c, dims);
  });
  def("aten.unsqueeze.default", kView, Unsqueeze);
  def("aten.slice.Tensor", kView, Slice);
  def("aten.select.int", kView, Select);
  def("aten.split.Tensor", kView, Split);
  def("aten.split_with_sizes.default", kView, SplitWithSizes);
  def("aten.unbind.int", kView, Unbind);
  def("aten.as_strided.default", kView, AsStrided);
  // A copy of self with the strided window written from src: self's shape.
  def("aten.as_strided_scatter.default", kPointwise, [](const OpCall& c) -> absl::StatusOr<Metas> {
    ASSIGN_OR_RETURN(const TensorMeta* self, c.Meta("self"));
    return Metas{NewTensor(self->dtype, self->sizes, *self)};
  });
  def("aten.t.default", kView, T);
  def("aten.transpose.int", kView, [](const OpCall& c) -> absl::StatusOr<Metas> {
    ASSIGN_OR_RETURN(int64_t dim0, c.Int("dim0"));
    ASSIGN_OR_RETURN(int64_t dim1, c.Int("dim1"));
    return Transpose(c, dim0, dim1);
  });
  def("aten.cat.default", kNone, Cat);
  def("aten.stack.default", kNone, Stack);
  def("aten.constant_pad_nd.default", kNone, ConstantPadNd);
}

}  // namespace kiln::ops::shape_rules_internal
