// Tests of absl_tsan_shim.cc, built only in ThreadSanitizer builds: accesses
// ordered by absl::Mutex, absl::CondVar and absl::Notification (called from
// this executable, and from libgpr, which is how gRPC calls them) are not
// reported, and an unordered access still is.
//
// Each case runs in a child process (a death test) that exits with 0 on its
// own; TSan turns the exit status into 66 when it reported anything, with or
// without halt_on_error.

#include <grpc/support/sync.h>
#include <grpc/support/time.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::ExitedWithCode;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kIncrements = 10000;
constexpr int kTsanExitCode = 66;  // TSan's default exitcode

// Runs `body` on two threads at once.
void OnTwoThreads(const std::function<void()>& body) {
  std::thread a(body);
  std::thread b(body);
  a.join();
  b.join();
}

void ExpectNoReport(const std::function<void()>& body) {
  EXPECT_EXIT(
      {
        body();
        std::exit(0);
      },
      ExitedWithCode(0), Not(HasSubstr("ThreadSanitizer")));
}

class AbslTsanShimTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(AbslTsanShimTest, UnorderedIncrementIsReported) {
  EXPECT_EXIT(
      {
        int counter = 0;
        OnTwoThreads([&] {
          for (int i = 0; i < kIncrements; ++i) ++counter;
        });
        std::exit(0);
      },
      ExitedWithCode(kTsanExitCode), HasSubstr("ThreadSanitizer: data race"));
}

TEST_F(AbslTsanShimTest, MutexLockOrdersIncrements) {
  ExpectNoReport([] {
    absl::Mutex mu;
    int counter = 0;
    OnTwoThreads([&] {
      for (int i = 0; i < kIncrements; ++i) {
        absl::MutexLock lock(&mu);
        ++counter;
      }
    });
    if (counter != 2 * kIncrements) std::abort();
  });
}

TEST_F(AbslTsanShimTest, TryLockOrdersIncrements) {
  ExpectNoReport([] {
    absl::Mutex mu;
    int counter = 0;
    OnTwoThreads([&] {
      for (int i = 0; i < kIncrements;) {
        if (!mu.TryLock()) continue;
        ++counter;
        ++i;
        mu.Unlock();
      }
    });
  });
}

TEST_F(AbslTsanShimTest, CondVarHandsOffData) {
  ExpectNoReport([] {
    absl::Mutex mu;
    absl::CondVar cv;
    bool ready = false;  // guarded by mu
    int payload = 0;     // written before `ready`, read after it
    std::thread producer([&] {
      payload = 42;
      absl::MutexLock lock(&mu);
      ready = true;
      cv.Signal();
    });
    {
      absl::MutexLock lock(&mu);
      while (!ready) cv.WaitWithTimeout(&mu, absl::Seconds(1));
    }
    if (payload != 42) std::abort();
    producer.join();
  });
}

TEST_F(AbslTsanShimTest, AwaitConditionReadsGuardedState) {
  ExpectNoReport([] {
    absl::Mutex mu;
    int stage = 0;  // guarded by mu, read by the Condition
    std::thread other([&] {
      for (int i = 1; i <= 100; ++i) {
        absl::MutexLock lock(&mu);
        stage = i;
      }
    });
    {
      absl::MutexLock lock(&mu, absl::Condition(
                                    +[](int* s) { return *s == 100; }, &stage));
      if (stage != 100) std::abort();
    }
    other.join();
  });
}

TEST_F(AbslTsanShimTest, NotificationPublishes) {
  ExpectNoReport([] {
    absl::Notification waited;
    absl::Notification polled;
    int payload = 0;
    std::thread producer([&] {
      payload = 1;
      waited.Notify();
    });
    waited.WaitForNotification();
    payload = 2;
    std::thread polling_producer([&] {
      payload = 3;
      polled.Notify();
    });
    while (!polled.HasBeenNotified()) std::this_thread::yield();
    if (payload != 3) std::abort();
    producer.join();
    polling_producer.join();
  });
}

TEST_F(AbslTsanShimTest, StatusCopiesShareTheirMessageAcrossThreads) {
  ExpectNoReport([] {
    auto status = std::make_unique<absl::Status>(absl::InternalError("a message long enough"));
    std::thread other([copy = *status]() mutable {
      if (copy.message().empty()) std::abort();
      copy = absl::OkStatus();  // may drop the last reference
    });
    if (status->message().empty()) std::abort();
    status.reset();  // or this one does
    other.join();
  });
}

// gpr_mu_lock and gpr_cv_wait are absl::Mutex::Lock and CondVar::WaitWithDeadline
// called from inside libgpr: the shim must take calls from shared libraries.
TEST_F(AbslTsanShimTest, GprMutexFromLibgprOrdersIncrements) {
  ExpectNoReport([] {
    gpr_mu mu;
    gpr_mu_init(&mu);
    int counter = 0;
    OnTwoThreads([&] {
      for (int i = 0; i < kIncrements; ++i) {
        gpr_mu_lock(&mu);
        ++counter;
        gpr_mu_unlock(&mu);
      }
    });
    gpr_mu_destroy(&mu);
  });
}

TEST_F(AbslTsanShimTest, GprCondVarFromLibgprHandsOffData) {
  ExpectNoReport([] {
    gpr_mu mu;
    gpr_cv cv;
    gpr_mu_init(&mu);
    gpr_cv_init(&cv);
    bool ready = false;
    int payload = 0;
    std::thread producer([&] {
      payload = 42;
      gpr_mu_lock(&mu);
      ready = true;
      gpr_cv_signal(&cv);
      gpr_mu_unlock(&mu);
    });
    gpr_mu_lock(&mu);
    while (!ready) gpr_cv_wait(&cv, &mu, gpr_inf_future(GPR_CLOCK_MONOTONIC));
    gpr_mu_unlock(&mu);
    if (payload != 42) std::abort();
    producer.join();
    gpr_cv_destroy(&cv);
    gpr_mu_destroy(&mu);
  });
}

}  // namespace
