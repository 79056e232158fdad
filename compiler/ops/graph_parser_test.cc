// The graph IR's parser: every graph under tests/data (and its joint,
// forward and backward graphs) reads back as it printed, hand-written text
// reads as meant, malformed text is refused with its line, and pass tests
// written as text in, text out.
#include "compiler/ops/graph_parser.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compiler/autograd/joint_graph.h"
#include "compiler/autograd/partition.h"
#include "compiler/ir/dead_code.h"
#include "compiler/ir/printer.h"
#include "compiler/ir/verify.h"
#include "compiler/pipeline/attention.h"
#include "google/protobuf/util/json_util.h"
#include "kiln/v1/service.pb.h"
#include "tests/data/graph_files.h"

namespace kiln::ops {
namespace {

// Parses what PrintReadable printed of `g` and checks that it prints the
// same.
void ExpectRoundTrip(const ir::Graph& g, const std::string& label) {
  const std::string text = ir::PrintReadable(g);
  ParseOptions options;
  for (const ir::Input& in : g.inputs()) {
    const ir::Value& v = g.value(in.value);
    if (v.meta.requires_grad) options.requires_grad.insert(v.name);
    if (in.kind != v1::Placeholder::USER_INPUT) options.input_kinds[v.name] = in.kind;
    options.device = v.meta.device_type;
    if (v.meta.device_index >= 0) absl::StrAppend(&options.device, ":", v.meta.device_index);
  }
  // A graph the shape rules disagree with (a CPU capture moved to the GPU,
  // where batch norm's saved statistics have other sizes) is read without
  // them.
  if (!CheckMetadata(DefaultRegistry(), g).ok()) options.registry = nullptr;
  absl::StatusOr<ir::Graph> parsed = ParseReadable(text, options);
  // What the verifier refuses, the parser refuses too.
  const absl::Status valid = ir::Verify(g);
  if (!valid.ok()) {
    EXPECT_FALSE(parsed.ok()) << label;
    std::cerr << label << " fails ir::Verify (" << valid
              << "), and the parser says: " << parsed.status() << "\n";
    return;
  }
  ASSERT_TRUE(parsed.ok()) << label << ": " << parsed.status() << "\n" << text;
  EXPECT_EQ(ir::PrintReadable(*parsed), text) << label;
  ASSERT_EQ(parsed->inputs().size(), g.inputs().size());
  for (size_t k = 0; k < g.inputs().size(); ++k) {
    EXPECT_EQ(parsed->inputs()[k].kind, g.inputs()[k].kind) << label;
  }
}

// Each graph on the CPU and on the GPU (with the attention rewrite the CUDA
// pipeline makes), and for training graphs the joint graph and its halves.
TEST(GraphParser, RoundTripsTheTestGraphsAndTheirAutogradGraphs) {
  const std::vector<std::string> paths = testing::TestGraphFiles();
  ASSERT_FALSE(paths.empty());
  int graphs = 0;
  for (const std::string& path : paths) {
    std::ifstream f(path);
    std::stringstream text;
    text << f.rdbuf();
    v1::GraphFile file;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &file).ok()) << path;
    for (const std::string device : {"cpu", "cuda"}) {
      const std::string label = absl::StrCat(path, " ", device);
      v1::Graph proto = file.graph();
      if (device == "cuda") ir::MoveTensors(&proto, "cuda", 0);
      absl::StatusOr<ir::Graph> graph = ir::Graph::FromProto(proto);
      ASSERT_TRUE(graph.ok()) << label << ": " << graph.status();
      ExpectRoundTrip(*graph, label);
      ++graphs;
      bool training = false;
      for (const auto& in : graph->inputs()) {
        training = training || graph->value(in.value).meta.requires_grad;
      }
      if (device == "cuda") {
        pipeline::AttentionOptions attention;
        attention.training = training;
        absl::StatusOr<int> fused = pipeline::RewriteAttention(*graph, &*graph, attention);
        ASSERT_TRUE(fused.ok()) << label << ": " << fused.status();
        if (*fused > 0) {
          ExpectRoundTrip(*graph, label + " attention");
          ++graphs;
        }
      }
      if (!training) continue;
      auto joint = autograd::BuildJointGraph(*graph, autograd::JointOptions());
      ASSERT_TRUE(joint.ok()) << label << ": " << joint.status();
      ExpectRoundTrip(joint->graph, label + " joint");
      auto split = autograd::PartitionJointGraph(*joint);
      ASSERT_TRUE(split.ok()) << label << ": " << split.status();
      ExpectRoundTrip(split->forward, label + " forward");
      ExpectRoundTrip(split->backward, label + " backward");
      graphs += 3;
    }
  }
  // Six graphs on two devices, five of them training graphs, one with
  // attention.
  EXPECT_GE(graphs, 6 * 2 + 5 * 2 * 3 + 1);
}

