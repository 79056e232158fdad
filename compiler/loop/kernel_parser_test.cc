// The loop IR's parser: every kernel the compiler makes from the graphs
// under tests/data reads back as it printed, hand-written text reads as
// meant, malformed text is refused with its line, and a pass test written
// as text in, text out.
#include "compiler/loop/kernel_parser.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "compiler/autograd/joint_graph.h"
#include "compiler/autograd/partition.h"
#include "compiler/codegen/codegen.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/canonical.h"
#include "compiler/loop/fold_column_sums.h"
#include "compiler/loop/lowering.h"
#include "compiler/loop/split_reductions.h"
#include "compiler/pipeline/attention.h"
#include "compiler/target/target.h"
#include "google/protobuf/util/json_util.h"
#include "kiln/v1/service.pb.h"
#include "tests/data/graph_files.h"

namespace kiln::loop {
namespace {

// What the printer shows of two kernels, and what the parser rebuilds, is
// equal.
void ExpectSameKernel(const Kernel& want, const Kernel& got, const std::string& label) {
  SCOPED_TRACE(label);
  EXPECT_EQ(got.name, want.name);
  EXPECT_EQ(got.outer, want.outer);
  EXPECT_EQ(got.inner, want.inner);
  EXPECT_EQ(got.passes, want.passes);
  EXPECT_EQ(got.row_groups, want.row_groups);
  EXPECT_EQ(got.block, want.block);
  EXPECT_EQ(got.reversed, want.reversed);
  EXPECT_EQ(got.nodes, want.nodes);
  ASSERT_EQ(got.buffers.size(), want.buffers.size());
  for (size_t b = 0; b < want.buffers.size(); ++b) {
    EXPECT_EQ(got.buffers[b].value, want.buffers[b].value) << "buf" << b;
    EXPECT_EQ(got.buffers[b].dtype, want.buffers[b].dtype) << "buf" << b;
    EXPECT_EQ(got.buffers[b].written, want.buffers[b].written) << "buf" << b;
  }
  ASSERT_EQ(got.stmts.size(), want.stmts.size());
  for (size_t j = 0; j < want.stmts.size(); ++j) {
    const Stmt& w = want.stmts[j];
    const Stmt& g = got.stmts[j];
    SCOPED_TRACE(absl::StrCat("statement ", j));
    EXPECT_EQ(g.kind, w.kind);
    EXPECT_EQ(g.pass, w.pass);
    EXPECT_EQ(g.inner, w.inner);
    EXPECT_EQ(g.dtype, w.dtype);
    EXPECT_EQ(g.args, w.args);
    switch (w.kind) {
      case StmtKind::kLoad:
      case StmtKind::kStore:
      case StmtKind::kAccumulate:
        EXPECT_EQ(g.buffer, w.buffer);
        EXPECT_EQ(g.index.outer_strides, w.index.outer_strides);
        EXPECT_EQ(g.index.inner_strides, w.index.inner_strides);
        EXPECT_EQ(g.index.offset, w.index.offset);
        break;
      case StmtKind::kIndex:
        EXPECT_EQ(g.index.outer_strides, w.index.outer_strides);
        EXPECT_EQ(g.index.inner_strides, w.index.inner_strides);
        EXPECT_EQ(g.index.offset, w.index.offset);
        break;
      case StmtKind::kGather:
      case StmtKind::kScatterAdd:
        EXPECT_EQ(g.buffer, w.buffer);
        EXPECT_EQ(g.index.outer_strides, w.index.outer_strides);
        EXPECT_EQ(g.index.inner_strides, w.index.inner_strides);
        EXPECT_EQ(g.index.offset, w.index.offset);
        EXPECT_EQ(g.gather_strides, w.gather_strides);
        EXPECT_EQ(g.gather_sizes, w.gather_sizes);
        EXPECT_EQ(g.gather_wraps, w.gather_wraps);
        break;
      case StmtKind::kConstant:
        // Bit for bit, NaNs and signed zeros included.
        EXPECT_EQ(std::memcmp(&g.constant, &w.constant, sizeof(double)), 0)
            << g.constant << " vs " << w.constant;
        break;
      case StmtKind::kOp:
        EXPECT_EQ(g.op, w.op);
        break;
      case StmtKind::kReduce:
        EXPECT_EQ(g.reduce, w.reduce);
        break;
    }
  }
}

// Parses what PrintKernel printed of `k` and checks the round trip.
void ExpectRoundTrip(const Kernel& k, const std::string& label) {
  const std::string text = PrintKernel(k);
  absl::StatusOr<Kernel> parsed = ParseKernel(text);
  ASSERT_TRUE(parsed.ok()) << label << ": " << parsed.status() << "\n" << text;
  EXPECT_EQ(PrintKernel(*parsed), text) << label;
  ExpectSameKernel(k, *parsed, label);
}

// Splits every reduction kernel it legally can, into as many slices as fit.
SplitPolicy SplitEverything() {
  SplitPolicy policy;
  policy.blocks = [](const Kernel&) -> std::optional<int64_t> { return 1; };
  policy.split_below = 2;
  policy.min_blocks = 1 << 20;
  policy.min_slice = 1;
  return policy;
}

// The kernel of `text`, alone in a graph, split by `policy`.
absl::StatusOr<LoweredGraph> SplitParsed(const std::string& text, const SplitPolicy& policy) {
  ASSIGN_OR_RETURN(Kernel k, ParseKernel(text));
  LoweredGraph lowered;
  lowered.kernels.push_back(std::move(k));
  SplitReductions(policy, &lowered);
  return lowered;
}

struct Lowered {
  std::string label;
  LoweredGraph lowered;
};

// The kernels the kiln pipeline (compiler/pipeline/pipeline.cc) makes of
// `path` for `device`: the attention rewrite on CUDA; the forward and
// backward halves of a training graph; lowering, then the target's split
// of narrow reductions. Then each graph again, split wherever legal.
void LowerAsThePipelineDoes(const std::string& path, const std::string& device,
                            std::vector<Lowered>* out) {
  SCOPED_TRACE(path + " for " + device);
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  v1::GraphFile file;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &file).ok());
  v1::Graph proto = file.graph();
  if (device == "cuda") ir::MoveTensors(&proto, "cuda", 0);
  absl::StatusOr<ir::Graph> graph = ir::Graph::FromProto(proto);
  ASSERT_TRUE(graph.ok()) << graph.status();

