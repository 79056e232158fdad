// What kilnd does for each RPC, without gRPC types: the services in
// services.cc validate, call the Engine and map its status to the wire.
//
// Compile, top to bottom on the caller's thread: verify -> key -> probe the
// cache (cache::Cache::Probe: a verified artifact, or the recompile reasons)
// -> frozen? (FAILED_PRECONDITION with the reasons) -> over cache_size_limit?
// (RESOURCE_EXHAUSTED with the recompile reasons) -> single-flight by
// (namespace, key, guards): the first caller compiles, identical ones wait
// for it -> a compile slot (server/compile_slots.h) -> backend (the compile
// pipeline) -> publish -> reply. Lookup never compiles. Outcomes, compiles
// and phase times are counted in cache::Stats.
//
// Tiered compiles (CompileRequest.quick_first): on a miss, the optimized
// compile leaves for a background thread as the flight that identical
// requests join, and the caller's own thread builds the backend's quick
// artifact (server/backend.h; for `kiln`, the graph for ATen) for the reply,
// which is never cached and takes no compile worker.
//
// Thread-safe: every method may be called concurrently.
#ifndef KILN_SERVER_ENGINE_H_
#define KILN_SERVER_ENGINE_H_

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cache/cache.h"
#include "cache/guards.h"
#include "cache/shape_family.h"
#include "cache/stats.h"
#include "compiler/ir/limits.h"
#include "kiln/v1/service.pb.h"
#include "server/backend.h"
#include "server/compile_slots.h"
#include "server/request_log.h"
#include "server/worker_pool.h"

namespace re2 {
class RE2;
}  // namespace re2

namespace kiln::server {

// Where kilnd compiles the candidates of its background minifications:
// failures there are neither kept nor minified.
inline constexpr char kMinifyNamespace[] = "kiln.minify";

// The function filter's pattern (debug_function), compiled with bounded
// memory; INVALID_ARGUMENT for a malformed or over-long one.
absl::StatusOr<std::shared_ptr<const re2::RE2>> CompileFunctionFilter(const std::string& pattern);

struct EngineOptions {
  bool frozen = false;
  // Shape families (cache/shape_family.h): a static graph that differs from
  // an earlier one of its family only in sizes is compiled with those
  // dimensions symbolic, and later graphs of the family that are instances of
  // a symbolic one are served by its artifact without compiling.
  bool automatic_dynamic = true;
  // Defaults of the request options of the same names (server/backend.h):
  // a request without one gets the server's, which then enters the key.
  std::string inject_fault;
  std::string debug_function;
  // At debug level, the begin and end of each compile job's steps; may be
  // null. Must outlive the Engine.
  RequestLog* step_log = nullptr;
  // Minify failed compiles in the background (client/minify.h), one at a
  // time, compiling the candidates here in namespace kMinifyNamespace.
  bool minify_failures = false;
  uint32_t cache_size_limit = 8;
  // What one graph, and one guard expression, may hold (ServerConfig.limits).
  ir::GraphLimits graph_limits;
  cache::ExprLimits expr_limits;
  int compile_workers = 2;
  int compile_queue_depth = 64;
  // The backends' compiled kernels, reported by Stats; may be null. Must
  // outlive the Engine.
  const codegen::KernelCache* kernel_cache = nullptr;
};

// The client of one Compile, as far as the Engine needs it: whether it still
// waits for the reply. The service marks it gone when gRPC reports the call
// cancelled (its deadline passed, it went away). Thread-safe.
class Caller {
 public:
  // Marks the caller gone and runs the hook set by OnGone, once.
  void MarkGone();
  bool gone() const;
  // Sets what runs when the caller goes (at once if it has gone); an empty
  // hook clears it. The hook runs under the caller's lock: it must be short.
  void OnGone(std::function<void()> hook);

 private:
  mutable absl::Mutex mu_;
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> hook_ ABSL_GUARDED_BY(mu_);
};

class Engine {
 public:
  // `cache` and `stats` must outlive the Engine.
  Engine(const EngineOptions& options, cache::Cache* cache, cache::Stats* stats,
         BackendRegistry backends);
  ~Engine();  // waits for a background minification

