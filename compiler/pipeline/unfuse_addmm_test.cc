#include "compiler/pipeline/unfuse_addmm.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compiler/ir/builder.h"
#include "compiler/ir/verify.h"
#include "compiler/ops/registry.h"
#include "compiler/pipeline/rewrite_test_util.h"

namespace kiln::pipeline {
namespace {

using ir::Ref;

// A linear layer [B*L, K] x [K, N] + bias viewed back as [B, L, N], then
// `reader` (a GELU, or a sum over the rows).
ir::Graph Linear(v1::DType dtype, const std::string& device, const std::string& reader,
                 std::vector<ir::Argument> kwargs = {}) {
  ir::GraphBuilder b("linear");
  ir::ValueId x = b.AddInput(DeviceMeta({64, 32}, dtype, device), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId w = b.AddInput(DeviceMeta({32, 16}, dtype, device), v1::Placeholder::PARAMETER, "w");
  ir::ValueId bias =
      b.AddInput(DeviceMeta({16}, dtype, device), v1::Placeholder::PARAMETER, "bias");
  ir::ValueId y = Op(b, "aten.addmm.default", {Ref(bias), Ref(x), Ref(w)}, std::move(kwargs));
  ir::ValueId v = Op(b, "aten.view.default", {Ref(y), ir::Ints({4, 16, 16})});
  if (reader == "gelu") {
    b.AddOutput(Op(b, "aten.gelu.default", {Ref(v)}));
  } else {
    b.AddOutput(Op(b, "aten.sum.dim_IntList", {Ref(v), ir::Ints({1}), ir::Bool(false)}));
  }
  return std::move(b).Build();
}

TEST(UnfuseAddmmTest, Float32OnCudaIsAGemmAndABiasAddItsReaderFuses) {
  const ir::Graph g = Linear(v1::FLOAT32, "cuda", "gelu");
  ir::Graph out;
  absl::StatusOr<int> n = UnfuseAddmm(g, &out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1);
  EXPECT_TRUE(ir::Verify(out).ok());
  EXPECT_EQ(Count(out, "aten.addmm.default"), 0);
  EXPECT_EQ(Count(out, "aten.mm.default"), 1);
  EXPECT_EQ(Count(out, "aten.add.Tensor"), 1);
  // The product's only reader is a view: the bias is added to the product
  // viewed so, and the sum is the view's value (its name and metadata), of
  // the GELU's shape.
  const ir::Value& before = g.value(g.nodes()[1].outputs[0]);
  bool kept = false;
  for (const ir::Node& node : out.nodes()) {
    if (node.target != "aten.add.Tensor") continue;
    const ir::Value& after = out.value(node.outputs[0]);
    const ir::Value& operand = out.value(ir::Graph::Operands(node)[0]);
    kept = after.name == before.name && after.meta.sizes == before.meta.sizes &&
           after.meta.strides == before.meta.strides && after.meta.dtype == before.meta.dtype &&
           operand.meta.sizes == before.meta.sizes && operand.producer >= 0 &&
           out.nodes()[operand.producer].target == "aten.view.default";
  }
  EXPECT_TRUE(kept);
}

TEST(UnfuseAddmmTest, AProductReadOtherwiseKeepsItsShape) {
  // The addmm's result is read as it is as well as through the view: the
  // sum is the addmm's value, its name and metadata.
  ir::GraphBuilder b("linear");
  const ir::TensorMeta x_meta = DeviceMeta({64, 32}, v1::FLOAT32, "cuda");
  ir::ValueId x = b.AddInput(x_meta, v1::Placeholder::USER_INPUT, "x");
  ir::ValueId w =
      b.AddInput(DeviceMeta({32, 16}, v1::FLOAT32, "cuda"), v1::Placeholder::PARAMETER, "w");
  ir::ValueId bias =
      b.AddInput(DeviceMeta({16}, v1::FLOAT32, "cuda"), v1::Placeholder::PARAMETER, "bias");
  ir::ValueId y = Op(b, "aten.addmm.default", {Ref(bias), Ref(x), Ref(w)});
  ir::ValueId v = Op(b, "aten.view.default", {Ref(y), ir::Ints({4, 16, 16})});
  b.AddOutput(Op(b, "aten.gelu.default", {Ref(v)}));
  b.AddOutput(Op(b, "aten.relu.default", {Ref(y)}));
  const ir::Graph g = std::move(b).Build();
  ir::Graph out;
  ASSERT_EQ(*UnfuseAddmm(g, &out), 1);
  EXPECT_TRUE(ir::Verify(out).ok());
  const ir::Value& before = g.value(g.nodes()[0].outputs[0]);
  bool kept = false;
  for (const ir::Node& node : out.nodes()) {
    if (node.target != "aten.add.Tensor") continue;
    const ir::Value& after = out.value(node.outputs[0]);
    kept = after.name == before.name && after.meta.sizes == before.meta.sizes;
  }
  EXPECT_TRUE(kept);
}

TEST(UnfuseAddmmTest, LeavesWhatItCannotHelp) {
  ir::Graph out;
  // 16-bit GEMMs keep their bias epilogue.
  EXPECT_EQ(*UnfuseAddmm(Linear(v1::BFLOAT16, "cuda", "gelu"), &out), 0);
  // The CPU's code is its own.
  EXPECT_EQ(*UnfuseAddmm(Linear(v1::FLOAT32, "cpu", "gelu"), &out), 0);
  // No pointwise reader to take the add.
  EXPECT_EQ(*UnfuseAddmm(Linear(v1::FLOAT32, "cuda", "sum"), &out), 0);
  // A scaled product or bias is not a plain add.
  EXPECT_EQ(
      *UnfuseAddmm(Linear(v1::FLOAT32, "cuda", "gelu", {ir::Kwarg("beta", ir::Float(0.5))}), &out),
      0);
}

}  // namespace
}  // namespace kiln::pipeline
