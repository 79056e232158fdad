// Tests of the shape rules of elementwise ops (broadcasting, type
// promotion, dtypes, _to_copy's device and layout), of the creation ops and
// of the elementwise backward ops.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
// Broadcasting, through aten.add.Tensor.

struct BroadcastCase {
  SymSizes a, b;
  std::string want;  // sizes, or a substring of the error
  bool ok = true;
};

TEST(ShapeRules, Broadcasting) {
  const std::vector<BroadcastCase> cases = {
      {ToSymSizes({4, 8}), ToSymSizes({8}), "[4, 8]"},
      {ToSymSizes({4, 1}), ToSymSizes({1, 8}), "[4, 8]"},
      {ToSymSizes({}), ToSymSizes({3}), "[3]"},
      {ToSymSizes({2, 1, 5}), ToSymSizes({3, 1}), "[2, 3, 5]"},
      {ToSymSizes({0, 1}), ToSymSizes({1, 7}), "[0, 7]"},
      {{S("s0"), C(8)}, {C(1), C(8)}, "[s0, 8]"},
      {{C(1)}, {S("s0")}, "[s0]"},
      {{S("s0")}, {S("s1")}, "[s0]"},
      {{S("s0")}, {C(8)}, "[8]"},
      {{S("s0"), C(1)}, {S("s1")}, "[s0, s1]"},
      {ToSymSizes({4, 8}), ToSymSizes({3, 8}),
       "arguments 'self' and 'other': shapes [4, 8] and [3, 8] do not broadcast at dimension 0",
       false},
      {ToSymSizes({2, 4, 8}), ToSymSizes({3}), "do not broadcast at dimension 2", false},
  };
  for (const BroadcastCase& c : cases) {
    Env env;
    auto a = env.In(Meta(v1::FLOAT32, c.a));
    auto b = env.In(Meta(v1::FLOAT32, c.b));
    auto r = env.Infer("aten.add.Tensor", {ir::Ref(a), ir::Ref(b)});
    SCOPED_TRACE(Str(c.a) + " + " + Str(c.b));
    if (c.ok) {
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(Str((*r)[0].sizes), c.want);
      EXPECT_EQ((*r)[0].strides, ContiguousStrides((*r)[0].sizes));
    } else {
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.want));
    }
  }
}

