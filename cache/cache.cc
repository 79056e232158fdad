#include "cache/cache.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cache/guards.h"
#include "cache/records.h"
#include "common/hashing.h"
#include "common/status_macros.h"
#include "compiler/ir/canonical.h"
#include "google/protobuf/message.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/iterator.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"

namespace kiln::cache {
namespace internal {

// The one place rocksdb::Status becomes absl::Status.
absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  if (s.IsNotFound()) return absl::NotFoundError(absl::StrCat(what, ": not found"));
  if (s.IsCorruption()) return absl::DataLossError(absl::StrCat(what, ": ", s.ToString()));
  return absl::InternalError(absl::StrCat(what, ": ", s.ToString()));
}

int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

// Every record but the artifacts (which are stored by their own SHA-256 and
// checked against it) is sealed: its bytes, their SHA-256 (64 hex digits) and
// a marker. Reading one checks the digest first.
constexpr absl::string_view kSealMarker = "\nkiln-sealed-sha256";
constexpr size_t kDigestHex = 64;

std::string Seal(const google::protobuf::Message& m) {
  std::string bytes = m.SerializeAsString();
  const std::string digest = Sha256Hex(bytes);
  return absl::StrCat(bytes, digest, kSealMarker);
}

// Parses a record into `m`. `sealed` tells whether it carried a seal;
// DATA_LOSS when the seal does not match or the bytes do not parse.
absl::Status Unseal(absl::string_view value, google::protobuf::Message* m, bool* sealed,
                    absl::string_view what) {
  *sealed = absl::EndsWith(value, kSealMarker) && value.size() >= kSealMarker.size() + kDigestHex;
  absl::string_view bytes = value;
  if (*sealed) {
    bytes = value.substr(0, value.size() - kSealMarker.size() - kDigestHex);
    const absl::string_view digest = value.substr(bytes.size(), kDigestHex);
    if (Sha256Hex(bytes) != digest) {
      return absl::DataLossError(absl::StrCat(what, ": its checksum does not match its bytes"));
    }
  }
  if (!m->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError(absl::StrCat(what, " does not parse"));
  }
  return absl::OkStatus();
}

}  // namespace internal

using internal::FromRocks;
using internal::NowMicros;
using internal::Seal;
using internal::Unseal;

namespace {

// Format 2: the record is sealed (see Seal). Format 1 records, written before
// records were sealed, are read without a checksum.
constexpr uint32_t kEntryFormat = 2;
constexpr uint32_t kFirstSealedFormat = 2;
constexpr int kMaxRecompileReasons = 32;
constexpr char kStatsKey[] = "s/stats";

// An entry record: sealed exactly when its format says so.
absl::Status ReadEntry(absl::string_view value, v1::StoredEntry* entry, absl::string_view ek) {
  bool sealed = false;
  RETURN_IF_ERROR(Unseal(value, entry, &sealed, absl::StrCat("stored entry ", ek)));
  if (sealed != (entry->format_version() >= kFirstSealedFormat)) {
    return absl::DataLossError(absl::StrCat("stored entry ", ek, " has format version ",
                                            entry->format_version(), " but is ",
                                            sealed ? "" : "not ", "sealed"));
  }
  return absl::OkStatus();
}

std::string UsageKey(const std::string& entry_key, const std::string& digest) {
  return absl::StrCat(entry_key, "\n", digest);
}

// Why a variant whose guards are not the requested ones did not serve.
std::string ExactMissReason(const v1::StoredVariant& v,
                            const std::optional<v1::InputSignature>& signature) {
  if (signature.has_value()) {
    auto failed = CheckGuards(v.guards(), *signature);
    if (failed.ok() && failed->has_value()) return **failed;
  }
  return "its guards differ from the requested guards";
}

}  // namespace

std::string EntryKey(const std::string& ns, const std::string& key) {
  return absl::StrCat("e/", ns, "/", key);
}

std::string ArtifactKey(const std::string& digest) { return absl::StrCat("a/", digest); }

std::string FamilyKey(const std::string& ns, const std::string& family) {
  return absl::StrCat("f/", ns, "/", family);
}

