// Gathers in generated kernels (loop::StmtKind::kGather): embedding,
// index_select, gather and advanced indexing, fused with what computes
// their indices and what reads their results, compiled to C++ and compared
// with ATen; an index out of range, refused with an error naming it; and
// the creation ops computed where they are read (arange as index values,
// full and zeros as constants).
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "client/runtime/backend_test_util.h"

namespace kiln::runtime {
namespace {

using backend_test::Compile;
using backend_test::Compiled;
using backend_test::Meta;
using backend_test::Op;
using backend_test::Rand;
using backend_test::S;
using ir::Ref;

at::Tensor Ints(int64_t low, int64_t high, std::vector<int64_t> sizes) {
  return at::randint(low, high, sizes, at::TensorOptions().dtype(at::kLong));
}

int Count(const v1::ExecutionPlan& plan, v1::PlanStep::KindCase kind) {
  int n = 0;
  for (const auto& s : plan.steps()) n += s.kind_case() == kind;
  return n;
}

// The kernels' statements of kind `kind`.
int Statements(const loop::LoweredGraph& l, loop::StmtKind kind = loop::StmtKind::kGather) {
  int n = 0;
  for (const loop::Kernel& k : l.kernels) {
    for (const loop::Stmt& s : k.stmts) n += s.kind == kind;
  }
  return n;
}

// The graph `body` builds over inputs of `metas`, compiled: `kernels`
// kernels, no extern, `gathers` gathers and `scatters` scatter-adds, and
// ATen's results on `inputs`.
void Check(const std::string& what, const std::vector<ir::TensorMeta>& metas,
           const backend_test::GraphBody& body, const std::vector<at::Tensor>& inputs, int kernels,
           int gathers, int scatters = 0) {
  ir::Graph g = backend_test::BuildGraph(what, metas, body);
  Compiled c = Compile(g);
  const std::string listing = loop::PrintLowered(c.lowered);
  EXPECT_EQ(static_cast<int>(c.lowered.kernels.size()), kernels) << what << "\n" << listing;
  EXPECT_EQ(Count(c.lowered.plan, v1::PlanStep::kExternCall), 0) << what << "\n" << listing;
  EXPECT_EQ(Statements(c.lowered), gathers) << what << "\n" << listing;
  EXPECT_EQ(Statements(c.lowered, loop::StmtKind::kScatterAdd), scatters) << what << "\n"
                                                                          << listing;
  backend_test::ExpectSame(c, g, inputs, what);
}

TEST(GatherTest, EmbeddingPlusPositionsIsOneKernel) {
  // Token embeddings plus position embeddings, then a GELU: one kernel,
  // two gathers.
  const std::vector<ir::TensorMeta> metas = {Meta(S({50, 16})), Meta(S({4, 7}), v1::INT64),
                                             Meta(S({7, 16})), Meta(S({7}), v1::INT64)};
  at::Tensor ids = Ints(0, 50, {4, 7});
  Check(
      "embedding", metas,
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        ir::ValueId tok = Op(b, "aten.embedding.default", {Ref(in[0]), Ref(in[1])});
        ir::ValueId pos = Op(b, "aten.embedding.default", {Ref(in[2]), Ref(in[3])});
        b.AddOutput(
            Op(b, "aten.gelu.default", {Ref(Op(b, "aten.add.Tensor", {Ref(tok), Ref(pos)}))}));
      },
      {Rand({50, 16}), ids, Rand({7, 16}), at::arange(7, at::TensorOptions().dtype(at::kLong))},
      /*kernels=*/1, /*gathers=*/2);
}

TEST(GatherTest, IndexSelectAndGatherFuseWithTheirIndicesAndReaders) {
  Check(
      "index_select", {Meta(S({6, 5, 3})), Meta(S({4}), v1::INT64)},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        ir::ValueId x = Op(b, "aten.index_select.default", {Ref(in[0]), ir::Int(1), Ref(in[1])});
        b.AddOutput(Op(b, "aten.mul.Scalar", {Ref(x), ir::Float(2.0)}));
      },
      {Rand({6, 5, 3}), Ints(0, 5, {4})}, 1, 1);
  // gather along the last dim with an index smaller than the input, summed
  // over its rows (a loss's picked log-probabilities).
  Check(
      "gather", {Meta(S({8, 10})), Meta(S({8, 3}), v1::INT64)},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        ir::ValueId g = Op(b, "aten.gather.default", {Ref(in[0]), ir::Int(1), Ref(in[1])});
        b.AddOutput(
            Op(b, "aten.sum.dim_IntList", {Ref(g), ir::Argument{"", std::vector<int64_t>{1}}}));
      },
      {Rand({8, 10}), Ints(0, 10, {8, 3})}, 1, 1);
}