  v1::CompileOptions wanted;
  wanted.set_backend("kiln");
  wanted.mutable_target()->set_device_type(device);
  auto target = target::SelectTarget(ir::NormalizeOptions(wanted).target(), *graph);
  ASSERT_TRUE(target.ok()) << target.status();
  std::unique_ptr<codegen::CodegenBackend> backend = (*target)->MakeCodegen({});

  bool training = false;
  for (const auto& in : graph->inputs()) {
    training = training || graph->value(in.value).meta.requires_grad;
  }
  ir::Graph source = *graph;
  if (device == "cuda") {
    pipeline::AttentionOptions attention;
    attention.training = training;
    ir::Graph rewritten;
    absl::StatusOr<int> fused = pipeline::RewriteAttention(*graph, &rewritten, attention);
    if (fused.ok() && *fused > 0) source = std::move(rewritten);
  }
  std::vector<std::pair<std::string, ir::Graph>> graphs;
  if (training) {
    auto joint = autograd::BuildJointGraph(source, autograd::JointOptions());
    ASSERT_TRUE(joint.ok()) << joint.status();
    auto split = autograd::PartitionJointGraph(*joint);
    ASSERT_TRUE(split.ok()) << split.status();
    graphs.emplace_back("forward", std::move(split->forward));
    graphs.emplace_back("backward", std::move(split->backward));
  } else {
    graphs.emplace_back("inference", std::move(source));
  }
  for (const auto& [half, g] : graphs) {
    absl::StatusOr<LoweredGraph> lowered = LowerGraph(g);
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    const std::string label = absl::StrCat(path, " ", device, " ", half);
    out->push_back({label + " split everywhere", *lowered});
    SplitReductions(SplitEverything(), &out->back().lowered);
    if ((*target)->multiprocessors() > 0) {
      // Every sum over rows a row kernel in registers can take, in 4 groups.
      ColumnSumPolicy sums;
      sums.groups = [&backend](const Kernel& k) -> int64_t {
        absl::StatusOr<codegen::LaunchSize> size = backend->Launch(k);
        return size.ok() && size->row_in_registers ? 4 : 0;
      };
      FoldColumnSums(sums, &*lowered);
      SplitPolicy policy;
      policy.split_below = (*target)->multiprocessors();
      policy.min_blocks = 2 * (*target)->multiprocessors();
      policy.blocks = [&backend](const Kernel& k) -> std::optional<int64_t> {
        absl::StatusOr<codegen::LaunchSize> size = backend->Launch(k);
        if (!size.ok() || !size->grid.is_constant()) return std::nullopt;
        return size->grid.constant();
      };
      SplitReductions(policy, &*lowered);
    }
    out->push_back({label, *std::move(lowered)});
  }
}

