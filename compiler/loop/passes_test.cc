// The loop passes one at a time, text in and text out: the lower pass's
// classification, the fuse pass's decisions under the target's policies
// (every refusal with its reason), and the memory plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/loop/lowering.h"
#include "compiler/loop/sweep_order.h"
#include "compiler/ops/graph_parser.h"
#include "google/protobuf/text_format.h"

namespace kiln::loop {
namespace {

constexpr const char* kGraph = R"(
def forward(self, x: "f32[8, 16]", w: "f32[16, 16]"):
    mm: "f32[8, 16]" = aten.mm.default(x, w)
    relu: "f32[8, 16]" = aten.relu.default(mm)
    add: "f32[8, 16]" = aten.add.Tensor(relu, x)
    sum_1: "f32[8]" = aten.sum.dim_IntList(add, [1], False)
    permute: "f32[16, 8]" = aten.permute.default(add, [1, 0])
    return (sum_1, permute)
)";

ir::Graph Parse(const char* text) {
  absl::StatusOr<ir::Graph> g = ops::ParseReadable(text);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : ir::Graph();
}

FusedGraph FuseWith(const ir::Graph& g, const FusionPolicy& policy) {
  absl::StatusOr<std::vector<NodeLowering>> nodes = LowerNodes(g, ops::DefaultRegistry());
  EXPECT_TRUE(nodes.ok()) << nodes.status();
  if (!nodes.ok()) return {};
  absl::StatusOr<FusedGraph> fused = Fuse(g, *nodes, policy);
  EXPECT_TRUE(fused.ok()) << fused.status();
  return fused.ok() ? *std::move(fused) : FusedGraph();
}

std::vector<std::vector<std::string>> NodesByKernel(const FusedGraph& f) {
  std::vector<std::vector<std::string>> out;
  for (const Kernel& k : f.kernels) out.push_back(k.nodes);
  return out;
}

TEST(LowerPassTest, ClassifiesEveryNode) {
  const ir::Graph g = Parse(kGraph);
  absl::StatusOr<std::vector<NodeLowering>> nodes = LowerNodes(g, ops::DefaultRegistry());
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_EQ(PrintNodeLowerings(g, *nodes),
            "mm_node = aten.mm.default: extern (no loop lowering)\n"
            "relu_node = aten.relu.default: pointwise over [8, 16]\n"
            "add_node = aten.add.Tensor: pointwise over [8, 16]\n"
            "sum_1_node = aten.sum.dim_IntList: reduction of 'add' [8, 16] over dims [1]\n"
            "permute_node = aten.permute.default: view of 'add'\n");
}

TEST(LowerPassTest, ReductionsWithoutALoweringSayWhy) {
  const ir::Graph g = Parse(R"(
def forward(self, x: "i64[8, 16]", y: "f32[8, 16]"):
    sum_1: "i64[8]" = aten.sum.dim_IntList(x, [1], False)
    sum_2: "f64[8]" = aten.sum.dim_IntList(y, [1], False, dtype=torch.float64)
    return (sum_1, sum_2)
)");
  absl::StatusOr<std::vector<NodeLowering>> nodes = LowerNodes(g, ops::DefaultRegistry());
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_EQ(PrintNodeLowerings(g, *nodes),
            "sum_1_node = aten.sum.dim_IntList: extern (its input has dtype INT64)\n"
            "sum_2_node = aten.sum.dim_IntList: extern (it accumulates in a dtype of its own)\n");
}

TEST(FusePassTest, DefaultPolicyFusesTheChainWithItsReduction) {
  const ir::Graph g = Parse(kGraph);
  const FusedGraph f = FuseWith(g, FusionPolicy());
  EXPECT_EQ(NodesByKernel(f),
            (std::vector<std::vector<std::string>>{{"relu_node", "add_node", "sum_1_node"}}))
      << PrintFused(g, f);
  EXPECT_EQ(absl::StrJoin(f.decisions, "\n"),
            "extern: mm_node (aten.mm.default) runs through ATen: no loop lowering\n"
            "new kernel_0: relu_node (aten.relu.default)\n"
            "fuse: add_node (aten.add.Tensor) into kernel_0\n"
            "fuse: sum_1_node (aten.sum.dim_IntList) into kernel_0 (reduction)\n"
            "view: permute_node (aten.permute.default) reads 'add' in place");
  ASSERT_EQ(f.steps.size(), 2u);
  EXPECT_EQ(f.steps[0].node, 0);  // mm, then the kernel
  EXPECT_EQ(f.steps[1].kernel, 0);
}

TEST(FusePassTest, APolicyThatFusesNothingGivesEachNodeItsKernel) {
  const ir::Graph g = Parse(kGraph);
  FusionPolicy policy;
  policy.fuse = false;
  const FusedGraph f = FuseWith(g, policy);
  EXPECT_EQ(NodesByKernel(f),
            (std::vector<std::vector<std::string>>{{"relu_node"}, {"add_node"}, {"sum_1_node"}}))
      << PrintFused(g, f);
  const std::string all = absl::StrJoin(f.decisions, "\n");
  EXPECT_NE(all.find("new kernel_2: sum_1_node (aten.sum.dim_IntList); not fused: kernel_1: the "
                     "target's policy fuses nothing; kernel_0: 'add' is produced after this "
                     "kernel or by it (fusing would form a cycle)"),
            std::string::npos)
      << all;
  EXPECT_EQ(all.find("recompute:"), std::string::npos) << all;
}

TEST(FusePassTest, AKernelSizeLimitStartsANewKernel) {
  const ir::Graph g = Parse(kGraph);
  FusionPolicy policy;
  policy.max_kernel_nodes = 2;
  const FusedGraph f = FuseWith(g, policy);
  EXPECT_EQ(NodesByKernel(f),
            (std::vector<std::vector<std::string>>{{"relu_node", "add_node"}, {"sum_1_node"}}))
      << PrintFused(g, f);
  const std::string all = absl::StrJoin(f.decisions, "\n");
  EXPECT_NE(all.find("not fused: kernel_0: it holds 2 nodes, the target's limit"),
            std::string::npos)
      << all;
}

// relu's kernel cannot take add: add reads mm, which reads relu. The
// refusal names the value; add's kernel computes relu again rather than
// reading it, unless the policy forbids recomputation.
TEST(FusePassTest, IllegalFusionsAreRefusedWithTheirReason) {
  const ir::Graph g = Parse(R"(
def forward(self, x: "f32[8, 16]", w: "f32[16, 16]"):
    relu: "f32[8, 16]" = aten.relu.default(x)
    mm: "f32[8, 16]" = aten.mm.default(relu, w)
    add: "f32[8, 16]" = aten.add.Tensor(relu, mm)
    return (add,)
)");
  FusedGraph f = FuseWith(g, FusionPolicy());
  std::string all = absl::StrJoin(f.decisions, "\n");
  EXPECT_NE(all.find("new kernel_1: add_node (aten.add.Tensor); not fused: kernel_0: 'mm' is "
                     "produced after this kernel or by it (fusing would form a cycle)"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("recompute: relu_node (aten.relu.default) in kernel_1 rather than read from "
                     "kernel_0"),
            std::string::npos)
      << all;

  FusionPolicy no_recompute;
  no_recompute.max_recompute_nodes = 0;
  f = FuseWith(g, no_recompute);
  all = absl::StrJoin(f.decisions, "\n");
  EXPECT_EQ(all.find("recompute:"), std::string::npos) << all;
  ASSERT_EQ(f.kernels.size(), 2u);
  bool reads_relu = false;
  for (const KernelBuffer& b : f.kernels[1].buffers) reads_relu |= b.value == "relu";
  EXPECT_TRUE(reads_relu) << PrintFused(g, f);
}

// sum_2 may read `neg` in relu's kernel only by computing it again from mm,
// which that kernel cannot read (mm runs after it): the legality check
// takes neg as recomputable, building it finds otherwise, and the kernel is
// refused with that reason rather than failing the compile.
TEST(FusePassTest, AReductionWhoseValuesCannotBeBuiltIsRefusedNotFailed) {
  const ir::Graph g = Parse(R"(
def forward(self, x: "f32[8, 16]", w: "f32[16, 16]"):
    relu: "f32[8, 16]" = aten.relu.default(x)
    mm: "f32[8, 16]" = aten.mm.default(x, w)
    neg: "f32[8, 16]" = aten.neg.default(mm)
    sum_1: "f32[16]" = aten.sum.dim_IntList(neg, [0], False)
    sum_2: "f32[8]" = aten.sum.dim_IntList(neg, [1], False)
    return (relu, sum_1, sum_2)
)");
  const FusedGraph f = FuseWith(g, FusionPolicy());
  EXPECT_EQ(NodesByKernel(f), (std::vector<std::vector<std::string>>{
                                  {"relu_node"}, {"neg_node", "sum_1_node"}, {"sum_2_node"}}))
      << PrintFused(g, f);
  const std::string all = absl::StrJoin(f.decisions, "\n");
  EXPECT_NE(all.find("new kernel_2: sum_2_node (aten.sum.dim_IntList); not fused: kernel_1: it "
                     "reduces other dimensions; kernel_0: 'neg' is produced after this kernel or "
                     "by it (fusing would form a cycle)"),
            std::string::npos)
      << all;
  // relu's kernel was left as it was: it stores relu and reads x only.
  ASSERT_EQ(f.kernels.size(), 3u);
  std::vector<std::string> buffers;
  for (const KernelBuffer& b : f.kernels[0].buffers) buffers.push_back(b.value);
  EXPECT_EQ(buffers, (std::vector<std::string>{"x", "relu"}));
}

TEST(FusePassTest, TheTwoPassRowLimitIsThePolicys) {
  const ir::Graph g = Parse(R"(
def forward(self, x: "f32[8, 64]"):
    var: "f32[8]" = aten.var.correction(x, [1])
    return (var,)
)");
  FusionPolicy welford;
  welford.two_pass_max_row = 32;
  const std::string two_pass = PrintFused(g, FuseWith(g, FusionPolicy()));
  const std::string one_pass = PrintFused(g, FuseWith(g, welford));
  EXPECT_EQ(two_pass.find("welford"), std::string::npos) << two_pass;
  EXPECT_NE(one_pass.find("welford"), std::string::npos) << one_pass;
}

v1::ExecutionPlan PlanFromText(const std::string& text) {
  v1::ExecutionPlan plan;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &plan)) << text;
  return plan;
}

