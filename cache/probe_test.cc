// Cache::Probe: the one call that finds what serves a request.
#include <gtest/gtest.h>

#include <string>

#include "cache/cache.h"
#include "cache/test_util.h"
#include "common/hashing.h"
#include "rocksdb/db.h"

namespace kiln::cache {
namespace {

const std::string kKey(64, 'c');

// A serialized artifact for the variant of size n.
std::string ArtifactBytes(int64_t n, uint32_t format_version = 1) {
  v1::Artifact a;
  a.set_format_version(format_version);
  a.set_backend("eager");
  a.set_key(kKey);
  *a.mutable_guards() = GuardsForSize(n);
  return a.SerializeAsString();
}

ProbeRequest BySignature(int64_t n) {
  ProbeRequest r{"", kKey};
  r.signature = SignatureForSize(n);
  return r;
}

// Overwrites a stored artifact's bytes behind the cache's back.
void Overwrite(const std::string& path, const std::string& digest, const std::string& bytes) {
  rocksdb::DB* db = nullptr;
  ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), path, &db).ok());
  ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), ArtifactKey(digest), bytes).ok());
  delete db;
}

TEST(ProbeTest, HitReturnsTheVerifiedArtifact) {
  TempDir dir;
  auto cache = *Cache::Open({dir.path()});
  const std::string bytes = ArtifactBytes(4);
  ASSERT_TRUE(cache->Publish(Pub(kKey, 4, bytes)).ok());
  auto hit = cache->Probe(BySignature(4));
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(hit->lookup.outcome, v1::HIT);
  EXPECT_EQ(hit->lookup.digest, Sha256Hex(bytes));
  EXPECT_TRUE(hit->lookup.misses.empty());
  EXPECT_TRUE(hit->unreadable.empty());
  EXPECT_EQ(hit->quarantined, 0);
  ASSERT_TRUE(hit->artifact.has_value());
  EXPECT_EQ(hit->artifact->digest, Sha256Hex(bytes));
  EXPECT_EQ(hit->artifact->bytes, bytes);
  EXPECT_EQ(hit->artifact->artifact.key(), kKey);
  // The hit is the variant's use: its recency and hit count.
  EXPECT_EQ(cache->GetEntry("", kKey)->variants(0).hits(), 1u);

  // Without the artifact: the digest only.
  ProbeRequest digest_only = BySignature(4);
  digest_only.read_artifact = false;
  auto cheap = cache->Probe(digest_only);
  ASSERT_TRUE(cheap.ok());
  EXPECT_EQ(cheap->lookup.outcome, v1::HIT);
  EXPECT_FALSE(cheap->artifact.has_value());
}

