#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/graph.h"
#include "compiler/ir/schema.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_util.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "kiln/v1/service.pb.h"

namespace kiln::ops {
namespace {

using ir::Argument;
using ir::SymInt;
using ir::TensorMeta;
using ::testing::HasSubstr;

SymInt C(int64_t v) { return SymInt{v}; }
SymInt S(const char* e) { return SymInt{std::string(e)}; }

// Sizes as text for readable table entries: "[4, s0, 8]".
std::string Str(const SymSizes& s) { return SizesToString(s); }

TensorMeta Meta(v1::DType dtype, SymSizes sizes, std::string device = "cpu") {
  TensorMeta m;
  m.dtype = dtype;
  m.strides = ContiguousStrides(sizes);
  m.sizes = std::move(sizes);
  m.device_type = std::move(device);
  return m;
}

TensorMeta F32(std::vector<int64_t> sizes) { return Meta(v1::FLOAT32, ToSymSizes(sizes)); }

Argument Dtype(v1::DType d) { return Argument{"", d}; }
Argument Syms(SymSizes s) { return Argument{"", std::move(s)}; }
Argument Tensors(std::vector<ir::ValueId> v) { return Argument{"", std::move(v)}; }
Argument Bools(std::vector<bool> v) { return Argument{"", std::move(v)}; }
Argument StrArg(std::string s) { return Argument{"", std::move(s)}; }

// Builds a graph of inputs and runs the registry's shape rules on them.
class Env {
 public:
  ir::ValueId In(TensorMeta meta) { return b_.AddInput(meta); }
  ir::ValueId In(v1::DType dtype, std::vector<int64_t> sizes) {
    return In(Meta(dtype, ToSymSizes(sizes)));
  }

  absl::StatusOr<std::vector<TensorMeta>> Infer(const std::string& target,
                                                std::vector<Argument> args,
                                                std::vector<Argument> kwargs = {}) {
    return InferMetas(DefaultRegistry(), target, args, kwargs,
                      [this](ir::ValueId v) -> const TensorMeta& { return b_.value(v).meta; });
  }

  // The single output's metadata; fails the test on an error.
  TensorMeta One(const std::string& target, std::vector<Argument> args,
                 std::vector<Argument> kwargs = {}) {
    auto r = Infer(target, std::move(args), std::move(kwargs));
    EXPECT_TRUE(r.ok()) << target << ": " << r.status();
    if (!r.ok() || r->empty()) return TensorMeta{};
    EXPECT_EQ(r->size(), 1u) << target;
    return (*r)[0];
  }

  // Emits a node (outputs get rule metadata) and returns its outputs.
  std::vector<ir::ValueId> Node(const std::string& target, std::vector<Argument> args,
                                std::vector<Argument> kwargs = {}) {
    auto r = Emit(b_, DefaultRegistry(), target, std::move(args), std::move(kwargs));
    EXPECT_TRUE(r.ok()) << target << ": " << r.status();
    return r.ok() ? *r : std::vector<ir::ValueId>{};
  }

  const TensorMeta& meta(ir::ValueId v) const { return b_.value(v).meta; }
  ir::GraphBuilder& builder() { return b_; }

