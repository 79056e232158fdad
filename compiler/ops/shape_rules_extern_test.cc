// Tests of the shape rules of matmul, fused attention, convolution, pooling, embedding and
// indexing.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/graph.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_rules_test_util.h"
#include "compiler/ops/shape_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::ops::shape_rules_test {
namespace {

// ---------------------------------------------------------------------------
// Matmul, convolution, pooling, indexing.

TEST(ShapeRules, MatmulErrorsNameTheArguments) {
  Env env;
  auto a = env.In(v1::FLOAT32, {4, 8});
  auto b = env.In(v1::FLOAT32, {7, 5});
  ir::GraphBuilder& gb = env.builder();
  // Through CheckMetadata, the node's name is in the message.
  auto out = gb.AddNode("aten.mm.default", {ir::Ref(a), ir::Ref(b)}, {}, {F32({4, 5})}, "mm_1");
  gb.AddOutput(out[0]);
  ir::Graph g = std::move(gb).Build();
  absl::Status s = CheckMetadata(DefaultRegistry(), g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      s.message(),
      "node 'mm_1' (aten.mm.default): argument 'mat2' has size[0] 7, but 'self' has size[1] 8");

  Env env2;
  auto x = env2.In(v1::FLOAT32, {2, 4, 8});
  auto y = env2.In(v1::FLOAT32, {2, 8, 3});
  EXPECT_EQ(Str(env2.One("aten.bmm.default", {ir::Ref(x), ir::Ref(y)}).sizes), "[2, 4, 3]");
  auto bias = env2.In(v1::FLOAT32, {3});
  auto m1 = env2.In(v1::FLOAT32, {5, 8});
  auto m2 = env2.In(v1::FLOAT32, {8, 3});
  EXPECT_EQ(Str(env2.One("aten.addmm.default", {ir::Ref(bias), ir::Ref(m1), ir::Ref(m2)}).sizes),
            "[5, 3]");
  auto r = env2.Infer("aten.mm.default", {ir::Ref(x), ir::Ref(y)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("argument 'self' should be a 2-D tensor"));
  auto h = env2.In(v1::FLOAT16, {8, 3});
  r = env2.Infer("aten.mm.default", {ir::Ref(m1), ir::Ref(h)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("argument 'mat2' has dtype FLOAT16"));
}

struct ConvCase {
  SymSizes input;
  std::vector<int64_t> weight;
  std::vector<int64_t> stride, padding, dilation;
  bool transposed;
  std::vector<int64_t> output_padding;
  int64_t groups;
  std::string want;
};

TEST(ShapeRules, FusedAttention) {
  Env env;
  auto q = env.In(v1::BFLOAT16, {2, 4, 16, 64});
  auto k = env.In(v1::BFLOAT16, {2, 4, 24, 64});
  auto v = env.In(v1::BFLOAT16, {2, 4, 24, 32});
  auto efficient =
      env.Infer("aten._scaled_dot_product_efficient_attention.default",
                {ir::Ref(q), ir::Ref(k), ir::Ref(v), Argument{"", ir::None{}}, Argument{"", true}});
  ASSERT_TRUE(efficient.ok()) << efficient.status();
  ASSERT_EQ(efficient->size(), 4u);
  EXPECT_EQ(Str((*efficient)[0].sizes), "[2, 4, 16, 32]");
  EXPECT_EQ(Str((*efficient)[0].strides), "[2048, 32, 128, 1]");  // [B, L, H, Ev] in memory
  EXPECT_EQ(Str((*efficient)[1].sizes), "[2, 4, 32]");            // 16 rounded up to 32
  EXPECT_EQ((*efficient)[1].dtype, v1::FLOAT32);

  // Flash attention in its [B, L, H, E] layout, its output laid out as q.
  auto fq = env.In(v1::BFLOAT16, {2, 16, 4, 64});
  auto fk = env.In(v1::BFLOAT16, {2, 24, 4, 64});
  auto flash =
      env.Infer("aten._flash_attention_forward.default",
                {ir::Ref(fq), ir::Ref(fk), ir::Ref(fk), Argument{"", ir::None{}},
                 Argument{"", ir::None{}}, Argument{"", int64_t{16}}, Argument{"", int64_t{24}},
                 Argument{"", 0.0}, Argument{"", false}, Argument{"", false}});
  ASSERT_TRUE(flash.ok()) << flash.status();
  ASSERT_EQ(flash->size(), 5u);
  EXPECT_EQ(Str((*flash)[0].sizes), "[2, 16, 4, 64]");
  EXPECT_EQ(Str((*flash)[1].sizes), "[2, 4, 16]");

  // Refused by name: dropout, a bias, mismatched sizes.
  auto dropout = env.Infer("aten._scaled_dot_product_efficient_attention.default",
                           {ir::Ref(q), ir::Ref(k), ir::Ref(v), Argument{"", ir::None{}},
                            Argument{"", false}, Argument{"", 0.1}});
  EXPECT_TRUE(absl::StrContains(dropout.status().message(), "'dropout_p'")) << dropout.status();
  auto bias = env.Infer("aten._scaled_dot_product_efficient_attention.default",
                        {ir::Ref(q), ir::Ref(k), ir::Ref(v), ir::Ref(q), Argument{"", false}});
  EXPECT_TRUE(absl::StrContains(bias.status().message(), "'attn_bias'")) << bias.status();
  auto sizes = env.Infer(
      "aten._scaled_dot_product_efficient_attention.default",
      {ir::Ref(q), ir::Ref(v), ir::Ref(v), Argument{"", ir::None{}}, Argument{"", false}});
  EXPECT_EQ(sizes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(sizes.status().message(), "'key'")) << sizes.status();
}

TEST(ShapeRules, ConvolutionOutputSizes) {
  const std::vector<ConvCase> cases = {
      {ToSymSizes({1, 3, 16, 16}),
       {8, 3, 3, 3},
       {1, 1},
       {1, 1},
       {1, 1},
       false,
       {0, 0},
       1,
       "[1, 8, 16, 16]"},
      {ToSymSizes({1, 3, 16, 16}),
       {8, 3, 3, 3},
       {2, 2},
       {0, 0},
       {1, 1},
       false,
       {0, 0},
       1,
       "[1, 8, 7, 7]"},
      {ToSymSizes({1, 3, 16, 16}),
       {8, 3, 3, 3},
       {1, 1},
       {2, 2},
       {2, 2},
       false,
       {0, 0},
       1,
       "[1, 8, 16, 16]"},
      {ToSymSizes({2, 3, 15, 9}),
       {8, 3, 5, 3},
       {2, 1},
       {1, 0},
       {1, 1},
       false,
       {0, 0},
       1,
       "[2, 8, 7, 7]"},
      {ToSymSizes({1, 6, 16, 16}), {6, 2, 3, 3}, {1}, {0}, {1}, false, {0}, 3, "[1, 6, 14, 14]"},
      {ToSymSizes({1, 8, 7, 7}),
       {8, 4, 3, 3},
       {2, 2},
       {1, 1},
       {1, 1},
       true,
       {1, 1},
       1,
       "[1, 4, 14, 14]"},
      {ToSymSizes({1, 8, 7, 7}),
       {8, 2, 3, 3},
       {1, 1},
       {0, 0},
       {1, 1},
       true,
       {0, 0},
       2,
       "[1, 4, 9, 9]"},
      {ToSymSizes({2, 4, 10}), {5, 4, 3}, {1}, {0}, {1}, false, {0}, 1, "[2, 5, 8]"},
      {ToSymSizes({2, 4, 6, 6, 6}),
       {5, 4, 3, 3, 3},
       {1, 1, 1},
       {1, 1, 1},
       {1, 1, 1},
       false,
       {0, 0, 0},
       1,
       "[2, 5, 6, 6, 6]"},
      {{S("s0"), C(3), S("s1"), C(16)},
       {8, 3, 3, 3},
       {1, 1},
       {1, 1},
       {1, 1},
       false,
       {0, 0},
       1,
       "[s0, 8, s1, 16]"},
      {{S("s0"), C(3), S("s1"), C(16)},
       {8, 3, 3, 3},
       {2, 2},
       {1, 1},
       {1, 1},
       false,
       {0, 0},
       1,
       "[s0, 8, (s1 - 1)//2 + 1, 8]"},
  };
  for (const ConvCase& c : cases) {
    Env env;
    auto in = env.In(Meta(v1::FLOAT32, c.input));
    auto w = env.In(v1::FLOAT32, c.weight);
    SCOPED_TRACE(Str(c.input) + " * " + Str(ToSymSizes(c.weight)));
    TensorMeta m = env.One("aten.convolution.default",
                           {ir::Ref(in), ir::Ref(w), ir::NoneArg(), ir::Ints(c.stride),
                            ir::Ints(c.padding), ir::Ints(c.dilation), ir::Bool(c.transposed),
                            ir::Ints(c.output_padding), ir::Int(c.groups)});
    EXPECT_EQ(Str(m.sizes), c.want);
    EXPECT_EQ(m.strides, ContiguousStrides(m.sizes));
  }
}

TEST(ShapeRules, ConvolutionErrorsAndBackward) {
  Env env;
  auto in = env.In(v1::FLOAT32, {1, 4, 8, 8});
  auto w = env.In(v1::FLOAT32, {8, 3, 3, 3});
  auto r = env.Infer("aten.convolution.default",
                     {ir::Ref(in), ir::Ref(w), ir::NoneArg(), ir::Ints({1, 1}), ir::Ints({0, 0}),
                      ir::Ints({1, 1}), ir::Bool(false), ir::Ints({0, 0}), ir::Int(1)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("argument 'weight' has sizes [8, 3, 3, 3]"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("'input' has 4"));

  auto x = env.In(v1::FLOAT32, {2, 3, 8, 8});
  auto grad = env.In(v1::FLOAT32, {2, 8, 6, 6});
  r = env.Infer(
      "aten.convolution_backward.default",
      {ir::Ref(grad), ir::Ref(x), ir::Ref(w), ir::Ints({8}), ir::Ints({1, 1}), ir::Ints({0, 0}),
       ir::Ints({1, 1}), ir::Bool(false), ir::Ints({0, 0}), ir::Int(1), Bools({true, true, true})});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ(Str((*r)[0].sizes), "[2, 3, 8, 8]");
  EXPECT_EQ(Str((*r)[1].sizes), "[8, 3, 3, 3]");
  EXPECT_EQ(Str((*r)[2].sizes), "[8]");
}

TEST(ShapeRules, Pooling) {
  Env env;
  auto x = env.In(v1::FLOAT32, {1, 3, 7, 7});
  auto r = env.Infer("aten.max_pool2d_with_indices.default",
                     {ir::Ref(x), ir::Ints({2, 2}), ir::Ints({2, 2})});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ(Str((*r)[0].sizes), "[1, 3, 3, 3]");
  EXPECT_EQ((*r)[1].dtype, v1::INT64);
  r = env.Infer("aten.max_pool2d_with_indices.default",
                {ir::Ref(x), ir::Ints({2, 2}), ir::Ints({2, 2}), ir::Ints({0, 0}), ir::Ints({1, 1}),
                 ir::Bool(true)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Str((*r)[0].sizes), "[1, 3, 4, 4]");
  // ceil_mode drops a last window that would start in the right padding.
  auto y = env.In(v1::FLOAT32, {1, 1, 5, 5});
  r = env.Infer(
      "aten.max_pool2d_with_indices.default",
      {ir::Ref(y), ir::Ints({2}), ir::Ints({2}), ir::Ints({1}), ir::Ints({1}), ir::Bool(true)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Str((*r)[0].sizes), "[1, 1, 3, 3]");
  // Default stride = kernel size.
  EXPECT_EQ(Str(env.One("aten.avg_pool2d.default", {ir::Ref(x), ir::Ints({3, 3})}).sizes),
            "[1, 3, 2, 2]");
  EXPECT_EQ(Str(env.One("aten.avg_pool2d.default",
                        {ir::Ref(x), ir::Ints({3, 3}), ir::Ints({1, 1}), ir::Ints({1, 1})})
                    .sizes),
            "[1, 3, 7, 7]");
}

// ATen's layouts: a CUDA convolution with a channels-last input or weight
// runs channels-last (cuDNN), its backward too; a pooling keeps its input's
// channels-last layout; elsewhere outputs are contiguous.
TEST(ShapeRules, ChannelsLastLayoutsFollowATen) {
  Env env;
  auto channels_last = [](std::vector<int64_t> sizes, const std::string& device) {
    TensorMeta m = F32(sizes);
    m.device_type = device;
    m.strides = ChannelsLastStrides(m.sizes);
    return m;
  };
  auto contiguous = [](std::vector<int64_t> sizes, const std::string& device) {
    TensorMeta m = F32(sizes);
    m.device_type = device;
    return m;
  };
  auto conv = [&](ir::ValueId x, ir::ValueId w, int64_t groups) {
    return env.Infer("aten.convolution.default",
                     {ir::Ref(x), ir::Ref(w), ir::NoneArg(), ir::Ints({1, 1}), ir::Ints({1, 1}),
                      ir::Ints({1, 1}), ir::Bool(false), ir::Ints({0, 0}), ir::Int(groups)});
  };
  const auto x_nhwc = env.In(channels_last({2, 4, 8, 8}, "cuda"));
  const auto x = env.In(contiguous({2, 4, 8, 8}, "cuda"));
  const auto w = env.In(contiguous({6, 4, 3, 3}, "cuda"));
  const auto w_nhwc = env.In(channels_last({6, 4, 3, 3}, "cuda"));
  const auto w_grouped = env.In(contiguous({6, 2, 3, 3}, "cuda"));
  for (auto [input, weight, want] :
       {std::tuple{x_nhwc, w, true}, std::tuple{x, w_nhwc, true}, std::tuple{x, w, false}}) {
    auto r = conv(input, weight, 1);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(IsChannelsLast((*r)[0]), want);
    EXPECT_EQ(IsContiguous((*r)[0]), !want);
    auto grads =
        env.Infer("aten.convolution_backward.default",
                  {ir::Ref(env.In((*r)[0])), ir::Ref(input), ir::Ref(weight), ir::Ints({6}),
                   ir::Ints({1, 1}), ir::Ints({1, 1}), ir::Ints({1, 1}), ir::Bool(false),
                   ir::Ints({0, 0}), ir::Int(1), Bools({true, true, true})});
    ASSERT_TRUE(grads.ok()) << grads.status();
    EXPECT_EQ(IsChannelsLast((*grads)[0]), want);
    EXPECT_EQ(IsChannelsLast((*grads)[1]), want);
  }
  // Grouped convolutions may take ATen's depthwise kernels: contiguous.
  auto grouped = conv(x_nhwc, w_grouped, 2);
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  EXPECT_TRUE(IsContiguous((*grouped)[0]));
  // On the CPU, contiguous as before.
  const auto cpu_x = env.In(channels_last({2, 4, 8, 8}, "cpu"));
  const auto cpu_w = env.In(contiguous({6, 4, 3, 3}, "cpu"));
  auto cpu = conv(cpu_x, cpu_w, 1);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_TRUE(IsContiguous((*cpu)[0]));
  // Pooling keeps the layout, indices included; its backward too.
  auto pooled = env.Infer("aten.max_pool2d_with_indices.default",
                          {ir::Ref(x_nhwc), ir::Ints({2, 2}), ir::Ints({2, 2})});
  ASSERT_TRUE(pooled.ok()) << pooled.status();
  EXPECT_TRUE(IsChannelsLast((*pooled)[0]));
  EXPECT_TRUE(IsChannelsLast((*pooled)[1]));
  auto back = env.Infer(
      "aten.max_pool2d_with_indices_backward.default",
      {ir::Ref(env.In((*pooled)[0])), ir::Ref(x_nhwc), ir::Ints({2, 2}), ir::Ints({2, 2}),
       ir::Ints({0, 0}), ir::Ints({1, 1}), ir::Bool(false), ir::Ref(env.In((*pooled)[1]))});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(IsChannelsLast((*back)[0]));
  EXPECT_TRUE(IsContiguous(env.One("aten.avg_pool2d.default", {ir::Ref(x), ir::Ints({2, 2})})));
}

TEST(ShapeRules, EmbeddingIndexGather) {
  Env env;
  auto w = env.In(v1::FLOAT32, {100, 16});
  auto idx = env.In(v1::INT64, {4, 7});
  EXPECT_EQ(Str(env.One("aten.embedding.default", {ir::Ref(w), ir::Ref(idx)}).sizes), "[4, 7, 16]");
  auto g = env.In(v1::FLOAT32, {4, 7, 16});
  TensorMeta db = env.One("aten.embedding_dense_backward.default",
                          {ir::Ref(g), ir::Ref(idx), ir::Int(100), ir::Int(-1), ir::Bool(false)});
  EXPECT_EQ(Str(db.sizes), "[100, 16]");

  auto x = env.In(v1::FLOAT32, {10, 3, 5});
  auto i = env.In(v1::INT64, {6});
  EXPECT_EQ(Str(env.One("aten.index.Tensor", {ir::Ref(x), Tensors({i})}).sizes), "[6, 3, 5]");
  EXPECT_EQ(Str(env.One("aten.index.Tensor", {ir::Ref(x), Tensors({ir::kNoValue, i})}).sizes),
            "[10, 6, 5]");
  EXPECT_EQ(Str(env.One("aten.index.Tensor", {ir::Ref(x), Tensors({i, ir::kNoValue, i})}).sizes),
            "[6, 3]");
  auto mask = env.In(v1::BOOL, {10});
  auto r = env.Infer("aten.index.Tensor", {ir::Ref(x), Tensors({mask})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("argument 'indices' entry 0 is a mask"));

  auto gi = env.In(v1::INT64, {10, 2, 5});
  EXPECT_EQ(Str(env.One("aten.gather.default", {ir::Ref(x), ir::Int(1), ir::Ref(gi)}).sizes),
            "[10, 2, 5]");
}

}  // namespace
}  // namespace kiln::ops::shape_rules_test
