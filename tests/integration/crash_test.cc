// kill -9 during a stream of compiles, round after round on one data
// directory: every compile kilnd acknowledged before it died is found after
// the restart, and kilnd starts every time.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "client/client.h"
#include "tests/integration/graphs.h"
#include "tests/integration/kilnd_process.h"

namespace kiln::testing {
namespace {

constexpr int kRounds = 10;

std::unique_ptr<Client> Connect(const KilndProcess& kilnd) {
  ClientOptions o;
  o.address = kilnd.address();
  o.deadline = absl::Seconds(10);
  o.max_attempts = 1;  // a dead server is an answer here, not something to retry
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

TEST(CrashTest, AcknowledgedCompilesSurviveKillNine) {
  TempDir dir;
  std::mt19937 rng(20261124);
  std::vector<v1::Graph> acknowledged;
  int salt = 0;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    KilndProcess kilnd(dir.path());
    auto client = Connect(kilnd);
    ASSERT_NE(client, nullptr);
    // What earlier rounds acknowledged is all there.
    for (const v1::Graph& g : acknowledged) {
      v1::LookupRequest r;
      *r.mutable_graph() = g;
      auto found = client->Lookup(r);
      ASSERT_TRUE(found.ok()) << found.status();
      EXPECT_EQ(found->outcome(), v1::HIT) << found->reason();
    }
    // A stream of compiles, killed at a random moment.
    std::atomic<bool> stop{false};
    std::atomic<int> acked{0};
    std::vector<v1::Graph> acked_now;
    std::thread stream([&] {
      while (!stop.load()) {
        v1::CompileRequest r;
        *r.mutable_graph() = ChainGraph(6, 8, ++salt);
        r.mutable_options()->set_backend("eager");
        auto done = client->Compile(r);
        if (!done.ok()) break;  // killed
        acked_now.push_back(r.graph());
        ++acked;
      }
    });
    // The kill comes at a random moment once the stream is under way (its
    // first compile acknowledged): on a loaded machine a restarted kilnd's
    // first compile has taken longer than the whole window.
    const absl::Time under_way = absl::Now() + absl::Seconds(30);
    while (acked.load() == 0 && absl::Now() < under_way) absl::SleepFor(absl::Milliseconds(1));
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(100, 400)(rng)));
    kilnd.Kill();
    stop = true;
    stream.join();
    EXPECT_GT(acked_now.size(), 0u);
    acknowledged.insert(acknowledged.end(), acked_now.begin(), acked_now.end());
  }
  KilndProcess kilnd(dir.path());
  auto client = Connect(kilnd);
  ASSERT_NE(client, nullptr);
  int found = 0;
  for (const v1::Graph& g : acknowledged) {
    v1::LookupRequest r;
    *r.mutable_graph() = g;
    auto hit = client->Lookup(r);
    found += hit.ok() && hit->outcome() == v1::HIT ? 1 : 0;
  }
  EXPECT_EQ(found, static_cast<int>(acknowledged.size()));
  std::printf("crash test: %d rounds, %zu compiles acknowledged, %d found\n", kRounds,
              acknowledged.size(), found);
  EXPECT_EQ(kilnd.Terminate(), 0);
}

}  // namespace
}  // namespace kiln::testing
