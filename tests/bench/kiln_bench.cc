// kiln_bench: lookup latency and throughput over loopback, and the server-side
// compile time of the eager backend. Starts its own kilnd over a temporary
// data directory.
//
//   build/bin/kiln_bench [--seconds=3] [--clients=16] [--compiles=20]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "tests/integration/graphs.h"
#include "tests/integration/kilnd_process.h"

ABSL_FLAG(double, seconds, 3.0, "duration of each throughput run");
ABSL_FLAG(int, clients, 16, "concurrent clients for the throughput run");
ABSL_FLAG(int, samples, 20000, "lookups timed one at a time per graph");
ABSL_FLAG(int, compiles, 20, "eager compiles of distinct 1000-node graphs");
ABSL_FLAG(std::string, server, "", "measure this running kilnd instead of starting one");
ABSL_FLAG(bool, security, false,
          "also start a kilnd with TLS and tokens and measure the same lookups through it");

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// How the clients reach kilnd: plaintext, or TLS with a bearer token.
struct Credentials {
  std::string token;
  std::string root_certs;
};
Credentials g_credentials;

std::unique_ptr<Client> Connect(const std::string& address) {
  ClientOptions o;
  o.address = address;
  o.token = g_credentials.token;
  o.tls_root_certs = g_credentials.root_certs;
  auto c = Client::Connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(c);
}

v1::LookupRequest ByKey(const std::string& key) {
  v1::LookupRequest r;
  r.set_key(key);
  *r.mutable_signature() = testing::ChainSignature(8);
  return r;
}

void LookupBench(const std::string& address, int nodes, const char* how = "") {
  auto c = Connect(address);
  v1::CompileRequest compile;
  *compile.mutable_graph() = testing::ChainGraph(nodes);
  auto compiled = c->Compile(compile);
  if (!compiled.ok()) {
    std::fprintf(stderr, "compile: %s\n", compiled.status().ToString().c_str());
    std::exit(1);
  }
  // The client computes the key once per graph, then sends key + signature.
  std::string key;
  std::vector<double> key_times;
  for (int i = 0; i < 21; ++i) {
    auto t0 = Clock::now();
    key = *Client::Key(compile.graph(), v1::CompileOptions());
    key_times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  const double key_us = Percentile(key_times, 0.5);
  const v1::LookupRequest req = ByKey(key);

  for (int i = 0; i < 1000; ++i) (void)c->Lookup(req);  // warm-up
  std::vector<double> lat;
  const int samples = absl::GetFlag(FLAGS_samples);
  lat.reserve(samples);
  for (int i = 0; i < samples; ++i) {
    auto s = Clock::now();
    auto r = c->Lookup(req);
    lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - s).count());
    if (!r.ok() || r->outcome() != v1::HIT) {
      std::fprintf(stderr, "lookup did not hit\n");
      std::exit(1);
    }
  }

  const int n = absl::GetFlag(FLAGS_clients);
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < n; ++i) clients.push_back(Connect(address));
  for (auto& cl : clients) (void)cl->Lookup(req);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> hits{0};
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      uint64_t mine = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        auto r = clients[i]->Lookup(req);
        if (r.ok() && r->outcome() == v1::HIT) ++mine;
      }
      hits += mine;
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds)));
  stop = true;
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();

  std::printf("| lookup hit, %4d-node graph%s | %7.1f | %7.1f | %9.0f | %8.1f |\n", nodes, how,
              Percentile(lat, 0.50), Percentile(lat, 0.99), static_cast<double>(hits) / secs,
              key_us);
}

void CompileBench(const std::string& address) {
  auto c = Connect(address);
  std::vector<double> server_ms, rpc_ms;
  for (int i = 0; i < absl::GetFlag(FLAGS_compiles); ++i) {
    v1::CompileRequest req;
    *req.mutable_graph() = testing::ChainGraph(1000, 8, 1000 + i);
    auto s = Clock::now();
    auto r = c->Compile(req);
    rpc_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - s).count());
    if (!r.ok() || r->outcome() != v1::FULL_MISS) {
      std::fprintf(stderr, "compile failed\n");
      std::exit(1);
    }
    int64_t us = 0;
    for (const auto& p : r->artifact().compile_times()) us += p.micros();
    server_ms.push_back(static_cast<double>(us) / 1000.0);
  }
  // Phases after the artifact was serialized (store) are in Stats.
  auto stats = c->Stats();
  double store_ms = 0;
  for (const auto& p : stats->phases()) {
    if (p.phase() == "store") store_ms = p.histogram().sum() / p.histogram().count() / 1000.0;
  }
  std::printf("\n| eager compile, 1000-node graph | median | p90 |\n|---|---|---|\n");
  std::printf("| server-side, verify + key + canonicalize (ms) | %.2f | %.2f |\n",
              Percentile(server_ms, 0.5), Percentile(server_ms, 0.9));
  std::printf("| server-side store (mean, ms) | %.2f | |\n", store_ms);
  std::printf("| whole Compile RPC seen by the client (ms) | %.2f | %.2f |\n",
              Percentile(rpc_ms, 0.5), Percentile(rpc_ms, 0.9));
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  kiln::testing::TempDir dir;
  std::unique_ptr<kiln::testing::KilndProcess> kilnd;
  std::string address = absl::GetFlag(FLAGS_server);
  if (address.empty()) {
    kilnd = std::make_unique<kiln::testing::KilndProcess>(dir.path());
    address = kilnd->address();
  }
  std::printf("kiln_bench against %s (%u hardware threads)\n\n", address.c_str(),
              std::thread::hardware_concurrency());
  std::printf(
      "| what | p50 µs (1 client) | p99 µs (1 client) | hits/s (%d clients) | key µs (client, once "
      "per graph) |\n",
      absl::GetFlag(FLAGS_clients));
  std::printf("|---|---|---|---|---|\n");
  kiln::LookupBench(address, 100);
  kiln::LookupBench(address, 1000);
  int status = 0;
  if (absl::GetFlag(FLAGS_security)) {
    // The same lookups through a kilnd with TLS (an EC P-256 certificate made
    // here by openssl) and a tokens file.
    kiln::testing::TempDir secure_dir;
    const std::string key = secure_dir.path() + "/key.pem", cert = secure_dir.path() + "/cert.pem";
    const std::string make = absl::StrCat(
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
        "-subj /CN=localhost -addext subjectAltName=IP:127.0.0.1 -keyout ",
        key, " -out ", cert, " >/dev/null 2>&1");
    if (std::system(make.c_str()) != 0) {
      std::fprintf(stderr, "openssl could not make a certificate\n");
      return 1;
    }
    const std::string token = "bench-token-0123456789abcdef";
    std::ofstream(secure_dir.path() + "/tokens") << token << " compiler - bench\n";
    std::ifstream pem(cert);
    kiln::g_credentials.root_certs.assign(std::istreambuf_iterator<char>(pem),
                                          std::istreambuf_iterator<char>());
    kiln::g_credentials.token = token;
    kiln::testing::KilndProcess secure(secure_dir.path() + "/data",
                                       {"--tokens_file=" + secure_dir.path() + "/tokens",
                                        "--tls_cert_file=" + cert, "--tls_key_file=" + key});
    kiln::LookupBench(secure.address(), 100, ", TLS + token");
    kiln::LookupBench(secure.address(), 1000, ", TLS + token");
    kiln::g_credentials = {};
    status |= secure.Terminate();
  }
  kiln::CompileBench(address);
  return (kilnd == nullptr || kilnd->Terminate() == 0) && status == 0 ? 0 : 1;
}
