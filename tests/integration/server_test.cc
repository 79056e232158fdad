// kilnd end to end: the real daemon on loopback over a real RocksDB in a
// temporary directory, driven through kiln::Client.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cache/cache.h"
#include "client/client.h"
#include "common/hashing.h"
#include "compiler/ir/canonical.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "rocksdb/db.h"
#include "tests/integration/connect.h"
#include "tests/integration/graphs.h"
#include "tests/integration/kilnd_process.h"

namespace kiln::testing {
namespace {

v1::CompileRequest Request(const v1::Graph& graph, const std::string& backend = "eager") {
  v1::CompileRequest r;
  *r.mutable_graph() = graph;
  r.mutable_options()->set_backend(backend);
  return r;
}

bool Contains(absl::string_view haystack, absl::string_view needle) {
  return haystack.find(needle) != absl::string_view::npos;
}

TEST(KilndTest, CompileThenHitFromASecondClient) {
  TempDir dir;
  KilndProcess kilnd(dir.path());
  auto a = ConnectTo(kilnd);
  ASSERT_TRUE(a->Health().ok());
  const v1::GraphFile mlp = LoadGraphFile("mlp.json");

  auto first = a->Compile(Request(mlp.graph()));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->outcome(), v1::FULL_MISS);
  EXPECT_EQ(first->artifact().backend(), "eager");
  EXPECT_EQ(first->artifact().graph().nodes_size(), mlp.graph().nodes_size());
  EXPECT_EQ(first->artifact().guards().tensors_size(), mlp.graph().inputs_size());
  EXPECT_EQ(first->key(), *Client::Key(mlp.graph(), v1::CompileOptions()));

  auto b = ConnectTo(kilnd);
  auto sig = SignatureFromMetadata(mlp.graph());
  ASSERT_TRUE(sig.ok()) << sig.status();
  auto hit = b->LookupGraph(mlp.graph(), v1::CompileOptions(), *sig);
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(hit->outcome(), v1::HIT) << hit->reason();
  EXPECT_EQ(hit->digest(), first->digest());
  auto again = b->Compile(Request(mlp.graph()));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outcome(), v1::HIT);
  auto artifact = b->GetArtifact(first->digest());
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  EXPECT_EQ(artifact->artifact().key(), first->key());

  auto stats = b->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->counters().compiles(), 1u);
  EXPECT_EQ(stats->counters().full_misses(), 1u);
  EXPECT_EQ(stats->counters().hits(), 2u);
  EXPECT_EQ(stats->entries(), 1u);
  EXPECT_EQ(stats->variants(), 1u);
  EXPECT_GT(stats->bytes(), 0u);
  bool saw_verify = false;
  for (const auto& p : stats->phases())
    saw_verify |= p.phase() == "verify" && p.histogram().count() == 1;
  EXPECT_TRUE(saw_verify);
  EXPECT_EQ(kilnd.Terminate(), 0);
}

TEST(KilndTest, RestartKeepsEntriesAndStatistics) {
  TempDir dir;
  const v1::Graph g = ChainGraph(30);
  std::string digest;
  {
    KilndProcess kilnd(dir.path());
    auto c = ConnectTo(kilnd);
    auto r = c->Compile(Request(g));
    ASSERT_TRUE(r.ok()) << r.status();
    digest = r->digest();
    ASSERT_EQ(c->LookupGraph(g, {}, ChainSignature(8))->outcome(), v1::HIT);
    EXPECT_EQ(kilnd.Terminate(), 0);
  }
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd);
  auto hit = c->LookupGraph(g, {}, ChainSignature(8));
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->outcome(), v1::HIT);
  EXPECT_EQ(hit->digest(), digest);
  auto stats = c->Stats();
  EXPECT_EQ(stats->counters().compiles(), 1u);
  EXPECT_EQ(stats->counters().hits(), 2u);
  EXPECT_EQ(stats->entries(), 1u);
  auto entry = c->GetEntry(hit->key());
  ASSERT_TRUE(entry.ok());
  EXPECT_EQ(entry->entry().variants(0).hits(), 2u);
}

