// kilnd's limits as configuration (ServerConfig.limits): each configured
// limit refuses by its field name, a limit over its ceiling stops kilnd at
// start, one namespace cannot take every compile slot or queue unbounded
// bytes, and Lookups wait in a bounded queue of their own.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "google/protobuf/text_format.h"
#include "server/config.h"
#include "tests/integration/connect.h"
#include "tests/integration/graphs.h"
#include "tests/integration/kilnd_process.h"

namespace kiln::testing {
namespace {

std::string WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

TEST(ConfigTest, DefaultsFillEveryLimit) {
  absl::StatusOr<v1::ServerConfig> config = server::ParseConfig("listen: \"127.0.0.1:0\"");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(server::FinishConfig(&*config).ok());
  const v1::Limits& l = config->limits();
  EXPECT_EQ(l.max_nodes(), 100000u);
  EXPECT_EQ(l.max_rank(), 64u);
  EXPECT_EQ(l.max_elements(), uint64_t{1} << 48);
  EXPECT_EQ(l.max_outputs_per_node(), 4096u);
  EXPECT_EQ(l.max_expr_length(), 1024u);
  EXPECT_EQ(l.max_expr_depth(), 256u);
  EXPECT_EQ(l.max_waiting_compiles(), 256u);
  EXPECT_EQ(l.max_compiles_per_tenant(), 32u);
  EXPECT_EQ(l.max_queued_bytes_per_tenant(), uint64_t{256} << 20);
  EXPECT_EQ(l.max_queued_lookups(), 4096u);
}

TEST(ConfigTest, BadConfigsAreRefusedByField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"limits { max_rank: 65 }", "limits.max_rank: 65 is over its ceiling of 64"},
      {"limits { max_elements: 281474976710657 }", "limits.max_elements: 281474976710657"},
      {"limits { max_expr_depth: 100000 }", "limits.max_expr_depth"},
      {"limits { max_waiting_compiles: 8 max_compiles_per_tenant: 9 }",
       "limits.max_compiles_per_tenant: 9 is over limits.max_waiting_compiles (8)"},
      {"listen: \"nowhere\"", "listen: 'nowhere' is not HOST:PORT"},
      {"tls_cert_file: \"c.pem\"", "tls_cert_file and tls_key_file"},
      {"tls_client_ca_file: \"ca.pem\"", "tls_client_ca_file"},
      {"max_message_bytes: 2000000000", "max_message_bytes"},
  };
  for (const auto& [text, expect] : cases) {
    SCOPED_TRACE(text);
    absl::StatusOr<v1::ServerConfig> config = server::ParseConfig(text);
    ASSERT_TRUE(config.ok()) << config.status();
    absl::Status s = server::FinishConfig(&*config);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(s.message(), expect)) << s.message();
  }
  absl::StatusOr<v1::ServerConfig> unknown = server::ParseConfig("limits { max_bananas: 3 }");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(unknown.status().message(), "line 1 column"))
      << unknown.status().message();
}

TEST(LimitsTest, ALimitOverItsCeilingStopsKilndAtStart) {
  TempDir dir;
  const std::string config = WriteFile(dir.path() + "/kilnd.conf", "limits { max_rank: 100 }\n");
  const std::string out =
      RunShell(absl::StrCat(KILND_PATH, " --listen=127.0.0.1:0 --data_dir=", dir.path(),
                            "/data --config=", config, " 2>&1"));
  EXPECT_TRUE(absl::StrContains(out, "limits.max_rank: 100 is over its ceiling of 64")) << out;
  EXPECT_TRUE(absl::StrContains(out, "exit 256")) << out;  // pclose: exit status 1
}

// A graph or guard set that breaks one configured limit, and the field its
// refusal names.
struct Case {
  std::string what;
  v1::Graph graph;
  std::string guards;  // protobuf text of a GuardSet; Compile only
  std::string expect;
};

