#include "compiler/ir/graph.h"

#include <gtest/gtest.h>

#include "compiler/ir/canonical.h"
#include "compiler/ir/printer.h"
#include "compiler/ir/verify.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"

namespace kiln::ir {
namespace {

constexpr char kMeta[] =
    R"(meta { dtype: FLOAT32 sizes { int_value: 4 } sizes { int_value: 8 }
              strides { int_value: 8 } strides { int_value: 1 } device { type: "cpu" index: -1 } })";

std::string V(const std::string& name) { return "{ name: \"" + name + "\" " + kMeta + " }"; }

// x -> relu -> a ; x -> neg -> b ; add(a, b) -> c
v1::Graph Diamond(bool swap_independent = false, const std::string& prefix = "") {
  std::string relu = "nodes { name: \"" + prefix +
                     "relu\" target: \"aten.relu.default\" args { tensor: \"" + prefix +
                     "x\" } outputs " + V(prefix + "a") + " }\n";
  std::string neg = "nodes { name: \"" + prefix +
                    "neg\" target: \"aten.neg.default\" args { tensor: \"" + prefix +
                    "x\" } outputs " + V(prefix + "b") + " }\n";
  std::string text = "name: \"diamond\" inputs { kind: USER_INPUT value " + V(prefix + "x") +
                     " }\n" + (swap_independent ? neg + relu : relu + neg) + "nodes { name: \"" +
                     prefix + "add\" target: \"aten.add.Tensor\" args { tensor: \"" + prefix +
                     "a\" } args { tensor: \"" + prefix +
                     "b\" } kwargs { name: \"alpha\" int_value: 1 } outputs " + V(prefix + "c") +
                     " }\n" + "outputs: \"" + prefix + "c\"\n";
  v1::Graph g;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &g)) << text;
  return g;
}

Graph MustBuild(const v1::Graph& p) {
  auto g = Graph::FromProto(p);
  EXPECT_TRUE(g.ok()) << g.status();
  return *std::move(g);
}

absl::Status BuildAndVerify(const v1::Graph& p) {
  auto g = Graph::FromProto(p);
  if (!g.ok()) return g.status();
  return Verify(*g);
}

TEST(GraphTest, RoundTripsLosslessly) {
  v1::Graph p = Diamond();
  Graph g = MustBuild(p);
  v1::Graph back = g.ToProto();
  // Storage offsets are filled in with their default; everything else is equal.
  for (auto* in : {back.mutable_inputs(0)->mutable_value()})
    in->mutable_meta()->clear_storage_offset();
  for (auto& n : *back.mutable_nodes()) {
    for (auto& o : *n.mutable_outputs()) o.mutable_meta()->clear_storage_offset();
  }
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(p, back))
      << p.DebugString() << "\nvs\n"
      << back.DebugString();
  // IR -> proto -> IR -> proto is the identity.
  v1::Graph again = MustBuild(g.ToProto()).ToProto();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(g.ToProto(), again));
}

TEST(GraphTest, SortsNodesTopologically) {
  v1::Graph p = Diamond();
  // Move the consumer first.
  p.mutable_nodes()->SwapElements(0, 2);
  Graph g = MustBuild(p);
  EXPECT_EQ(g.nodes().back().target, "aten.add.Tensor");
  EXPECT_TRUE(Verify(g).ok());
}

