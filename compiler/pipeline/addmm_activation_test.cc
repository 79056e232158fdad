#include "compiler/pipeline/addmm_activation.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "compiler/ir/builder.h"
#include "compiler/ir/verify.h"
#include "compiler/ops/registry.h"
#include "compiler/pipeline/rewrite_test_util.h"

namespace kiln::pipeline {
namespace {

using ir::Ref;

struct Options {
  v1::DType dtype = v1::BFLOAT16;
  std::string device = "cuda";
  std::string activation = "gelu_tanh";  // gelu_tanh, gelu, relu
  bool view = true;                      // the product viewed as [4, 16, 16] first
  bool keep_product = false;             // the product an output too
  bool keep_view = false;                // its view an output too
  std::vector<int64_t> bias_sizes = {16};
  std::vector<ir::Argument> addmm_kwargs;
};

// A linear layer [64, 32] x [32, 16] + bias, then its activation.
ir::Graph Linear(const Options& o) {
  ir::GraphBuilder b("linear");
  ir::ValueId x =
      b.AddInput(DeviceMeta({64, 32}, o.dtype, o.device), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId w =
      b.AddInput(DeviceMeta({32, 16}, o.dtype, o.device), v1::Placeholder::PARAMETER, "w");
  ir::ValueId bias =
      b.AddInput(DeviceMeta(o.bias_sizes, o.dtype, o.device), v1::Placeholder::PARAMETER, "bias");
  ir::ValueId y = Op(b, "aten.addmm.default", {Ref(bias), Ref(x), Ref(w)}, o.addmm_kwargs);
  ir::ValueId v = o.view ? Op(b, "aten.view.default", {Ref(y), ir::Ints({4, 16, 16})}) : y;
  ir::ValueId a;
  if (o.activation == "relu") {
    a = Op(b, "aten.relu.default", {Ref(v)});
  } else {
    std::vector<ir::Argument> kwargs;
    if (o.activation == "gelu_tanh")
      kwargs.push_back(ir::Kwarg("approximate", ir::Positional(std::string("tanh"))));
    a = Op(b, "aten.gelu.default", {Ref(v)}, std::move(kwargs));
  }
  b.AddOutput(Op(b, "aten.mul.Tensor", {Ref(a), Ref(a)}));
  if (o.keep_product) b.AddOutput(y);
  if (o.keep_view && o.view) b.AddOutput(v);
  return std::move(b).Build();
}

// The use_gelu argument of the graph's one _addmm_activation.
bool UsesGelu(const ir::Graph& g) {
  for (const ir::Node& n : g.nodes()) {
    if (n.target != "aten._addmm_activation.default") continue;
    for (const ir::Argument& a : n.kwargs) {
      if (a.name == "use_gelu") return std::get<bool>(a.kind);
    }
  }
  ADD_FAILURE() << "no use_gelu";
  return false;
}

TEST(AddmmActivationTest, TanhGeluThroughTheViewBecomesTheEpilogue) {
  const ir::Graph g = Linear({});
  ir::Graph out;
  absl::StatusOr<int> n = FuseAddmmActivations(g, &out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1);
  EXPECT_TRUE(ir::Verify(out).ok()) << ir::Verify(out).message();
  EXPECT_EQ(Count(out, "aten.addmm.default"), 0);
  EXPECT_EQ(Count(out, "aten.gelu.default"), 0);
  EXPECT_EQ(Count(out, "aten._addmm_activation.default"), 1);
  EXPECT_EQ(Count(out, "aten.view.default"), 1);
  EXPECT_TRUE(UsesGelu(out));
  // The view of the epilogue's product is the GELU's value: its name and
  // metadata, and what reads it reads it.
  const ir::Value& gelu = g.value(g.nodes()[2].outputs[0]);
  const ir::Node& mul = out.nodes().back();
  ASSERT_EQ(mul.target, "aten.mul.Tensor");
  const ir::Value& read = out.value(ir::Graph::Operands(mul)[0]);
  EXPECT_EQ(read.name, gelu.name);
  EXPECT_EQ(read.meta.sizes, gelu.meta.sizes);
  EXPECT_EQ(out.nodes()[read.producer].target, "aten.view.default");
}

TEST(AddmmActivationTest, TanhGeluOfTheProductItself) {
  Options o;
  o.view = false;
  o.dtype = v1::FLOAT16;
  const ir::Graph g = Linear(o);
  ir::Graph out;
  absl::StatusOr<int> n = FuseAddmmActivations(g, &out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1);
  EXPECT_TRUE(ir::Verify(out).ok()) << ir::Verify(out).message();
  EXPECT_EQ(Count(out, "aten.gelu.default"), 0);
  EXPECT_TRUE(UsesGelu(out));
  const ir::Value& gelu = g.value(g.nodes()[1].outputs[0]);
  const ir::Value& read = out.value(ir::Graph::Operands(out.nodes().back())[0]);
  EXPECT_EQ(read.name, gelu.name);
  EXPECT_EQ(out.nodes()[read.producer].target, "aten._addmm_activation.default");
}

// How many matches the rewrite makes of the graph `o` describes.
int Matches(const Options& o) {
  ir::Graph out;
  absl::StatusOr<int> n = FuseAddmmActivations(Linear(o), &out);
  EXPECT_TRUE(n.ok()) << n.status();
  return n.ok() ? *n : -1;
}

TEST(AddmmActivationTest, LeavesWhatTheEpilogueCannotDo) {
  // The exact GELU (erf) is no cuBLASLt epilogue; ReLU's is not known to
  // keep NaN.
  Options exact;
  exact.activation = "gelu";
  EXPECT_EQ(Matches(exact), 0);
  Options relu;
  relu.activation = "relu";
  EXPECT_EQ(Matches(relu), 0);
  // A product or view read besides the GELU (a training graph saves it).
  Options kept;
  kept.keep_product = true;
  EXPECT_EQ(Matches(kept), 0);
  Options viewed;
  viewed.keep_view = true;
  EXPECT_EQ(Matches(viewed), 0);
  // The CPU's code is its own; float64 has no such epilogue, and
  // float32's is a second kernel after the GEMM.
  Options cpu;
  cpu.device = "cpu";
  EXPECT_EQ(Matches(cpu), 0);
  Options f64;
  f64.dtype = v1::FLOAT64;
  EXPECT_EQ(Matches(f64), 0);
  Options f32;
  f32.dtype = v1::FLOAT32;
  EXPECT_EQ(Matches(f32), 0);
  // A scaled product, or a bias of two dimensions, is not the epilogue's.
  Options scaled;
  scaled.addmm_kwargs = {ir::Kwarg("alpha", ir::Float(0.5))};
  EXPECT_EQ(Matches(scaled), 0);
  Options wide_bias;
  wide_bias.bias_sizes = {1, 16};
  EXPECT_EQ(Matches(wide_bias), 0);
}

}  // namespace
}  // namespace kiln::pipeline
