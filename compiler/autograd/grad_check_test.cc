// Gradient checks of the op registry's derivative rules (compiler/ops/
// derivatives.cc) through the joint graph (joint_graph.h), against
// libtorch's autograd in float64.
//
// Each case builds a one-op forward graph over random inputs (fresh values
// every run: the seed is drawn at start-up and printed), builds the joint
// graph, runs it with the reference interpreter on (primals, random
// tangents), and compares every input gradient with torch::autograd::grad
// over the same forward graph run on inputs that require grad: the same
// values (rtol 1e-7, atol 1e-9) and the same undefined gradients. Every
// joint graph must be free of dead nodes, and the metadata of each of its
// values must match what ATen computes (sizes and dtype; stride
// differences are printed as notes).
//
// Every op with a derivative rule needs a case here, and every op of
// kExpectedDifferentiable needs a rule: both are tests.
//
// The harness is grad_check_test_util.h; the cases live by op family in
// grad_check_*_test.cc.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdint>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_replace.h"
#include "client/runtime/interpreter.h"
#include "compiler/autograd/grad_check_test_util.h"
#include "compiler/autograd/joint_graph.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/graph.h"
#include "compiler/ops/registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::autograd::grad_check_test {
namespace {

using ::testing::HasSubstr;

// Ops that must have a derivative rule.
const char* const kExpectedDifferentiable[] = {
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
    "aten.pow.Tensor_Scalar",
    "aten.pow.Tensor_Tensor",
    "aten.clamp.default",
    "aten.add.Tensor",
    "aten.add.Scalar",
    "aten.sub.Tensor",
    "aten.sub.Scalar",
    "aten.mul.Tensor",
    "aten.mul.Scalar",
    "aten.div.Tensor",
    "aten.div.Scalar",
    "aten.div.Tensor_mode",
    "aten.rsub.Tensor",
    "aten.rsub.Scalar",
    "aten.maximum.default",
    "aten.minimum.default",
    "aten.where.self",
    "aten.masked_fill.Scalar",
    "aten._to_copy.default",
    "aten.clone.default",
    "aten.alias.default",
    "aten.detach.default",
    "aten.sum.dim_IntList",
    "aten.sum.default",
    "aten.mean.dim",
    "aten.mean.default",
    "aten.amax.default",
    "aten.amin.default",
    "aten.var.correction",
    "aten.var_mean.correction",
    "aten.prod.dim_int",
    "aten._softmax.default",
    "aten._log_softmax.default",
    "aten.native_layer_norm.default",
    "aten.native_batch_norm.default",
    "aten._native_batch_norm_legit_functional.default",
    "aten._native_batch_norm_legit_no_training.default",
    "aten.nll_loss_forward.default",
    "aten.native_dropout.default",
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
    "aten.cat.default",
    "aten.t.default",
    "aten.transpose.int",
    "aten.as_strided.default",
    "aten.mm.default",
    "aten.bmm.default",
    "aten.addmm.default",
    "aten.convolution.default",
    "aten.max_pool2d_with_indices.default",
    "aten.avg_pool2d.default",
    "aten.embedding.default",
    "aten.index.Tensor",
};

std::map<std::string, Case> Cases() {
  std::map<std::string, Case> c;
  AddPointwiseCases(c);
  AddReductionCases(c);
  AddViewCases(c);
  AddMatmulCases(c);
  return c;
}

std::vector<std::string> CaseNames() {
  std::vector<std::string> names;
  for (const auto& [name, unused] : Cases()) names.push_back(name);
  return names;
}

// ---------------------------------------------------------------------------
// Tests.

class Environment : public ::testing::Environment {
 public:
  void SetUp() override {
    const uint64_t seed = std::random_device{}();
    std::cout << "grad_check seed: " << seed << std::endl;
    at::manual_seed(seed);
    Rng().seed(seed);
  }
  void TearDown() override {
    for (const std::string& note : Notes()) std::cout << "[note] " << note << "\n";
  }
};
const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new Environment);

class GradCheck : public ::testing::TestWithParam<std::string> {};

