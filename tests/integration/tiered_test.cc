// Tiered compiles end to end (CompileRequest.quick_first): the real kilnd on
// loopback over a real RocksDB in a temporary directory.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "client/client.h"
#include "tests/integration/connect.h"
#include "tests/integration/graphs.h"
#include "tests/integration/kilnd_process.h"

namespace kiln::testing {
namespace {

v1::CompileRequest Request(const v1::Graph& graph, const std::string& backend, bool quick_first) {
  v1::CompileRequest r;
  *r.mutable_graph() = graph;
  r.mutable_options()->set_backend(backend);
  r.set_quick_first(quick_first);
  return r;
}

// The g++ command of the artifact's one module.
std::string Command(const v1::Artifact& a) {
  return a.compiled().modules_size() == 1 ? a.compiled().modules(0).compile_command() : "";
}

// Waits until nothing compiles on the server, background compiles included.
void AwaitIdle(Client& c) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(3);
  while (std::chrono::steady_clock::now() < deadline) {
    auto s = c.Stats();
    if (s.ok() && s->in_flight() == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  FAIL() << "a compile was still in flight after 3 minutes";
}

// Waits until a compile is in flight on the server; false after a minute.
bool AwaitInFlight(Client& c) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (std::chrono::steady_clock::now() < deadline) {
    auto s = c.Stats();
    if (s.ok() && s->in_flight() > 0) return true;
  }
  return false;
}

TEST(TieredTest, QuickFirstAnswersQuicklyAndCachesOnlyTheOptimizedArtifact) {
  TempDir dir;
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd);
  const v1::Graph g = ChainGraph(12);

  auto quick = c->Compile(Request(g, "kiln", true));
  ASSERT_TRUE(quick.ok()) << quick.status();
  EXPECT_TRUE(quick->quick());
  EXPECT_EQ(quick->outcome(), v1::FULL_MISS);
  // The graph, run through ATen: nothing compiled natively.
  EXPECT_EQ(quick->artifact().backend(), "eager");
  EXPECT_EQ(quick->artifact().graph().nodes_size(), g.nodes_size());
  EXPECT_FALSE(quick->artifact().has_compiled());
  // Not cached: the digest names no stored artifact.
  EXPECT_EQ(c->GetArtifact(quick->digest()).status().code(), absl::StatusCode::kNotFound);

  // The same request without quick_first: the optimized artifact, from the
  // background compile it joins or from the cache it was published to.
  auto optimized = c->Compile(Request(g, "kiln", false));
  ASSERT_TRUE(optimized.ok()) << optimized.status();
  EXPECT_FALSE(optimized->quick());
  EXPECT_TRUE(absl::StrContains(Command(optimized->artifact()), "g++ -O3 "))
      << Command(optimized->artifact());
  EXPECT_TRUE(c->GetArtifact(optimized->digest()).ok());
  EXPECT_EQ(optimized->key(), quick->key());

  // Once cached, quick_first changes nothing: a hit.
  auto again = c->Compile(Request(g, "kiln", true));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->quick());
  EXPECT_EQ(again->outcome(), v1::HIT);
  EXPECT_EQ(again->digest(), optimized->digest());

  AwaitIdle(*c);
  auto stats = c->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->counters().quick_compiles(), 1u);
  EXPECT_EQ(stats->counters().compiles(), 2u);  // quick and optimized
  // The second request joined the background compile (a miss that joined)
  // or found its artifact cached (a hit).
  EXPECT_EQ(stats->counters().full_misses() - stats->counters().single_flight_joins(), 1u);
  EXPECT_EQ(stats->counters().hits() + stats->counters().single_flight_joins(), 2u);
  EXPECT_EQ(stats->entries(), 1u);
  EXPECT_EQ(stats->variants(), 1u);
  EXPECT_EQ(kilnd.Terminate(), 0);
}