TEST(KernelParserTest, EveryTestDataKernelRoundTrips) {
  const std::vector<std::string> paths = testing::TestGraphFiles();
  ASSERT_GE(paths.size(), 6u);
  int kernels = 0, split = 0, folded = 0;
  for (const std::string device : {"cpu", "cuda"}) {
    std::vector<Lowered> all;
    for (const std::string& path : paths) LowerAsThePipelineDoes(path, device, &all);
    for (const Lowered& l : all) {
      std::string section;
      for (const Kernel& k : l.lowered.kernels) {
        ExpectRoundTrip(k, l.label + " " + k.name);
        absl::StrAppend(&section, PrintKernel(k), "\n");
        ++kernels;
        split += absl::EndsWith(k.name, "_partial");
        folded += k.row_groups > 0;
      }
      // The "# kernels" section of PrintLowered reads back whole.
      absl::StatusOr<std::vector<Kernel>> parsed =
          ParseKernels(absl::StrCat("# kernels (", l.lowered.kernels.size(), ")\n", section));
      ASSERT_TRUE(parsed.ok()) << l.label << ": " << parsed.status();
      std::string again;
      for (const Kernel& k : *parsed) absl::StrAppend(&again, PrintKernel(k), "\n");
      EXPECT_EQ(again, section) << l.label;
    }
  }
  EXPECT_GE(kernels, 100);
  EXPECT_GE(split, 10);  // partial kernels, with their finishing ones
  EXPECT_GE(folded, 1);  // row kernels that took a column kernel's sums
}

// Graphs the test data lacks: rows of symbolic size and long rows (Welford).
TEST(KernelParserTest, SymbolicAndWelfordKernelsRoundTrip) {
  ir::TensorMeta symbolic = ir::ContiguousMeta({4, 1}, v1::FLOAT32);
  symbolic.sizes[1] = ir::SymInt{std::string("s0")};
  symbolic.strides[0] = ir::SymInt{std::string("s0")};
  ir::TensorMeta strided = ir::ContiguousMeta({4, 1}, v1::FLOAT32);
  strided.sizes[1] = ir::SymInt{std::string("Max(s0, s1)")};
  strided.strides[0] = ir::SymInt{std::string("2*Max(s0, s1) + 1")};
  strided.storage_offset = ir::SymInt{std::string("s1 + 3")};
  int welford = 0, symbolic_strides = 0;
  for (const ir::TensorMeta& meta :
       {ir::ContiguousMeta({2, 16385}, v1::FLOAT32), symbolic, strided}) {
    const ir::SymInt d = meta.sizes.back();
    ir::GraphBuilder b("ln");
    ir::ValueId x = b.AddInput(meta, v1::Placeholder::USER_INPUT, "x");
    ir::TensorMeta p = ir::ContiguousMeta({1}, v1::FLOAT32);
    p.sizes = {d};
    ir::ValueId w = b.AddInput(p, v1::Placeholder::PARAMETER, "w");
    ir::ValueId bias = b.AddInput(p, v1::Placeholder::PARAMETER, "b");
    auto out = ops::Emit(b, ops::DefaultRegistry(), "aten.native_layer_norm.default",
                         {ir::Ref(x), ir::Argument{"", std::vector<ir::SymInt>{d}}, ir::Ref(w),
                          ir::Ref(bias), ir::Float(1e-5)},
                         {});
    ASSERT_TRUE(out.ok()) << out.status();
    b.AddOutput((*out)[0]);
    absl::StatusOr<LoweredGraph> lowered = LowerGraph(std::move(b).Build());
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    SplitReductions(SplitEverything(), &*lowered);
    for (const Kernel& k : lowered->kernels) {
      ExpectRoundTrip(k, k.name);
      const std::string text = PrintKernel(k);
      welford += text.find("welford_m2") != std::string::npos;
      symbolic_strides += text.find("*(2*Max(s0, s1) + 1) + ") != std::string::npos;
    }
  }
  EXPECT_GE(welford, 3);
  EXPECT_GE(symbolic_strides, 1);
}

using ir::SymInt;

SymInt C(int64_t v) { return SymInt{v}; }
SymInt E(const char* text) { return SymInt{std::string(text)}; }

