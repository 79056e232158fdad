// Tiered compiles (CompileRequest.quick_first): the caller gets an artifact
// compiled at the backend's quick level while the optimized one compiles in
// the background, as the flight that the caller's next request joins.
#include <algorithm>
#include <memory>
#include <utility>

#include "server/engine.h"

namespace kiln::server {

absl::StatusOr<v1::CompileResponse> Engine::CompileMissTiered(Job job, Caller* caller,
                                                              bool quick_first) {
  if (!quick_first) return CompileMiss(std::move(job), caller);
  const absl::StatusOr<const Backend*> backend = backends_.Find(job.options.backend());
  if (!backend.ok() || !(*backend)->has_quick_level()) return CompileMiss(std::move(job), caller);
  Job quick{job.ns, job.graph, job.guards, job.options, job.key, job.outcome, {}, job.times};
  quick.quick = true;
  // Identical requests that arrive while the quick compile runs join it (a
  // thousand ranks asking at once make one of each); later ones join the
  // optimized compile. With the background queue full, or the namespace's
  // share of it taken, the request compiles optimized, as without
  // quick_first.
  if (!CompileInBackground(job)) {
    bool quick_running = false;
    {
      absl::MutexLock l(&flights_mu_);
      auto it = flights_.find(FlightKey(quick));
      quick_running = it != flights_.end() && !it->second->cancel.load();
    }
    if (!quick_running) return CompileMiss(std::move(job), caller);
  }
  return CompileMiss(std::move(quick), caller);
}

bool Engine::CompileInBackground(const Job& job) {
  if (stopping_) return false;
  {
    absl::MutexLock l(&flights_mu_);
    auto it = flights_.find(FlightKey(job));
    if (it != flights_.end() && !it->second->cancel.load()) return false;
  }
  // A background compile outlives its request, and so the request's hold
  // on its tenant's share (server/tenant_limits.h): a namespace gets at most
  // half the compile workers for them, and its other misses compile in
  // their requests.
  {
    absl::MutexLock l(&background_mu_);
    int& mine = background_per_namespace_[job.ns];
    if (mine >= std::max(1, options_.compile_workers / 2)) return false;
    ++mine;
  }
  auto release = [this, ns = job.ns] {
    absl::MutexLock l(&background_mu_);
    if (--background_per_namespace_[ns] == 0) background_per_namespace_.erase(ns);
  };
  // The job refers to the caller's frame, which returns before the thread
  // is done: the thread gets copies.
  struct Owned {
    std::string ns;
    ir::Graph graph;
    v1::GuardSet guards;
    v1::CompileOptions options;
    std::string key;
    v1::LookupOutcome outcome;
    MissRecord record;
    PhaseTimes times;
  };
  auto owned = std::make_shared<Owned>(Owned{job.ns, job.graph, job.guards, job.options, job.key,
                                             job.outcome, job.record, job.times});
  const absl::Status queued = background_->Submit([this, owned, release] {
    Caller caller;
    bool stopping = false;
    {
      absl::MutexLock l(&background_mu_);
      stopping = stopping_;
      if (!stopping) background_callers_.insert(&caller);
    }
    if (!stopping) {
      Job copy{owned->ns,
               owned->graph,
               owned->guards,
               owned->options,
               owned->key,
               owned->outcome,
               std::move(owned->record),
               std::move(owned->times)};
      // Its result reaches the callers that joined the flight, and the cache.
      (void)CompileMiss(std::move(copy), &caller);
      absl::MutexLock l(&background_mu_);
      background_callers_.erase(&caller);
    }
    release();
  });
  if (!queued.ok()) release();
  return queued.ok();
}

}  // namespace kiln::server