TEST(GatherTest, AdvancedIndexingWithComputedIndices) {
  // x[:, :, clamp(ys, 0, 5), clamp(xs, 0, 6)] with ys [4, 1] and xs [9]
  // broadcast (the shape of an upsampling's taps): the clamps, the gather
  // and the scale in one kernel.
  Check(
      "index", {Meta(S({2, 3, 6, 7})), Meta(S({4, 1}), v1::INT64), Meta(S({9}), v1::INT64)},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        ir::ValueId ys = Op(b, "aten.clamp.default", {Ref(in[1]), ir::Int(0), ir::Int(5)});
        ir::ValueId xs = Op(b, "aten.clamp.default", {Ref(in[2]), ir::Int(0), ir::Int(6)});
        ir::ValueId g =
            Op(b, "aten.index.Tensor",
               {Ref(in[0]),
                ir::Argument{"", std::vector<ir::ValueId>{ir::kNoValue, ir::kNoValue, ys, xs}}});
        b.AddOutput(Op(b, "aten.mul.Scalar", {Ref(g), ir::Float(0.5)}));
      },
      {Rand({2, 3, 6, 7}), Ints(-2, 8, {4, 1}), Ints(-2, 9, {9})}, 1, 1);
  // Indices not adjacent (dims 0 and 2): the broadcast index dims lead;
  // negative ones count from the end.
  Check(
      "index_apart", {Meta(S({5, 4, 6})), Meta(S({3}), v1::INT64), Meta(S({3}), v1::INT64)},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        b.AddOutput(Op(
            b, "aten.index.Tensor",
            {Ref(in[0]), ir::Argument{"", std::vector<ir::ValueId>{in[1], ir::kNoValue, in[2]}}}));
      },
      {Rand({5, 4, 6}), Ints(-5, 5, {3}), Ints(0, 6, {3})}, 1, 1);
}