absl::Status ValidateNamespace(const std::string& ns) {
  if (ns.size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace '", ns.substr(0, 64), "...' is longer than 64 characters"));
  }
  for (char c : ns) {
    if (!(absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-')) {
      return absl::InvalidArgumentError(
          absl::StrCat("namespace '", ns, "' may hold only letters, digits, '_', '.' and '-'"));
    }
  }
  return absl::OkStatus();
}

// A directory that holds RocksDB's files but no CURRENT (which names the live
// MANIFEST) is a damaged database, not an empty one: opening it with
// create_if_missing would start an empty cache and delete the old files.
absl::Status CheckNotHeadless(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return absl::OkStatus();
  if (std::filesystem::exists(std::filesystem::path(path) / "CURRENT", ec)) {
    return absl::OkStatus();
  }
  int db_files = 0;
  std::string example;
  for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::EndsWith(name, ".sst") || absl::EndsWith(name, ".log") ||
        absl::StartsWith(name, "MANIFEST-") || absl::StartsWith(name, "OPTIONS-")) {
      ++db_files;
      if (example.empty() || absl::StartsWith(name, "MANIFEST-")) example = name;
    }
  }
  if (db_files == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "data_dir ", path, " holds ", db_files, " RocksDB files (", example,
      ", ...) but no CURRENT file: refusing to open it, which would start an empty cache and "
      "delete them. Restore CURRENT (one line naming the newest MANIFEST, e.g. 'echo ",
      absl::StartsWith(example, "MANIFEST-") ? example : "MANIFEST-000001",
      " > CURRENT') or move the directory away; nothing in it was changed"));
}

absl::StatusOr<std::unique_ptr<Cache>> Cache::Open(const CacheOptions& options) {
  RETURN_IF_ERROR(CheckNotHeadless(options.path));
  rocksdb::Options o;
  o.create_if_missing = true;
  o.paranoid_checks = true;
  // Every acknowledged write is replayed or the open fails: a log damaged
  // before its last record is refused rather than silently cut short, and
  // the MANIFEST records each closed log's size, so a missing or shortened
  // one is refused too. An incomplete last record is what a crash (kill -9)
  // leaves of a write that was never acknowledged: it is dropped.
  o.wal_recovery_mode = options.salvage_wal
                            ? rocksdb::WALRecoveryMode::kPointInTimeRecovery
                            : rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  o.track_and_verify_wals_in_manifest = !options.salvage_wal;
  o.IncreaseParallelism(2);
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status opened = rocksdb::DB::Open(o, options.path, &raw);
  if (opened.IsCorruption() && !options.salvage_wal) {
    return absl::DataLossError(absl::StrCat(
        "opening RocksDB at ", options.path, ": ", opened.ToString(),
        ". The write-ahead log is damaged; starting would drop acknowledged entries. To keep "
        "the writes before the damage and drop the rest, start once with --salvage_wal "
        "(salvage_wal: true in the config); back up the directory first"));
  }
  RETURN_IF_ERROR(FromRocks(opened, absl::StrCat("opening RocksDB at ", options.path)));
  std::unique_ptr<Cache> cache(new Cache(options, std::unique_ptr<rocksdb::DB>(raw)));
  RETURN_IF_ERROR(cache->LoadIndex());
  return cache;
}

Cache::Cache(CacheOptions options, std::unique_ptr<rocksdb::DB> db)
    : options_(std::move(options)), db_(std::move(db)) {
  // One shard: a shard holds at most its share of the bytes, and an
  // artifact larger than that would never be kept.
  if (options_.memory_bytes > 0) {
    verified_ = rocksdb::NewLRUCache(options_.memory_bytes, /*num_shard_bits=*/0);
  }
}

Cache::~Cache() {
  (void)FlushUsage();
  (void)db_->FlushWAL(/*sync=*/true);
  (void)db_->Close();
}

absl::StatusOr<v1::StoredStats> Cache::ReadStats() {
  v1::StoredStats stats;
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), kStatsKey, &value);
  if (s.IsNotFound()) return stats;
  RETURN_IF_ERROR(FromRocks(s, "reading statistics"));
  bool sealed = false;
  RETURN_IF_ERROR(Unseal(value, &stats, &sealed, "stored statistics"));
  return stats;
}

