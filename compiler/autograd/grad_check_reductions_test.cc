// Gradient-check cases of the reductions, softmax, normalization, nll_loss
// and dropout (see grad_check_test.cc).
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

void AddReductionCases(std::map<std::string, Case>& c) {
  // Reductions: negative dims, keepdim both ways, all dims.
  c["aten.sum.default"] = [] {
    Check("aten.sum.default", {G(Transposed(Dim(), Dim()))}, {Ref(0)});
    return Check("aten.sum.default", {G(Randn({Dim(), Dim(), Dim()}))}, {Ref(0)});
  };
  c["aten.mean.default"] = [] {
    Check("aten.mean.default", {G(Transposed(Dim(), Dim()))}, {Ref(0)});
    return Check("aten.mean.default", {G(Randn({Dim(), Dim(), Dim()}))}, {Ref(0)});
  };
  for (const char* t : {"aten.sum.dim_IntList", "aten.mean.dim"}) {
    c[t] = [t] {
      const int64_t a = Dim(), b = Dim(), d = Dim();
      bool ok = true;
      for (bool keep : {false, true}) {
        for (std::vector<int64_t> dims :
             std::vector<std::vector<int64_t>>{{1}, {-1}, {0, -1}, {2, 0}}) {
          ok = Check(t, {G(Randn({a, b, d}))}, {Ref(0), Ints(dims), Bool(keep)}) && ok;
        }
        Check(t, {G(Transposed(a, b))}, {Ref(0), Ints({0}), Bool(keep)});
        Check(t, {G(Randn({a, b}))}, {Ref(0), NoneArg(), Bool(keep)});
      }
      Check(t, {G(Randn({a, b}))}, {Ref(0), Ints({1})}, {Kwarg("dtype", DType(v1::FLOAT32))});
      return ok;
    };
  }
  for (const char* t : {"aten.amax.default", "aten.amin.default"}) {
    c[t] = [t] {
      const int64_t a = Dim(), b = Dim(), d = Dim();
      // Rounded values: many ties, which share the gradient.
      at::Tensor x = at::round(Randn({a, b, d}));
      bool ok = true;
      for (bool keep : {false, true}) {
        for (std::vector<int64_t> dims :
             std::vector<std::vector<int64_t>>{{1}, {-1}, {0, -1}, {}}) {
          ok = Check(t, {G(x)}, {Ref(0), Ints(dims), Bool(keep)}) && ok;
        }
        Check(t, {G(at::round(Transposed(a, b)))}, {Ref(0), Ints({0}), Bool(keep)});
      }
      return ok;
    };
  }
  c["aten.var.correction"] = [] {
    const int64_t a = Dim(), b = Dim(), d = Dim();
    bool ok = true;
    for (bool keep : {false, true}) {
      ok = Check("aten.var.correction", {G(Randn({a, b, d}))}, {Ref(0), Ints({1})},
                 {Kwarg("keepdim", Bool(keep))}) &&
           ok;
      Check("aten.var.correction", {G(Randn({a, b, d}))}, {Ref(0), Ints({0, -1})},
            {Kwarg("correction", Int(0)), Kwarg("keepdim", Bool(keep))});
      Check("aten.var.correction", {G(Transposed(a, b))}, {Ref(0), Ints({-1})},
            {Kwarg("correction", Int(2)), Kwarg("keepdim", Bool(keep))});
      Check("aten.var.correction", {G(Randn({a}))}, {Ref(0), Ints({0})},
            {Kwarg("keepdim", Bool(keep))});
    }
    Check("aten.var.correction", {G(Randn({a, b}))}, {Ref(0)});
    Check("aten.var.correction", {G(Randn({a, b}))}, {Ref(0), NoneArg()},
          {Kwarg("correction", Int(0))});
    return ok;
  };
  c["aten.var_mean.correction"] = [] {
    const int64_t a = Dim(), b = Dim(), d = Dim();
    bool ok = Check("aten.var_mean.correction", {G(Randn({a, b, d}))}, {Ref(0), Ints({-1})});
    Check("aten.var_mean.correction", {G(Randn({a, b, d}))}, {Ref(0), Ints({0, 2})},
          {Kwarg("correction", Int(0)), Kwarg("keepdim", Bool(true))});
    Check("aten.var_mean.correction", {G(Randn({a, b}))}, {Ref(0)});
    // Only one of the two outputs receives a gradient.
    Options var_only, mean_only;
    var_only.receive = {true, false};
    mean_only.receive = {false, true};
    Check("aten.var_mean.correction", {G(Randn({a, b}))}, {Ref(0), Ints({1})}, {}, var_only);
    Check("aten.var_mean.correction", {G(Randn({a, b}))}, {Ref(0), Ints({1})}, {}, mean_only);
    return ok;
  };
  c["aten.prod.dim_int"] = [] {
    const int64_t a = Dim(), b = Dim();
    bool ok = Check("aten.prod.dim_int", {G(AwayFromZero({a, b, 3}))}, {Ref(0), Int(-1)});
    Check("aten.prod.dim_int", {G(AwayFromZero({a, b}))}, {Ref(0), Int(0), Bool(true)});
    Check("aten.prod.dim_int", {G(AwayFromZero({a}))}, {Ref(0), Int(0)});
    Check("aten.prod.dim_int", {G(AwayFromZero({b, a}).t())}, {Ref(0), Int(1)});
    // Rows with no zero, one zero and two: the gradient at a lone zero is
    // the product of the rest; every other element's is 0.
    at::Tensor zeros = AwayFromZero({3, 5});
    zeros.index_put_({1, 2}, 0.0);
    zeros.index_put_({2, 0}, 0.0);
    zeros.index_put_({2, 4}, 0.0);
    ok = Check("aten.prod.dim_int", {G(zeros)}, {Ref(0), Int(1)}) && ok;
    ok =
        Check("aten.prod.dim_int", {G(zeros.t().contiguous())}, {Ref(0), Int(0), Bool(true)}) && ok;
    return ok;
  };
  for (const char* t : {"aten.max.dim", "aten.min.dim"}) {
    c[t] = [t] {
      const int64_t a = Dim(), b = Dim(), d = Dim();
      bool ok = true;
      for (bool keep : {false, true}) {
        ok = Check(t, {G(Randn({a, b, d}))}, {Ref(0), Int(1), Bool(keep)}) && ok;
        ok = Check(t, {G(Transposed(a, b))}, {Ref(0), Int(-1), Bool(keep)}) && ok;
      }
      return ok;
    };
  }
  for (const char* t : {"aten._softmax.default", "aten._log_softmax.default"}) {
    c[t] = [t] {
      const int64_t a = Dim(), b = Dim(), d = Dim();
      bool ok = Check(t, {G(Randn({a, b, d}))}, {Ref(0), Int(-1), Bool(false)});
      Check(t, {G(Randn({a, b, d}))}, {Ref(0), Int(1), Bool(false)});
      Check(t, {G(Transposed(a, b))}, {Ref(0), Int(0), Bool(false)});
      return ok;
    };
  }

  // Normalization.
  c["aten.binary_cross_entropy.default"] = [] {
    const int64_t a = Dim(), b = Dim();
    const std::string t = "aten.binary_cross_entropy.default";
    auto prob = [](at::IntArrayRef s) { return at::rand(s, at::kDouble) * 0.98 + 0.01; };
    bool ok = Check(t, {G(prob({a, b})), N(prob({a, b}))}, {Ref(0), Ref(1)});
    Check(t, {G(prob({a, b})), N(prob({a, b})), N(prob({b}))}, {Ref(0), Ref(1), Ref(2), Int(0)});
    Check(t, {G(prob({a})), N(prob({a}))}, {Ref(0), Ref(1), NoneArg(), Int(2)});
    return ok;
  };
  c["aten.native_group_norm.default"] = [] {
    const int64_t n = Dim(1, 3), hw = Dim(2, 6);
    const std::string t = "aten.native_group_norm.default";
    // The output alone: kiln has no gradient through the mean and rstd
    // (F.group_norm never returns them).
    Options out;
    out.receive = {true, false, false};
    bool ok =
        Check(t, {G(Randn({n, 6, hw})), G(Randn({6})), G(Randn({6}))},
              {Ref(0), Ref(1), Ref(2), Int(n), Int(6), Int(hw), Int(3), Float(1e-5)}, {}, out);
    Check(t, {G(Randn({n, 4, hw, 2}))},
          {Ref(0), NoneArg(), NoneArg(), Int(n), Int(4), Int(hw * 2), Int(2), Float(1e-5)}, {},
          out);
    Check(t, {N(Randn({n, 4, hw})), G(Randn({4})), N(Randn({4}))},
          {Ref(0), Ref(1), Ref(2), Int(n), Int(4), Int(hw), Int(4), Float(1e-5)}, {}, out);
    return ok;
  };
  c["aten.native_layer_norm.default"] = [] {
    const int64_t a = Dim(), b = Dim(), d = Dim();
    bool ok =
        Check("aten.native_layer_norm.default", {G(Randn({a, b, d})), G(Randn({d})), G(Randn({d}))},
              {Ref(0), Ints({d}), Ref(1), Ref(2), Float(1e-5)});
    Check("aten.native_layer_norm.default",
          {G(Randn({a, b, d})), N(Randn({b, d})), G(Randn({b, d}))},
          {Ref(0), Ints({b, d}), Ref(1), Ref(2), Float(1e-5)});
    Check("aten.native_layer_norm.default", {N(Randn({a, b})), G(Randn({b})), N(Randn({b}))},
          {Ref(0), Ints({b}), Ref(1), Ref(2), Float(1e-5)});
    Check("aten.native_layer_norm.default", {G(Transposed(a, b))},
          {Ref(0), Ints({b}), NoneArg(), NoneArg(), Float(1e-5)});
    return ok;
  };
  auto batch_norm = [](const std::string& t, bool has_training, bool training) {
    const int64_t n = Dim(), ch = Dim(), h = Dim(), w = Dim();
    auto args = [&](bool weight, bool bias) {
      std::vector<Argument> a = {Ref(0), weight ? Ref(1) : NoneArg(), bias ? Ref(2) : NoneArg(),
                                 Ref(3), Ref(4)};
      if (has_training) a.push_back(Bool(training));
      a.push_back(Float(0.1));
      a.push_back(Float(1e-5));
      return a;
    };
    auto stats = [&] { return std::vector<In>{N(Randn({ch})), N(Positive({ch}))}; };
    std::vector<In> in = {G(Randn({n, ch, h, w})), G(Randn({ch})), G(Randn({ch}))};
    for (In s : stats()) in.push_back(s);
    bool ok = Check(t, in, args(true, true));
    in = {G(Randn({n, ch})), N(Randn({ch})), G(Randn({ch}))};
    for (In s : stats()) in.push_back(s);
    Check(t, in, args(true, true));
    in = {G(Randn({n, ch, h})), G(Randn({ch})), G(Randn({ch}))};
    for (In s : stats()) in.push_back(s);
    Check(t, in, args(false, false));
    return ok;
  };
  c["aten.native_batch_norm.default"] = [batch_norm] {
    batch_norm("aten.native_batch_norm.default", true, false);
    return batch_norm("aten.native_batch_norm.default", true, true);
  };
  c["aten._native_batch_norm_legit_functional.default"] = [batch_norm] {
    return batch_norm("aten._native_batch_norm_legit_functional.default", true, true);
  };
  c["aten._native_batch_norm_legit_no_training.default"] = [batch_norm] {
    return batch_norm("aten._native_batch_norm_legit_no_training.default", false, false);
  };
  c["aten.nll_loss_forward.default"] = [] {
    const int64_t n = Dim(), cls = Dim(3, 6);
    bool ok = true;
    for (int64_t reduction : {0, 1, 2}) {
      ok = Check("aten.nll_loss_forward.default",
                 {G(Randn({n, cls})), N(Indices({n}, cls)), N(Positive({cls}))},
                 {Ref(0), Ref(1), Ref(2), Int(reduction), Int(-100)}) &&
           ok;
      // Ignored targets, no weight.
      Check("aten.nll_loss_forward.default", {G(Randn({n, cls})), N(Indices({n}, cls))},
            {Ref(0), Ref(1), NoneArg(), Int(reduction), Int(1)});
    }
    Check("aten.nll_loss_forward.default", {G(Randn({cls})), N(Indices({}, cls))},
          {Ref(0), Ref(1), NoneArg(), Int(1), Int(-100)});
    return ok;
  };
  c["aten.native_dropout.default"] = [] {
    const double p = 0.3;
    Options o;
    o.random = true;
    o.check_random = [p](const std::vector<at::Tensor>& in, const std::vector<at::Tensor>& out,
                         const JointGraph& jg) {
      // gradient = tangent * mask / (1 - p), with the joint graph's own mask.
      ASSERT_EQ(jg.num_tangents, 1);
      ASSERT_GE(jg.grad_output_index[0], 0);
      const at::Tensor& mask = out[1];
      const at::Tensor& tangent = in[1];
      at::Tensor want = tangent * mask * (1.0 / (1.0 - p));
      EXPECT_TRUE(at::allclose(out[jg.grad_output_index[0]], want, kRtol, kAtol));
      EXPECT_TRUE(at::allclose(out[0], in[0] * mask * (1.0 / (1.0 - p)), kRtol, kAtol));
    };
    Check("aten.native_dropout.default", {G(Transposed(Dim(), Dim()))},
          {Ref(0), Float(p), Bool(true)}, {}, o);
    bool ok = Check("aten.native_dropout.default", {G(Randn({Dim(), Dim(), Dim()}))},
                    {Ref(0), Float(p), Bool(true)}, {}, o);
    // Not training: the identity, which libtorch can check directly.
    Check("aten.native_dropout.default", {G(Randn({Dim(), Dim()}))},
          {Ref(0), Float(p), Bool(false)});
    return ok;
  };
  c["aten.normal.Tensor_float"] = [] {
    Options o;
    o.random = true;
    o.check_random = [](const std::vector<at::Tensor>& in, const std::vector<at::Tensor>& out,
                        const JointGraph& jg) {
      // mean's gradient is autograd's zeros, whatever was drawn.
      ASSERT_GE(jg.grad_output_index[0], 0);
      EXPECT_TRUE(at::equal(out[jg.grad_output_index[0]], at::zeros_like(in[0])));
      EXPECT_FALSE(at::equal(out[0], in[0]));  // it drew
    };
    return Check("aten.normal.Tensor_float", {G(Randn({Dim(), Dim()}))}, {Ref(0), Float(0.5)}, {},
                 o);
  };
}

}  // namespace kiln::autograd::grad_check_test