// A lookup by graph: the same graph sent again (as every process of a job
// sends it) gets the same key; other options or another graph get theirs.
// A hit's artifact is the stored one, byte for byte (kilnd sends the bytes
// it verified, and again from memory).
TEST(KilndTest, LookupsByGraphCarryTheStoredArtifact) {
  TempDir dir;
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd);
  const v1::Graph g = ChainGraph(30);
  auto compiled = c->Compile(Request(g));
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  auto stored = c->GetArtifact(compiled->digest());
  ASSERT_TRUE(stored.ok()) << stored.status();
  v1::LookupRequest by_graph;
  *by_graph.mutable_graph() = g;
  *by_graph.mutable_signature() = ChainSignature(8);
  by_graph.mutable_options()->set_backend("eager");
  by_graph.set_include_artifact(true);
  for (int i = 0; i < 3; ++i) {
    auto hit = c->Lookup(by_graph);
    ASSERT_TRUE(hit.ok()) << hit.status();
    EXPECT_EQ(hit->outcome(), v1::HIT);
    EXPECT_EQ(hit->key(), compiled->key());
    EXPECT_EQ(hit->digest(), compiled->digest());
    ASSERT_TRUE(hit->has_artifact());
    EXPECT_EQ(ir::DeterministicBytes(hit->artifact()), ir::DeterministicBytes(stored->artifact()));
    EXPECT_EQ(Sha256Hex(ir::DeterministicBytes(hit->artifact())), compiled->digest());
  }
  v1::LookupRequest other_backend = by_graph;
  other_backend.mutable_options()->set_backend("aot_eager");
  auto other = c->Lookup(other_backend);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(other->key(), compiled->key());
  EXPECT_EQ(other->outcome(), v1::FULL_MISS);
  v1::LookupRequest other_graph = by_graph;
  *other_graph.mutable_graph() = ChainGraph(31);
  auto longer = c->Lookup(other_graph);
  ASSERT_TRUE(longer.ok()) << longer.status();
  EXPECT_NE(longer->key(), compiled->key());
  EXPECT_EQ(longer->outcome(), v1::FULL_MISS);
  // A graph that does not verify is refused however often it comes.
  v1::LookupRequest bad = by_graph;
  bad.mutable_graph()->set_outputs(0, "t99");
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(c->Lookup(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(KilndTest, ConcurrentIdenticalCompilesMakeOneCompile) {
  TempDir dir;
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd);
  const v1::Graph g = ChainGraph(3000);
  std::vector<std::thread> threads;
  std::vector<std::string> digests(32);
  std::atomic<int> failures{0};
  for (int i = 0; i < 32; ++i) {
    threads.emplace_back([&, i] {
      auto r = c->Compile(Request(g));
      if (!r.ok()) {
        ++failures;
        return;
      }
      digests[i] = r->digest();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, 0);
  for (const auto& d : digests) EXPECT_EQ(d, digests[0]);
  auto stats = c->Stats();
  EXPECT_EQ(stats->counters().compiles(), 1u);
  EXPECT_EQ(stats->variants(), 1u);
  EXPECT_EQ(stats->counters().single_flight_joins() + stats->counters().hits(), 31u);
}

TEST(KilndTest, FrozenRefusesMissesAndStillServesHits) {
  TempDir dir;
  const v1::Graph cached = ChainGraph(10);
  const v1::Graph fresh = ChainGraph(10, 8, /*salt=*/1);
  {
    KilndProcess kilnd(dir.path());
    auto c = ConnectTo(kilnd);
    ASSERT_TRUE(c->Compile(Request(cached)).ok());
    ASSERT_TRUE(c->Freeze().ok());
    auto refused = c->Compile(Request(fresh));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Contains(refused.status().message(), "frozen")) << refused.status();
    EXPECT_TRUE(Contains(refused.status().message(), "full miss")) << refused.status();
    // A different batch size of the cached graph: the reason names the guard.
    auto guard_refused = c->Compile(Request(ChainGraph(10, 12)));
    EXPECT_EQ(guard_refused.status().code(), absl::StatusCode::kFailedPrecondition);
    auto hit = c->Compile(Request(cached));
    ASSERT_TRUE(hit.ok()) << hit.status();
    EXPECT_EQ(hit->outcome(), v1::HIT);
    auto lookup = c->LookupGraph(fresh, {}, ChainSignature(8));
    EXPECT_EQ(lookup->outcome(), v1::FROZEN_MISS);
    auto stats = c->Stats();
    EXPECT_TRUE(stats->frozen());
    EXPECT_EQ(stats->counters().compiles(), 1u);
    EXPECT_EQ(stats->counters().frozen_misses(), 3u);
    ASSERT_TRUE(c->Thaw().ok());
    EXPECT_TRUE(c->Compile(Request(fresh)).ok());
    // A request may be frozen on its own.
    v1::CompileRequest frozen_request = Request(ChainGraph(10, 8, 2));
    frozen_request.set_frozen(true);
    EXPECT_EQ(c->Compile(frozen_request).status().code(), absl::StatusCode::kFailedPrecondition);
    // Bypassing the cache would compile: refused too.
    frozen_request.set_bypass_cache(true);
    EXPECT_EQ(c->Compile(frozen_request).status().code(), absl::StatusCode::kFailedPrecondition);
    v1::CompileRequest bypass = Request(ChainGraph(10, 8, 2));
    bypass.set_bypass_cache(true);
    auto bypassed = c->Compile(bypass);
    ASSERT_TRUE(bypassed.ok()) << bypassed.status();
    EXPECT_EQ(bypassed->outcome(), v1::BYPASS);
    EXPECT_EQ(c->LookupGraph(bypass.graph(), {}, ChainSignature(8))->outcome(), v1::FULL_MISS);
    EXPECT_EQ(kilnd.Terminate(), 0);
  }
  KilndProcess kilnd(dir.path(), {"--frozen"});
  auto c = ConnectTo(kilnd);
  EXPECT_EQ(c->Compile(Request(ChainGraph(10, 8, 3))).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->Compile(Request(cached))->outcome(), v1::HIT);
  EXPECT_TRUE(c->Stats()->frozen());
}

TEST(KilndTest, CacheSizeLimitRefusesWithRecompileReasons) {
  TempDir dir;
  KilndProcess kilnd(dir.path(), {"--cache_size_limit=2"});
  auto c = ConnectTo(kilnd);
  // One graph with a symbolic batch, specialized per batch size by its guards:
  // the variants share one key.
  auto specialized = [](int64_t batch) {
    v1::CompileRequest r = Request(ChainGraph(5, 0, 0, /*symbolic=*/true));
    *r.mutable_guards() = ChainGuards(batch);
    *r.mutable_signature() = ChainSignature(batch);
    return r;
  };
  auto first = c->Compile(specialized(4));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->outcome(), v1::FULL_MISS);
  auto second = c->Compile(specialized(5));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->outcome(), v1::GUARD_MISS);
  EXPECT_EQ(second->key(), first->key());
  ASSERT_EQ(second->misses_size(), 1);
  EXPECT_EQ(second->misses(0).failed_guard(), "input 0 'x': size[0] is 5, guard expects 4");
  // Both variants serve lookups by key.
  v1::LookupRequest by_key;
  by_key.set_key(first->key());
  *by_key.mutable_signature() = ChainSignature(5);
  auto hit = c->Lookup(by_key);
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(hit->outcome(), v1::HIT);
  EXPECT_EQ(hit->digest(), second->digest());

  auto third = c->Compile(specialized(6));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(third.status().message(), "cache_size_limit (2)")) << third.status();
  EXPECT_TRUE(Contains(third.status().message(), "input 0 'x': size[0] is 6, guard expects"))
      << third.status();
  EXPECT_EQ(c->Stats()->counters().cache_limit_hits(), 1u);
  auto entry = c->GetEntry(first->key());
  ASSERT_TRUE(entry.ok());
  EXPECT_EQ(entry->entry().variants_size(), 2);
  ASSERT_EQ(entry->entry().recompiles_size(), 1);
  EXPECT_EQ(entry->entry().recompiles(0).digest(), second->digest());
  EXPECT_EQ(entry->entry().recompiles(0).misses(0).failed_guard(),
            "input 0 'x': size[0] is 5, guard expects 4");
  by_key.mutable_signature()->mutable_inputs(0)->set_sizes(0, 6);
  auto lookup = c->Lookup(by_key);
  EXPECT_EQ(lookup->outcome(), v1::CACHE_LIMIT);
  EXPECT_EQ(lookup->misses_size(), 2);
}