// Every kind of argument the printer writes.
constexpr const char* kEveryKind = R"(# graph 'kinds'
def forward(self, x: "f32[s0, 16]", w: "f32[16, 16]", i: "i64[s0]"):
    mm: "f32[s0, 16]" = aten.mm.default(x, w)
    view: "f32[s0, 4, 4]" = aten.view.default(mm, [s0, 4, 4])
    permute: "f32[16, s0]" = aten.permute.default(mm, [1, 0])
    add: "f32[s0, 16]" = aten.add.Tensor(x, mm, alpha=2)
    add_1: "f32[s0, 16]" = aten.add.Scalar(add, 1e-06)
    gelu: "f32[s0, 16]" = aten.gelu.default(add_1, approximate='tanh')
    cat: "f32[2*s0, 16]" = aten.cat.default([x, gelu])
    copy: "f16[s0, 16]" = aten._to_copy.default(gelu, dtype=torch.float16, layout=torch.strided, device=device('cpu'))
    clone: "f32[s0, 16]" = aten.clone.default(gelu, memory_format=torch.contiguous_format)
    returned: "f32[16]" = aten.sum.dim_IntList(mm, [0], False)
    var_mean_1, var_mean_2 = aten.var_mean.correction(x, [1], correction=0, keepdim=True)  # f32[s0, 1], f32[s0, 1]
    index: "f32[s0, 16]" = aten.index.Tensor(x, [i, None])
    full: "f32[s0]" = aten.full.default([s0], 0.5, dtype=torch.float32)
    return (view, permute, cat, copy, clone, returned, var_mean_1, var_mean_2, index, full)
)";

TEST(GraphParser, ReadsEveryArgumentKind) {
  absl::StatusOr<ir::Graph> g = ParseReadable(kEveryKind);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(ir::PrintReadable(*g), kEveryKind);
  EXPECT_EQ(g->name(), "kinds");
  const ir::Node& view = g->nodes()[1];
  ASSERT_TRUE(std::holds_alternative<std::vector<ir::SymInt>>(view.args[1].kind));
  const ir::Node& sum = g->nodes()[9];
  EXPECT_TRUE(std::holds_alternative<std::vector<int64_t>>(sum.args[1].kind));
  EXPECT_TRUE(std::holds_alternative<bool>(sum.args[2].kind));
  const ir::Node& add = g->nodes()[3];
  ASSERT_EQ(add.kwargs.size(), 1u);
  EXPECT_EQ(add.kwargs[0].name, "alpha");
  EXPECT_TRUE(std::holds_alternative<int64_t>(add.kwargs[0].kind));
}

TEST(GraphParser, ReadsTheHeadersExample) {
  constexpr const char* kExample = R"(# graph 'rmsnorm'
def forward(self, x: "f32[s0, 16]", w: "f32[16]"):
    pow_1: "f32[s0, 16]" = aten.pow.Tensor_Scalar(x, 2)
    mean: "f32[s0, 1]" = aten.mean.dim(pow_1, [-1], True)
    add: "f32[s0, 1]" = aten.add.Scalar(mean, 1e-06)
    var_mean_1, var_mean_2 = aten.var_mean.correction(x, [1])  # f32[s0], f32[s0]
    return (add,)
)";
  absl::StatusOr<ir::Graph> g = ParseReadable(kExample);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(ir::PrintReadable(*g), kExample);
}

