#include "client/client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "compiler/ir/canonical.h"
#include "compiler/ir/graph.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"

#ifndef KILNCTL_PATH
#error "KILNCTL_PATH must name the kilnctl binary"
#endif

namespace kiln {
namespace {

// A port nothing listens on: bound, read, closed.
int UnusedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

std::unique_ptr<Client> MustConnect(ClientOptions options) {
  auto client = Client::Connect(std::move(options));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// x: f32[4, 8] -> relu -> neg
v1::Graph TestGraph(const std::string& size0 = "int_value: 4") {
  const std::string meta = "meta { dtype: FLOAT32 sizes { " + size0 +
                           " } sizes { int_value: 8 } strides { int_value: 8 } "
                           "strides { int_value: 1 } device { type: \"cpu\" index: -1 } }";
  const std::string text =
      "name: \"f\" inputs { kind: USER_INPUT value { name: \"x\" " + meta +
      " } }\n"
      "nodes { name: \"relu\" target: \"aten.relu.default\" args { tensor: \"x\" } "
      "outputs { name: \"a\" " +
      meta +
      " } }\n"
      "nodes { name: \"neg\" target: \"aten.neg.default\" args { tensor: \"a\" } "
      "outputs { name: \"b\" " +
      meta +
      " } }\n"
      "outputs: \"b\"\n";
  v1::Graph g;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &g)) << text;
  return g;
}

v1::CompileOptions Backend(const std::string& backend) {
  v1::CompileOptions o;
  o.set_backend(backend);
  o.mutable_target()->set_device_type("cpu");
  return o;
}

// ---------------------------------------------------------------------------
// Retries and deadlines without a server.

TEST(ClientTest, RetriesUnavailableWithBackoff) {
  ClientOptions options;
  options.address = absl::StrCat("127.0.0.1:", UnusedPort());
  options.max_attempts = 3;
  options.initial_backoff = absl::Milliseconds(50);
  auto client = MustConnect(options);
  ASSERT_NE(client, nullptr);

  const absl::Time start = absl::Now();
  auto stats = client->Stats();
  const absl::Duration elapsed = absl::Now() - start;
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kUnavailable) << stats.status();
  // Three attempts sleep 50 ms, then 100 ms, in between.
  EXPECT_GE(elapsed, absl::Milliseconds(150)) << elapsed;
}

TEST(ClientTest, DeadlineBoundsRetries) {
  ClientOptions options;
  options.address = absl::StrCat("127.0.0.1:", UnusedPort());
  options.max_attempts = 100;  // 50 ms doubling: minutes of backoff if unbounded
  options.initial_backoff = absl::Milliseconds(50);
  options.deadline = absl::Milliseconds(300);
  auto client = MustConnect(options);
  ASSERT_NE(client, nullptr);

  const absl::Time start = absl::Now();
  absl::Status health = client->Health();
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_TRUE(health.code() == absl::StatusCode::kUnavailable ||
              health.code() == absl::StatusCode::kDeadlineExceeded)
      << health;
  EXPECT_LT(elapsed, absl::Milliseconds(300) + absl::Milliseconds(700)) << elapsed;
  EXPECT_GE(elapsed, absl::Milliseconds(150)) << elapsed;  // it did retry
}

TEST(ClientTest, ConnectValidatesOptions) {
  EXPECT_EQ(Client::Connect({}).status().code(), absl::StatusCode::kInvalidArgument);
  ClientOptions o;
  o.address = "127.0.0.1:1";
  o.max_attempts = 0;
  auto c = Client::Connect(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("max_attempts"), std::string::npos) << c.status();
  o.max_attempts = 1;
  o.deadline = absl::ZeroDuration();
  EXPECT_EQ(Client::Connect(o).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// Against an in-process fake server.

class FakeAdmin final : public v1::Admin::Service {
 public:
  std::atomic<int> stats_calls{0};
  std::atomic<int> get_entry_calls{0};
  std::atomic<int> freeze_calls{0};
  // Stats fails this many times first (set by the test, read on the
  // server's threads).
  std::atomic<int> unavailable_first{0};

  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest*,
                     v1::StatsResponse* response) override {
    if (++stats_calls <= unavailable_first) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "warming up");
    }
    response->set_compiler_version("fake");
    return grpc::Status::OK;
  }
  grpc::Status GetEntry(grpc::ServerContext*, const v1::GetEntryRequest* request,
                        v1::GetEntryResponse*) override {
    ++get_entry_calls;
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("no entry '", request->key(), "'"));
  }
  // Never answers before the caller gives up.
  grpc::Status Freeze(grpc::ServerContext* context, const v1::FreezeRequest*,
                      v1::FreezeResponse*) override {
    ++freeze_calls;
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (!context->IsCancelled() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
    return grpc::Status(grpc::StatusCode::INTERNAL, "should have timed out");
  }
};

