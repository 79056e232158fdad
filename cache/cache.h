// The guard-keyed artifact cache on RocksDB (docs/architecture.md §4, docs/cache.md).
//
// Records (one RocksDB instance, default column family):
//   "e/<namespace>/<key>"  StoredEntry: the variants of a key (guards, digest)
//                          and its recompile reasons
//   "a/<digest>"           artifact bytes; digest = hex SHA-256 of the bytes
//   "q/<digest>"           a quarantined (corrupt) blob, kept for inspection
//   "s/stats"              StoredStats: kilnd's statistics, kept for
//                          cache/stats.h (ReadStats, WriteStats)
//   "f/<namespace>/<id>"   StoredFamily: a shape family's latest graph
//                          (cache/shape_family.h)
//   "r/<namespace>/<id>"   FailedCompile: a failed compile request, for
//                          record and replay (the newest 32 per namespace)
//   "b/<namespace>/<job>"  JobGraphs: the graphs clients reported for a job
//                          and why each ended (graph breaks)
//
// A variant and its artifact are published in one WriteBatch, so a crash
// leaves either the old state or the new one. Artifacts are verified against
// their digest on every read; a corrupt one is moved to quarantine, its
// variants dropped (the next Compile rebuilds it) and never served. Eviction is LRU over variants
// by total artifact bytes; recency and hit counts live in memory and are written back by FlushUsage
// (periodically and on Close).
//
// The cache is storage only: it counts nothing. What it did on its own (the
// variants a publish evicted, the artifacts a read quarantined) it returns, for
// the caller to count (cache/stats.h).
//
// Thread-safe: lookups run concurrently; writers are serialized internally.
#ifndef KILN_CACHE_CACHE_H_
#define KILN_CACHE_CACHE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kiln/v1/artifact.pb.h"
#include "kiln/v1/store.pb.h"

namespace rocksdb {
class Cache;
class DB;
class WriteBatch;
}  // namespace rocksdb

namespace kiln::cache {

struct CacheOptions {
  std::string path;                   // RocksDB directory, created if missing
  uint64_t byte_budget = 8ull << 30;  // LRU eviction above this many artifact bytes
  bool sync_writes = false;           // fsync each publish (power-loss durability)
  // Open even a damaged write-ahead log, keeping what precedes the damage.
  // Off: a damaged log fails Open with DATA_LOSS naming this option.
  bool salvage_wal = false;
  // The newest Artifact.format_version served (kArtifactFormatVersion,
  // server/backend.h); a newer artifact is FAILED_PRECONDITION.
  uint32_t max_artifact_format_version = 1;
  // Artifacts verified once (their digest, their parse, their format), and
  // those published, are kept in memory, least recently read dropped
  // first, up to this many bytes; 0: none. A hit then reads none of
  // RocksDB, SHA-256 or the parse again.
  uint64_t memory_bytes = 256ull << 20;
};

struct LookupResult {
  v1::LookupOutcome outcome = v1::FULL_MISS;  // HIT, GUARD_MISS or FULL_MISS
  std::string digest;                         // on HIT
  std::vector<v1::VariantMiss> misses;        // on GUARD_MISS, one per variant
  int variants = 0;                           // variants held under the key
};

// An artifact read and checked: its bytes hash to its digest and parse as a
// v1::Artifact of a format this server serves. `artifact` is those bytes
// parsed, unless the reader asked for the bytes alone (`parsed` false).
struct VerifiedArtifact {
  std::string digest;
  std::string bytes;
  v1::Artifact artifact;
  bool parsed = true;
};

// What a probe asks: which variant of (ns, key) serves.
struct ProbeRequest {
  std::string ns;
  std::string key;
  // Without `guards`: the first variant (most recently used first) whose
  // guards admit `signature` serves. With `guards`: only a variant with
  // exactly these guards serves, and `signature`, when given, explains why
  // the others did not.
  std::optional<v1::InputSignature> signature;
  std::optional<v1::GuardSet> guards;
  // Read and verify the serving variant's artifact.
  bool read_artifact = true;
  // Parse it too (false: the bytes alone where they were verified before).
  bool parse_artifact = true;
};

// A probe's answer: a hit with its verified artifact, or the miss report.
struct ProbeResult {
  LookupResult lookup;  // outcome, digest on a hit; misses and variants
  // On a hit, when read_artifact was asked for.
  std::optional<VerifiedArtifact> artifact;
  // Why the artifacts of serving variants could not be served (DATA_LOSS:
  // corrupt, or not parsing), in the order found; after each the probe ran
  // once more. Two of them leave a miss.
  std::vector<absl::Status> unreadable;
  // How many of those were corrupt: quarantined, their variants dropped.
  int quarantined = 0;
};

struct Published {
  std::string digest;
  uint64_t evicted_variants = 0;  // dropped to keep to the byte budget
};

struct PublishRequest {
  std::string ns;
  std::string key;
  std::string graph_name;
  std::string backend;
  v1::GuardSet guards;
  std::string artifact;                           // serialized v1::Artifact
  std::vector<v1::VariantMiss> recompile_misses;  // why earlier variants did not serve
  std::string automatic_dynamic;                  // RecompileReason.automatic_dynamic
  std::string client_reason;                      // RecompileReason.client_reason
  // Also written in the publishing batch when `family` is set.
  std::string family;
  v1::StoredFamily family_record;
};

class Cache {
 public:
  static absl::StatusOr<std::unique_ptr<Cache>> Open(const CacheOptions& options);
  ~Cache();  // flushes usage (FlushUsage), closes RocksDB

  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  // The one call that finds what serves a request: evaluates the variants
  // of (ns, key) (see ProbeRequest), and on a hit reads and verifies the
  // artifact. A hit whose artifact cannot be served (corrupt: quarantined)
  // makes the probe run once more (see ProbeResult). A hit updates the variant's recency and
  // hit count. Malformed stored guards are INTERNAL; a record that cannot be
  // read, or an artifact of a newer format, is the error.
  absl::StatusOr<ProbeResult> Probe(const ProbeRequest& request);

