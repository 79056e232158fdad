// kilnd: the Kiln compile server.
//
//   kilnd --listen=ADDR --data_dir=DIR [--config=FILE] [--frozen]
//
// Prints "kilnd listening on ADDR" once it accepts requests. SIGTERM or
// SIGINT drains the requests in flight, finishes queued compiles, writes
// statistics back and closes RocksDB.
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cache/cache.h"
#include "cache/stats.h"
#include "common/flags_usage.h"
#include "common/signing.h"
#include "common/status_macros.h"
#include "compiler/codegen/codegen.h"
#include "compiler/codegen/modules.h"
#include "compiler/pipeline/fault.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "kiln/v1/config.pb.h"
#include "server/auth.h"
#include "server/config.h"
#include "server/engine.h"
#include "server/listener.h"
#include "server/metrics.h"
#include "server/services.h"

ABSL_FLAG(std::string, listen, "",
          "address to listen on (default 127.0.0.1:50051; port 0 picks one)");
ABSL_FLAG(std::string, data_dir, "", "RocksDB directory (default $HOME/.local/share/kiln)");
ABSL_FLAG(std::string, config, "", "text-format kiln.v1.ServerConfig; flags override it");
ABSL_FLAG(bool, frozen, false, "serve only what is cached; compile nothing");
ABSL_FLAG(uint64_t, cache_byte_budget, 0,
          "artifact bytes kept before LRU eviction (default 8 GiB)");
ABSL_FLAG(uint32_t, cache_size_limit, 0, "variants per key (default 8)");
ABSL_FLAG(uint64_t, artifact_memory_bytes, 0,
          "bytes of verified artifacts kept in memory for hits (default 256 MiB)");
ABSL_FLAG(std::string, inject_fault, "",
          "testing only: KIND:TARGET, KIND compile_error, accuracy or runtime_error, TARGET an "
          "op (aten.relu.default): the kiln backend fails to compile graphs with it, computes "
          "a wrong value for it, or generates a plan that fails when it runs");
ABSL_FLAG(std::string, debug_function, "",
          "function filter: only graphs whose name matches this regular expression get the "
          "requested backend; the others get eager");
ABSL_FLAG(bool, minify_failures, false,
          "minify each failed compile in the background, one at a time; kilnctl failures and "
          "show point to the result");
ABSL_FLAG(bool, automatic_dynamic, true,
          "compile a static graph whose family differs from an earlier graph only in sizes "
          "with those sizes symbolic (off: --noautomatic_dynamic)");
ABSL_FLAG(uint64_t, max_message_bytes, 0, "largest request accepted (default 64 MiB)");
ABSL_FLAG(uint32_t, compile_workers, 0, "compile threads (default: cores)");
ABSL_FLAG(bool, sync_writes, false, "fsync every publish (survive power loss, not only crashes)");
ABSL_FLAG(std::string, request_log, "",
          "one JSON line per Compile and Lookup (request id, namespace, caller, status, time) "
          "appended to this file, '-' for stderr; empty: none");
ABSL_FLAG(std::string, log_level, "info",
          "the request log's level: warning (failed requests only), info (every request), "
          "debug (also the begin and end of each compile job's steps)");
ABSL_FLAG(std::string, audit_log, "-",
          "one JSON line per Freeze, Thaw and Evict, with the caller, appended to this file "
          "('-': stderr)");
ABSL_FLAG(std::string, signing_key_file, "",
          "PEM Ed25519 private key: every artifact sent carries kilnd's signature of its digest");
ABSL_FLAG(std::string, tokens_file, "",
          "bearer tokens, one per line: TOKEN ROLE NAMESPACES [NAME] (server/auth.h); empty: "
          "every caller is an admin");
ABSL_FLAG(std::string, tls_cert_file, "", "PEM certificate chain of the server (enables TLS)");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of the server");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CA certificates that client certificates must chain to (mutual TLS)");
ABSL_FLAG(bool, allow_insecure_remote, false,
          "listen beyond loopback without TLS and tokens (refused otherwise)");
ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus metrics at http://HOST:PORT/metrics (empty: off; port 0 picks one)");
ABSL_FLAG(int64_t, open_file_limit, 0,
          "open-file limit to run under (0: raise the soft limit to the hard one); connections "
          "beyond it less a reserve of 128 are closed on arrival");