absl::Status Cache::WriteStats(const v1::StoredStats& stats) {
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  return FromRocks(db_->Put(wo, kStatsKey, Seal(stats)), "writing statistics");
}

absl::Status Cache::LoadIndex() {
  absl::MutexLock l(&index_mu_);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("e/"); it->Valid() && it->key().starts_with("e/"); it->Next()) {
    v1::StoredEntry entry;
    std::string ek = it->key().ToString();
    absl::Status read =
        ReadEntry(absl::string_view(it->value().data(), it->value().size()), &entry, ek);
    // A newer server's record may not be sealed as this one seals: its format
    // is what to report, not a broken seal.
    if (!read.ok() &&
        !(entry.ParseFromArray(it->value().data(), static_cast<int>(it->value().size())) &&
          entry.format_version() > kEntryFormat)) {
      return read;
    }
    if (entry.format_version() > kEntryFormat) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stored entry ", ek, " has format version ", entry.format_version(),
          ", newer than this server's ", kEntryFormat, "; refusing to open ", options_.path));
    }
    auto& list = entries_[ek];
    for (const auto& v : entry.variants()) {
      list.push_back(IndexedVariant{v.digest(), v.bytes()});
      usage_[UsageKey(ek, v.digest())] = VariantUse{v.last_used_unix_micros(), v.hits(), false};
      if (refcount_[v.digest()]++ == 0) {
        blob_bytes_[v.digest()] = v.bytes();
        total_bytes_ += v.bytes();
      }
      ++total_variants_;
    }
  }
  return FromRocks(it->status(), "scanning entries");
}

void Cache::ApplyUsage(const std::string& ek, v1::StoredEntry* entry) const {
  for (auto& v : *entry->mutable_variants()) {
    auto it = usage_.find(UsageKey(ek, v.digest()));
    if (it == usage_.end()) continue;
    v.set_last_used_unix_micros(it->second.last_used);
    v.set_hits(it->second.hits);
  }
  std::stable_sort(entry->mutable_variants()->begin(), entry->mutable_variants()->end(),
                   [](const v1::StoredVariant& a, const v1::StoredVariant& b) {
                     return a.last_used_unix_micros() > b.last_used_unix_micros();
                   });
}

absl::StatusOr<v1::StoredEntry> Cache::GetEntry(const std::string& ns, const std::string& key) {
  const std::string ek = EntryKey(ns, key);
  std::string value;
  RETURN_IF_ERROR(FromRocks(db_->Get(rocksdb::ReadOptions(), ek, &value),
                            absl::StrCat("entry ", key, " in namespace '", ns, "'")));
  v1::StoredEntry entry;
  RETURN_IF_ERROR(ReadEntry(value, &entry, ek));
  absl::MutexLock l(&index_mu_);
  ApplyUsage(ek, &entry);
  return entry;
}

absl::StatusOr<v1::StoredFamily> Cache::GetFamily(const std::string& ns,
                                                  const std::string& family) {
  const std::string fk = FamilyKey(ns, family);
  std::string value;
  RETURN_IF_ERROR(FromRocks(db_->Get(rocksdb::ReadOptions(), fk, &value),
                            absl::StrCat("shape family ", family)));
  v1::StoredFamily record;
  bool sealed = false;
  RETURN_IF_ERROR(Unseal(value, &record, &sealed, absl::StrCat("shape family ", fk)));
  if (!sealed) return absl::DataLossError(absl::StrCat("shape family ", fk, " is not sealed"));
  return record;
}