  // Evaluates the variants of (ns, key) against `signature`, most recently
  // used first, without reading an artifact: Probe with read_artifact off.
  absl::StatusOr<LookupResult> Lookup(const std::string& ns, const std::string& key,
                                      const v1::InputSignature& signature);

  // Counts a hit on a variant found by other means than a probe of its own
  // key (a shape family's variant): recency and hit count.
  void RecordHit(const std::string& ns, const std::string& key, const std::string& digest);

  // The stored entry, or NOT_FOUND.
  absl::StatusOr<v1::StoredEntry> GetEntry(const std::string& ns, const std::string& key);

  // Artifact bytes, verified against `digest`. A mismatch is DATA_LOSS: the
  // blob is quarantined and every variant naming it is dropped.
  absl::StatusOr<std::string> ReadArtifact(const std::string& digest);
  // ReadArtifact, then parsed: bytes that do not parse are DATA_LOSS too
  // (not quarantined), a newer format FAILED_PRECONDITION. `*quarantined`
  // (when given) tells whether the blob was found corrupt and quarantined.
  // An artifact verified before comes from memory (CacheOptions::
  // memory_bytes), parsed only when `parse`.
  absl::StatusOr<VerifiedArtifact> ReadVerifiedArtifact(const std::string& digest,
                                                        bool* quarantined = nullptr,
                                                        bool parse = true);

  // Stores the artifact and a new variant at the front of the key's list in
  // one WriteBatch. Then evicts down to the byte budget.
  absl::StatusOr<Published> Publish(const PublishRequest& request);

  // The shape family's record, or NOT_FOUND. A record that does not unseal
  // is DATA_LOSS.
  absl::StatusOr<v1::StoredFamily> GetFamily(const std::string& ns, const std::string& family);

  // Record and replay: keeps `failure` (its namespace and id set; ids are
  // the time in 16 hex digits, so that their order is their age) under
  // "r/<ns>/<id>", then drops the namespace's oldest records beyond
  // kMaxFailuresPerNamespace and the oldest of all beyond kMaxFailures (a
  // record holds at most 4 MiB of request: at most 1 GiB in all).
  static constexpr int kMaxFailuresPerNamespace = 32;
  static constexpr size_t kMaxFailures = 256;
  absl::Status RecordFailure(const v1::FailedCompile& failure);
  // The records of `ns` (of every namespace for "*"), newest first.
  absl::StatusOr<std::vector<v1::FailedCompile>> ListFailures(const std::string& ns);
  // One record, or NOT_FOUND.
  absl::StatusOr<v1::FailedCompile> GetFailure(const std::string& ns, const std::string& id);

  // Graph-break reports: merges `report` into its job's record, in memory
  // (written back by FlushUsage). A job holds at most kMaxGraphsPerJob
  // graphs; reports of further graphs are dropped.
  static constexpr int kMaxGraphsPerJob = 256;
  static constexpr size_t kMaxJobRecords = 128;  // per kilnd run, every namespace
  absl::Status RecordGraph(const std::string& ns, const v1::GraphReport& report);
  // The records of `ns` ("*": every namespace), of `job` or of every job.
  absl::StatusOr<std::vector<v1::JobGraphs>> ListJobGraphs(const std::string& ns,
                                                           const std::string& job);