TEST(TieredTest, ConcurrentQuickFirstRequestsMakeOneQuickAndOneOptimizedCompile) {
  TempDir dir;
  KilndProcess kilnd(dir.path());
  const v1::Graph g = ChainGraph(30, 8, 2);
  constexpr int kClients = 8;
  std::vector<absl::StatusOr<v1::CompileResponse>> replies(kClients, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto c = ConnectTo(kilnd);
      replies[i] = c->Compile(Request(g, "kiln", true));
    });
  }
  for (auto& t : threads) t.join();
  int quick = 0;
  for (const auto& r : replies) {
    ASSERT_TRUE(r.ok()) << r.status();
    quick += r->quick();
    // Quick or optimized, every reply is under the graph's key.
    EXPECT_EQ(r->key(), replies[0]->key());
    EXPECT_EQ(r->artifact().backend(), r->quick() ? "eager" : "kiln");
  }
  EXPECT_GE(quick, 1);
  auto c = ConnectTo(kilnd);
  AwaitIdle(*c);
  auto stats = c->Stats();
  ASSERT_TRUE(stats.ok());
  // Requests that came after the quick compile finished may have made one
  // more; never one each.
  EXPECT_GE(stats->counters().quick_compiles(), 1u);
  EXPECT_LE(stats->counters().quick_compiles(), 2u);
  EXPECT_EQ(stats->counters().compiles() - stats->counters().quick_compiles(), 1u);
  EXPECT_EQ(stats->variants(), 1u);
}

// A background compile outlives its request's hold on the tenant's share,
// so a namespace gets at most half the compile workers for them (one here):
// its next miss meanwhile compiles in its request. Another namespace still
// gets its quick artifact.
TEST(TieredTest, ANamespaceHoldsAtMostHalfTheWorkersWithBackgroundCompiles) {
  TempDir dir;
  KilndProcess kilnd(dir.path(), {"--compile_workers=2"});
  auto c = ConnectTo(kilnd);
  // A long chain, whose optimized compile takes a second or more: the
  // second request arrives while it runs (the namespace's share is taken
  // before either of the first request's compiles begins).
  absl::StatusOr<v1::CompileResponse> first = absl::UnknownError("not run");
  std::thread long_one([&] {
    auto own = ConnectTo(kilnd);
    first = own->Compile(Request(ChainGraph(1500, 8, 3), "kiln", true));
  });
  ASSERT_TRUE(AwaitInFlight(*c));
  auto second = c->Compile(Request(ChainGraph(10, 8, 4), "kiln", true));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->quick());
  EXPECT_TRUE(absl::StrContains(Command(second->artifact()), "g++ -O3 "));
  v1::CompileRequest other = Request(ChainGraph(10, 8, 5), "kiln", true);
  other.set_namespace_("other");
  auto third = c->Compile(other);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_TRUE(third->quick());
  long_one.join();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->quick());
  AwaitIdle(*c);
}

// The quick artifact takes no compile worker: with the only one busy with
// a long compile, a quick_first request is answered at once, while its own
// optimized compile waits for the worker.
TEST(TieredTest, TheQuickArtifactWaitsForNoCompileWorker) {
  TempDir dir;
  KilndProcess kilnd(dir.path(), {"--compile_workers=1"});
  auto c = ConnectTo(kilnd);
  absl::StatusOr<v1::CompileResponse> long_one = absl::UnknownError("not run");
  std::chrono::steady_clock::duration long_took{};
  std::thread busy([&] {
    auto own = ConnectTo(kilnd);
    const auto start = std::chrono::steady_clock::now();
    long_one = own->Compile(Request(ChainGraph(1500, 8, 7), "kiln", false));
    long_took = std::chrono::steady_clock::now() - start;
  });
  ASSERT_TRUE(AwaitInFlight(*c));
  v1::CompileRequest other = Request(ChainGraph(10, 8, 8), "kiln", true);
  other.set_namespace_("other");
  const auto start = std::chrono::steady_clock::now();
  auto quick = c->Compile(other);
  const auto quick_took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(quick.ok()) << quick.status();
  EXPECT_TRUE(quick->quick());
  EXPECT_EQ(quick->artifact().backend(), "eager");
  busy.join();
  ASSERT_TRUE(long_one.ok()) << long_one.status();
  // The request began as the long compile (a second or more) did: had it
  // waited for the worker, it would have taken nearly as long.
  EXPECT_LT(quick_took, long_took / 2)
      << std::chrono::duration<double>(quick_took).count() << " s against "
      << std::chrono::duration<double>(long_took).count() << " s";
  other.set_quick_first(false);
  auto optimized = c->Compile(other);
  ASSERT_TRUE(optimized.ok()) << optimized.status();
  EXPECT_EQ(optimized->artifact().backend(), "kiln");
  AwaitIdle(*c);
}