absl::StatusOr<ProbeResult> Cache::Probe(const ProbeRequest& req) {
  if (!req.guards.has_value() && !req.signature.has_value()) {
    return absl::InvalidArgumentError("a probe needs a signature or guards");
  }
  const std::string exact = req.guards.has_value() ? ir::DeterministicBytes(*req.guards) : "";
  ProbeResult result;
  for (int attempt = 0; attempt < 2; ++attempt) {
    LookupResult& r = result.lookup;
    r = LookupResult();
    auto entry = GetEntry(req.ns, req.key);
    if (absl::IsNotFound(entry.status())) return result;  // FULL_MISS
    if (!entry.ok()) return entry.status();
    r.variants = entry->variants_size();
    for (int i = 0; i < entry->variants_size() && r.digest.empty(); ++i) {
      const v1::StoredVariant& v = entry->variants(i);
      v1::VariantMiss miss;
      if (req.guards.has_value()) {
        if (ir::DeterministicBytes(v.guards()) == exact) {
          r.digest = v.digest();
          break;
        }
        miss.set_failed_guard(ExactMissReason(v, req.signature));
      } else {
        auto failed = CheckGuards(v.guards(), *req.signature);
        if (!failed.ok()) {
          return absl::InternalError(absl::StrCat("stored guards of variant ", i, " of ", req.key,
                                                  " are malformed: ", failed.status().message()));
        }
        if (!failed->has_value()) {
          r.digest = v.digest();
          break;
        }
        miss.set_failed_guard(**failed);
      }
      miss.set_variant(i);
      miss.set_digest(v.digest());
      r.misses.push_back(std::move(miss));
    }
    if (r.digest.empty()) {
      r.outcome = r.variants == 0 ? v1::FULL_MISS : v1::GUARD_MISS;
      return result;
    }
    if (req.read_artifact) {
      bool quarantined = false;
      auto artifact = ReadVerifiedArtifact(r.digest, &quarantined, req.parse_artifact);
      if (absl::IsDataLoss(artifact.status())) {  // probe again
        result.unreadable.push_back(artifact.status());
        result.quarantined += quarantined ? 1 : 0;
        continue;
      }
      if (!artifact.ok()) return artifact.status();
      result.artifact = *std::move(artifact);
    }
    r.outcome = v1::HIT;
    r.misses.clear();
    Touch(EntryKey(req.ns, req.key), r.digest);
    return result;
  }
  // Two serving variants in a row could not be served: a miss.
  LookupResult& r = result.lookup;
  r.outcome = r.variants == 0 ? v1::FULL_MISS : v1::GUARD_MISS;
  r.digest.clear();
  return result;
}

absl::StatusOr<LookupResult> Cache::Lookup(const std::string& ns, const std::string& key,
                                           const v1::InputSignature& signature) {
  ASSIGN_OR_RETURN(ProbeResult r, Probe(ProbeRequest{ns, key, signature, std::nullopt, false}));
  return std::move(r.lookup);
}

void Cache::Touch(const std::string& ek, const std::string& digest) {
  absl::MutexLock l(&index_mu_);
  // A variant dropped since it was read has no record, and gets none.
  auto it = usage_.find(UsageKey(ek, digest));
  if (it == usage_.end()) return;
  it->second.last_used = NowMicros();
  ++it->second.hits;
  it->second.dirty = true;
}

void Cache::RecordHit(const std::string& ns, const std::string& key, const std::string& digest) {
  Touch(EntryKey(ns, key), digest);
}

absl::StatusOr<std::string> Cache::ReadArtifact(const std::string& digest) {
  std::string bytes;
  RETURN_IF_ERROR(FromRocks(db_->Get(rocksdb::ReadOptions(), ArtifactKey(digest), &bytes),
                            absl::StrCat("artifact ", digest)));
  if (Sha256Hex(bytes) == digest) return bytes;
  RETURN_IF_ERROR(Quarantine(digest, bytes));
  return absl::DataLossError(
      absl::StrCat("artifact ", digest, " is corrupt (its bytes hash to ", Sha256Hex(bytes),
                   "); it was quarantined and will be recompiled on the next Compile"));
}

