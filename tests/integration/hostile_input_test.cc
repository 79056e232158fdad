// Hostile requests against the real kilnd: each is refused with
// INVALID_ARGUMENT naming the limit or the field, quickly, with a short
// message, through Compile and through Lookup; kilnd keeps answering health
// checks throughout and its peak memory stays bounded.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "google/protobuf/text_format.h"
#include "tests/integration/graphs.h"
#include "tests/integration/kilnd_process.h"

namespace kiln::testing {
namespace {

std::string Nested(int depth) { return std::string(depth, '(') + "s0" + std::string(depth, ')'); }

// kilnd's peak resident memory (VmHWM), in KiB.
int64_t PeakRssKib(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "VmHWM:")) {
      int64_t kib = 0;
      std::string digits;
      for (char c : line) {
        if (std::isdigit(c)) digits += c;
      }
      if (absl::SimpleAtoi(digits, &kib)) return kib;
    }
  }
  return -1;
}

struct Case {
  std::string what;
  std::function<v1::Graph()> graph;
  std::string expect;  // in the message
};

TEST(HostileInputTest, EveryBadGraphIsRefusedByNameAndKilndKeepsServing) {
  const std::string two62 = std::to_string(int64_t{1} << 62);
  const std::vector<Case> cases = {
      // A 300-byte request that killed kilnd with SIGFPE: the element count
      // overflows int64 and the view rule took numel % known.
      {"view of 2^63 elements",
       [&] {
         return OneNodeGraph({two62, "2"}, {"2", "1"}, "aten.view.default",
                             "args { ints { values: 3 values: 5 values: 17 values: 257 values: 641 "
                             "values: 65537 values: 6700417 values: -1 } }");
       },
       "elements (the limit per tensor, max_elements)"},
      // The same view sizes, whose product is 2^64 - 1, over a small input.
      {"view sizes whose product overflows",
       [&] {
         return OneNodeGraph({"4096", "4096"}, {"4096", "1"}, "aten.view.default",
                             "args { ints { values: 3 values: 5 values: 17 values: 257 values: 641 "
                             "values: 65537 values: 6700417 values: -1 } }");
       },
       "is invalid for input of size 16777216"},
      {"split of a dimension of 10^12",
       [&] {
         return OneNodeGraph({"1000000000000"}, {"1"}, "aten.split.Tensor",
                             "args { int_value: 1 }");
       },
       "outputs, over the limit of 4096 per node"},
      {"unbind of a dimension of 10^12",
       [&] {
         return OneNodeGraph({"1000000000000", "2"}, {"2", "1"}, "aten.unbind.int", "");
       },
       "over the limit of 4096 per node"},
      {"100,000 nested parentheses in a size",
       [&] { return OneNodeGraph({Nested(100000)}, {"1"}, "aten.relu.default", ""); },
       "is an expression of 200002 characters, over the limit of 1024"},
      {"a megabyte of size expression",
       [&] {
         std::string e = "s0";
         while (e.size() < (1u << 20)) e += " + s0";
         return OneNodeGraph({e}, {"1"}, "aten.relu.default", "");
       },
       "over the limit of 1024"},
      {"rank 65",
       [&] {
         return OneNodeGraph(std::vector<std::string>(65, "1"), std::vector<std::string>(65, "1"),
                             "aten.relu.default", "");
       },
       "rank 65 is over the limit of 64"},
      {"a negative stride beyond the bound",
       [&] { return OneNodeGraph({"4"}, {"-9223372036854775807"}, "aten.relu.default", ""); },
       "stride[0] is -9223372036854775807, beyond the limit"},
      {"5000 outputs on one node",
       [&] {
         return OneNodeGraph({"8"}, {"1"}, "aten.split.Tensor", "args { int_value: 1 }", 5000);
       },
       "has 5000 outputs, over the limit of 4096 per node"},
  };

  TempDir dir;
  KilndProcess kilnd(dir.path());
  ClientOptions o;
  o.address = kilnd.address();
  o.deadline = absl::Seconds(30);
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    const v1::Graph graph = k.graph();
    v1::CompileRequest compile;
    *compile.mutable_graph() = graph;
    compile.mutable_options()->set_backend("kiln");
    const absl::Time start = absl::Now();
    auto compiled = (*c)->Compile(compile);
    v1::LookupRequest lookup;
    *lookup.mutable_graph() = graph;
    auto looked_up = (*c)->Lookup(lookup);
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    for (const absl::Status& s : {compiled.status(), looked_up.status()}) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s.message().substr(0, 300);
      EXPECT_TRUE(absl::StrContains(s.message(), k.expect)) << s.message().substr(0, 300);
      EXPECT_LT(s.message().size(), 4200u);
    }
    EXPECT_TRUE((*c)->Health().ok());
  }
  const int64_t peak = PeakRssKib(kilnd.pid());
  std::printf(
      "hostile inputs: %zu graphs, each through Compile and Lookup; kilnd peak RSS %lld KiB\n",
      cases.size(), static_cast<long long>(peak));
  EXPECT_GT(peak, 0);
  EXPECT_LT(peak, 1 << 20) << "kilnd's peak RSS reached " << peak << " KiB";
  EXPECT_EQ(kilnd.Terminate(), 0);
}

