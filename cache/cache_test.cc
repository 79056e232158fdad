#include "cache/cache.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "cache/test_util.h"
#include "common/hashing.h"
#include "rocksdb/db.h"

namespace kiln::cache {
namespace {

const std::string kKey(64, 'a');
const std::string kKey2(64, 'b');

TEST(CacheTest, PublishThenHitAndGuardMiss) {
  TempDir dir;
  auto cache = Cache::Open({dir.path()});
  ASSERT_TRUE(cache.ok()) << cache.status();
  auto miss = (*cache)->Lookup("", kKey, SignatureForSize(4));
  ASSERT_TRUE(miss.ok());
  EXPECT_EQ(miss->outcome, v1::FULL_MISS);

  auto published = (*cache)->Publish(Pub(kKey, 4, "artifact-4"));
  ASSERT_TRUE(published.ok()) << published.status();
  const std::string* digest = &published->digest;
  EXPECT_EQ(*digest, Sha256Hex("artifact-4"));
  EXPECT_EQ(published->evicted_variants, 0u);

  auto hit = (*cache)->Lookup("", kKey, SignatureForSize(4));
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->outcome, v1::HIT);
  EXPECT_EQ(hit->digest, *digest);
  EXPECT_EQ(*(*cache)->ReadArtifact(*digest), "artifact-4");

  auto gm = (*cache)->Lookup("", kKey, SignatureForSize(5));
  ASSERT_TRUE(gm.ok());
  EXPECT_EQ(gm->outcome, v1::GUARD_MISS);
  ASSERT_EQ(gm->misses.size(), 1u);
  EXPECT_EQ(gm->misses[0].failed_guard(), "input 0 'x': size[0] is 5, guard expects 4");

  // Namespaces are separate.
  auto other_ns = (*cache)->Lookup("tenant-b", kKey, SignatureForSize(4));
  EXPECT_EQ(other_ns->outcome, v1::FULL_MISS);

  // A second variant records why the first did not serve.
  PublishRequest p = Pub(kKey, 5, "artifact-5");
  p.recompile_misses = gm->misses;
  ASSERT_TRUE((*cache)->Publish(p).ok());
  auto entry = (*cache)->GetEntry("", kKey);
  ASSERT_TRUE(entry.ok());
  EXPECT_EQ(entry->variants_size(), 2);
  ASSERT_EQ(entry->recompiles_size(), 1);
  EXPECT_EQ(entry->recompiles(0).misses(0).failed_guard(),
            "input 0 'x': size[0] is 5, guard expects 4");
  EXPECT_EQ((*cache)->totals().variants, 2u);
  EXPECT_EQ((*cache)->totals().bytes, 20u);
}

TEST(CacheTest, SurvivesReopenWithUsage) {
  TempDir dir;
  std::string digest;
  {
    auto cache = *Cache::Open({dir.path()});
    digest = cache->Publish(Pub(kKey, 4, "persisted"))->digest;
    ASSERT_EQ(cache->Lookup("", kKey, SignatureForSize(4))->outcome, v1::HIT);
  }
  auto cache = *Cache::Open({dir.path()});
  EXPECT_EQ(cache->Lookup("", kKey, SignatureForSize(4))->outcome, v1::HIT);
  EXPECT_EQ(*cache->ReadArtifact(digest), "persisted");
  EXPECT_EQ(cache->GetEntry("", kKey)->variants(0).hits(), 2u);  // one before, one after
  EXPECT_EQ(cache->totals().entries, 1u);
}

TEST(CacheTest, EvictsLeastRecentlyUsedByBytes) {
  TempDir dir;
  auto cache = *Cache::Open({dir.path(), /*byte_budget=*/25});
  ASSERT_TRUE(cache->Publish(Pub(kKey, 1, std::string(10, '1'))).ok());
  ASSERT_TRUE(cache->Publish(Pub(kKey2, 1, std::string(10, '2'))).ok());
  // Touch the first so the second is least recently used.
  absl::SleepFor(absl::Milliseconds(2));
  ASSERT_EQ(cache->Lookup("", kKey, SignatureForSize(1))->outcome, v1::HIT);
  auto third = cache->Publish(Pub(kKey, 2, std::string(10, '3')));
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->evicted_variants, 1u);
  EXPECT_LE(cache->totals().bytes, 25u);
  EXPECT_EQ(cache->Lookup("", kKey2, SignatureForSize(1))->outcome, v1::FULL_MISS);
  EXPECT_EQ(cache->Lookup("", kKey, SignatureForSize(1))->outcome, v1::HIT);
  EXPECT_EQ(cache->Lookup("", kKey, SignatureForSize(2))->outcome, v1::HIT);
  EXPECT_TRUE(absl::IsNotFound(cache->ReadArtifact(Sha256Hex(std::string(10, '2'))).status()));
}