TEST(GraphParser, RebuildsWhatThePrinterLeavesOut) {
  ParseOptions options;
  options.device = "cuda:0";
  options.requires_grad = {"w"};
  options.input_kinds = {{"w", v1::Placeholder::PARAMETER}};
  absl::StatusOr<ir::Graph> g = ParseReadable(R"(
def forward(self, x: "f32[8, 16]", w: "f32[16, 4]"):
    mm: "f32[8, 4]" = aten.mm.default(x, w)
    permute: "f32[4, 8]" = aten.permute.default(mm, [1, 0])
    relu: "f32[8, 16]" = aten.relu.default(x)
    return (permute, relu)
)",
                                              options);
  ASSERT_TRUE(g.ok()) << g.status();
  const ir::Value& x = g->value(g->inputs()[0].value);
  EXPECT_EQ(x.meta.strides, (std::vector<ir::SymInt>{{int64_t{16}}, {int64_t{1}}}));
  EXPECT_EQ(x.meta.device_type, "cuda");
  EXPECT_EQ(x.meta.device_index, 0);
  EXPECT_FALSE(x.meta.requires_grad);
  EXPECT_EQ(g->inputs()[0].kind, v1::Placeholder::USER_INPUT);
  EXPECT_EQ(g->inputs()[1].kind, v1::Placeholder::PARAMETER);
  const ir::Value& permute = g->value(g->outputs()[0]);
  // A view keeps the strides of what it views.
  EXPECT_EQ(permute.meta.strides, (std::vector<ir::SymInt>{{int64_t{1}}, {int64_t{4}}}));
  EXPECT_TRUE(permute.meta.requires_grad);
  EXPECT_FALSE(g->value(g->outputs()[1]).meta.requires_grad);
}

constexpr const char* kSmall = R"(# graph 'small'
def forward(self, x: "f32[4, 8]", w: "f32[8]"):
    mul: "f32[4, 8]" = aten.mul.Tensor(x, w)
    sum_1: "f32[4]" = aten.sum.dim_IntList(mul, [1], False)
    return (sum_1,)
)";

// The status of parsing `text`, which must be INVALID_ARGUMENT.
std::string ErrorOf(const std::string& text, const ParseOptions& options = ParseOptions()) {
  absl::StatusOr<ir::Graph> g = ParseReadable(text, options);
  EXPECT_FALSE(g.ok()) << text;
  if (g.ok()) return "";
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
  return std::string(g.status().message());
}

TEST(GraphParser, RefusesEveryTruncation) {
  ASSERT_TRUE(ParseReadable(kSmall).ok());
  const std::string text = kSmall;
  const size_t end = text.rfind(')');
  for (size_t n = 0; n < end; ++n) {
    const std::string error = ErrorOf(text.substr(0, n));
    EXPECT_TRUE(absl::StartsWith(error, "line ")) << n << ": " << error;
  }
}

struct BadCase {
  std::string from;  // replaced in kSmall
  std::string to;
  std::string error;  // the message contains it
};