// Targets a client names: an unknown device, an SM arch that is not one (it
// would reach NVRTC's command line), a CUDA version the server lacks, and
// tensors on another device than the target's.
TEST(HostileInputTest, BadTargetsAreRefusedByField) {
  TempDir dir;
  KilndProcess kilnd(dir.path());
  ClientOptions o;
  o.address = kilnd.address();
  o.deadline = absl::Seconds(60);
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  v1::Graph cuda_graph = OneNodeGraph({"8"}, {"1"}, "aten.relu.default", "", 1, {"8"});
  cuda_graph.mutable_inputs(0)->mutable_value()->mutable_meta()->mutable_device()->set_type("cuda");
  cuda_graph.mutable_nodes(0)->mutable_outputs(0)->mutable_meta()->mutable_device()->set_type(
      "cuda");
  struct TargetCase {
    std::string what;
    std::string device, sm_arch, cuda_version;
    bool cuda_tensors;
    absl::StatusCode code;
    std::string expect;
  };
  const std::vector<TargetCase> cases = {
      {"unknown device", "tpu", "", "", false, absl::StatusCode::kInvalidArgument,
       "options.target.device_type: 'tpu' is not a device"},
      {"an arch with a quote", "cuda", "sm_9'; rm -rf /", "", true,
       absl::StatusCode::kInvalidArgument, "options.target.sm_arch"},
      {"a megabyte of arch", "cuda", std::string(1 << 20, 'a'), "", true,
       absl::StatusCode::kInvalidArgument, "options.target.sm_arch"},
      {"a CUDA version the server lacks", "cuda", "sm_90", "9.1", true,
       absl::StatusCode::kFailedPrecondition, "cuda_version is 9.1"},
      {"cuda tensors for a cpu target", "cpu", "", "", true, absl::StatusCode::kInvalidArgument,
       "is on cuda but options.target.device_type is cpu"},
  };
  for (const TargetCase& k : cases) {
    SCOPED_TRACE(k.what);
    v1::CompileRequest compile;
    *compile.mutable_graph() =
        k.cuda_tensors ? cuda_graph : OneNodeGraph({"8"}, {"1"}, "aten.relu.default", "", 1, {"8"});
    compile.mutable_options()->set_backend("kiln");
    v1::Target* t = compile.mutable_options()->mutable_target();
    t->set_device_type(k.device);
    t->set_sm_arch(k.sm_arch);
    t->set_cuda_version(k.cuda_version);
    auto compiled = (*c)->Compile(compile);
    EXPECT_EQ(compiled.status().code(), k.code) << compiled.status().message().substr(0, 300);
    EXPECT_TRUE(absl::StrContains(compiled.status().message(), k.expect))
        << compiled.status().message().substr(0, 300);
    EXPECT_LT(compiled.status().message().size(), 4200u);
    EXPECT_TRUE((*c)->Health().ok());
  }
  // The same graph on the GPU compiles for sm_90 (NVRTC, no GPU needed).
  v1::CompileRequest good;
  *good.mutable_graph() = cuda_graph;
  good.mutable_options()->set_backend("kiln");
  auto compiled = (*c)->Compile(good);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  EXPECT_EQ(compiled->artifact().target().sm_arch(), "sm_90");
  EXPECT_EQ(compiled->artifact().compiled().modules(0).language(), "cuda");
  EXPECT_EQ(kilnd.Terminate(), 0);
}

}  // namespace
}  // namespace kiln::testing