TEST(ShapeRules, WhereBroadcastsThreeOperands) {
  Env env;
  auto cond = env.In(v1::BOOL, {4, 1});
  auto x = env.In(v1::FLOAT16, {4});
  auto y = env.In(v1::FLOAT32, {});
  TensorMeta m = env.One("aten.where.self", {ir::Ref(cond), ir::Ref(x), ir::Ref(y)});
  EXPECT_EQ(Str(m.sizes), "[4, 4]");
  EXPECT_EQ(m.dtype, v1::FLOAT16);  // a rank-0 operand does not widen

  auto z = env.In(v1::FLOAT32, {3});
  auto r = env.Infer("aten.where.self", {ir::Ref(cond), ir::Ref(x), ir::Ref(z)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("arguments 'condition', 'self' and 'other'"));
}

// ---------------------------------------------------------------------------
// Type promotion.

struct PromotionCase {
  std::string target;
  v1::DType a;
  std::vector<int64_t> a_sizes;
  // The second operand: a tensor (b != UNSPECIFIED) or a scalar argument.
  v1::DType b;
  std::vector<int64_t> b_sizes;
  Argument scalar;
  v1::DType want;
};

TEST(ShapeRules, TypePromotion) {
  const auto none = v1::DTYPE_UNSPECIFIED;
  const Argument no_scalar = ir::NoneArg();
  const std::vector<PromotionCase> cases = {
      {"aten.add.Tensor", v1::INT32, {3}, v1::FLOAT32, {3}, no_scalar, v1::FLOAT32},
      {"aten.add.Tensor", v1::FLOAT16, {3}, v1::FLOAT32, {3}, no_scalar, v1::FLOAT32},
      {"aten.add.Tensor", v1::FLOAT16, {3}, v1::FLOAT32, {}, no_scalar, v1::FLOAT16},
      {"aten.add.Tensor", v1::INT32, {3}, v1::FLOAT64, {}, no_scalar, v1::FLOAT64},
      {"aten.add.Tensor", v1::INT32, {3}, v1::INT64, {}, no_scalar, v1::INT32},
      {"aten.add.Tensor", v1::UINT8, {3}, v1::INT8, {3}, no_scalar, v1::INT16},
      {"aten.add.Tensor", v1::BFLOAT16, {3}, v1::FLOAT16, {3}, no_scalar, v1::FLOAT32},
      {"aten.add.Tensor", v1::COMPLEX64, {3}, v1::FLOAT64, {3}, no_scalar, v1::COMPLEX128},
      {"aten.mul.Tensor", v1::INT64, {3}, v1::BOOL, {3}, no_scalar, v1::INT64},
      // Wrapped numbers: only the category.
      {"aten.add.Scalar", v1::INT64, {3}, none, {}, ir::Float(2.5), v1::FLOAT32},
      {"aten.add.Scalar", v1::INT32, {3}, none, {}, ir::Int(2), v1::INT32},
      {"aten.mul.Scalar", v1::FLOAT16, {3}, none, {}, ir::Float(2.5), v1::FLOAT16},
      {"aten.add.Scalar", v1::BOOL, {3}, none, {}, ir::Int(1), v1::INT64},
      {"aten.mul.Scalar", v1::BOOL, {3}, none, {}, ir::Bool(true), v1::BOOL},
      {"aten.pow.Tensor_Scalar", v1::INT64, {3}, none, {}, ir::Int(2), v1::INT64},
      {"aten.pow.Tensor_Scalar", v1::INT64, {3}, none, {}, ir::Float(0.5), v1::FLOAT32},
      {"aten.rsub.Scalar", v1::INT8, {3}, none, {}, ir::Float(1.0), v1::FLOAT32},
      // True division goes to float; comparisons are bool.
      {"aten.div.Tensor", v1::INT64, {3}, v1::INT64, {3}, no_scalar, v1::FLOAT32},
      {"aten.div.Scalar", v1::INT32, {3}, none, {}, ir::Int(2), v1::FLOAT32},
      {"aten.div.Scalar", v1::FLOAT64, {3}, none, {}, ir::Int(2), v1::FLOAT64},
      {"aten.eq.Tensor", v1::FLOAT32, {3}, v1::INT64, {3}, no_scalar, v1::BOOL},
      {"aten.lt.Scalar", v1::FLOAT16, {3}, none, {}, ir::Float(0.5), v1::BOOL},
      {"aten.logical_and.default", v1::FLOAT32, {3}, v1::INT64, {3}, no_scalar, v1::BOOL},
      {"aten.maximum.default", v1::INT32, {3}, v1::FLOAT16, {3}, no_scalar, v1::FLOAT16},
  };
  for (const PromotionCase& c : cases) {
    Env env;
    auto a = env.In(c.a, c.a_sizes);
    std::vector<Argument> args = {ir::Ref(a)};
    args.push_back(c.b != none ? ir::Ref(env.In(c.b, c.b_sizes)) : c.scalar);
    SCOPED_TRACE(absl::StrCat(c.target, " ", v1::DType_Name(c.a), " with ",
                              c.b != none ? v1::DType_Name(c.b) : "a scalar"));
    TensorMeta m = env.One(c.target, args);
    EXPECT_EQ(v1::DType_Name(m.dtype), v1::DType_Name(c.want));
  }
}

TEST(ShapeRules, UnaryAndMiscDtypes) {
  Env env;
  auto i = env.In(v1::INT32, {3});
  auto h = env.In(v1::FLOAT16, {3});
  EXPECT_EQ(env.One("aten.exp.default", {ir::Ref(i)}).dtype, v1::FLOAT32);
  EXPECT_EQ(env.One("aten.sqrt.default", {ir::Ref(h)}).dtype, v1::FLOAT16);
  EXPECT_EQ(env.One("aten.abs.default", {ir::Ref(i)}).dtype, v1::INT32);
  EXPECT_EQ(env.One("aten.neg.default", {ir::Ref(h)}).dtype, v1::FLOAT16);
  EXPECT_EQ(env.One("aten.logical_not.default", {ir::Ref(h)}).dtype, v1::BOOL);
  EXPECT_EQ(env.One("aten.clamp.default", {ir::Ref(i), ir::Float(0.5)}).dtype, v1::FLOAT32);
  EXPECT_EQ(env.One("aten.clamp.default", {ir::Ref(i), ir::Int(0), ir::Int(4)}).dtype, v1::INT32);
  EXPECT_EQ(env.One("aten.div.Tensor_mode", {ir::Ref(i), ir::Ref(i)},
                    {ir::Kwarg("rounding_mode", StrArg("floor"))})
                .dtype,
            v1::INT32);
  EXPECT_EQ(env.One("aten.div.Tensor_mode", {ir::Ref(i), ir::Ref(i)},
                    {ir::Kwarg("rounding_mode", ir::NoneArg())})
                .dtype,
            v1::FLOAT32);
  EXPECT_EQ(env.One("aten._to_copy.default", {ir::Ref(h)}, {ir::Kwarg("dtype", Dtype(v1::FLOAT32))})
                .dtype,
            v1::FLOAT32);
  EXPECT_EQ(env.One("aten._to_copy.default", {ir::Ref(h)}).dtype, v1::FLOAT16);
  EXPECT_EQ(env.One("aten.fill.Scalar", {ir::Ref(i), ir::Float(1.5)}).dtype, v1::INT32);

  auto mask = env.In(v1::BOOL, {2, 3});
  TensorMeta filled = env.One("aten.masked_fill.Scalar", {ir::Ref(h), ir::Ref(mask), ir::Int(0)});
  EXPECT_EQ(Str(filled.sizes), "[2, 3]");
  EXPECT_EQ(filled.dtype, v1::FLOAT16);
}

TEST(ShapeRules, ToCopyDeviceAndLayout) {
  Env env;
  TensorMeta in = Meta(v1::FLOAT32, ToSymSizes({4, 8}), "cuda");
  in.device_index = 0;
  in.strides = ToSymSizes({1, 4});  // a transposed (dense) layout is preserved
  auto x = env.In(in);
  TensorMeta m = env.One("aten._to_copy.default", {ir::Ref(x)});
  EXPECT_EQ(m.device_type, "cuda");
  EXPECT_EQ(m.device_index, 0);
  EXPECT_EQ(Str(m.strides), "[1, 4]");
  TensorMeta cpu = env.One("aten._to_copy.default", {ir::Ref(x)},
                           {ir::Kwarg("device", Argument{"", ir::Device{"cpu", -1}})});
  EXPECT_EQ(cpu.device_type, "cpu");
  TensorMeta relu = env.One("aten.relu.default", {ir::Ref(x)});
  EXPECT_EQ(Str(relu.strides), "[1, 4]");
  EXPECT_FALSE(relu.requires_grad);
}

// ---------------------------------------------------------------------------
// Creation.

TEST(ShapeRules, Creation) {
  Env env;
  auto x = env.In(Meta(v1::FLOAT16, ToSymSizes({2, 3}), "cuda"));
  TensorMeta full = env.One("aten.full.default", {ir::Ints({2, 3}), ir::Int(7)});
  EXPECT_EQ(full.dtype, v1::INT64);
  EXPECT_EQ(full.device_type, "cpu");
  EXPECT_EQ(env.One("aten.full.default", {ir::Ints({2}), ir::Float(0.5)}).dtype, v1::FLOAT32);
  EXPECT_EQ(env.One("aten.full.default", {ir::Ints({2}), ir::Bool(true)}).dtype, v1::BOOL);
  TensorMeta zeros = env.One("aten.zeros.default", {Syms({S("s0"), C(4)})},
                             {ir::Kwarg("device", Argument{"", ir::Device{"cuda", 1}})});
  EXPECT_EQ(zeros.dtype, v1::FLOAT32);
  EXPECT_EQ(zeros.device_type, "cuda");
  EXPECT_EQ(zeros.device_index, 1);
  EXPECT_EQ(Str(zeros.strides), "[4, 1]");
  TensorMeta like = env.One("aten.zeros_like.default", {ir::Ref(x)});
  EXPECT_EQ(like.dtype, v1::FLOAT16);
  EXPECT_EQ(like.device_type, "cuda");
  EXPECT_EQ(
      env.One("aten.ones_like.default", {ir::Ref(x)}, {ir::Kwarg("dtype", Dtype(v1::BOOL))}).dtype,
      v1::BOOL);
  EXPECT_EQ(Str(env.One("aten.new_zeros.default", {ir::Ref(x), ir::Ints({5})}).sizes), "[5]");
  EXPECT_EQ(env.One("aten.scalar_tensor.default", {ir::Int(3)}).dtype, v1::FLOAT32);
  EXPECT_EQ(Str(env.One("aten.scalar_tensor.default", {ir::Int(3)}).sizes), "[]");

  TensorMeta ar = env.One("aten.arange.start_step", {ir::Int(0), ir::Int(10), ir::Int(3)});
  EXPECT_EQ(Str(ar.sizes), "[4]");
  EXPECT_EQ(ar.dtype, v1::INT64);
  TensorMeta arf = env.One("aten.arange.start_step", {ir::Float(0), ir::Float(1), ir::Float(0.25)});
  EXPECT_EQ(Str(arf.sizes), "[4]");
  EXPECT_EQ(arf.dtype, v1::FLOAT32);
  EXPECT_EQ(Str(env.One("aten.arange.default", {Argument{"", S("s0")}}).sizes), "[s0]");
  EXPECT_EQ(Str(env.One("aten.arange.default", {ir::Int(5)}).sizes), "[5]");
  TensorMeta es = env.One("aten.empty_strided.default", {ir::Ints({2, 3}), ir::Ints({1, 2})});
  EXPECT_EQ(Str(es.strides), "[1, 2]");
  auto r = env.Infer("aten.arange.start_step", {ir::Int(0), ir::Int(10), ir::Int(0)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("argument 'step' must be nonzero"));
}

TEST(ShapeRules, PointwiseBackwardOps) {
  Env env;
  auto g = env.In(v1::FLOAT32, {4, 8});
  auto y = env.In(v1::FLOAT32, {4, 8});
  EXPECT_EQ(
      Str(env.One("aten.threshold_backward.default", {ir::Ref(g), ir::Ref(y), ir::Int(0)}).sizes),
      "[4, 8]");
  EXPECT_EQ(Str(env.One("aten.tanh_backward.default", {ir::Ref(g), ir::Ref(y)}).sizes), "[4, 8]");
  auto h = env.In(v1::FLOAT16, {4, 8});
  EXPECT_EQ(env.One("aten._softmax_backward_data.default",
                    {ir::Ref(g), ir::Ref(y), ir::Int(-1), Dtype(v1::FLOAT16)})
                .dtype,
            v1::FLOAT16);
  auto mask = env.In(v1::BOOL, {4, 8});
  EXPECT_EQ(
      env.One("aten.native_dropout_backward.default", {ir::Ref(h), ir::Ref(mask), ir::Float(2.0)})
          .dtype,
      v1::FLOAT16);
}

}  // namespace
}  // namespace kiln::ops::shape_rules_test