// Text as people write it: no indentation, comments, blank lines around.
TEST(KernelParserTest, HandWrittenText) {
  absl::StatusOr<Kernel> k = ParseKernel(R"(
# a comment
kernel scale: outer [2, s0] inner [Max(s0, s1)] passes 2
nodes: mul, where
buffers:
buf0 = x : bf16
buf1 = mask : b8
buf2 = out : f32 (written)
%0 = load buf0[o1*(2*s0) + i0*1 + s1 + 3] : bf16 [pass 0, inner]
%1 = cast %0 : f32 [pass 0, inner]
%2 = reduce max %1 : f32 [pass 0, inner]
store buf2[o0*(-1) + 7] = %2 [pass 0, outer]
%4 = load buf1[i0*-4 + 0] : b8 [pass 1, inner]
%5 = constant -inf : f32 [pass 1, inner]
%6 = constant nan : f32 [pass 1, inner]
%7 = where %4, %5, %6 : f32 [pass 1, inner]
%8 = constant -0 : f32 [pass 1, inner]
%9 = constant 2.5e-300 : f32 [pass 1, inner]
store buf2[o1*1 + 0] = %7 [pass 1, inner]

)");
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->name, "scale");
  EXPECT_EQ(k->outer, (std::vector<SymInt>{C(2), E("s0")}));
  EXPECT_EQ(k->inner, (std::vector<SymInt>{E("Max(s0, s1)")}));
  EXPECT_EQ(k->nodes, (std::vector<std::string>{"mul", "where"}));
  ASSERT_EQ(k->buffers.size(), 3u);
  EXPECT_EQ(k->buffers[1].dtype, v1::BOOL);
  EXPECT_TRUE(k->buffers[2].written);
  ASSERT_EQ(k->stmts.size(), 11u);
  // Strides the text leaves out are zero; one per dimension.
  const Index& load = k->stmts[0].index;
  EXPECT_EQ(load.outer_strides, (std::vector<SymInt>{C(0), E("2*s0")}));
  EXPECT_EQ(load.inner_strides, (std::vector<SymInt>{C(1)}));
  EXPECT_EQ(load.offset, E("s1 + 3"));
  EXPECT_EQ(k->stmts[10].index.outer_strides, (std::vector<SymInt>{C(0), C(1)}));
  EXPECT_EQ(k->stmts[4].index.inner_strides, (std::vector<SymInt>{C(-4)}));
  // A parenthesized stride stays symbolic, so that it prints as it was.
  EXPECT_EQ(k->stmts[3].index.outer_strides[0], E("-1"));
  // The first store is statement 3 (the numbers skip it); it stores in its
  // buffer's dtype.
  EXPECT_EQ(k->stmts[3].kind, StmtKind::kStore);
  EXPECT_FALSE(k->stmts[3].inner);
  EXPECT_EQ(k->stmts[3].args, std::vector<int>{2});
  EXPECT_EQ(k->stmts[3].dtype, v1::FLOAT32);
  EXPECT_EQ(k->stmts[3].buffer, 2);
  EXPECT_EQ(k->stmts[1].op, ScalarOp::kCast);
  EXPECT_EQ(k->stmts[2].reduce, ReduceOp::kMax);
  EXPECT_EQ(k->stmts[4].pass, 1);
  EXPECT_EQ(k->stmts[5].constant, -INFINITY);
  EXPECT_TRUE(std::isnan(k->stmts[6].constant));
  EXPECT_EQ(k->stmts[7].args, (std::vector<int>{4, 5, 6}));
  EXPECT_TRUE(std::signbit(k->stmts[8].constant));
  EXPECT_EQ(k->stmts[9].constant, 2.5e-300);
  // Printed, it reads back the same.
  ExpectRoundTrip(*k, "hand-written");
  EXPECT_NE(PrintKernel(*k).find("  store buf2[o0*(-1) + 7] = %2 [pass 0, outer]\n"),
            std::string::npos)
      << PrintKernel(*k);
}

// The autotuner's block size prints after the passes and reads back.
TEST(KernelParserTest, TunedBlockSizeRoundTrips) {
  const char* kText = R"(kernel k: outer [8] inner [64] passes 1 block 512
  buffers:
    buf0 = x : f32
    buf1 = out : f32 (written)
  %0 = load buf0[o0*64 + i0*1 + 0] : f32 [pass 0, inner]
  store buf1[o0*64 + i0*1 + 0] = %0 [pass 0, inner]
)";
  absl::StatusOr<Kernel> k = ParseKernel(kText);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->block, 512);
  EXPECT_EQ(k->passes, 1);
  EXPECT_EQ(PrintKernel(*k), kText);
  absl::StatusOr<Kernel> zero = ParseKernel("kernel k: outer [8] inner [64] passes 1 block 0\n");
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("at least 1 thread per block"), std::string::npos)
      << zero.status();
}

TEST(KernelParserTest, AReversedSweepRoundTrips) {
  const char* kText = R"(kernel k: outer [8] inner [64] passes 1 groups 4 block 256 reversed
  buffers:
    buf0 = x : f32
    buf1 = out : f32 (written)
  %0 = load buf0[o0*64 + i0*1 + 0] : f32 [pass 0, inner]
  store buf1[o0*64 + i0*1 + 0] = %0 [pass 0, inner]
)";
  absl::StatusOr<Kernel> k = ParseKernel(kText);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_TRUE(k->reversed);
  EXPECT_EQ(k->row_groups, 4);
  EXPECT_EQ(k->block, 256);
  EXPECT_EQ(PrintKernel(*k), kText);
  std::string text = kText;
  absl::StrReplaceAll({{" reversed\n", "\n"}}, &text);
  absl::StatusOr<Kernel> plain = ParseKernel(text);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->reversed);
}