ABSL_FLAG(int32_t, idle_connection_timeout_s, 300,
          "close a client connection with no call for this long (clients reconnect)");
ABSL_FLAG(std::string, nvrtc_helper, "",
          "the program that runs NVRTC for cuda targets (default: kiln_nvrtc beside kilnd)");
ABSL_FLAG(std::string, nvrtc_fast_compile, "",
          "NVRTC's --Ofast-compile level for cuda kernels: min, mid or max (shorter cold "
          "compiles, less optimized kernels); empty: full optimization. Artifacts compiled at "
          "any level are interchangeable (the level is not in the key)");
ABSL_FLAG(std::string, autotune, "auto",
          "cuda kernels' block sizes timed on this machine's GPU (compiler/codegen/cuda_tuner.h) "
          "for the requests that ask (mode=\"max-autotune\"): auto (when a GPU and its driver "
          "are here), on (refuse to start without them), always (tune every cuda compile), off "
          "(never; also where kilnd shares its GPU with jobs: tuning takes up to 4 GiB of its "
          "memory, and their work would disturb the timings)");
ABSL_FLAG(std::string, native_compiler, "g++",
          "the C++ compiler the kiln backend runs on generated code (a path, or a name in PATH)");
ABSL_FLAG(int32_t, compile_timeout_s, 120,
          "seconds one run of the native compiler (g++, or NVRTC for cuda) may take before it is "
          "killed");
ABSL_FLAG(
    int32_t, compile_jobs, 0,
    "native compiler processes (g++, NVRTC) kilnd runs at once, over every graph it compiles; "
    "a graph's kernels (each half's, for a training graph) are dealt into that many modules "
    "(0: the cores, at most 16)");
ABSL_FLAG(int32_t, kernel_cache_mb, 256,
          "MiB of compiled kernels kept in memory, by their code, for later graphs that have the "
          "same kernel (the forward of a training graph and its inference graph, a graph "
          "recompiled for new sizes): served without compiling again. 0 keeps none");
ABSL_FLAG(std::string, channels_last, "inference",
          "the graphs whose 16-bit 2-D convolutions run channels-last on cuda, the layout "
          "cuDNN's tensor-core kernels run in: inference (not training graphs), always or never. "
          "Artifacts compiled either way are interchangeable (the choice is not in the key)");
ABSL_FLAG(bool, warm_compilers, true,
          "as kilnd starts, start compile_jobs NVRTC helpers, each compiling a small kernel, and "
          "the autotuner's GPU context, so that the first cuda compiles do not pay their start-up");
ABSL_FLAG(bool, reflection, false, "serve gRPC server reflection (grpc_cli, grpcurl)");
ABSL_FLAG(bool, salvage_wal, false,
          "start on a corrupted or truncated write-ahead log, dropping the writes after the "
          "damage (refused otherwise)");