TEST(CacheTest, CorruptArtifactIsQuarantinedNeverServed) {
  TempDir dir;
  std::string digest;
  {
    auto cache = *Cache::Open({dir.path()});
    digest = cache->Publish(Pub(kKey, 4, "good bytes"))->digest;
  }
  {
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir.path(), &db).ok());
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), ArtifactKey(digest), "g00d bytes").ok());
    delete db;
  }
  auto cache = *Cache::Open({dir.path()});
  auto read = cache->ReadArtifact(digest);
  EXPECT_TRUE(absl::IsDataLoss(read.status())) << read.status();
  // The variant is gone, so the next lookup misses and a compile rebuilds it.
  EXPECT_EQ(cache->Lookup("", kKey, SignatureForSize(4))->outcome, v1::FULL_MISS);
  EXPECT_TRUE(absl::IsNotFound(cache->ReadArtifact(digest).status()));
  ASSERT_TRUE(cache->Publish(Pub(kKey, 4, "good bytes")).ok());
  EXPECT_EQ(*cache->ReadArtifact(digest), "good bytes");
}

TEST(CacheTest, HitsOnDroppedVariantsLeaveNoRecordAndEvictionEnds) {
  TempDir dir;
  auto cache = *Cache::Open({dir.path(), /*byte_budget=*/15});
  const std::string gone = cache->Publish(Pub(kKey, 1, std::string(10, 'x')))->digest;
  ASSERT_TRUE(cache->Evict("", kKey).ok());
  // A hit recorded for a variant that was dropped meanwhile.
  cache->RecordHit("", kKey, gone);
  ASSERT_TRUE(cache->Publish(Pub(kKey2, 1, std::string(10, 'y'))).ok());
  ASSERT_TRUE(cache->Publish(Pub(kKey2, 2, std::string(10, 'z'))).ok());  // over budget
  EXPECT_LE(cache->totals().bytes, 15u);
  EXPECT_EQ(cache->totals().variants, 1u);
  EXPECT_EQ(cache->Lookup("", kKey2, SignatureForSize(2))->outcome, v1::HIT);
}

TEST(CacheTest, RefusesEntriesFromANewerFormat) {
  TempDir dir;
  {
    auto cache = *Cache::Open({dir.path()});
    ASSERT_TRUE(cache->Publish(Pub(kKey, 1, "a")).ok());
  }
  {
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir.path(), &db).ok());
    std::string value;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), EntryKey("", kKey), &value).ok());
    // A newer server's record: whatever its envelope, the format is read first.
    v1::StoredEntry entry;
    entry.set_format_version(99);
    ASSERT_TRUE(
        db->Put(rocksdb::WriteOptions(), EntryKey("", kKey), entry.SerializeAsString()).ok());
    delete db;
  }
  auto reopened = Cache::Open({dir.path()});
  EXPECT_EQ(reopened.status().code(), absl::StatusCode::kFailedPrecondition) << reopened.status();
  EXPECT_NE(reopened.status().message().find("format version 99"), std::string::npos);
}

TEST(CacheTest, EveryEntryReadChecksItsSeal) {
  TempDir dir;
  {
    auto cache = *Cache::Open({dir.path()});
    ASSERT_TRUE(cache->Publish(Pub(kKey, 1, "a")).ok());
  }
  {
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir.path(), &db).ok());
    std::string value;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), EntryKey("", kKey), &value).ok());
    // A guard's size changes from 1 to 3: the record still parses.
    const size_t at = value.find(std::string("\x08\x01", 2));
    ASSERT_NE(at, std::string::npos);
    value[at + 1] = 3;
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), EntryKey("", kKey), value).ok());
    delete db;
  }
  auto reopened = Cache::Open({dir.path()});
  ASSERT_EQ(reopened.status().code(), absl::StatusCode::kDataLoss) << reopened.status();
  EXPECT_TRUE(absl::StrContains(reopened.status().message(), "checksum does not match"))
      << reopened.status();
}

TEST(CacheTest, EvictKeyAndListNamespaces) {
  TempDir dir;
  auto cache = *Cache::Open({dir.path()});
  ASSERT_TRUE(cache->Publish(Pub(kKey, 1, "one", "a")).ok());
  ASSERT_TRUE(cache->Publish(Pub(kKey, 2, "two", "a")).ok());
  ASSERT_TRUE(cache->Publish(Pub(kKey2, 1, "one", "b")).ok());
  EXPECT_EQ(cache->List("*")->size(), 2u);
  EXPECT_EQ(cache->List("a")->size(), 1u);
  auto freed = cache->Evict("a", kKey);
  ASSERT_TRUE(freed.ok());
  EXPECT_EQ(freed->first, 2u);
  EXPECT_EQ(freed->second, 3u);  // "one" is still held by namespace b
  EXPECT_EQ(*cache->ReadArtifact(Sha256Hex("one")), "one");
  EXPECT_TRUE(absl::IsNotFound(cache->Evict("a", kKey).status()));
  EXPECT_FALSE(ValidateNamespace("bad/ns").ok());
  EXPECT_TRUE(ValidateNamespace("team-a.prod_1").ok());
}

}  // namespace
}  // namespace kiln::cache