TEST(GatherTest, CreationOpsAreComputedWhereTheyAreRead) {
  // A causal mask from two aranges, filled with a full's -inf where it is
  // masked, added to the scores and summed by rows: one kernel, no extern
  // (nothing is created in memory).
  const int64_t n = 6;
  ir::GraphBuilder b("causal");
  ir::ValueId x = b.AddInput(Meta(S({3, n, n})), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId rows =
      Op(b, "aten.arange.default", {ir::Int(n)}, {ir::Kwarg("dtype", ir::Argument{"", v1::INT32})});
  ir::ValueId cols = Op(b, "aten.arange.start_step", {ir::Int(1), ir::Int(n + 1), ir::Int(1)});
  ir::ValueId col = Op(b, "aten.unsqueeze.default", {Ref(cols), ir::Int(0)});
  ir::ValueId row = Op(b, "aten.unsqueeze.default", {Ref(rows), ir::Int(1)});
  ir::ValueId masked =
      Op(b, "aten.gt.Tensor", {Ref(col), Ref(Op(b, "aten.add.Scalar", {Ref(row), ir::Int(1)}))});
  ir::ValueId inf = Op(b, "aten.full.default",
                       {ir::Ints({n, n}), ir::Float(-std::numeric_limits<double>::infinity())});
  ir::ValueId zeros = Op(b, "aten.zeros.default", {ir::Ints({n, n})});
  ir::ValueId bias = Op(b, "aten.where.self", {Ref(masked), Ref(inf), Ref(zeros)});
  ir::ValueId scores = Op(b, "aten.add.Tensor", {Ref(x), Ref(bias)});
  b.AddOutput(Op(b, "aten.amax.default", {Ref(scores), ir::Ints({-1})}));
  b.AddOutput(
      Op(b, "aten.mul.Tensor", {Ref(scores), Ref(Op(b, "aten.arange.default", {ir::Int(n)}))}));
  ir::Graph g = std::move(b).Build();
  Compiled c = Compile(g);
  EXPECT_EQ(Count(c.lowered.plan, v1::PlanStep::kExternCall), 0) << loop::PrintLowered(c.lowered);
  backend_test::ExpectSame(c, g, {Rand({3, n, n})}, "causal");
}

TEST(GatherTest, ScatterAddsAreKernelsWithDuplicatesAddedUp) {
  // index_put with accumulation into zeros (advanced indexing's gradient),
  // duplicates and negative indices among the positions; the values
  // computed in the same kernel.
  Check(
      "index_put", {Meta(S({6, 4})), Meta(S({5}), v1::INT64), Meta(S({5, 4}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        ir::ValueId zeros = Op(b, "aten.zeros_like.default", {Ref(in[0])});
        ir::ValueId values = Op(b, "aten.mul.Scalar", {Ref(in[2]), ir::Float(3.0)});
        b.AddOutput(Op(b, "aten.index_put.default",
                       {Ref(zeros), ir::Argument{"", std::vector<ir::ValueId>{in[1]}}, Ref(values),
                        ir::Bool(true)}));
      },
      {Rand({6, 4}), at::tensor({2, -1, 2, 0, 5}, at::TensorOptions().dtype(at::kLong)),
       Rand({5, 4})},
      1, 0, 1);
  // Into a tensor that is not zeros: a kernel copies it, the next adds.
  Check(
      "index_put_base", {Meta(S({6, 4})), Meta(S({5}), v1::INT64), Meta(S({5, 4}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        b.AddOutput(Op(b, "aten.index_put.default",
                       {Ref(in[0]), ir::Argument{"", std::vector<ir::ValueId>{in[1]}}, Ref(in[2]),
                        ir::Bool(true)}));
      },
      {Rand({6, 4}), at::tensor({2, -1, 2, 0, 5}, at::TensorOptions().dtype(at::kLong)),
       Rand({5, 4})},
      2, 0, 1);
  // index_add into zeros along dim 1.
  Check(
      "index_add", {Meta(S({3, 7})), Meta(S({9}), v1::INT64), Meta(S({3, 9}))},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        ir::ValueId zeros = Op(b, "aten.zeros.default", {ir::Ints({3, 7})});
        b.AddOutput(
            Op(b, "aten.index_add.default", {Ref(zeros), ir::Int(1), Ref(in[1]), Ref(in[2])}));
      },
      {Rand({3, 7}), Ints(0, 7, {9}), Rand({3, 9})}, 1, 0, 1);
  // An embedding's gradient: rows of the padding index add nothing.
  Check(
      "embedding_dense_backward", {Meta(S({4, 5, 8})), Meta(S({4, 5}), v1::INT64)},
      [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
        b.AddOutput(Op(b, "aten.embedding_dense_backward.default",
                       {Ref(in[0]), Ref(in[1]), ir::Int(11), ir::Int(3), ir::Bool(false)}));
      },
      {Rand({4, 5, 8}), Ints(0, 11, {4, 5})}, 1, 0, 1);
}

TEST(GatherTest, SixteenBitScatterAddsStayWithATen) {
  // bfloat16 would round after every addition where ATen sums each
  // position in float32.
  ir::GraphBuilder b("bf16");
  ir::ValueId g = b.AddInput(Meta(S({4, 8}), v1::BFLOAT16), v1::Placeholder::USER_INPUT, "g");
  ir::ValueId i = b.AddInput(Meta(S({4}), v1::INT64), v1::Placeholder::USER_INPUT, "i");
  b.AddOutput(Op(b, "aten.embedding_dense_backward.default",
                 {Ref(g), Ref(i), ir::Int(10), ir::Int(-1), ir::Bool(false)}));
  ir::Graph graph = std::move(b).Build();
  Compiled c = Compile(graph);
  EXPECT_EQ(Count(c.lowered.plan, v1::PlanStep::kExternCall), 1) << loop::PrintLowered(c.lowered);
  EXPECT_EQ(Statements(c.lowered, loop::StmtKind::kScatterAdd), 0);
  backend_test::ExpectSame(c, graph, {Rand({4, 8}, at::kBFloat16), Ints(0, 10, {4})}, "bf16");
}

TEST(GatherTest, AnIndexOutOfRangeIsAnErrorNamingIt) {
  ir::GraphBuilder b("oob");
  ir::ValueId w = b.AddInput(Meta(S({10, 4})), v1::Placeholder::USER_INPUT, "w");
  ir::ValueId i = b.AddInput(Meta(S({3}), v1::INT64), v1::Placeholder::USER_INPUT, "i");
  b.AddOutput(Op(b, "aten.embedding.default", {Ref(w), Ref(i)}));
  ir::Graph g = std::move(b).Build();
  Compiled c = Compile(g);
  ASSERT_EQ(Statements(c.lowered), 1) << loop::PrintLowered(c.lowered);
  ASSERT_NE(c.exec, nullptr);
  at::Tensor ids = at::arange(3, at::TensorOptions().dtype(at::kLong));
  ids[1] = 10;
  auto got = c.exec->Run({Rand({10, 4}), ids});
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(absl::StrContains(got.status().message(),
                                "index 10 is out of bounds for a dimension with size 10"))
      << got.status();
  // An embedding's ids do not count from the end (advanced indexing's do).
  ids[1] = -1;
  EXPECT_FALSE(c.exec->Run({Rand({10, 4}), ids}).ok());
  ids[1] = 9;
  EXPECT_TRUE(c.exec->Run({Rand({10, 4}), ids}).ok());
}

}  // namespace
}  // namespace kiln::runtime
