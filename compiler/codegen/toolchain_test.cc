// CompilerWorkers against small serving programs written in the shell: the
// protocol kiln_nvrtc --serve speaks, and what happens when a worker dies,
// hangs, or answers nonsense. (kiln_cuda_codegen_test drives the real
// kiln_nvrtc through the CUDA backend.)
#include "compiler/codegen/toolchain.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"

namespace kiln::codegen {
namespace {

// An executable shell script in the test's temporary directory.
std::string Script(const std::string& name, const std::string& body) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::trunc) << "#!/bin/sh\n" << body;
  chmod(path.c_str(), 0755);
  return path;
}

// Serves request after request: replies with exit code 0 and the three
// lines it read, joined by '|'.
const char kEcho[] =
    "while read a && read b && read c; do\n"
    "  log=\"$a|$b|$c\"\n"
    "  printf '0 %d\\n%s' \"${#log}\" \"$log\"\n"
    "done\n";

TEST(CompilerWorkers, AWorkerServesRequestAfterRequest) {
  CompilerWorkers workers({Script("echo_server", kEcho)}, 2);
  for (int i = 0; i < 3; ++i) {
    auto run = workers.Run("sm_90\nin" + std::to_string(i) + "\nout\n", absl::Seconds(10), nullptr);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_TRUE(Succeeded(*run));
    EXPECT_EQ(run->log, "sm_90|in" + std::to_string(i) + "|out");
  }
  EXPECT_EQ(workers.started(), 1);
}

TEST(CompilerWorkers, AWorkerEndsAfterItsLastRequest) {
  CompilerWorkers workers({Script("echo_server_2", kEcho)}, 2, /*max_requests=*/2);
  for (int i = 0; i < 5; ++i) {
    auto run = workers.Run("a\nb\nc\n", absl::Seconds(10), nullptr);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->log, "a|b|c");
  }
  EXPECT_EQ(workers.started(), 3);  // two requests each
}

TEST(CompilerWorkers, ConcurrentRequestsStartWorkersAndKeepAtMostMaxIdle) {
  CompilerWorkers workers({Script("slow_echo_server", std::string("sleep 0.2\n") + kEcho)}, 1);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&] {
      auto run = workers.Run("a\nb\nc\n", absl::Seconds(10), nullptr);
      if (run.ok() && run->log == "a|b|c") ++ok;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok.load(), 3);
  EXPECT_EQ(workers.started(), 3);
  // One stayed: the next request starts none.
  ASSERT_TRUE(workers.Run("a\nb\nc\n", absl::Seconds(10), nullptr).ok());
  EXPECT_EQ(workers.started(), 3);
}

TEST(CompilerWorkers, AFailedCompileIsItsExitCodeAndLog) {
  CompilerWorkers workers({Script("failing_server",
                                  "read a; read b; read c\n"
                                  "printf '1 5\\nerror'\n"
                                  "read a\n")},
                          2);
  auto run = workers.Run("a\nb\nc\n", absl::Seconds(10), nullptr);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_FALSE(Succeeded(*run));
  EXPECT_EQ(run->log, "error");
}

TEST(CompilerWorkers, AWorkerThatDiesIsUnavailableAndReplaced) {
  // Answers one request, then ends.
  CompilerWorkers workers(
      {Script("one_shot_server", "read a; read b; read c\nprintf '0 2\\nok'\n")}, 2);
  ASSERT_TRUE(workers.Run("a\nb\nc\n", absl::Seconds(10), nullptr).ok());
  // The idle worker is gone: this request finds it dead.
  auto second = workers.Run("a\nb\nc\n", absl::Seconds(10), nullptr);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  // The next one starts another.
  auto third = workers.Run("a\nb\nc\n", absl::Seconds(10), nullptr);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->log, "ok");
  EXPECT_EQ(workers.started(), 2);
}

TEST(CompilerWorkers, WhatIsNotAServerIsUnavailable) {
  for (const std::string& body :
       {std::string("exit 2\n"), std::string("read a; echo 'usage: no such flag'\n"),
        std::string("read a; read b; read c; printf '0 99999999999\\n'; sleep 5\n")}) {
    CompilerWorkers workers({Script("not_a_server", body)}, 2);
    auto run = workers.Run("a\nb\nc\n", absl::Seconds(10), nullptr);
    ASSERT_FALSE(run.ok()) << body;
    EXPECT_EQ(run.status().code(), absl::StatusCode::kUnavailable) << run.status();
  }
  CompilerWorkers missing({::testing::TempDir() + "/no_such_program"}, 2);
  auto run = missing.Run("a\nb\nc\n", absl::Seconds(10), nullptr);
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kUnavailable) << run.status();
}

TEST(CompilerWorkers, AHungWorkerIsKilledAtTheDeadlineOrOnCancel) {
  CompilerWorkers workers({Script("hung_server", "read a; read b; read c; sleep 60\n")}, 2);
  absl::Time start = absl::Now();
  auto run = workers.Run("a\nb\nc\n", absl::Milliseconds(300), nullptr);
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kDeadlineExceeded) << run.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(200));
    cancel = true;
  });
  start = absl::Now();
  run = workers.Run("a\nb\nc\n", absl::Seconds(30), &cancel);
  canceller.join();
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kCancelled) << run.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(workers.started(), 2);  // the killed ones were not kept
}

}  // namespace
}  // namespace kiln::codegen