TEST(KernelParserTest, SeveralKernels) {
  const std::string text =
      "# kernels (2)\n"
      "kernel a: outer [4] inner [8] passes 1\n"
      "  buffers:\n"
      "    buf0 = x : f32 (written)\n"
      "  %0 = constant 1 : f32 [pass 0, inner]\n"
      "  store buf0[o0*8 + i0*1 + 0] = %0 [pass 0, inner]\n"
      "\n"
      "kernel b: outer [] inner [1] passes 1\n"
      "  buffers:\n"
      "\n";
  absl::StatusOr<std::vector<Kernel>> kernels = ParseKernels(text);
  ASSERT_TRUE(kernels.ok()) << kernels.status();
  ASSERT_EQ(kernels->size(), 2u);
  EXPECT_EQ((*kernels)[0].name, "a");
  EXPECT_EQ((*kernels)[1].name, "b");
  EXPECT_TRUE((*kernels)[1].outer.empty());
  EXPECT_TRUE((*kernels)[1].stmts.empty());
  EXPECT_EQ(ParseKernel(text).status().message(), "line 8: expected one kernel, found a second");
  absl::StatusOr<std::vector<Kernel>> none = ParseKernels("\n# nothing\n");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

constexpr absl::string_view kSmall =
    "kernel k: outer [4] inner [8] passes 1\n"
    "  buffers:\n"
    "    buf0 = x : f32\n"
    "    buf1 = y : f32 (written)\n"
    "  %0 = load buf0[o0*8 + i0*1 + 0] : f32 [pass 0, inner]\n"
    "  %1 = neg %0 : f32 [pass 0, inner]\n"
    "  store buf1[o0*8 + i0*1 + 0] = %1 [pass 0, inner]\n";

// kSmall with line `line` (1-based) replaced by `text`.
std::string WithLine(int line, const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(kSmall, '\n');
  lines[line - 1] = text;
  return absl::StrJoin(lines, "\n");
}

TEST(KernelParserTest, MalformedTextNamesTheLine) {
  ASSERT_TRUE(ParseKernel(kSmall).ok());
  const std::string huge = "99999999999999999999";
  const std::string deep = std::string(1000, '(') + "s0" + std::string(1000, ')');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "line 1: expected 'kernel <name>: outer [...] inner [...] passes <n>'"},
      {"kernel k: outer [4] inner [8]", "line 1: expected ' passes <n>' after the inner sizes"},
      {"kernel k: outer [4 inner [8] passes 1", "line 1: malformed outer size '4 inner [8'"},
      {"kernel k: outer [4] inner [8] passes 1", "line 2: expected 'buffers:'"},
      {"kernel k: outer [s0 %] inner [8] passes 1", "line 1: malformed outer size 's0 %'"},
      {"kernel k: outer [" + huge + "] inner [8] passes 1", "out of range of int64"},
      {"kernel k: outer [4] inner [8] passes " + huge, "is out of range"},
      {"kernel k: outer [4] inner [8] passes 0", "line 1: expected at least 1 pass"},
      {WithLine(3, "    buf1 = x : f32"), "line 3: expected 'buf0 = <value> : <dtype>'"},
      {WithLine(3, "    buf0 = x"), "line 3: expected '<value> : <dtype>' after 'buf0 = '"},
      {WithLine(6, "  %1 neg %0 : f32 [pass 0, inner]"), "line 6: expected ' = ' after '%1'"},
      {WithLine(6, "  %3 = neg %0 : f32 [pass 0, inner]"), "line 6: expected %1"},
      {WithLine(6, "  %" + huge + " = neg %0 : f32 [pass 0, inner]"), "line 6: expected %1"},
      {WithLine(6, "  %1 = frobnicate %0 : f32 [pass 0, inner]"),
       "line 6: expected load, gather, index, constant, reduce or a scalar op, got 'frobnicate'"},
      {WithLine(6, "  %1 = neg %2 : f32 [pass 0, inner]"),
       "line 6: operand %2 is not a statement before %1"},
      {WithLine(6, "  %1 = neg %1 : f32 [pass 0, inner]"),
       "line 6: operand %1 is not a statement before %1"},
      {WithLine(6, "  %1 = neg %" + huge + " : f32 [pass 0, inner]"),
       "is not a statement before %1"},
      {WithLine(6, "  %1 = add %0 : f32 [pass 0, inner]"), "line 6: add takes 2 operands, got 1"},
      {WithLine(6, "  %1 = neg %0, %0 : f32 [pass 0, inner]"), "line 6: neg takes 1 operand"},
      {WithLine(6, "  %1 = neg 0 : f32 [pass 0, inner]"), "line 6: expected an operand"},
      {WithLine(6, "  %1 = neg %0 : f33 [pass 0, inner]"), "line 6: expected a dtype"},
      {WithLine(6, "  %1 = neg %0 : f32 [pass 1, inner]"), "line 6: pass 1 of a kernel of 1"},
      {WithLine(6, "  %1 = neg %0 : f32 [pass 0, middle]"),
       "line 6: expected 'inner' or 'outer', got 'middle'"},
      {WithLine(6, "  %1 = neg %0 : f32"), "line 6: expected ' [pass <p>, inner|outer]'"},
      {WithLine(6, "  %1 = neg %0 : f32 [pass " + huge + ", inner]"), "is out of range"},
      {WithLine(6, "  %1 = constant 1e : f32 [pass 0, inner]"),
       "line 6: expected a number after 'constant', got '1e'"},
      {WithLine(6, "  %1 = reduce mean %0 : f32 [pass 0, inner]"), "line 6: expected a reduction"},
      {WithLine(6, "  %1 = load buf7[0] : f32 [pass 0, inner]"),
       "line 6: buf7 is not one of the kernel's 2 buffers"},
      {WithLine(6, "  %1 = load buf0[o1*8 + 0] : f32 [pass 0, inner]"),
       "line 6: o1 is not one of the kernel's 1 outer dimensions"},
      {WithLine(6, "  %1 = load buf0[o0*8 + o0*8 + 0] : f32 [pass 0, inner]"),
       "line 6: o0 appears twice"},
      {WithLine(6, "  %1 = load buf0[o0*(s0 + 0] : f32 [pass 0, inner]"),
       "line 6: unbalanced '(' in stride of o0"},
      {WithLine(6, "  %1 = load buf0[o0*s0 % + 0] : f32 [pass 0, inner]"),
       "line 6: malformed stride of o0 's0 %'"},
      {WithLine(6, "  %1 = load buf0[o0*" + huge + " + 0] : f32 [pass 0, inner]"),
       "line 6: stride of o0 '" + huge + "' is out of range of int64"},
      {WithLine(6, "  %1 = load buf0[o0*8 + " + deep + "] : f32 [pass 0, inner]"),
       "line 6: malformed offset"},
      {WithLine(6, "  %1 = load buf0[o0*8 + i0*1 + 0 : f32 [pass 0, inner]"),
       "line 6: expected ']' after the index of buf0"},
      {WithLine(7, "  store buf1[o0*8 + i0*1 + 0] = %2 [pass 0, inner]"),
       "line 7: operand %2 is not a statement before %2"},
      {absl::StrCat(kSmall, "  %3 = neg %2 : f32 [pass 0, inner]\n"),
       "line 8: operand %2 is a store, which has no value"},
      {WithLine(2, "  nodes:"), "line 2: expected node names"},
      {WithLine(5, "  buf0 = x : f32"), "line 5: expected 'buf2 = <value> : <dtype>'"},
      {WithLine(5, "  what"),
       "line 5: expected a statement ('%0 = ...', 'store ...' or 'accumulate ...')"},
  };
  for (const auto& [text, want] : cases) {
    absl::StatusOr<Kernel> k = ParseKernel(text);
    ASSERT_FALSE(k.ok()) << text;
    EXPECT_EQ(k.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(k.status().message().find(want), absl::string_view::npos)
        << k.status().message() << "\nwanted: " << want;
    // Errors quote a short prefix of what they refuse.
    EXPECT_LT(k.status().message().size(), 200u) << k.status().message();
  }
}

