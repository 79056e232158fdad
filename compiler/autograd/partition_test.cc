// The joint graph and the min-cut partitioner, structurally: what is saved,
// what is recomputed, what never is. (Numerical agreement with libtorch's
// autograd is grad_check_test.cc's business.)
#include "compiler/autograd/partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/autograd/joint_graph.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/verify.h"

namespace kiln::autograd {
namespace {

using ir::Ref;

ir::TensorMeta Meta(std::vector<int64_t> sizes, bool requires_grad = false) {
  return ir::ContiguousMeta(sizes, v1::FLOAT32, requires_grad);
}

ir::ValueId Op(ir::GraphBuilder& b, const std::string& target, std::vector<ir::Argument> args,
               std::vector<ir::Argument> kwargs = {}, int output = 0) {
  auto out = ops::Emit(b, ops::DefaultRegistry(), target, std::move(args), std::move(kwargs));
  EXPECT_TRUE(out.ok()) << target << ": " << out.status();
  return out.ok() ? (*out)[output] : ir::kNoValue;
}

Partition Split(const ir::Graph& g, bool min_cut = true) {
  auto joint = BuildJointGraph(g, {});
  EXPECT_TRUE(joint.ok()) << joint.status();
  PartitionOptions o;
  o.min_cut = min_cut;
  auto p = PartitionJointGraph(*joint, o);
  EXPECT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(ir::Verify(p->forward).ok());
  EXPECT_TRUE(ir::Verify(p->backward).ok());
  return *std::move(p);
}

// Whether `names` (a partition's saved or recomputed values) holds `name`.
bool Holds(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool HasTarget(const ir::Graph& g, const std::string& target) {
  for (const auto& n : g.nodes()) {
    if (n.target == target) return true;
  }
  return false;
}

// A long pointwise chain over x: saving x and recomputing the chain costs
// one tensor; saving what each backward step reads costs one per step.
ir::Graph PointwiseChain(int steps) {
  ir::GraphBuilder b("chain");
  ir::ValueId x = b.AddInput(Meta({64, 64}, true), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId v = x;
  for (int i = 0; i < steps; ++i)
    v = Op(b, i % 2 ? "aten.sin.default" : "aten.cos.default", {Ref(v)});
  b.AddOutput(Op(b, "aten.sum.default", {Ref(v)}));
  return std::move(b).Build();
}

TEST(PartitionTest, RecomputesCheapChainsInsteadOfSavingEachStep) {
  const ir::Graph g = PointwiseChain(6);
  Partition save_all = Split(g, /*min_cut=*/false);
  Partition cut = Split(g);
  EXPECT_EQ(save_all.saved.size(), 6u);  // each sin/cos backward reads its input
  EXPECT_EQ(cut.saved, std::vector<std::string>{"x"});
  EXPECT_EQ(cut.saved_bytes, 64 * 64 * 4);
  EXPECT_LT(cut.saved_bytes, save_all.saved_bytes);
  EXPECT_EQ(cut.recomputed.size(), 5u);
  // Forward: the primal in, the loss and the saved value out.
  EXPECT_EQ(cut.forward.inputs().size(), 1u);
  EXPECT_EQ(cut.forward.outputs().size(), 2u);
  // Backward: the saved value and one tangent in, one gradient out.
  EXPECT_EQ(cut.backward.inputs().size(), 2u);
  EXPECT_EQ(cut.backward.outputs().size(), 1u);
}

// RMS norm's weight gradient reads x * rstd. Saving it costs the forward a
// write of the whole tensor; saving x (which exists anyway) and the per-row
// mean, and recomputing x * rstd in the backward, does not.
TEST(PartitionTest, SavesAPrimalAndAPerRowValueRatherThanANewWholeTensor) {
  ir::GraphBuilder b("rmsnorm");
  ir::ValueId w = b.AddInput(Meta({256}, true), v1::Placeholder::PARAMETER, "w");
  ir::ValueId x = b.AddInput(Meta({128, 256}), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId sq = Op(b, "aten.mul.Tensor", {Ref(x), Ref(x)});
  ir::ValueId mean = Op(b, "aten.mean.dim", {Ref(sq), ir::Ints({-1}), ir::Bool(true)});
  ir::ValueId rstd =
      Op(b, "aten.rsqrt.default", {Ref(Op(b, "aten.add.Scalar", {Ref(mean), ir::Float(1e-6)}))});
  ir::ValueId normed = Op(b, "aten.mul.Tensor", {Ref(x), Ref(rstd)});
  b.AddOutput(Op(b, "aten.mul.Tensor", {Ref(normed), Ref(w)}));
  Partition p = Split(std::move(b).Build());
  EXPECT_EQ(p.saved_bytes, (128 * 256 + 128) * 4) << absl::StrJoin(p.saved, ", ");
  EXPECT_TRUE(Holds(p.saved, "x")) << absl::StrJoin(p.saved, ", ");
}

// x[:, 1:] of an x of symbolic sizes [s0, s1]: the slice's size is
// Max(1, s1 - 1), and its backward writes a gradient of size s1, which no
// tangent's dimension binds. The partition saves x (a primal: a
// reference) so that the backward's plan can bind s1 from it.
TEST(PartitionTest, SavesAPrimalThatBindsASymbolOnlyTheBackwardNeeds) {
  ir::GraphBuilder b("slice");
  ir::TensorMeta m = Meta({4, 4}, true);
  m.sizes = {ir::SymInt{std::string("s0")}, ir::SymInt{std::string("s1")}};
  m.strides = {ir::SymInt{std::string("s1")}, ir::SymInt{int64_t{1}}};
  ir::ValueId x = b.AddInput(m, v1::Placeholder::USER_INPUT, "x");
  ir::ValueId sliced = Op(b, "aten.slice.Tensor",
                          {Ref(x), ir::Int(1), ir::Int(1), ir::Int(int64_t{1} << 62), ir::Int(1)});
  b.AddOutput(Op(b, "aten.sum.dim_IntList", {Ref(sliced), ir::Ints({-1})}));
  Partition p = Split(std::move(b).Build());
  EXPECT_EQ(p.saved, std::vector<std::string>{"x"});
  bool binds = false;
  for (const auto& in : p.backward.inputs()) {
    for (const ir::SymInt& s : p.backward.value(in.value).meta.sizes) {
      binds = binds || (!s.is_constant() && s.expr() == "s1");
    }
  }
  EXPECT_TRUE(binds) << "no backward input has a dimension s1";
}

// A linear layer spelled mm + bias, then GELU: the backward reads the
// biased value. The mm's result exists anyway (ATen writes it); the biased
// value would exist only to be saved. The cut saves the product and the
// backward adds the bias again.
TEST(PartitionTest, SavesAMatmulsResultRatherThanAPointwiseValueOfIt) {
  ir::GraphBuilder b("linear_gelu");
  ir::ValueId x = b.AddInput(Meta({256, 64}, true), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId w = b.AddInput(Meta({64, 128}, true), v1::Placeholder::PARAMETER, "w");
  ir::ValueId bias = b.AddInput(Meta({128}, true), v1::Placeholder::PARAMETER, "bias");
  ir::ValueId m = Op(b, "aten.mm.default", {Ref(x), Ref(w)});
  const std::string product = b.value(m).name;
  ir::ValueId biased = Op(b, "aten.add.Tensor", {Ref(m), Ref(bias)});
  const std::string sum = b.value(biased).name;
  b.AddOutput(Op(b, "aten.gelu.default", {Ref(biased)}));
  Partition p = Split(std::move(b).Build());
  EXPECT_TRUE(Holds(p.saved, product)) << absl::StrJoin(p.saved, ", ");
  EXPECT_FALSE(Holds(p.saved, sum)) << absl::StrJoin(p.saved, ", ");
  EXPECT_TRUE(Holds(p.recomputed, sum)) << absl::StrJoin(p.recomputed, ", ");
}

// A product copied into another layout for a second matmul (attention's
// heads, transposed for the batched matmuls): the forward writes the copy
// for its matmul, and the backward's weight gradient reads it again. Saving
// the copy costs the backward one read; saving the product and copying it
// again costs the backward a read and a write as well.
TEST(PartitionTest, SavesACopyBothPassesMatmulsReadRatherThanCopyingItAgain) {
  ir::GraphBuilder b("heads");
  ir::ValueId x = b.AddInput(Meta({64, 32}, true), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId w = b.AddInput(Meta({32, 128}, true), v1::Placeholder::PARAMETER, "w");
  ir::ValueId w2 = b.AddInput(Meta({64, 16}, true), v1::Placeholder::PARAMETER, "w2");
  ir::ValueId product = Op(b, "aten.mm.default", {Ref(x), Ref(w)});
  ir::ValueId moved = Op(b, "aten.clone.default",
                         {Ref(Op(b, "aten.permute.default", {Ref(product), ir::Ints({1, 0})}))},
                         {ir::Kwarg("memory_format", ir::NoneArg())});
  const std::string copy = b.value(moved).name;
  const std::string mm = b.value(product).name;
  b.AddOutput(Op(b, "aten.sum.default", {Ref(Op(b, "aten.mm.default", {Ref(moved), Ref(w2)}))}));
  Partition p = Split(std::move(b).Build());
  EXPECT_TRUE(Holds(p.saved, copy)) << absl::StrJoin(p.saved, ", ");
  EXPECT_FALSE(Holds(p.saved, mm)) << absl::StrJoin(p.saved, ", ");
  EXPECT_FALSE(Holds(p.recomputed, copy)) << absl::StrJoin(p.recomputed, ", ");
}

// An MLP: gelu(x @ w1 + b) @ w2. The forward writes the activation for its
// second matmul, and the backward's gradient of w2 reads it again. Saving
// it costs that read; computing it again from the saved product costs the
// backward a kernel that reads the product and writes the activation, and
// the matmul's read of it.
TEST(PartitionTest, SavesAnActivationABackwardMatmulReadsRatherThanComputingItAgain) {
  ir::GraphBuilder b("mlp_gelu");
  ir::ValueId x = b.AddInput(Meta({256, 64}, true), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId w1 = b.AddInput(Meta({64, 256}, true), v1::Placeholder::PARAMETER, "w1");
  ir::ValueId bias = b.AddInput(Meta({256}, true), v1::Placeholder::PARAMETER, "bias");
  ir::ValueId w2 = b.AddInput(Meta({256, 64}, true), v1::Placeholder::PARAMETER, "w2");
  ir::ValueId m = Op(b, "aten.mm.default", {Ref(x), Ref(w1)});
  ir::ValueId a = Op(b, "aten.gelu.default", {Ref(Op(b, "aten.add.Tensor", {Ref(m), Ref(bias)}))});
  const std::string product = b.value(m).name, activation = b.value(a).name;
  b.AddOutput(Op(b, "aten.sum.default", {Ref(Op(b, "aten.mm.default", {Ref(a), Ref(w2)}))}));
  Partition p = Split(std::move(b).Build());
  EXPECT_TRUE(Holds(p.saved, activation)) << absl::StrJoin(p.saved, ", ");
  EXPECT_FALSE(Holds(p.recomputed, activation)) << absl::StrJoin(p.recomputed, ", ");
  EXPECT_FALSE(HasTarget(p.backward, "aten.gelu.default"));
  // GELU's backward reads the biased product: the product is saved for it.
  EXPECT_TRUE(Holds(p.saved, product)) << absl::StrJoin(p.saved, ", ");
}

// A residual stream: h = x @ w1 + x @ w2 is read before a matmul (sin(h)
// feeds it) and after it (h + the product). The forward writes h for the
// reader after the matmul, so saving h costs its bytes once, less than
// saving both products to add them again in the backward.
TEST(PartitionTest, SavesAValueReadOnBothSidesOfAMatmul) {
  ir::GraphBuilder b("residual");
  ir::ValueId x = b.AddInput(Meta({64, 32}, true), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId w1 = b.AddInput(Meta({32, 32}, true), v1::Placeholder::PARAMETER, "w1");
  ir::ValueId w2 = b.AddInput(Meta({32, 32}, true), v1::Placeholder::PARAMETER, "w2");
  ir::ValueId w3 = b.AddInput(Meta({32, 32}, true), v1::Placeholder::PARAMETER, "w3");
  ir::ValueId p1 = Op(b, "aten.mm.default", {Ref(x), Ref(w1)});
  ir::ValueId p2 = Op(b, "aten.mm.default", {Ref(x), Ref(w2)});
  ir::ValueId h = Op(b, "aten.add.Tensor", {Ref(p1), Ref(p2)});
  ir::ValueId branch =
      Op(b, "aten.mm.default", {Ref(Op(b, "aten.sin.default", {Ref(h)})), Ref(w3)});
  b.AddOutput(Op(b, "aten.sum.default", {Ref(Op(b, "aten.add.Tensor", {Ref(h), Ref(branch)}))}));
  const std::string stream = b.value(h).name;
  const std::string first = b.value(p1).name, second = b.value(p2).name;
  Partition p = Split(std::move(b).Build());
  const std::string saved = absl::StrJoin(p.saved, ", ");
  EXPECT_TRUE(Holds(p.saved, stream)) << saved;
  EXPECT_FALSE(Holds(p.saved, first)) << saved;
  EXPECT_FALSE(Holds(p.saved, second)) << saved;
}

TEST(PartitionTest, NeverRecomputesMatmulsOrReductions) {
  ir::GraphBuilder b("mlp");
  ir::ValueId x = b.AddInput(Meta({8, 64}, true), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId w = b.AddInput(Meta({64, 64}, true), v1::Placeholder::PARAMETER, "w");
  ir::ValueId m = Op(b, "aten.mm.default", {Ref(x), Ref(w)});
  ir::ValueId y = Op(b, "aten.tanh.default", {Ref(m)});
  ir::ValueId s = Op(b, "aten._softmax.default", {Ref(y), ir::Int(-1), ir::Bool(false)});
  const std::string softmax = b.value(s).name;
  b.AddOutput(Op(b, "aten.sum.default", {Ref(s)}));
  Partition p = Split(std::move(b).Build());
  const ops::Registry& r = ops::DefaultRegistry();
  for (const std::string& name : p.recomputed) {
    for (const auto& n : p.backward.nodes()) {
      if (n.outputs.empty() || p.backward.value(n.outputs[0]).name != name) continue;
      const ops::OpDef* def = r.Find(n.target);
      ASSERT_NE(def, nullptr);
      EXPECT_TRUE(def->traits.pointwise || def->traits.view) << n.target << " was recomputed";
    }
  }
  // The softmax result is saved (its backward reads it), not recomputed;
  // the only matmuls in the backward are the gradient's own (they read the
  // tangent), never the forward's mm again.
  EXPECT_FALSE(HasTarget(p.backward, "aten._softmax.default"));
  EXPECT_TRUE(Holds(p.saved, softmax));
}

// amax's gradient goes where tanh(x) equals the max: the backward compares
// the forward's own tanh(x), saved, never a recomputed one.
TEST(PartitionTest, SavesWhatTheBackwardComparesForEquality) {
  ir::GraphBuilder b("amax");
  ir::ValueId x = b.AddInput(Meta({16, 32}, true), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId t = Op(b, "aten.tanh.default", {Ref(x)});
  const std::string tanh = b.value(t).name;
  b.AddOutput(Op(b, "aten.amax.default", {Ref(t), ir::Ints({-1}), ir::Bool(false)}));
  Partition p = Split(std::move(b).Build());
  EXPECT_TRUE(Holds(p.saved, tanh))
      << absl::StrJoin(p.saved, ",") << " / " << absl::StrJoin(p.recomputed, ",");
  EXPECT_FALSE(HasTarget(p.backward, "aten.tanh.default"));
}

TEST(PartitionTest, SavesTheDropoutMaskAndNeverRedrawsIt) {
  ir::GraphBuilder b("dropout");
  ir::ValueId x = b.AddInput(Meta({16, 32}, true), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId y = Op(b, "aten.native_dropout.default", {Ref(x), ir::Float(0.25), ir::Bool(true)});
  ir::ValueId z = Op(b, "aten.relu.default", {Ref(y)});
  b.AddOutput(Op(b, "aten.sum.default", {Ref(z)}));
  Partition p = Split(std::move(b).Build());
  EXPECT_TRUE(HasTarget(p.forward, "aten.native_dropout.default"));
  EXPECT_FALSE(HasTarget(p.backward, "aten.native_dropout.default"));
  // Dropout's mask, and relu's (NarrowMask).
  int masks_saved = 0;
  for (int i = p.num_forward_outputs; i < static_cast<int>(p.forward.outputs().size()); ++i) {
    masks_saved += p.forward.value(p.forward.outputs()[i]).meta.dtype == v1::BOOL;
  }
  EXPECT_EQ(masks_saved, 2);
}

// relu's mask (result <= 0) is saved, a byte an element, even though x,
// which the backward reads anyway, would give it back for free in the
// cut's terms: every backward kernel that needs the mask would read x
// again to compare it.
TEST(PartitionTest, SavesReluMaskRatherThanComparingWhatItIsComputedFrom) {
  ir::GraphBuilder b("relu_times_x");
  ir::ValueId x = b.AddInput(Meta({64, 64}, true), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId r = Op(b, "aten.relu.default", {Ref(x)});
  b.AddOutput(Op(b, "aten.sum.default", {Ref(Op(b, "aten.mul.Tensor", {Ref(r), Ref(x)}))}));
  Partition p = Split(std::move(b).Build());
  EXPECT_TRUE(Holds(p.saved, "x")) << absl::StrJoin(p.saved, ", ");
  ASSERT_EQ(p.saved.size(), 2u) << absl::StrJoin(p.saved, ", ");
  EXPECT_EQ(p.saved_bytes, 64 * 64 * 4 + 64 * 64);
  EXPECT_TRUE(HasTarget(p.forward, "aten.le.Scalar"));
  EXPECT_FALSE(HasTarget(p.backward, "aten.le.Scalar"));
  EXPECT_TRUE(HasTarget(p.backward, "aten.masked_fill.Scalar"));
}

TEST(PartitionTest, ForwardHoldsNoTangentWorkAndBackwardReadsOnlyItsInputs) {
  const ir::Graph g = PointwiseChain(3);
  Partition p = Split(g);
  for (const auto& in : p.forward.inputs()) {
    EXPECT_EQ(p.forward.value(in.value).name.rfind("tangent", 0), std::string::npos);
  }
  // Extract would have failed had the backward read anything it does not
  // receive; the saved names match the backward's first inputs.
  for (size_t i = 0; i < p.saved.size(); ++i) {
    EXPECT_EQ(p.backward.value(p.backward.inputs()[i].value).name, p.saved[i]);
  }
}

TEST(PartitionTest, InputsWithoutGradientsGetNone) {
  ir::GraphBuilder b("half");
  ir::ValueId x = b.AddInput(Meta({4, 4}, true), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId c = b.AddInput(Meta({4, 4}, false), v1::Placeholder::USER_INPUT, "c");
  b.AddOutput(Op(b, "aten.mul.Tensor", {Ref(x), Ref(c)}));
  auto joint = BuildJointGraph(std::move(b).Build(), {});
  ASSERT_TRUE(joint.ok()) << joint.status();
  EXPECT_EQ(joint->grad_output_index, (std::vector<int>{1, -1}));
  EXPECT_EQ(joint->num_tangents, 1);
}

TEST(PartitionTest, FiveThousandNodesWellUnderOneHundredMilliseconds) {
  const ir::Graph g = PointwiseChain(5000);
  const auto start = std::chrono::steady_clock::now();
  auto joint = BuildJointGraph(g, {});
  ASSERT_TRUE(joint.ok()) << joint.status();
  auto p = PartitionJointGraph(*joint);
  ASSERT_TRUE(p.ok()) << p.status();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(ms, 1000.0);  // the benchmark reports the real figure; this catches blow-ups
  EXPECT_EQ(p->saved.size(), 1u);
}

// A deep stack of residual blocks, each a matmul and a residual add: the
// values read across matmuls are found for every block in bounded time.
TEST(PartitionTest, AThousandResidualMatmulsWellUnderOneSecond) {
  ir::GraphBuilder b("stack");
  ir::ValueId h = b.AddInput(Meta({16, 16}, true), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId w = b.AddInput(Meta({16, 16}, true), v1::Placeholder::PARAMETER, "w");
  for (int i = 0; i < 1000; ++i) {
    ir::ValueId branch =
        Op(b, "aten.mm.default", {Ref(Op(b, "aten.sin.default", {Ref(h)})), Ref(w)});
    h = Op(b, "aten.add.Tensor", {Ref(h), Ref(branch)});
  }
  b.AddOutput(Op(b, "aten.sum.default", {Ref(h)}));
  const ir::Graph g = std::move(b).Build();
  const auto start = std::chrono::steady_clock::now();
  auto joint = BuildJointGraph(g, {});
  ASSERT_TRUE(joint.ok()) << joint.status();
  auto p = PartitionJointGraph(*joint);
  ASSERT_TRUE(p.ok()) << p.status();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(ms, 1000.0);
  // Each block's backward reads a value of the block (w's gradient reads
  // sin(h)), which no other block's saved values give.
  EXPECT_GE(p->saved.size(), 1000u);
}

// A derivative rule that would compute a value the graph computes already
// reads it: var's derivative takes the mean of its input, which a batch
// norm's forward computes over the same dims; one mean, not two.
TEST(PartitionTest, DerivativesReuseWhatTheForwardComputes) {
  ir::GraphBuilder b("norm");
  ir::ValueId x = b.AddInput(Meta({8, 4, 6, 6}, true), v1::Placeholder::USER_INPUT, "x");
  const std::vector<int64_t> dims = {0, 2, 3};
  ir::ValueId var = Op(b, "aten.var.correction", {Ref(x), ir::Ints(dims)},
                       {ir::Kwarg("correction", ir::Int(0)), ir::Kwarg("keepdim", ir::Bool(true))});
  ir::ValueId mean = Op(b, "aten.mean.dim", {Ref(x), ir::Ints(dims), ir::Bool(true)});
  ir::ValueId centered = Op(b, "aten.sub.Tensor", {Ref(x), Ref(mean)});
  ir::ValueId scale = Op(b, "aten.rsqrt.default", {Ref(var)});
  b.AddOutput(Op(b, "aten.mul.Tensor", {Ref(centered), Ref(scale)}));
  auto joint = BuildJointGraph(std::move(b).Build(), {});
  ASSERT_TRUE(joint.ok()) << joint.status();
  int means = 0;
  for (const ir::Node& n : joint->graph.nodes()) means += n.target == "aten.mean.dim";
  EXPECT_EQ(means, 1);
  // Only where the arguments are the same: a mean over other dims is new.
  ir::GraphBuilder other("other");
  ir::ValueId y = other.AddInput(Meta({8, 4}, true), v1::Placeholder::USER_INPUT, "y");
  ir::ValueId m0 = Op(other, "aten.mean.dim", {Ref(y), ir::Ints({0}), ir::Bool(true)});
  EXPECT_EQ(
      other.FindNode("aten.mean.dim", {Ref(y), ir::Ints({0}), ir::Bool(true)}, {})->outputs[0], m0);
  EXPECT_EQ(other.FindNode("aten.mean.dim", {Ref(y), ir::Ints({1}), ir::Bool(true)}, {}), nullptr);
  EXPECT_EQ(other.FindNode("aten.mean.dim", {Ref(y), ir::Ints({0}), ir::Bool(false)}, {}), nullptr);
}

}  // namespace
}  // namespace kiln::autograd