// Frees after the last reader (a view keeps its base alive), and an
// allocation takes the storage of a dead one of its dtype that is as large.
TEST(MemoryPlanTest, FreesAfterLastUseAndReusesDeadStorage) {
  v1::ExecutionPlan plan = PlanFromText(R"pb(
    steps {
      alloc {
        value: "a"
        dtype: FLOAT32
        sizes { int_value: 16 }
        strides { int_value: 1 }
      }
    }
    steps { launch { symbol: "kernel_0" buffers: "x" buffers: "a" } }
    steps {
      alloc {
        value: "b"
        dtype: FLOAT32
        sizes { int_value: 16 }
        strides { int_value: 1 }
      }
    }
    steps { launch { symbol: "kernel_1" buffers: "a" buffers: "b" } }
    steps {
      view {
        value: "v"
        base: "b"
        sizes { int_value: 4 }
        strides { int_value: 1 }
      }
    }
    steps {
      extern_call {
        node {
          target: "aten.relu.default"
          args { tensor: "v" }
          outputs { name: "r" }
        }
      }
    }
    steps {
      alloc {
        value: "c"
        dtype: FLOAT32
        sizes { int_value: 8 }
        strides { int_value: 1 }
      }
    }
    steps { launch { symbol: "kernel_2" buffers: "r" buffers: "c" } }
    outputs: "c"
  )pb");
  PlanMemory(&plan);
  const std::string want =
      "alloc a [16] float32\n"
      "launch kernel_0 (x, a)\n"
      "alloc b [16] float32\n"
      "launch kernel_1 (a, b)\n"
      "free a\n"
      "view v of b [4]\n"
      "extern aten.relu.default -> r\n"
      "free b\n"
      "free v\n"
      "alloc c [8] float32 (reuses a)\n"
      "launch kernel_2 (r, c)\n"
      "free r\n";
  EXPECT_EQ(PrintSteps(plan), want);
  // Planned again (as after split-reductions adds steps): the same plan.
  PlanMemory(&plan);
  EXPECT_EQ(PrintSteps(plan), want);
}

