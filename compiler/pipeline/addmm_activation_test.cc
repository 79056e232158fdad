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

ir::TensorMeta Meta(std::vector<int64_t> sizes, v1::DType dtype, const std::string& device) {
  ir::TensorMeta m = ir::ContiguousMeta(sizes, dtype);
  m.device_type = device;
  return m;
}

struct Options {
  v1::DType dtype = v1::BFLOAT16;
  std::string device = "cuda";
  std::string activation = "gelu_tanh";  // gelu_tanh, gelu, relu
  bool view = true;                      // the product viewed as [4, 16, 16] first
  bool keep_product = false;             // the product an output too
  std::vector<ir::Argument> addmm_kwargs;
};

// A linear layer [64, 32] x [32, 16] + bias, then its activation.
ir::Graph Linear(const Options& o) {
  ir::GraphBuilder b("linear");
  ir::ValueId x = b.AddInput(Meta({64, 32}, o.dtype, o.device), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId w = b.AddInput(Meta({32, 16}, o.dtype, o.device), v1::Placeholder::PARAMETER, "w");
  ir::ValueId bias = b.AddInput(Meta({16}, o.dtype, o.device), v1::Placeholder::PARAMETER, "bias");
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

TEST(AddmmActivationTest, ReluOfTheProductItself) {
  Options o;
  o.activation = "relu";
  o.view = false;
  o.dtype = v1::FLOAT32;
  const ir::Graph g = Linear(o);
  ir::Graph out;
  ASSERT_EQ(*FuseAddmmActivations(g, &out), 1);
  EXPECT_TRUE(ir::Verify(out).ok()) << ir::Verify(out).message();
  EXPECT_EQ(Count(out, "aten.relu.default"), 0);
  EXPECT_FALSE(UsesGelu(out));
  const ir::Value& relu = g.value(g.nodes()[1].outputs[0]);
  const ir::Value& read = out.value(ir::Graph::Operands(out.nodes().back())[0]);
  EXPECT_EQ(read.name, relu.name);
  EXPECT_EQ(out.nodes()[read.producer].target, "aten._addmm_activation.default");
}

TEST(AddmmActivationTest, LeavesWhatTheEpilogueCannotDo) {
  ir::Graph out;
  // The exact GELU (erf) is no cuBLASLt epilogue.
  Options exact;
  exact.activation = "gelu";
  EXPECT_EQ(*FuseAddmmActivations(Linear(exact), &out), 0);
  // A product read besides the activation (a training graph saves it).
  Options kept;
  kept.keep_product = true;
  EXPECT_EQ(*FuseAddmmActivations(Linear(kept), &out), 0);
  // The CPU's code is its own; float64 has no such epilogue.
  Options cpu;
  cpu.device = "cpu";
  EXPECT_EQ(*FuseAddmmActivations(Linear(cpu), &out), 0);
  Options f64;
  f64.dtype = v1::FLOAT64;
  EXPECT_EQ(*FuseAddmmActivations(Linear(f64), &out), 0);
  // A scaled product is not the epilogue's.
  Options scaled;
  scaled.addmm_kwargs = {ir::Kwarg("alpha", ir::Float(0.5))};
  EXPECT_EQ(*FuseAddmmActivations(Linear(scaled), &out), 0);
}

}  // namespace
}  // namespace kiln::pipeline
