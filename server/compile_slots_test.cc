// CompileSlots: how many compiles run at once, and how many wait.
#include "server/compile_slots.h"

#include <gtest/gtest.h>

#include <atomic>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/time/clock.h"

namespace kiln::server {
namespace {

// Waits until `slots` has `n` callers waiting.
void AwaitWaiting(const CompileSlots& slots, int n) {
  while (slots.waiting() != n) absl::SleepFor(absl::Milliseconds(1));
}

TEST(CompileSlotsTest, RunsWorkersAtOnceQueuesTheDepthAndRefusesBeyond) {
  CompileSlots slots(/*workers=*/1, /*queue_depth=*/1);
  std::optional<absl::StatusOr<CompileSlots::Slot>> first(slots.Acquire(nullptr));
  ASSERT_TRUE(first->ok());
  EXPECT_TRUE((*first)->held());

  std::atomic<bool> second_held{false};
  std::thread second([&] {
    auto slot = slots.Acquire(nullptr);
    ASSERT_TRUE(slot.ok());
    second_held = slot->held();
  });
  AwaitWaiting(slots, 1);
  auto third = slots.Acquire(nullptr);
  EXPECT_TRUE(absl::IsResourceExhausted(third.status()));
  EXPECT_TRUE(absl::StrContains(third.status().message(),
                                "the compile queue (compile_queue_depth) is full (1 waiting)"))
      << third.status();
  EXPECT_FALSE(second_held);

  first.reset();  // gives the slot back: the waiting one gets it
  second.join();
  EXPECT_TRUE(second_held);
  EXPECT_EQ(slots.waiting(), 0);
  // Every slot is free again.
  auto again = slots.Acquire(nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->held());
}

TEST(CompileSlotsTest, AWaitGivenUpEndsWithoutASlot) {
  CompileSlots slots(/*workers=*/1, /*queue_depth=*/4);
  auto held = slots.Acquire(nullptr);
  ASSERT_TRUE(held.ok());
  std::atomic<bool> give_up{false};
  std::atomic<int> outcome{-1};
  std::thread waiter([&] {
    auto slot = slots.Acquire(&give_up);
    outcome = slot.ok() ? (slot->held() ? 1 : 0) : 2;
  });
  AwaitWaiting(slots, 1);
  give_up = true;
  waiter.join();
  EXPECT_EQ(outcome, 0);
  EXPECT_EQ(slots.waiting(), 0);
}

}  // namespace
}  // namespace kiln::server