absl::StatusOr<VerifiedArtifact> Cache::ReadVerifiedArtifact(const std::string& digest,
                                                             bool* quarantined, bool parse) {
  VerifiedArtifact a;
  a.digest = digest;
  if (quarantined != nullptr) *quarantined = false;
  if (verified_ != nullptr) {
    if (rocksdb::Cache::Handle* h = verified_->Lookup(digest)) {
      a.bytes = *static_cast<const std::string*>(verified_->Value(h));
      verified_->Release(h);
      a.parsed = parse;
      if (parse && !a.artifact.ParseFromString(a.bytes)) {
        return absl::InternalError(
            absl::StrCat("artifact ", digest, " held in memory does not parse"));
      }
      return a;
    }
  }
  absl::StatusOr<std::string> bytes = ReadArtifact(digest);
  // ReadArtifact's DATA_LOSS is a corrupt blob, quarantined.
  if (quarantined != nullptr) *quarantined = absl::IsDataLoss(bytes.status());
  if (!bytes.ok()) return bytes.status();
  a.bytes = *std::move(bytes);
  if (!a.artifact.ParseFromString(a.bytes)) {
    return absl::DataLossError(absl::StrCat("artifact ", digest, " does not parse"));
  }
  if (a.artifact.format_version() > options_.max_artifact_format_version) {
    return absl::FailedPreconditionError(
        absl::StrCat("artifact ", digest, " has format version ", a.artifact.format_version(),
                     ", newer than this server's ", options_.max_artifact_format_version));
  }
  if (verified_ != nullptr) Remember(digest, a.bytes);
  return a;
}

absl::Status Cache::Quarantine(const std::string& digest, const std::string& bytes) {
  absl::MutexLock w(&write_mu_);
  std::vector<std::string> holders;
  {
    absl::MutexLock l(&index_mu_);
    for (const auto& [ek, variants] : entries_) {
      for (const auto& v : variants) {
        if (v.digest == digest) {
          holders.push_back(ek);
          break;
        }
      }
    }
  }
  // The blob moves to quarantine and every variant naming it goes, together.
  rocksdb::WriteBatch batch;
  batch.Put(absl::StrCat("q/", digest), bytes);
  batch.Delete(ArtifactKey(digest));
  uint64_t variants = 0, freed = 0;
  return DropVariants(holders, digest, &batch, &variants, &freed);
}

absl::StatusOr<Published> Cache::Publish(const PublishRequest& req) {
  const std::string digest = Sha256Hex(req.artifact);
  const std::string ek = EntryKey(req.ns, req.key);
  absl::MutexLock w(&write_mu_);

  v1::StoredEntry entry;
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), ek, &value);
  if (s.ok()) {
    RETURN_IF_ERROR(ReadEntry(value, &entry, ek));
  } else if (!s.IsNotFound()) {
    return FromRocks(s, absl::StrCat("reading entry ", ek));
  }
  for (const auto& v : entry.variants()) {
    if (v.digest() == digest) return Published{digest, 0};  // already published
  }
  const int64_t now = NowMicros();
  entry.set_format_version(kEntryFormat);
  entry.set_graph_name(req.graph_name);
  entry.set_backend(req.backend);
  {
    absl::MutexLock l(&index_mu_);
    ApplyUsage(ek, &entry);
  }
  v1::StoredVariant variant;
  *variant.mutable_guards() = req.guards;
  variant.set_digest(digest);
  variant.set_bytes(req.artifact.size());
  variant.set_created_unix_micros(now);
  variant.set_last_used_unix_micros(now);
  if (entry.variants_size() > 0 || !req.recompile_misses.empty() ||
      !req.automatic_dynamic.empty() || !req.client_reason.empty()) {
    v1::RecompileReason* r = entry.add_recompiles();
    r->set_unix_micros(now);
    r->set_digest(digest);
    for (const auto& m : req.recompile_misses) *r->add_misses() = m;
    r->set_automatic_dynamic(req.automatic_dynamic);
    r->set_client_reason(req.client_reason);
    if (entry.recompiles_size() > kMaxRecompileReasons) {
      entry.mutable_recompiles()->DeleteSubrange(0, entry.recompiles_size() - kMaxRecompileReasons);
    }
  }
  entry.mutable_variants()->Add(std::move(variant));
  std::rotate(entry.mutable_variants()->rbegin(), entry.mutable_variants()->rbegin() + 1,
              entry.mutable_variants()->rend());

  bool new_blob;
  {
    absl::MutexLock l(&index_mu_);
    new_blob = refcount_[digest] == 0;
  }
  rocksdb::WriteBatch batch;
  if (new_blob) batch.Put(ArtifactKey(digest), req.artifact);
  batch.Put(ek, Seal(entry));
  if (!req.family.empty()) batch.Put(FamilyKey(req.ns, req.family), Seal(req.family_record));
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  RETURN_IF_ERROR(FromRocks(db_->Write(wo, &batch), absl::StrCat("publishing ", ek)));
  {
    absl::MutexLock l(&index_mu_);
    entries_[ek].push_back(IndexedVariant{digest, req.artifact.size()});
    usage_[UsageKey(ek, digest)] = VariantUse{now, 0, false};
    if (refcount_[digest]++ == 0) {
      blob_bytes_[digest] = req.artifact.size();
      total_bytes_ += req.artifact.size();
    }
    ++total_variants_;
  }
  ASSIGN_OR_RETURN(const uint64_t evicted, EvictToBudget());
  // What was just compiled is what the job's other processes look up next.
  if (verified_ != nullptr) {
    v1::Artifact parsed;
    if (parsed.ParseFromString(req.artifact) &&
        parsed.format_version() <= options_.max_artifact_format_version) {
      Remember(digest, req.artifact);
    }
  }
  return Published{digest, evicted};
}