class FakeCompiler final : public v1::Compiler::Service {
 public:
  grpc::Status Lookup(grpc::ServerContext*, const v1::LookupRequest* request,
                      v1::LookupResponse* response) override {
    absl::MutexLock lock(&mu);
    last_lookup = *request;
    response->set_outcome(v1::FULL_MISS);
    response->set_key(request->key());
    return grpc::Status::OK;
  }
  absl::Mutex mu;
  v1::LookupRequest last_lookup;
};

class FakeServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&admin_);
    builder.RegisterService(&compiler_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }
  std::unique_ptr<Client> Connect(int max_attempts = 5,
                                  absl::Duration deadline = absl::Seconds(10)) {
    ClientOptions o;
    o.address = address_;
    o.max_attempts = max_attempts;
    o.initial_backoff = absl::Milliseconds(10);
    o.deadline = deadline;
    return MustConnect(o);
  }

  FakeAdmin admin_;
  FakeCompiler compiler_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(FakeServerTest, RetriedUnavailableThenSucceeds) {
  admin_.unavailable_first = 2;
  auto client = Connect();
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->compiler_version(), "fake");
  EXPECT_EQ(admin_.stats_calls, 3);
}

TEST_F(FakeServerTest, GivesUpAfterMaxAttempts) {
  admin_.unavailable_first = 100;
  auto client = Connect(/*max_attempts=*/4);
  auto stats = client->Stats();
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(stats.status().message(), "warming up");
  EXPECT_EQ(admin_.stats_calls, 4);
}