TEST_P(GradCheck, MatchesLibtorch) {
  const ops::OpDef* def = ops::DefaultRegistry().Find(GetParam());
  if (def == nullptr || !def->derivative) {
    GTEST_SKIP() << GetParam()
                 << " has no derivative rule (ExpectedOpsHaveRules says whether it must)";
  }
  if (!Cases().at(GetParam())()) {
    GTEST_SKIP() << GetParam()
                 << " is not in this libtorch or runs on CUDA only: only the joint graph's "
                    "shape was checked";
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, GradCheck, ::testing::ValuesIn(CaseNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return absl::StrReplaceAll(info.param, {{".", "_"}});
                         });

TEST(GradCheckCoverage, ExpectedOpsHaveRules) {
  for (const char* t : kExpectedDifferentiable) {
    const ops::OpDef* def = ops::DefaultRegistry().Find(t);
    if (def == nullptr) {
      ADD_FAILURE() << t
                    << " is not in the op registry (no shape rule), so it has no derivative rule";
    } else if (!def->derivative) {
      ADD_FAILURE() << t << " has no derivative rule";
    }
  }
}

TEST(GradCheckCoverage, EveryRuleHasACase) {
  const std::map<std::string, Case> cases = Cases();
  for (const ops::OpDef* def : ops::DefaultRegistry().All()) {
    if (def->derivative && !cases.count(def->target)) {
      ADD_FAILURE() << def->target << " has a derivative rule but no grad-check case";
    }
  }
}

// A node on a gradient path whose op has no derivative rule.
TEST(JointGraph, OpWithoutRuleIsInvalidArgument) {
  ir::GraphBuilder b("fwd");
  at::Tensor grad = Randn({5, 3});
  at::Tensor idx = Indices({5}, 4);
  ValueId g = b.AddInput(MetaOf(grad, true));
  ValueId i = b.AddInput(MetaOf(idx, false));
  const std::string target = "aten.embedding_dense_backward.default";
  ASSERT_NE(ops::DefaultRegistry().Find(target), nullptr);
  ASSERT_FALSE(ops::DefaultRegistry().Find(target)->derivative);
  auto outs =
      ops::Emit(b, ops::DefaultRegistry(), target, {Ref(g), Ref(i), Int(4), Int(-1), Bool(false)});
  ASSERT_TRUE(outs.ok()) << outs.status();
  b.AddOutput((*outs)[0]);
  const ir::Graph fwd = std::move(b).Build();
  auto jg = BuildJointGraph(fwd, {});
  ASSERT_FALSE(jg.ok());
  EXPECT_EQ(jg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(jg.status().message()), HasSubstr(target));
  EXPECT_THAT(std::string(jg.status().message()), HasSubstr(fwd.nodes()[0].name));
}

// y = x * x + x: the gradients of the three uses of x add up.
TEST(JointGraph, AccumulatesGradientsOfAValueUsedTwice) {
  at::Tensor x = Randn({Dim(), Dim()});
  ir::GraphBuilder b("fwd");
  ValueId in = b.AddInput(MetaOf(x, true));
  auto sq = ops::Emit(b, ops::DefaultRegistry(), "aten.mul.Tensor", {Ref(in), Ref(in)});
  ASSERT_TRUE(sq.ok()) << sq.status();
  auto y = ops::Emit(b, ops::DefaultRegistry(), "aten.add.Tensor", {Ref((*sq)[0]), Ref(in)});
  ASSERT_TRUE(y.ok()) << y.status();
  b.AddOutput((*y)[0]);
  const ir::Graph fwd = std::move(b).Build();
  auto jg = BuildJointGraph(fwd, {});
  ASSERT_TRUE(jg.ok()) << jg.status();
  ExpectNoDeadNodes(jg->graph);
  at::Tensor t = Randn(x.sizes());
  auto out = runtime::RunGraph(jg->graph, {x, t});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(jg->grad_output_index[0], 1);
  EXPECT_TRUE(at::allclose((*out)[1], t * 2 * x + t, kRtol, kAtol));

  at::Tensor leaf = x.detach().requires_grad_(true);
  auto ref = runtime::RunGraph(fwd, {leaf});
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto grads = torch::autograd::grad({(*ref)[0]}, {leaf}, {t});
  EXPECT_TRUE(at::allclose((*out)[1], grads[0], kRtol, kAtol));
}

// Two outputs, only the first receiving a gradient; an input that needs none.
TEST(JointGraph, OutputWithoutGradientAndInputWithoutNeed) {
  at::Tensor x = Randn({Dim(), Dim()});
  at::Tensor w = Randn(x.sizes());
  ir::GraphBuilder b("fwd");
  ValueId xi = b.AddInput(MetaOf(x, true));
  ValueId wi = b.AddInput(MetaOf(w, false));
  auto m = ops::Emit(b, ops::DefaultRegistry(), "aten.mul.Tensor", {Ref(xi), Ref(wi)});
  ASSERT_TRUE(m.ok()) << m.status();
  auto e = ops::Emit(b, ops::DefaultRegistry(), "aten.exp.default", {Ref((*m)[0])});
  ASSERT_TRUE(e.ok()) << e.status();
  auto s = ops::Emit(b, ops::DefaultRegistry(), "aten.sin.default", {Ref((*m)[0])});
  ASSERT_TRUE(s.ok()) << s.status();
  b.AddOutput((*e)[0]);
  b.AddOutput((*s)[0]);
  const ir::Graph fwd = std::move(b).Build();

  JointOptions options;
  options.outputs_receive_grad = {true, false};
  auto jg = BuildJointGraph(fwd, options);
  ASSERT_TRUE(jg.ok()) << jg.status();
  EXPECT_EQ(jg->num_tangents, 1);
  EXPECT_EQ(jg->grad_output_index, (std::vector<int>{2, -1}));
  ExpectNoDeadNodes(jg->graph);
  // Forward mul, backward exp's mul and mul by w: nothing for sin, nothing for w.
  int muls = 0, cos = 0;
  for (const ir::Node& n : jg->graph.nodes()) {
    muls += n.target == "aten.mul.Tensor";
    cos += n.target == "aten.cos.default";
  }
  EXPECT_EQ(muls, 3);
  EXPECT_EQ(cos, 0);
  at::Tensor t = Randn(x.sizes());
  auto out = runtime::RunGraph(jg->graph, {x, w, t});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(at::allclose((*out)[2], t * at::exp(x * w) * w, kRtol, kAtol));
}

// Rules over symbolic sizes build (the interpreter cannot run them yet).
TEST(JointGraph, RulesBuildOverSymbolicSizes) {
  ir::TensorMeta x;
  x.dtype = v1::FLOAT64;
  x.sizes = {ir::SymInt{std::string("s0")}, ir::SymInt{int64_t{4}}};
  x.strides = {ir::SymInt{int64_t{4}}, ir::SymInt{int64_t{1}}};
  x.device_type = "cpu";
  x.requires_grad = true;
  const std::vector<std::pair<std::string, std::vector<Argument>>> ops = {
      {"aten.sum.dim_IntList", {Ref(0), Ints({0})}},
      {"aten.mean.dim", {Ref(0), Ints({0, 1})}},
      {"aten.mean.default", {Ref(0)}},
      {"aten.var.correction", {Ref(0), Ints({0})}},
      {"aten.amax.default", {Ref(0), Ints({0})}},
      {"aten.expand.default",
       {Ref(0),
        Argument{"", std::vector<ir::SymInt>{{int64_t{3}}, {std::string("s0")}, {int64_t{4}}}}}},
      {"aten.view.default", {Ref(0), Ints({-1})}},
      {"aten.slice.Tensor", {Ref(0), Int(0), Int(1), Int(kEnd)}},
      {"aten.slice.Tensor", {Ref(0), Int(0), Int(0), Int(kEnd), Int(2)}},
      {"aten.select.int", {Ref(0), Int(0), Int(1)}},
      {"aten.split.Tensor", {Ref(0), Int(2), Int(1)}},
      {"aten.cat.default", {Refs({0, 0}), Int(0)}},
      {"aten.permute.default", {Ref(0), Ints({1, 0})}},
      {"aten.mm.default", {Ref(0), Ref(1)}},
      {"aten._softmax.default", {Ref(0), Int(0), Bool(false)}},
  };
  for (const auto& [target, args] : ops) {
    SCOPED_TRACE(target);
    ir::GraphBuilder b("fwd");
    b.AddInput(x);
    ir::TensorMeta w = MetaOf(Randn({4, 3}), true);
    b.AddInput(w);
    auto outs = ops::Emit(b, ops::DefaultRegistry(), target, args);
    ASSERT_TRUE(outs.ok()) << outs.status();
    for (ValueId v : *outs) b.AddOutput(v);
    const ir::Graph fwd = std::move(b).Build();
    auto jg = BuildJointGraph(fwd, {});
    ASSERT_TRUE(jg.ok()) << jg.status();
    EXPECT_GE(jg->grad_output_index[0], 0);
    ExpectNoDeadNodes(jg->graph);
    EXPECT_TRUE(ops::CheckMetadata(ops::DefaultRegistry(), jg->graph).ok());
    // The gradient of x has x's sizes.
    const ir::Value& g = jg->graph.value(jg->graph.outputs()[jg->grad_output_index[0]]);
    EXPECT_EQ(g.meta.sizes, x.sizes) << g.name;
  }
}

}  // namespace
}  // namespace kiln::autograd::grad_check_test