 private:
  ir::GraphBuilder b_;
};

// ---------------------------------------------------------------------------
// shape_util: symbolic arithmetic.

TEST(SymArith, FoldsConstantsAndKeepsProductsCanonical) {
  EXPECT_EQ(SymMul(C(16), S("s0")), S("16*s0"));
  EXPECT_EQ(SymMul(C(2), S("16*s0")), S("32*s0"));
  EXPECT_EQ(SymMul(S("s1"), S("4*s0")), S("4*s0*s1"));
  EXPECT_EQ(SymMul(S("s0"), C(0)), C(0));
  EXPECT_EQ(SymMul(S("s0"), C(1)), S("s0"));
  EXPECT_EQ(SymAdd(S("s0"), C(4)), S("s0 + 4"));
  EXPECT_EQ(SymAdd(C(4), S("s0")), S("s0 + 4"));
  EXPECT_EQ(SymAdd(S("s0 + 2"), C(-3)), S("s0 - 1"));
  EXPECT_EQ(SymSub(SymAdd(S("s1"), C(2)), C(2)), S("s1"));
  EXPECT_EQ(SymAdd(S("s0"), S("s0")), S("2*s0"));
  EXPECT_EQ(SymSub(S("s0"), S("s1")), S("s0 - s1"));
  EXPECT_EQ(SymSub(S("s0"), S("s0")), C(0));
  EXPECT_EQ(SymMul(C(2), S("s0 + 1")), S("2*s0 + 2"));
  EXPECT_EQ(SymFloorDiv(S("32*s0"), C(16)), S("2*s0"));
  EXPECT_EQ(SymFloorDiv(S("4*s0*s1"), S("s1")), S("4*s0"));
  EXPECT_EQ(SymFloorDiv(S("s0 - 1"), C(2)), S("(s0 - 1)//2"));
  EXPECT_EQ(SymAdd(SymFloorDiv(S("s0 - 1"), C(2)), C(1)), S("(s0 - 1)//2 + 1"));
  EXPECT_EQ(SymFloorDiv(C(-7), C(2)), C(-4));
  EXPECT_EQ(Numel({C(4), S("s0"), C(2)}), S("8*s0"));
}

TEST(ContiguousStrides, ConstantAndSymbolic) {
  EXPECT_EQ(Str(ContiguousStrides(ToSymSizes({2, 3, 4}))), "[12, 4, 1]");
  EXPECT_EQ(Str(ContiguousStrides(ToSymSizes({2, 0, 3}))), "[3, 3, 1]");
  EXPECT_EQ(Str(ContiguousStrides({C(4), S("s0"), C(16)})), "[16*s0, 16, 1]");
  EXPECT_EQ(Str(ContiguousStrides({S("s0"), S("s1"), C(8)})), "[8*s1, 8, 1]");
  EXPECT_EQ(Str(ContiguousStrides({})), "[]");
}

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
// Views.

TEST(ShapeRules, ViewInfersMinusOne) {
  struct Case {
    SymSizes in;
    SymSizes size;
    std::string want_sizes, want_strides;
  };
  const std::vector<Case> cases = {
      {ToSymSizes({4, 6}), ToSymSizes({-1, 3}), "[8, 3]", "[3, 1]"},
      {ToSymSizes({4, 6}), ToSymSizes({24}), "[24]", "[1]"},
      {ToSymSizes({2, 3, 4}), ToSymSizes({6, -1}), "[6, 4]", "[4, 1]"},
      {{S("s0"), C(16)}, {C(-1), C(4)}, "[4*s0, 4]", "[4, 1]"},
      {{S("s0"), C(16)}, {S("s0"), C(4), C(4)}, "[s0, 4, 4]", "[16, 4, 1]"},
      {{C(4), S("s0"), C(16)}, {C(-1), C(16)}, "[4*s0, 16]", "[16, 1]"},
      {ToSymSizes({}), ToSymSizes({1, 1}), "[1, 1]", "[1, 1]"},
  };
  for (const Case& c : cases) {
    Env env;
    auto x = env.In(Meta(v1::FLOAT32, c.in));
    SCOPED_TRACE(Str(c.in) + " -> " + Str(c.size));
    TensorMeta m = env.One("aten.view.default", {ir::Ref(x), Syms(c.size)});
    EXPECT_EQ(Str(m.sizes), c.want_sizes);
    EXPECT_EQ(Str(m.strides), c.want_strides);
  }
}

TEST(ShapeRules, ViewErrors) {
  Env env;
  auto x = env.In(v1::FLOAT32, {4, 6});
  auto r = env.Infer("aten.view.default", {ir::Ref(x), ir::Ints({5, -1})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("argument 'size': shape [5, -1] is invalid for input of size 24"));
  r = env.Infer("aten.view.default", {ir::Ref(x), ir::Ints({-1, -1})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("more than one -1"));
  r = env.Infer("aten.view.default", {ir::Ref(x), ir::Ints({5, 5})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("invalid for input of size 24"));

  // Symbolic counts a single term apart differ for every s0.
  auto sym = env.In(Meta(v1::FLOAT32, {S("s0"), C(16)}));
  r = env.Infer("aten.view.default", {ir::Ref(sym), Syms({S("s0"), C(8)})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("shape [s0, 8] is invalid for input of size 16*s0"));

  // A transposed tensor cannot merge its dimensions without a copy.
  auto t = env.Node("aten.t.default", {ir::Ref(x)})[0];
  r = env.Infer("aten.view.default", {ir::Ref(t), ir::Ints({24})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("argument 'size' [24] is not a view of 'self'"));
  // _unsafe_view is a fresh tensor's reshape: contiguous.
  TensorMeta u = env.One("aten._unsafe_view.default", {ir::Ref(t), ir::Ints({24})});
  EXPECT_EQ(Str(u.strides), "[1]");
  // Splitting a transposed dimension is a view.
  TensorMeta split = env.One("aten.view.default", {ir::Ref(t), ir::Ints({2, 3, 4})});
  EXPECT_EQ(Str(split.strides), "[3, 1, 6]");
}

TEST(ShapeRules, ViewStridesOfLayoutOps) {
  Env env;
  auto x = env.In(v1::FLOAT32, {2, 3, 4});  // strides [12, 4, 1]
  struct Case {
    std::string target;
    std::vector<Argument> args;  // after self
    std::string sizes, strides;
    int64_t offset = 0;
  };
  const std::vector<Case> cases = {
      {"aten.permute.default", {ir::Ints({2, 0, 1})}, "[4, 2, 3]", "[1, 12, 4]"},
      {"aten.permute.default", {ir::Ints({-1, 1, 0})}, "[4, 3, 2]", "[1, 4, 12]"},
      {"aten.transpose.int", {ir::Int(0), ir::Int(2)}, "[4, 3, 2]", "[1, 4, 12]"},
      {"aten.expand.default", {ir::Ints({5, 2, 3, 4})}, "[5, 2, 3, 4]", "[0, 12, 4, 1]"},
      {"aten.expand.default", {ir::Ints({-1, 3, -1})}, "[2, 3, 4]", "[12, 4, 1]"},
      {"aten.unsqueeze.default", {ir::Int(1)}, "[2, 1, 3, 4]", "[12, 12, 4, 1]"},
      {"aten.unsqueeze.default", {ir::Int(-1)}, "[2, 3, 4, 1]", "[12, 4, 1, 1]"},
      {"aten.slice.Tensor",
       {ir::Int(2), ir::Int(1), ir::Int(4), ir::Int(2)},
       "[2, 3, 2]",
       "[12, 4, 2]",
       1},
      {"aten.slice.Tensor", {ir::Int(1), ir::Int(-2)}, "[2, 2, 4]", "[12, 4, 1]", 4},
      {"aten.slice.Tensor",
       {ir::Int(0), ir::Int(0), ir::Int(std::numeric_limits<int64_t>::max())},
       "[2, 3, 4]",
       "[12, 4, 1]"},
      {"aten.slice.Tensor", {ir::Int(1), ir::Int(5), ir::Int(9)}, "[2, 0, 4]", "[12, 4, 1]", 12},
      {"aten.select.int", {ir::Int(1), ir::Int(-1)}, "[2, 4]", "[12, 1]", 8},
      {"aten.select.int", {ir::Int(0), ir::Int(1)}, "[3, 4]", "[4, 1]", 12},
      {"aten.as_strided.default",
       {ir::Ints({2, 2}), ir::Ints({1, 2}), ir::Int(3)},
       "[2, 2]",
       "[1, 2]",
       3},
      {"aten.alias.default", {}, "[2, 3, 4]", "[12, 4, 1]"},
      {"aten.squeeze.dim", {ir::Int(0)}, "[2, 3, 4]", "[12, 4, 1]"},
  };
  for (const Case& c : cases) {
    std::vector<Argument> args = {ir::Ref(x)};
    args.insert(args.end(), c.args.begin(), c.args.end());
    SCOPED_TRACE(c.target + " -> " + c.sizes);
    TensorMeta m = env.One(c.target, args);
    EXPECT_EQ(Str(m.sizes), c.sizes);
    EXPECT_EQ(Str(m.strides), c.strides);
    EXPECT_EQ(m.storage_offset, C(c.offset));
    EXPECT_EQ(m.dtype, v1::FLOAT32);
    EXPECT_EQ(m.device_type, "cpu");
  }
}

TEST(ShapeRules, ExpandSqueezeOfSizeOneDims) {
  Env env;
  auto x = env.In(v1::FLOAT32, {3, 1});
  TensorMeta e = env.One("aten.expand.default", {ir::Ref(x), ir::Ints({2, 3, 5})});
  EXPECT_EQ(Str(e.sizes), "[2, 3, 5]");
  EXPECT_EQ(Str(e.strides), "[0, 1, 0]");
  auto r = env.Infer("aten.expand.default", {ir::Ref(x), ir::Ints({4, 5})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("argument 'size'"));

  auto y = env.In(v1::FLOAT32, {1, 4, 1});
  EXPECT_EQ(Str(env.One("aten.squeeze.dims", {ir::Ref(y), ir::Ints({0, -1})}).sizes), "[4]");
  EXPECT_EQ(Str(env.One("aten.squeeze.dim", {ir::Ref(y), ir::Int(1)}).sizes), "[1, 4, 1]");
  EXPECT_EQ(Str(env.One("aten.t.default", {ir::Ref(x)}).strides), "[1, 1]");
}

TEST(ShapeRules, SymbolicSliceAndSelect) {
  Env env;
  auto x = env.In(Meta(v1::FLOAT32, {S("s0"), C(8)}));
  TensorMeta s = env.One("aten.slice.Tensor", {ir::Ref(x), ir::Int(0), ir::Int(2),
                                               ir::Int(std::numeric_limits<int64_t>::max())});
  EXPECT_EQ(Str(s.sizes), "[s0 - 2, 8]");
  EXPECT_EQ(s.storage_offset, C(16));
  TensorMeta t = env.One("aten.slice.Tensor", {ir::Ref(x), ir::Int(0), ir::Int(0), ir::Int(-1)});
  EXPECT_EQ(Str(t.sizes), "[s0 - 1, 8]");
  TensorMeta sel = env.One("aten.select.int", {ir::Ref(x), ir::Int(0), ir::Int(-1)});
  EXPECT_EQ(Str(sel.sizes), "[8]");
  EXPECT_EQ(sel.storage_offset, S("8*s0 - 8"));
}

TEST(ShapeRules, SelectAndPermuteErrors) {
  Env env;
  auto x = env.In(v1::FLOAT32, {4, 8});
  auto r = env.Infer("aten.select.int", {ir::Ref(x), ir::Int(0), ir::Int(4)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("argument 'index' is 4, out of range for dimension 0 of size 4"));
  r = env.Infer("aten.permute.default", {ir::Ref(x), ir::Ints({0, 0})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("argument 'dims' [0, 0] is not a permutation"));
}

TEST(ShapeRules, SplitWithSizes) {
  Env env;
  auto x = env.In(v1::FLOAT32, {4, 10});
  auto r =
      env.Infer("aten.split_with_sizes.default", {ir::Ref(x), ir::Ints({2, 3, 5}), ir::Int(1)});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  const char* want[] = {"[4, 2]", "[4, 3]", "[4, 5]"};
  const int64_t offsets[] = {0, 2, 5};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Str((*r)[i].sizes), want[i]);
    EXPECT_EQ(Str((*r)[i].strides), "[10, 1]");
    EXPECT_EQ((*r)[i].storage_offset, C(offsets[i]));
  }
  r = env.Infer("aten.split_with_sizes.default", {ir::Ref(x), ir::Ints({2, 3}), ir::Int(1)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("argument 'split_sizes' [2, 3] sums to 5, but dimension 1 of 'self' has "
                        "size 10"));

  r = env.Infer("aten.split.Tensor", {ir::Ref(x), ir::Int(4), ir::Int(-1)});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ(Str((*r)[2].sizes), "[4, 2]");
  EXPECT_EQ((*r)[2].storage_offset, C(8));

  r = env.Infer("aten.unbind.int", {ir::Ref(x)});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 4u);
  EXPECT_EQ(Str((*r)[3].sizes), "[10]");
  EXPECT_EQ((*r)[3].storage_offset, C(30));
}

TEST(ShapeRules, CatAndStack) {
  Env env;
  auto a = env.In(v1::FLOAT32, {2, 3});
  auto b = env.In(v1::FLOAT16, {4, 3});
  auto empty = env.In(v1::FLOAT32, {0});
  auto s = env.In(Meta(v1::FLOAT32, {S("s0"), C(3)}));
  TensorMeta cat = env.One("aten.cat.default", {Tensors({a, b, empty})});
  EXPECT_EQ(Str(cat.sizes), "[6, 3]");
  EXPECT_EQ(cat.dtype, v1::FLOAT32);
  EXPECT_EQ(Str(env.One("aten.cat.default", {Tensors({a, s})}).sizes), "[s0 + 2, 3]");
  auto r = env.Infer("aten.cat.default", {Tensors({a, b}), ir::Int(1)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("argument 'tensors' element 1 has size[0] 4, but element 0 has size[0] 2"));
  TensorMeta st = env.One("aten.stack.default", {Tensors({a, a}), ir::Int(-1)});
  EXPECT_EQ(Str(st.sizes), "[2, 3, 2]");
}

// The attention graph's permute/expand/view chain, with PyTorch's strides.
TEST(ShapeRules, ViewOfPermutedExpand) {
  Env env;
  auto k = env.In(v1::FLOAT32, {2, 16, 32});
  auto p = env.Node("aten.permute.default", {ir::Ref(k), ir::Ints({0, 2, 1})})[0];
  auto e = env.Node("aten.expand.default", {ir::Ref(p), ir::Ints({2, 32, 16})})[0];
  auto v = env.Node("aten.view.default", {ir::Ref(e), ir::Ints({2, 32, 16})})[0];
  EXPECT_EQ(Str(env.meta(v).strides), "[512, 1, 32]");
}

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

// ---------------------------------------------------------------------------
// The registry as a whole.

TEST(Registry, TraitsOfRepresentativeOps) {
  const Registry& r = DefaultRegistry();
  auto traits = [&](const std::string& t) {
    const OpDef* d = r.Find(t);
    EXPECT_NE(d, nullptr) << t;
    return d == nullptr ? OpTraits{} : d->traits;
  };
  EXPECT_TRUE(traits("aten.add.Tensor").pointwise);
  EXPECT_TRUE(traits("aten._to_copy.default").pointwise);
  EXPECT_TRUE(traits("aten.threshold_backward.default").pointwise);
  EXPECT_TRUE(traits("aten.view.default").view);
  EXPECT_TRUE(traits("aten.split_with_sizes.default").view);
  EXPECT_TRUE(traits("aten.sum.dim_IntList").reduction);
  EXPECT_TRUE(traits("aten._softmax.default").reduction);
  EXPECT_TRUE(traits("aten.native_layer_norm.default").reduction);
  EXPECT_TRUE(traits("aten.native_dropout.default").random);
  EXPECT_TRUE(traits("aten.mm.default").expensive);
  EXPECT_TRUE(traits("aten.convolution_backward.default").expensive);
  EXPECT_TRUE(traits("aten.full.default").creation);
  EXPECT_FALSE(traits("aten.mm.default").pointwise);
}

TEST(Registry, CoversTheRequiredOps) {
  const char* required[] = {
      "aten.abs.default",
      "aten.neg.default",
      "aten.exp.default",
      "aten.log.default",
      "aten.log1p.default",
      "aten.expm1.default",
      "aten.sqrt.default",
      "aten.rsqrt.default",
      "aten.reciprocal.default",
      "aten.sin.default",
      "aten.cos.default",
      "aten.tanh.default",
      "aten.sigmoid.default",
      "aten.relu.default",
      "aten.gelu.default",
      "aten.silu.default",
      "aten.erf.default",
      "aten.sign.default",
      "aten.logical_not.default",
      "aten.bitwise_not.default",
      "aten.pow.Tensor_Scalar",
      "aten.pow.Tensor_Tensor",
      "aten.clamp.default",
      "aten.add.Tensor",
      "aten.add.Scalar",
      "aten.sub.Tensor",
      "aten.sub.Scalar",
      "aten.rsub.Scalar",
      "aten.rsub.Tensor",
      "aten.mul.Tensor",
      "aten.mul.Scalar",
      "aten.div.Tensor",
      "aten.div.Tensor_mode",
      "aten.div.Scalar",
      "aten.maximum.default",
      "aten.minimum.default",
      "aten.eq.Tensor",
      "aten.eq.Scalar",
      "aten.ne.Tensor",
      "aten.ne.Scalar",
      "aten.lt.Tensor",
      "aten.lt.Scalar",
      "aten.le.Tensor",
      "aten.le.Scalar",
      "aten.gt.Tensor",
      "aten.gt.Scalar",
      "aten.ge.Tensor",
      "aten.ge.Scalar",
      "aten.where.self",
      "aten.logical_and.default",
      "aten.logical_or.default",
      "aten.masked_fill.Scalar",
      "aten.fill.Scalar",
      "aten._to_copy.default",
      "aten.clone.default",
      "aten.detach.default",
      "aten.lift_fresh_copy.default",
      "aten.alias.default",
      "aten.sum.dim_IntList",
      "aten.sum.default",
      "aten.mean.dim",
      "aten.mean.default",
      "aten.amax.default",
      "aten.amin.default",
      "aten.var.correction",
      "aten.var_mean.correction",
      "aten.argmax.default",
      "aten.prod.dim_int",
      "aten.max.dim",
      "aten._softmax.default",
      "aten._log_softmax.default",
      "aten.native_layer_norm.default",
      "aten.native_batch_norm.default",
      "aten._native_batch_norm_legit_functional.default",
      "aten._native_batch_norm_legit_no_training.default",
      "aten.nll_loss_forward.default",
      "aten.native_dropout.default",
      "aten.bernoulli.p",
      "aten.view.default",
      "aten._unsafe_view.default",
      "aten.permute.default",
      "aten.expand.default",
      "aten.squeeze.dim",
      "aten.squeeze.dims",
      "aten.unsqueeze.default",
      "aten.slice.Tensor",
      "aten.select.int",
      "aten.split_with_sizes.default",
      "aten.split.Tensor",
      "aten.cat.default",
      "aten.stack.default",
      "aten.as_strided.default",
      "aten.t.default",
      "aten.transpose.int",
      "aten.full.default",
      "aten.full_like.default",
      "aten.zeros_like.default",
      "aten.ones_like.default",
      "aten.empty_like.default",
      "aten.arange.start_step",
      "aten.arange.default",
      "aten.scalar_tensor.default",
      "aten.empty_strided.default",
      "aten.zeros.default",
      "aten.ones.default",
      "aten.new_zeros.default",
      "aten.mm.default",
      "aten.bmm.default",
      "aten.addmm.default",
      "aten.convolution.default",
      "aten.max_pool2d_with_indices.default",
      "aten.avg_pool2d.default",
      "aten.embedding.default",
      "aten.index.Tensor",
      "aten.gather.default",
      "aten.threshold_backward.default",
      "aten.gelu_backward.default",
      "aten.tanh_backward.default",
      "aten.sigmoid_backward.default",
      "aten._softmax_backward_data.default",
      "aten._log_softmax_backward_data.default",
      "aten.native_layer_norm_backward.default",
      "aten.native_batch_norm_backward.default",
      "aten.convolution_backward.default",
      "aten.max_pool2d_with_indices_backward.default",
      "aten.avg_pool2d_backward.default",
      "aten.embedding_dense_backward.default",
      "aten.native_dropout_backward.default",
      "aten.nll_loss_backward.default",
  };
  for (const char* t : required) {
    const OpDef* d = DefaultRegistry().Find(t);
    ASSERT_NE(d, nullptr) << t;
    EXPECT_TRUE(d->shape) << t;
  }
}

TEST(Registry, EveryOpHasASchema) {
  for (const OpDef* d : DefaultRegistry().All()) {
    EXPECT_NE(ir::FindSchema(d->target), nullptr) << d->target;
    EXPECT_TRUE(d->shape) << d->target;
  }
}

// A plausible argument for each schema parameter; tensors are float32
// [2, 3, 4, 5] unless the parameter's name suggests an index.
Argument SampleArgument(Env& env, const ir::SchemaParam& p) {
  using B = ir::SchemaType::Base;
  const bool index_like = absl::StrContains(p.name, "ind") || p.name == "target" ||
                          p.name == "mask" || p.name == "condition";
  auto tensor = [&] {
    if (p.name == "mask" || p.name == "condition") return env.In(v1::BOOL, {2, 3, 4, 5});
    if (index_like) return env.In(v1::INT64, {2, 3, 4, 5});
    return env.In(v1::FLOAT32, {2, 3, 4, 5});
  };
  switch (p.type.base) {
    case B::kTensor:
      if (p.type.is_list) return Tensors({tensor(), tensor()});
      return ir::Ref(tensor());
    case B::kInt:
    case B::kSymInt:
      if (p.type.is_list) return ir::Ints(std::vector<int64_t>(std::max(1, p.type.list_size), 1));
      return ir::Int(1);
    case B::kFloat:
      return p.type.is_list ? Argument{"", std::vector<double>{0.5}} : ir::Float(0.5);
    case B::kBool:
      return p.type.is_list ? Bools(std::vector<bool>(std::max(1, p.type.list_size), true))
                            : ir::Bool(false);
    case B::kScalar:
      return ir::Int(1);
    case B::kScalarType:
      return Dtype(v1::FLOAT32);
    case B::kStr:
      return StrArg("none");
    default:
      return ir::NoneArg();
  }
}

TEST(Registry, EveryShapeRuleRunsOnASampleCall) {
  int ok = 0;
  for (const OpDef* d : DefaultRegistry().All()) {
    const ir::OpSchema* schema = ir::FindSchema(d->target);
    ASSERT_NE(schema, nullptr) << d->target;
    Env env;
    // By name, so that parameters left to their defaults shift nothing.
    std::vector<Argument> kwargs;
    for (const ir::SchemaParam& p : schema->params) {
      if (p.required()) kwargs.push_back(ir::Kwarg(p.name, SampleArgument(env, p)));
    }
    auto r = env.Infer(d->target, {}, kwargs);
    if (!r.ok()) {
      // Sample arguments need not fit every op; a rule may refuse them, but
      // only as a request error.
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
          << d->target << ": " << r.status();
      continue;
    }
    ++ok;
    if (schema->num_returns != ir::OpSchema::kListReturn) {
      EXPECT_EQ(static_cast<int>(r->size()), schema->num_returns) << d->target;
    }
    for (const TensorMeta& m : *r) {
      EXPECT_NE(m.dtype, v1::DTYPE_UNSPECIFIED) << d->target;
      EXPECT_EQ(m.strides.size(), m.sizes.size()) << d->target;
      EXPECT_FALSE(m.requires_grad) << d->target;
    }
  }
  // Most rules accept the generic sample.
  EXPECT_GT(ok, static_cast<int>(DefaultRegistry().All().size()) / 2);
}

// ---------------------------------------------------------------------------
// CheckMetadata against the captured test graphs.

absl::StatusOr<ir::Graph> LoadGraph(const std::string& name) {
  const std::string path = absl::StrCat(KILN_SOURCE_DIR, "/tests/data/graphs/", name);
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  v1::GraphFile file;
  auto status = google::protobuf::util::JsonStringToMessage(text.str(), &file);
  if (!status.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", status.ToString()));
  return ir::Graph::FromProto(file.graph());
}

const char* kGraphs[] = {"attention.json", "conv_block.json", "mlp.json", "rmsnorm.json"};

TEST(CheckMetadata, CapturedGraphsPass) {
  for (const char* name : kGraphs) {
    auto g = LoadGraph(name);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(CheckMetadata(DefaultRegistry(), *g).ok())
        << name << ": " << CheckMetadata(DefaultRegistry(), *g);
  }
}

// Beyond what CheckMetadata compares: the rules reproduce the captured
// strides and storage offsets too.
TEST(CheckMetadata, RulesReproduceCapturedStrides) {
  for (const char* name : kGraphs) {
    auto g = LoadGraph(name);
    ASSERT_TRUE(g.ok()) << g.status();
    auto meta_of = [&](ir::ValueId v) -> const TensorMeta& { return g->value(v).meta; };
    for (const ir::Node& node : g->nodes()) {
      auto r = InferMetas(DefaultRegistry(), node.target, node.args, node.kwargs, meta_of);
      ASSERT_TRUE(r.ok()) << name << " " << node.name << ": " << r.status();
      ASSERT_EQ(r->size(), node.outputs.size());
      for (size_t j = 0; j < r->size(); ++j) {
        const TensorMeta& have = g->value(node.outputs[j]).meta;
        EXPECT_EQ(Str((*r)[j].strides), Str(have.strides)) << name << " " << node.name << " " << j;
        EXPECT_EQ((*r)[j].storage_offset, have.storage_offset) << name << " " << node.name;
      }
    }
  }
}

// Alters one output of one node in the wire form and expects the named
// error.
void ExpectAlteredGraphFails(const std::string& graph, const std::string& node_name,
                             const std::function<void(v1::Value*)>& alter,
                             const std::string& want) {
  const std::string path = absl::StrCat(KILN_SOURCE_DIR, "/tests/data/graphs/", graph);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  v1::GraphFile file;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &file).ok());
  bool found = false;
  for (v1::Node& n : *file.mutable_graph()->mutable_nodes()) {
    if (n.name() != node_name) continue;
    alter(n.mutable_outputs(n.outputs_size() > 1 ? 1 : 0));
    found = true;
  }
  ASSERT_TRUE(found) << node_name;
  auto g = ir::Graph::FromProto(file.graph());
  ASSERT_TRUE(g.ok()) << g.status();
  absl::Status s = CheckMetadata(DefaultRegistry(), *g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(want));
}

TEST(CheckMetadata, AlteredDtypeOrSizeIsNamed) {
  ExpectAlteredGraphFails(
      "rmsnorm.json", "mean", [](v1::Value* v) { v->mutable_meta()->set_dtype(v1::FLOAT16); },
      "node 'mean' (aten.mean.dim) output 0 'mean': dtype is FLOAT16 in the graph, but the op "
      "gives FLOAT32");
  ExpectAlteredGraphFails(
      "mlp.json", "native_layer_norm",
      [](v1::Value* v) { v->mutable_meta()->mutable_sizes(0)->set_int_value(9); },
      "node 'native_layer_norm' (aten.native_layer_norm.default) output 1 "
      "'native_layer_norm_out1': size[0] is 9 in the graph, but the op gives 8");
  ExpectAlteredGraphFails(
      "attention.json", "bmm",
      [](v1::Value* v) { v->mutable_meta()->mutable_sizes(2)->set_int_value(32); },
      "node 'bmm' (aten.bmm.default) output 0 'bmm': size[2] is 32 in the graph, but the op "
      "gives 16");
  ExpectAlteredGraphFails(
      "conv_block.json", "convolution", [](v1::Value* v) { v->mutable_meta()->add_sizes(); },
      "node 'convolution' (aten.convolution.default) output 0 'convolution': rank is 5");
}

// ---------------------------------------------------------------------------
// kiln_ops_doc lists every registry op (registered as its own ctest).

TEST(OpsDocTool, ListsEveryRegistryOp) {
  const std::string command =
      absl::StrCat(KILN_OPS_DOC_PATH, " ", KILN_SOURCE_DIR, "/compiler/ops/core_aten_ops.txt");
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe.get())) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(pipe.release()), 0);
  EXPECT_THAT(out,
              HasSubstr("build/bin/kiln_ops_doc compiler/ops/core_aten_ops.txt > docs/ops.md"));
  for (const OpDef* d : DefaultRegistry().All()) {
    EXPECT_THAT(out, HasSubstr(absl::StrCat("| `", d->target, "` |"))) << d->target;
  }
  EXPECT_THAT(out,
              HasSubstr("`add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor`"));
  // Every op of torch's core opset has a row saying how kiln serves it.
  std::ifstream core(absl::StrCat(KILN_SOURCE_DIR, "/compiler/ops/core_aten_ops.txt"));
  std::string line;
  int core_ops = 0;
  while (std::getline(core, line)) {
    if (line.empty() || line[0] == '#') continue;
    ++core_ops;
    EXPECT_THAT(out, HasSubstr(absl::StrCat("| `", line, "` | "))) << line;
  }
  EXPECT_GT(core_ops, 150);
  // docs/ops.md is this output: regenerated whenever the registry changes.
  std::ifstream doc(absl::StrCat(KILN_SOURCE_DIR, "/docs/ops.md"));
  const std::string committed((std::istreambuf_iterator<char>(doc)),
                              std::istreambuf_iterator<char>());
  EXPECT_EQ(committed, out) << "docs/ops.md is stale: build/bin/kiln_ops_doc "
                               "compiler/ops/core_aten_ops.txt > docs/ops.md";
}

}  // namespace
}  // namespace kiln::ops
