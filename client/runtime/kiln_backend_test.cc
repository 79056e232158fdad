// The `kiln` backend end to end: every lowered op family, compiled to C++
// with g++, run by the plan executor on fresh random inputs, and compared
// with the reference interpreter (ATen op by op) on the same inputs.
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "client/runtime/backend_test_util.h"
#include "client/runtime/cpu_features.h"
#include "client/runtime/interpreter.h"
#include "client/runtime/plan_executor.h"
#include "compiler/codegen/codegen.h"
#include "compiler/ir/builder.h"
#include "compiler/loop/lowering.h"
#include "compiler/ops/shape_util.h"

namespace kiln::runtime {
namespace {

using ir::Ref;

using backend_test::CheckOne;
using backend_test::Compile;
using backend_test::Compiled;
using backend_test::ExpectSame;
using backend_test::Meta;
using backend_test::Op;
using backend_test::Rand;
using backend_test::S;

TEST(KilnBackendTest, UnaryOps) {
  for (const char* op : {"neg",   "abs",        "exp",   "log",  "log1p", "expm1",   "sqrt",
                         "rsqrt", "reciprocal", "sin",   "cos",  "tanh",  "sigmoid", "relu",
                         "erf",   "sign",       "floor", "ceil", "silu",  "gelu"}) {
    const std::string target = std::string("aten.") + op + ".default";
    const bool positive = std::string(op) == "log" || std::string(op) == "sqrt" ||
                          std::string(op) == "rsqrt" || std::string(op) == "log1p";
    at::Tensor x = Rand({6, 33});
    if (positive) x = x.abs().add(0.1);
    CheckOne(
        target, {Meta(S({6, 33}))},
        [&](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
          b.AddOutput(Op(b, target, {Ref(in[0])}));
        },
        {x}, 1);
  }
  CheckOne(
      "gelu tanh", {Meta(S({4, 16}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        b.AddOutput(Op(b, "aten.gelu.default", {Ref(in[0])},
                       {ir::Kwarg("approximate", ir::Argument{"", std::string("tanh")})}));
      },
      {Rand({4, 16})}, 1);
}

// A float32 constant beyond float's range was written "inf.0f" (INTERNAL: g++
// refused it); a value name ending in a backslash, echoed in a // comment,
// commented out the next generated line.
TEST(KilnBackendTest, HugeConstantsAndNamesEndingInABackslash) {
  ir::GraphBuilder b("hostile");
  ir::ValueId x = b.AddInput(Meta(S({4, 8})), v1::Placeholder::USER_INPUT, "x\\");
  ir::ValueId y = Op(b, "aten.mul.Scalar", {Ref(x), ir::Float(1e308)});
  ir::ValueId z = Op(b, "aten.add.Scalar", {Ref(x), ir::Float(-1e300)});
  b.AddOutput(Op(b, "aten.where.self",
                 {Ref(Op(b, "aten.gt.Scalar", {Ref(x), ir::Float(0.0)})), Ref(y), Ref(z)}));
  ir::Graph g = std::move(b).Build();
  Compiled c = Compile(g);
  at::Tensor in = Rand({4, 8});
  ExpectSame(c, g, {in}, "huge constants");
}

TEST(KilnBackendTest, BinaryOpsBroadcastScalarsAndAlpha) {
  for (const char* op : {"add", "sub", "mul", "div", "maximum", "minimum"}) {
    const bool tensor = std::string(op) == "maximum" || std::string(op) == "minimum";
    const std::string target = std::string("aten.") + op + (tensor ? ".default" : ".Tensor");
    CheckOne(
        target + " broadcast", {Meta(S({5, 7})), Meta(S({7}))},
        [&](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
          b.AddOutput(Op(b, target, {Ref(in[0]), Ref(in[1])}));
        },
        {Rand({5, 7}), Rand({7})}, 1);
  }
  CheckOne(
      "add alpha", {Meta(S({3, 9})), Meta(S({3, 1}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        b.AddOutput(Op(b, "aten.add.Tensor", {Ref(in[0]), Ref(in[1])},
                       {ir::Kwarg("alpha", ir::Float(-2.5))}));
      },
      {Rand({3, 9}), Rand({3, 1})}, 1);
  CheckOne(
      "scalar ops and pow", {Meta(S({4, 10}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        ir::ValueId y = Op(b, "aten.mul.Scalar", {Ref(in[0]), ir::Float(3.0)});
        y = Op(b, "aten.rsub.Scalar", {Ref(y), ir::Float(1.0)});
        y = Op(b, "aten.pow.Tensor_Scalar", {Ref(y), ir::Float(3.0)});
        y = Op(b, "aten.div.Scalar", {Ref(y), ir::Float(7.0)});
        b.AddOutput(y);
      },
      {Rand({4, 10})}, 1);
}

TEST(KilnBackendTest, ComparisonsWhereClampAndDtypes) {
  CheckOne(
      "compare/where/masked_fill/clamp", {Meta(S({6, 8})), Meta(S({6, 8}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        ir::ValueId gt = Op(b, "aten.gt.Tensor", {Ref(in[0]), Ref(in[1])});
        b.AddOutput(gt);
        b.AddOutput(Op(b, "aten.where.self", {Ref(gt), Ref(in[0]), Ref(in[1])}));
        b.AddOutput(Op(b, "aten.masked_fill.Scalar", {Ref(in[0]), Ref(gt), ir::Float(-1.0)}));
        b.AddOutput(Op(b, "aten.clamp.default", {Ref(in[1]), ir::Float(-0.5), ir::Float(0.5)}));
        b.AddOutput(Op(b, "aten.le.Scalar", {Ref(in[1]), ir::Float(0.25)}));
      },
      {Rand({6, 8}), Rand({6, 8})}, 1);
  CheckOne(
      "float64", {Meta(S({3, 5}), v1::FLOAT64)},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        b.AddOutput(Op(b, "aten.exp.default",
                       {Ref(Op(b, "aten.mul.Scalar", {Ref(in[0]), ir::Float(0.5)}))}));
      },
      {Rand({3, 5}, at::kDouble)}, 1);
  CheckOne(
      "int64", {Meta(S({4, 6}), v1::INT64), Meta(S({4, 6}), v1::INT64)},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        b.AddOutput(Op(b, "aten.add.Tensor", {Ref(in[0]), Ref(in[1])}));
        b.AddOutput(Op(b, "aten.mul.Tensor", {Ref(in[0]), Ref(in[1])}));
      },
      {at::randint(-50, 50, {4, 6}), at::randint(-50, 50, {4, 6})}, 1);
  CheckOne(
      "bool logic", {Meta(S({5, 5}), v1::BOOL), Meta(S({5, 5}), v1::BOOL)},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        b.AddOutput(Op(b, "aten.logical_and.default", {Ref(in[0]), Ref(in[1])}));
        b.AddOutput(Op(b, "aten.logical_not.default", {Ref(in[0])}));
      },
      {at::rand({5, 5}).gt(0.5), at::rand({5, 5}).gt(0.5)}, 1);
  for (v1::DType half : {v1::FLOAT16, v1::BFLOAT16}) {
    const at::ScalarType t = half == v1::FLOAT16 ? at::kHalf : at::kBFloat16;
    CheckOne(
        std::string("half type ") + v1::DType_Name(half),
        {Meta(S({6, 40}), half), Meta(S({40}), half)},
        [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
          ir::ValueId y = Op(b, "aten.add.Tensor", {Ref(in[0]), Ref(in[1])});
          b.AddOutput(Op(b, "aten.mul.Tensor", {Ref(y), Ref(in[0])}));
          b.AddOutput(Op(b, "aten.sum.dim_IntList", {Ref(in[0]), ir::Ints({-1}), ir::Bool(false)}));
        },
        {Rand({6, 40}).to(t), Rand({40}).to(t)});
  }
  CheckOne(
      "to float64 and back", {Meta(S({4, 4}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        ir::ValueId d = Op(b, "aten._to_copy.default", {Ref(in[0])},
                           {ir::Kwarg("dtype", ir::Argument{"", v1::FLOAT64})});
        b.AddOutput(Op(b, "aten.mul.Tensor", {Ref(d), Ref(d)}));
      },
      {Rand({4, 4})}, 1);
  // An explicit conversion to a half type rounds, inside a kernel too:
  // x.to(half).to(float32) * 2 is off by up to 1e-2 without it.
  for (v1::DType half : {v1::FLOAT16, v1::BFLOAT16}) {
    CheckOne(
        std::string("float32 through ") + v1::DType_Name(half), {Meta(S({6, 40}))},
        [half](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
          ir::ValueId h = Op(b, "aten._to_copy.default", {Ref(in[0])},
                             {ir::Kwarg("dtype", ir::Argument{"", half})});
          ir::ValueId f = Op(b, "aten._to_copy.default", {Ref(h)},
                             {ir::Kwarg("dtype", ir::Argument{"", v1::FLOAT32})});
          b.AddOutput(Op(b, "aten.mul.Scalar", {Ref(f), ir::Float(2.0)}));
        },
        {Rand({6, 40})}, 1);
  }
}

TEST(KilnBackendTest, NonContiguousInputsAndViews) {
  // A transposed input (strides [1, 7]) and a permute inside the graph.
  at::Tensor base = Rand({7, 5});
  CheckOne(
      "transposed input", {Meta(S({5, 7}), v1::FLOAT32, S({1, 5}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        b.AddOutput(Op(b, "aten.tanh.default", {Ref(in[0])}));
      },
      {base.t()}, 1);
  CheckOne(
      "permute then add", {Meta(S({6, 4})), Meta(S({4, 6}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        ir::ValueId t = Op(b, "aten.permute.default", {Ref(in[0]), ir::Ints({1, 0})});
        b.AddOutput(Op(b, "aten.add.Tensor", {Ref(t), Ref(in[1])}));
      },
      {Rand({6, 4}), Rand({4, 6})}, 1);
  CheckOne(
      "view output", {Meta(S({4, 6}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        ir::ValueId y = Op(b, "aten.relu.default", {Ref(in[0])});
        b.AddOutput(Op(b, "aten.view.default", {Ref(y), ir::Ints({2, 12})}));
      },
      {Rand({4, 6})}, 1);
}

// A view that keeps the elements and their order (view, reshape, flatten,
// unsqueeze of a contiguous value) does not stop fusion: the kernel takes
// the view's shape. A view that reorders (permute) still does, and so does
// a load that cannot be re-indexed in the new shape.
TEST(KilnBackendTest, FusionThroughOrderPreservingViews) {
  // The bias gradient of a linear layer: a pointwise [2, 8, 16] value,
  // viewed as [16, 16] and summed over the rows; the value is an output too.
  CheckOne(
      "gelu, view, column sum", {Meta(S({2, 8, 16})), Meta(S({16}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        ir::ValueId g =
            Op(b, "aten.gelu.default", {Ref(Op(b, "aten.add.Tensor", {Ref(in[0]), Ref(in[1])}))});
        ir::ValueId v = Op(b, "aten.view.default", {Ref(g), ir::Ints({16, 16})});
        b.AddOutput(Op(b, "aten.sum.dim_IntList", {Ref(v), ir::Ints({0}), ir::Bool(false)}));
        b.AddOutput(g);
      },
      {Rand({2, 8, 16}), Rand({16})}, 1);
  CheckOne(
      "relu, view, mul, unsqueeze, add", {Meta(S({4, 6})), Meta(S({2, 12}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        ir::ValueId r = Op(b, "aten.relu.default", {Ref(in[0])});
        ir::ValueId v = Op(b, "aten.view.default", {Ref(r), ir::Ints({2, 12})});
        ir::ValueId m = Op(b, "aten.mul.Tensor", {Ref(v), Ref(in[1])});
        ir::ValueId u = Op(b, "aten.unsqueeze.default", {Ref(m), ir::Int(0)});
        b.AddOutput(Op(b, "aten.add.Scalar", {Ref(u), ir::Float(1.0)}));
      },
      {Rand({4, 6}), Rand({2, 12})}, 1);
  CheckOne(
      "relu, permute, exp", {Meta(S({4, 6}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        ir::ValueId r = Op(b, "aten.relu.default", {Ref(in[0])});
        ir::ValueId t = Op(b, "aten.permute.default", {Ref(r), ir::Ints({1, 0})});
        b.AddOutput(Op(b, "aten.exp.default", {Ref(t)}));
      },
      {Rand({4, 6})}, 2);
  // x + y with y [2, 1, 16] broadcast over dim 1: its load has strides
  // (16, 0, 1), which merge into no stride over the 16 rows of [16, 16].
  CheckOne(
      "broadcast load that cannot be re-indexed", {Meta(S({2, 8, 16})), Meta(S({2, 1, 16}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        ir::ValueId a = Op(b, "aten.add.Tensor", {Ref(in[0]), Ref(in[1])});
        ir::ValueId v = Op(b, "aten.view.default", {Ref(a), ir::Ints({16, 16})});
        b.AddOutput(Op(b, "aten.sum.dim_IntList", {Ref(v), ir::Ints({0}), ir::Bool(false)}));
      },
      {Rand({2, 8, 16}), Rand({2, 1, 16})}, 2);
}

TEST(KilnBackendTest, Reductions) {
  for (bool keep : {false, true}) {
    for (std::vector<int64_t> dims : {std::vector<int64_t>{-1}, {0}, {0, 2}, {1}}) {
      const std::string tag = std::string(keep ? "keepdim " : "") + "dims " +
                              std::to_string(dims[0]) +
                              (dims.size() > 1 ? "," + std::to_string(dims[1]) : "");
      for (const char* target :
           {"aten.sum.dim_IntList", "aten.mean.dim", "aten.amax.default", "aten.amin.default"}) {
        CheckOne(
            std::string(target) + " " + tag, {Meta(S({3, 5, 9}))},
            [&](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
              b.AddOutput(Op(b, target, {Ref(in[0]), ir::Ints(dims), ir::Bool(keep)}));
            },
            {Rand({3, 5, 9})}, 1);
      }
      CheckOne(
          "var " + tag, {Meta(S({3, 5, 9}))},
          [&](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
            b.AddOutput(
                Op(b, "aten.var.correction", {Ref(in[0]), ir::Ints(dims)},
                   {ir::Kwarg("correction", ir::Int(1)), ir::Kwarg("keepdim", ir::Bool(keep))}));
          },
          {Rand({3, 5, 9})}, 1);
    }
  }
  // A row holding an inf has an inf mean (sum / n, as ATen), not NaN; a
  // row holding a NaN has a NaN mean.
  at::Tensor special = Rand({3, 100}).contiguous();
  special.data_ptr<float>()[7] = std::numeric_limits<float>::infinity();
  special.data_ptr<float>()[150] = std::numeric_limits<float>::quiet_NaN();
  CheckOne(
      "mean of rows holding inf and NaN", {Meta(S({3, 100}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        b.AddOutput(Op(b, "aten.mean.dim", {Ref(in[0]), ir::Ints({-1}), ir::Bool(false)}));
      },
      {special}, 1);
  CheckOne(
      "sum all", {Meta(S({4, 11}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        b.AddOutput(Op(b, "aten.sum.default", {Ref(in[0])}));
      },
      {Rand({4, 11})}, 1);
}

TEST(KilnBackendTest, SoftmaxLayerNormAndRmsNormAreOneKernel) {
  CheckOne(
      "softmax", {Meta(S({6, 50}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        b.AddOutput(Op(b, "aten._softmax.default", {Ref(in[0]), ir::Int(-1), ir::Bool(false)}));
      },
      {Rand({6, 50}).mul(4)}, 1);
  // The first softmax is an output: its exponentials are kept in its
  // buffer, then overwritten by it; the second reads it from there.
  CheckOne(
      "softmax of a stored softmax", {Meta(S({3, 40}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        ir::ValueId s1 = Op(b, "aten._softmax.default", {Ref(in[0]), ir::Int(-1), ir::Bool(false)});
        b.AddOutput(s1);
        b.AddOutput(Op(b, "aten._log_softmax.default", {Ref(s1), ir::Int(-1), ir::Bool(false)}));
      },
      {Rand({3, 40}).mul(4)}, 1);
  CheckOne(
      "log_softmax dim 0", {Meta(S({7, 3}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        b.AddOutput(Op(b, "aten._log_softmax.default", {Ref(in[0]), ir::Int(0), ir::Bool(false)}));
      },
      {Rand({7, 3})}, 1);
  // The backwards: the gradient's sum over each row of the output, then
  // one pass over both.
  for (const char* target :
       {"aten._softmax_backward_data.default", "aten._log_softmax_backward_data.default"}) {
    for (int64_t dim : {-1, 0}) {
      CheckOne(
          absl::StrCat(target, " dim ", dim), {Meta(S({6, 50})), Meta(S({6, 50}))},
          [&](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
            b.AddOutput(Op(b, target,
                           {Ref(in[0]), Ref(in[1]), ir::Int(dim), ir::Argument{"", v1::FLOAT32}}));
          },
          {Rand({6, 50}), Rand({6, 50}).softmax(dim)}, 1);
    }
  }
  // Rows of 32 get their mean and variance in two sweeps; rows longer than
  // the lowering's two-pass limit keep one Welford sweep.
  for (const int64_t d : {32, 20000}) {
    const int64_t rows = d == 32 ? 5 : 3;
    CheckOne(
        "layer norm over rows of " + std::to_string(d),
        {Meta(S({rows, d})), Meta(S({d})), Meta(S({d}))},
        [d](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
          for (int k = 0; k < 3; ++k) {
            b.AddOutput(Op(b, "aten.native_layer_norm.default",
                           {Ref(in[0]), ir::Ints({d}), Ref(in[1]), Ref(in[2]), ir::Float(1e-5)}, {},
                           k));
          }
        },
        {Rand({rows, d}).mul(3).add(d == 32 ? 1 : 50), Rand({d}), Rand({d})}, 1);
  }
  CheckOne(
      "rmsnorm", {Meta(S({8, 64})), Meta(S({64}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        ir::ValueId sq = Op(b, "aten.pow.Tensor_Scalar", {Ref(in[0]), ir::Float(2.0)});
        ir::ValueId m = Op(b, "aten.mean.dim", {Ref(sq), ir::Ints({-1}), ir::Bool(true)});
        ir::ValueId r =
            Op(b, "aten.rsqrt.default", {Ref(Op(b, "aten.add.Scalar", {Ref(m), ir::Float(1e-6)}))});
        ir::ValueId y = Op(b, "aten.mul.Tensor", {Ref(in[0]), Ref(r)});
        b.AddOutput(Op(b, "aten.mul.Tensor", {Ref(y), Ref(in[1])}));
      },
      {Rand({8, 64}), Rand({64})}, 1);
}

// Reductions over dims of size 1, where a row's value has the shape of the
// whole space: a softmax over the kept dim of a mean or max reads the row
// value in a later pass, and layer norm's statistics are per-row values.
TEST(KilnBackendTest, ReductionsOverSizeOneDims) {
  for (const char* target : {"aten.mean.dim", "aten.amax.default"}) {
    CheckOne(
        std::string("softmax of a kept ") + target, {Meta(S({6, 1}))},
        [target](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
          ir::ValueId t = Op(b, "aten.tanh.default", {Ref(in[0])});
          ir::ValueId r = Op(b, target, {Ref(t), ir::Ints({-1}), ir::Bool(true)});
          b.AddOutput(Op(b, "aten._softmax.default", {Ref(r), ir::Int(-1), ir::Bool(false)}));
        },
        {Rand({6, 1})}, 1);
  }
  // Every output is x - mean = 0 times 1 / sqrt(eps); ATen's mean of one
  // element is off by an ulp, so a small eps would scale that up to 1e-5.
  CheckOne(
      "layer norm over a dim of size 1", {Meta(S({4, 3, 1}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        for (int k = 0; k < 3; ++k) {
          b.AddOutput(Op(b, "aten.native_layer_norm.default",
                         {Ref(in[0]), ir::Ints({1}), ir::NoneArg(), ir::NoneArg(), ir::Float(1.0)},
                         {}, k));
        }
      },
      {Rand({4, 3, 1})}, 1);
}

// f(x) == max over the row of f(x): the max is reduced in one loop and the
// comparison recomputes f(x) in another, where the element may fall in the
// vectorized part instead of the scalar tail (rows of 37 and 40 against 32
// lanes and 8-wide vectors). Every row must find its maximum, as eager's.
TEST(KilnBackendTest, TranscendentalsGiveTheSameBitsInEveryLoop) {
  // f(x) == max(f(x)) over a row reads f from two loops (the vectorized
  // body and the scalar tail of a row of 37): every row must find its own
  // maximum. (Compared with ATen's result, rows could differ where two
  // values of a row are within an ulp: ATen's libm is another.)
  for (const char* target :
       {"aten.tanh.default", "aten.erf.default", "aten.sin.default", "aten.cos.default",
        "aten.expm1.default", "aten.log1p.default", "aten.gelu.default"}) {
    for (const int64_t n : {37, 40}) {
      for (const v1::DType dtype : {v1::FLOAT32, v1::FLOAT64}) {
        const at::ScalarType t = dtype == v1::FLOAT32 ? at::kFloat : at::kDouble;
        const std::string what = absl::StrCat(target, " rows of ", n, " ", v1::DType_Name(dtype));
        ir::GraphBuilder b(what);
        ir::ValueId in = b.AddInput(Meta(S({64, n}), dtype), v1::Placeholder::USER_INPUT, "x");
        ir::ValueId x = Op(b, "aten.abs.default", {Ref(in)});  // log1p of |x|: defined
        ir::ValueId f = Op(b, target, {Ref(x)});
        ir::ValueId m = Op(b, "aten.amax.default", {Ref(f), ir::Ints({-1}), ir::Bool(true)});
        b.AddOutput(Op(b, "aten.eq.Tensor", {Ref(f), Ref(m)}));
        b.AddOutput(f);
        ir::Graph g = std::move(b).Build();
        Compiled c = Compile(g);
        ASSERT_NE(c.exec, nullptr) << what;
        const at::Tensor input = Rand({64, n}, t);
        auto got = c.exec->Run({input});
        ASSERT_TRUE(got.ok()) << what << ": " << got.status();
        EXPECT_TRUE((*got)[0].any(-1).all().item<bool>())
            << what << ": a row where no value equals the row's maximum";
        auto want = RunGraph(g, {input});
        ASSERT_TRUE(want.ok()) << what << ": " << want.status();
        EXPECT_TRUE(at::allclose((*got)[1], (*want)[1], 1e-5, 1e-6)) << what;
      }
    }
  }
}

TEST(KilnBackendTest, BackwardPointwiseOps) {
  CheckOne(
      "backward ops", {Meta(S({4, 12})), Meta(S({4, 12}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        b.AddOutput(
            Op(b, "aten.threshold_backward.default", {Ref(in[0]), Ref(in[1]), ir::Float(0.0)}));
        b.AddOutput(Op(b, "aten.gelu_backward.default", {Ref(in[0]), Ref(in[1])}));
        b.AddOutput(Op(b, "aten.tanh_backward.default", {Ref(in[0]), Ref(in[1])}));
        b.AddOutput(Op(b, "aten.sigmoid_backward.default", {Ref(in[0]), Ref(in[1])}));
      },
      {Rand({4, 12}), Rand({4, 12})}, 1);
}

TEST(KilnBackendTest, OneSymbolicCompileServesThreeSizes) {
  // Rows are the symbol s0: the kernel takes it as an argument.
  ir::GraphBuilder b("dynamic");
  ir::TensorMeta m =
      Meta({ir::SymInt{std::string("s0")}, ir::SymInt{int64_t{24}}}, v1::FLOAT32, S({24, 1}));
  ir::ValueId x = b.AddInput(m, v1::Placeholder::USER_INPUT, "x");
  ir::ValueId y = Op(b, "aten.gelu.default", {Ref(x)});
  b.AddOutput(Op(b, "aten._softmax.default", {Ref(y), ir::Int(-1), ir::Bool(false)}));
  b.AddOutput(Op(b, "aten.sum.dim_IntList", {Ref(y), ir::Ints({0}), ir::Bool(false)}));
  ir::Graph g = std::move(b).Build();
  Compiled c = Compile(g);
  for (int64_t rows : {1, 5, 37}) {
    ExpectSame(c, g, {Rand({rows, 24})}, "rows " + std::to_string(rows));
  }
}

// The bias gradient again, with the batch a symbol: [s0, 8, 16] viewed as
// [8*s0, 16] still re-indexes (the sizes match as polynomials), and the one
// compile runs at three batch sizes. (The reference is the same graph with
// the batch written out: the interpreter resolves no symbols.)
TEST(KilnBackendTest, FusionThroughAViewWithSymbolicSizes) {
  auto build = [](ir::SymInt batch, ir::SymInt rows) {
    ir::GraphBuilder b("dynamic_view");
    const ir::SymInt batch_stride{int64_t{128}};
    ir::ValueId x =
        b.AddInput(Meta({batch, ir::SymInt{int64_t{8}}, ir::SymInt{int64_t{16}}}, v1::FLOAT32,
                        {batch_stride, ir::SymInt{int64_t{16}}, ir::SymInt{int64_t{1}}}),
                   v1::Placeholder::USER_INPUT, "x");
    ir::ValueId bias = b.AddInput(Meta(S({16})), v1::Placeholder::PARAMETER, "bias");
    ir::ValueId g =
        Op(b, "aten.gelu.default", {Ref(Op(b, "aten.add.Tensor", {Ref(x), Ref(bias)}))});
    const std::vector<ir::SymInt> shape = {rows, ir::SymInt{int64_t{16}}};
    ir::ValueId v = Op(b, "aten.view.default", {Ref(g), ir::Argument{"", shape}});
    b.AddOutput(Op(b, "aten.sum.dim_IntList", {Ref(v), ir::Ints({0}), ir::Bool(false)}));
    b.AddOutput(v);
    return std::move(b).Build();
  };
  ir::Graph dynamic = build(ir::SymInt{std::string("s0")}, ir::SymInt{std::string("8*s0")});
  Compiled c = Compile(dynamic);
  EXPECT_EQ(c.lowered.kernels.size(), 1u);
  for (int64_t batch : {1, 3, 5}) {
    ExpectSame(c, build(ir::SymInt{batch}, ir::SymInt{8 * batch}),
               {Rand({batch, 8, 16}), Rand({16})}, "batch " + std::to_string(batch));
  }
}

// Random graphs over a batch of symbolic size s0: pointwise ops, binary
// ops with broadcasting partners, reductions over any dim (kept or not),
// and views (a transpose, the batch merged into the next dim, a strided
// slice, an unsqueeze). Each is compiled once and run at three batch sizes
// against the interpreter on the same graph built with the batch as a
// constant. Fixed seeds (a failure names one); fresh random inputs.
struct RandomStep {
  int kind;  // 0 unary, 1 binary, 2 reduction, 3 view
  int op;
  int a, b;  // operands: indices into the values so far
  int dim;
  bool keep;
};

// Emits `step` into `b` over `vals`; false when it does not apply.
bool EmitRandomStep(ir::GraphBuilder& b, std::vector<ir::ValueId>& vals, const RandomStep& step) {
  static const char* const kUnary[] = {
      "aten.tanh.default", "aten.sigmoid.default", "aten.relu.default", "aten.neg.default",
      "aten.sin.default",  "aten.gelu.default",    "aten.abs.default"};
  static const char* const kBinary[] = {"aten.add.Tensor", "aten.mul.Tensor", "aten.sub.Tensor",
                                        "aten.maximum.default"};
  static const char* const kReduce[] = {"aten.sum.dim_IntList",  "aten.mean.dim",
                                        "aten.amax.default",     "aten.var.correction",
                                        "aten._softmax.default", "aten._log_softmax.default"};
  const ir::ValueId a = vals[step.a];
  const std::vector<ir::SymInt> sizes = b.value(a).meta.sizes;
  const int rank = static_cast<int>(sizes.size());
  const ops::Registry& r = ops::DefaultRegistry();
  absl::StatusOr<std::vector<ir::ValueId>> out = absl::InvalidArgumentError("no step");
  switch (step.kind) {
    case 0:
      out = ops::Emit(b, r, kUnary[step.op % 7], {Ref(a)});
      break;
    case 1: {
      // Only partners whose dims equal a's or are 1: broadcasting s0
      // against 6 would assume s0 == 6, which the batch sizes break.
      const std::vector<ir::SymInt>& other = b.value(vals[step.b]).meta.sizes;
      if (other.size() > sizes.size()) return false;
      for (size_t k = 0; k < other.size(); ++k) {
        const ir::SymInt& d = other[other.size() - 1 - k];
        if (!(d == sizes[sizes.size() - 1 - k]) && !(d.is_constant() && d.constant() == 1))
          return false;
      }
      out = ops::Emit(b, r, kBinary[step.op % 4], {Ref(a), Ref(vals[step.b])});
      break;
    }
    case 2: {
      if (rank == 0) return false;
      const std::string target = kReduce[step.op % 6];
      const int64_t dim = step.dim % rank - rank;
      if (target == "aten._softmax.default" || target == "aten._log_softmax.default") {
        out = ops::Emit(b, r, target, {Ref(a), ir::Int(dim), ir::Bool(false)});
      } else if (target == "aten.var.correction") {
        out = ops::Emit(
            b, r, target, {Ref(a), ir::Ints({dim})},
            {ir::Kwarg("correction", ir::Int(0)), ir::Kwarg("keepdim", ir::Bool(step.keep))});
      } else {
        out = ops::Emit(b, r, target, {Ref(a), ir::Ints({dim}), ir::Bool(step.keep)});
      }
      break;
    }
    default:
      switch (step.op % 4) {
        case 0: {
          if (rank < 2) return false;
          std::vector<int64_t> perm(rank);
          for (int d = 0; d < rank; ++d) perm[d] = d;
          std::swap(perm[rank - 1], perm[rank - 2]);
          out = ops::Emit(b, r, "aten.permute.default", {Ref(a), ir::Ints(perm)});
          break;
        }
        case 1: {
          if (rank < 2) return false;
          std::vector<ir::SymInt> shape = {ops::SymMul(sizes[0], sizes[1])};
          shape.insert(shape.end(), sizes.begin() + 2, sizes.end());
          out = ops::Emit(b, r, "aten.reshape.default", {Ref(a), ir::Argument{"", shape}});
          break;
        }
        case 2:
          if (rank == 0) return false;
          out = ops::Emit(b, r, "aten.slice.Tensor",
                          {Ref(a), ir::Int(-1), ir::Int(0),
                           ir::Int(std::numeric_limits<int64_t>::max()), ir::Int(2)});
          break;
        default:
          out = ops::Emit(b, r, "aten.unsqueeze.default", {Ref(a), ir::Int(0)});
      }
  }
  if (!out.ok()) return false;
  vals.push_back((*out)[0]);
  return true;
}

// The inputs x [batch, 6, 8] and y (a [6, 1], [8] or [batch, 6, 1]
// partner, by `partner`).
std::vector<ir::ValueId> RandomInputs(ir::GraphBuilder& b, int partner, ir::SymInt batch) {
  const ir::SymInt six{int64_t{6}}, eight{int64_t{8}}, one{int64_t{1}};
  const std::vector<ir::TensorMeta> partners = {Meta(S({6, 1})), Meta(S({8})),
                                                Meta({batch, six, one}, v1::FLOAT32, S({6, 1, 1}))};
  return {b.AddInput(Meta({batch, six, eight}, v1::FLOAT32, S({48, 8, 1})),
                     v1::Placeholder::USER_INPUT, "x"),
          b.AddInput(partners[partner], v1::Placeholder::USER_INPUT, "y")};
}

// Draws up to 3-8 steps that apply one after another over the inputs.
std::vector<RandomStep> RandomSteps(std::mt19937& rng, int partner) {
  const ir::SymInt s0{std::string("s0")};
  std::vector<RandomStep> steps;
  const size_t want = 3 + rng() % 6;
  for (int attempt = 0; attempt < 40 && steps.size() < want; ++attempt) {
    const int n = 2 + static_cast<int>(steps.size());
    // op: 84 is a multiple of every table's size (7, 4, 6, 4).
    const RandomStep step{static_cast<int>(rng() % 4), static_cast<int>(rng() % 84),
                          static_cast<int>(rng() % n), static_cast<int>(rng() % n),
                          static_cast<int>(rng() % 4), rng() % 2 == 0};
    ir::GraphBuilder b("probe");
    std::vector<ir::ValueId> vals = RandomInputs(b, partner, s0);
    for (const RandomStep& s : steps) EmitRandomStep(b, vals, s);
    if (EmitRandomStep(b, vals, step)) steps.push_back(step);
  }
  return steps;
}

ir::Graph RandomGraph(const std::vector<RandomStep>& steps, int partner, ir::SymInt batch) {
  ir::GraphBuilder b("random");
  std::vector<ir::ValueId> vals = RandomInputs(b, partner, batch);
  for (const RandomStep& step : steps) EXPECT_TRUE(EmitRandomStep(b, vals, step));
  b.AddOutput(vals.back());
  return std::move(b).Build();
}

// The first seeds also under the fusion policies a target may set: no
// fusion at all, and kernels of at most two nodes with no recomputation
// and Welford for every row; the results are the same.
TEST(KilnBackendTest, RandomGraphsOverASymbolicBatch) {
  loop::FusionPolicy none, small;
  none.fuse = false;
  small.max_kernel_nodes = 2;
  small.max_recompute_nodes = 0;
  small.two_pass_max_row = 0;
  for (uint32_t run = 1; run <= 40; ++run) {
    const uint32_t seed = run <= 30 ? run : run - 30;
    const loop::FusionPolicy policy = run <= 30 ? loop::FusionPolicy() : run <= 35 ? none : small;
    std::mt19937 rng(seed);
    const int partner = static_cast<int>(rng() % 3);
    const std::vector<RandomStep> steps = RandomSteps(rng, partner);
    const std::string what = "seed " + std::to_string(seed) + " policy " + std::to_string(run);
    Compiled c = Compile(RandomGraph(steps, partner, ir::SymInt{std::string("s0")}), policy);
    for (const loop::Kernel& k : c.lowered.kernels) {
      EXPECT_LE(k.nodes.size(), !policy.fuse                  ? 1u
                                : policy.max_kernel_nodes > 0 ? 2u
                                                              : 1000u)
          << what;
    }
    for (int64_t batch : {1, 2, 5}) {
      const std::vector<std::vector<int64_t>> y_sizes = {{6, 1}, {8}, {batch, 6, 1}};
      ExpectSame(c, RandomGraph(steps, partner, ir::SymInt{batch}),
                 {Rand({batch, 6, 8}), Rand(y_sizes[partner])},
                 what + ", batch " + std::to_string(batch));
    }
  }
}

// [s0, 8] * [s0, 6, 8] broadcasts s0 against 6: the graph assumes s0 == 6
// (a tracer would have guarded it). No kernel indexes the [s0, 8] value as
// [6, 8]: the mul runs through ATen, right at s0 = 6 and a clear error at
// s0 = 2 (a kernel would have read past the value).
TEST(KilnBackendTest, AssumedBroadcastEqualitiesAreCheckedNotIndexedPast) {
  auto build = [](ir::SymInt batch) {
    ir::GraphBuilder b("assumed");
    const ir::SymInt six{int64_t{6}}, eight{int64_t{8}};
    ir::ValueId x = b.AddInput(Meta({batch, six, eight}, v1::FLOAT32, S({48, 8, 1})),
                               v1::Placeholder::USER_INPUT, "x");
    ir::ValueId r = Op(b, "aten.sum.dim_IntList", {Ref(x), ir::Ints({1}), ir::Bool(false)});
    b.AddOutput(Op(b, "aten.mul.Tensor", {Ref(Op(b, "aten.tanh.default", {Ref(x)})), Ref(r)}));
    return std::move(b).Build();
  };
  Compiled c = Compile(build(ir::SymInt{std::string("s0")}));
  ASSERT_NE(c.exec, nullptr);
  bool refused = false;
  for (const std::string& d : c.lowered.decisions)
    refused = refused || d.find("equal only by assumption") != std::string::npos;
  EXPECT_TRUE(refused) << loop::PrintLowered(c.lowered);
  ExpectSame(c, build(ir::SymInt{int64_t{6}}), {Rand({6, 6, 8})}, "s0 = 6");
  auto bad = c.exec->Run({Rand({2, 6, 8})});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("mul"), std::string::npos) << bad.status();
}

TEST(CpuFeaturesTest, RefusesCodeForAnIsaTheCpuLacks) {
  auto without_avx2 = [](const char* f) { return std::string(f) != "avx2"; };
  absl::Status s = CheckCpuSupports("x86-64-v3", without_avx2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("avx2"), std::string::npos) << s;
  EXPECT_TRUE(CheckCpuSupports("x86-64-v2", without_avx2).ok());
  EXPECT_TRUE(CheckCpuSupports("native", [](const char*) { return false; }).ok());
  // The default ISA runs on this machine (every test above ran its code).
  EXPECT_TRUE(CheckCpuSupports("x86-64-v3").ok());
}

}  // namespace
}  // namespace kiln::runtime