TEST(KernelParserTest, HostileTextIsRefusedQuickly) {
  // Every prefix and every single-byte change of a valid text parses or is
  // INVALID_ARGUMENT.
  const std::string text(kSmall);
  for (size_t n = 0; n <= text.size(); ++n) {
    absl::StatusOr<Kernel> k = ParseKernel(text.substr(0, n));
    EXPECT_TRUE(k.ok() || k.status().code() == absl::StatusCode::kInvalidArgument) << n;
  }
  for (size_t at = 0; at < text.size(); ++at) {
    for (char c : {'\0', '\n', ' ', '%', '[', ']', '(', ')', ',', '9', '-', '*', '+', ':'}) {
      std::string changed = text;
      changed[at] = c;
      absl::StatusOr<Kernel> k = ParseKernel(changed);
      EXPECT_TRUE(k.ok() || k.status().code() == absl::StatusCode::kInvalidArgument) << changed;
    }
  }
  // Long lines: a million operands, a deep stride, a long list of sizes;
  // each refused at once.
  std::string operands = "  %1 = add %0";
  for (int k = 0; k < 1000000; ++k) operands += ", %0";
  EXPECT_FALSE(ParseKernel(WithLine(6, operands + " : f32 [pass 0, inner]")).ok());
  const std::string deep = std::string(1000000, '(') + "s0" + std::string(1000000, ')');
  EXPECT_FALSE(
      ParseKernel(WithLine(6, "  %1 = load buf0[o0*" + deep + " + 0] : f32 [pass 0, inner]")).ok());
  std::string sizes = "kernel k: outer [1";
  for (int k = 0; k < 1000000; ++k) sizes += ", 1";
  EXPECT_EQ(ParseKernel(sizes + "] inner [1] passes 1\n  buffers:\n").status().message(),
            "line 1: more than 64 outer dimensions");
  // Many statements: linear.
  std::string many(kSmall);
  for (int j = 3; j < 200000; ++j) {
    absl::StrAppend(&many, "  %", j, " = neg %", j - 1 == 2 ? 1 : j - 1,
                    " : f32 [pass 0, inner]\n");
  }
  absl::StatusOr<Kernel> k = ParseKernel(many);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->stmts.size(), 200000u);
}