void Cache::Remember(const std::string& digest, const std::string& bytes) {
  // Dropped (if over the budget) when the memory evicts it.
  (void)verified_->Insert(
      digest, new std::string(bytes), bytes.size(),
      [](const rocksdb::Slice&, void* value) { delete static_cast<std::string*>(value); });
}

absl::Status Cache::DropVariants(const std::vector<std::string>& entry_keys,
                                 const std::string& digest, rocksdb::WriteBatch* batch,
                                 uint64_t* freed_variants, uint64_t* freed_bytes) {
  // (entry key, digest) of every variant dropped.
  std::vector<std::pair<std::string, std::string>> dropped;
  for (const std::string& ek : entry_keys) {
    std::string value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), ek, &value);
    if (s.IsNotFound()) continue;
    RETURN_IF_ERROR(FromRocks(s, absl::StrCat("reading entry ", ek)));
    v1::StoredEntry entry;
    RETURN_IF_ERROR(ReadEntry(value, &entry, ek));
    auto* vs = entry.mutable_variants();
    for (int i = vs->size() - 1; i >= 0; --i) {
      if (digest.empty() || vs->Get(i).digest() == digest) {
        dropped.emplace_back(ek, vs->Get(i).digest());
        vs->DeleteSubrange(i, 1);
      }
    }
    if (entry.variants_size() == 0) {
      batch->Delete(ek);
    } else {
      entry.set_format_version(kEntryFormat);
      batch->Put(ek, Seal(entry));
    }
  }
  absl::MutexLock l(&index_mu_);
  std::vector<std::string> orphaned;
  for (const auto& [ek, d] : dropped) {
    if (--refcount_[d] == 0) orphaned.push_back(d);
  }
  for (const std::string& d : orphaned) batch->Delete(ArtifactKey(d));
  rocksdb::Status ws = db_->Write(rocksdb::WriteOptions(), batch);
  if (!ws.ok()) {
    for (const auto& [ek, d] : dropped) ++refcount_[d];
    return FromRocks(ws, "dropping variants");
  }
  for (const std::string& ek : entry_keys) {
    auto it = entries_.find(ek);
    if (it == entries_.end()) continue;
    auto& list = it->second;
    list.erase(std::remove_if(
                   list.begin(), list.end(),
                   [&](const IndexedVariant& v) { return digest.empty() || v.digest == digest; }),
               list.end());
    if (list.empty()) entries_.erase(it);
  }
  for (const auto& [ek, d] : dropped) usage_.erase(UsageKey(ek, d));
  for (const std::string& d : orphaned) {
    *freed_bytes += blob_bytes_[d];
    total_bytes_ -= blob_bytes_[d];
    blob_bytes_.erase(d);
    refcount_.erase(d);
  }
  *freed_variants += dropped.size();
  total_variants_ -= dropped.size();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Cache::EvictToBudget() {
  uint64_t evicted = 0;
  while (true) {
    std::string victim_entry, victim_digest;
    {
      absl::MutexLock l(&index_mu_);
      if (total_bytes_ <= options_.byte_budget) return evicted;
      int64_t oldest = INT64_MAX;
      for (const auto& [uk, use] : usage_) {
        if (use.last_used < oldest) {
          oldest = use.last_used;
          size_t nl = uk.find('\n');
          victim_entry = uk.substr(0, nl);
          victim_digest = uk.substr(nl + 1);
        }
      }
      if (victim_entry.empty()) return evicted;
    }
    uint64_t variants = 0, bytes = 0;
    rocksdb::WriteBatch batch;
    RETURN_IF_ERROR(DropVariants({victim_entry}, victim_digest, &batch, &variants, &bytes));
    if (variants == 0) {
      // A recency record without its variant: forget it, never loop on it.
      absl::MutexLock l(&index_mu_);
      usage_.erase(UsageKey(victim_entry, victim_digest));
      continue;
    }
    evicted += variants;
  }
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> Cache::Evict(const std::string& ns,
                                                           const std::string& key) {
  const std::string ek = EntryKey(ns, key);
  absl::MutexLock w(&write_mu_);
  {
    absl::MutexLock l(&index_mu_);
    if (!entries_.contains(ek)) {
      return absl::NotFoundError(absl::StrCat("no entry ", key, " in namespace '", ns, "'"));
    }
  }
  uint64_t variants = 0, bytes = 0;
  rocksdb::WriteBatch batch;
  RETURN_IF_ERROR(DropVariants({ek}, /*digest=*/"", &batch, &variants, &bytes));
  return std::make_pair(variants, bytes);
}

absl::StatusOr<std::vector<Cache::EntrySummary>> Cache::List(const std::string& ns) {
  std::vector<EntrySummary> out;
  const std::string prefix = ns == "*" ? "e/" : EntryKey(ns, "");
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    std::string ek = it->key().ToString();
    size_t slash = ek.find('/', 2);
    EntrySummary e;
    e.ns = ek.substr(2, slash - 2);
    e.key = ek.substr(slash + 1);
    RETURN_IF_ERROR(
        ReadEntry(absl::string_view(it->value().data(), it->value().size()), &e.entry, ek));
    {
      absl::MutexLock l(&index_mu_);
      ApplyUsage(ek, &e.entry);
    }
    out.push_back(std::move(e));
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "listing entries"));
  return out;
}

