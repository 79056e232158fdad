// kilnd's statistics (docs/cache.md §7): lookup and compile outcomes,
// compiles, single-flight joins, the function filter, corrupt artifacts,
// evictions, and per-phase compile-time histograms.
//
// They are counted in memory and persisted as the cache's "s/stats" record
// (v1::StoredStats, the same record and format as before they had a class of
// their own): Load reads it, Flush writes it back (kilnd flushes
// periodically, after every publish, and on close). The store only keeps the
// record; what it means is this class's.
//
// Thread-safe: every method may be called concurrently.
#ifndef KILN_CACHE_STATS_H_
#define KILN_CACHE_STATS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cache/cache.h"
#include "kiln/v1/store.pb.h"

namespace kiln::cache {

class Stats {
 public:
  // The statistics `store` holds (zeros when it holds none); DATA_LOSS when
  // its record does not unseal. `store` must outlive the Stats.
  static absl::StatusOr<std::unique_ptr<Stats>> Load(Cache* store);
  ~Stats();  // flushes

  Stats(const Stats&) = delete;
  Stats& operator=(const Stats&) = delete;

  // One lookup or compile outcome (HIT, GUARD_MISS, ..., BYPASS).
  void Count(v1::LookupOutcome outcome);
  // One backend run, successful or not.
  void CountCompile(bool ok);
  void CountSingleFlightJoin();
  // An artifact compiled at a backend's quick level (quick_first).
  void CountQuickCompile();
  // A compile under a function filter: its graph name matched, or the
  // filter sent it to the eager backend.
  void CountFunctionFilter(bool matched);
  void CountCorruptArtifacts(uint64_t artifacts);
  void CountEvictions(uint64_t variants);
  // One compile phase's time, into the phase's histogram.
  void RecordPhase(const std::string& phase, int64_t micros);

  // What has been counted, as stored.
  v1::StoredStats record() const;

  // Writes the record to the store.
  absl::Status Flush();

 private:
  Stats(Cache* store, v1::StoredStats record) : store_(store), record_(std::move(record)) {}

  Cache* const store_;
  // Held while a flush takes the record and writes it: the record written
  // last is the newest.
  absl::Mutex flush_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  v1::StoredStats record_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kiln::cache

#endif  // KILN_CACHE_STATS_H_