TEST(KilndTest, AutomaticDynamicGeneralizesStaticGraphsOfOneFamily) {
  TempDir dir;
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd);
  auto first = c->Compile(Request(ChainGraph(6, 4)));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->outcome(), v1::FULL_MISS);

  // Batch 5: the same program; its batch becomes a symbol.
  auto second = c->Compile(Request(ChainGraph(6, 5)));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->outcome(), v1::FULL_MISS);
  EXPECT_NE(second->key(), first->key());
  ASSERT_EQ(second->misses_size(), 1);
  EXPECT_EQ(second->misses(0).key(), first->key());
  EXPECT_EQ(second->misses(0).failed_guard(), "input 0 'x': size[0] is 5, guard expects 4");
  const v1::Graph& general = second->artifact().graph();
  EXPECT_EQ(general.inputs(0).value().meta().sizes(0).expr(), "s0");
  EXPECT_EQ(general.inputs(0).value().meta().sizes(1).int_value(), 16);
  EXPECT_EQ(general.inputs(0).value().meta().strides(0).int_value(), 16);
  auto entry = c->GetEntry(second->key());
  ASSERT_TRUE(entry.ok()) << entry.status();
  ASSERT_EQ(entry->entry().recompiles_size(), 1);
  const v1::RecompileReason& why = entry->entry().recompiles(0);
  EXPECT_EQ(why.automatic_dynamic(), "s0: input 0 'x' size[0]");
  ASSERT_EQ(why.misses_size(), 1);
  EXPECT_EQ(why.misses(0).key(), first->key());
  const uint64_t compiles = c->Stats()->counters().compiles();

  // Every later batch is served by the symbolic variant without compiling,
  // frozen or not, and then hits under its own key.
  for (int64_t batch : {9, 64}) {
    auto later = c->Compile(Request(ChainGraph(6, batch)));
    ASSERT_TRUE(later.ok()) << later.status();
    EXPECT_EQ(later->outcome(), v1::HIT) << batch;
    EXPECT_EQ(later->digest(), second->digest()) << batch;
    v1::LookupRequest lookup;
    *lookup.mutable_graph() = ChainGraph(6, batch);
    lookup.mutable_options()->set_backend("eager");
    auto hit = c->Lookup(lookup);
    ASSERT_TRUE(hit.ok()) << hit.status();
    EXPECT_EQ(hit->outcome(), v1::HIT) << batch << ": " << hit->reason();
  }
  EXPECT_EQ(c->Stats()->counters().compiles(), compiles);
  ASSERT_TRUE(c->Freeze().ok());
  auto frozen = c->Compile(Request(ChainGraph(6, 33)));
  ASSERT_TRUE(frozen.ok()) << frozen.status();
  EXPECT_EQ(frozen->digest(), second->digest());
  // Batch 1 is specialized (s0 >= 2): a frozen server refuses it, naming the
  // guard of the symbolic variant that failed.
  auto one = c->Compile(Request(ChainGraph(6, 1)));
  EXPECT_EQ(one.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(one.status().message(),
                       "(same shape family): input 0 'x': size[0] is 1, "
                       "guard 's0 >= 2' fails (s0 = 1)"))
      << one.status();
  ASSERT_TRUE(c->Thaw().ok());
  auto specialized = c->Compile(Request(ChainGraph(6, 1)));
  ASSERT_TRUE(specialized.ok()) << specialized.status();
  EXPECT_EQ(specialized->outcome(), v1::FULL_MISS);
  EXPECT_EQ(specialized->artifact().graph().inputs(0).value().meta().sizes(0).int_value(), 1);
  EXPECT_EQ(c->Stats()->counters().compiles(), compiles + 1);
  // An integer argument that differs (alpha): the graph is of the family but
  // no instance of the symbolic graph, and is compiled as sent.
  auto alpha = c->Compile(Request(ChainGraph(6, 7, /*salt=*/2)));
  ASSERT_TRUE(alpha.ok()) << alpha.status();
  ASSERT_EQ(alpha->misses_size(), 1);
  EXPECT_TRUE(Contains(alpha->misses(0).failed_guard(),
                       "its guards admit these inputs, but this graph is not an instance: "
                       "integer"))
      << alpha->misses(0).failed_guard();
  EXPECT_EQ(alpha->artifact().graph().inputs(0).value().meta().sizes(0).int_value(), 7);
  // Another program is another family.
  auto other = c->Compile(Request(ChainGraph(7, 7)));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->misses_size(), 0);
}

