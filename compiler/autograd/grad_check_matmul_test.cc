// Gradient-check cases of matmul, convolution, pooling and embedding (see
// grad_check_test.cc).
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "compiler/autograd/grad_check_test_util.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/graph.h"
#include "compiler/ops/registry.h"
#include "gtest/gtest.h"

namespace kiln::autograd::grad_check_test {

void AddMatmulCases(std::map<std::string, Case>& c) {
  // Matmul, convolution, pooling, embedding.
  c["aten.mm.default"] = [] {
    const int64_t a = Dim(), b = Dim(), d = Dim();
    bool ok = Check("aten.mm.default", {G(Randn({a, b})), G(Randn({b, d}))}, {Ref(0), Ref(1)});
    // Column-major operands.
    Check("aten.mm.default", {G(Transposed(a, b)), G(Transposed(b, d))}, {Ref(0), Ref(1)});
    Check("aten.mm.default", {N(Randn({a, b})), G(Transposed(b, d))}, {Ref(0), Ref(1)});
    return ok;
  };
  c["aten.bmm.default"] = [] {
    const int64_t n = Dim(), a = Dim(), b = Dim(), d = Dim();
    bool ok =
        Check("aten.bmm.default", {G(Randn({n, a, b})), G(Randn({n, b, d}))}, {Ref(0), Ref(1)});
    // Column-major operands (attention's k^T): their gradients come out
    // column-major too.
    Check("aten.bmm.default", {G(Randn({n, b, a}).transpose(1, 2)), N(Randn({n, b, d}))},
          {Ref(0), Ref(1)});
    Check("aten.bmm.default", {G(Randn({n, a, b})), G(Randn({n, d, b}).transpose(1, 2))},
          {Ref(0), Ref(1)});
    return ok;
  };
  c["aten.addmm.default"] = [] {
    const int64_t a = Dim(), b = Dim(), d = Dim();
    bool ok = Check("aten.addmm.default", {G(Randn({d})), G(Randn({a, b})), G(Randn({b, d}))},
                    {Ref(0), Ref(1), Ref(2)}, {Kwarg("beta", Float(0.5)), Kwarg("alpha", Int(2))});
    Check("aten.addmm.default", {G(Randn({a, d})), G(Transposed(a, b)), G(Transposed(b, d))},
          {Ref(0), Ref(1), Ref(2)});
    Check("aten.addmm.default", {N(Randn({a, 1})), G(Randn({a, b})), N(Randn({b, d}))},
          {Ref(0), Ref(1), Ref(2)}, {Kwarg("alpha", Float(-1.5))});
    return ok;
  };
  c["aten.convolution.default"] = [] {
    const int64_t n = Dim(1, 3), cin = 4, cout = 6, h = Dim(5, 8), w = Dim(5, 8);
    auto conv = [&](std::vector<In> in, bool bias, std::vector<int64_t> stride,
                    std::vector<int64_t> padding, std::vector<int64_t> dilation, bool transposed,
                    std::vector<int64_t> output_padding, int64_t groups) {
      return Check("aten.convolution.default", in,
                   {Ref(0), Ref(1), bias ? Ref(2) : NoneArg(), Ints(stride), Ints(padding),
                    Ints(dilation), Bool(transposed), Ints(output_padding), Int(groups)});
    };
    bool ok = conv({G(Randn({n, cin, h, w})), G(Randn({cout, cin, 3, 3})), G(Randn({cout}))}, true,
                   {1, 1}, {1, 0}, {1, 1}, false, {0, 0}, 1);
    conv({G(Randn({n, cin, h, w})), G(Randn({cout, cin / 2, 2, 3}))}, false, {2, 1}, {0, 1}, {1, 2},
         false, {0, 0}, 2);
    conv({N(Randn({n, cin, h, w})), G(Randn({cin, cout / 2, 3, 3})), G(Randn({cout}))}, true,
         {2, 2}, {1, 1}, {1, 1}, true, {1, 0}, 2);
    conv({G(Randn({n, cin, h})), N(Randn({cout, cin, 3})), G(Randn({cout}))}, true, {1}, {1}, {1},
         false, {0}, 1);
    return ok;
  };
  c["aten.max_pool2d_with_indices.default"] = [] {
    const int64_t n = Dim(1, 3), ch = Dim(1, 3), h = Dim(4, 7), w = Dim(4, 7);
    const std::string t = "aten.max_pool2d_with_indices.default";
    bool ok = Check(t, {G(Randn({n, ch, h, w}))}, {Ref(0), Ints({2, 2}), Ints({2, 2})});
    Check(t, {G(Randn({n, ch, h, w}))}, {Ref(0), Ints({3, 3}), Ints({1, 1}), Ints({1, 1})});
    Check(t, {G(Randn({ch, h, w}))}, {Ref(0), Ints({2, 3})});
    Check(t, {G(Randn({n, ch, h, w}))},
          {Ref(0), Ints({2, 2}), Ints({2, 1}), Ints({0, 1}), Ints({1, 1}), Bool(true)});
    return ok;
  };
  c["aten.max_pool3d_with_indices.default"] = [] {
    const int64_t n = Dim(1, 3), ch = Dim(1, 3), d = Dim(4, 6), h = Dim(4, 6), w = Dim(4, 6);
    const std::string t = "aten.max_pool3d_with_indices.default";
    bool ok = Check(t, {G(Randn({n, ch, d, h, w}))}, {Ref(0), Ints({2, 2, 2})});
    Check(t, {G(Randn({ch, d, h, w}))}, {Ref(0), Ints({3}), Ints({1, 2, 1}), Ints({1})});
    return ok;
  };
  c["aten._adaptive_avg_pool2d.default"] = [] {
    const int64_t n = Dim(1, 3), ch = Dim(1, 3), h = Dim(4, 7), w = Dim(4, 7);
    const std::string t = "aten._adaptive_avg_pool2d.default";
    bool ok = Check(t, {G(Randn({n, ch, h, w}))}, {Ref(0), Ints({3, 2})});
    Check(t, {G(Randn({ch, h, w}))}, {Ref(0), Ints({h - 1, 1})});
    return ok;
  };
  c["aten.adaptive_max_pool2d.default"] = [] {
    const int64_t n = Dim(1, 3), ch = Dim(1, 3), h = Dim(4, 7), w = Dim(4, 7);
    const std::string t = "aten.adaptive_max_pool2d.default";
    bool ok = Check(t, {G(Randn({n, ch, h, w}))}, {Ref(0), Ints({2, 3})});
    Check(t, {G(Randn({ch, h, w}))}, {Ref(0), Ints({1, w - 1})});
    return ok;
  };
  c["aten.avg_pool2d.default"] = [] {
    const int64_t n = Dim(1, 3), ch = Dim(1, 3), h = Dim(4, 7), w = Dim(4, 7);
    const std::string t = "aten.avg_pool2d.default";
    bool ok = Check(t, {G(Randn({n, ch, h, w}))}, {Ref(0), Ints({2, 2})});
    Check(t, {G(Randn({n, ch, h, w}))},
          {Ref(0), Ints({3, 3}), Ints({2, 2}), Ints({1, 1}), Bool(true), Bool(false)});
    Check(t, {G(Randn({ch, h, w}))},
          {Ref(0), Ints({2, 2}), Ints({1, 1}), Ints({0, 0}), Bool(false), Bool(true), Int(3)});
    return ok;
  };
  c["aten.avg_pool3d.default"] = [] {
    const int64_t n = Dim(1, 3), ch = Dim(1, 3), d = Dim(4, 6), h = Dim(4, 6), w = Dim(4, 6);
    const std::string t = "aten.avg_pool3d.default";
    bool ok = Check(t, {G(Randn({n, ch, d, h, w}))}, {Ref(0), Ints({2, 2, 2})});
    ok = Check(t, {G(Randn({ch, d, h, w}))},
               {Ref(0), Ints({3, 3, 2}), Ints({2, 1, 2}), Ints({1, 1, 0}), Bool(true),
                Bool(false)}) &&
         ok;
    return ok;
  };
  c["aten._adaptive_avg_pool3d.default"] = [] {
    const int64_t n = Dim(1, 3), ch = Dim(1, 3), d = Dim(4, 6), h = Dim(4, 6), w = Dim(4, 6);
    const std::string t = "aten._adaptive_avg_pool3d.default";
    bool ok = Check(t, {G(Randn({n, ch, d, h, w}))}, {Ref(0), Ints({3, 2, 1})});
    ok = Check(t, {G(Randn({ch, d, h, w}))}, {Ref(0), Ints({d - 1, 1, w})}) && ok;
    return ok;
  };
  c["aten.embedding.default"] = [] {
    const int64_t v = Dim(4, 8), d = Dim();
    bool ok = Check("aten.embedding.default", {G(Randn({v, d})), N(Indices({3, 5}, v))},
                    {Ref(0), Ref(1)});
    Check("aten.embedding.default", {G(Randn({v, d})), N(Indices({9}, v))},
          {Ref(0), Ref(1), Int(1), Bool(true)});
    return ok;
  };
  // Memory-efficient and flash attention run on CUDA only: here the joint
  // graph's shape (ATen's backward of the kernel, one gradient per operand,
  // shaped as the operand); tests/gpu compares their numbers with eager's.
  auto fused_attention = [](const std::string& target, const std::string& backward, v1::DType dtype,
                            std::vector<Argument> rest, std::vector<Argument> kwargs) {
    ir::GraphBuilder b("attention");
    std::vector<Argument> args;
    for (const char* name : {"q", "k", "v"}) {
      ir::TensorMeta m = ir::ContiguousMeta({2, 3, 32, 16}, dtype);
      m.device_type = "cuda";
      m.device_index = 0;
      m.requires_grad = true;
      args.push_back(Ref(b.AddInput(m, v1::Placeholder::USER_INPUT, name)));
    }
    args.insert(args.end(), rest.begin(), rest.end());
    auto out = ops::Emit(b, ops::DefaultRegistry(), target, std::move(args), std::move(kwargs));
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) return false;
    b.AddOutput((*out)[0]);
    auto jg = BuildJointGraph(std::move(b).Build(), {});
    EXPECT_TRUE(jg.ok()) << jg.status();
    if (!jg.ok()) return false;
    int backwards = 0;
    for (const ir::Node& n : jg->graph.nodes()) backwards += n.target == backward;
    EXPECT_EQ(backwards, 1) << target;
    for (int i = 0; i < 3; ++i) {
      const int at = jg->grad_output_index[i];
      EXPECT_GE(at, 0);
      if (at >= 0) {
        EXPECT_EQ(jg->graph.value(jg->graph.outputs()[at]).meta.sizes,
                  jg->graph.value(jg->graph.inputs()[i].value).meta.sizes);
      }
    }
    return false;  // numbers: tests/gpu
  };
  c["aten._scaled_dot_product_efficient_attention.default"] = [fused_attention] {
    return fused_attention("aten._scaled_dot_product_efficient_attention.default",
                           "aten._scaled_dot_product_efficient_attention_backward.default",
                           v1::FLOAT32, {NoneArg(), Bool(true)}, {});
  };
  c["aten._flash_attention_forward.default"] = [fused_attention] {
    // [B, L, H, E] = [2, 3, 32, 16]: lengths 3.
    return fused_attention(
        "aten._flash_attention_forward.default", "aten._flash_attention_backward.default",
        v1::BFLOAT16, {NoneArg(), NoneArg(), Int(3), Int(3), Float(0.0), Bool(false), Bool(false)},
        {Kwarg("scale", Float(0.25))});
  };
}

}  // namespace kiln::autograd::grad_check_test