TEST(GraphParser, RefusesMalformedText) {
  const std::vector<BadCase> cases = {
      {"aten.mul.Tensor", "aten.frobnicate.default", "line 3: unknown target 'aten.frobnicate"},
      {"(x, w)", "(x, y)", "line 3: expected a value, got 'y', which no input"},
      {"(x, w)", "(x)", "line 3: aten.mul.Tensor needs argument 'other'"},
      {"(x, w)", "(x, w, w)", "line 3: aten.mul.Tensor takes 2 positional arguments"},
      {"(x, w)", "(x, other=w, other=w)", "given twice"},
      {"(x, w)", "(x, bogus=w)", "has no parameter 'bogus'"},
      {"(x, w)", "(x, w", "line 3: expected ')' closing the arguments"},
      {"[1]", "[99999999999999999999]",
       "line 4: an integer '99999999999999999999' is out of range"},
      {"[1]", "[1e999]", "line 4: expected an integer"},
      {"[1]", "[s0 +]", "line 4: expected an integer"},
      {"False)", "Maybe)", "line 4: expected True or False for 'keepdim'"},
      {"f32[4]", "f32[5]", "line 4:"},
      {"f32[4]", "q32[4]", "line 4: expected a dtype"},
      {"f32[4]", "f32[4", "line 4: expected metadata"},
      {"f32[4]", "f32[99999999999999999999999]", "out of range of int64"},
      {"sum_1: \"f32[4]\" =", "x: \"f32[4]\" =", "line 4: 'x' is defined twice"},
      {"sum_1: \"f32[4]\" = ", "sum_1: \"f32[4]\" ", "line 4: expected ' = '"},
      {"(sum_1,)", "(sum_2,)", "line 5: expected a value, got 'sum_2'"},
      {"return (sum_1,)", "return sum_1", "line 5: expected 'return (<values>)'"},
      {"def forward(self, ", "def forward(this, ", "line 2: expected 'def forward(self"},
      {"w: \"f32[8]\"", "w \"f32[8]\"", "line 2: expected '<input>: \"<metadata>\"'"},
      {"mul: \"f32[4, 8]\" = aten.mul.Tensor(x, w)",
       "mul, mul_2 = aten.mul.Tensor(x, w)  # f32[4, 8], f32[4, 8]",
       "line 3: aten.mul.Tensor returns 1 outputs, the line names 2"},
      {"aten.sum.dim_IntList(mul, [1], False)", "aten.sum.dim_IntList(mul, [1], False) junk",
       "line 4: expected the end of the line"},
      {"sum_1: \"f32[4]\"", "sum_1", "line 4: expected 'sum_1: \"<metadata>\" = ...'"},
      {"[1]", "[1, 2]",
       "line 4: aten.sum.dim_IntList: argument 'dim': dimension 2 is out of range"},
      {"[1]", "[0]", "line 4: node 'sum_1_node' (aten.sum.dim_IntList) output 0 'sum_1': size[0]"},
      {"f32[4]", absl::StrCat("f32[", std::string(2000, 's'), "]"),
       "is longer than 1024 characters (GraphLimits.max_expr_length)"},
      {"(x, w)", "(x, device('cpu'))", "line 3: expected a value for 'other' (Tensor)"},
  };
  for (const BadCase& c : cases) {
    std::string text = kSmall;
    const size_t at = text.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from;
    text.replace(at, c.from.size(), c.to);
    const std::string error = ErrorOf(text);
    EXPECT_TRUE(absl::StrContains(error, c.error)) << c.to << "\n  got: " << error;
  }
  EXPECT_TRUE(absl::StrContains(ErrorOf(std::string(kSmall) + "    relu = aten.relu(x)\n"),
                                "line 6: expected nothing after the return"));
  ParseOptions options;
  options.requires_grad = {"nope"};
  EXPECT_TRUE(absl::StrContains(ErrorOf(kSmall, options), "requires_grad names 'nope'"));
  options = ParseOptions();
  options.device = "cuda:x";
  EXPECT_TRUE(absl::StrContains(ErrorOf(kSmall, options), "ParseOptions.device"));
}

TEST(GraphParser, HostileTextIsRefusedQuickly) {
  const auto start = std::chrono::steady_clock::now();
  // One enormous line of brackets, an enormous expression, many nodes.
  ErrorOf(absl::StrCat("def forward(self, x: \"f32[", std::string(1 << 20, '['), "]\"):"));
  ErrorOf(absl::StrCat("def forward(self, x: \"f32[", std::string(1 << 20, '('), "s0]\"):"));
  ErrorOf(absl::StrCat("def forward(self, x: \"f32[s0", std::string(1 << 18, '+'), "]\"):"));
  std::string chain = "def forward(self, x: \"f32[4]\"):\n";
  std::string last = "x";
  for (int k = 0; k < 20000; ++k) {
    const std::string name = absl::StrCat("r", k);
    absl::StrAppend(&chain, "    ", name, ": \"f32[4]\" = aten.relu.default(", last, ")\n");
    last = name;
  }
  absl::StatusOr<ir::Graph> long_chain = ParseReadable(chain + "    return (" + last + ",)\n");
  EXPECT_TRUE(long_chain.ok()) << long_chain.status();
  ErrorOf(chain + "    return (" + last + ", undefined)\n");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 20.0);
}