TEST(MemoryPlanTest, SymbolicAndOtherDtypeAllocationsAreNotReused) {
  v1::ExecutionPlan plan = PlanFromText(R"pb(
    steps {
      alloc {
        value: "a"
        dtype: FLOAT32
        sizes { expr: "s0" }
        strides { int_value: 1 }
      }
    }
    steps { launch { symbol: "kernel_0" buffers: "a" } }
    steps {
      alloc {
        value: "b"
        dtype: FLOAT16
        sizes { int_value: 4 }
        strides { int_value: 1 }
      }
    }
    steps { launch { symbol: "kernel_1" buffers: "b" } }
    steps {
      alloc {
        value: "c"
        dtype: FLOAT32
        sizes { int_value: 4 }
        strides { int_value: 1 }
      }
    }
    steps { launch { symbol: "kernel_2" buffers: "c" } }
    outputs: "c"
  )pb");
  PlanMemory(&plan);
  EXPECT_EQ(PrintSteps(plan),
            "alloc a [s0] float32\n"
            "launch kernel_0 (a)\n"
            "free a\n"
            "alloc b [4] float16\n"
            "launch kernel_1 (b)\n"
            "free b\n"
            "alloc c [4] float32\n"
            "launch kernel_2 (c)\n");
}

// Two layers of the same code between matmuls share one kernel; a third of
// other code (tanh), and one of the same ops over another shape, keep their
// own. Each launch passes its own tensors.
TEST(ShareKernelsTest, LayersOfTheSameCodeShareOneKernel) {
  const ir::Graph g = Parse(R"(
def forward(self, x: "f32[8, 16]", w: "f32[16, 16]", v: "f32[16, 4]"):
    mm: "f32[8, 16]" = aten.mm.default(x, w)
    relu: "f32[8, 16]" = aten.relu.default(mm)
    mm_1: "f32[8, 16]" = aten.mm.default(relu, w)
    relu_1: "f32[8, 16]" = aten.relu.default(mm_1)
    mm_2: "f32[8, 16]" = aten.mm.default(relu_1, w)
    tanh: "f32[8, 16]" = aten.tanh.default(mm_2)
    mm_3: "f32[8, 4]" = aten.mm.default(tanh, v)
    relu_2: "f32[8, 4]" = aten.relu.default(mm_3)
    return (relu_2,)
)");
  absl::StatusOr<LoweredGraph> lowered = LowerGraph(g);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  std::vector<std::string> names, launches, buffers;
  for (const Kernel& k : lowered->kernels) names.push_back(k.name);
  for (const v1::PlanStep& step : lowered->plan.steps()) {
    if (!step.has_launch()) continue;
    launches.push_back(step.launch().symbol());
    buffers.push_back(absl::StrJoin(step.launch().buffers(), " "));
  }
  EXPECT_EQ(names, (std::vector<std::string>{"kernel_0", "kernel_2", "kernel_3"}));
  EXPECT_EQ(launches, (std::vector<std::string>{"kernel_0", "kernel_0", "kernel_2", "kernel_3"}));
  EXPECT_EQ(buffers[0], "mm relu");
  EXPECT_EQ(buffers[1], "mm_1 relu_1");
  EXPECT_EQ(lowered->plan.kernels(), 4);
  EXPECT_NE(std::find(lowered->decisions.begin(), lowered->decisions.end(),
                      "share: kernel_1 runs kernel_0's code"),
            lowered->decisions.end())
      << absl::StrJoin(lowered->decisions, "\n");
}

