#include "cache/stats.h"

#include <algorithm>
#include <vector>

#include "common/status_macros.h"

namespace kiln::cache {
namespace {

// Histogram bounds for compile phases, in microseconds.
const std::vector<double>& PhaseBounds() {
  static const auto* b =
      new std::vector<double>{10, 50, 100, 500, 1e3, 5e3, 1e4, 5e4, 1e5, 5e5, 1e6, 5e6, 1e7, 6e7};
  return *b;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Stats>> Stats::Load(Cache* store) {
  ASSIGN_OR_RETURN(v1::StoredStats record, store->ReadStats());
  return std::unique_ptr<Stats>(new Stats(store, std::move(record)));
}

Stats::~Stats() { (void)Flush(); }

void Stats::Count(v1::LookupOutcome outcome) {
  absl::MutexLock l(&mu_);
  auto* c = record_.mutable_counters();
  switch (outcome) {
    case v1::HIT:
      c->set_hits(c->hits() + 1);
      break;
    case v1::GUARD_MISS:
      c->set_guard_misses(c->guard_misses() + 1);
      break;
    case v1::FULL_MISS:
      c->set_full_misses(c->full_misses() + 1);
      break;
    case v1::FROZEN_MISS:
      c->set_frozen_misses(c->frozen_misses() + 1);
      break;
    case v1::CACHE_LIMIT:
      c->set_cache_limit_hits(c->cache_limit_hits() + 1);
      break;
    case v1::BYPASS:
      c->set_bypasses(c->bypasses() + 1);
      break;
    default:
      break;
  }
}

void Stats::CountCompile(bool ok) {
  absl::MutexLock l(&mu_);
  auto* c = record_.mutable_counters();
  if (ok) {
    c->set_compiles(c->compiles() + 1);
  } else {
    c->set_compile_errors(c->compile_errors() + 1);
  }
}

void Stats::CountSingleFlightJoin() {
  absl::MutexLock l(&mu_);
  auto* c = record_.mutable_counters();
  c->set_single_flight_joins(c->single_flight_joins() + 1);
}

void Stats::CountQuickCompile() {
  absl::MutexLock l(&mu_);
  auto* c = record_.mutable_counters();
  c->set_quick_compiles(c->quick_compiles() + 1);
}

void Stats::CountFunctionFilter(bool matched) {
  absl::MutexLock l(&mu_);
  auto* c = record_.mutable_counters();
  if (matched) {
    c->set_function_filter_matched(c->function_filter_matched() + 1);
  } else {
    c->set_function_filter_eager(c->function_filter_eager() + 1);
  }
}

void Stats::CountCorruptArtifacts(uint64_t artifacts) {
  absl::MutexLock l(&mu_);
  auto* c = record_.mutable_counters();
  c->set_corrupt_artifacts(c->corrupt_artifacts() + artifacts);
}

void Stats::CountEvictions(uint64_t variants) {
  absl::MutexLock l(&mu_);
  auto* c = record_.mutable_counters();
  c->set_evictions(c->evictions() + variants);
}

void Stats::RecordPhase(const std::string& phase, int64_t micros) {
  absl::MutexLock l(&mu_);
  v1::PhaseStats* p = nullptr;
  for (auto& ps : *record_.mutable_phases()) {
    if (ps.phase() == phase) p = &ps;
  }
  if (p == nullptr) {
    p = record_.add_phases();
    p->set_phase(phase);
    for (double b : PhaseBounds()) p->mutable_histogram()->add_bounds(b);
    for (size_t i = 0; i <= PhaseBounds().size(); ++i) p->mutable_histogram()->add_counts(0);
  }
  p->set_total_micros(p->total_micros() + micros);
  v1::Histogram* h = p->mutable_histogram();
  size_t bucket =
      std::upper_bound(PhaseBounds().begin(), PhaseBounds().end(), static_cast<double>(micros)) -
      PhaseBounds().begin();
  // A value equal to a bound belongs to that bound's bucket.
  if (bucket > 0 && PhaseBounds()[bucket - 1] == static_cast<double>(micros)) --bucket;
  h->set_counts(static_cast<int>(bucket), h->counts(static_cast<int>(bucket)) + 1);
  h->set_count(h->count() + 1);
  h->set_sum(h->sum() + static_cast<double>(micros));
}

v1::StoredStats Stats::record() const {
  absl::MutexLock l(&mu_);
  return record_;
}

absl::Status Stats::Flush() {
  absl::MutexLock l(&flush_mu_);
  return store_->WriteStats(record());
}

}  // namespace kiln::cache
