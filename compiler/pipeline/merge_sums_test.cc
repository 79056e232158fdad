#include "compiler/pipeline/merge_sums.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "compiler/ir/builder.h"
#include "compiler/ir/verify.h"
#include "compiler/ops/registry.h"
#include "compiler/pipeline/rewrite_test_util.h"

namespace kiln::pipeline {
namespace {

using ir::Ref;

ir::ValueId Input(ir::GraphBuilder& b, std::vector<int64_t> sizes, const std::string& name,
                  v1::DType dtype = v1::FLOAT32) {
  return b.AddInput(ir::ContiguousMeta(std::move(sizes), dtype), v1::Placeholder::USER_INPUT, name);
}

ir::ValueId Sum(ir::GraphBuilder& b, ir::ValueId x, std::vector<int64_t> dims, bool keepdim) {
  return Op(b, "aten.sum.dim_IntList", {Ref(x), ir::Ints(dims), ir::Bool(keepdim)});
}

ir::ValueId Mul(ir::GraphBuilder& b, ir::ValueId x, ir::ValueId y) {
  return Op(b, "aten.mul.Tensor", {Ref(x), Ref(y)});
}

// A decomposed batch norm's backward, as kilnd's derivatives of mean, var,
// sub and mul give it: g the output gradient, x - mean the centered input,
// w the weight ([C, 1, 1], bfloat16 beside float32 statistics, as a
// bfloat16 model's) and r the inverse deviation ([1, C, 1, 1]).
TEST(MergeSumsTest, ABatchNormsBackwardSumsEachProductOnce) {
  ir::GraphBuilder b("batch_norm_backward");
  const ir::ValueId g = Input(b, {4, 3, 5, 5}, "g");
  const ir::ValueId centered = Input(b, {4, 3, 5, 5}, "centered");
  const ir::ValueId w = Input(b, {3, 1, 1}, "w", v1::BFLOAT16);  // float32 stats
  const ir::ValueId r = Input(b, {1, 3, 1, 1}, "r");
  // The bias's and the weight's gradients: over (H, W), then N.
  const ir::ValueId bias = Sum(b, Sum(b, g, {2, 3}, true), {0}, false);
  const ir::ValueId normalized = Mul(b, centered, r);
  const ir::ValueId weight = Sum(b, Sum(b, Mul(b, g, normalized), {2, 3}, true), {0}, false);
  // The normalization's derivative: over (N, H, W) at once.
  const ir::ValueId gw = Mul(b, g, w);
  const ir::ValueId mean_part =
      Sum(b, Op(b, "aten.neg.default", {Ref(Mul(b, gw, r))}), {0, 2, 3}, true);
  const ir::ValueId var_part = Sum(b, Mul(b, gw, centered), {0, 2, 3}, true);
  const ir::ValueId scaled =
      Sum(b, Op(b, "aten.mul.Scalar", {Ref(g), ir::Argument{"", 0.5}}), {-1, -2, 0}, true);
  for (ir::ValueId v : {bias, weight, mean_part, var_part, scaled}) b.AddOutput(v);
  const ir::Graph before = std::move(b).Build();
  EXPECT_EQ(Count(before, "aten.sum.dim_IntList"), 7);

  ir::Graph out;
  absl::StatusOr<int> n = MergeEquivalentSums(before, &out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 5);
  ASSERT_TRUE(ir::Verify(out).ok()) << ir::Verify(out);
  // sum(g) for the bias, the mean part and the scaled one; sum(g *
  // centered) for the weight and the variance part. The two-step sums'
  // first steps are gone.
  EXPECT_EQ(Count(out, "aten.sum.dim_IntList"), 2);
  for (const ir::Node& node : out.nodes()) {
    if (node.target == "aten.sum.dim_IntList") {
      EXPECT_EQ(out.value(node.outputs[0]).meta.sizes,
                (std::vector<ir::SymInt>{ir::SymInt{int64_t{1}}, ir::SymInt{int64_t{3}},
                                         ir::SymInt{int64_t{1}}, ir::SymInt{int64_t{1}}}));
    }
  }
  // The outputs keep their sizes and dtypes.
  ASSERT_EQ(out.outputs().size(), before.outputs().size());
  for (size_t k = 0; k < out.outputs().size(); ++k) {
    EXPECT_EQ(out.value(out.outputs()[k]).meta.sizes, before.value(before.outputs()[k]).meta.sizes)
        << k;
    EXPECT_EQ(out.value(out.outputs()[k]).meta.dtype, v1::FLOAT32) << k;
  }
}

TEST(MergeSumsTest, SumsThatDifferStayApart) {
  ir::GraphBuilder b("different");
  const ir::ValueId g = Input(b, {4, 3, 5, 5}, "g");
  const ir::ValueId x = Input(b, {4, 3, 5, 5}, "x");
  const ir::ValueId c = Input(b, {4, 1, 1, 1}, "c");  // varies along N
  const ir::ValueId i = Input(b, {4, 3, 5, 5}, "i", v1::INT64);
  b.AddOutput(Sum(b, g, {0, 2, 3}, true));
  b.AddOutput(Sum(b, g, {2, 3}, true));                // other dims
  b.AddOutput(Sum(b, Mul(b, g, x), {0, 2, 3}, true));  // another product
  b.AddOutput(Sum(b, Mul(b, g, c), {0, 2, 3}, true));  // c is not constant along N
  b.AddOutput(Sum(b, Mul(b, g, i), {0, 2, 3}, true));  // an integer factor
  b.AddOutput(Sum(b, Mul(b, i, g), {0, 2, 3}, true));
  b.AddOutput(Op(b, "aten.sum.dim_IntList", {Ref(g), ir::Ints({0, 2, 3}), ir::Bool(true)},
                 {ir::Argument{"dtype", v1::FLOAT64}}));  // a dtype argument
  ir::Graph out;
  absl::StatusOr<int> n = MergeEquivalentSums(std::move(b).Build(), &out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 0);
}

// A chain of 20,000 sums of sums that keep their dims (a hostile graph's
// shape): every sum follows a few steps of the chain, not all of it. Only
// the chain's second to fifth sums, each the whole sum of x, merge.
TEST(MergeSumsTest, AChainOfSumsTakesLinearTime) {
  ir::GraphBuilder b("chain");
  ir::ValueId x = Input(b, {4, 3}, "x");
  for (int i = 0; i < 20000; ++i) x = Sum(b, x, {i % 2}, true);
  b.AddOutput(x);
  const ir::Graph g = std::move(b).Build();
  const auto start = std::chrono::steady_clock::now();
  ir::Graph out;
  absl::StatusOr<int> n = MergeEquivalentSums(g, &out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(*n, 4);
  ASSERT_TRUE(ir::Verify(out).ok()) << ir::Verify(out);
}

}  // namespace
}  // namespace kiln::pipeline