TEST(GraphTest, VerifyErrorsNameWhatIsWrong) {
  struct Case {
    std::string what;
    std::function<void(v1::Graph*)> mutate;
    std::string expect;
  };
  std::vector<Case> cases = {
      {"dangling", [](v1::Graph* g) { g->mutable_nodes(2)->mutable_args(1)->set_tensor("nope"); },
       "node 'add' argument 1 refers to 'nope'"},
      {"duplicate", [](v1::Graph* g) { g->mutable_nodes(1)->mutable_outputs(0)->set_name("a"); },
       "'a' is defined twice"},
      {"duplicate node", [](v1::Graph* g) { g->mutable_nodes(1)->set_name("relu"); },
       "node name 'relu' is used twice"},
      {"cycle", [](v1::Graph* g) { g->mutable_nodes(0)->mutable_args(0)->set_tensor("c"); },
       "graph has a cycle: 'relu' -> 'add' -> 'relu'"},
      {"output names nothing", [](v1::Graph* g) { g->set_outputs(0, "zz"); },
       "graph output 0 refers to 'zz'"},
      {"missing meta", [](v1::Graph* g) { g->mutable_nodes(1)->mutable_outputs(0)->clear_meta(); },
       "node 'neg' output 0 'b' has no metadata"},
      {"no dtype",
       [](v1::Graph* g) { g->mutable_inputs(0)->mutable_value()->mutable_meta()->clear_dtype(); },
       "input 0 'x': metadata has no dtype"},
      {"no device",
       [](v1::Graph* g) { g->mutable_inputs(0)->mutable_value()->mutable_meta()->clear_device(); },
       "input 0 'x': metadata has no device"},
      {"rank mismatch",
       [](v1::Graph* g) {
         g->mutable_nodes(0)->mutable_outputs(0)->mutable_meta()->mutable_strides()->RemoveLast();
       },
       "node 'relu' output 'a': metadata has 2 sizes but 1 strides"},
      {"bad target", [](v1::Graph* g) { g->mutable_nodes(1)->set_target("neg"); },
       "node 'neg': target 'neg' is not of the form"},
      {"empty",
       [](v1::Graph* g) {
         g->clear_nodes();
         g->clear_outputs();
       },
       "graph is empty"},
      {"no outputs", [](v1::Graph* g) { g->clear_outputs(); }, "graph has no outputs"},
      {"kind not set", [](v1::Graph* g) { g->mutable_nodes(1)->mutable_args(0)->clear_kind(); },
       "node 'neg' argument 0 has no value"},
  };
  for (const Case& c : cases) {
    v1::Graph p = Diamond();
    c.mutate(&p);
    absl::Status s = BuildAndVerify(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << s;
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << c.what << ": " << s;
  }
}

TEST(CanonicalTest, RenamingAndReorderingKeepTheKey) {
  v1::CompileOptions opts;
  const std::string k = CacheKey(MustBuild(Diamond()), opts);
  EXPECT_EQ(k.size(), 64u);
  EXPECT_EQ(CacheKey(MustBuild(Diamond(/*swap_independent=*/true)), opts), k);
  EXPECT_EQ(CacheKey(MustBuild(Diamond(false, "renamed_")), opts), k);
  EXPECT_EQ(CacheKey(MustBuild(Diamond(true, "other_")), opts), k);
  v1::Graph named = Diamond();
  named.set_name("another name");
  EXPECT_EQ(CacheKey(MustBuild(named), opts), k);
  // Keyword order does not matter either.
  v1::Graph kw = Diamond();
  auto* extra = kw.mutable_nodes(2)->add_kwargs();
  extra->set_name("beta");
  extra->set_int_value(2);
  v1::Graph kw2 = kw;
  kw2.mutable_nodes(2)->mutable_kwargs()->SwapElements(0, 1);
  EXPECT_EQ(CacheKey(MustBuild(kw), opts), CacheKey(MustBuild(kw2), opts));
  EXPECT_EQ(CanonicalBytes(MustBuild(Diamond())), CanonicalBytes(MustBuild(Diamond(true, "q"))));
}

// Two identical independent nodes (relu(x) twice) feeding different
// consumers: listing them in either order gives the same key.
TEST(CanonicalTest, IdenticalNodesWithDifferentUsersKeepTheKey) {
  auto build = [](bool swap) {
    std::string r1 =
        "nodes { name: \"r1\" target: \"aten.relu.default\" args { tensor: \"x\" } outputs " +
        V("a") + " }\n";
    std::string r2 =
        "nodes { name: \"r2\" target: \"aten.relu.default\" args { tensor: \"x\" } outputs " +
        V("b") + " }\n";
    std::string text =
        "inputs { value " + V("x") + " }\n" + (swap ? r2 + r1 : r1 + r2) +
        "nodes { name: \"n\" target: \"aten.neg.default\" args { tensor: \"a\" } outputs " +
        V("c") + " }\n" +
        "nodes { name: \"s\" target: \"aten.sigmoid.default\" args { tensor: \"b\" } outputs " +
        V("d") + " }\n" + "outputs: \"c\" outputs: \"d\"";
    v1::Graph g;
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &g));
    return g;
  };
  EXPECT_EQ(CacheKey(MustBuild(build(false)), {}), CacheKey(MustBuild(build(true)), {}));
  EXPECT_EQ(CanonicalBytes(MustBuild(build(false))), CanonicalBytes(MustBuild(build(true))));
}