Cache::Totals Cache::totals() const {
  absl::MutexLock l(&index_mu_);
  return Totals{entries_.size(), total_variants_, total_bytes_};
}

absl::Status Cache::FlushUsage() {
  absl::MutexLock w(&write_mu_);
  std::vector<std::string> dirty;
  {
    absl::MutexLock l(&index_mu_);
    for (auto& [uk, use] : usage_) {
      if (!use.dirty) continue;
      dirty.push_back(uk.substr(0, uk.find('\n')));
      use.dirty = false;
    }
  }
  std::sort(dirty.begin(), dirty.end());
  dirty.erase(std::unique(dirty.begin(), dirty.end()), dirty.end());
  rocksdb::WriteBatch batch;
  for (const std::string& ek : dirty) {
    std::string value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), ek, &value);
    if (s.IsNotFound()) continue;
    RETURN_IF_ERROR(FromRocks(s, absl::StrCat("reading entry ", ek)));
    v1::StoredEntry entry;
    if (!ReadEntry(value, &entry, ek).ok()) continue;  // reported where it is read
    {
      absl::MutexLock l(&index_mu_);
      ApplyUsage(ek, &entry);
    }
    entry.set_format_version(kEntryFormat);
    batch.Put(ek, Seal(entry));
  }
  {
    absl::MutexLock l(&jobs_mu_);
    for (auto& [rk, record] : jobs_) {
      if (!record.dirty) continue;
      batch.Put(rk, Seal(record.graphs));
      record.dirty = false;
    }
  }
  return FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), "flushing usage");
}

}  // namespace kiln::cache
