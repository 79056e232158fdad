// The troubleshooting toolkit against the real kilnd: fault injection, the
// function filter, record and replay of failed compiles, the minifier's
// delta debugging on kilnd's own errors.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/minify.h"
#include "tests/integration/connect.h"
#include "tests/integration/graphs.h"
#include "tests/integration/kilnd_process.h"

namespace kiln::testing {
namespace {

// Minifying waits on many compiles.
constexpr absl::Duration kDeadline = absl::Seconds(120);

v1::CompileRequest Request(const v1::Graph& graph, const std::string& backend,
                           const std::string& fault = "") {
  v1::CompileRequest r;
  *r.mutable_graph() = graph;
  r.mutable_options()->set_backend(backend);
  if (!fault.empty()) {
    auto* o = r.mutable_options()->add_options();
    o->set_name("inject_fault");
    o->set_value(fault);
  }
  return r;
}

// autotune=on (torch.compile's mode="max-autotune") is a backend option: it
// enters the key, so tuned and untuned artifacts are cached apart. Without a
// GPU to time on, the heuristics stand and the compile succeeds.
TEST(ToolkitTest, TheAutotuneOptionEntersTheKeyAndTakesOnOrOff) {
  TempDir dir;
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd, kDeadline);
  auto with = [](const std::string& value) {
    v1::CompileRequest r = Request(ChainGraph(3), "kiln");
    auto* o = r.mutable_options()->add_options();
    o->set_name("autotune");
    o->set_value(value);
    return r;
  };
  auto plain = c->Compile(Request(ChainGraph(3), "kiln"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto tuned = c->Compile(with("on"));
  ASSERT_TRUE(tuned.ok()) << tuned.status();
  auto off = c->Compile(with("off"));
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_NE(tuned->key(), plain->key());
  EXPECT_NE(off->key(), tuned->key());
  auto bad = c->Compile(with("maybe"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "options.options: autotune: 'maybe' is not on or off");
}

TEST(ToolkitTest, InjectedCompileErrorIsRecordedAndReplayable) {
  TempDir dir;
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd, kDeadline);
  // ChainGraph: relu, neg, add, relu, ...
  auto failed = c->Compile(Request(ChainGraph(6), "kiln", "compile_error:aten.neg.default"));
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(failed.status().message(),
            "injected compile error (inject_fault=compile_error:aten.neg.default) at node 'op1'");
  // The same graph without the fault compiles: the option is in the key.
  auto fine = c->Compile(Request(ChainGraph(6), "kiln"));
  ASSERT_TRUE(fine.ok()) << fine.status();
  // A graph without the op is unaffected by the fault.
  v1::CompileRequest relu_only = Request(ChainGraph(1), "kiln", "compile_error:aten.neg.default");
  EXPECT_TRUE(c->Compile(relu_only).ok());

  auto bad_kind = c->Compile(Request(ChainGraph(2), "kiln", "crash:aten.neg.default"));
  EXPECT_EQ(bad_kind.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad_kind.status().message(), "unknown kind 'crash'"))
      << bad_kind.status();
  v1::CompileRequest unknown = Request(ChainGraph(2), "eager");
  auto* o = unknown.mutable_options()->add_options();
  o->set_name("fast_math");
  o->set_value("1");
  auto refused = c->Compile(unknown);
  EXPECT_EQ(refused.status().message(),
            "options.options: unknown option 'fast_math' (known: autotune, debug_function, "
            "inject_fault)");

  // Both failures are kept, newest first; the compile error with its key,
  // request and trace.
  auto listed = c->ListFailures();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->failures_size(), 3);
  const v1::FailedCompile& newest = listed->failures(0);
  EXPECT_EQ(newest.code(), "INVALID_ARGUMENT");
  const v1::FailedCompile& injected = listed->failures(2);
  EXPECT_EQ(injected.code(), "INTERNAL");
  EXPECT_EQ(injected.graph_name(), "chain6");
  EXPECT_EQ(injected.key().size(), 64u);
  EXPECT_FALSE(injected.has_request());  // listed without it
  auto got = c->GetFailure(injected.id());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->failure().request().graph().nodes_size(), 6);
  EXPECT_TRUE(got->failure().trace().count("ir_before_fusion.txt"));
  EXPECT_EQ(c->GetFailure("0123456789abcdef").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c->GetFailure("../../e/").status().code(), absl::StatusCode::kInvalidArgument);