TEST(KilndTest, StaticShapesRequestsAreCompiledAsSent) {
  TempDir dir;
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd);
  ASSERT_TRUE(c->Compile(Request(ChainGraph(6, 4))).ok());
  auto symbolic = c->Compile(Request(ChainGraph(6, 5)));
  ASSERT_TRUE(symbolic.ok()) << symbolic.status();
  ASSERT_EQ(symbolic->artifact().graph().inputs(0).value().meta().sizes(0).expr(), "s0");

  // A client that keeps its sizes static (torch.compile(dynamic=False)) gets
  // a static compile for a batch the symbolic variant would serve, and for
  // a size no graph of the family had; the reasons name the variant that
  // admitted the inputs.
  for (int64_t batch : {9, 12}) {
    v1::CompileRequest req = Request(ChainGraph(6, batch));
    req.set_static_shapes(true);
    auto r = c->Compile(req);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outcome(), v1::FULL_MISS) << batch;
    EXPECT_NE(r->digest(), symbolic->digest()) << batch;
    EXPECT_EQ(r->artifact().graph().inputs(0).value().meta().sizes(0).int_value(), batch);
    ASSERT_EQ(r->misses_size(), 1) << batch;
    EXPECT_EQ(r->misses(0).failed_guard(),
              "its guards admit these inputs and this graph is an instance of its graph, but "
              "the request keeps its sizes static");
    // Its own key hits from now on.
    auto again = c->Compile(req);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->outcome(), v1::HIT);
    EXPECT_EQ(again->digest(), r->digest());
  }
  // Two static requests of a fresh family stay static too.
  for (int64_t batch : {3, 7}) {
    v1::CompileRequest req = Request(ChainGraph(8, batch));
    req.set_static_shapes(true);
    auto r = c->Compile(req);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->artifact().graph().inputs(0).value().meta().sizes(0).int_value(), batch);
  }
  // A request that allows symbols still gets the family's symbolic variant.
  auto later = c->Compile(Request(ChainGraph(6, 33)));
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(later->outcome(), v1::HIT);
  EXPECT_EQ(later->digest(), symbolic->digest());
}

TEST(KilndTest, WithoutAutomaticDynamicEveryStaticGraphCompiles) {
  TempDir dir;
  KilndProcess kilnd(dir.path(), {"--noautomatic_dynamic"});
  auto c = ConnectTo(kilnd);
  for (int64_t batch : {4, 5, 6}) {
    auto r = c->Compile(Request(ChainGraph(6, batch)));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outcome(), v1::FULL_MISS);
    EXPECT_EQ(r->misses_size(), 0);
    EXPECT_EQ(r->artifact().graph().inputs(0).value().meta().sizes(0).int_value(), batch);
  }
  EXPECT_EQ(c->Stats()->counters().compiles(), 3u);
}

