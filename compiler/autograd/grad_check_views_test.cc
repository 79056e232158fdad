// Gradient-check cases of views and shape manipulation, cat, stack,
// constant_pad_nd and index.Tensor (see grad_check_test.cc).
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "compiler/autograd/grad_check_test_util.h"
#include "compiler/ir/graph.h"
#include "gtest/gtest.h"

namespace kiln::autograd::grad_check_test {

void AddViewCases(std::map<std::string, Case>& c) {
  // Views.
  for (const char* t : {"aten.view.default", "aten._unsafe_view.default"}) {
    c[t] = [t] {
      const int64_t a = Dim(), b = Dim(), d = Dim();
      bool ok = Check(t, {G(Randn({a, b, d}))}, {Ref(0), Ints({a, b * d})});
      Check(t, {G(Randn({a, b, d}))}, {Ref(0), Ints({-1, d})});
      Check(t, {G(Randn({a * b}))}, {Ref(0), Ints({a, 1, b})});
      // A view of a non-contiguous input that keeps its last dimension.
      Check(t, {G(Randn({b, d, a}).permute({2, 0, 1}))}, {Ref(0), Ints({a, b, d})});
      return ok;
    };
  }
  c["aten.permute.default"] = [] {
    const int64_t a = Dim(), b = Dim(), d = Dim();
    bool ok = Check("aten.permute.default", {G(Randn({a, b, d}))}, {Ref(0), Ints({2, 0, 1})});
    Check("aten.permute.default", {G(Randn({a, b, d}))}, {Ref(0), Ints({-1, 0, -2})});
    Check("aten.permute.default", {G(Transposed(a, b))}, {Ref(0), Ints({1, 0})});
    return ok;
  };
  c["aten.expand.default"] = [] {
    const int64_t a = Dim(), b = Dim(), d = Dim();
    bool ok = Check("aten.expand.default", {G(Randn({a, 1}))}, {Ref(0), Ints({d, a, b})});
    Check("aten.expand.default", {G(Randn({1, b}))}, {Ref(0), Ints({a, -1})});
    Check("aten.expand.default", {G(Randn({b}))}, {Ref(0), Ints({a, d, b})});
    Check("aten.expand.default", {G(Randn({}))}, {Ref(0), Ints({a, b})});
    return ok;
  };
  c["aten.squeeze.dim"] = [] {
    const int64_t a = Dim(), b = Dim();
    bool ok = Check("aten.squeeze.dim", {G(Randn({a, 1, b}))}, {Ref(0), Int(1)});
    Check("aten.squeeze.dim", {G(Randn({a, b, 1}))}, {Ref(0), Int(-1)});
    Check("aten.squeeze.dim", {G(Randn({a, b}))}, {Ref(0), Int(0)});  // not of size 1
    Check("aten.squeeze.dim", {G(Randn({}))}, {Ref(0), Int(0)});
    return ok;
  };
  c["aten.squeeze.dims"] = [] {
    const int64_t a = Dim(), b = Dim();
    bool ok = Check("aten.squeeze.dims", {G(Randn({a, 1, b, 1}))}, {Ref(0), Ints({1, -1})});
    Check("aten.squeeze.dims", {G(Randn({1, a, b}))}, {Ref(0), Ints({0, 1})});
    return ok;
  };
  c["aten.unsqueeze.default"] = [] {
    const int64_t a = Dim(), b = Dim();
    bool ok = true;
    for (int64_t d : {0, 1, 2, -1, -3}) {
      ok = Check("aten.unsqueeze.default", {G(Randn({a, b}))}, {Ref(0), Int(d)}) && ok;
    }
    Check("aten.unsqueeze.default", {G(Transposed(a, b))}, {Ref(0), Int(1)});
    return ok;
  };
  c["aten.slice.Tensor"] = [] {
    const int64_t a = Dim(), b = Dim(4, 8);
    auto slice = [&](const In& x, std::vector<Argument> args) {
      args.insert(args.begin(), Ref(0));
      return Check("aten.slice.Tensor", {x}, args);
    };
    bool ok = slice(G(Randn({a, b})), {Int(1), Int(1), Int(3)});
    slice(G(Randn({a, b})), {Int(1), NoneArg(), NoneArg()});
    slice(G(Randn({a, b})), {Int(-1), Int(-3), Int(kEnd)});
    slice(G(Randn({a, b})), {Int(1), Int(0), Int(b + 5)});
    slice(G(Randn({a, b})), {Int(1), Int(1), Int(kEnd), Int(2)});
    slice(G(Randn({a, b})), {Int(-1), Int(0), Int(b - 1), Int(3)});
    slice(G(Randn({b, a})), {Int(0), Int(2), Int(-1), Int(2)});
    slice(G(Transposed(b, a)), {Int(0), Int(1), Int(3)});
    return ok;
  };
  c["aten.select.int"] = [] {
    const int64_t a = Dim(), b = Dim();
    bool ok = Check("aten.select.int", {G(Randn({a, b}))}, {Ref(0), Int(0), Int(1)});
    Check("aten.select.int", {G(Randn({a, b, 3}))}, {Ref(0), Int(-1), Int(-1)});
    Check("aten.select.int", {G(Transposed(a, b))}, {Ref(0), Int(1), Int(0)});
    Check("aten.select.int", {G(Randn({a}))}, {Ref(0), Int(0), Int(a - 1)});
    return ok;
  };
  c["aten.split.Tensor"] = [] {
    const int64_t a = Dim(), b = Dim(4, 7);
    bool ok = Check("aten.split.Tensor", {G(Randn({a, b}))}, {Ref(0), Int(2), Int(1)});
    // Outputs without gradients get zeros.
    const int64_t pieces = (b + 1) / 2;
    Options some;
    for (int64_t i = 0; i < pieces; ++i) some.receive.push_back(i % 2 == 1);
    Check("aten.split.Tensor", {G(Randn({a, b}))}, {Ref(0), Int(2), Int(-1)}, {}, some);
    return ok;
  };
  c["aten.split_with_sizes.default"] = [] {
    const int64_t a = Dim(), b = Dim(), d = Dim();
    bool ok = Check("aten.split_with_sizes.default", {G(Randn({a, b + d}))},
                    {Ref(0), Ints({b, d}), Int(1)});
    Options first;
    first.receive = {true, false, false};
    Check("aten.split_with_sizes.default", {G(Randn({a + b + d, 2}))}, {Ref(0), Ints({a, b, d})},
          {}, first);
    Check("aten.split_with_sizes.default", {G(Transposed(a, b + 1))},
          {Ref(0), Ints({1, b}), Int(-1)});
    return ok;
  };
  c["aten.unbind.int"] = [] {
    const int64_t a = Dim(), b = Dim();
    bool ok = Check("aten.unbind.int", {G(Randn({a, b}))}, {Ref(0), Int(1)});
    Options some;
    for (int64_t i = 0; i < a; ++i) some.receive.push_back(i != 0);
    Check("aten.unbind.int", {G(Randn({a, b}))}, {Ref(0)}, {}, some);
    return ok;
  };
  c["aten.cat.default"] = [] {
    const int64_t a = Dim(), b = Dim(), d = Dim();
    bool ok =
        Check("aten.cat.default", {G(Randn({a, b})), G(Randn({a, d}))}, {Refs({0, 1}), Int(1)});
    Check("aten.cat.default", {G(Randn({a, b})), N(Randn({d, b})), G(Transposed(a, b))},
          {Refs({0, 1, 2})});
    Check("aten.cat.default", {G(Randn({a, b})), G(Randn({a, d}))}, {Refs({0, 1, 0}), Int(-1)});
    return ok;
  };
  c["aten.as_strided.default"] = [] {
    // A non-overlapping window: every other column of the first rows.
    const int64_t a = Dim() + 2, b = 2 * Dim();
    bool ok = Check("aten.as_strided.default", {G(Randn({a, b}))},
                    {Ref(0), Ints({a - 1, b / 2}), Ints({b, 2}), Int(1)});
    Check("aten.as_strided.default", {G(Randn({a * b}))}, {Ref(0), Ints({a, b}), Ints({b, 1})});
    return ok;
  };
  c["aten.stack.default"] = [] {
    const int64_t a = Dim(), b = Dim();
    bool ok = Check("aten.stack.default", {G(Randn({a, b})), N(Randn({a, b}))}, {Refs({0, 1})});
    Check("aten.stack.default", {G(Randn({a, b})), G(Transposed(a, b))},
          {Refs({0, 1, 0}), Int(-1)});
    return ok;
  };
  c["aten.t.default"] = [] {
    Check("aten.t.default", {G(Randn({Dim()}))}, {Ref(0)});
    return Check("aten.t.default", {G(Randn({Dim(), Dim()}))}, {Ref(0)});
  };
  c["aten.transpose.int"] = [] {
    const int64_t a = Dim(), b = Dim(), d = Dim();
    bool ok = Check("aten.transpose.int", {G(Randn({a, b, d}))}, {Ref(0), Int(0), Int(-1)});
    Check("aten.transpose.int", {G(Transposed(a, b))}, {Ref(0), Int(1), Int(0)});
    return ok;
  };
  c["aten.constant_pad_nd.default"] = [] {
    const int64_t a = Dim(), b = Dim(3, 5);
    bool ok = Check("aten.constant_pad_nd.default", {G(Randn({a, b}))}, {Ref(0), Ints({1, 2})});
    Check("aten.constant_pad_nd.default", {G(Randn({a, b}))},
          {Ref(0), Ints({1, 1, 0, 2}), Float(1.5)});
    Check("aten.constant_pad_nd.default", {G(Transposed(a, b))}, {Ref(0), Ints({-1, 2})});
    return ok;
  };
  c["aten.index.Tensor"] = [] {
    const int64_t n = Dim(), b = Dim();
    bool ok =
        Check("aten.index.Tensor", {G(Randn({n, b})), N(Indices({7}, n))}, {Ref(0), Refs({1})});
    Check("aten.index.Tensor", {G(Randn({n})), N(Indices({2, 3}, n))}, {Ref(0), Refs({1})});
    Check("aten.index.Tensor", {G(Randn({n, b, 2})), N(Indices({3, 2}, n))}, {Ref(0), Refs({1})});
    Check("aten.index.Tensor", {G(Transposed(n, b)), N(Indices({5}, n))}, {Ref(0), Refs({1})});
    // Through index_put: two index tensors (broadcast), one on dimension 1.
    Check("aten.index.Tensor", {G(Randn({n, b, 3})), N(Indices({4, 1}, n)), N(Indices({5}, b))},
          {Ref(0), Refs({1, 2})});
    Check("aten.index.Tensor", {G(Randn({n, b, 3})), N(Indices({6}, b))},
          {Ref(0), Refs({ir::kNoValue, 1})});
    return ok;
  };
  c["aten.index_put.default"] = [] {
    const int64_t n = Dim(), b = Dim();
    // Distinct indices without accumulating: libtorch's gradient of a
    // repeated index is whichever write it kept.
    at::Tensor rows = at::randperm(n, at::kLong).slice(0, 0, 2);
    bool ok = Check("aten.index_put.default", {G(Randn({n, b})), N(rows), G(Randn({2, b}))},
                    {Ref(0), Refs({1}), Ref(2)});
    Check("aten.index_put.default", {G(Randn({n, b})), N(Indices({5}, n)), G(Randn({b}))},
          {Ref(0), Refs({1}), Ref(2), Bool(true)});
    return ok;
  };
  c["aten.gather.default"] = [] {
    const int64_t n = Dim(), b = Dim();
    bool ok = Check("aten.gather.default", {G(Randn({n, b})), N(Indices({n, 7}, b))},
                    {Ref(0), Int(1), Ref(1)});
    Check("aten.gather.default", {G(Transposed(n, b)), N(Indices({3, b}, n))},
          {Ref(0), Int(0), Ref(1)});
    return ok;
  };
  c["aten.scatter_add.default"] = [] {
    const int64_t n = Dim(), b = Dim();
    return Check("aten.scatter_add.default",
                 {G(Randn({n, b})), N(Indices({4, b}, n)), G(Randn({4, b}))},
                 {Ref(0), Int(0), Ref(1), Ref(2)});
  };
  // scatter writes one value per place: indices without repeats in each
  // column (a repeated one's value is whichever write lands last), and src
  // of index's sizes (libtorch's backward gives src a gradient of index's).
  auto distinct = [](int64_t k, int64_t b) {
    return at::arange(k, at::kLong).flip(0).unsqueeze(1).expand({k, b}).contiguous();
  };
  c["aten.scatter.src"] = [distinct] {
    const int64_t n = Dim(3, 6), b = Dim();
    return Check("aten.scatter.src",
                 {G(Randn({n, b})), N(distinct(n - 1, b)), G(Randn({n - 1, b}))},
                 {Ref(0), Int(0), Ref(1), Ref(2)});
  };
  c["aten.scatter.value"] = [distinct] {
    const int64_t n = Dim(3, 6), b = Dim();
    return Check("aten.scatter.value", {G(Randn({n, b})), N(distinct(2, b))},
                 {Ref(0), Int(0), Ref(1), Float(0.5)});
  };
  c["aten.scatter_reduce.two"] = [] {
    const int64_t n = Dim(), b = Dim();
    bool ok = true;
    for (const char* reduce : {"sum", "mean", "amax", "amin"}) {
      for (bool include_self : {true, false}) {
        ok = Check("aten.scatter_reduce.two",
                   {G(Randn({n, b})), N(Indices({5, b}, n)), G(Randn({5, b}))},
                   {Ref(0), Int(0), Ref(1), Ref(2), Str(reduce)},
                   {Kwarg("include_self", Bool(include_self))}) &&
             ok;
      }
    }
    return ok;
  };
  c["aten.slice_scatter.default"] = [] {
    const int64_t n = Dim(4, 8), b = Dim();
    bool ok = Check("aten.slice_scatter.default", {G(Randn({n, b})), G(Randn({n, 2}))},
                    {Ref(0), Ref(1), Int(1), Int(0), Int(2)});
    ok = Check("aten.slice_scatter.default", {G(Randn({n, b})), G(Randn({(n - 1) / 2 + 1, b}))},
               {Ref(0), Ref(1), Int(0), Int(0), Int(n), Int(2)}) &&
         ok;
    return ok;
  };
  c["aten.index_select.default"] = [] {
    const int64_t n = Dim(), b = Dim();
    bool ok = Check("aten.index_select.default", {G(Randn({n, b})), N(Indices({6}, b))},
                    {Ref(0), Int(1), Ref(1)});
    Check("aten.index_select.default", {G(Randn({n})), N(Indices({3}, n))},
          {Ref(0), Int(0), Ref(1)});
    return ok;
  };
  c["aten.index_add.default"] = [] {
    const int64_t n = Dim(), b = Dim();
    return Check("aten.index_add.default", {G(Randn({n, b})), N(Indices({5}, n)), G(Randn({5, b}))},
                 {Ref(0), Int(0), Ref(1), Ref(2)}, {Kwarg("alpha", Float(-2.0))});
  };
  c["aten.flip.default"] = [] {
    const int64_t n = Dim(), b = Dim();
    bool ok = Check("aten.flip.default", {G(Randn({n, b, 3}))}, {Ref(0), Ints({0, 2})});
    Check("aten.flip.default", {G(Transposed(n, b))}, {Ref(0), Ints({-1})});
    return ok;
  };
  c["aten.cumsum.default"] = [] {
    const int64_t n = Dim(), b = Dim();
    bool ok = Check("aten.cumsum.default", {G(Randn({n, b}))}, {Ref(0), Int(1)});
    Check("aten.cumsum.default", {G(Randn({n, b}))}, {Ref(0), Int(-2)},
          {Kwarg("dtype", DType(v1::FLOAT64))});
    return ok;
  };
  // Distinct values (randn): the order, and so the gradient, is unique.
  c["aten.sort.default"] = [] {
    const int64_t n = Dim(), b = Dim();
    bool ok = Check("aten.sort.default", {G(Randn({n, b}))}, {Ref(0)});
    Check("aten.sort.default", {G(Randn({n, b}))}, {Ref(0), Int(0), Bool(true)});
    return ok;
  };
  c["aten.cummax.default"] = [] {
    const int64_t n = Dim(), b = Dim(3, 6);
    bool ok = Check("aten.cummax.default", {G(Randn({n, b}))}, {Ref(0), Int(1)});
    Check("aten.cummax.default", {G(Randn({n, b}))}, {Ref(0), Int(0)});
    return ok;
  };
  c["aten.median.dim"] = [] {
    const int64_t n = Dim(), b = Dim(3, 6);
    bool ok = Check("aten.median.dim", {G(Randn({n, b}))}, {Ref(0), Int(1)});
    Check("aten.median.dim", {G(Randn({n, b}))}, {Ref(0), Int(0), Bool(true)});
    return ok;
  };
  c["aten.kthvalue.default"] = [] {
    const int64_t n = Dim(), b = Dim(3, 6);
    bool ok = Check("aten.kthvalue.default", {G(Randn({n, b}))}, {Ref(0), Int(2)});
    Check("aten.kthvalue.default", {G(Randn({b, n}))}, {Ref(0), Int(1), Int(0), Bool(true)});
    return ok;
  };
  c["aten.topk.default"] = [] {
    const int64_t n = Dim(), b = Dim(3, 6);
    bool ok = Check("aten.topk.default", {G(Randn({n, b}))}, {Ref(0), Int(2)});
    Check("aten.topk.default", {G(Randn({b, n}))}, {Ref(0), Int(2), Int(0), Bool(false)});
    return ok;
  };
}

}  // namespace kiln::autograd::grad_check_test
