#include "compiler/pipeline/cat_layouts.h"

#include <gtest/gtest.h>

#include <string>
#include <variant>
#include <vector>

#include "absl/strings/match.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/verify.h"
#include "compiler/loop/lowering.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_util.h"

namespace kiln::pipeline {
namespace {

using ir::Ref;

ir::ValueId Op(ir::GraphBuilder& b, const std::string& target, std::vector<ir::Argument> args,
               std::vector<ir::Argument> kwargs = {}) {
  auto out = ops::Emit(b, ops::DefaultRegistry(), target, std::move(args), std::move(kwargs));
  EXPECT_TRUE(out.ok()) << target << ": " << out.status();
  return out.ok() ? (*out)[0] : ir::kNoValue;
}

ir::TensorMeta Cuda(std::vector<int64_t> sizes) {
  ir::TensorMeta m = ir::ContiguousMeta(sizes, v1::BFLOAT16);
  m.device_type = "cuda";
  m.device_index = 0;
  return m;
}

// dq, dk and dv of [B, L, C] concatenated along C, dk a transposed view
// (its bmm made [B, C, L]).
ir::Graph QkvGradient() {
  ir::GraphBuilder b("qkv_grad");
  const ir::ValueId dq = b.AddInput(Cuda({2, 16, 8}), v1::Placeholder::USER_INPUT, "dq");
  const ir::ValueId dkt = b.AddInput(Cuda({2, 8, 16}), v1::Placeholder::USER_INPUT, "dkt");
  const ir::ValueId dv = b.AddInput(Cuda({2, 16, 8}), v1::Placeholder::USER_INPUT, "dv");
  const ir::ValueId dk = Op(b, "aten.permute.default", {Ref(dkt), ir::Ints({0, 2, 1})});
  const ir::ValueId cat =
      Op(b, "aten.cat.default",
         {ir::Argument{"", std::vector<ir::ValueId>{dq, dk, dv}}, ir::Argument{"", int64_t{-1}}});
  b.AddOutput(cat);
  return std::move(b).Build();
}

TEST(CatLayouts, ATransposedOperandIsCopiedAlongMemoryFirst) {
  const ir::Graph g = QkvGradient();
  ir::Graph out;
  absl::StatusOr<int> copied = ContiguousCatOperands(g, &out);
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(*copied, 1);
  ASSERT_TRUE(ir::Verify(out).ok()) << ir::Verify(out);
  const ir::Node* cat = nullptr;
  int clones = 0;
  for (const ir::Node& n : out.nodes()) {
    if (n.target == "aten.cat.default") cat = &n;
    clones += n.target == "aten.clone.default";
  }
  ASSERT_NE(cat, nullptr);
  EXPECT_EQ(clones, 1);
  // Every operand of the cat is row-major now, and its result is as before.
  for (ir::ValueId v : std::get<std::vector<ir::ValueId>>(cat->args[0].kind)) {
    EXPECT_TRUE(ops::IsContiguous(out.value(v).meta)) << out.value(v).name;
  }
  EXPECT_EQ(out.value(cat->outputs[0]).meta.sizes, g.value(g.outputs()[0]).meta.sizes);
  EXPECT_EQ(out.value(cat->outputs[0]).name, g.value(g.outputs()[0]).name);
  // The copy is a generated kernel; the cat stays with ATen.
  absl::StatusOr<loop::LoweredGraph> lowered = loop::LowerGraph(out);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(lowered->kernels.size(), 1u);
}

TEST(CatLayouts, RowMajorOperandsAreLeftAlone) {
  ir::GraphBuilder b("rows");
  const ir::ValueId x = b.AddInput(Cuda({4, 8}), v1::Placeholder::USER_INPUT, "x");
  const ir::ValueId y = b.AddInput(Cuda({4, 8}), v1::Placeholder::USER_INPUT, "y");
  // A slice keeps the last dim along memory: ATen's cat reads it well.
  const ir::ValueId ys = Op(b, "aten.slice.Tensor",
                            {Ref(y), ir::Argument{"", int64_t{0}}, ir::Argument{"", int64_t{0}},
                             ir::Argument{"", int64_t{2}}});
  const ir::ValueId xs = Op(b, "aten.slice.Tensor",
                            {Ref(x), ir::Argument{"", int64_t{0}}, ir::Argument{"", int64_t{0}},
                             ir::Argument{"", int64_t{2}}});
  b.AddOutput(
      Op(b, "aten.cat.default",
         {ir::Argument{"", std::vector<ir::ValueId>{xs, ys}}, ir::Argument{"", int64_t{1}}}));
  const ir::Graph g = std::move(b).Build();
  ir::Graph out;
  absl::StatusOr<int> copied = ContiguousCatOperands(g, &out);
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(*copied, 0);
}

}  // namespace
}  // namespace kiln::pipeline