TEST(TieredTest, WithoutAQuickLevelOrWhileFrozenQuickFirstChangesNothing) {
  TempDir dir;
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd);
  // The eager backend has no quick level: one compile, cached.
  auto eager = c->Compile(Request(ChainGraph(6), "eager", true));
  ASSERT_TRUE(eager.ok()) << eager.status();
  EXPECT_FALSE(eager->quick());
  EXPECT_TRUE(c->GetArtifact(eager->digest()).ok());

  // A frozen request compiles nothing, quick or not.
  v1::CompileRequest frozen = Request(ChainGraph(7), "kiln", true);
  frozen.set_frozen(true);
  auto refused = c->Compile(frozen);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();

  AwaitIdle(*c);
  auto stats = c->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->counters().quick_compiles(), 0u);
  EXPECT_EQ(stats->counters().compiles(), 1u);
  EXPECT_EQ(stats->counters().frozen_misses(), 1u);
}

// ChainGraph with its tensors on the GPU; with `training`, its input
// requires grad.
v1::Graph OnCuda(v1::Graph g, bool training) {
  for (auto& in : *g.mutable_inputs()) {
    in.mutable_value()->mutable_meta()->mutable_device()->set_type("cuda");
    in.mutable_value()->mutable_meta()->set_requires_grad(training);
  }
  for (auto& node : *g.mutable_nodes()) {
    for (auto& out : *node.mutable_outputs())
      out.mutable_meta()->mutable_device()->set_type("cuda");
  }
  return g;
}

// On CUDA as on the CPU the quick artifact compiles no kernel: the graph,
// run through ATen (`eager`, or `aot_eager` with the backward graph when an
// input requires grad) until the optimized kernels (NVRTC, no GPU needed)
// replace it.
TEST(TieredTest, OnCudaTheQuickArtifactRunsTheGraphThroughATen) {
  TempDir dir;
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd);
  for (bool training : {false, true}) {
    SCOPED_TRACE(training ? "training" : "inference");
    const v1::Graph g = OnCuda(ChainGraph(12, 8, training ? 1 : 0), training);
    // A namespace each: the first one's background compile may hold its
    // share of the workers a moment after its reply.
    v1::CompileRequest request = Request(g, "kiln", true);
    request.set_namespace_(training ? "training" : "inference");
    auto quick = c->Compile(request);
    ASSERT_TRUE(quick.ok()) << quick.status();
    EXPECT_TRUE(quick->quick());
    const v1::Artifact& a = quick->artifact();
    EXPECT_EQ(a.backend(), training ? "aot_eager" : "eager");
    EXPECT_EQ(a.graph().nodes_size(), g.nodes_size());
    EXPECT_EQ(a.has_autograd(), training);
    EXPECT_FALSE(a.has_compiled() || a.has_compiled_forward());
    EXPECT_EQ(a.target().device_type(), "cuda");

    request.set_quick_first(false);
    auto optimized = c->Compile(request);
    ASSERT_TRUE(optimized.ok()) << optimized.status();
    EXPECT_FALSE(optimized->quick());
    EXPECT_EQ(optimized->artifact().backend(), "kiln");
    const v1::CompiledGraph& plan =
        training ? optimized->artifact().compiled_forward() : optimized->artifact().compiled();
    ASSERT_GE(plan.modules_size(), 1);
    EXPECT_EQ(plan.modules(0).language(), "cuda");
    EXPECT_FALSE(plan.modules(0).binary().empty());
    EXPECT_EQ(optimized->key(), quick->key());
  }
  AwaitIdle(*c);
  EXPECT_EQ(kilnd.Terminate(), 0);
}