TEST(KilndTest, EvictsUnderAByteBudget) {
  TempDir dir;
  // One chain-20 artifact is a few KiB; the budget holds about two.
  KilndProcess probe_server(dir.path());
  uint64_t one;
  {
    auto c = ConnectTo(probe_server);
    auto r = c->Compile(Request(ChainGraph(20)));
    ASSERT_TRUE(r.ok());
    one = c->Stats()->bytes();
    ASSERT_TRUE(c->Evict(r->key()).ok());
    EXPECT_EQ(c->Stats()->bytes(), 0u);
  }
  probe_server.Terminate();
  const uint64_t budget = one * 5 / 2;
  KilndProcess kilnd(dir.path(), {absl::StrCat("--cache_byte_budget=", budget)});
  auto c = ConnectTo(kilnd);
  for (int salt = 1; salt <= 5; ++salt) {
    ASSERT_TRUE(c->Compile(Request(ChainGraph(20, 8, salt))).ok());
  }
  auto stats = c->Stats();
  EXPECT_LE(stats->bytes(), budget);
  EXPECT_EQ(stats->variants(), 2u);
  EXPECT_EQ(stats->counters().evictions(), 3u);
  EXPECT_EQ(c->LookupGraph(ChainGraph(20, 8, 1), {}, ChainSignature(8))->outcome(), v1::FULL_MISS);
  EXPECT_EQ(c->LookupGraph(ChainGraph(20, 8, 5), {}, ChainSignature(8))->outcome(), v1::HIT);
}

TEST(KilndTest, CorruptArtifactIsDetectedNotServedAndRecompiled) {
  TempDir dir;
  const v1::Graph g = ChainGraph(12);
  std::string digest;
  {
    KilndProcess kilnd(dir.path());
    auto r = ConnectTo(kilnd)->Compile(Request(g));
    ASSERT_TRUE(r.ok());
    digest = r->digest();
    ASSERT_EQ(kilnd.Terminate(), 0);
  }
  {
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir.path(), &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    std::string bytes;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), cache::ArtifactKey(digest), &bytes).ok());
    bytes[bytes.size() / 2] ^= 0x5a;
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), cache::ArtifactKey(digest), bytes).ok());
  }
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd);
  auto read = c->GetArtifact(digest);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_TRUE(Contains(read.status().message(), "corrupt"));
  EXPECT_EQ(c->Stats()->counters().corrupt_artifacts(), 1u);
  EXPECT_EQ(c->LookupGraph(g, {}, ChainSignature(8))->outcome(), v1::FULL_MISS);
  auto again = c->Compile(Request(g));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->outcome(), v1::FULL_MISS);
  ASSERT_TRUE(c->GetArtifact(again->digest()).ok());
  EXPECT_EQ(c->Stats()->counters().compiles(), 2u);
}