namespace kiln::cache {
namespace {

std::map<std::string, uintmax_t> Listing(const std::string& dir) {
  std::map<std::string, uintmax_t> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    out[e.path().filename().string()] = e.is_regular_file() ? e.file_size() : 0;
  }
  return out;
}

TEST(CacheTest, ADirectoryWithoutCurrentIsRefusedAndLeftAsItWas) {
  TempDir dir;
  {
    auto cache = *Cache::Open({dir.path()});
    for (int i = 0; i < 20; ++i) {
      ASSERT_TRUE(cache->Publish(Pub(std::string(63, 'a') + char('a' + i), 4, "bytes")).ok());
    }
  }
  {
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir.path(), &db).ok());
    ASSERT_TRUE(db->Flush(rocksdb::FlushOptions()).ok());  // the entries into SST files
    delete db;
  }
  std::filesystem::remove(std::filesystem::path(dir.path()) / "CURRENT");
  const auto before = Listing(dir.path());
  for (int attempt = 0; attempt < 2; ++attempt) {  // what Restart=on-failure does
    auto cache = Cache::Open({dir.path()});
    ASSERT_EQ(cache.status().code(), absl::StatusCode::kFailedPrecondition) << cache.status();
    EXPECT_TRUE(absl::StrContains(cache.status().message(), "but no CURRENT file"))
        << cache.status();
  }
  EXPECT_EQ(Listing(dir.path()), before);
}

TEST(CacheTest, ADamagedWriteAheadLogIsRefusedUnlessSalvaged) {
  TempDir dir;
  {
    auto cache = *Cache::Open({dir.path()});
    for (int i = 0; i < 50; ++i) {
      ASSERT_TRUE(cache
                      ->Publish(Pub(std::string(63, 'a') + char('a' + i % 26) + std::to_string(i),
                                    4, std::string(2000, 'x')))
                      .ok());
    }
  }
  std::filesystem::path log;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    if (e.path().extension() == ".log" && e.file_size() > 0) log = e.path();
  }
  ASSERT_FALSE(log.empty()) << "the entries are expected in the write-ahead log";
  // Damage the middle of the log: a crash never does this; a disk does.
  {
    std::fstream f(log, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(log) / 2));
    f.write("\xde\xad\xbe\xef\xde\xad\xbe\xef", 8);
  }
  auto refused = Cache::Open({dir.path()});
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "--salvage_wal")) << refused.status();

  CacheOptions salvage{dir.path()};
  salvage.salvage_wal = true;
  auto salvaged = Cache::Open(salvage);
  ASSERT_TRUE(salvaged.ok()) << salvaged.status();
  EXPECT_GT((*salvaged)->totals().entries, 0u);
  EXPECT_LT((*salvaged)->totals().entries, 50u);
}

TEST(CacheTest, FailureRecordsAreBoundedPerNamespaceAndInAll) {
  TempDir dir;
  auto cache = *Cache::Open({dir.path()});
  auto record = [&](const std::string& ns, int64_t t) {
    v1::FailedCompile f;
    f.set_namespace_(ns);
    f.set_id(absl::StrFormat("%016x", t));
    f.set_unix_micros(t);
    ASSERT_TRUE(cache->RecordFailure(f).ok());
  };
  int64_t t = 1;
  for (int i = 0; i < 40; ++i) record("one", t++);
  auto one = cache->ListFailures("one");
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), static_cast<size_t>(Cache::kMaxFailuresPerNamespace));
  EXPECT_EQ(one->front().unix_micros(), 40);  // the newest kept, the oldest gone
  EXPECT_EQ(one->back().unix_micros(), 9);
  // Many namespaces: the oldest records of all go beyond kMaxFailures.
  for (int n = 0; n < 300; ++n) record(absl::StrCat("ns", n), t++);
  auto all = cache->ListFailures("*");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), Cache::kMaxFailures);
  EXPECT_EQ(all->front().unix_micros(), t - 1);
  EXPECT_EQ(all->back().unix_micros(), t - static_cast<int64_t>(Cache::kMaxFailures));
  EXPECT_TRUE(cache->ListFailures("one")->empty());
}

}  // namespace
}  // namespace kiln::cache