TEST(TieredTest, AFailedOptimizedCompileIsRefusedByNameAndRecorded) {
  TempDir dir;
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd);
  // An ISA g++ does not know: the quick artifact (no native compile) is
  // served, the background compile fails and keeps the record, and the
  // request for the optimized artifact gets its error by name.
  v1::CompileRequest bad = Request(ChainGraph(12), "kiln", true);
  bad.mutable_options()->mutable_target()->set_cpu_isa("no-such-isa");
  auto quick = c->Compile(bad);
  ASSERT_TRUE(quick.ok()) << quick.status();
  EXPECT_TRUE(quick->quick());
  bad.set_quick_first(false);
  auto failed = c->Compile(bad);
  ASSERT_EQ(failed.status().code(), absl::StatusCode::kInternal) << failed.status();
  EXPECT_TRUE(absl::StrContains(failed.status().message(), "no-such-isa")) << failed.status();
  AwaitIdle(*c);
  auto listed = c->ListFailures();
  ASSERT_TRUE(listed.ok()) << listed.status();
  // The second request joined the background compile, or (when g++ had
  // failed already) compiled once more.
  ASSERT_GE(listed->failures_size(), 1);
  for (const auto& f : listed->failures()) EXPECT_EQ(f.code(), "INTERNAL");
  auto stats = c->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GE(stats->counters().compile_errors(), 1u);
  EXPECT_LE(stats->counters().compile_errors(), 2u);
  EXPECT_EQ(stats->variants(), 0u);
  // A fault injected into the kernels is the quick artifact's as well: it
  // has quick kernels (g++ -O1).
  v1::CompileRequest faulty = Request(ChainGraph(12, 8, 6), "kiln", true);
  faulty.set_namespace_("faulty");  // the failed compile's share may be held still
  auto* fault = faulty.mutable_options()->add_options();
  fault->set_name("inject_fault");
  fault->set_value("accuracy:aten.relu.default");
  auto faulty_quick = c->Compile(faulty);
  ASSERT_TRUE(faulty_quick.ok()) << faulty_quick.status();
  EXPECT_TRUE(faulty_quick->quick());
  EXPECT_TRUE(absl::StrContains(Command(faulty_quick->artifact()), "g++ -O1 "))
      << Command(faulty_quick->artifact());
  EXPECT_TRUE(c->Health().ok());
}

TEST(TieredTest, SigtermWithABackgroundCompileStopsCleanly) {
  TempDir dir;
  {
    KilndProcess kilnd(dir.path());
    auto c = ConnectTo(kilnd);
    auto quick = c->Compile(Request(ChainGraph(40, 8, 1), "kiln", true));
    ASSERT_TRUE(quick.ok()) << quick.status();
    EXPECT_TRUE(quick->quick());
    // The optimized compile may still run: kilnd stops it or lets it
    // finish, and exits cleanly either way.
    EXPECT_EQ(kilnd.Terminate(), 0);
  }
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd);
  auto stats = c->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_LE(stats->variants(), 1u);
  // Served or compiled again, the graph compiles to the optimized artifact.
  auto optimized = c->Compile(Request(ChainGraph(40, 8, 1), "kiln", false));
  ASSERT_TRUE(optimized.ok()) << optimized.status();
  EXPECT_TRUE(absl::StrContains(Command(optimized->artifact()), "g++ -O3 "));
}

}  // namespace
}  // namespace kiln::testing
