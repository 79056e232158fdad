#include "cache/cache.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/hashing.h"
#include "rocksdb/db.h"

namespace kiln::cache {
namespace {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kiln_cache_test.XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

v1::GuardSet GuardsForSize(int64_t n) {
  v1::GuardSet g;
  auto* t = g.add_tensors();
  t->set_name("x");
  t->set_dtype(v1::FLOAT32);
  t->mutable_device()->set_type("cpu");
  t->mutable_device()->set_index(-1);
  t->add_sizes()->set_int_value(n);
  return g;
}

v1::InputSignature SignatureForSize(int64_t n) {
  v1::InputSignature s;
  auto* t = s.add_inputs();
  t->set_dtype(v1::FLOAT32);
  t->mutable_device()->set_type("cpu");
  t->mutable_device()->set_index(-1);
  t->add_sizes(n);
  t->add_strides(1);
  return s;
}

PublishRequest Pub(const std::string& key, int64_t n, const std::string& artifact,
                   const std::string& ns = "") {
  PublishRequest p;
  p.ns = ns;
  p.key = key;
  p.graph_name = "g";
  p.backend = "eager";
  p.guards = GuardsForSize(n);
  p.artifact = artifact;
  return p;
}

const std::string kKey(64, 'a');
const std::string kKey2(64, 'b');

TEST(CacheTest, PublishThenHitAndGuardMiss) {
  TempDir dir;
  auto cache = Cache::Open({dir.path()});
  ASSERT_TRUE(cache.ok()) << cache.status();
  auto miss = (*cache)->Lookup("", kKey, SignatureForSize(4));
  ASSERT_TRUE(miss.ok());
  EXPECT_EQ(miss->outcome, v1::FULL_MISS);

  auto digest = (*cache)->Publish(Pub(kKey, 4, "artifact-4"));
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, Sha256Hex("artifact-4"));

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

TEST(CacheTest, SurvivesReopenWithStatistics) {
  TempDir dir;
  std::string digest;
  {
    auto cache = *Cache::Open({dir.path()});
    digest = *cache->Publish(Pub(kKey, 4, "persisted"));
    ASSERT_EQ(cache->Lookup("", kKey, SignatureForSize(4))->outcome, v1::HIT);
    cache->Count(v1::HIT);
    cache->Count(v1::FULL_MISS);
    cache->RecordPhase("verify", 120);
  }
  auto cache = *Cache::Open({dir.path()});
  EXPECT_EQ(cache->Lookup("", kKey, SignatureForSize(4))->outcome, v1::HIT);
  EXPECT_EQ(*cache->ReadArtifact(digest), "persisted");
  v1::StoredStats s = cache->Stats();
  EXPECT_EQ(s.counters().hits(), 1u);
  EXPECT_EQ(s.counters().full_misses(), 1u);
  ASSERT_EQ(s.phases_size(), 1);
  EXPECT_EQ(s.phases(0).total_micros(), 120u);
  EXPECT_EQ(s.phases(0).histogram().count(), 1u);
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
  ASSERT_TRUE(cache->Publish(Pub(kKey, 2, std::string(10, '3'))).ok());
  EXPECT_LE(cache->totals().bytes, 25u);
  EXPECT_EQ(cache->Lookup("", kKey2, SignatureForSize(1))->outcome, v1::FULL_MISS);
  EXPECT_EQ(cache->Lookup("", kKey, SignatureForSize(1))->outcome, v1::HIT);
  EXPECT_EQ(cache->Lookup("", kKey, SignatureForSize(2))->outcome, v1::HIT);
  EXPECT_EQ(cache->Stats().counters().evictions(), 1u);
  EXPECT_TRUE(absl::IsNotFound(cache->ReadArtifact(Sha256Hex(std::string(10, '2'))).status()));
}

TEST(CacheTest, CorruptArtifactIsQuarantinedNeverServed) {
  TempDir dir;
  std::string digest;
  {
    auto cache = *Cache::Open({dir.path()});
    digest = *cache->Publish(Pub(kKey, 4, "good bytes"));
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
  EXPECT_EQ(cache->Stats().counters().corrupt_artifacts(), 1u);
  // The variant is gone, so the next lookup misses and a compile rebuilds it.
  EXPECT_EQ(cache->Lookup("", kKey, SignatureForSize(4))->outcome, v1::FULL_MISS);
  EXPECT_TRUE(absl::IsNotFound(cache->ReadArtifact(digest).status()));
  ASSERT_TRUE(cache->Publish(Pub(kKey, 4, "good bytes")).ok());
  EXPECT_EQ(*cache->ReadArtifact(digest), "good bytes");
}

TEST(CacheTest, HitsOnDroppedVariantsLeaveNoRecordAndEvictionEnds) {
  TempDir dir;
  auto cache = *Cache::Open({dir.path(), /*byte_budget=*/15});
  const std::string gone = *cache->Publish(Pub(kKey, 1, std::string(10, 'x')));
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
    v1::StoredEntry entry;
    ASSERT_TRUE(entry.ParseFromString(value));
    entry.set_format_version(99);
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), EntryKey("", kKey), entry.SerializeAsString()).ok());
    delete db;
  }
  auto reopened = Cache::Open({dir.path()});
  EXPECT_EQ(reopened.status().code(), absl::StatusCode::kFailedPrecondition) << reopened.status();
  EXPECT_NE(reopened.status().message().find("format version 99"), std::string::npos);
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
