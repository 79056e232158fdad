// Derivative rules of views and shape manipulation (view, permute, expand,
// squeeze, unsqueeze, slice, select, split, unbind, t, transpose,
// as_strided), of cat, stack and constant_pad_nd, and of index.Tensor.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/ops/derivative.h"
#include "compiler/ops/derivatives_internal.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_util.h"

namespace kiln::ops::derivatives_internal {
namespace {

// grad.reshape(sizes): a view when the strides allow one, else a
// contiguous copy first (reshape's own rule). Over symbolic sizes a view is
// taken only of a contiguous gradient: ViewStrides cannot decide the other
// layouts there (a permuted or expanded gradient viewed as if contiguous
// read the wrong elements).
Val Reshape(Ctx& c, ValueId v, const std::vector<ir::SymInt>& sizes) {
  const ir::TensorMeta m = c.meta(v);
  if (m.sizes == sizes) return v;
  const bool known = ConstantSizes(m.sizes).has_value() && ConstantSizes(m.strides).has_value() &&
                     ConstantSizes(sizes).has_value();
  if (known ? !ViewStrides(m.sizes, m.strides, sizes).has_value() : !IsContiguous(m)) {
    ASSIGN_OR_RETURN(v, c.Op("aten.clone.default", {Ref(v)},
                             {ir::Kwarg("memory_format", Argument{"", v1::CONTIGUOUS_FORMAT})}));
  }
  return c.Op("aten.view.default", {Ref(v), SizesArg(sizes)});
}

// constant_pad_nd padding of dimension `dim` of a rank-`rank` tensor by
// `before`/`after` (negative values crop).
Val PadDim(Ctx& c, ValueId v, int64_t dim, int64_t rank, const ir::SymInt& before,
           const ir::SymInt& after) {
  std::vector<ir::SymInt> pad(2 * (rank - dim), ir::SymInt{int64_t{0}});
  pad[pad.size() - 2] = before;
  pad[pad.size() - 1] = after;
  return c.Op("aten.constant_pad_nd.default", {Ref(v), SizesArg(pad)});
}

// ---------------------------------------------------------------------------
// Views.

// slice_backward(grad, input_sizes, dim, start, end, step): zeros with grad
// written into the slice, spelled as constant padding (step 1) or as
// padding each element to `step` elements first (step > 1).
absl::Status SliceRule(Ctx& c) {
  if (!c.NeedsGrad("self") || c.grad_output(0) == kNoValue) return absl::OkStatus();
  ValueId g = c.grad_output(0);
  ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
  const int64_t rank = Rank(m);
  ASSIGN_OR_RETURN(int64_t dim, c.call().Int("dim"));
  ASSIGN_OR_RETURN(dim, WrapDim(dim, rank));
  ASSIGN_OR_RETURN(int64_t step, c.call().Int("step"));
  const ir::SymInt size = m.sizes[dim];
  const ir::SymInt out_size = c.meta(g).sizes[dim];
  // The start as the forward clamped it (Python slice semantics).
  ir::SymInt start{int64_t{0}};
  const Argument* given = c.call().Find("start");
  if (const auto* s = given == nullptr ? nullptr : std::get_if<ir::SymInt>(&given->kind);
      s != nullptr && !s->is_constant()) {
    start = *s;
  } else if (!c.call().IsNone("start")) {
    ASSIGN_OR_RETURN(int64_t s0, c.call().Int("start"));
    if (size.is_constant()) {
      if (s0 < 0) s0 += size.constant();
      start = ir::SymInt{std::clamp<int64_t>(s0, 0, size.constant())};
    } else if (s0 >= 0) {
      start = ir::SymInt{s0};
    } else {
      return absl::UnimplementedError(absl::StrCat("derivative of ", c.call().Where(),
                                                   ": negative start over a symbolic size"));
    }
  }
  ir::SymInt covered = SymMul(out_size, ir::SymInt{step});
  if (step > 1) {
    // [.., m, ..] -> [.., m, step, ..] (grad first, zeros after) -> [.., m*step, ..].
    ASSIGN_OR_RETURN(g, Unsqueeze(c, g, dim + 1));
    ASSIGN_OR_RETURN(g,
                     PadDim(c, g, dim + 1, rank + 1, ir::SymInt{int64_t{0}}, ir::SymInt{step - 1}));
    std::vector<ir::SymInt> sizes = c.meta(g).sizes;
    sizes[dim] = covered;
    sizes.erase(sizes.begin() + dim + 1);
    ASSIGN_OR_RETURN(g, Reshape(c, g, sizes));
  }
  ASSIGN_OR_RETURN(g, PadDim(c, g, dim, rank, start, SymSub(SymSub(size, start), covered)));
  c.SetGrad("self", g);
  return absl::OkStatus();
}

// select_backward: unsqueeze, then pad with zeros around the index.
absl::Status SelectRule(Ctx& c) {
  if (!c.NeedsGrad("self") || c.grad_output(0) == kNoValue) return absl::OkStatus();
  ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
  const int64_t rank = Rank(m);
  ASSIGN_OR_RETURN(int64_t dim, c.call().Int("dim"));
  ASSIGN_OR_RETURN(dim, WrapDim(dim, rank));
  const ir::SymInt size = m.sizes[dim];
  ir::SymInt index;
  const Argument* a = c.call().Find("index");
  if (const auto* s = std::get_if<ir::SymInt>(&a->kind); s != nullptr && !s->is_constant()) {
    index = *s;
  } else {
    ASSIGN_OR_RETURN(int64_t i, c.call().Int("index"));
    if (i < 0) {
      if (!size.is_constant()) {
        return absl::UnimplementedError(absl::StrCat("derivative of ", c.call().Where(),
                                                     ": negative index over a symbolic size"));
      }
      i += size.constant();
    }
    index = ir::SymInt{i};
  }
  ASSIGN_OR_RETURN(ValueId g, Unsqueeze(c, c.grad_output(0), dim));
  ASSIGN_OR_RETURN(
      g, PadDim(c, g, dim, rank, index, SymSub(SymSub(size, index), ir::SymInt{int64_t{1}})));
  c.SetGrad("self", g);
  return absl::OkStatus();
}

// split_backward / split_with_sizes_backward: cat of the output gradients,
// zeros for outputs without one.
absl::Status SplitRule(Ctx& c) {
  if (!c.NeedsGrad("self")) return absl::OkStatus();
  std::vector<ValueId> parts;
  for (int i = 0; i < c.num_outputs(); ++i) {
    ASSIGN_OR_RETURN(ValueId g, c.GradOrZeros(i));
    parts.push_back(g);
  }
  ASSIGN_OR_RETURN(ValueId g, c.Op("aten.cat.default", {Argument{"", parts}, Arg(c, "dim")}));
  return SetReduced(c, "self", g);
}

// cat_tensors_backward: the slice of grad each input became.
absl::Status CatRule(Ctx& c) {
  if (!c.NeedsGrad("tensors") || c.grad_output(0) == kNoValue) return absl::OkStatus();
  const ValueId g = c.grad_output(0);
  ASSIGN_OR_RETURN(std::vector<ValueId> tensors, c.call().Tensors("tensors"));
  ASSIGN_OR_RETURN(int64_t dim, c.call().Int("dim"));
  ASSIGN_OR_RETURN(dim, WrapDim(dim, Rank(c.meta(g))));
  std::vector<ValueId> grads;
  ir::SymInt offset{int64_t{0}};
  for (ValueId t : tensors) {
    const ir::TensorMeta m = c.meta(t);
    if (m.sizes.size() == 1 && IsConstant(m.sizes[0], 0)) {
      // Legacy empty inputs take no part in cat; libtorch gives zeros({0}).
      ASSIGN_OR_RETURN(ValueId z, c.Op("aten.new_zeros.default", {Ref(g), ir::Ints({0})}));
      grads.push_back(z);
      continue;
    }
    ir::SymInt end = SymAdd(offset, m.sizes[dim]);
    ASSIGN_OR_RETURN(ValueId part,
                     c.Op("aten.slice.Tensor",
                          {Ref(g), ir::Int(dim), SymIntArg(offset), SymIntArg(end), ir::Int(1)}));
    ASSIGN_OR_RETURN(part, c.SumToSize(part, m));
    grads.push_back(part);
    offset = end;
  }
  c.SetGrads("tensors", std::move(grads));
  return absl::OkStatus();
}

// Zeros like self with `g` added at `index` along `dim`: the gradient of
// an op that read self there (gather, sort, topk, ...).
Val ScatterIntoZeros(Ctx& c, Argument dim, Argument index, ValueId g) {
  ASSIGN_OR_RETURN(ValueId self, c.call().Tensor("self"));
  ASSIGN_OR_RETURN(ValueId zeros, ZerosLike(c, self));
  return c.Op("aten.scatter_add.default", {Ref(zeros), std::move(dim), std::move(index), Ref(g)});
}

// scatter_reduce.two: libtorch's scatter_reduce_backward for sum, mean,
// amax and amin. mean divides by each slot's count (self's element
// included or not); amax and amin share the gradient evenly among self's
// element and the sources equal to the result. Where include_self is false,
// self's elements that sources went into get none.
absl::Status ScatterReduceRule(Ctx& c) {
  const ir::Argument* arg = c.call().Find("reduce");
  const std::string* reduce = arg != nullptr ? std::get_if<std::string>(&arg->kind) : nullptr;
  if (reduce == nullptr) {
    return absl::InvalidArgumentError(c.call().Where() + ": 'reduce' should be a string");
  }
  ASSIGN_OR_RETURN(bool include_self, c.call().Bool("include_self"));
  const ValueId g = c.grad_output(0);
  if (g == kNoValue) return absl::OkStatus();
  ASSIGN_OR_RETURN(ValueId self, c.call().Tensor("self"));
  ASSIGN_OR_RETURN(ValueId src, c.call().Tensor("src"));
  const v1::DType dtype = c.meta(self).dtype;
  auto gather = [&c](ValueId v) {
    return c.Op("aten.gather.default", {Ref(v), Arg(c, "dim"), Arg(c, "index")});
  };
  auto scatter_add = [&c](ValueId into, ValueId v) {
    return c.Op("aten.scatter_add.default", {Ref(into), Arg(c, "dim"), Arg(c, "index"), Ref(v)});
  };
  auto as_dtype = [&c, dtype](ValueId v) {
    return c.Op("aten._to_copy.default", {Ref(v)}, {ir::Kwarg("dtype", Argument{"", dtype})});
  };
  // How many sources went into each of self's elements (for mean, and for
  // the mask of those that lose their own value without include_self).
  ValueId scattered = kNoValue;
  if (*reduce == "mean" || !include_self) {
    ASSIGN_OR_RETURN(ValueId zeros, ZerosLike(c, self));
    ASSIGN_OR_RETURN(ValueId ones, c.Op("aten.ones_like.default", {Ref(src)}));
    ASSIGN_OR_RETURN(scattered, scatter_add(zeros, ones));
  }
  ValueId grad_self = kNoValue, grad_src = kNoValue;
  if (*reduce == "sum") {
    grad_self = g;
    ASSIGN_OR_RETURN(grad_src, gather(g));
  } else if (*reduce == "mean") {
    ValueId count = scattered;
    if (include_self) {
      ASSIGN_OR_RETURN(count, AddScalar(c, scattered, ir::Int(1)));
    }
    ASSIGN_OR_RETURN(count, c.Op("aten.clamp.default", {Ref(count), ir::Float(1.0)}));
    ASSIGN_OR_RETURN(grad_self, Div(c, g, count));
    ASSIGN_OR_RETURN(grad_src, gather(grad_self));
  } else if (*reduce == "amax" || *reduce == "amin") {
    ASSIGN_OR_RETURN(ValueId value, gather(c.output(0)));
    ASSIGN_OR_RETURN(ValueId self_is, c.Op("aten.eq.Tensor", {Ref(self), Ref(c.output(0))}));
    ASSIGN_OR_RETURN(self_is, as_dtype(self_is));
    ASSIGN_OR_RETURN(ValueId src_is, c.Op("aten.eq.Tensor", {Ref(src), Ref(value)}));
    ASSIGN_OR_RETURN(src_is, as_dtype(src_is));
    ASSIGN_OR_RETURN(ValueId count, scatter_add(self_is, src_is));
    ASSIGN_OR_RETURN(ValueId shared, Div(c, g, count));
    ASSIGN_OR_RETURN(grad_self, Mul(c, self_is, shared));
    ASSIGN_OR_RETURN(ValueId picked, gather(shared));
    ASSIGN_OR_RETURN(grad_src, Mul(c, src_is, picked));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(c.call().Where(), ": scatter_reduce with reduce='", *reduce,
                     "' has no derivative rule (sum, mean, amax and amin have)"));
  }
  if (!include_self) {
    ASSIGN_OR_RETURN(ValueId hit, c.Op("aten.gt.Scalar", {Ref(scattered), ir::Float(0.0)}));
    ASSIGN_OR_RETURN(ValueId none, ZerosLike(c, grad_self));
    ASSIGN_OR_RETURN(grad_self, c.Op("aten.where.self", {Ref(hit), Ref(none), Ref(grad_self)}));
  }
  if (c.NeedsGrad("self")) c.SetGrad("self", grad_self);
  if (c.NeedsGrad("src")) c.SetGrad("src", grad_src);
  return absl::OkStatus();
}

}  // namespace