// A pass test, text in and text out: a mean over long rows, then the rows
// centered, on a device that wants 264 blocks where the kernel launches 4.
TEST(KernelParserTest, SplitReductionsTextInTextOut) {
  SplitPolicy policy;
  policy.blocks = [](const Kernel& k) -> std::optional<int64_t> { return k.outer[0].constant(); };
  absl::StatusOr<LoweredGraph> lowered = SplitParsed(R"(
kernel kernel_0: outer [4] inner [16384] passes 2
  nodes: mean, sub
  buffers:
    buf0 = x : f32
    buf1 = mean : f32 (written)
    buf2 = centered : f32 (written)
  %0 = load buf0[o0*16384 + i0*1 + 0] : f32 [pass 0, inner]
  %1 = reduce sum %0 : f32 [pass 0, inner]
  %2 = constant 16384 : f32 [pass 0, outer]
  %3 = div %1, %2 : f32 [pass 0, outer]
  store buf1[o0*1 + 0] = %3 [pass 0, outer]
  %5 = load buf0[o0*16384 + i0*1 + 0] : f32 [pass 1, inner]
  %6 = sub %5, %3 : f32 [pass 1, inner]
  store buf2[o0*16384 + i0*1 + 0] = %6 [pass 1, inner]
)",
                                                     policy);
  ASSERT_TRUE(lowered.ok()) << lowered.status();

  // Eight slices of 2048 per row, their partial sums in [8, 4]; the slices'
  // sums then the mean per row; the rows centered over the whole space.
  const std::string want = R"(kernel kernel_0_partial: outer [8, 4] inner [2048] passes 1
  nodes: mean, sub
  buffers:
    buf0 = x : f32
    buf1 = mean : f32
    buf2 = centered : f32
    buf3 = kernel_0_partial0 : f32 (written)
    buf4 = kernel_0_row0 : f32
  %0 = load buf0[o0*2048 + o1*16384 + i0*1 + 0] : f32 [pass 0, inner]
  %1 = reduce sum %0 : f32 [pass 0, inner]
  store buf3[o0*4 + o1*1 + 0] = %1 [pass 0, outer]

kernel kernel_0: outer [4] inner [8] passes 1
  nodes: mean, sub
  buffers:
    buf0 = x : f32
    buf1 = mean : f32 (written)
    buf2 = centered : f32
    buf3 = kernel_0_partial0 : f32
    buf4 = kernel_0_row0 : f32 (written)
  %0 = load buf3[o0*1 + i0*4 + 0] : f32 [pass 0, inner]
  %1 = reduce sum %0 : f32 [pass 0, inner]
  %2 = constant 16384 : f32 [pass 0, outer]
  %3 = div %1, %2 : f32 [pass 0, outer]
  store buf1[o0*1 + 0] = %3 [pass 0, outer]
  store buf4[o0*1 + 0] = %3 [pass 0, outer]

kernel kernel_0_apply: outer [4] inner [16384] passes 1
  nodes: mean, sub
  buffers:
    buf0 = x : f32
    buf1 = mean : f32
    buf2 = centered : f32 (written)
    buf3 = kernel_0_partial0 : f32
    buf4 = kernel_0_row0 : f32
  %0 = load buf4[o0*1 + 0] : f32 [pass 0, inner]
  %1 = load buf0[o0*16384 + i0*1 + 0] : f32 [pass 0, inner]
  %2 = sub %1, %0 : f32 [pass 0, inner]
  store buf2[o0*16384 + i0*1 + 0] = %2 [pass 0, inner]
)";
  std::string got;
  for (const Kernel& out : lowered->kernels) {
    absl::StrAppend(&got, got.empty() ? "" : "\n", PrintKernel(out));
  }
  EXPECT_EQ(got, want);
  ASSERT_EQ(lowered->decisions.size(), 1u);
  EXPECT_EQ(lowered->decisions[0],
            "split: kernel_0 (4 blocks) reduces 8 slices of each row in kernel_0_partial, outer "
            "[8, 4] inner [2048], then the slices in kernel_0, then its later passes over the "
            "whole space in kernel_0_apply");
}