TEST(KilndTest, BadInputIsRefusedByNameAndTheServerKeepsServing) {
  TempDir dir;
  KilndProcess kilnd(dir.path(), {"--max_message_bytes=20000"});
  auto c = ConnectTo(kilnd);
  struct Case {
    std::string what;
    std::function<void(v1::CompileRequest*)> mutate;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"dangling reference",
       [](v1::CompileRequest* r) {
         r->mutable_graph()->mutable_nodes(1)->mutable_args(0)->set_tensor("ghost");
       },
       "node 'op1' argument 0 refers to 'ghost'"},
      {"cycle",
       [](v1::CompileRequest* r) {
         r->mutable_graph()->mutable_nodes(0)->mutable_args(0)->set_tensor("t2");
       },
       "graph has a cycle"},
      {"empty graph", [](v1::CompileRequest* r) { r->mutable_graph()->Clear(); }, "graph is empty"},
      {"missing metadata",
       [](v1::CompileRequest* r) {
         r->mutable_graph()->mutable_nodes(2)->mutable_outputs(0)->clear_meta();
       },
       "node 'op2' output 0 't2' has no metadata"},
      {"output names nothing",
       [](v1::CompileRequest* r) { r->mutable_graph()->set_outputs(0, "t99"); },
       "graph output 0 refers to 't99'"},
      {"argument kind",
       [](v1::CompileRequest* r) {
         r->mutable_graph()->mutable_nodes(2)->mutable_args(1)->set_string_value("two");
       },
       "node 'op2' argument 1"},
      {"nonsense guard",
       [](v1::CompileRequest* r) {
         auto* g = r->mutable_guards();
         auto* t = g->add_tensors();
         t->set_name("x");
         t->set_dtype(v1::FLOAT32);
         t->add_sizes()->set_expr("s0");
         t->add_sizes()->set_int_value(16);
         g->add_shape_guards("s0 %% 8 ==");
       },
       "guards: shape guard 0"},
      {"guard for an unbound symbol",
       [](v1::CompileRequest* r) {
         auto* t = r->mutable_guards()->add_tensors();
         t->set_name("x");
         t->add_sizes()->set_expr("s0");
         r->mutable_guards()->add_shape_guards("s7 > 2");
       },
       "s7"},
      {"guard count",
       [](v1::CompileRequest* r) {
         r->mutable_guards()->add_tensors();
         r->mutable_guards()->add_tensors();
       },
       "guards: 2 tensor guards for a graph of 1 inputs"},
      {"unknown backend", [](v1::CompileRequest* r) { r->mutable_options()->set_backend("tvm"); },
       "unknown backend 'tvm'"},
      {"bad namespace", [](v1::CompileRequest* r) { r->set_namespace_("a/b"); }, "namespace 'a/b'"},
      {"oversized", [](v1::CompileRequest* r) { *r->mutable_graph() = ChainGraph(400); },
       "over max_message_bytes (20000)"},
      {"metadata against the op's shape rule",
       [](v1::CompileRequest* r) {
         r->mutable_graph()->mutable_nodes(1)->mutable_outputs(0)->mutable_meta()->set_dtype(
             v1::FLOAT16);
       },
       "node 'op1' (aten.neg.default) output 0 't1': dtype is FLOAT16 in the graph, but the op "
       "gives FLOAT32"},
      {"wrong size",
       [](v1::CompileRequest* r) {
         r->mutable_graph()
             ->mutable_nodes(0)
             ->mutable_outputs(0)
             ->mutable_meta()
             ->mutable_sizes(1)
             ->set_int_value(15);
       },
       "size[1] is 15 in the graph, but the op gives 16"},
  };
  const v1::CompileRequest good = Request(ChainGraph(6));
  for (const Case& k : cases) {
    v1::CompileRequest r = good;
    k.mutate(&r);
    auto resp = c->Compile(r);
    EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument)
        << k.what << ": " << resp.status();
    EXPECT_TRUE(Contains(resp.status().message(), k.expect)) << k.what << ": " << resp.status();
    EXPECT_TRUE(c->Health().ok()) << k.what;
  }
  v1::LookupRequest bad_key;
  bad_key.set_key("not-a-key");
  *bad_key.mutable_signature() = ChainSignature(8);
  EXPECT_EQ(c->Lookup(bad_key).status().code(), absl::StatusCode::kInvalidArgument);
  v1::LookupRequest no_sig;
  no_sig.set_key(std::string(64, 'c'));
  auto ns = c->Lookup(no_sig);
  EXPECT_TRUE(Contains(ns.status().message(), "signature")) << ns.status();
  EXPECT_EQ(c->GetArtifact("zz").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->GetArtifact(std::string(64, 'd')).status().code(), absl::StatusCode::kNotFound);

  // Bytes that are no protobuf at all.
  auto channel = grpc::CreateChannel(kilnd.address(), grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  grpc::ClientContext ctx;
  const char garbage[] = "\xff\xff\xff\xff\x0f not a CompileRequest";
  grpc::Slice slice(garbage, sizeof(garbage) - 1);
  grpc::ByteBuffer request(&slice, 1), response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  generic.UnaryCall(&ctx, "/kiln.v1.Compiler/Compile", grpc::StubOptions(), &request, &response,
                    [&](grpc::Status s) {
                      std::lock_guard<std::mutex> l(mu);
                      status = s;
                      done = true;
                      cv.notify_all();
                    });
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return done; });
  }
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(status.error_message(), "does not parse as kiln.v1.CompileRequest"))
      << status.error_message();

  // Still serving, nothing stored was touched.
  EXPECT_TRUE(c->Health().ok());
  auto ok = c->Compile(good);
  ASSERT_TRUE(ok.ok()) << ok.status();
  auto stats = c->Stats();
  EXPECT_EQ(stats->variants(), 1u);
  EXPECT_EQ(stats->counters().compiles(), 1u);
  EXPECT_EQ(kilnd.Terminate(), 0);
}

TEST(KilndTest, AotEagerSplitsForwardAndBackward) {
  TempDir dir;
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd);
  v1::Graph g = ChainGraph(9);
  g.mutable_inputs(0)->mutable_value()->mutable_meta()->set_requires_grad(true);
  auto r = c->Compile(Request(g, "aot_eager"));
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::AutogradGraphs& ag = r->artifact().autograd();
  EXPECT_EQ(ag.num_forward_outputs(), 1);
  EXPECT_EQ(ag.inputs_need_grad_size(), 1);
  EXPECT_TRUE(ag.inputs_need_grad(0));
  EXPECT_EQ(ag.grad_input_index_size(), 1);
  EXPECT_EQ(ag.forward().outputs_size(), 1 + ag.saved_size());
  EXPECT_EQ(ag.backward().inputs_size(), ag.saved_size() + 1);  // saved values, one tangent
  EXPECT_GT(ag.backward().nodes_size(), 0);
  bool timed_partition = false;
  for (const auto& p : r->artifact().compile_times()) timed_partition |= p.phase() == "partition";
  EXPECT_TRUE(timed_partition);
  // aot_eager and eager artifacts live under different keys.
  auto eager = c->Compile(Request(g));
  ASSERT_TRUE(eager.ok());
  EXPECT_NE(eager->key(), r->key());
}