TEST(LimitsTest, ConfiguredLimitsRefuseByTheirField) {
  TempDir dir;
  const std::string config = WriteFile(dir.path() + "/kilnd.conf", R"(
limits {
  max_nodes: 3 max_rank: 2 max_elements: 1000 max_outputs_per_node: 2
  max_expr_length: 16 max_expr_depth: 3
}
)");
  KilndProcess kilnd(dir.path() + "/data", {"--config=" + config});
  std::unique_ptr<Client> c = ConnectTo(kilnd);
  ASSERT_NE(c, nullptr);
  const std::string relu = "aten.relu.default";
  const std::vector<Case> cases = {
      {"4 nodes", ChainGraph(4), "", "graph has 4 nodes, over the limit of 3 (max_nodes)"},
      {"rank 3", OneNodeGraph({"2", "2", "2"}, {"4", "2", "1"}, relu, "", 1, {"2", "2", "2"}), "",
       "rank 3 is over the limit of 2 (max_rank)"},
      {"100 x 100", OneNodeGraph({"100", "100"}, {"100", "1"}, relu, "", 1, {"100", "100"}), "",
       "more than 1000 elements (the limit per tensor, max_elements)"},
      {"3 outputs", OneNodeGraph({"3"}, {"1"}, "aten.split.Tensor", "args { int_value: 1 }", 3), "",
       "3 outputs, over the limit of 2 per node (max_outputs_per_node)"},
      {"a long size",
       OneNodeGraph({"s0 + s0 + s0 + s0"}, {"1"}, relu, "", 1, {"s0 + s0 + s0 + s0"}), "",
       "over the limit of 16 (max_expr_length)"},
      {"a deep guard", OneNodeGraph({"s0"}, {"1"}, relu, "", 1, {"s0"}),
       "tensors { name: \"x\" dtype: FLOAT32 sizes { expr: \"s0\" } } "
       "shape_guards: \"((((s0)))) >= 2\"",
       "shape guard 0: parentheses nest deeper than 3 (max_expr_depth)"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    v1::CompileRequest compile;
    *compile.mutable_graph() = k.graph;
    compile.mutable_options()->set_backend("eager");
    if (!k.guards.empty()) {
      ASSERT_TRUE(
          google::protobuf::TextFormat::ParseFromString(k.guards, compile.mutable_guards()));
    }
    std::vector<absl::Status> refused = {c->Compile(compile).status()};
    if (k.guards.empty()) {
      v1::LookupRequest lookup;
      *lookup.mutable_graph() = k.graph;
      refused.push_back(c->Lookup(lookup).status());
    }
    for (const absl::Status& s : refused) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_TRUE(absl::StrContains(s.message(), k.expect)) << s.message();
    }
  }
  // Within every limit: compiled.
  v1::CompileRequest fine;
  *fine.mutable_graph() = OneNodeGraph({"8"}, {"1"}, relu, "", 1, {"8"});
  fine.mutable_options()->set_backend("eager");
  EXPECT_TRUE(c->Compile(fine).ok());
  EXPECT_EQ(kilnd.Terminate(), 0);
}