// Two independent dropouts: their order is their meaning (one generator).
TEST(CanonicalTest, RandomOpsKeepProgramOrder) {
  auto build = [](bool swap) {
    std::string d1 =
        "nodes { name: \"d1\" target: \"aten.native_dropout.default\" args { tensor: \"x\" } args "
        "{ float_value: 0.1 } args { bool_value: true } outputs " +
        V("a") + " outputs " + V("am") + " }\n";
    std::string d2 =
        "nodes { name: \"d2\" target: \"aten.native_dropout.default\" args { tensor: \"x\" } args "
        "{ float_value: 0.5 } args { bool_value: true } outputs " +
        V("b") + " outputs " + V("bm") + " }\n";
    std::string text = "inputs { value " + V("x") + " }\n" + (swap ? d2 + d1 : d1 + d2) +
                       "outputs: \"a\" outputs: \"b\"";
    v1::Graph g;
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &g));
    return g;
  };
  const Graph a = MustBuild(build(false)), b = MustBuild(build(true));
  EXPECT_NE(CacheKey(a, {}), CacheKey(b, {}));
  // The canonical graph keeps the order the program drew them in.
  EXPECT_EQ(Canonicalize(a).nodes(0).args(1).float_value(), 0.1);
  EXPECT_EQ(Canonicalize(b).nodes(0).args(1).float_value(), 0.5);
  // Non-random nodes still reorder freely.
  EXPECT_EQ(CacheKey(MustBuild(Diamond()), {}), CacheKey(MustBuild(Diamond(true)), {}));
}

