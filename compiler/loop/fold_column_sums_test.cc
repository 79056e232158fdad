// Pass "fold-column-sums" on a norm layer's backward: the weight
// gradient's sum over rows joins the row kernel that computes the input
// gradient, and the kernels it makes compile under NVRTC for sm_90 (the
// GPU suite, tests/gpu, runs them against eager).
#include "compiler/loop/fold_column_sums.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "compiler/codegen/codegen.h"
#include "compiler/ir/builder.h"
#include "compiler/loop/kernel_parser.h"
#include "compiler/loop/lowering.h"
#include "compiler/loop/split_reductions.h"
#include "compiler/pipeline/rewrite_test_util.h"

namespace kiln::loop {
namespace {

using ir::Ref;
using pipeline::Op;

// An RMS norm's backward over [rows, cols] in `dtype`: dx row by row (a
// row sum, then a pass over the row), dw = sum over the rows of dy * x * r.
// With `product`, dy * x * r * 2 is an output too: the column kernel
// stores it in its sweep, and the row kernel takes the store. With
// `saved_mean`, r is computed as the forward saves it for the backward:
// rsqrt(mean + eps) of a float32 mean of squares, rounded to `dtype`.
LoweredGraph NormBackward(int64_t rows, int64_t cols, v1::DType dtype, bool product = false,
                          bool saved_mean = false) {
  ir::GraphBuilder b("norm_backward");
  const ir::ValueId x =
      b.AddInput(ir::ContiguousMeta({rows, cols}, dtype), v1::Placeholder::USER_INPUT, "x");
  const ir::ValueId dy =
      b.AddInput(ir::ContiguousMeta({rows, cols}, dtype), v1::Placeholder::USER_INPUT, "dy");
  const ir::ValueId w =
      b.AddInput(ir::ContiguousMeta({cols}, dtype), v1::Placeholder::PARAMETER, "w");
  ir::ValueId r = ir::kNoValue;
  if (saved_mean) {
    const ir::ValueId mean =
        b.AddInput(ir::ContiguousMeta({rows, 1}, v1::FLOAT32), v1::Placeholder::USER_INPUT, "mean");
    r = Op(b, "aten._to_copy.default",
           {Ref(Op(b, "aten.rsqrt.default",
                   {Ref(Op(b, "aten.add.Scalar", {Ref(mean), ir::Float(1e-6)}))}))},
           {ir::Argument{"dtype", ir::Argument::Kind{dtype}}});
  } else {
    r = b.AddInput(ir::ContiguousMeta({rows, 1}, dtype), v1::Placeholder::USER_INPUT, "r");
  }
  const ir::ValueId a = Op(b, "aten.mul.Tensor", {Ref(dy), Ref(w)});
  const ir::ValueId s =
      Op(b, "aten.sum.dim_IntList",
         {Ref(Op(b, "aten.mul.Tensor", {Ref(a), Ref(x)})), ir::Ints({1}), ir::Bool(true)});
  const ir::ValueId dx = Op(b, "aten.sub.Tensor",
                            {Ref(Op(b, "aten.mul.Tensor", {Ref(a), Ref(r)})),
                             Ref(Op(b, "aten.mul.Tensor", {Ref(x), Ref(s)}))});
  const ir::ValueId xr = Op(b, "aten.mul.Tensor", {Ref(x), Ref(r)});
  const ir::ValueId g = Op(b, "aten.mul.Tensor", {Ref(dy), Ref(xr)});
  const ir::ValueId dw = Op(b, "aten.sum.dim_IntList", {Ref(g), ir::Ints({0}), ir::Bool(false)});
  b.AddOutput(dx);
  b.AddOutput(dw);
  if (product) b.AddOutput(Op(b, "aten.mul.Scalar", {Ref(g), ir::Float(2.0)}));
  ir::Graph graph = std::move(b).Build();
  v1::Graph proto = graph.ToProto();
  ir::MoveTensors(&proto, "cuda", 0);
  absl::StatusOr<ir::Graph> on_gpu = ir::Graph::FromProto(proto);
  EXPECT_TRUE(on_gpu.ok()) << on_gpu.status();
  auto lowered = LowerGraph(*on_gpu);
  EXPECT_TRUE(lowered.ok()) << lowered.status();
  return lowered.ok() ? *std::move(lowered) : LoweredGraph{};
}

ColumnSumPolicy Groups(int64_t groups) {
  ColumnSumPolicy policy;
  policy.groups = [groups](const Kernel&) { return groups; };
  return policy;
}

std::vector<std::string> Steps(const v1::ExecutionPlan& plan) {
  std::vector<std::string> out;
  for (const v1::PlanStep& s : plan.steps()) {
    if (s.has_launch()) out.push_back("launch " + s.launch().symbol());
    if (s.has_alloc()) out.push_back("alloc " + s.alloc().value());
  }
  return out;
}

std::unique_ptr<codegen::CodegenBackend> Cuda() {
  codegen::CudaOptions options;
  options.sm_arch = "sm_90";
  return codegen::MakeCudaBackend(options);
}

// Every value a launch names is an input or defined by an earlier step.
void ExpectDefinedBeforeUse(const v1::ExecutionPlan& plan) {
  std::set<std::string> defined;
  for (const v1::Placeholder& p : plan.inputs()) defined.insert(p.value().name());
  for (int i = 0; i < plan.steps_size(); ++i) {
    const v1::PlanStep& s = plan.steps(i);
    if (s.has_alloc()) defined.insert(s.alloc().value());
    if (s.has_view()) defined.insert(s.view().value());
    if (!s.has_launch()) continue;
    for (const std::string& b : s.launch().buffers()) {
      EXPECT_TRUE(defined.count(b) > 0) << "step " << i << " (" << s.launch().symbol() << ") reads "
                                        << b << " before it is defined";
    }
  }
}

TEST(FoldColumnSums, TheWeightGradientJoinsTheRowKernel) {
  for (v1::DType dtype : {v1::FLOAT32, v1::BFLOAT16}) {
    SCOPED_TRACE(v1::DType_Name(dtype));
    LoweredGraph lowered = NormBackward(2048, 1024, dtype);
    ASSERT_EQ(lowered.kernels.size(), 2u) << PrintLowered(lowered);
    FoldColumnSums(Groups(16), &lowered);
    const std::string decisions = absl::StrJoin(lowered.decisions, "\n");
    ASSERT_TRUE(absl::StrContains("\n" + decisions, "\nfold: ")) << decisions;
    ASSERT_EQ(lowered.kernels.size(), 2u);
    // The row kernel, then the finishing kernel over the 16 groups.
    const Kernel& rows = lowered.kernels[0];
    const Kernel& finish = lowered.kernels[1];
    EXPECT_EQ(rows.row_groups, 16);
    EXPECT_EQ(rows.outer, std::vector<ir::SymInt>{ir::SymInt{2048}});
    EXPECT_EQ(finish.outer, std::vector<ir::SymInt>{ir::SymInt{1024}});
    EXPECT_EQ(finish.inner, std::vector<ir::SymInt>{ir::SymInt{16}});
    int accumulates = 0;
    for (const Stmt& s : rows.stmts) {
      if (s.kind != StmtKind::kAccumulate) continue;
      ++accumulates;
      EXPECT_EQ(s.pass, rows.passes - 1);
      EXPECT_EQ(s.dtype, v1::FLOAT32);  // summed in float32, whatever the inputs
      EXPECT_EQ(s.index.outer_strides, std::vector<ir::SymInt>{ir::SymInt{1024}});
    }
    EXPECT_EQ(accumulates, 1) << PrintKernel(rows);
    // The row kernel reads x and dy once: the sum's loads are its own.
    int loads_of_x = 0;
    for (const Stmt& s : rows.stmts) {
      loads_of_x += s.kind == StmtKind::kLoad && rows.buffers[s.buffer].value == "x";
    }
    EXPECT_LE(loads_of_x, rows.passes + 1) << PrintKernel(rows);
    // The partials are allocated before the row kernel, which the
    // finishing kernel follows.
    const std::vector<std::string> steps = Steps(lowered.plan);
    const std::string text = absl::StrJoin(steps, ", ");
    const auto at = [&](const std::string& step) {
      return std::find(steps.begin(), steps.end(), step) - steps.begin();
    };
    const std::string partial = finish.buffers.back().value;
    EXPECT_LT(at("alloc " + partial), at("launch " + rows.name)) << text;
    ASSERT_GT(at("launch " + finish.name), at("launch " + rows.name)) << text;
    for (auto i = at("launch " + rows.name) + 1; i < at("launch " + finish.name); ++i) {
      EXPECT_TRUE(absl::StartsWith(steps[i], "alloc ")) << text;
    }
    ExpectDefinedBeforeUse(lowered.plan);
    // Printed and parsed back, the same.
    for (const Kernel& k : lowered.kernels) {
      absl::StatusOr<Kernel> parsed = ParseKernel(PrintKernel(k));
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_EQ(PrintKernel(*parsed), PrintKernel(k));
    }
    // Generated, launched on 16 blocks, and compiled.
    auto backend = Cuda();
    auto launch = backend->Launch(rows);
    ASSERT_TRUE(launch.ok()) << launch.status();
    EXPECT_EQ(launch->grid, ir::SymInt{16});
    auto source = backend->Generate(lowered.kernels, lowered.symbols);
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_TRUE(absl::StrContains(*source, "] += ")) << *source;
    auto module = backend->Compile(*source);
    ASSERT_TRUE(module.ok()) << module.status();
  }
}

TEST(FoldColumnSums, WhatTheColumnSweepStoresTheRowKernelStores) {
  LoweredGraph lowered = NormBackward(2048, 1024, v1::FLOAT32, /*product=*/true);
  FoldColumnSums(Groups(16), &lowered);
  const std::string decisions = absl::StrJoin(lowered.decisions, "\n");
  ASSERT_TRUE(absl::StrContains("\n" + decisions, "\nfold: ")) << PrintLowered(lowered);
  ExpectDefinedBeforeUse(lowered.plan);
  int stores = 0;
  for (const Kernel& k : lowered.kernels) {
    if (k.row_groups == 0) continue;
    for (const Stmt& s : k.stmts) stores += s.kind == StmtKind::kStore && s.inner;
  }
  EXPECT_GE(stores, 2) << PrintLowered(lowered);  // dx and the product
  auto backend = Cuda();
  auto source = backend->Generate(lowered.kernels, lowered.symbols);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE(backend->Compile(*source).ok());
}

// The rsqrt of the saved mean is computed where it is read, in the row
// kernel (once per row) and in the column kernel (for each element), rather
// than in a kernel of its own between them: that kernel would store it
// after the row kernel runs, and the column sums could not join it.
TEST(FoldColumnSums, TheRsqrtOfTheSavedMeanDoesNotStopTheFold) {
  for (v1::DType dtype : {v1::FLOAT32, v1::BFLOAT16}) {
    SCOPED_TRACE(v1::DType_Name(dtype));
    LoweredGraph lowered = NormBackward(2048, 1024, dtype, /*product=*/false, /*saved_mean=*/true);
    ASSERT_EQ(lowered.kernels.size(), 2u) << PrintLowered(lowered);
    FoldColumnSums(Groups(16), &lowered);
    const std::string decisions = absl::StrJoin(lowered.decisions, "\n");
    EXPECT_TRUE(absl::StrContains(decisions, "stores nothing")) << decisions;
    ASSERT_TRUE(absl::StrContains("\n" + decisions, "\nfold: ")) << decisions;
    ASSERT_EQ(lowered.kernels.size(), 2u);
    const Kernel& rows = lowered.kernels[0];
    EXPECT_EQ(rows.row_groups, 16);
    // The row kernel takes its rsqrt once per row, outside the sweeps.
    int rsqrts = 0;
    for (const Stmt& st : rows.stmts) {
      if (st.kind != StmtKind::kOp || st.op != ScalarOp::kRsqrt) continue;
      ++rsqrts;
      EXPECT_FALSE(st.inner) << PrintKernel(rows);
    }
    EXPECT_GE(rsqrts, 1) << PrintKernel(rows);
    ExpectDefinedBeforeUse(lowered.plan);
    auto backend = Cuda();
    auto source = backend->Generate(lowered.kernels, lowered.symbols);
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_TRUE(backend->Compile(*source).ok());
  }
}

TEST(FoldColumnSums, ATargetThatCannotTakeItLeavesBothKernels) {
  LoweredGraph lowered = NormBackward(2048, 1024, v1::FLOAT32);
  const std::string before = PrintLowered(lowered);
  FoldColumnSums(Groups(0), &lowered);
  const std::string decisions = absl::StrJoin(lowered.decisions, "\n");
  EXPECT_TRUE(absl::StrContains(decisions, "cannot take it")) << decisions;
  EXPECT_FALSE(absl::StrContains("\n" + decisions, "\nfold: ")) << decisions;
  for (const Kernel& k : lowered.kernels) EXPECT_EQ(k.row_groups, 0);
}

// Splitting a row kernel with row groups would sum each group's rows in
// several blocks: split-reductions refuses it, naming why, whatever its
// block count.
TEST(FoldColumnSums, SplitReductionsLeavesRowGroupsAlone) {
  LoweredGraph lowered = NormBackward(2048, 1024, v1::FLOAT32);
  FoldColumnSums(Groups(4), &lowered);
  SplitPolicy policy;
  policy.blocks = [](const Kernel&) -> std::optional<int64_t> { return 4; };
  policy.min_slice = 1;
  SplitReductions(policy, &lowered);
  const std::string decisions = absl::StrJoin(lowered.decisions, "\n");
  EXPECT_TRUE(absl::StrContains(decisions, "row groups (sums across rows)")) << decisions;
  for (const Kernel& k : lowered.kernels) {
    if (k.row_groups > 0) {
      EXPECT_FALSE(absl::EndsWith(k.name, "_partial")) << k.name;
    }
  }
}

TEST(FoldColumnSums, TheCppBackendRefusesRowGroupsByName) {
  LoweredGraph lowered = NormBackward(256, 64, v1::FLOAT32);
  FoldColumnSums(Groups(4), &lowered);
  codegen::CppOptions options;
  auto cpp = codegen::MakeCppBackend(options);
  auto source = cpp->Generate(lowered.kernels, lowered.symbols);
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(absl::StrContains(source.status().message(), "row groups")) << source.status();
}

TEST(FoldColumnSums, ALongRowOutsideRegistersIsRefusedByTheCudaBackend) {
  // 65536 float32 elements per row: swept by a loop, not kept in
  // registers; the CUDA backend names what it needs.
  LoweredGraph lowered = NormBackward(512, 65536, v1::FLOAT32);
  FoldColumnSums(Groups(4), &lowered);
  auto backend = Cuda();
  bool refused = false;
  for (const Kernel& k : lowered.kernels) {
    if (k.row_groups == 0) continue;
    auto launch = backend->Launch(k);
    ASSERT_TRUE(launch.ok());
    EXPECT_FALSE(launch->row_in_registers);
    auto source = backend->Generate({k}, lowered.symbols);
    ASSERT_FALSE(source.ok());
    EXPECT_TRUE(absl::StrContains(source.status().message(), "kept in registers"))
        << source.status();
    refused = true;
  }
  EXPECT_TRUE(refused);
}

}  // namespace
}  // namespace kiln::loop
