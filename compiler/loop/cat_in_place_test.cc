// Pass "cat-in-place": attention's heads moved out of their layout and a
// scaled tensor, concatenated. The kernels that make the parts write them
// into the concatenation, and the plan runs without ATen's cat: its kernels
// compiled by the C++ backend and run over the plan's buffers, against the
// concatenation computed here. A part that anything else reads keeps the
// cat.
#include "compiler/loop/cat_in_place.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "compiler/codegen/cpp_codegen_test_util.h"
#include "compiler/ir/builder.h"
#include "compiler/loop/lowering.h"
#include "compiler/pipeline/rewrite_test_util.h"

namespace kiln::loop {
namespace {

using ir::Ref;
using pipeline::Contiguous;
using pipeline::Op;

constexpr int64_t kB = 2, kH = 4, kL = 3, kD = 5, kC = 7;

enum class Extra { kNone, kHeadsAreAnOutput, kScaledIsAnInput };

// x [B, H, L, D] -> permute to [B, L, H, D] -> clone -> view [B, L, H*D];
// y [B, L, C] * 3; out = cat([y * 3, heads], dim=-1) of [B, L, C + H*D].
ir::Graph HeadsBesideScaled(Extra extra = Extra::kNone) {
  ir::GraphBuilder b("heads_cat");
  const ir::ValueId x =
      b.AddInput(ir::ContiguousMeta({kB, kH, kL, kD}), v1::Placeholder::USER_INPUT, "x");
  const ir::ValueId y =
      b.AddInput(ir::ContiguousMeta({kB, kL, kC}), v1::Placeholder::USER_INPUT, "y");
  const ir::ValueId moved =
      Contiguous(b, Op(b, "aten.permute.default", {Ref(x), ir::Ints({0, 2, 1, 3})}));
  const ir::ValueId heads = Op(b, "aten.view.default", {Ref(moved), ir::Ints({kB, kL, kH * kD})});
  const ir::ValueId scaled =
      extra == Extra::kScaledIsAnInput ? y : Op(b, "aten.mul.Scalar", {Ref(y), ir::Float(3)});
  b.AddOutput(Op(b, "aten.cat.default",
                 {ir::Positional(std::vector<ir::ValueId>{scaled, heads}), ir::Int(-1)}));
  if (extra == Extra::kHeadsAreAnOutput) b.AddOutput(moved);
  return std::move(b).Build();
}

bool HasCat(const LoweredGraph& lowered) {
  for (const v1::PlanStep& s : lowered.plan.steps()) {
    if (s.has_extern_call() && s.extern_call().node().target() == "aten.cat.default") return true;
  }
  return false;
}

// Runs `lowered`'s plan (allocations and launches only) on `inputs` with
// its kernels compiled by the C++ backend; returns the memory of every value.
std::map<std::string, std::vector<float>> RunPlan(
    const LoweredGraph& lowered, std::map<std::string, std::vector<float>> memory) {
  std::unique_ptr<codegen::cpp_test::LoadedModule> module =
      codegen::cpp_test::Build(lowered.kernels, lowered.symbols);
  EXPECT_NE(module, nullptr);
  if (module == nullptr) return memory;
  for (const v1::PlanStep& s : lowered.plan.steps()) {
    if (s.has_alloc()) {
      int64_t n = 1;
      for (const v1::SymInt& d : s.alloc().sizes()) n *= d.int_value();
      memory[s.alloc().value()].assign(n, std::nanf(""));
    } else if (s.has_launch()) {
      std::vector<void*> buffers;
      for (const std::string& b : s.launch().buffers()) buffers.push_back(memory[b].data());
      codegen::cpp_test::Call(module->Fn(s.launch().symbol()), buffers);
    } else {
      EXPECT_TRUE(s.has_free()) << "a step the test does not run: " << s.DebugString();
    }
  }
  return memory;
}

TEST(CatInPlace, TheKernelsWriteTheirSlicesAndTheCatGoes) {
  absl::StatusOr<LoweredGraph> lowered = LowerGraph(HeadsBesideScaled());
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  const std::string decisions = absl::StrJoin(lowered->decisions, "\n");
  EXPECT_TRUE(absl::StrContains(decisions, "cat in place: ")) << decisions;
  EXPECT_FALSE(HasCat(*lowered)) << PrintSteps(lowered->plan);

  // The plan, run: inputs, allocations and launches; nothing else is left.
  const std::vector<float> x = codegen::cpp_test::Random(kB * kH * kL * kD, 1);
  const std::vector<float> y = codegen::cpp_test::Random(kB * kL * kC, 2);
  std::map<std::string, std::vector<float>> memory = RunPlan(*lowered, {{"x", x}, {"y", y}});
  ASSERT_EQ(lowered->plan.outputs_size(), 1);
  std::vector<float> want;
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t l = 0; l < kL; ++l) {
      for (int64_t c = 0; c < kC; ++c) want.push_back(y[(b * kL + l) * kC + c] * 3);
      for (int64_t h = 0; h < kH; ++h) {
        for (int64_t d = 0; d < kD; ++d) want.push_back(x[((b * kH + h) * kL + l) * kD + d]);
      }
    }
  }
  codegen::cpp_test::ExpectClose(memory[lowered->plan.outputs(0)], want);
}

