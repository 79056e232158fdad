// Tests of the shape rules of reductions and of normalization, losses and
// dropout.
#include <string>
#include <vector>

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
// Reductions.

struct ReductionCase {
  std::string target;
  SymSizes in;
  std::vector<Argument> args;  // after self
  std::string want;
};

TEST(ShapeRules, Reductions) {
  const SymSizes x = ToSymSizes({2, 3, 4});
  const std::vector<ReductionCase> cases = {
      {"aten.sum.dim_IntList", x, {ir::Ints({-1})}, "[2, 3]"},
      {"aten.sum.dim_IntList", x, {ir::Ints({0, 2}), ir::Bool(true)}, "[1, 3, 1]"},
      {"aten.sum.dim_IntList", x, {ir::Ints({-1, 0})}, "[3]"},
      {"aten.sum.dim_IntList", x, {ir::Ints({})}, "[]"},
      {"aten.sum.dim_IntList", x, {ir::NoneArg(), ir::Bool(true)}, "[1, 1, 1]"},
      {"aten.sum.default", x, {}, "[]"},
      {"aten.mean.dim", {S("s0"), C(8)}, {ir::Ints({-1}), ir::Bool(true)}, "[s0, 1]"},
      {"aten.mean.default", x, {}, "[]"},
      {"aten.amax.default", x, {ir::Ints({1})}, "[2, 4]"},
      {"aten.amin.default", x, {}, "[]"},
      {"aten.var.correction", x, {ir::Ints({1})}, "[2, 4]"},
      {"aten.argmax.default", x, {ir::Int(-2)}, "[2, 4]"},
      {"aten.argmax.default", x, {}, "[]"},
      {"aten.prod.dim_int", x, {ir::Int(0), ir::Bool(true)}, "[1, 3, 4]"},
      {"aten._softmax.default", x, {ir::Int(-1), ir::Bool(false)}, "[2, 3, 4]"},
      {"aten.sum.dim_IntList", ToSymSizes({}), {ir::Ints({0})}, "[]"},
  };
  for (const ReductionCase& c : cases) {
    Env env;
    auto in = env.In(Meta(v1::FLOAT32, c.in));
    std::vector<Argument> args = {ir::Ref(in)};
    args.insert(args.end(), c.args.begin(), c.args.end());
    SCOPED_TRACE(c.target + " " + c.want);
    TensorMeta m = env.One(c.target, args);
    EXPECT_EQ(Str(m.sizes), c.want);
    EXPECT_EQ(m.strides, ContiguousStrides(m.sizes));
  }
}

TEST(ShapeRules, ReductionDtypesAndOutputs) {
  Env env;
  auto i = env.In(v1::INT32, {2, 3});
  auto b = env.In(v1::BOOL, {2, 3});
  auto h = env.In(v1::FLOAT16, {2, 3});
  EXPECT_EQ(env.One("aten.sum.dim_IntList", {ir::Ref(i), ir::Ints({0})}).dtype, v1::INT64);
  EXPECT_EQ(env.One("aten.sum.default", {ir::Ref(b)}).dtype, v1::INT64);
  EXPECT_EQ(
      env.One("aten.sum.default", {ir::Ref(i)}, {ir::Kwarg("dtype", Dtype(v1::FLOAT64))}).dtype,
      v1::FLOAT64);
  EXPECT_EQ(env.One("aten.amax.default", {ir::Ref(i), ir::Ints({0})}).dtype, v1::INT32);
  EXPECT_EQ(env.One("aten.argmax.default", {ir::Ref(h), ir::Int(1)}).dtype, v1::INT64);
  EXPECT_EQ(env.One("aten._softmax.default", {ir::Ref(h), ir::Int(1), ir::Bool(true)}).dtype,
            v1::FLOAT32);
  EXPECT_EQ(env.One("aten._log_softmax.default", {ir::Ref(h), ir::Int(1), ir::Bool(false)}).dtype,
            v1::FLOAT16);

  auto r = env.Infer("aten.max.dim", {ir::Ref(h), ir::Int(1)});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ(Str((*r)[0].sizes), "[2]");
  EXPECT_EQ((*r)[0].dtype, v1::FLOAT16);
  EXPECT_EQ((*r)[1].dtype, v1::INT64);

  r = env.Infer("aten.var_mean.correction", {ir::Ref(h), ir::Ints({1})},
                {ir::Kwarg("keepdim", ir::Bool(true))});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ(Str((*r)[0].sizes), "[2, 1]");
  EXPECT_EQ(Str((*r)[1].sizes), "[2, 1]");
}