TEST_F(FakeServerTest, OtherCodesAreNotRetriedAndKeepTheirMessage) {
  auto client = Connect();
  auto entry = client->GetEntry("abc");
  EXPECT_EQ(entry.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(entry.status().message(), "no entry 'abc'");
  EXPECT_EQ(admin_.get_entry_calls, 1);
}

TEST_F(FakeServerTest, DeadlineIsHonored) {
  auto client = Connect(/*max_attempts=*/5, /*deadline=*/absl::Milliseconds(200));
  const absl::Time start = absl::Now();
  auto frozen = client->Freeze();
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_EQ(frozen.status().code(), absl::StatusCode::kDeadlineExceeded) << frozen.status();
  EXPECT_GE(elapsed, absl::Milliseconds(150)) << elapsed;
  EXPECT_LT(elapsed, absl::Seconds(2)) << elapsed;
  EXPECT_EQ(admin_.freeze_calls, 1);
}

TEST_F(FakeServerTest, HealthUsesTheStandardService) {
  auto client = Connect();
  EXPECT_TRUE(client->Health().ok()) << client->Health();
  server_->GetHealthCheckService()->SetServingStatus(false);
  const absl::Status health = client->Health();
  EXPECT_EQ(health.code(), absl::StatusCode::kUnavailable) << health;
  EXPECT_NE(health.message().find("NOT_SERVING"), std::string::npos) << health;
}

TEST_F(FakeServerTest, LookupGraphSendsTheKeyNotTheGraph) {
  auto client = Connect();
  const v1::Graph graph = TestGraph();
  auto signature = SignatureFromMetadata(graph);
  ASSERT_TRUE(signature.ok()) << signature.status();
  auto r = client->LookupGraph(graph, Backend("eager"), *signature, "tenant", true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome(), v1::FULL_MISS);

  absl::MutexLock lock(&compiler_.mu);
  const v1::LookupRequest& sent = compiler_.last_lookup;
  EXPECT_EQ(sent.what_case(), v1::LookupRequest::kKey);
  EXPECT_EQ(sent.key(), *Client::Key(graph, Backend("eager")));
  EXPECT_EQ(sent.namespace_(), "tenant");
  EXPECT_TRUE(sent.include_artifact());
  ASSERT_EQ(sent.signature().inputs_size(), 1);
  EXPECT_EQ(sent.signature().inputs(0).sizes_size(), 2);
}

// ---------------------------------------------------------------------------
// Keys and signatures, computed locally.

TEST(ClientKeyTest, EqualsTheServersKeyFunction) {
  const v1::Graph graph = TestGraph();
  auto ir_graph = ir::Graph::FromProto(graph);
  ASSERT_TRUE(ir_graph.ok()) << ir_graph.status();
  auto key = Client::Key(graph, Backend("eager"));
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(*key, ir::CacheKey(*ir_graph, Backend("eager")));
  EXPECT_EQ(key->size(), 64u);
  EXPECT_NE(*key, *Client::Key(graph, Backend("aot_eager")));
}

TEST(ClientKeyTest, MalformedGraphIsInvalidArgument) {
  v1::Graph graph = TestGraph();
  graph.mutable_nodes(0)->mutable_args(0)->set_tensor("nowhere");
  EXPECT_EQ(Client::Key(graph, Backend("eager")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SignatureTest, ConcreteMetadataIsTheSignature) {
  auto s = SignatureFromMetadata(TestGraph());
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->inputs_size(), 1);
  const v1::TensorSignature& t = s->inputs(0);
  EXPECT_EQ(t.dtype(), v1::FLOAT32);
  EXPECT_EQ(t.device().type(), "cpu");
  EXPECT_EQ(std::vector<int64_t>(t.sizes().begin(), t.sizes().end()), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(std::vector<int64_t>(t.strides().begin(), t.strides().end()),
            (std::vector<int64_t>{8, 1}));
}

TEST(SignatureTest, SymbolicMetadataNamesTheInput) {
  auto s = SignatureFromMetadata(TestGraph("expr: \"s0\""));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("'x'"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("s0"), std::string::npos) << s.status();
}

// ---------------------------------------------------------------------------
// kilnctl, run as separate processes.

struct ProcessResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

ProcessResult RunKilnctl(const std::string& args) {
  const std::string command = absl::StrCat(KILNCTL_PATH, " ", args, " 2>&1");
  ProcessResult run;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) run.output.append(buf, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

std::string WriteGraphFile(const std::string& name, const v1::Graph& graph,
                           const v1::CompileOptions& options) {
  v1::GraphFile file;
  *file.mutable_graph() = graph;
  *file.mutable_options() = options;
  std::string json;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(file, &json).ok());
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/kiln_client_test_", getpid(), "_", name);
  std::ofstream(path) << json;
  return path;
}

TEST(KilnctlTest, KeyMatchesClientKeyInTwoProcesses) {
  const v1::Graph graph = TestGraph();
  const std::string path = WriteGraphFile("graph.json", graph, Backend("eager"));
  const std::string expected = *Client::Key(graph, Backend("eager"));

  const ProcessResult first = RunKilnctl("key " + path);
  const ProcessResult second = RunKilnctl("key " + path);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(absl::StripTrailingAsciiWhitespace(first.output), expected);
  EXPECT_EQ(first.output, second.output);

  // --backend overrides the file's options, and changes the key.
  const ProcessResult aot = RunKilnctl("key --backend=aot_eager " + path);
  ASSERT_EQ(aot.exit_code, 0) << aot.output;
  EXPECT_EQ(absl::StripTrailingAsciiWhitespace(aot.output),
            *Client::Key(graph, Backend("aot_eager")));
  std::filesystem::remove(path);
}

TEST(KilnctlTest, PrintsTheGraph) {
  const std::string path = WriteGraphFile("print.json", TestGraph(), Backend("eager"));
  const ProcessResult run = RunKilnctl("print " + path);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("aten.relu.default"), std::string::npos) << run.output;
  std::filesystem::remove(path);
}

TEST(KilnctlTest, ErrorsAreReportedWithTheirCode) {
  const ProcessResult unreachable =
      RunKilnctl(absl::StrCat("--server=127.0.0.1:", UnusedPort(), " --deadline=2s stats"));
  EXPECT_EQ(unreachable.exit_code, 1);
  EXPECT_NE(unreachable.output.find("kilnctl: UNAVAILABLE: "), std::string::npos)
      << unreachable.output;

  const ProcessResult missing = RunKilnctl("key /nonexistent/graph.json");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("/nonexistent/graph.json"), std::string::npos) << missing.output;

  const std::string bad =
      absl::StrCat(::testing::TempDir(), "/kiln_client_test_", getpid(), "_bad.json");
  std::ofstream(bad) << "{\"graph\": {\"nodez\": []}}";
  const ProcessResult parse = RunKilnctl("print " + bad);
  EXPECT_EQ(parse.exit_code, 1);
  EXPECT_NE(parse.output.find("kilnctl: INVALID_ARGUMENT: " + bad), std::string::npos)
      << parse.output;
  std::filesystem::remove(bad);

  // lookup derives the signature before any RPC: symbolic metadata is refused.
  const std::string symbolic =
      WriteGraphFile("sym.json", TestGraph("expr: \"s0\""), Backend("eager"));
  const ProcessResult lookup =
      RunKilnctl(absl::StrCat("--server=127.0.0.1:", UnusedPort(), " lookup ", symbolic));
  EXPECT_EQ(lookup.exit_code, 1);
  EXPECT_NE(lookup.output.find("INVALID_ARGUMENT"), std::string::npos) << lookup.output;
  EXPECT_NE(lookup.output.find("'x'"), std::string::npos) << lookup.output;
  std::filesystem::remove(symbolic);
}

TEST(KilnctlTest, UsageOnNoOrUnknownCommand) {
  const ProcessResult none = RunKilnctl("");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.output.find("usage: kilnctl"), std::string::npos) << none.output;
  const ProcessResult unknown = RunKilnctl("frobnicate");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.output.find("unknown command 'frobnicate'"), std::string::npos)
      << unknown.output;
}

}  // namespace
}  // namespace kiln