namespace kiln::server {
namespace {

absl::StatusOr<v1::ServerConfig> LoadConfig() {
  v1::ServerConfig config;
  const std::string path = absl::GetFlag(FLAGS_config);
  if (!path.empty()) {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrCat("config ", path, ": cannot be read"));
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<v1::ServerConfig> parsed = ParseConfig(text.str());
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config ", path, ": ", parsed.status().message()));
    }
    config = *std::move(parsed);
  }
  if (!absl::GetFlag(FLAGS_listen).empty()) config.set_listen(absl::GetFlag(FLAGS_listen));
  if (!absl::GetFlag(FLAGS_data_dir).empty()) config.set_data_dir(absl::GetFlag(FLAGS_data_dir));
  if (absl::GetFlag(FLAGS_frozen)) config.set_frozen(true);
  if (absl::GetFlag(FLAGS_sync_writes)) config.set_sync_writes(true);
  if (absl::GetFlag(FLAGS_salvage_wal)) config.set_salvage_wal(true);
  if (!absl::GetFlag(FLAGS_automatic_dynamic)) config.set_no_automatic_dynamic(true);
  if (absl::GetFlag(FLAGS_minify_failures)) config.set_minify_failures(true);
  if (absl::GetFlag(FLAGS_allow_insecure_remote)) config.set_allow_insecure_remote(true);
  if (absl::GetFlag(FLAGS_reflection)) config.set_reflection(true);
  auto set_string = [](const std::string& flag, std::string* field) {
    if (!flag.empty()) *field = flag;
  };
  set_string(absl::GetFlag(FLAGS_inject_fault), config.mutable_inject_fault());
  set_string(absl::GetFlag(FLAGS_debug_function), config.mutable_debug_function());
  set_string(absl::GetFlag(FLAGS_tls_cert_file), config.mutable_tls_cert_file());
  set_string(absl::GetFlag(FLAGS_tls_key_file), config.mutable_tls_key_file());
  set_string(absl::GetFlag(FLAGS_tls_client_ca_file), config.mutable_tls_client_ca_file());
  set_string(absl::GetFlag(FLAGS_tokens_file), config.mutable_tokens_file());
  set_string(absl::GetFlag(FLAGS_signing_key_file), config.mutable_signing_key_file());
  if (auto v = absl::GetFlag(FLAGS_cache_byte_budget)) config.set_cache_byte_budget(v);
  if (auto v = absl::GetFlag(FLAGS_artifact_memory_bytes)) config.set_artifact_memory_bytes(v);
  if (auto v = absl::GetFlag(FLAGS_cache_size_limit)) config.set_cache_size_limit(v);
  if (auto v = absl::GetFlag(FLAGS_max_message_bytes)) config.set_max_message_bytes(v);
  if (auto v = absl::GetFlag(FLAGS_compile_workers)) config.set_compile_workers(v);
  RETURN_IF_ERROR(FinishConfig(&config));
  return config;
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* flag) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  std::stringstream text;
  text << f.rdbuf();
  return text.str();
}