void RegisterViews(Registry* r) {
  auto reshape_back = [](Ctx& c, ValueId g) -> Val {
    ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
    return Reshape(c, g, m.sizes);
  };
  Def(r, "aten.view.default", SelfRule(reshape_back));
  Def(r, "aten._unsafe_view.default", SelfRule(reshape_back));
  Def(r, "aten.permute.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
        ASSIGN_OR_RETURN(std::vector<int64_t> dims, c.call().Ints("dims"));
        std::vector<int64_t> inverse(dims.size());
        for (size_t i = 0; i < dims.size(); ++i) {
          ASSIGN_OR_RETURN(int64_t d, WrapDim(dims[i], Rank(m)));
          inverse[d] = static_cast<int64_t>(i);
        }
        return c.Op("aten.permute.default", {Ref(g), ir::Ints(inverse)});
      }));
  // expand: sum over the expanded dimensions (SetReduced).
  Def(r, "aten.expand.default", SelfRule(Identity()));
  // squeeze: unsqueeze_to, which puts back only dimensions of size 1.
  Def(r, "aten.squeeze.dim", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
        if (m.sizes.empty()) return g;
        ASSIGN_OR_RETURN(int64_t dim, c.call().Int("dim"));
        ASSIGN_OR_RETURN(dim, WrapDim(dim, Rank(m)));
        if (!IsConstant(m.sizes[dim], 1)) return g;
        return Unsqueeze(c, g, dim);
      }));
  Def(r, "aten.squeeze.dims", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
        if (m.sizes.empty()) return g;
        ASSIGN_OR_RETURN(std::vector<int64_t> given, c.call().Ints("dim"));
        std::vector<int64_t> dims;
        for (int64_t d : given) {
          ASSIGN_OR_RETURN(d, WrapDim(d, Rank(m)));
          dims.push_back(d);
        }
        std::sort(dims.begin(), dims.end());
        dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
        for (int64_t d : dims) {
          if (!IsConstant(m.sizes[d], 1)) continue;
          ASSIGN_OR_RETURN(g, Unsqueeze(c, g, d));
        }
        return g;
      }));
  Def(r, "aten.unsqueeze.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(int64_t dim, c.call().Int("dim"));
        ASSIGN_OR_RETURN(dim, WrapDim(dim, Rank(c.meta(g))));
        return c.Op("aten.squeeze.dim", {Ref(g), ir::Int(dim)});
      }));
  Def(r, "aten.slice.Tensor", SliceRule);
  Def(r, "aten.select.int", SelectRule);
  Def(r, "aten.split.Tensor", SplitRule);
  Def(r, "aten.split_with_sizes.default", SplitRule);
  // unbind_backward: stack of the output gradients, zeros where missing.
  Def(r, "aten.unbind.int", [](Ctx& c) -> absl::Status {
    if (!c.NeedsGrad("self")) return absl::OkStatus();
    std::vector<ValueId> parts;
    for (int i = 0; i < c.num_outputs(); ++i) {
      ASSIGN_OR_RETURN(ValueId g, c.GradOrZeros(i));
      parts.push_back(g);
    }
    ASSIGN_OR_RETURN(ValueId g, c.Op("aten.stack.default", {Argument{"", parts}, Arg(c, "dim")}));
    return SetReduced(c, "self", g);
  });
  Def(r, "aten.cat.default", CatRule);
  // stack_tensors_backward: grad unbound along the stacked dimension.
  Def(r, "aten.stack.default", [](Ctx& c) -> absl::Status {
    if (!c.NeedsGrad("tensors") || c.grad_output(0) == kNoValue) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::vector<ValueId> tensors, c.call().Tensors("tensors"));
    ASSIGN_OR_RETURN(int64_t dim, c.call().Int("dim"));
    ASSIGN_OR_RETURN(dim, WrapDim(dim, Rank(c.meta(c.grad_output(0)))));
    ASSIGN_OR_RETURN(std::vector<ValueId> parts,
                     c.OpN("aten.unbind.int", {Ref(c.grad_output(0)), ir::Int(dim)}));
    if (parts.size() != tensors.size()) {
      return absl::InternalError(absl::StrCat("derivative of ", c.call().Where(), ": unbind gave ",
                                              parts.size(), " parts for ", tensors.size(),
                                              " tensors"));
    }
    for (size_t i = 0; i < parts.size(); ++i) {
      const ir::TensorMeta like = c.meta(tensors[i]);
      ASSIGN_OR_RETURN(parts[i], c.SumToSize(parts[i], like));
    }
    c.SetGrads("tensors", std::move(parts));
    return absl::OkStatus();
  });
  Def(r, "aten.t.default",
      SelfRule([](Ctx& c, ValueId g) { return c.Op("aten.t.default", {Ref(g)}); }));
  // as_strided: the gradient written into zeros through the same window.
  // Exact when the window does not overlap itself (libtorch then sums).
  Def(r, "aten.as_strided.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, c.call().Tensor("self"));
        ASSIGN_OR_RETURN(ValueId zeros, c.Op("aten.zeros_like.default", {Ref(self)}));
        return c.Op(
            "aten.as_strided_scatter.default",
            {Ref(zeros), Ref(g), Arg(c, "size"), Arg(c, "stride"), Arg(c, "storage_offset")});
      }));
  Def(r, "aten.transpose.int", SelfRule([](Ctx& c, ValueId g) {
        return c.Op("aten.transpose.int", {Ref(g), Arg(c, "dim0"), Arg(c, "dim1")});
      }));
  // constant_pad_nd: the negated padding crops the gradient back.
  Def(r, "aten.constant_pad_nd.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(std::vector<ir::SymInt> pad, c.call().SymInts("pad"));
        for (ir::SymInt& p : pad) p = SymSub(ir::SymInt{int64_t{0}}, p);
        return c.Op("aten.constant_pad_nd.default", {Ref(g), SizesArg(pad)});
      }));
  // index.Tensor: the gradient accumulated into zeros at the indices
  // (index_put with accumulate, as libtorch's index_backward). With one
  // integer index tensor on dimension 0 of constant size N that
  // accumulation is embedding_dense_backward over self viewed as [N, rest],
  // at the indices with the negative ones counted from the end (as
  // indexing counts them; embedding_dense_backward does not).
  Def(r, "aten.index.Tensor", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
        ASSIGN_OR_RETURN(std::vector<ValueId> indices, c.call().Tensors("indices"));
        if (indices.size() != 1 || indices[0] == kNoValue || m.sizes.empty() ||
            !m.sizes[0].is_constant() ||
            (c.meta(indices[0]).dtype != v1::INT64 && c.meta(indices[0]).dtype != v1::INT32)) {
          ASSIGN_OR_RETURN(ValueId self, c.call().Tensor("self"));
          ASSIGN_OR_RETURN(ValueId zeros, ZerosLike(c, self));
          return c.Op("aten.index_put.default",
                      {Ref(zeros), Arg(c, "indices"), Ref(g), ir::Bool(true)});
        }
        const std::vector<ir::SymInt> rest(m.sizes.begin() + 1, m.sizes.end());
        std::vector<ir::SymInt> flat = c.meta(indices[0]).sizes;
        flat.push_back(Numel(rest));
        ASSIGN_OR_RETURN(g, Reshape(c, g, flat));
        ASSIGN_OR_RETURN(ValueId negative, c.Op("aten.lt.Scalar", {Ref(indices[0]), ir::Int(0)}));
        ASSIGN_OR_RETURN(ValueId shifted, c.Op("aten.add.Scalar",
                                               {Ref(indices[0]), ir::Int(m.sizes[0].constant())}));
        ASSIGN_OR_RETURN(ValueId wrapped,
                         c.Op("aten.where.self", {Ref(negative), Ref(shifted), Ref(indices[0])}));
        ASSIGN_OR_RETURN(
            g, c.Op("aten.embedding_dense_backward.default",
                    {Ref(g), Ref(wrapped), SymIntArg(m.sizes[0]), ir::Int(-1), ir::Bool(false)}));
        return Reshape(c, g, m.sizes);
      }),
      {"indices"});
  // index_put: values take the gradient at the indices (summed back over
  // their broadcast); self the rest of it, all of it when accumulating.
  Def(r, "aten.index_put.default",
      ParamRule({{"self",
                  [](Ctx& c, ValueId g) -> Val {
                    ASSIGN_OR_RETURN(bool accumulate, c.call().Bool("accumulate"));
                    if (accumulate) return g;
                    ASSIGN_OR_RETURN(ValueId values, c.call().Tensor("values"));
                    ASSIGN_OR_RETURN(ValueId zeros, ZerosLike(c, values));
                    return c.Op("aten.index_put.default",
                                {Ref(g), Arg(c, "indices"), Ref(zeros), ir::Bool(false)});
                  }},
                 {"values",
                  [](Ctx& c, ValueId g) {
                    return c.Op("aten.index.Tensor", {Ref(g), Arg(c, "indices")});
                  }}}),
      {"indices"});
  // gather: the gradient added into zeros where it was read from.
  Def(r, "aten.gather.default", SelfRule([](Ctx& c, ValueId g) {
        return ScatterIntoZeros(c, Arg(c, "dim"), Arg(c, "index"), g);
      }),
      {"index"});
  // scatter_add: self passes the gradient on; src reads it back where it
  // was added.
  Def(r, "aten.scatter_add.default",
      ParamRule({{"self", Identity()},
                 {"src",
                  [](Ctx& c, ValueId g) {
                    return c.Op("aten.gather.default", {Ref(g), Arg(c, "dim"), Arg(c, "index")});
                  }}}),
      {"index"});
  // scatter: self's gradient where nothing was written over it (zeros
  // scattered where src or the value was); src's read back where it went.
  auto unwritten = [](Ctx& c, ValueId g) {
    return c.Op("aten.scatter.value", {Ref(g), Arg(c, "dim"), Arg(c, "index"), ir::Int(0)});
  };
  Def(r, "aten.scatter.src",
      ParamRule({{"self", unwritten},
                 {"src",
                  [](Ctx& c, ValueId g) {
                    return c.Op("aten.gather.default", {Ref(g), Arg(c, "dim"), Arg(c, "index")});
                  }}}),
      {"index"});
  Def(r, "aten.scatter.value", ParamRule({{"self", unwritten}}), {"index"});
  Def(r, "aten.scatter_reduce.two", ScatterReduceRule, {"index"});
  // slice_scatter: self's gradient with the slice zeroed; src's, the slice.
  Def(r, "aten.slice_scatter.default",
      ParamRule({{"self",
                  [](Ctx& c, ValueId g) -> Val {
                    ASSIGN_OR_RETURN(ValueId src, c.call().Tensor("src"));
                    ASSIGN_OR_RETURN(ValueId zeros, ZerosLike(c, src));
                    return c.Op("aten.slice_scatter.default",
                                {Ref(g), Ref(zeros), Arg(c, "dim"), Arg(c, "start"), Arg(c, "end"),
                                 Arg(c, "step")});
                  }},
                 {"src", [](Ctx& c, ValueId g) {
                    return c.Op("aten.slice.Tensor", {Ref(g), Arg(c, "dim"), Arg(c, "start"),
                                                      Arg(c, "end"), Arg(c, "step")});
                  }}}));
  // index_select: the gradient added back into zeros at the index;
  // index_add: self passes it on, source reads it back at the index.
  Def(r, "aten.index_select.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, c.call().Tensor("self"));
        ASSIGN_OR_RETURN(ValueId zeros, ZerosLike(c, self));
        return c.Op("aten.index_add.default", {Ref(zeros), Arg(c, "dim"), Arg(c, "index"), Ref(g)});
      }),
      {"index"});
  Def(r, "aten.index_add.default",
      ParamRule({{"self", Identity()},
                 {"source",
                  [](Ctx& c, ValueId g) -> Val {
                    ASSIGN_OR_RETURN(ValueId picked,
                                     c.Op("aten.index_select.default",
                                          {Ref(g), Arg(c, "dim"), Arg(c, "index")}));
                    return MaybeMultiply(c, picked, "alpha");
                  }}}),
      {"index"});
  Def(r, "aten.flip.default", SelfRule([](Ctx& c, ValueId g) {
        return c.Op("aten.flip.default", {Ref(g), Arg(c, "dims")});
      }));
  // cumsum: the gradient summed from the end (flip, cumsum, flip).
  Def(r, "aten.cumsum.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
        if (m.sizes.empty()) return g;
        ASSIGN_OR_RETURN(int64_t dim, c.call().Int("dim"));
        ASSIGN_OR_RETURN(dim, WrapDim(dim, Rank(m)));
        ASSIGN_OR_RETURN(ValueId r, c.Op("aten.flip.default", {Ref(g), ir::Ints({dim})}));
        ASSIGN_OR_RETURN(r, c.Op("aten.cumsum.default", {Ref(r), ir::Int(dim)}));
        return c.Op("aten.flip.default", {Ref(r), ir::Ints({dim})});
      }));
  // sort, topk and cummax: the values' gradient goes back to where each
  // value came from (the indices output), zeros elsewhere (cummax's
  // repeated indices add up).
  for (const char* target : {"aten.sort.default", "aten.topk.default", "aten.cummax.default"}) {
    Def(r, target, [](Ctx& c) -> absl::Status {
      if (!c.NeedsGrad("self") || c.grad_output(0) == kNoValue) return absl::OkStatus();
      ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
      if (m.sizes.empty()) return SetReduced(c, "self", c.grad_output(0));
      ASSIGN_OR_RETURN(ValueId g,
                       ScatterIntoZeros(c, Arg(c, "dim"), Ref(c.output(1)), c.grad_output(0)));
      return SetReduced(c, "self", g);
    });
  }
  // median.dim and kthvalue: value_selecting_reduction_backward, the
  // gradient put back at the index each value came from.
  for (const char* target : {"aten.median.dim", "aten.kthvalue.default"}) {
    Def(r, target, [](Ctx& c) -> absl::Status {
      if (!c.NeedsGrad("self") || c.grad_output(0) == kNoValue) return absl::OkStatus();
      ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, "self"));
      if (m.sizes.empty()) return SetReduced(c, "self", c.grad_output(0));
      ASSIGN_OR_RETURN(int64_t dim, c.call().Int("dim"));
      ASSIGN_OR_RETURN(dim, WrapDim(dim, Rank(m)));
      ASSIGN_OR_RETURN(bool keepdim, c.call().Bool("keepdim"));
      ValueId g = c.grad_output(0), indices = c.output(1);
      if (!keepdim) {
        ASSIGN_OR_RETURN(g, Unsqueeze(c, g, dim));
        ASSIGN_OR_RETURN(indices, Unsqueeze(c, indices, dim));
      }
      ASSIGN_OR_RETURN(g, ScatterIntoZeros(c, ir::Int(dim), Ref(indices), g));
      return SetReduced(c, "self", g);
    });
  }
}

}  // namespace kiln::ops::derivatives_internal
