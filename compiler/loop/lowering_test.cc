// Lowering and fusion, structurally: how many kernels, what is fused, what
// stays extern, what the plan allocates and frees. (Numbers are checked
// against the reference interpreter in client/runtime/kiln_backend_test.cc.)
#include "compiler/loop/lowering.h"

#include <gtest/gtest.h>

#include "absl/strings/str_join.h"
#include "compiler/ir/builder.h"
#include "compiler/loop/kernel.h"

namespace kiln::loop {
namespace {

using ir::Ref;

ir::TensorMeta Meta(std::vector<int64_t> sizes, v1::DType dtype = v1::FLOAT32) {
  return ir::ContiguousMeta(sizes, dtype);
}

ir::ValueId Op(ir::GraphBuilder& b, const std::string& target, std::vector<ir::Argument> args,
               std::vector<ir::Argument> kwargs = {}, int output = 0) {
  auto out = ops::Emit(b, ops::DefaultRegistry(), target, std::move(args), std::move(kwargs));
  EXPECT_TRUE(out.ok()) << target << ": " << out.status();
  return out.ok() ? (*out)[output] : ir::kNoValue;
}

LoweredGraph Lower(const ir::Graph& g) {
  auto l = LowerGraph(g);
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? *std::move(l) : LoweredGraph{};
}

int Count(const v1::ExecutionPlan& plan, v1::PlanStep::KindCase kind) {
  int n = 0;
  for (const auto& s : plan.steps()) n += s.kind_case() == kind;
  return n;
}

LoweredGraph LayerNorm(const ir::TensorMeta& x_meta) {
  const ir::SymInt d = x_meta.sizes.back();
  ir::GraphBuilder b("ln");
  ir::ValueId x = b.AddInput(x_meta, v1::Placeholder::USER_INPUT, "x");
  ir::TensorMeta p = Meta({1});
  p.sizes = {d};
  ir::ValueId w = b.AddInput(p, v1::Placeholder::PARAMETER, "w");
  ir::ValueId bias = b.AddInput(p, v1::Placeholder::PARAMETER, "b");
  b.AddOutput(Op(
      b, "aten.native_layer_norm.default",
      {Ref(x), ir::Argument{"", std::vector<ir::SymInt>{d}}, Ref(w), Ref(bias), ir::Float(1e-5)}));
  return Lower(std::move(b).Build());
}

// The reductions of a kernel, in order.
// Every buffer the plan allocates holds fewer than `whole` elements: no
// whole-space intermediate is written.
void ExpectAllocationsSmallerThan(const LoweredGraph& l, int64_t whole) {
  for (const auto& step : l.plan.steps()) {
    if (step.kind_case() != v1::PlanStep::kAlloc) continue;
    int64_t n = 1;
    for (const auto& size : step.alloc().sizes()) n *= size.int_value();
    EXPECT_LT(n, whole) << step.alloc().value() << " is a whole-space intermediate\n"
                        << PrintLowered(l);
  }
}

std::vector<ReduceOp> Reductions(const Kernel& k) {
  std::vector<ReduceOp> ops;
  for (const Stmt& s : k.stmts) {
    if (s.kind == StmtKind::kReduce) ops.push_back(s.reduce);
  }
  return ops;
}

TEST(LoweringTest, LayerNormForwardIsOneKernel) {
  LoweredGraph l = LayerNorm(Meta({16, 64}));
  ASSERT_EQ(l.kernels.size(), 1u) << PrintLowered(l);
  // A short contiguous row: its sum, its squared deviations from the mean
  // (read again from cache), then the normalized store.
  EXPECT_EQ(l.kernels[0].passes, 3);
  EXPECT_EQ(Reductions(l.kernels[0]), (std::vector<ReduceOp>{ReduceOp::kSum, ReduceOp::kSum}));
  EXPECT_EQ(Count(l.plan, v1::PlanStep::kExternCall), 0);
}

TEST(LoweringTest, LongOrStridedOrSymbolicRowsKeepWelford) {
  const std::vector<ReduceOp> welford = {ReduceOp::kWelfordMean, ReduceOp::kWelfordM2};
  ir::TensorMeta transposed = Meta({64, 16});
  transposed.sizes = {ir::SymInt{int64_t{16}}, ir::SymInt{int64_t{64}}};
  transposed.strides = {ir::SymInt{int64_t{1}}, ir::SymInt{int64_t{16}}};
  ir::TensorMeta symbolic = Meta({4, 1});
  symbolic.sizes[1] = ir::SymInt{std::string("s0")};
  symbolic.strides[0] = ir::SymInt{std::string("s0")};
  for (const auto& [name, meta] : std::vector<std::pair<std::string, ir::TensorMeta>>{
           {"long", Meta({2, 16385})}, {"transposed", transposed}, {"symbolic", symbolic}}) {
    LoweredGraph l = LayerNorm(meta);
    ASSERT_EQ(l.kernels.size(), 1u) << name << "\n" << PrintLowered(l);
    EXPECT_EQ(l.kernels[0].passes, 2) << name;  // Welford, then normalize
    // (A symbolic row also counts its elements with a sum.)
    std::vector<ReduceOp> got = Reductions(l.kernels[0]);
    got.resize(2);
    EXPECT_EQ(got, welford) << name;
  }
}

TEST(LoweringTest, SoftmaxIsOneKernelInThreePasses) {
  ir::GraphBuilder b("softmax");
  ir::ValueId x = b.AddInput(Meta({8, 128}), v1::Placeholder::USER_INPUT, "x");
  b.AddOutput(Op(b, "aten._softmax.default", {Ref(x), ir::Int(-1), ir::Bool(false)}));
  LoweredGraph l = Lower(std::move(b).Build());
  ASSERT_EQ(l.kernels.size(), 1u) << PrintLowered(l);
  EXPECT_EQ(l.kernels[0].passes, 3);
}

// By default a float32 softmax keeps its exps in the output, storing it
// twice and reading it back once; with keep_in_output off (a GPU's policy)
// the output is written once and never read.
TEST(LoweringTest, SoftmaxKeepsItsExpsInTheOutputOnlyWhenThePolicySaysSo) {
  for (bool keep : {true, false}) {
    ir::GraphBuilder b("softmax");
    ir::ValueId x = b.AddInput(Meta({8, 128}), v1::Placeholder::USER_INPUT, "x");
    b.AddOutput(Op(b, "aten._softmax.default", {Ref(x), ir::Int(-1), ir::Bool(false)}));
    FusionPolicy policy;
    policy.keep_in_output = keep;
    auto l = LowerGraph(std::move(b).Build(), ops::DefaultRegistry(), policy);
    ASSERT_TRUE(l.ok()) << l.status();
    ASSERT_EQ(l->kernels.size(), 1u) << PrintLowered(*l);
    const Kernel& k = l->kernels[0];
    int stores = 0, output_loads = 0;
    for (const Stmt& s : k.stmts) {
      if (s.kind == StmtKind::kStore) ++stores;
      if (s.kind == StmtKind::kLoad && k.buffers[s.buffer].written) ++output_loads;
    }
    EXPECT_EQ(stores, keep ? 2 : 1) << PrintLowered(*l);
    EXPECT_EQ(output_loads, keep ? 1 : 0) << PrintLowered(*l);
  }
}

TEST(LoweringTest, GeluChainAfterMatmulIsOneKernel) {
  ir::GraphBuilder b("mm_gelu");
  ir::ValueId x = b.AddInput(Meta({8, 32}), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId w = b.AddInput(Meta({32, 64}), v1::Placeholder::PARAMETER, "w");
  ir::ValueId bias = b.AddInput(Meta({64}), v1::Placeholder::PARAMETER, "b");
  ir::ValueId h = Op(b, "aten.mm.default", {Ref(x), Ref(w)});
  h = Op(b, "aten.add.Tensor", {Ref(h), Ref(bias)});
  h = Op(b, "aten.gelu.default", {Ref(h)});
  h = Op(b, "aten.mul.Scalar", {Ref(h), ir::Float(2.0)});
  b.AddOutput(h);
  LoweredGraph l = Lower(std::move(b).Build());
  EXPECT_EQ(l.kernels.size(), 1u) << PrintLowered(l);
  EXPECT_EQ(Count(l.plan, v1::PlanStep::kExternCall), 1);  // the matmul
  // Only the final value is stored: the chain stays in registers.
  EXPECT_EQ(Count(l.plan, v1::PlanStep::kAlloc), 1);
}

TEST(LoweringTest, SiblingsShareAKernel) {
  ir::GraphBuilder b("siblings");
  ir::ValueId x = b.AddInput(Meta({4, 32}), v1::Placeholder::USER_INPUT, "x");
  b.AddOutput(Op(b, "aten.exp.default", {Ref(x)}));
  b.AddOutput(Op(b, "aten.sin.default", {Ref(x)}));
  LoweredGraph l = Lower(std::move(b).Build());
  ASSERT_EQ(l.kernels.size(), 1u) << PrintLowered(l);
  EXPECT_EQ(l.kernels[0].buffers.size(), 3u);  // x read once, two outputs
}

TEST(LoweringTest, ViewsNeverCopy) {
  ir::GraphBuilder b("views");
  ir::ValueId x = b.AddInput(Meta({8, 16}), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId t = Op(b, "aten.permute.default", {Ref(x), ir::Ints({1, 0})});
  b.AddOutput(Op(b, "aten.relu.default", {Ref(t)}));
  LoweredGraph l = Lower(std::move(b).Build());
  ASSERT_EQ(l.kernels.size(), 1u);
  // The kernel reads x's storage through the transposed strides.
  EXPECT_EQ(l.kernels[0].buffers[0].value, "x");
  EXPECT_EQ(Count(l.plan, v1::PlanStep::kView), 0);
  bool transposed = false;
  for (const auto& s : l.kernels[0].stmts) {
    if (s.kind == StmtKind::kLoad) {
      transposed = s.index.inner_strides[0] == ir::SymInt{int64_t{16}};
    }
  }
  EXPECT_TRUE(transposed) << PrintKernel(l.kernels[0]);
}

TEST(LoweringTest, ExternOutputsFeedLaterKernelsAndBuffersAreReused) {
  // relu(x) -> mm -> relu -> mm -> relu: kernels between externs (one
  // kernel's code, launched three times); the first activation is dead once
  // the first mm ran, so the third reuses it.
  ir::GraphBuilder b("stack");
  ir::ValueId x = b.AddInput(Meta({16, 16}), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId w = b.AddInput(Meta({16, 16}), v1::Placeholder::PARAMETER, "w");
  ir::ValueId h = Op(b, "aten.relu.default", {Ref(x)});
  h = Op(b, "aten.mm.default", {Ref(h), Ref(w)});
  h = Op(b, "aten.relu.default", {Ref(h)});
  h = Op(b, "aten.mm.default", {Ref(h), Ref(w)});
  b.AddOutput(Op(b, "aten.relu.default", {Ref(h)}));
  LoweredGraph l = Lower(std::move(b).Build());
  EXPECT_EQ(l.kernels.size(), 1u) << PrintLowered(l);
  EXPECT_EQ(Count(l.plan, v1::PlanStep::kLaunch), 3);
  EXPECT_EQ(Count(l.plan, v1::PlanStep::kExternCall), 2);
  EXPECT_GE(Count(l.plan, v1::PlanStep::kFree), 1);
  bool reused = false;
  for (const auto& s : l.plan.steps()) reused |= s.has_alloc() && !s.alloc().reuse().empty();
  EXPECT_TRUE(reused) << l.plan.DebugString();
}

TEST(LoweringTest, ReductionWithPrologueAndEpilogue) {
  // sum((x * 2) ^ 2, -1) * 0.5: prologue, reduction, per-row epilogue.
  ir::GraphBuilder b("norm");
  ir::ValueId x = b.AddInput(Meta({8, 64}), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId y = Op(b, "aten.mul.Scalar", {Ref(x), ir::Float(2.0)});
  y = Op(b, "aten.pow.Tensor_Scalar", {Ref(y), ir::Float(2.0)});
  y = Op(b, "aten.sum.dim_IntList", {Ref(y), ir::Ints({-1}), ir::Bool(true)});
  b.AddOutput(Op(b, "aten.mul.Scalar", {Ref(y), ir::Float(0.5)}));
  LoweredGraph l = Lower(std::move(b).Build());
  ASSERT_EQ(l.kernels.size(), 1u) << PrintLowered(l);
  EXPECT_EQ(l.kernels[0].passes, 1);
}

TEST(LoweringTest, AReshapeDoesNotStopFusion) {
  // gelu over [2, 8, 16], viewed as [16, 16], summed over the rows (a bias
  // gradient): one kernel over [16, 16] in which the gelu is never stored.
  ir::GraphBuilder b("bias_grad");
  ir::ValueId x = b.AddInput(Meta({2, 8, 16}), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId g = Op(b, "aten.gelu.default", {Ref(x)});
  ir::ValueId v = Op(b, "aten.view.default", {Ref(g), ir::Ints({16, 16})});
  b.AddOutput(Op(b, "aten.sum.dim_IntList", {Ref(v), ir::Ints({0}), ir::Bool(false)}));
  LoweredGraph l = Lower(std::move(b).Build());
  ASSERT_EQ(l.kernels.size(), 1u) << PrintLowered(l);
  EXPECT_EQ(Count(l.plan, v1::PlanStep::kAlloc), 1);  // the sum only
  const std::string all = absl::StrJoin(l.decisions, "\n");
  EXPECT_NE(all.find("reshape: kernel_0 from [2, 8, 16] to [16, 16]"), std::string::npos) << all;
}

// An RMS norm's backward: the weight's gradient reduces over the rows, the
// input's over each row, both from the same products of the upstream
// gradient. The products are computed again in the row kernel rather than
// stored by the column kernel, and what follows the row sum (the input's
// gradient, through a broadcast of it) stays in the row kernel: two kernels
// over the whole space, and no whole-space intermediate in memory.
TEST(LoweringTest, PointwiseValuesAreRecomputedWhereStoringThemWouldSplitKernels) {
  ir::GraphBuilder b("rms_backward");
  ir::ValueId x = b.AddInput(Meta({16, 64}), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId w = b.AddInput(Meta({64}), v1::Placeholder::PARAMETER, "w");
  ir::ValueId r = b.AddInput(Meta({16, 1}), v1::Placeholder::USER_INPUT, "rstd");
  ir::ValueId g = b.AddInput(Meta({16, 64}), v1::Placeholder::USER_INPUT, "grad");
  ir::ValueId gw = Op(b, "aten.mul.Tensor", {Ref(g), Ref(w)});
  ir::ValueId xr = Op(b, "aten.mul.Tensor", {Ref(x), Ref(r)});
  ir::ValueId dw =
      Op(b, "aten.sum.dim_IntList",
         {Ref(Op(b, "aten.mul.Tensor", {Ref(g), Ref(xr)})), ir::Ints({0}), ir::Bool(false)});
  ir::ValueId gwx = Op(b, "aten.mul.Tensor", {Ref(gw), Ref(x)});
  ir::ValueId row = Op(b, "aten.sum.dim_IntList", {Ref(gwx), ir::Ints({1}), ir::Bool(true)});
  ir::ValueId wide = Op(b, "aten.expand.default", {Ref(row), ir::Ints({16, 64})});
  ir::ValueId dx = Op(b, "aten.add.Tensor",
                      {Ref(Op(b, "aten.mul.Tensor", {Ref(gw), Ref(r)})),
                       Ref(Op(b, "aten.mul.Tensor", {Ref(wide), Ref(x)}))});
  b.AddOutput(dw);
  b.AddOutput(dx);
  LoweredGraph l = Lower(std::move(b).Build());
  ASSERT_EQ(l.kernels.size(), 2u) << PrintLowered(l);
  const std::string all = absl::StrJoin(l.decisions, "\n");
  EXPECT_NE(all.find("recompute: "), std::string::npos) << all;
  // Allocations: the two gradients and the row sums (the broadcast's base).
  for (const auto& step : l.plan.steps()) {
    if (step.kind_case() != v1::PlanStep::kAlloc) continue;
    int64_t n = 1;
    for (const auto& s : step.alloc().sizes()) n *= s.int_value();
    EXPECT_TRUE(step.alloc().value() == l.plan.outputs(0) ||
                step.alloc().value() == l.plan.outputs(1) || n == 16)
        << step.alloc().value() << " is a whole-space intermediate\n"
        << PrintLowered(l);
  }
}

// A per-channel value that no reduction of its kernel precedes (a batch
// norm's rsqrt of the variance it loads) is computed before the sweep, and
// whole-space values read it in the same pass: the channel's gradient sums
// and the input's gradient take two passes, not three.
TEST(LoweringTest, PerRowValuesOfLoadsAreReadInTheirOwnPass) {
  ir::GraphBuilder b("bn_backward");
  ir::ValueId x = b.AddInput(Meta({8, 4, 16, 16}), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId var = b.AddInput(Meta({1, 4, 1, 1}), v1::Placeholder::USER_INPUT, "var");
  ir::ValueId g = b.AddInput(Meta({8, 4, 16, 16}), v1::Placeholder::USER_INPUT, "grad");
  ir::ValueId r =
      Op(b, "aten.rsqrt.default", {Ref(Op(b, "aten.add.Scalar", {Ref(var), ir::Float(1e-5)}))});
  ir::ValueId a = Op(b, "aten.mul.Tensor", {Ref(g), Ref(r)});
  ir::ValueId s =
      Op(b, "aten.sum.dim_IntList",
         {Ref(Op(b, "aten.mul.Tensor", {Ref(a), Ref(x)})), ir::Ints({0, 2, 3}), ir::Bool(true)});
  b.AddOutput(Op(b, "aten.sub.Tensor", {Ref(a), Ref(Op(b, "aten.mul.Tensor", {Ref(x), Ref(s)}))}));
  LoweredGraph l = Lower(std::move(b).Build());
  // The rsqrt's own kernel ([1, 4, 1, 1]) stores nothing: the kernel over
  // the channels computes it again, once per channel, before its sweeps.
  ASSERT_EQ(l.kernels.size(), 1u) << PrintLowered(l);
  const Kernel& k = l.kernels[0];
  EXPECT_EQ(Reductions(k).size(), 1u) << PrintLowered(l);
  EXPECT_EQ(k.passes, 2) << PrintLowered(l);
  int rsqrts = 0;
  for (const Stmt& s : k.stmts) {
    if (s.kind != StmtKind::kOp || s.op != ScalarOp::kRsqrt) continue;
    ++rsqrts;
    EXPECT_FALSE(s.inner) << PrintKernel(k);
  }
  EXPECT_EQ(rsqrts, 1) << PrintKernel(k);
}

// A cheap pointwise value is recomputed through a small operand that another
// kernel computes (a batch norm's per-channel scale): the kernel reducing
// over other dims computes the normalized input again from the input
// rather than reading it, and no whole-space intermediate is stored.
TEST(LoweringTest, RecomputationReadsSmallOperandsOfOtherKernels) {
  ir::GraphBuilder b("bn_two_sums");
  ir::ValueId x = b.AddInput(Meta({8, 4, 16, 16}), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId var = b.AddInput(Meta({1, 4, 1, 1}), v1::Placeholder::USER_INPUT, "var");
  ir::ValueId g = b.AddInput(Meta({8, 4, 16, 16}), v1::Placeholder::USER_INPUT, "grad");
  ir::ValueId r =
      Op(b, "aten.rsqrt.default", {Ref(Op(b, "aten.add.Scalar", {Ref(var), ir::Float(1e-5)}))});
  b.AddOutput(r);
  ir::ValueId y = Op(b, "aten.relu.default", {Ref(Op(b, "aten.mul.Tensor", {Ref(x), Ref(r)}))});
  ir::ValueId gy = Op(b, "aten.mul.Tensor", {Ref(g), Ref(y)});
  b.AddOutput(Op(b, "aten.sum.dim_IntList", {Ref(gy), ir::Ints({2, 3}), ir::Bool(true)}));
  b.AddOutput(Op(b, "aten.sum.dim_IntList", {Ref(gy), ir::Ints({0, 2, 3}), ir::Bool(true)}));
  LoweredGraph l = Lower(std::move(b).Build());
  const std::string all = absl::StrJoin(l.decisions, "\n");
  EXPECT_NE(all.find("recompute: "), std::string::npos) << all;
  ExpectAllocationsSmallerThan(l, 8 * 4 * 16 * 16);
}

// x.float() opens a kernel; a per-row value of another input opens a
// second; their product cannot read the second's result in the first (it
// is made after it), and computes the per-row value again there, for each
// element. The second kernel then stores nothing and is not launched.
TEST(LoweringTest, AKernelThatStoresNothingIsNotLaunched) {
  ir::GraphBuilder b("dead");
  ir::ValueId x = b.AddInput(Meta({16, 64}, v1::BFLOAT16), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId s = b.AddInput(Meta({16, 1}), v1::Placeholder::USER_INPUT, "s");
  ir::ValueId wide = Op(b, "aten._to_copy.default", {Ref(x)},
                        {ir::Argument{"dtype", ir::Argument::Kind{v1::FLOAT32}}});
  ir::ValueId m = Op(b, "aten.add.Scalar", {Ref(s), ir::Float(1.0)});
  b.AddOutput(Op(b, "aten.mul.Tensor", {Ref(wide), Ref(m)}));
  LoweredGraph l = Lower(std::move(b).Build());
  const std::string all = absl::StrJoin(l.decisions, "\n");
  EXPECT_NE(all.find("drop: kernel_1 stores nothing"), std::string::npos) << all;
  ASSERT_EQ(l.kernels.size(), 1u) << PrintLowered(l);
  EXPECT_EQ(l.kernels[0].name, "kernel_0");
  bool stores = false;
  for (const KernelBuffer& buf : l.kernels[0].buffers) stores = stores || buf.written;
  EXPECT_TRUE(stores);
  EXPECT_EQ(Count(l.plan, v1::PlanStep::kLaunch), 1);
}

// A batch norm in training whose normalized output only a mean over the
// spatial dims reads (the head of a conv net): the mean's kernel computes
// the output again from the input and the saved statistics, so the batch
// norm's kernel stores only its statistics, and no whole-space tensor is
// written. Its sweep that applied the norm is not emitted, and splitting
// its sums over the batch makes no kernel for it.
TEST(LoweringTest, ANormOutputReadOnlyByAnotherReductionIsNotStored) {
  ir::GraphBuilder b("bn_then_pool");
  ir::ValueId x = b.AddInput(Meta({128, 8, 64, 64}), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId var = Op(b, "aten.var.correction", {Ref(x), ir::Ints({0, 2, 3})},
                       {ir::Argument{"correction", ir::Argument::Kind{int64_t{0}}},
                        ir::Argument{"keepdim", ir::Argument::Kind{true}}});
  ir::ValueId mean = Op(b, "aten.mean.dim", {Ref(x), ir::Ints({0, 2, 3}), ir::Bool(true)});
  ir::ValueId r =
      Op(b, "aten.rsqrt.default", {Ref(Op(b, "aten.add.Scalar", {Ref(var), ir::Float(1e-5)}))});
  ir::ValueId y = Op(b, "aten.relu.default",
                     {Ref(Op(b, "aten.mul.Tensor",
                             {Ref(Op(b, "aten.sub.Tensor", {Ref(x), Ref(mean)})), Ref(r)}))});
  b.AddOutput(Op(b, "aten.mean.dim", {Ref(y), ir::Ints({2, 3})}));
  b.AddOutput(mean);
  b.AddOutput(var);
  LoweredGraph l = Lower(std::move(b).Build());
  const std::string all = absl::StrJoin(l.decisions, "\n");
  EXPECT_NE(all.find("recompute: "), std::string::npos) << all;
  ExpectAllocationsSmallerThan(l, 128 * 8 * 64 * 64);
  for (const Kernel& k : l.kernels) {
    EXPECT_EQ(k.name.find("_apply"), std::string::npos) << PrintLowered(l);
    for (const Stmt& s : k.stmts) {
      for (int a : s.args) EXPECT_LT(a, static_cast<int>(k.stmts.size())) << k.name;
    }
  }
}

TEST(LoweringTest, EveryDecisionIsRecorded) {
  ir::GraphBuilder b("mixed");
  ir::ValueId x = b.AddInput(Meta({4, 8}), v1::Placeholder::USER_INPUT, "x");
  ir::ValueId w = b.AddInput(Meta({8, 4}), v1::Placeholder::USER_INPUT, "w");
  ir::ValueId h = Op(b, "aten.relu.default", {Ref(x)});
  ir::ValueId m = Op(b, "aten.mm.default", {Ref(h), Ref(w)});
  b.AddOutput(Op(b, "aten.sum.dim_IntList", {Ref(m), ir::Ints({0}), ir::Bool(false)}));
  LoweredGraph l = Lower(std::move(b).Build());
  const std::string all = absl::StrJoin(l.decisions, "\n");
  EXPECT_NE(all.find("extern: "), std::string::npos) << all;
  EXPECT_NE(all.find("new kernel_0"), std::string::npos) << all;
  EXPECT_NE(all.find("not fused"), std::string::npos) << all;  // the sum's space differs
}

TEST(ScalarOps, NamesParseBackAndTheTableIsInEnumOrder) {
  int k = 0;
  for (const ScalarOpInfo& info : ScalarOps()) {
    EXPECT_EQ(static_cast<int>(info.op), k++);
    EXPECT_EQ(ScalarOpName(info.op), std::string(info.name));
    EXPECT_EQ(FindScalarOp(info.op), &info);
    EXPECT_EQ(ParseScalarOp(info.name), info.op) << info.name;
  }
  EXPECT_EQ(k, static_cast<int>(ScalarOp::kCast) + 1);
  EXPECT_EQ(ParseScalarOp("frobnicate"), std::nullopt);
  EXPECT_EQ(ParseScalarOp(""), std::nullopt);
  EXPECT_EQ(FindScalarOp(static_cast<ScalarOp>(k)), nullptr);
  EXPECT_EQ(std::string(ScalarOpName(static_cast<ScalarOp>(k))), "?");
  EXPECT_EQ(FindScalarOp(ScalarOp::kDiv)->arity, 2);
  EXPECT_TRUE(FindScalarOp(ScalarOp::kDiv)->needs_float);
  EXPECT_EQ(FindScalarOp(ScalarOp::kWhere)->arity, 3);
  EXPECT_FALSE(FindScalarOp(ScalarOp::kCast)->needs_float);
}

}  // namespace
}  // namespace kiln::loop