// A kernel's own least slice (min_slice_of) overrides min_slice: rows of
// 2048 make no two slices of 2048, but eight of 256.
TEST(KernelParserTest, SplitReductionsTakesEachKernelsLeastSlice) {
  const std::string text = R"(kernel kernel_0: outer [4] inner [2048] passes 1
  nodes: sum
  buffers:
    buf0 = x : f32
    buf1 = out : f32 (written)
  %0 = load buf0[o0*1 + i0*4 + 0] : f32 [pass 0, inner]
  %1 = reduce sum %0 : f32 [pass 0, inner]
  store buf1[o0*1 + 0] = %1 [pass 0, outer]
)";
  for (const int64_t least : {int64_t{0}, int64_t{256}}) {
    SplitPolicy policy;
    policy.split_below = 132;
    policy.min_blocks = 32;
    policy.blocks = [](const Kernel& k) -> std::optional<int64_t> { return k.outer[0].constant(); };
    if (least > 0) policy.min_slice_of = [least](const Kernel&) { return least; };
    absl::StatusOr<LoweredGraph> lowered = SplitParsed(text, policy);
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    ASSERT_EQ(lowered->decisions.size(), 1u);
    if (least == 0) {
      EXPECT_EQ(lowered->decisions[0],
                "no split: kernel_0 launches 4 blocks: rows of 2048 elements make fewer than 2 "
                "slices of 2048 or more that divide their first dimension");
    } else {
      EXPECT_EQ(lowered->decisions[0],
                "split: kernel_0 (4 blocks) reduces 8 slices of each row in kernel_0_partial, "
                "outer [8, 4] inner [256], then the slices in kernel_0");
    }
  }
}

// fewer_slices_of: a sum over 8192 rows in 32 blocks wants 264 blocks, 9
// slices; the fewest from 9 up that divide 8192 are 16 (512 blocks), the
// most up to 9 are 8 (256 blocks, nine tenths of 264 and more), taken
// where the kernel asks. 12 blocks want 22 slices: 16 (192 blocks) fall
// short, and 32 stay.
TEST(KernelParserTest, SplitReductionsTakesFewerSlicesWhereTheyStillFillTheSms) {
  for (const int64_t columns : {int64_t{32}, int64_t{12}}) {
    for (const bool fewer : {false, true}) {
      const std::string text = absl::StrCat("kernel kernel_0: outer [", columns,
                                            R"(] inner [8192] passes 1
  nodes: sum
  buffers:
    buf0 = x : f32
    buf1 = out : f32 (written)
  %0 = load buf0[o0*1 + i0*)",
                                            columns, R"( + 0] : f32 [pass 0, inner]
  %1 = reduce sum %0 : f32 [pass 0, inner]
  store buf1[o0*1 + 0] = %1 [pass 0, outer]
)");
      SplitPolicy policy;
      policy.split_below = 132;
      policy.min_blocks = 264;
      policy.min_slice = 256;
      policy.blocks = [](const Kernel& k) -> std::optional<int64_t> {
        return k.outer.back().constant();
      };
      if (fewer) policy.fewer_slices_of = [](const Kernel&) { return true; };
      absl::StatusOr<LoweredGraph> lowered = SplitParsed(text, policy);
      ASSERT_TRUE(lowered.ok()) << lowered.status();
      ASSERT_EQ(lowered->decisions.size(), 1u);
      const int slices = columns == 32 ? (fewer ? 8 : 16) : 32;
      EXPECT_EQ(lowered->decisions[0],
                absl::StrCat("split: kernel_0 (", columns, " blocks) reduces ", slices,
                             " slices of each row in kernel_0_partial, outer [", slices, ", ",
                             columns, "] inner [", 8192 / slices, "], then the slices in kernel_0"))
          << columns << " " << fewer;
    }
  }
}

// And unchanged is unchanged: a softmax's later passes reduce, so it stays
// whole, with the reason.
TEST(KernelParserTest, SplitReductionsLeavesSoftmaxWhole) {
  const std::string text = R"(kernel kernel_0: outer [4] inner [16384] passes 2
  nodes: softmax
  buffers:
    buf0 = x : f32
    buf1 = out : f32 (written)
  %0 = load buf0[o0*16384 + i0*1 + 0] : f32 [pass 0, inner]
  %1 = reduce max %0 : f32 [pass 0, inner]
  %2 = load buf0[o0*16384 + i0*1 + 0] : f32 [pass 1, inner]
  %3 = sub %2, %1 : f32 [pass 1, inner]
  %4 = exp %3 : f32 [pass 1, inner]
  %5 = reduce sum %4 : f32 [pass 1, inner]
  %6 = div %4, %5 : f32 [pass 1, inner]
  store buf1[o0*16384 + i0*1 + 0] = %6 [pass 1, inner]
)";
  SplitPolicy policy;
  policy.blocks = [](const Kernel& k) -> std::optional<int64_t> { return k.outer[0].constant(); };
  absl::StatusOr<LoweredGraph> lowered = SplitParsed(text, policy);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  ASSERT_EQ(lowered->kernels.size(), 1u);
  EXPECT_EQ(PrintKernel(lowered->kernels[0]), text);
  ASSERT_EQ(lowered->decisions.size(), 1u);
  EXPECT_EQ(lowered->decisions[0],
            "no split: kernel_0 launches 4 blocks: reductions in a later pass");
}

}  // namespace
}  // namespace kiln::loop