TEST(ShapeRules, ReductionErrorsNameTheArgument) {
  Env env;
  auto x = env.In(v1::FLOAT32, {2, 3});
  auto r = env.Infer("aten.sum.dim_IntList", {ir::Ref(x), ir::Ints({2})});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("argument 'dim': dimension 2 is out of range for a tensor of rank 2"));
  r = env.Infer("aten.sum.dim_IntList", {ir::Ref(x), ir::Ints({1, -1})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("appears more than once"));
  r = env.Infer("aten._softmax.default", {ir::Ref(x), ir::Int(-3), ir::Bool(false)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("argument 'dim'"));
}

// ---------------------------------------------------------------------------
// Normalization, losses, dropout.

TEST(ShapeRules, LayerNormHasThreeOutputs) {
  struct Case {
    v1::DType dtype;
    std::string device;
    v1::DType stats;
  };
  for (const Case& c :
       {Case{v1::FLOAT32, "cpu", v1::FLOAT32}, Case{v1::FLOAT16, "cuda", v1::FLOAT32},
        Case{v1::BFLOAT16, "cuda", v1::FLOAT32}, Case{v1::FLOAT16, "cpu", v1::FLOAT16}}) {
    Env env;
    auto x = env.In(Meta(c.dtype, ToSymSizes({2, 5, 8, 16}), c.device));
    auto w = env.In(Meta(c.dtype, ToSymSizes({8, 16}), c.device));
    auto r = env.Infer("aten.native_layer_norm.default",
                       {ir::Ref(x), ir::Ints({8, 16}), ir::Ref(w), ir::NoneArg(), ir::Float(1e-5)});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->size(), 3u);
    EXPECT_EQ(Str((*r)[0].sizes), "[2, 5, 8, 16]");
    EXPECT_EQ((*r)[0].dtype, c.dtype);
    for (int i = 1; i < 3; ++i) {
      EXPECT_EQ(Str((*r)[i].sizes), "[2, 5, 1, 1]");
      EXPECT_EQ(v1::DType_Name((*r)[i].dtype), v1::DType_Name(c.stats)) << c.device;
      EXPECT_EQ((*r)[i].device_type, c.device);
    }
  }
  Env env;
  auto x = env.In(v1::FLOAT32, {8, 32});
  auto r = env.Infer("aten.native_layer_norm.default",
                     {ir::Ref(x), ir::Ints({64}), ir::NoneArg(), ir::NoneArg(), ir::Float(1e-5)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("argument 'normalized_shape' is [64], but 'input' has sizes [8, 32]"));
}

TEST(ShapeRules, LayerNormBackwardGivesEveryOutput) {
  Env env;
  auto x = env.In(v1::FLOAT32, {4, 8});
  auto w = env.In(v1::FLOAT32, {8});
  auto stat = env.In(v1::FLOAT32, {4, 1});
  auto r = env.Infer("aten.native_layer_norm_backward.default",
                     {ir::Ref(x), ir::Ref(x), ir::Ints({8}), ir::Ref(stat), ir::Ref(stat),
                      ir::Ref(w), ir::NoneArg(), Bools({true, false, false})});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ(Str((*r)[0].sizes), "[4, 8]");
  EXPECT_EQ(Str((*r)[1].sizes), "[8]");
  EXPECT_EQ(Str((*r)[2].sizes), "[8]");
}

TEST(ShapeRules, GroupNormStatisticsTakeTheInputsDTypeOnEveryDevice) {
  Env env;
  // As ATen's param_scalar_type: float32 only for a 16-bit input with a
  // float32 weight.
  for (const char* device : {"cpu", "cuda"}) {
    auto x = env.In(Meta(v1::BFLOAT16, ToSymSizes({2, 8, 5}), device));
    auto w16 = env.In(Meta(v1::BFLOAT16, ToSymSizes({8}), device));
    auto w32 = env.In(Meta(v1::FLOAT32, ToSymSizes({8}), device));
    for (auto [w, want] : {std::pair{w16, v1::BFLOAT16}, std::pair{w32, v1::FLOAT32}}) {
      auto r = env.Infer("aten.native_group_norm.default",
                         {ir::Ref(x), ir::Ref(w), ir::Ref(w), ir::Int(2), ir::Int(8), ir::Int(5),
                          ir::Int(2), ir::Float(1e-5)});
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ((*r)[0].dtype, v1::BFLOAT16) << device;
      EXPECT_EQ((*r)[1].dtype, want) << device;
      EXPECT_EQ(Str((*r)[2].sizes), "[2, 2]");
    }
    auto r = env.Infer("aten.native_group_norm.default",
                       {ir::Ref(x), ir::NoneArg(), ir::NoneArg(), ir::Int(2), ir::Int(8),
                        ir::Int(5), ir::Int(2), ir::Float(1e-5)});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)[2].dtype, v1::BFLOAT16) << device;
  }
}

