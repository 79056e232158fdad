#include "compiler/pipeline/conv_layouts.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compiler/ir/builder.h"
#include "compiler/ir/verify.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_util.h"
#include "compiler/pipeline/rewrite_test_util.h"

namespace kiln::pipeline {
namespace {

using ir::Ref;

ir::ValueId Input(ir::GraphBuilder& b, std::vector<int64_t> sizes, const std::string& name,
                  const std::string& device = "cuda", v1::DType dtype = v1::BFLOAT16) {
  ir::TensorMeta m = ir::ContiguousMeta(std::move(sizes), dtype);
  m.device_type = device;
  m.device_index = device == "cuda" ? 0 : -1;
  return b.AddInput(m, v1::Placeholder::USER_INPUT, name);
}

ir::ValueId Conv(ir::GraphBuilder& b, ir::ValueId x, ir::ValueId w, int64_t groups = 1) {
  return Op(b, "aten.convolution.default",
            {Ref(x), Ref(w), ir::NoneArg(), ir::Ints({1, 1}), ir::Ints({1, 1}), ir::Ints({1, 1}),
             ir::Bool(false), ir::Ints({0, 0}), ir::Int(groups)});
}

const ir::Value* Named(const ir::Graph& g, const std::string& name) {
  for (const ir::Value& v : g.values()) {
    if (v.name == name) return &v;
  }
  return nullptr;
}

// conv, batch-norm-like scale, relu, conv, residual add, relu, mean over
// the pixels: the conv net's shape. The first relu is an output too.
ir::Graph ConvNet(const std::string& device = "cuda", int64_t groups = 1,
                  v1::DType dtype = v1::BFLOAT16) {
  ir::GraphBuilder b("convnet");
  const ir::ValueId x = Input(b, {4, 3, 8, 8}, "x", device, dtype);
  const ir::ValueId w1 = Input(b, {16, 3, 3, 3}, "w1", device, dtype);
  const ir::ValueId w2 = Input(b, {16, 16 / groups, 3, 3}, "w2", device, dtype);
  const ir::ValueId scale = Input(b, {16, 1, 1}, "scale", device, dtype);
  const ir::ValueId c1 = Conv(b, x, w1);
  const ir::ValueId y =
      Op(b, "aten.relu.default", {Ref(Op(b, "aten.mul.Tensor", {Ref(c1), Ref(scale)}))});
  const ir::ValueId c2 = Conv(b, y, w2, groups);
  const ir::ValueId z =
      Op(b, "aten.relu.default", {Ref(Op(b, "aten.add.Tensor", {Ref(y), Ref(c2)}))});
  b.AddOutput(Op(b, "aten.mean.dim", {Ref(z), ir::Ints({2, 3})}));
  b.AddOutput(y);
  return std::move(b).Build();
}

TEST(ConvLayoutsTest, TheFirstConvolutionsOperandsAreCopiedAndTheLayoutFlowsToTheNext) {
  const ir::Graph g = ConvNet();
  ir::Graph out;
  absl::StatusOr<int> n = ChannelsLastConvolutions(g, &out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 2);
  ASSERT_TRUE(ir::Verify(out).ok()) << ir::Verify(out);

  // Channels-last copies of x and w1 for the first convolution, of w2 for
  // the second (whose input is channels-last already), and y's contiguous
  // copy for the output.
  ASSERT_EQ(Count(out, "aten.clone.default"), 4);
  const ir::Value* x = Named(out, "x_nhwc");
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(Strides(x->meta), (std::vector<int64_t>{192, 1, 24, 3}));
  const ir::Value* w1 = Named(out, "w1_nhwc");
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ(Strides(w1->meta), (std::vector<int64_t>{27, 1, 9, 3}));
  const ir::Value* w2 = Named(out, "w2_nhwc");
  ASSERT_NE(w2, nullptr);
  EXPECT_EQ(Strides(w2->meta), (std::vector<int64_t>{144, 1, 48, 16}));
  EXPECT_EQ(Named(out, "y_nhwc"), nullptr);

  // Both convolutions, the pointwise values between and after them:
  // channels-last, [4, 16, 8, 8] -> strides [1024, 1, 128, 16].
  const std::vector<int64_t> nhwc = {1024, 1, 128, 16};
  int convolutions = 0;
  for (const ir::Node& node : out.nodes()) {
    if (node.target == "aten.convolution.default" || node.target == "aten.relu.default" ||
        node.target == "aten.add.Tensor" || node.target == "aten.mul.Tensor") {
      EXPECT_EQ(Strides(out.value(node.outputs[0]).meta), nhwc) << node.name;
      convolutions += node.target == "aten.convolution.default";
    }
  }
  EXPECT_EQ(convolutions, 2);

  // The outputs keep the layouts they had: the mean's is contiguous
  // anyway; y gets a contiguous copy.
  ASSERT_EQ(out.outputs().size(), 2u);
  EXPECT_EQ(Strides(out.value(out.outputs()[0]).meta), (std::vector<int64_t>{16, 1}));
  const ir::Value& y = out.value(out.outputs()[1]);
  EXPECT_EQ(Strides(y.meta), (std::vector<int64_t>{1024, 64, 8, 1}));
  EXPECT_EQ(y.meta.sizes, g.value(g.outputs()[1]).meta.sizes);
  EXPECT_EQ(y.meta.dtype, g.value(g.outputs()[1]).meta.dtype);
}

TEST(ConvLayoutsTest, ConvolutionsElsewhereStayAsTheyAre) {
  ir::Graph out;
  // On the CPU.
  absl::StatusOr<int> n = ChannelsLastConvolutions(ConvNet("cpu"), &out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 0);
  // In float32.
  n = ChannelsLastConvolutions(ConvNet("cuda", 1, v1::FLOAT32), &out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 0);
  // Grouped: the first is rewritten, the grouped one reads its
  // channels-last input as it comes (ATen decides its layout).
  const ir::Graph grouped = ConvNet("cuda", /*groups=*/2);
  n = ChannelsLastConvolutions(grouped, &out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1);
  const ir::Node* second = nullptr;
  for (const ir::Node& node : out.nodes()) {
    if (node.target == "aten.convolution.default") second = &node;
  }
  ASSERT_NE(second, nullptr);
  EXPECT_TRUE(ops::IsContiguous(out.value(second->outputs[0]).meta));
}

TEST(ConvLayoutsTest, AChannelsLastInputNeedsNoCopyItsWeightDoes) {
  ir::GraphBuilder b("nhwc");
  const ir::ValueId x = Input(b, {4, 8, 8, 8}, "x");
  const ir::ValueId w = Input(b, {8, 8, 3, 3}, "w");
  const ir::ValueId x_nhwc =
      Op(b, "aten.clone.default", {Ref(x)}, {ir::Argument{"memory_format", v1::CHANNELS_LAST}});
  const ir::ValueId c = Conv(b, x_nhwc, w);
  b.AddOutput(Op(b, "aten.sum.dim_IntList", {Ref(c), ir::Ints({1})}));
  const ir::Graph g = std::move(b).Build();
  // The registry's rule already gives cuDNN's channels-last output.
  EXPECT_TRUE(ops::IsChannelsLast(g.value(c).meta));
  ir::Graph out;
  absl::StatusOr<int> n = ChannelsLastConvolutions(g, &out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1);
  ASSERT_TRUE(ir::Verify(out).ok()) << ir::Verify(out);
  EXPECT_EQ(Count(out, "aten.clone.default"), 2);  // the graph's own, and w's
  ASSERT_NE(Named(out, "w_nhwc"), nullptr);
  EXPECT_EQ(Named(out, "x_nhwc_nhwc"), nullptr);
  // A convolution whose operands are both channels-last is left as it is.
  ir::Graph again;
  n = ChannelsLastConvolutions(out, &again);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 0);
}

TEST(ConvLayoutsTest, AViewThatWouldNotStayAViewLeavesTheGraph) {
  ir::GraphBuilder b("flatten");
  const ir::ValueId x = Input(b, {4, 3, 8, 8}, "x");
  const ir::ValueId w = Input(b, {16, 3, 3, 3}, "w");
  const ir::ValueId c = Op(b, "aten.relu.default", {Ref(Conv(b, x, w))});
  b.AddOutput(Op(b, "aten.view.default", {Ref(c), ir::Ints({4, 1024})}));
  ir::Graph out;
  EXPECT_FALSE(ChannelsLastConvolutions(std::move(b).Build(), &out).ok());
}

// ATen's CUDA group norm refuses a channels-last input (F.group_norm makes
// it contiguous before the kernel; a diffusion model's residual block):
// the convolution's result reaches it through a contiguous copy, and the
// pointwise ops after it are contiguous again.
TEST(ConvLayoutsTest, GroupNormReadsAContiguousCopy) {
  ir::GraphBuilder b("groupnorm");
  const ir::ValueId x = Input(b, {2, 3, 8, 8}, "x");
  const ir::ValueId w = Input(b, {16, 3, 3, 3}, "w");
  const ir::ValueId gamma = Input(b, {16}, "gamma");
  const ir::ValueId beta = Input(b, {16}, "beta");
  const ir::ValueId c = Op(b, "aten.relu.default", {Ref(Conv(b, x, w))});
  const absl::StatusOr<std::vector<ir::ValueId>> norm =
      ops::Emit(b, ops::DefaultRegistry(), "aten.native_group_norm.default",
                {Ref(c), Ref(gamma), Ref(beta), ir::Int(2), ir::Int(16), ir::Int(64), ir::Int(4),
                 ir::Float(1e-5)},
                {});
  ASSERT_TRUE(norm.ok()) << norm.status();
  b.AddOutput(Op(b, "aten.sigmoid.default", {Ref((*norm)[0])}));
  ir::Graph out;
  absl::StatusOr<int> n = ChannelsLastConvolutions(std::move(b).Build(), &out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1);
  ASSERT_TRUE(ir::Verify(out).ok()) << ir::Verify(out);
  int norms = 0;
  for (const ir::Node& node : out.nodes()) {
    if (node.target != "aten.native_group_norm.default") continue;
    ++norms;
    const auto* input = std::get_if<ir::ValueId>(&node.args[0].kind);
    ASSERT_NE(input, nullptr);
    EXPECT_TRUE(ops::IsContiguous(out.value(*input).meta));
    const ir::Node* copy = nullptr;
    for (const ir::Node& m : out.nodes()) {
      if (!m.outputs.empty() && m.outputs[0] == *input) copy = &m;
    }
    ASSERT_NE(copy, nullptr);
    EXPECT_EQ(copy->target, "aten.clone.default");
    const auto* relu = std::get_if<ir::ValueId>(&copy->args[0].kind);
    ASSERT_NE(relu, nullptr);
    EXPECT_TRUE(ops::IsChannelsLast(out.value(*relu).meta));
  }
  EXPECT_EQ(norms, 1);
  // x, w, and the group norm's input: no copy of the output, which stayed
  // contiguous.
  EXPECT_EQ(Count(out, "aten.clone.default"), 3);
}

}  // namespace
}  // namespace kiln::pipeline