// An artifact verified once, or published, is held in memory
// (CacheOptions::memory_bytes): later probes that ask for the bytes alone
// get them unparsed. A cache
// opened afresh holds nothing, and finds damage to the stored copy; with no
// memory, every probe reads, verifies and parses the stored bytes.
TEST(ProbeTest, VerifiedArtifactsAreServedFromMemory) {
  TempDir dir;
  const std::string bytes = ArtifactBytes(4);
  const std::string digest = Sha256Hex(bytes);
  {
    auto cache = *Cache::Open({dir.path()});
    ASSERT_TRUE(cache->Publish(Pub(kKey, 4, bytes)).ok());
  }
  CacheOptions options{dir.path()};
  auto cache = *Cache::Open(options);
  ProbeRequest bytes_only = BySignature(4);
  bytes_only.parse_artifact = false;
  // The first read verifies and parses, whatever was asked.
  auto first = cache->Probe(bytes_only);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->artifact.has_value());
  EXPECT_TRUE(first->artifact->parsed);
  EXPECT_EQ(first->artifact->bytes, bytes);
  // The stored copy damaged while the cache is closed.
  cache.reset();
  Overwrite(dir.path(), digest, "damaged");
  cache = *Cache::Open(options);
  // A fresh cache knows nothing: the damage is found and quarantined.
  auto damaged = cache->Probe(bytes_only);
  ASSERT_TRUE(damaged.ok()) << damaged.status();
  EXPECT_EQ(damaged->quarantined, 1);
  EXPECT_EQ(damaged->lookup.outcome, v1::FULL_MISS);

  // Published (kilnd's own compile): served from memory at once, bytes
  // alone or parsed.
  ASSERT_TRUE(cache->Publish(Pub(kKey, 4, bytes)).ok());
  auto held = cache->Probe(bytes_only);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE(held->artifact.has_value());
  EXPECT_FALSE(held->artifact->parsed);
  EXPECT_EQ(held->artifact->bytes, bytes);
  auto parsed = cache->Probe(BySignature(4));
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed->artifact->parsed);
  EXPECT_EQ(parsed->artifact->artifact.key(), kKey);

  // An artifact of most of the memory's bytes is held too.
  cache.reset();
  options.memory_bytes = 1 << 20;
  cache = *Cache::Open(options);
  v1::Artifact large;
  large.set_format_version(1);
  large.set_backend("eager");
  large.set_key(kKey);
  *large.mutable_guards() = GuardsForSize(6);
  (*large.mutable_trace())["code.txt"] = std::string(600 << 10, 'x');
  ASSERT_TRUE(cache->Publish(Pub(kKey, 6, large.SerializeAsString())).ok());
  ProbeRequest large_bytes = BySignature(6);
  large_bytes.parse_artifact = false;
  auto held_large = cache->Probe(large_bytes);
  ASSERT_TRUE(held_large.ok()) << held_large.status();
  ASSERT_TRUE(held_large->artifact.has_value());
  EXPECT_FALSE(held_large->artifact->parsed);

  // No memory: always read and parsed.
  cache.reset();
  options.memory_bytes = 0;
  cache = *Cache::Open(options);
  for (int i = 0; i < 2; ++i) {
    auto again = cache->Probe(bytes_only);
    ASSERT_TRUE(again.ok()) << again.status();
    ASSERT_TRUE(again->artifact.has_value());
    EXPECT_TRUE(again->artifact->parsed);
  }
}

TEST(ProbeTest, MissesCarryTheReasonOfEveryVariant) {
  TempDir dir;
  auto cache = *Cache::Open({dir.path()});
  auto full = cache->Probe(BySignature(4));
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->lookup.outcome, v1::FULL_MISS);
  EXPECT_EQ(full->lookup.variants, 0);

  ASSERT_TRUE(cache->Publish(Pub(kKey, 4, ArtifactBytes(4))).ok());
  ASSERT_TRUE(cache->Publish(Pub(kKey, 8, ArtifactBytes(8))).ok());
  auto miss = cache->Probe(BySignature(5));
  ASSERT_TRUE(miss.ok());
  EXPECT_EQ(miss->lookup.outcome, v1::GUARD_MISS);
  EXPECT_EQ(miss->lookup.variants, 2);
  EXPECT_FALSE(miss->artifact.has_value());
  ASSERT_EQ(miss->lookup.misses.size(), 2u);
  EXPECT_EQ(miss->lookup.misses[0].variant(), 0);
  EXPECT_EQ(miss->lookup.misses[0].failed_guard(), "input 0 'x': size[0] is 5, guard expects 8");
  EXPECT_EQ(miss->lookup.misses[1].failed_guard(), "input 0 'x': size[0] is 5, guard expects 4");
}