// Pass "sweep-order": the kernel launched right after the matmul whose
// output it reads sweeps in reverse; one launched after a matmul whose
// output it does not read keeps its order, and so does one after a kernel.
TEST(SweepOrderTest, AKernelRightAfterAMatmulItReadsIsReversed) {
  const ir::Graph g = Parse(R"(
def forward(self, x: "f32[8, 16]", w: "f32[16, 16]", v: "f32[16, 16]"):
    mm: "f32[8, 16]" = aten.mm.default(x, w)
    mm_1: "f32[8, 16]" = aten.mm.default(x, v)
    tanh: "f32[8, 16]" = aten.tanh.default(mm)
    mm_2: "f32[8, 16]" = aten.mm.default(mm_1, w)
    view: "f32[128]" = aten.view.default(mm_2, [128])
    relu: "f32[128]" = aten.relu.default(view)
    sum_1: "f32[]" = aten.sum.default(tanh)
    return (relu, sum_1)
)");
  absl::StatusOr<LoweredGraph> lowered = LowerGraph(g);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(ReverseAfterExterns(&*lowered), 1);
  std::vector<std::string> reversed;
  for (const Kernel& k : lowered->kernels) {
    if (k.reversed) reversed.insert(reversed.end(), k.nodes.begin(), k.nodes.end());
    EXPECT_EQ(absl::StrContains(PrintKernel(k), " reversed\n"), k.reversed) << PrintKernel(k);
  }
  EXPECT_EQ(reversed, (std::vector<std::string>{"relu_node"}));
  EXPECT_NE(std::find(lowered->decisions.begin(), lowered->decisions.end(),
                      "reverse: kernel_1 reads mm_2, which aten.mm.default wrote just before it"),
            lowered->decisions.end())
      << absl::StrJoin(lowered->decisions, "\n");
}