namespace kiln::testing {
namespace {

TEST(HostileInputTest, HelpListsTheFlagsAndNoBuildPaths) {
  for (const auto& [binary, flag, file] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {KILND_PATH, "--data_dir", "server/main.cc"},
           {KILNCTL_PATH, "--server", "client/kilnctl.cc"}}) {
    SCOPED_TRACE(binary);
    const std::string help = RunShell(binary + " --help 2>&1");
    EXPECT_FALSE(absl::StrContains(help, "No flags matched")) << help;
    EXPECT_TRUE(absl::StrContains(help, flag)) << help;
    EXPECT_TRUE(absl::StrContains(help, "Flags from " + file + ":")) << help;
    EXPECT_FALSE(absl::StrContains(help, KILN_SOURCE_DIR)) << help;
  }
}

// Idle connections beyond kilnd's open-file limit: gRPC's own listener stopped
// for good after one EMFILE; kilnd's sheds them and serves again once they
// close.
TEST(HostileInputTest, AConnectionFloodNeverStopsTheListener) {
  rlimit r{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &r), 0);
  r.rlim_cur = r.rlim_max;
  setrlimit(RLIMIT_NOFILE, &r);  // this test holds 600 sockets itself
  TempDir dir;
  KilndProcess kilnd(dir.path(), {"--open_file_limit=256"});
  ClientOptions o;
  o.address = kilnd.address();
  o.deadline = absl::Seconds(10);
  auto health = [&] {
    auto c = Client::Connect(o);
    return c.ok() && (*c)->Health().ok();
  };
  ASSERT_TRUE(health());
  std::vector<int> flood;
  for (int i = 0; i < 600; ++i) {
    const int fd = ConnectLoopback(kilnd.address());
    if (fd >= 0) flood.push_back(fd);
  }
  EXPECT_GT(flood.size(), 300u);
  absl::SleepFor(absl::Seconds(1));
  for (int fd : flood) close(fd);
  // Served again once the flood is gone (the kernel may take a moment to
  // tear the shed connections down).
  bool serving = false;
  for (int attempt = 0; attempt < 20 && !serving; ++attempt) {
    serving = health();
    if (!serving) absl::SleepFor(absl::Milliseconds(250));
  }
  EXPECT_TRUE(serving) << "kilnd stopped accepting after a connection flood";
  EXPECT_EQ(kilnd.Terminate(), 0);
}

// A compile whose only client gave up (deadline) stops: its compiler, and
// what the compiler started, are killed, and nothing stays in flight.
TEST(HostileInputTest, ACompileNobodyWaitsForStops) {
  TempDir dir;
  const std::string script = dir.path() + "/slow-g++";
  const std::string marker = dir.path() + "/compiler-child-finished";
  {
    std::ofstream f(script);
    f << "#!/bin/sh\n(sleep 4; touch '" << marker << "') &\nsleep 60\n";
  }
  ASSERT_EQ(chmod(script.c_str(), 0755), 0);
  KilndProcess kilnd(dir.path() + "/data", {"--native_compiler=" + script});
  ClientOptions o;
  o.address = kilnd.address();
  o.deadline = absl::Seconds(1);
  o.max_attempts = 1;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  v1::CompileRequest r;
  *r.mutable_graph() = ChainGraph(4);
  r.mutable_options()->set_backend("kiln");
  const absl::Time start = absl::Now();
  auto compiled = (*c)->Compile(r);
  EXPECT_EQ(compiled.status().code(), absl::StatusCode::kDeadlineExceeded) << compiled.status();
  o.deadline = absl::Seconds(10);
  auto admin = Client::Connect(o);
  ASSERT_TRUE(admin.ok());
  uint64_t in_flight = 1;
  while (in_flight != 0 && absl::Now() - start < absl::Seconds(3)) {
    auto stats = (*admin)->Stats();
    ASSERT_TRUE(stats.ok()) << stats.status();
    in_flight = stats->in_flight();
    if (in_flight != 0) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(in_flight, 0u) << "the compile kept running after its client left";
  absl::SleepFor(absl::Seconds(5) - (absl::Now() - start));
  EXPECT_FALSE(std::ifstream(marker).good()) << "the compiler's child outlived the cancel";
  auto stats = (*admin)->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->counters().compile_errors(), 0u);
  EXPECT_EQ(kilnd.Terminate(), 0);
}

TEST(HostileInputTest, ScratchFilesACrashLeftAreRemovedAtStart) {
  TempDir dir;
  {
    KilndProcess kilnd(dir.path());
    kilnd.Kill();  // as a crash would: nothing cleaned up
  }
  const std::string stale = dir.path() + "/scratch/kiln_AbCdEf.cc";
  { std::ofstream(stale) << "left by a crash\n"; }
  ASSERT_TRUE(std::ifstream(stale).good());
  KilndProcess kilnd(dir.path());
  EXPECT_FALSE(std::ifstream(stale).good());
  EXPECT_EQ(kilnd.Terminate(), 0);
}

TEST(HostileInputTest, DataDirIsAPathNeverAShellCommand) {
  TempDir dir;
  const std::string marker = dir.path() + "/ran";
  const std::string data_dir = dir.path() + "/a'; touch '" + marker + "'; '";
  {
    KilndProcess kilnd(data_dir);
    EXPECT_EQ(kilnd.Terminate(), 0);
  }
  EXPECT_FALSE(std::ifstream(marker).good()) << "a quote in data_dir ran a command";
  EXPECT_TRUE(std::ifstream(data_dir + "/CURRENT").good()) << "no database at the literal path";
}

}  // namespace
}  // namespace kiln::testing