TEST(ProbeTest, ExactGuardsServeOnlyTheirOwnVariant) {
  TempDir dir;
  auto cache = *Cache::Open({dir.path()});
  ASSERT_TRUE(cache->Publish(Pub(kKey, 4, ArtifactBytes(4))).ok());
  ProbeRequest exact{"", kKey};
  exact.guards = GuardsForSize(4);
  auto hit = cache->Probe(exact);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->lookup.outcome, v1::HIT);
  ASSERT_TRUE(hit->artifact.has_value());

  // Other guards: a miss, explained by the signature when there is one.
  exact.guards = GuardsForSize(6);
  auto unexplained = cache->Probe(exact);
  ASSERT_TRUE(unexplained.ok());
  EXPECT_EQ(unexplained->lookup.outcome, v1::GUARD_MISS);
  ASSERT_EQ(unexplained->lookup.misses.size(), 1u);
  EXPECT_EQ(unexplained->lookup.misses[0].failed_guard(),
            "its guards differ from the requested guards");
  exact.signature = SignatureForSize(6);
  auto explained = cache->Probe(exact);
  ASSERT_TRUE(explained.ok());
  ASSERT_EQ(explained->lookup.misses.size(), 1u);
  EXPECT_EQ(explained->lookup.misses[0].failed_guard(),
            "input 0 'x': size[0] is 6, guard expects 4");

  EXPECT_TRUE(absl::IsInvalidArgument(cache->Probe(ProbeRequest{"", kKey}).status()));
}

TEST(ProbeTest, CorruptArtifactIsQuarantinedAndTheProbeGoesOn) {
  TempDir dir;
  std::string corrupt, good;
  {
    auto cache = *Cache::Open({dir.path()});
    good = cache->Publish(Pub(kKey, 4, ArtifactBytes(4, 1)))->digest;
    // Published last, so evaluated first; it admits size 4 too.
    PublishRequest wide = Pub(kKey, 4, ArtifactBytes(4, 0));
    corrupt = cache->Publish(wide)->digest;
  }
  Overwrite(dir.path(), corrupt, "not what was published");
  auto cache = *Cache::Open({dir.path()});
  auto found = cache->Probe(BySignature(4));
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->quarantined, 1);
  ASSERT_EQ(found->unreadable.size(), 1u);
  EXPECT_TRUE(absl::IsDataLoss(found->unreadable[0]));
  EXPECT_NE(found->unreadable[0].message().find("is corrupt"), std::string::npos);
  // The other variant serves.
  EXPECT_EQ(found->lookup.outcome, v1::HIT);
  EXPECT_EQ(found->lookup.digest, good);
  ASSERT_TRUE(found->artifact.has_value());
  EXPECT_EQ(cache->GetEntry("", kKey)->variants_size(), 1);
  EXPECT_TRUE(absl::IsNotFound(cache->ReadArtifact(corrupt).status()));

  // Corrupt again, with no other variant: a full miss.
  {
    cache.reset();
    Overwrite(dir.path(), good, "also damaged");
    cache = *Cache::Open({dir.path()});
  }
  auto miss = cache->Probe(BySignature(4));
  ASSERT_TRUE(miss.ok());
  EXPECT_EQ(miss->quarantined, 1);
  EXPECT_EQ(miss->lookup.outcome, v1::FULL_MISS);
  EXPECT_FALSE(miss->artifact.has_value());
}

TEST(ProbeTest, ArtifactsThatDoNotParseOrAreNewerAreNotServed) {
  TempDir dir;
  auto cache = *Cache::Open({dir.path()});
  const std::string garbage = "\xff\xff\xff not a protobuf";
  const std::string digest = cache->Publish(Pub(kKey, 4, garbage))->digest;
  // Intact bytes that are no artifact: not quarantined, so the second
  // attempt finds them again, and the probe ends in a miss.
  auto found = cache->Probe(BySignature(4));
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->quarantined, 0);
  ASSERT_EQ(found->unreadable.size(), 2u);
  EXPECT_NE(found->unreadable[0].message().find("does not parse"), std::string::npos);
  EXPECT_EQ(found->lookup.outcome, v1::GUARD_MISS);
  EXPECT_TRUE(found->lookup.digest.empty());
  EXPECT_FALSE(found->artifact.has_value());
  EXPECT_TRUE(cache->ReadArtifact(digest).ok());

  ASSERT_TRUE(cache->Evict("", kKey).ok());
  ASSERT_TRUE(cache->Publish(Pub(kKey, 4, ArtifactBytes(4, 2))).ok());
  auto newer = cache->Probe(BySignature(4));
  EXPECT_TRUE(absl::IsFailedPrecondition(newer.status())) << newer.status();
}

}  // namespace
}  // namespace kiln::cache