absl::Status Serve() {
  ASSIGN_OR_RETURN(v1::ServerConfig config, LoadConfig());

  // Every thread started from here on inherits the mask; this thread waits.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  cache::CacheOptions cache_options;
  cache_options.path = config.data_dir();
  cache_options.byte_budget = config.cache_byte_budget();
  cache_options.memory_bytes = config.artifact_memory_bytes();
  cache_options.sync_writes = config.sync_writes();
  cache_options.salvage_wal = config.salvage_wal();
  cache_options.max_artifact_format_version = kArtifactFormatVersion;
  std::error_code made;
  std::filesystem::create_directories(config.data_dir(), made);
  if (made) {
    return absl::FailedPreconditionError(
        absl::StrCat("data_dir: cannot create '", config.data_dir(), "': ", made.message()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<cache::Cache> cache, cache::Cache::Open(cache_options));
  ASSIGN_OR_RETURN(std::unique_ptr<cache::Stats> stats, cache::Stats::Load(cache.get()));

  EngineOptions engine_options;
  engine_options.frozen = config.frozen();
  engine_options.cache_size_limit = config.cache_size_limit();
  engine_options.automatic_dynamic = !config.no_automatic_dynamic();
  RETURN_IF_ERROR(pipeline::ParseFault(config.inject_fault()).status());
  engine_options.inject_fault = config.inject_fault();
  if (!config.debug_function().empty()) {
    RETURN_IF_ERROR(CompileFunctionFilter(config.debug_function()).status());
  }
  engine_options.debug_function = config.debug_function();
  engine_options.minify_failures = config.minify_failures();
  engine_options.compile_workers = static_cast<int>(config.compile_workers());
  engine_options.compile_queue_depth = static_cast<int>(config.compile_queue_depth());
  engine_options.graph_limits = GraphLimitsOf(config.limits());
  engine_options.expr_limits = ExprLimitsOf(config.limits());
  // Scratch files of native compiles live under the data directory, which
  // this kilnd alone holds (RocksDB's LOCK): what a crash left there is
  // removed now.
  BackendOptions backend_options;
  backend_options.scratch_dir = (std::filesystem::path(config.data_dir()) / "scratch").string();
  std::filesystem::remove_all(backend_options.scratch_dir, made);
  std::filesystem::create_directories(backend_options.scratch_dir, made);
  if (made) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot make the scratch directory ", backend_options.scratch_dir, ": ", made.message()));
  }
  const int32_t timeout_s = absl::GetFlag(FLAGS_compile_timeout_s);
  if (timeout_s <= 0) return absl::InvalidArgumentError("compile_timeout_s: must be positive");
  backend_options.native_compile_timeout = absl::Seconds(timeout_s);
  backend_options.native_compiler = absl::GetFlag(FLAGS_native_compiler);
  backend_options.nvrtc_helper = absl::GetFlag(FLAGS_nvrtc_helper);
  backend_options.nvrtc_fast_compile = absl::GetFlag(FLAGS_nvrtc_fast_compile);
  if (const std::string& level = backend_options.nvrtc_fast_compile;
      !level.empty() && level != "min" && level != "mid" && level != "max") {
    return absl::InvalidArgumentError(
        absl::StrCat("nvrtc_fast_compile: '", level.substr(0, 32), "' is not min, mid or max"));
  }
  ASSIGN_OR_RETURN(backend_options.channels_last,
                   pipeline::ParseChannelsLast(absl::GetFlag(FLAGS_channels_last)));
  const int32_t jobs = absl::GetFlag(FLAGS_compile_jobs);
  if (jobs < 0 || jobs > 64) return absl::InvalidArgumentError("compile_jobs: not in 0..64");
  backend_options.compile_jobs =
      jobs > 0 ? jobs : static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  backend_options.compile_slots =
      std::make_shared<codegen::CompileSlots>(backend_options.compile_jobs);
  const int32_t kernel_cache_mb = absl::GetFlag(FLAGS_kernel_cache_mb);
  if (kernel_cache_mb < 0 || kernel_cache_mb > (1 << 20)) {
    return absl::InvalidArgumentError("kernel_cache_mb: not in 0..1048576");
  }
  if (kernel_cache_mb > 0) {
    backend_options.kernel_cache =
        std::make_shared<codegen::KernelCache>(int64_t{kernel_cache_mb} << 20);
    engine_options.kernel_cache = backend_options.kernel_cache.get();
  }
  if (const std::string autotune = absl::GetFlag(FLAGS_autotune); autotune != "off") {
    if (autotune != "auto" && autotune != "on" && autotune != "always") {
      return absl::InvalidArgumentError(
          absl::StrCat("autotune: '", autotune.substr(0, 32), "' is not auto, on, always or off"));
    }
    backend_options.tune_every_compile = autotune == "always";
    absl::StatusOr<std::unique_ptr<codegen::CudaTuner>> tuner = codegen::CudaTuner::Open(0);
    if (tuner.ok()) {
      std::fprintf(stderr, "kilnd: autotuning cuda kernels on %s\n",
                   (*tuner)->device_name().c_str());
      backend_options.tuner = std::shared_ptr<codegen::CudaTuner>(*std::move(tuner));
    } else if (autotune != "auto") {
      return absl::FailedPreconditionError(
          absl::StrCat("autotune: ", autotune, ", but ", tuner.status().message()));
    }
  }
  if (absl::GetFlag(FLAGS_warm_compilers)) {
    // In the background: requests are served meanwhile. Where NVRTC or a GPU
    // is missing this does nothing but find it out.
    codegen::CudaOptions cuda;
    cuda.helper = backend_options.nvrtc_helper;
    cuda.fast_compile = backend_options.nvrtc_fast_compile;
    cuda.scratch_dir = backend_options.scratch_dir;
    cuda.timeout = backend_options.native_compile_timeout;
    // As many as compile at once (CompileSlots).
    std::thread([cuda, helpers = backend_options.compile_jobs, tuner = backend_options.tuner] {
      if (tuner != nullptr) tuner->Warm().IgnoreError();
      // (A tiered compile's quick artifact compiles no kernels,
      // server/backend.cc, so the quick level's helpers are not warmed.)
      codegen::WarmCudaCompiles(cuda, helpers);
    }).detach();
  }
  ASSIGN_OR_RETURN(const LogLevel log_level, ParseLogLevel(absl::GetFlag(FLAGS_log_level)));
  std::unique_ptr<RequestLog> requests, audit;
  if (const std::string path = absl::GetFlag(FLAGS_request_log); !path.empty()) {
    ASSIGN_OR_RETURN(requests, RequestLog::Open(path, log_level));
  }
  if (const std::string path = absl::GetFlag(FLAGS_audit_log); !path.empty()) {
    ASSIGN_OR_RETURN(audit, RequestLog::Open(path));
  }
  if (requests != nullptr && requests->debug()) engine_options.step_log = requests.get();
  auto engine = std::make_unique<Engine>(engine_options, cache.get(), stats.get(),
                                         BackendRegistry::Default(backend_options));

  Authorizer auth;
  if (const std::string& path = config.tokens_file(); !path.empty()) {
    ASSIGN_OR_RETURN(auth, Authorizer::FromFile(path));
  }
  const std::string& cert_file = config.tls_cert_file();
  const bool tls = !cert_file.empty();
  const std::string listen_host = config.listen().substr(0, config.listen().rfind(':'));
  const bool loopback = listen_host == "localhost" || absl::StartsWith(listen_host, "127.") ||
                        listen_host == "[::1]" || listen_host == "::1";
  if (!loopback && !(tls && auth.enabled()) && !config.allow_insecure_remote()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "listen: ", config.listen().substr(0, 200),
        " is beyond loopback, and TLS (--tls_cert_file, --tls_key_file) and tokens "
        "(--tokens_file) are not both configured: anyone who reaches the port could read "
        "and write every namespace. Configure both, or pass --allow_insecure_remote"));
  }
  std::unique_ptr<Signer> signer;
  if (const std::string& path = config.signing_key_file(); !path.empty()) {
    ASSIGN_OR_RETURN(std::string pem, ReadFile(path, "signing_key_file"));
    ASSIGN_OR_RETURN(signer, Signer::FromPem(pem));
  }
  CompilerService::Limits service_limits;
  service_limits.max_message_bytes = config.max_message_bytes();
  service_limits.max_waiting_compiles = static_cast<int>(config.limits().max_waiting_compiles());
  service_limits.max_compiles_per_tenant = config.limits().max_compiles_per_tenant();
  service_limits.max_queued_bytes_per_tenant =
      static_cast<int64_t>(config.limits().max_queued_bytes_per_tenant());
  service_limits.lookup_workers =
      static_cast<int>(std::max(4u, 2 * std::thread::hardware_concurrency()));
  service_limits.max_queued_lookups = static_cast<int>(config.limits().max_queued_lookups());
  auto compiler = std::make_unique<CompilerService>(engine.get(), service_limits, &auth,
                                                    requests.get(), signer.get());
  AdminService admin(engine.get(), &auth, audit.get());
  grpc::EnableDefaultHealthCheckService(true);
  if (config.reflection()) grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  // Plaintext connections come from kilnd's own accept loop
  // (server/listener.h), which survives running out of descriptors; gRPC
  // opens no port itself. TLS connections use gRPC's listener (its SSL
  // handshake), under the same raised open-file limit.
  if (const int64_t limit = absl::GetFlag(FLAGS_open_file_limit); limit > 0) {
    rlimit r{};
    getrlimit(RLIMIT_NOFILE, &r);
    r.rlim_cur = std::min<rlim_t>(static_cast<rlim_t>(limit), r.rlim_max);
    setrlimit(RLIMIT_NOFILE, &r);
  } else {
    RaiseOpenFileLimit();
  }
  grpc::ServerBuilder builder;
  std::unique_ptr<Listener> listener;
  int tls_port = 0;
  if (tls) {
    grpc::SslServerCredentialsOptions ssl;
    ASSIGN_OR_RETURN(std::string cert, ReadFile(cert_file, "tls_cert_file"));
    ASSIGN_OR_RETURN(std::string key, ReadFile(config.tls_key_file(), "tls_key_file"));
    ssl.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
    if (const std::string& ca = config.tls_client_ca_file(); !ca.empty()) {
      ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFile(ca, "tls_client_ca_file"));
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    builder.AddListeningPort(config.listen(), grpc::SslServerCredentials(ssl), &tls_port);
  } else {
    ASSIGN_OR_RETURN(listener, Listener::Bind(config.listen()));
  }
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<uint64_t>(2 * config.max_message_bytes(), std::numeric_limits<int>::max())));
  const int32_t idle_s = absl::GetFlag(FLAGS_idle_connection_timeout_s);
  if (idle_s <= 0) return absl::InvalidArgumentError("idle_connection_timeout_s: must be positive");
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, idle_s * 1000);
  // Keepalive pings find peers that vanished without closing.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 120 * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20 * 1000);
  builder.RegisterService(compiler.get());
  builder.RegisterService(&admin);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || (tls && tls_port == 0)) {
    return absl::UnavailableError(
        absl::StrCat("listen: cannot start the server on ", config.listen()));
  }
  if (listener != nullptr) listener->Start(server.get());
  const int port = listener != nullptr ? listener->port() : tls_port;
  auto metrics = std::make_shared<EngineMetrics>(engine.get());
  std::unique_ptr<prometheus::Exposer> exposer;
  if (const std::string at = absl::GetFlag(FLAGS_metrics_listen); !at.empty()) {
    ASSIGN_OR_RETURN(exposer, ServeMetrics(at, metrics));
    const std::vector<int> ports = exposer->GetListeningPorts();
    std::printf("kilnd metrics on %s:%d\n", at.substr(0, at.rfind(':')).c_str(),
                ports.empty() ? 0 : ports[0]);
  }
  const std::string host = config.listen().substr(0, config.listen().rfind(':'));
  std::printf("kilnd listening on %s:%d\n", host.c_str(), port);
  std::fflush(stdout);

  absl::Notification stop_flusher;
  std::thread flusher([&] {
    while (!stop_flusher.WaitForNotificationWithTimeout(
        absl::Milliseconds(config.stats_flush_millis()))) {
      if (auto s = cache->FlushUsage(); !s.ok())
        std::fprintf(stderr, "kilnd: %s\n", s.ToString().c_str());
      if (auto s = stats->Flush(); !s.ok())
        std::fprintf(stderr, "kilnd: %s\n", s.ToString().c_str());
    }
  });

  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "kilnd: signal %d, draining\n", sig);
  // Drain: compiles in flight finish (up to 30 s) before the server stops.
  // gRPC's own Shutdown would also wait out idle client connections until
  // its deadline, so the deadline is short once nothing is in flight.
  const absl::Time drain_deadline = absl::Now() + absl::Seconds(30);
  while (compiler->active() > 0 && absl::Now() < drain_deadline)
    absl::SleepFor(absl::Milliseconds(5));
  if (listener != nullptr) listener->Stop();
  exposer.reset();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  server->Wait();
  stop_flusher.Notify();
  flusher.join();
  // Compiles run on the service's threads: they finish before the engine
  // goes, and the statistics are written before the database closes.
  compiler.reset();
  engine.reset();
  stats.reset();
  cache.reset();
  std::fprintf(stderr, "kilnd: stopped cleanly\n");
  return absl::OkStatus();
}

}  // namespace
}  // namespace kiln::server

int main(int argc, char** argv) {
  kiln::UseFlagsDefinedIn("server/main.cc");
  absl::SetProgramUsageMessage(
      "kilnd --listen=ADDR --data_dir=DIR [--config=FILE] [--frozen]: the Kiln compile server");
  absl::ParseCommandLine(argc, argv);
  // Deadlock detection is a debugging aid; the server should not pay for it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::Status s = kiln::server::Serve();
  if (!s.ok()) {
    std::fprintf(stderr, "kilnd: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