  // Runs on the caller's thread, compiles included. A compile whose callers
  // are all gone stops (CANCELLED): its native compiler is killed. `caller`
  // may be null (nobody leaves); it must outlive the call.
  // A compile that fails (bad input, a failed native compile; not one
  // refused by a limit, frozen or cancelled) is recorded for replay.
  absl::StatusOr<v1::CompileResponse> Compile(const v1::CompileRequest& request,
                                              Caller* caller = nullptr);
  // A lookup's answer: on a hit with include_artifact, the artifact is
  // `artifact`, its stored (verified) bytes, which the reply carries as
  // `response`'s artifact field: they are never parsed again to be sent.
  struct LookupReply {
    v1::LookupResponse response;
    std::string artifact;
  };
  absl::StatusOr<LookupReply> Lookup(const v1::LookupRequest& request);
  // With `scoped`, the artifact must be named by a variant of the request's
  // namespace (NOT_FOUND otherwise, as for an unknown digest).
  absl::StatusOr<v1::GetArtifactResponse> GetArtifact(const v1::GetArtifactRequest& request,
                                                      bool scoped = false);

  v1::StatsResponse Stats() const;
  void SetFrozen(bool frozen) { frozen_ = frozen; }
  bool frozen() const { return frozen_; }
  absl::StatusOr<v1::ListEntriesResponse> ListEntries(const v1::ListEntriesRequest& request);
  absl::StatusOr<v1::GetEntryResponse> GetEntry(const v1::GetEntryRequest& request);
  absl::StatusOr<v1::EvictResponse> Evict(const v1::EvictRequest& request);
  absl::StatusOr<v1::ListFailuresResponse> ListFailures(const v1::ListFailuresRequest& request);
  absl::StatusOr<v1::GetFailureResponse> GetFailure(const v1::GetFailureRequest& request);
  absl::StatusOr<v1::GraphBreaksResponse> GraphBreaks(const v1::GraphBreaksRequest& request);

 private:
  // One compile in progress; identical requests wait on it.
  struct Flight {
    absl::Notification done;
    absl::StatusOr<v1::CompileResponse> result;
    std::atomic<int> waiters{0};      // callers still waiting
    std::atomic<bool> cancel{false};  // set when the last one leaves
    // One caller stopped waiting; the last one cancels the compile.
    void Leave() {
      if (--waiters == 0) cancel = true;
    }
  };

  // Compile, but failures are the caller's to record; `*compiling` says
  // whether the request got as far as a compile (which records its own).
  absl::StatusOr<v1::CompileResponse> CompileUnrecorded(const v1::CompileRequest& request,
                                                        Caller* caller, bool* compiling);
  // Adds a client's graph report, trimmed to its limits, to its job.
  void RecordReport(const std::string& ns, const v1::GraphReport& report);
  // Keeps a failed request for replay (cache::Cache::RecordFailure).
  void PersistFailure(const v1::CompileRequest& request, const std::string& key,
                      const absl::Status& error, const std::map<std::string, std::string>* trace);
  std::atomic<int64_t> last_failure_id_{0};
  // Starts minifying failure `f` (its namespace and id) unless a
  // minification is running; the result is written into its record.
  void MinifyInBackground(const v1::FailedCompile& f);
  absl::Mutex minify_mu_;
  std::thread minifier_ ABSL_GUARDED_BY(minify_mu_);
  bool minifying_ ABSL_GUARDED_BY(minify_mu_) = false;
  std::atomic<bool> stopping_{false};

  // What a compile records besides its artifact.
  struct MissRecord {
    std::vector<v1::VariantMiss> misses;  // the recompile reasons
    std::string automatic_dynamic;        // the dimensions made symbolic
    std::string client_reason;
    std::string family;  // the shape family to point at the new variant, if any
    v1::StoredFamily family_record;
    // A static graph's own key and guards, published to the same artifact
    // when a generalization of it was compiled; empty otherwise.
    std::string alias_key;
    v1::GuardSet alias_guards;
  };
  // What a miss compiles, and how. The references are to the caller's
  // frame: the job runs on the caller's thread, within the call.
  struct Job {
    const std::string& ns;
    const ir::Graph& graph;
    const v1::GuardSet& guards;
    const v1::CompileOptions& options;
    const std::string& key;
    v1::LookupOutcome outcome;  // FULL_MISS, GUARD_MISS or BYPASS
    MissRecord record;
    PhaseTimes times;
    // At the backend's quick level: neither probed nor published, and its
    // failures are left for the optimized compile to record.
    bool quick = false;
  };
  // The single flight's key of a job.
  static std::string FlightKey(const Job& job);
  // Single flight: the first caller of a (namespace, key, guards) runs the
  // job, the others wait for its result.
  absl::StatusOr<v1::CompileResponse> CompileMiss(Job job, Caller* caller);
  // The job, on the leader's thread: once it holds a compile slot (a quick
  // job holds none), the backend compiles and the artifact is published.
  absl::StatusOr<v1::CompileResponse> RunJob(Job& job, Flight& flight);
  // A miss's job as the request asks (server/engine_tiers.cc). Without
  // quick_first, or when the backend has no quick level: CompileMiss.
  // Otherwise the optimized compile is started in the background and the
  // caller gets the quick one; when the optimized one was running already
  // (or the background queue is full), the caller joins the quick compile
  // in flight, or else waits for the optimized one.
  absl::StatusOr<v1::CompileResponse> CompileMissTiered(Job job, Caller* caller, bool quick_first);
  // Queues `job`'s optimized compile as a flight's leader on a background
  // thread, with copies of what it refers to; false when a flight for it is
  // running, its namespace has half the compile workers' worth of
  // background compiles already, or the queue is full.
  bool CompileInBackground(const Job& job);