  // Replay: the kept request fails the same way again.
  v1::CompileRequest replay = got->failure().request();
  replay.set_bypass_cache(true);
  auto again = c->Compile(replay);
  EXPECT_EQ(again.status().message(), injected.error());

  // Kept across a restart.
  kilnd.Terminate();
  KilndProcess restarted(dir.path());
  auto c2 = ConnectTo(restarted, kDeadline);
  auto after = c2->ListFailures();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->failures_size(), 4);  // the replay failed too
}

TEST(ToolkitTest, FailuresAreBoundedPerNamespace) {
  TempDir dir;
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd, kDeadline);
  for (int i = 0; i < 40; ++i) {
    v1::CompileRequest r = Request(ChainGraph(3, 8, i), "kiln", "compile_error:aten.relu.default");
    r.set_namespace_(i % 2 ? "odd" : "even");
    EXPECT_FALSE(c->Compile(r).ok());
  }
  auto even = c->ListFailures("even");
  ASSERT_TRUE(even.ok());
  EXPECT_EQ(even->failures_size(), 20);
  for (int i = 40; i < 60; ++i) {
    v1::CompileRequest r = Request(ChainGraph(3, 8, i), "kiln", "compile_error:aten.relu.default");
    r.set_namespace_("even");
    EXPECT_FALSE(c->Compile(r).ok());
  }
  even = c->ListFailures("even");
  ASSERT_TRUE(even.ok());
  EXPECT_EQ(even->failures_size(), 32);
  // The newest were kept.
  auto newest = c->GetFailure(even->failures(0).id(), "even");
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(newest->failure().request().graph().nodes(2).kwargs(0).int_value(), 1 + 59);
  auto every = c->ListFailures("*");
  ASSERT_TRUE(every.ok());
  EXPECT_EQ(every->failures_size(), 52);
}

TEST(ToolkitTest, FunctionFilterSendsOtherGraphsToEager) {
  TempDir dir;
  KilndProcess kilnd(dir.path(), {"--debug_function=^chain6$"});
  auto c = ConnectTo(kilnd, kDeadline);
  auto matched = c->Compile(Request(ChainGraph(6), "kiln"));
  ASSERT_TRUE(matched.ok()) << matched.status();
  EXPECT_EQ(matched->artifact().backend(), "kiln");
  auto other = c->Compile(Request(ChainGraph(7), "kiln"));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->artifact().backend(), "eager");
  // A request's own filter replaces the server's.
  v1::CompileRequest own = Request(ChainGraph(8), "aot_eager");
  auto* o = own.mutable_options()->add_options();
  o->set_name("debug_function");
  o->set_value("chain[0-9]+");
  auto mine = c->Compile(own);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->artifact().backend(), "aot_eager");
  auto stats = c->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->counters().function_filter_matched(), 2u);
  EXPECT_EQ(stats->counters().function_filter_eager(), 1u);

  o->set_value("(unclosed");
  auto bad = c->Compile(own);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "is not a regular expression"))
      << bad.status();
}