// A row's sum and its max side by side: one row kernel stores both at the
// outer level, each now at its column of the [R, 2] result.
TEST(CatInPlace, ARowKernelsPerRowValuesLandSideBySide) {
  constexpr int64_t kR = 6, kN = 10;
  ir::GraphBuilder b("sum_and_max");
  const ir::ValueId x = b.AddInput(ir::ContiguousMeta({kR, kN}), v1::Placeholder::USER_INPUT, "x");
  const ir::ValueId sum = Op(b, "aten.sum.dim_IntList", {Ref(x), ir::Ints({1}), ir::Bool(true)});
  const ir::ValueId max = Op(b, "aten.amax.default", {Ref(x), ir::Ints({1}), ir::Bool(true)});
  b.AddOutput(
      Op(b, "aten.cat.default", {ir::Positional(std::vector<ir::ValueId>{sum, max}), ir::Int(1)}));
  absl::StatusOr<LoweredGraph> lowered = LowerGraph(std::move(b).Build());
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_FALSE(HasCat(*lowered)) << absl::StrJoin(lowered->decisions, "\n");
  const std::vector<float> in = codegen::cpp_test::Random(kR * kN, 3);
  std::map<std::string, std::vector<float>> memory = RunPlan(*lowered, {{"x", in}});
  std::vector<float> want;
  for (int64_t r = 0; r < kR; ++r) {
    float s = 0, m = -INFINITY;
    for (int64_t c = 0; c < kN; ++c) {
      s += in[r * kN + c];
      m = std::max(m, in[r * kN + c]);
    }
    want.push_back(s);
    want.push_back(m);
  }
  codegen::cpp_test::ExpectClose(memory[lowered->plan.outputs(0)], want);
}

// A part whose rows, viewed for the cat, cut across the kernel's rows: [3,
// 4] viewed as [2, 6] and concatenated along the 6. A store's index cannot
// be split at the cat's dimension, so ATen's cat stays.
TEST(CatInPlace, AViewAcrossTheKernelsRowsKeepsTheCat) {
  ir::GraphBuilder b("reshaped");
  const ir::ValueId x = b.AddInput(ir::ContiguousMeta({3, 4}), v1::Placeholder::USER_INPUT, "x");
  const ir::ValueId y = b.AddInput(ir::ContiguousMeta({2, 6}), v1::Placeholder::USER_INPUT, "y");
  const ir::ValueId part =
      Op(b, "aten.view.default",
         {Ref(Op(b, "aten.mul.Scalar", {Ref(x), ir::Float(2)})), ir::Ints({2, 6})});
  const ir::ValueId other = Op(b, "aten.mul.Scalar", {Ref(y), ir::Float(3)});
  b.AddOutput(Op(b, "aten.cat.default",
                 {ir::Positional(std::vector<ir::ValueId>{part, other}), ir::Int(1)}));
  absl::StatusOr<LoweredGraph> lowered = LowerGraph(std::move(b).Build());
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_TRUE(HasCat(*lowered)) << absl::StrJoin(lowered->decisions, "\n");
}

TEST(CatInPlace, APartTheGraphAlsoReturnsKeepsTheCat) {
  absl::StatusOr<LoweredGraph> lowered = LowerGraph(HeadsBesideScaled(Extra::kHeadsAreAnOutput));
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_TRUE(HasCat(*lowered)) << PrintSteps(lowered->plan);
}

TEST(CatInPlace, APartNoKernelWritesKeepsTheCat) {
  absl::StatusOr<LoweredGraph> lowered = LowerGraph(HeadsBesideScaled(Extra::kScaledIsAnInput));
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_TRUE(HasCat(*lowered)) << PrintSteps(lowered->plan);
}

}  // namespace
}  // namespace kiln::loop