TEST(CanonicalTest, EveryFieldChangesTheKey) {
  v1::CompileOptions opts;
  const std::string base = CacheKey(MustBuild(Diamond()), opts);
  std::vector<std::pair<std::string, std::function<void(v1::Graph*)>>> graph_changes = {
      {"op", [](v1::Graph* g) { g->mutable_nodes(0)->set_target("aten.sigmoid.default"); }},
      {"argument", [](v1::Graph* g) { g->mutable_nodes(2)->mutable_kwargs(0)->set_int_value(2); }},
      {"argument kind",
       [](v1::Graph* g) { g->mutable_nodes(2)->mutable_kwargs(0)->set_float_value(1.0); }},
      {"argument order",
       [](v1::Graph* g) { g->mutable_nodes(2)->mutable_args()->SwapElements(0, 1); }},
      {"dtype",
       [](v1::Graph* g) {
         g->mutable_nodes(0)->mutable_outputs(0)->mutable_meta()->set_dtype(v1::FLOAT16);
       }},
      {"input dtype",
       [](v1::Graph* g) {
         g->mutable_inputs(0)->mutable_value()->mutable_meta()->set_dtype(v1::FLOAT64);
       }},
      {"size",
       [](v1::Graph* g) {
         g->mutable_inputs(0)->mutable_value()->mutable_meta()->mutable_sizes(0)->set_int_value(5);
       }},
      {"symbolic size",
       [](v1::Graph* g) {
         g->mutable_inputs(0)->mutable_value()->mutable_meta()->mutable_sizes(0)->set_expr("s0");
       }},
      {"stride",
       [](v1::Graph* g) {
         g->mutable_nodes(1)->mutable_outputs(0)->mutable_meta()->mutable_strides(1)->set_int_value(
             2);
       }},
      {"device",
       [](v1::Graph* g) {
         g->mutable_inputs(0)->mutable_value()->mutable_meta()->mutable_device()->set_type("cuda");
       }},
      {"requires_grad",
       [](v1::Graph* g) {
         g->mutable_inputs(0)->mutable_value()->mutable_meta()->set_requires_grad(true);
       }},
      {"input kind",
       [](v1::Graph* g) { g->mutable_inputs(0)->set_kind(v1::Placeholder::PARAMETER); }},
      {"output", [](v1::Graph* g) { g->set_outputs(0, "a"); }},
      {"extra output", [](v1::Graph* g) { g->add_outputs("b"); }},
  };
  for (const auto& [what, mutate] : graph_changes) {
    v1::Graph p = Diamond();
    mutate(&p);
    EXPECT_NE(CacheKey(MustBuild(p), opts), base) << what;
  }
  Graph g = MustBuild(Diamond());
  std::vector<std::pair<std::string, std::function<void(v1::CompileOptions*)>>> option_changes = {
      {"backend", [](v1::CompileOptions* o) { o->set_backend("aot_eager"); }},
      {"option",
       [](v1::CompileOptions* o) {
         auto* x = o->add_options();
         x->set_name("mode");
         x->set_value("max");
       }},
      {"device type", [](v1::CompileOptions* o) { o->mutable_target()->set_device_type("cuda"); }},
      {"isa", [](v1::CompileOptions* o) { o->mutable_target()->set_cpu_isa("x86-64-v3"); }},
      {"sm arch", [](v1::CompileOptions* o) { o->mutable_target()->set_sm_arch("sm_90"); }},
      {"cuda version",
       [](v1::CompileOptions* o) { o->mutable_target()->set_cuda_version("13.0"); }},
  };
  for (const auto& [what, mutate] : option_changes) {
    v1::CompileOptions o;
    mutate(&o);
    EXPECT_NE(CacheKey(g, o), base) << what;
  }
  EXPECT_NE(CacheKey(g, opts, "kiln-other-build"), base) << "compiler version";
  // The default backend is eager, spelled or not.
  v1::CompileOptions eager;
  eager.set_backend("eager");
  EXPECT_EQ(CacheKey(g, eager), base);
  // kiln always compiles for a named ISA: the default is spelled out in the key.
  v1::CompileOptions kiln, kiln_v3, kiln_v4;
  kiln.set_backend("kiln");
  kiln_v3 = kiln;
  kiln_v3.mutable_target()->set_device_type("cpu");
  kiln_v3.mutable_target()->set_cpu_isa("x86-64-v3");
  kiln_v4 = kiln_v3;
  kiln_v4.mutable_target()->set_cpu_isa("x86-64-v4");
  EXPECT_EQ(NormalizeOptions(kiln).target().cpu_isa(), kDefaultCpuIsa);
  EXPECT_EQ(CacheKey(g, kiln), CacheKey(g, kiln_v3));
  EXPECT_NE(CacheKey(g, kiln), CacheKey(g, kiln_v4));
}

TEST(PrinterTest, ReadsLikeFx) {
  std::string s = PrintReadable(MustBuild(Diamond()));
  EXPECT_NE(s.find("def forward(self, x: \"f32[4, 8]\"):"), std::string::npos) << s;
  EXPECT_NE(s.find("c: \"f32[4, 8]\" = aten.add.Tensor(a, b, alpha=1)"), std::string::npos) << s;
  EXPECT_NE(s.find("return (c,)"), std::string::npos) << s;
}

}  // namespace
}  // namespace kiln::ir