TEST(ToolkitTest, GraphReportsAreGatheredPerJobAcrossClientsAndRestarts) {
  TempDir dir;
  auto report = [](const std::string& graph, bool graph_break) {
    v1::GraphReport r;
    r.set_job("train.py");
    r.set_function("forward");
    r.set_graph(graph);
    r.set_graph_break(graph_break);
    r.set_reason(graph_break ? "call to torch._dynamo.graph_break()" : "return_value");
    for (int i = 0; i < 20; ++i) r.add_user_frames(absl::StrCat("model.py:", i, " in forward"));
    return r;
  };
  {
    KilndProcess kilnd(dir.path());
    for (int client = 0; client < 2; ++client) {
      auto c = ConnectTo(kilnd, kDeadline);
      for (const auto& [graph, broke] : {std::pair{"forward_0_0", true}, {"forward_1_0", false}}) {
        v1::LookupRequest lookup;
        *lookup.mutable_graph() = ChainGraph(4);
        *lookup.mutable_report() = report(graph, broke);
        ASSERT_TRUE(c->Lookup(lookup).ok());
      }
    }
    // A compile carries one too; a job name over 128 bytes is cut.
    auto c = ConnectTo(kilnd, kDeadline);
    v1::CompileRequest compile = Request(ChainGraph(4), "eager");
    *compile.mutable_report() = report("forward_0_0", true);
    compile.mutable_report()->set_job(std::string(300, 'j'));
    ASSERT_TRUE(c->Compile(compile).ok());
    auto all = c->GraphBreaks("*");
    ASSERT_TRUE(all.ok()) << all.status();
    ASSERT_EQ(all->jobs_size(), 2);
    kilnd.Terminate();
  }
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd, kDeadline);
  auto got = c->GraphBreaks("", "train.py");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->jobs_size(), 1);
  const v1::JobGraphs& job = got->jobs(0);
  ASSERT_EQ(job.graphs_size(), 2);
  EXPECT_EQ(job.graphs(0).graph(), "forward_0_0");
  EXPECT_TRUE(job.graphs(0).graph_break());
  EXPECT_EQ(job.graphs(0).reports(), 2u);
  EXPECT_EQ(job.graphs(0).user_frames_size(), 8);
  EXPECT_EQ(job.graphs(0).user_frames(7), "model.py:19 in forward");
  EXPECT_FALSE(job.graphs(1).graph_break());
  auto cut = c->GraphBreaks("", std::string(128, 'j'));
  ASSERT_TRUE(cut.ok());
  ASSERT_EQ(cut->jobs_size(), 1);

  // At most 256 graphs per job.
  for (int i = 0; i < 300; ++i) {
    v1::LookupRequest lookup;
    *lookup.mutable_graph() = ChainGraph(2);
    *lookup.mutable_report() = report(absl::StrCat("g", i), false);
    lookup.mutable_report()->set_job("many");
    ASSERT_TRUE(c->Lookup(lookup).ok());
  }
  auto many = c->GraphBreaks("", "many");
  ASSERT_TRUE(many.ok());
  ASSERT_EQ(many->jobs_size(), 1);
  EXPECT_EQ(many->jobs(0).graphs_size(), 256);
}

TEST(ToolkitTest, MinifiesAnInjectedCompileErrorToTheFailingNode) {
  TempDir dir;
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd, kDeadline);
  // 120 nodes; the fault is on neg, the second node and every third after.
  v1::CompileRequest r = Request(ChainGraph(120), "kiln", "compile_error:aten.neg.default");
  auto compile = [&c](const v1::CompileRequest& req) { return c->Compile(req); };
  auto m = MinifyCompileError(compile, r, "graph");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_LE(m->request.graph().nodes_size(), 3);
  bool has_neg = false;
  for (const auto& n : m->request.graph().nodes()) has_neg |= n.target() == "aten.neg.default";
  EXPECT_TRUE(has_neg);
  EXPECT_TRUE(absl::StartsWith(m->error.message(), "injected compile error")) << m->error;
  EXPECT_LT(m->compiles, 120);

  // A graph that compiles has nothing to minify.
  auto nothing = MinifyCompileError(compile, Request(ChainGraph(4), "kiln"), "graph");
  EXPECT_EQ(nothing.status().code(), absl::StatusCode::kFailedPrecondition);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ToolkitTest, LogLevelsChooseWhatTheRequestLogHolds) {
  TempDir dir;
  const std::string debug_log = dir.path() + "/debug.log", warning_log = dir.path() + "/warn.log";
  {
    KilndProcess kilnd(dir.path() + "/a", {"--request_log=" + debug_log, "--log_level=debug"});
    auto c = ConnectTo(kilnd, kDeadline);
    ASSERT_TRUE(c->Compile(Request(ChainGraph(3), "kiln")).ok());
  }
  const std::string debug = ReadAll(debug_log);
  for (const char* line :
       {"\"step\":\"compile\",\"event\":\"begin\"", "\"step\":\"compile\",\"event\":\"end\"",
        "\"step\":\"store\",\"event\":\"end\"", "\"rpc\":\"Compile\""}) {
    EXPECT_TRUE(absl::StrContains(debug, line)) << line << " in\n" << debug;
  }
  {
    KilndProcess kilnd(dir.path() + "/b", {"--request_log=" + warning_log, "--log_level=warning"});
    auto c = ConnectTo(kilnd, kDeadline);
    ASSERT_TRUE(c->Compile(Request(ChainGraph(3), "eager")).ok());
    EXPECT_FALSE(c->Compile(Request(ChainGraph(3), "nope")).ok());
  }
  const std::string warning = ReadAll(warning_log);
  EXPECT_TRUE(absl::StrContains(warning, "\"code\":\"INVALID_ARGUMENT\"")) << warning;
  EXPECT_FALSE(absl::StrContains(warning, "\"code\":\"OK\"")) << warning;
  EXPECT_FALSE(absl::StrContains(warning, "\"step\"")) << warning;
}