  // Checks the request's backend options and adds the server's defaults.
  // Under a function filter, a graph whose name it does not match gets the
  // eager backend; returns whether a filter applied and matched.
  enum class Filter { kNone, kMatched, kEager };
  absl::StatusOr<Filter> ApplyRequestOptions(const ir::Graph& graph,
                                             v1::CompileOptions* options) const;

  // The graph's shape family and its record, when automatic dynamic is on.
  struct Family {
    std::string id;        // empty: no family (off, or the graph is too large)
    v1::Graph positional;  // the graph in positional form
    bool positional_static = false;
    std::optional<v1::StoredFamily> record;
    bool record_static = false;
  };
  Family FindFamily(const std::string& ns, const ir::Graph& graph,
                    const v1::CompileOptions& options);
  // Publishes the flight's result to its callers and forgets it.
  void FinishFlight(const std::shared_ptr<Flight>& flight, const std::string& flight_key);
  // The flight's result, or CANCELLED once the caller is gone.
  absl::StatusOr<v1::CompileResponse> AwaitFlight(const std::shared_ptr<Flight>& flight,
                                                  Caller* caller);
  // A verified artifact by digest; a corrupt one is counted.
  absl::StatusOr<cache::VerifiedArtifact> ReadArtifact(const std::string& digest);

  const EngineOptions options_;
  cache::Cache* const cache_;
  cache::Stats* const stats_;
  const BackendRegistry backends_;
  std::atomic<bool> frozen_;
  std::atomic<int> in_flight_{0};

  // The newest failed compile of each key (bounded), for `kilnctl trace`.
  void RecordFailure(const std::string& ns, const std::string& key, const absl::Status& error,
                     const std::map<std::string, std::string>& trace);
  absl::Mutex failures_mu_;
  std::map<std::string, v1::FailedCompile> failures_ ABSL_GUARDED_BY(failures_mu_);
  std::deque<std::string> failure_order_ ABSL_GUARDED_BY(failures_mu_);

  // The keys of graphs looked up by graph, by the SHA-256 of the graph's
  // and options' bytes: a graph sent again (every process of a job sends
  // its graphs) is verified and keyed once. At most kRememberedKeys, the
  // oldest dropped first.
  static constexpr size_t kRememberedKeys = 4096;
  absl::Mutex keys_mu_;
  absl::flat_hash_map<std::string, std::string> keys_ ABSL_GUARDED_BY(keys_mu_);
  std::deque<std::string> key_order_ ABSL_GUARDED_BY(keys_mu_);

  absl::Mutex flights_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Flight>> flights_ ABSL_GUARDED_BY(flights_mu_);

  CompileSlots slots_;

  // The callers of the background compiles running now: the destructor
  // marks them gone, which cancels the compiles nobody else waits for.
  absl::Mutex background_mu_;
  absl::flat_hash_set<Caller*> background_callers_ ABSL_GUARDED_BY(background_mu_);
  // Background compiles queued or running, by namespace.
  absl::flat_hash_map<std::string, int> background_per_namespace_ ABSL_GUARDED_BY(background_mu_);
  // Declared last, so destroyed first: its threads are joined while what
  // they use is alive.
  std::unique_ptr<WorkerPool> background_;
};

}  // namespace kiln::server

#endif  // KILN_SERVER_ENGINE_H_