TEST(KilndTest, AGradientThroughAnOpWithoutDerivativeIsRefusedByName) {
  TempDir dir;
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd);
  v1::Graph g;
  g.set_name("group_norm");
  auto meta = [](std::vector<int64_t> sizes) {
    v1::TensorMeta m;
    m.set_dtype(v1::FLOAT32);
    m.mutable_device()->set_type("cpu");
    m.mutable_device()->set_index(-1);
    int64_t stride = 1;
    std::vector<int64_t> strides(sizes.size());
    for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
      strides[d] = stride;
      stride *= sizes[d];
    }
    for (size_t d = 0; d < sizes.size(); ++d) {
      m.add_sizes()->set_int_value(sizes[d]);
      m.add_strides()->set_int_value(strides[d]);
    }
    return m;
  };
  auto* in = g.add_inputs();
  in->mutable_value()->set_name("x");
  *in->mutable_value()->mutable_meta() = meta({2, 4, 3});
  in->mutable_value()->mutable_meta()->set_requires_grad(true);
  auto* n = g.add_nodes();
  n->set_name("gb");
  n->set_target("aten.gelu_backward.default");
  n->add_args()->set_tensor("x");
  n->add_args()->set_tensor("x");
  auto* o = n->add_outputs();
  o->set_name("y");
  *o->mutable_meta() = meta({2, 4, 3});
  g.add_outputs("y");
  ASSERT_TRUE(c->Compile(Request(g)).ok()) << "eager needs no derivative";
  auto r = c->Compile(Request(g, "aot_eager"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_TRUE(Contains(r.status().message(),
                       "node 'gb': aten.gelu_backward.default has no derivative rule"))
      << r.status();
  EXPECT_TRUE(c->Health().ok());
  EXPECT_EQ(c->Stats()->counters().compile_errors(), 1u);
}

TEST(KilndTest, SigtermDrainsACompileInFlight) {
  TempDir dir;
  const v1::Graph g = ChainGraph(60000);
  std::string digest;
  {
    KilndProcess kilnd(dir.path(), {"--max_message_bytes=268435456"});
    auto c = ConnectTo(kilnd);
    absl::StatusOr<v1::CompileResponse> result;
    std::thread compile([&] { result = c->Compile(Request(g)); });
    // Signal once the compile is running on the server. A deadline, not a
    // number of polls: a sanitizer build takes far longer to get there.
    bool running = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(3);
    while (!running && std::chrono::steady_clock::now() < deadline) {
      auto s = c->Stats();
      running = s.ok() && s->in_flight() > 0;
      if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(running) << "the compile never showed as in flight";
    kilnd.SendTerm();
    compile.join();
    ASSERT_TRUE(result.ok()) << result.status();
    digest = result->digest();
    EXPECT_EQ(kilnd.Wait(), 0);
  }
  KilndProcess kilnd(dir.path(), {"--max_message_bytes=268435456"});
  auto c = ConnectTo(kilnd);
  EXPECT_TRUE(c->GetArtifact(digest).ok());
}

TEST(KilndTest, KilnCompilesAndAFailedNativeCompileKeepsItsTrace) {
  TempDir dir;
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd);
  const v1::Graph g = ChainGraph(12);
  auto ok = c->Compile(Request(g, "kiln"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  const v1::Artifact& a = ok->artifact();
  EXPECT_EQ(a.target().cpu_isa(), "x86-64-v3");
  ASSERT_EQ(a.compiled().modules_size(), 1);
  EXPECT_FALSE(a.compiled().modules(0).binary().empty());
  EXPECT_EQ(a.compiled().plan().kernels(), 1);  // relu/neg/add chain: one kernel
  EXPECT_TRUE(a.trace().count("generated_code.cc"));
  EXPECT_NE(a.trace().at("ir_after_fusion.txt").find("fusion decisions"), std::string::npos);

  // An ISA g++ does not know: INTERNAL with the compiler's words, and the
  // trace (with the whole log) kept for the key.
  v1::CompileRequest bad = Request(g, "kiln");
  bad.mutable_options()->mutable_target()->set_cpu_isa("no-such-isa");
  auto failed = c->Compile(bad);
  ASSERT_EQ(failed.status().code(), absl::StatusCode::kInternal) << failed.status();
  EXPECT_TRUE(Contains(failed.status().message(), "no-such-isa")) << failed.status();
  auto key = Client::Key(bad.graph(), bad.options());
  ASSERT_TRUE(key.ok());
  auto entry = c->GetEntry(*key);
  ASSERT_TRUE(entry.ok()) << entry.status();
  EXPECT_EQ(entry->entry().variants_size(), 0);
  ASSERT_TRUE(entry->has_last_failure());
  EXPECT_TRUE(entry->last_failure().trace().count("generated_code.cc"));
  ASSERT_TRUE(entry->last_failure().trace().count("compile_error.txt"));
  EXPECT_TRUE(Contains(entry->last_failure().trace().at("compile_error.txt"), "no-such-isa"));
  EXPECT_TRUE(c->Health().ok());
}

TEST(KilndTest, AKernelCompiledForOneGraphServesTheNextWithoutCompiling) {
  TempDir dir;
  KilndProcess kilnd(dir.path());
  auto c = ConnectTo(kilnd);
  const v1::Graph g = ChainGraph(12);
  auto first = c->Compile(Request(g, "kiln"));
  ASSERT_TRUE(first.ok()) << first.status();
  auto stats = c->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->kernel_cache().hits(), 0u);
  EXPECT_EQ(stats->kernel_cache().misses(), 1u);
  EXPECT_EQ(stats->kernel_cache().entries(), 1u);
  EXPECT_GT(stats->kernel_cache().bytes(), 0u);
  EXPECT_EQ(stats->kernel_cache().byte_budget(), 256u << 20);

  // The same graph in another namespace, which keeps entries of its own:
  // compiled again, its one kernel served by the kernel cache.
  v1::CompileRequest other = Request(g, "kiln");
  other.set_namespace_("other");
  auto second = c->Compile(other);
  ASSERT_TRUE(second.ok()) << second.status();
  stats = c->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->counters().compiles(), 2u);
  EXPECT_EQ(stats->kernel_cache().hits(), 1u);
  EXPECT_EQ(stats->kernel_cache().misses(), 1u);
  const v1::CompiledGraph& a = first->artifact().compiled();
  const v1::CompiledGraph& b = second->artifact().compiled();
  ASSERT_EQ(b.modules_size(), 1);
  EXPECT_EQ(b.modules(0).binary(), a.modules(0).binary());
  EXPECT_TRUE(second->artifact().trace().count("kernels_reused.txt"));
  EXPECT_FALSE(first->artifact().trace().count("kernels_reused.txt"));
}

TEST(KilndTest, KillNineLosesNoAcknowledgedEntry) {
  TempDir dir;
  struct Acked {
    v1::Graph graph;
    std::string digest;
  };
  std::vector<Acked> acked;
  {
    KilndProcess kilnd(dir.path());
    auto c = ConnectTo(kilnd);
    std::atomic<bool> stop{false};
    std::mutex mu;
    std::thread stream([&] {
      for (int salt = 0; !stop; ++salt) {
        v1::Graph g = ChainGraph(40, 8, salt);
        auto r = c->Compile(Request(g));
        if (!r.ok()) return;  // the server died under us
        std::lock_guard<std::mutex> l(mu);
        acked.push_back({g, r->digest()});
      }
    });
    while (true) {
      {
        std::lock_guard<std::mutex> l(mu);
        if (acked.size() >= 25) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    kilnd.Kill();
    stop = true;
    stream.join();
  }
  KilndProcess kilnd(dir.path());
  ClientOptions o;
  o.address = kilnd.address();
  auto c = *Client::Connect(o);
  ASSERT_GE(acked.size(), 25u);
  for (const Acked& a : acked) {
    auto hit = c->LookupGraph(a.graph, {}, ChainSignature(8));
    ASSERT_TRUE(hit.ok()) << hit.status();
    EXPECT_EQ(hit->outcome(), v1::HIT);
    EXPECT_EQ(hit->digest(), a.digest);
    auto artifact = c->GetArtifact(a.digest);
    EXPECT_TRUE(artifact.ok()) << artifact.status();  // verified against its digest
  }
}

}  // namespace
}  // namespace kiln::testing

namespace kiln::testing {
namespace {

// GET http://address/path with HTTP/1.0; the whole response.
std::string HttpGet(const std::string& address, const std::string& path) {
  const int fd = ConnectLoopback(address);
  if (fd < 0) return "";
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(fd, request.data(), request.size());
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) response.append(buf, static_cast<size_t>(n));
  close(fd);
  return response;
}

TEST(KilndTest, PrometheusMetricsFollowTheCounters) {
  TempDir dir;
  KilndProcess kilnd(dir.path(), {"--metrics_listen=127.0.0.1:0"});
  ASSERT_FALSE(kilnd.metrics_address().empty());
  auto c = ConnectTo(kilnd);
  auto first = c->Compile(Request(ChainGraph(4)));
  ASSERT_TRUE(first.ok()) << first.status();
  auto again = c->Compile(Request(ChainGraph(4)));
  ASSERT_TRUE(again.ok()) << again.status();
  const std::string metrics = HttpGet(kilnd.metrics_address(), "/metrics");
  EXPECT_TRUE(Contains(metrics, "200 OK")) << metrics.substr(0, 300);
  EXPECT_TRUE(Contains(metrics, "kiln_compiles_total 1\n")) << metrics;
  EXPECT_TRUE(Contains(metrics, "kiln_lookups_total{outcome=\"full_miss\"} 1\n")) << metrics;
  EXPECT_TRUE(Contains(metrics, "kiln_lookups_total{outcome=\"hit\"} 1\n")) << metrics;
  EXPECT_TRUE(Contains(metrics, "kiln_cache_variants 1\n")) << metrics;
  EXPECT_TRUE(Contains(metrics, "kiln_compile_phase_seconds_count{phase=\"verify\"} 1\n"))
      << metrics;
  EXPECT_TRUE(
      Contains(metrics, "kiln_compile_phase_seconds_bucket{phase=\"verify\",le=\"+Inf\"} 1"))
      << metrics;
  EXPECT_EQ(kilnd.Terminate(), 0);
}

}  // namespace
}  // namespace kiln::testing