TEST(ShapeRules, BatchNormVariants) {
  Env env;
  auto x = env.In(v1::FLOAT32, {2, 8, 4, 4});
  auto c = env.In(v1::FLOAT32, {8});
  auto r = env.Infer("aten.native_batch_norm.default",
                     {ir::Ref(x), ir::Ref(c), ir::Ref(c), ir::Ref(c), ir::Ref(c), ir::Bool(true),
                      ir::Float(0.1), ir::Float(1e-5)});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ(Str((*r)[1].sizes), "[8]");
  // Evaluation on cpu: empty saved statistics, as PyTorch's cpu kernel.
  r = env.Infer("aten.native_batch_norm.default",
                {ir::Ref(x), ir::Ref(c), ir::Ref(c), ir::Ref(c), ir::Ref(c), ir::Bool(false),
                 ir::Float(0.1), ir::Float(1e-5)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Str((*r)[1].sizes), "[0]");
  r = env.Infer("aten._native_batch_norm_legit_functional.default",
                {ir::Ref(x), ir::Ref(c), ir::Ref(c), ir::Ref(c), ir::Ref(c), ir::Bool(true),
                 ir::Float(0.1), ir::Float(1e-5)});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 5u);
  EXPECT_EQ(Str((*r)[4].sizes), "[8]");
  // bfloat16 input and buffers: the new running statistics are float32, as
  // torch computes them (float32 statistics mixed into bfloat16 buffers).
  auto xb = env.In(v1::BFLOAT16, {2, 8, 4, 4});
  auto cb = env.In(v1::BFLOAT16, {8});
  r = env.Infer("aten._native_batch_norm_legit_functional.default",
                {ir::Ref(xb), ir::Ref(cb), ir::Ref(cb), ir::Ref(cb), ir::Ref(cb), ir::Bool(true),
                 ir::Float(0.1), ir::Float(1e-5)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].dtype, v1::BFLOAT16);
  EXPECT_EQ((*r)[3].dtype, v1::FLOAT32);
  EXPECT_EQ((*r)[4].dtype, v1::FLOAT32);
  r = env.Infer("aten._native_batch_norm_legit_no_training.default",
                {ir::Ref(x), ir::Ref(c), ir::Ref(c), ir::Ref(c), ir::Ref(c), ir::Float(0.1),
                 ir::Float(1e-5)});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);

  auto bad = env.In(v1::FLOAT32, {7});
  r = env.Infer("aten.native_batch_norm.default",
                {ir::Ref(x), ir::Ref(bad), ir::NoneArg(), ir::NoneArg(), ir::NoneArg(),
                 ir::Bool(true), ir::Float(0.1), ir::Float(1e-5)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("argument 'weight' has sizes [7]"));
}

TEST(ShapeRules, NllLossAndDropout) {
  Env env;
  auto logits = env.In(v1::FLOAT32, {4, 10});
  auto target = env.In(v1::INT64, {4});
  for (int64_t reduction : {0, 1, 2}) {
    auto r = env.Infer(
        "aten.nll_loss_forward.default",
        {ir::Ref(logits), ir::Ref(target), ir::NoneArg(), ir::Int(reduction), ir::Int(-100)});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->size(), 2u);
    EXPECT_EQ(Str((*r)[0].sizes), reduction == 0 ? "[4]" : "[]");
    EXPECT_EQ(Str((*r)[1].sizes), "[]");
  }
  auto bad = env.In(v1::INT64, {5});
  auto r = env.Infer("aten.nll_loss_forward.default",
                     {ir::Ref(logits), ir::Ref(bad), ir::NoneArg(), ir::Int(1), ir::Int(-100)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("argument 'target' has size[0] 5"));

  r = env.Infer("aten.native_dropout.default", {ir::Ref(logits), ir::Float(0.5), ir::Bool(true)});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].dtype, v1::FLOAT32);
  EXPECT_EQ((*r)[1].dtype, v1::BOOL);
  EXPECT_EQ(Str((*r)[1].sizes), "[4, 10]");
}

}  // namespace
}  // namespace kiln::ops::shape_rules_test