// Random edits of printed graphs (a character replaced, dropped or
// doubled, a token swapped for another) are read or refused, never crash.
TEST(GraphParser, SurvivesRandomEdits) {
  std::vector<std::string> texts = {kEveryKind, kSmall};
  for (const std::string& path : testing::TestGraphFiles()) {
    std::ifstream f(path);
    std::stringstream text;
    text << f.rdbuf();
    v1::GraphFile file;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &file).ok()) << path;
    absl::StatusOr<ir::Graph> graph = ir::Graph::FromProto(file.graph());
    ASSERT_TRUE(graph.ok()) << graph.status();
    texts.push_back(ir::PrintReadable(*graph));
  }
  const std::vector<std::string> tokens = {"0",  "-1", "None", "[]",   "True", "s0", "x",
                                           "(",  ")",  "[",    "]",    ",",    "\"", "'",
                                           "\n", "=",  "#",    "1e99", "f32",  ".",  "-"};
  std::mt19937 rng(1234);
  int ok = 0;
  for (const std::string& original : texts) {
    for (int round = 0; round < 2000; ++round) {
      std::string text = original;
      const size_t at = rng() % text.size();
      switch (rng() % 4) {
        case 0:
          text.erase(at, 1);
          break;
        case 1:
          text.insert(at, 1, text[at]);
          break;
        case 2:
          text[at] = static_cast<char>(32 + rng() % 95);
          break;
        default:
          text.insert(at, tokens[rng() % tokens.size()]);
          break;
      }
      absl::StatusOr<ir::Graph> g = ParseReadable(text);
      if (g.ok()) {
        ++ok;
        continue;
      }
      EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
    }
  }
  // Some edits leave valid text (a name changed everywhere it matters).
  EXPECT_GT(ok, 0);
}

// Pass tests, text in and text out.

TEST(GraphParser, DeadCodeEliminationTextInTextOut) {
  absl::StatusOr<ir::Graph> g = ParseReadable(R"(# graph 'dce'
def forward(self, x: "f32[4]", y: "f32[4]"):
    a: "f32[4]" = aten.relu.default(x)
    b: "f32[4]" = aten.exp.default(y)
    c: "f32[4]" = aten.mul.Tensor(a, b)
    d: "f32[4]" = aten.neg.default(a)
    return (d,)
)");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(ir::EliminateDeadCode(&*g));
  EXPECT_EQ(ir::PrintReadable(*g), R"(# graph 'dce'
def forward(self, x: "f32[4]", y: "f32[4]"):
    a: "f32[4]" = aten.relu.default(x)
    d: "f32[4]" = aten.neg.default(a)
    return (d,)
)");
  EXPECT_FALSE(ir::EliminateDeadCode(&*g));
}

TEST(GraphParser, PartitionTextInTextOut) {
  ParseOptions options;
  options.requires_grad = {"w"};
  absl::StatusOr<ir::Graph> g = ParseReadable(R"(# graph 'mlp'
def forward(self, x: "f32[8, 16]", w: "f32[16, 4]"):
    mm: "f32[8, 4]" = aten.mm.default(x, w)
    relu: "f32[8, 4]" = aten.relu.default(mm)
    sum_1: "f32[]" = aten.sum.default(relu)
    return (sum_1,)
)",
                                              options);
  ASSERT_TRUE(g.ok()) << g.status();
  auto joint = autograd::BuildJointGraph(*g, autograd::JointOptions());
  ASSERT_TRUE(joint.ok()) << joint.status();
  auto split = autograd::PartitionJointGraph(*joint);
  ASSERT_TRUE(split.ok()) << split.status();
  // relu's mask is saved, a byte an element, rather than mm (four bytes an
  // element) for the backward to recompute relu and compare it.
  EXPECT_EQ(ir::PrintReadable(split->forward), R"(# graph 'mlp_joint_forward'
def forward(self, x: "f32[8, 16]", w: "f32[16, 4]"):
    mm: "f32[8, 4]" = aten.mm.default(x, w)
    relu: "f32[8, 4]" = aten.relu.default(mm)
    sum_1: "f32[]" = aten.sum.default(relu)
    n1_v: "b8[8, 4]" = aten.le.Scalar(relu, 0)
    return (sum_1, x, n1_v)
)");
  EXPECT_EQ(ir::PrintReadable(split->backward), R"(# graph 'mlp_joint_backward'
def forward(self, x: "f32[8, 16]", n1_v: "b8[8, 4]", tangent_0: "f32[]"):
    n0_v: "f32[8, 4]" = aten.expand.default(tangent_0, [8, 4])
    n2_v: "f32[8, 4]" = aten.masked_fill.Scalar(n0_v, n1_v, 0)
    n3_v: "f32[16, 8]" = aten.t.default(x)
    n4_v: "f32[16, 4]" = aten.mm.default(n3_v, n2_v)
    return (n4_v,)
)");
}

}  // namespace
}  // namespace kiln::ops