TEST(LimitsTest, OneNamespaceCannotTakeEveryCompileSlot) {
  TempDir dir;
  // A native compiler that takes 3 s: the first compile holds its slot.
  const std::string slow =
      WriteFile(dir.path() + "/slow-gxx", "#!/bin/sh\nsleep 3\nexec g++ \"$@\"\n");
  ASSERT_EQ(chmod(slow.c_str(), 0755), 0);
  const std::string config =
      WriteFile(dir.path() + "/kilnd.conf",
                "limits { max_compiles_per_tenant: 1 max_queued_bytes_per_tenant: 20000 }\n");
  KilndProcess kilnd(dir.path() + "/data",
                     {"--config=" + config, "--native_compiler=" + slow, "--compile_workers=2"});
  auto compile = [](const std::string& ns, const v1::Graph& g) {
    v1::CompileRequest r;
    r.set_namespace_(ns);
    *r.mutable_graph() = g;
    r.mutable_options()->set_backend("kiln");
    return r;
  };
  auto relu = [](const std::string& n) {
    return OneNodeGraph({n}, {"1"}, "aten.relu.default", "", 1, {n});
  };
  std::unique_ptr<Client> first_client = ConnectTo(kilnd);
  std::unique_ptr<Client> c = ConnectTo(kilnd);
  ASSERT_NE(c, nullptr);
  absl::Status first;
  std::thread greedy([&] { first = first_client->Compile(compile("greedy", relu("8"))).status(); });
  absl::SleepFor(absl::Milliseconds(700));
  // The same namespace, another graph: refused while the first compiles.
  absl::Status second = c->Compile(compile("greedy", relu("16"))).status();
  EXPECT_EQ(second.code(), absl::StatusCode::kResourceExhausted) << second;
  EXPECT_TRUE(absl::StrContains(second.message(),
                                "namespace 'greedy': 1 compile requests in flight, the limit "
                                "(limits.max_compiles_per_tenant) is 1"))
      << second.message();
  // Another namespace is served meanwhile.
  absl::Status other = c->Compile(compile("other", relu("16"))).status();
  EXPECT_TRUE(other.ok()) << other;
  greedy.join();
  EXPECT_TRUE(first.ok()) << first;
  // Its slot is free again.
  EXPECT_TRUE(c->Compile(compile("greedy", relu("16"))).ok());
  // One request larger than the namespace's byte limit is refused whole.
  v1::CompileRequest big = compile("greedy", ChainGraph(400));
  ASSERT_GT(big.ByteSizeLong(), 20000u);
  absl::Status too_big = c->Compile(big).status();
  EXPECT_EQ(too_big.code(), absl::StatusCode::kResourceExhausted) << too_big;
  EXPECT_TRUE(absl::StrContains(too_big.message(), "(limits.max_queued_bytes_per_tenant) of 20000"))
      << too_big.message();
  EXPECT_EQ(kilnd.Terminate(), 0);
}

// Lookups are parsed and verified on kilnd's own checking threads behind a
// queue of max_queued_lookups: a burst beyond it is refused by name, the rest
// are answered, and health answers throughout.
TEST(LimitsTest, LookupsWaitInABoundedQueue) {
  TempDir dir;
  const std::string config =
      WriteFile(dir.path() + "/kilnd.conf", "limits { max_queued_lookups: 1 }\n");
  KilndProcess kilnd(dir.path() + "/data", {"--config=" + config});
  v1::LookupRequest lookup;
  *lookup.mutable_graph() = ChainGraph(5000);
  std::atomic<int> answered{0}, refused{0}, other{0};
  std::string refusal;
  std::vector<std::thread> clients;
  for (int t = 0; t < 32; ++t) {
    clients.emplace_back([&] {
      std::unique_ptr<Client> c = ConnectTo(kilnd);
      if (c == nullptr) return;
      for (int i = 0; i < 4; ++i) {
        absl::Status s = c->Lookup(lookup).status();
        if (s.ok()) {
          ++answered;
        } else if (s.code() == absl::StatusCode::kResourceExhausted) {
          if (++refused == 1) refusal = std::string(s.message());
        } else {
          ++other;
        }
      }
    });
  }
  std::unique_ptr<Client> health = ConnectTo(kilnd);
  ASSERT_NE(health, nullptr);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(health->Health().ok());
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(other, 0);
  EXPECT_GT(answered, 0);
  EXPECT_GT(refused, 0);
  EXPECT_TRUE(absl::StrContains(refusal, "the lookup queue (limits.max_queued_lookups) is full"))
      << refusal;
  EXPECT_EQ(kilnd.Terminate(), 0);
}

}  // namespace
}  // namespace kiln::testing
