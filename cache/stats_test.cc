// cache::Stats: counted in memory, kept in the store's "s/stats" record.
#include "cache/stats.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "cache/test_util.h"
#include "rocksdb/db.h"

namespace kiln::cache {
namespace {

TEST(StatsTest, CountsAndSurvivesReopen) {
  TempDir dir;
  {
    auto cache = *Cache::Open({dir.path()});
    auto stats = Stats::Load(cache.get());
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ((*stats)->record().counters().hits(), 0u);
    (*stats)->Count(v1::HIT);
    (*stats)->Count(v1::HIT);
    (*stats)->Count(v1::GUARD_MISS);
    (*stats)->Count(v1::FULL_MISS);
    (*stats)->Count(v1::FROZEN_MISS);
    (*stats)->Count(v1::CACHE_LIMIT);
    (*stats)->Count(v1::BYPASS);
    (*stats)->CountCompile(true);
    (*stats)->CountCompile(false);
    (*stats)->CountSingleFlightJoin();
    (*stats)->CountFunctionFilter(true);
    (*stats)->CountFunctionFilter(false);
    (*stats)->CountCorruptArtifacts(2);
    (*stats)->CountEvictions(3);
    (*stats)->RecordPhase("verify", 120);
    (*stats)->RecordPhase("verify", 100);  // on a bound: that bound's bucket
    // Destroyed before the cache: it flushes.
  }
  auto cache = *Cache::Open({dir.path()});
  auto stats = *Stats::Load(cache.get());
  const v1::StoredStats s = stats->record();
  const v1::CacheCounters& c = s.counters();
  EXPECT_EQ(c.hits(), 2u);
  EXPECT_EQ(c.guard_misses(), 1u);
  EXPECT_EQ(c.full_misses(), 1u);
  EXPECT_EQ(c.frozen_misses(), 1u);
  EXPECT_EQ(c.cache_limit_hits(), 1u);
  EXPECT_EQ(c.bypasses(), 1u);
  EXPECT_EQ(c.compiles(), 1u);
  EXPECT_EQ(c.compile_errors(), 1u);
  EXPECT_EQ(c.single_flight_joins(), 1u);
  EXPECT_EQ(c.function_filter_matched(), 1u);
  EXPECT_EQ(c.function_filter_eager(), 1u);
  EXPECT_EQ(c.corrupt_artifacts(), 2u);
  EXPECT_EQ(c.evictions(), 3u);
  ASSERT_EQ(s.phases_size(), 1);
  EXPECT_EQ(s.phases(0).phase(), "verify");
  EXPECT_EQ(s.phases(0).total_micros(), 220u);
  const v1::Histogram& h = s.phases(0).histogram();
  EXPECT_EQ(h.count(), 2u);
  EXPECT_EQ(h.sum(), 220.0);
  ASSERT_EQ(h.counts_size(), h.bounds_size() + 1);
  EXPECT_EQ(h.bounds(2), 100.0);
  EXPECT_EQ(h.counts(2), 1u);  // 100: (50, 100]
  EXPECT_EQ(h.counts(3), 1u);  // 120: (100, 500]
}

TEST(StatsTest, FlushWritesTheRecordTheCacheKeeps) {
  TempDir dir;
  auto cache = *Cache::Open({dir.path()});
  auto stats = *Stats::Load(cache.get());
  stats->CountCompile(true);
  ASSERT_TRUE(stats->Flush().ok());
  auto stored = cache->ReadStats();
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->counters().compiles(), 1u);
}

TEST(StatsTest, CountsFromManyThreads) {
  TempDir dir;
  auto cache = *Cache::Open({dir.path()});
  auto stats = *Stats::Load(cache.get());
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        stats->Count(v1::HIT);
        stats->RecordPhase("key", i);
        if (i % 100 == 0) {
          EXPECT_TRUE(stats->Flush().ok());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(stats->record().counters().hits(), 8000u);
  EXPECT_EQ(stats->record().phases(0).histogram().count(), 8000u);
}

TEST(StatsTest, ARecordThatDoesNotUnsealStopsTheLoad) {
  TempDir dir;
  {
    auto cache = *Cache::Open({dir.path()});
    auto stats = *Stats::Load(cache.get());
    stats->Count(v1::HIT);
  }
  {
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir.path(), &db).ok());
    std::string value;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), "s/stats", &value).ok());
    value[0] ^= 1;
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "s/stats", value).ok());
    delete db;
  }
  auto cache = *Cache::Open({dir.path()});
  auto stats = Stats::Load(cache.get());
  EXPECT_TRUE(absl::IsDataLoss(stats.status())) << stats.status();
}

}  // namespace
}  // namespace kiln::cache