// Pass "streamed-loads" over the graph whose matmul reads `read_later`
// through a view, after sums over x and g: each kernel buffer's value and
// whether it is streamed.
std::map<std::string, bool> StreamedAfterSums(const std::string& read_later) {
  const std::string text = absl::StrCat(R"(
def forward(self, x: "f32[64, 16]", g: "f32[64, 16]", w: "f32[64, 8]"):
    sum_1: "f32[16]" = aten.sum.dim_IntList(x, [0])
    sum_2: "f32[16]" = aten.sum.dim_IntList(g, [0])
    t: "f32[16, 64]" = aten.t.default()",
                                        read_later, R"()
    mm: "f32[16, 8]" = aten.mm.default(t, w)
    return (sum_1, sum_2, mm)
)");
  absl::StatusOr<LoweredGraph> lowered = LowerGraph(Parse(text.c_str()));
  EXPECT_TRUE(lowered.ok()) << lowered.status();
  if (!lowered.ok()) return {};
  EXPECT_EQ(MarkStreamedLoads(&*lowered), 1);
  std::map<std::string, bool> streamed;
  for (const Kernel& k : lowered->kernels) {
    for (const KernelBuffer& b : k.buffers) streamed[b.value] = b.streamed;
  }
  return streamed;
}

// A buffer that no later step reads is streamed; one a later matmul reads
// through a view is not, nor is what a kernel writes.
TEST(StreamedLoadsTest, OnlyWhatNothingReadsLaterIsStreamed) {
  EXPECT_EQ(
      StreamedAfterSums("g"),
      (std::map<std::string, bool>{{"x", true}, {"g", false}, {"sum_1", false}, {"sum_2", false}}));
  EXPECT_EQ(
      StreamedAfterSums("x"),
      (std::map<std::string, bool>{{"x", false}, {"g", true}, {"sum_1", false}, {"sum_2", false}}));
}

}  // namespace
}  // namespace kiln::loop
