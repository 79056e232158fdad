#include "compiler/pipeline/elide_copies.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "compiler/ir/builder.h"
#include "compiler/ir/verify.h"
#include "compiler/ops/registry.h"
#include "compiler/pipeline/rewrite_test_util.h"

namespace kiln::pipeline {
namespace {

using ir::Ref;

constexpr char kClone[] = "aten.clone.default";

ir::ValueId SwapHeads(ir::GraphBuilder& b, ir::ValueId x) {
  return Op(b, "aten.permute.default", {Ref(x), ir::Ints({0, 2, 1, 3})});
}

// What attention through ATen leaves, for [B, L, H, D] = [2, 4, 3, 8]: a
// kernel's output in [B, L, H, D] memory seen as [B, H, L, D] (here a sum and
// a permute), copied contiguous as the matmul it replaced wrote it, then
// Dynamo's permute back to [B, L, H, D], clone and view to [B, L, H * D].
struct Heads {
  ir::Graph graph;
  ir::ValueId kernel_out;  // the [B, L, H, D] sum
};

enum class Variant { kPlain, kSecondCopyIsOutput, kFirstCopyReadByKernel, kFromInput };

Heads AttentionHeads(Variant variant = Variant::kPlain) {
  ir::GraphBuilder b("heads");
  ir::TensorMeta m = ir::ContiguousMeta({2, 4, 3, 8}, v1::FLOAT32);
  m.device_type = "cuda";
  m.device_index = 0;
  const ir::ValueId x = b.AddInput(m, v1::Placeholder::USER_INPUT, "x");
  const ir::ValueId sum =
      variant == Variant::kFromInput ? x : Op(b, "aten.add.Tensor", {Ref(x), Ref(x)});
  const ir::ValueId first = Contiguous(b, SwapHeads(b, sum));  // [B, H, L, D]
  const ir::ValueId second = Contiguous(b, SwapHeads(b, first));
  const ir::ValueId flat = Op(b, "aten.view.default", {Ref(second), ir::Ints({2, 4, 24})});
  b.AddOutput(Op(b, "aten.mul.Tensor", {Ref(flat), Ref(flat)}));
  if (variant == Variant::kSecondCopyIsOutput) b.AddOutput(second);
  if (variant == Variant::kFirstCopyReadByKernel) {
    b.AddOutput(Op(b, "aten.neg.default", {Ref(first)}));
  }
  Heads h{std::move(b).Build(), sum};
  return h;
}

TEST(ElideCopiesTest, AttentionsHeadsAreReadWhereTheKernelWroteThem) {
  const Heads h = AttentionHeads();
  ASSERT_EQ(Count(h.graph, kClone), 2);
  ir::Graph out;
  absl::StatusOr<int> n = ElideCopies(h.graph, &out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 2);
  EXPECT_EQ(Count(out, kClone), 0);
  ASSERT_TRUE(ir::Verify(out).ok()) << ir::Verify(out);
  // The view reads the sum through the two permutes, which cancel: the
  // sum's own contiguous layout.
  for (const ir::Node& node : out.nodes()) {
    if (node.target != "aten.view.default") continue;
    const ir::TensorMeta& in = out.value(ir::Graph::Operands(node)[0]).meta;
    EXPECT_EQ(Strides(in), (std::vector<int64_t>{96, 24, 8, 1}));
    ir::ValueId base = ir::Graph::Operands(node)[0];
    while (out.nodes()[out.value(base).producer].target == "aten.permute.default") {
      base = ir::Graph::Operands(out.nodes()[out.value(base).producer])[0];
    }
    EXPECT_EQ(out.value(base).name, h.graph.value(h.kernel_out).name);
  }
  EXPECT_EQ(Count(out, "aten.permute.default"), 2);
  EXPECT_EQ(out.outputs().size(), h.graph.outputs().size());
}

TEST(ElideCopiesTest, ACopyThatIsAGraphOutputStays) {
  const Heads h = AttentionHeads(Variant::kSecondCopyIsOutput);
  ir::Graph out;
  absl::StatusOr<int> n = ElideCopies(h.graph, &out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1);  // the first copy, only copied again
  EXPECT_EQ(Count(out, kClone), 1);
  ASSERT_TRUE(ir::Verify(out).ok()) << ir::Verify(out);
  // The output is still the copy, not a view of the sum.
  const ir::Value& second = out.value(out.outputs()[1]);
  EXPECT_NE(second.producer, -1);
  EXPECT_EQ(out.nodes()[second.producer].target, kClone);
}

TEST(ElideCopiesTest, ACopyAKernelReadsInItsLayoutStays) {
  const Heads h = AttentionHeads(Variant::kFirstCopyReadByKernel);
  ir::Graph out;
  absl::StatusOr<int> n = ElideCopies(h.graph, &out);
  ASSERT_TRUE(n.ok()) << n.status();
  // The first copy has a reader that is no copy, and the second is laid
  // out unlike what it copies: both stay.
  EXPECT_EQ(*n, 0);
}

TEST(ElideCopiesTest, ACopyOfAGraphInputStays) {
  const Heads h = AttentionHeads(Variant::kFromInput);
  ir::Graph out;
  absl::StatusOr<int> n = ElideCopies(h.graph, &out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 0);
}

// A contiguous copy of a contiguous intermediate (a copy kept for a layout
// that the value had anyway) goes; its readers read the intermediate.
TEST(ElideCopiesTest, ACopyLaidOutAsItsInputGoes) {
  ir::GraphBuilder b("same");
  ir::TensorMeta m = ir::ContiguousMeta({6, 5}, v1::FLOAT32);
  m.device_type = "cuda";
  m.device_index = 0;
  const ir::ValueId x = b.AddInput(m, v1::Placeholder::USER_INPUT, "x");
  const ir::ValueId y = Op(b, "aten.exp.default", {Ref(x)});
  const ir::ValueId row = Op(b, "aten.slice.Tensor",
                             {Ref(Contiguous(b, y)), ir::Positional(int64_t{0}),
                              ir::Positional(int64_t{2}), ir::Positional(int64_t{4})});
  b.AddOutput(Op(b, "aten.neg.default", {Ref(row)}));
  const ir::Graph g = std::move(b).Build();
  ir::Graph out;
  absl::StatusOr<int> n = ElideCopies(g, &out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1);
  EXPECT_EQ(Count(out, kClone), 0);
  ASSERT_TRUE(ir::Verify(out).ok()) << ir::Verify(out);
  // The slice is taken of the exp now, at the same offset into it.
  for (const ir::Node& node : out.nodes()) {
    if (node.target != "aten.slice.Tensor") continue;
    const ir::Value& in = out.value(ir::Graph::Operands(node)[0]);
    EXPECT_EQ(out.nodes()[in.producer].target, "aten.exp.default");
    const ir::TensorMeta& sliced = out.value(node.outputs[0]).meta;
    ASSERT_TRUE(sliced.storage_offset.is_constant());
    EXPECT_EQ(sliced.storage_offset.constant(), 10);
  }
}

}  // namespace
}  // namespace kiln::pipeline