  // Drops every variant of (ns, key). Returns (variants, bytes freed).
  absl::StatusOr<std::pair<uint64_t, uint64_t>> Evict(const std::string& ns,
                                                      const std::string& key);

  struct EntrySummary {
    std::string ns;
    std::string key;
    v1::StoredEntry entry;
  };
  // Every entry of `ns`, or of every namespace when ns == "*", by key.
  absl::StatusOr<std::vector<EntrySummary>> List(const std::string& ns);

  // The "s/stats" record (cache/stats.h): an empty one when none is stored;
  // DATA_LOSS when it does not unseal.
  absl::StatusOr<v1::StoredStats> ReadStats();
  absl::Status WriteStats(const v1::StoredStats& stats);

  // What the index holds.
  struct Totals {
    uint64_t entries = 0;
    uint64_t variants = 0;
    uint64_t bytes = 0;
  };
  Totals totals() const;
  uint64_t byte_budget() const { return options_.byte_budget; }

  // Writes recency, hit counts and graph-break reports back to RocksDB.
  absl::Status FlushUsage();

 private:
  struct VariantUse {
    int64_t last_used = 0;
    uint64_t hits = 0;
    bool dirty = false;
  };
  struct IndexedVariant {
    std::string digest;
    uint64_t bytes = 0;
  };

  Cache(CacheOptions options, std::unique_ptr<rocksdb::DB> db);
  absl::Status LoadIndex();
  // Keeps the bytes of verified artifact `digest` in memory (verified_).
  void Remember(const std::string& digest, const std::string& bytes);
  // Returns the variants evicted.
  absl::StatusOr<uint64_t> EvictToBudget() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Drops the variants naming `digest` (every variant when empty) from each
  // entry, and artifacts no variant names any more, in one write of `batch`
  // (which may already hold other updates).
  absl::Status DropVariants(const std::vector<std::string>& entry_keys, const std::string& digest,
                            rocksdb::WriteBatch* batch, uint64_t* freed_variants,
                            uint64_t* freed_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  void Touch(const std::string& entry_key, const std::string& digest);
  absl::Status Quarantine(const std::string& digest, const std::string& bytes);
  void ApplyUsage(const std::string& entry_key, v1::StoredEntry* entry) const;

  const CacheOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
  // Verified artifacts' bytes by digest (CacheOptions::memory_bytes), or
  // null. Thread-safe.
  std::shared_ptr<rocksdb::Cache> verified_;

  // Serializes read-modify-write of entries and artifacts.
  absl::Mutex write_mu_;

  mutable absl::Mutex index_mu_ ABSL_ACQUIRED_AFTER(write_mu_);
  // entry key ("e/ns/key") -> its variants' digests and sizes.
  absl::flat_hash_map<std::string, std::vector<IndexedVariant>> entries_ ABSL_GUARDED_BY(index_mu_);
  // (entry key + "\n" + digest) -> recency and hits.
  absl::flat_hash_map<std::string, VariantUse> usage_ ABSL_GUARDED_BY(index_mu_);
  absl::flat_hash_map<std::string, int> refcount_ ABSL_GUARDED_BY(index_mu_);  // by digest
  absl::flat_hash_map<std::string, uint64_t> blob_bytes_ ABSL_GUARDED_BY(index_mu_);
  uint64_t total_bytes_ ABSL_GUARDED_BY(index_mu_) = 0;
  uint64_t total_variants_ ABSL_GUARDED_BY(index_mu_) = 0;

  // Graph-break records read or changed since the start, by record key;
  // `dirty` ones are written by FlushUsage.
  struct JobRecord {
    v1::JobGraphs graphs;
    bool dirty = false;
  };
  absl::Mutex jobs_mu_ ABSL_ACQUIRED_AFTER(write_mu_);
  absl::flat_hash_map<std::string, JobRecord> jobs_ ABSL_GUARDED_BY(jobs_mu_);
};

// "e/<ns>/<key>"
std::string EntryKey(const std::string& ns, const std::string& key);
// "a/<digest>"
std::string ArtifactKey(const std::string& digest);
// "f/<ns>/<family>"
std::string FamilyKey(const std::string& ns, const std::string& family);

// Namespaces are [A-Za-z0-9_.-]{0,64}; "" is the default.
absl::Status ValidateNamespace(const std::string& ns);

}  // namespace kiln::cache

#endif  // KILN_CACHE_CACHE_H_