TEST(ToolkitTest, KilndMinifiesFailedCompilesInTheBackground) {
  TempDir dir;
  KilndProcess kilnd(dir.path(), {"--minify_failures"});
  auto c = ConnectTo(kilnd, kDeadline);
  v1::CompileRequest r = Request(ChainGraph(60), "kiln", "compile_error:aten.neg.default");
  r.set_namespace_("team");
  ASSERT_EQ(c->Compile(r).status().code(), absl::StatusCode::kInternal);
  std::string id;
  v1::FailedCompile record;
  for (int i = 0; i < 600 && !record.has_minified(); ++i) {
    auto listed = c->ListFailures("team");
    ASSERT_TRUE(listed.ok()) << listed.status();
    ASSERT_EQ(listed->failures_size(), 1);
    auto got = c->GetFailure(listed->failures(0).id(), "team");
    ASSERT_TRUE(got.ok()) << got.status();
    record = got->failure();
    if (!record.has_minified()) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(record.has_minified()) << "not minified within a minute";
  EXPECT_LE(record.minified().graph().nodes_size(), 3);
  EXPECT_EQ(record.minified().graph().nodes(0).target(), "aten.neg.default");
  EXPECT_TRUE(absl::StartsWith(record.minified_error(), "injected compile error"))
      << record.minified_error();
  // The candidates it compiled are not failures of anyone's.
  auto every = c->ListFailures("*");
  ASSERT_TRUE(every.ok());
  EXPECT_EQ(every->failures_size(), 1);
}

TEST(ToolkitTest, DeltaDebugFindsTheItemsToBlame) {
  std::vector<int> all(100);
  for (int i = 0; i < 100; ++i) all[i] = i;
  int calls = 0;
  auto one = DeltaDebug(all, [&](const std::vector<int>& s) {
    ++calls;
    return std::find(s.begin(), s.end(), 37) != s.end();
  });
  EXPECT_EQ(one, std::vector<int>{37});
  EXPECT_LT(calls, 40);
  auto two = DeltaDebug(all, [](const std::vector<int>& s) {
    return std::find(s.begin(), s.end(), 3) != s.end() &&
           std::find(s.begin(), s.end(), 90) != s.end();
  });
  EXPECT_EQ(two, (std::vector<int>{3, 90}));
  EXPECT_EQ(FailureSignature(absl::StatusCode::kInternal, "at node 'relu_3' of 12\nmore"),
            FailureSignature(absl::StatusCode::kInternal, "at node 'relu' of 7"));
}

TEST(ToolkitTest, SubgraphReadsOutsideValuesAsInputs) {
  const v1::Graph g = ChainGraph(5);  // relu, neg, add(t1, t0), relu, neg
  v1::Graph sub = Subgraph(g, {2, 3});
  ASSERT_EQ(sub.inputs_size(), 2);
  EXPECT_EQ(sub.inputs(0).value().name(), "t1");
  EXPECT_EQ(sub.inputs(1).value().name(), "t0");
  ASSERT_EQ(sub.nodes_size(), 2);
  ASSERT_EQ(sub.outputs_size(), 1);
  EXPECT_EQ(sub.outputs(0), "t3");
}

}  // namespace
}  // namespace kiln::testing
