// Running a native compiler (g++, the NVRTC helper) for the code
// generators: scratch files that are deleted, and a child process in a
// process group of its own under a time limit, killed on cancellation.
//
// Internal to compiler/codegen. Thread-safe.
#ifndef KILN_COMPILER_CODEGEN_TOOLCHAIN_H_
#define KILN_COMPILER_CODEGEN_TOOLCHAIN_H_

#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kiln::codegen {

// A file that is deleted when this goes out of scope.
class TempFile {
 public:
  static absl::StatusOr<TempFile> Create(const std::string& dir, const std::string& suffix) {
    std::string pattern = absl::StrCat(dir, "/kiln_XXXXXX", suffix);
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    const int fd = mkstemps(buf.data(), static_cast<int>(suffix.size()));
    if (fd < 0) {
      return absl::InternalError(
          absl::StrCat("cannot create a file in ", dir, ": ", std::strerror(errno)));
    }
    close(fd);
    return TempFile(std::string(buf.data()));
  }
  TempFile(TempFile&& o) noexcept : path_(std::move(o.path_)) { o.path_.clear(); }
  TempFile& operator=(TempFile&&) = delete;
  ~TempFile() {
    if (!path_.empty()) unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

absl::Status WriteFile(const std::string& path, const std::string& data);
absl::StatusOr<std::string> ReadFile(const std::string& path);

struct CommandResult {
  int wait_status = 0;
  std::string log;  // stdout and stderr together
};

// Runs argv[0] (searched in PATH unless it holds a '/') with stdin from
// /dev/null and its output captured, in a process group of its own. Past
// `timeout` the whole group (g++ and the cc1plus, as and ld it started) is
// killed: DEADLINE_EXCEEDED; when `cancel` turns true, CANCELLED.
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         absl::Duration timeout, const std::atomic<bool>* cancel);

// Compiler processes that serve request after request (kiln_nvrtc
// --serve), each in a process group of its own with one socket for its
// stdin and stdout. A request is written to an idle worker (one is started
// when none is idle); its reply is "RC LOG_BYTES\n" and the log. Workers that
// served go back to the idle list, up to `max_idle` of them; the rest end, as
// does a worker after `max_requests` (whatever a compiler keeps between
// requests cannot grow without bound). Thread-safe.
class CompilerWorkers {
 public:
  CompilerWorkers(std::vector<std::string> argv, int max_idle, int max_requests = 256)
      : argv_(std::move(argv)), max_idle_(max_idle), max_requests_(max_requests) {}
  ~CompilerWorkers();
  CompilerWorkers(const CompilerWorkers&) = delete;
  CompilerWorkers& operator=(const CompilerWorkers&) = delete;

  // The reply as RunCommand gives a result (wait_status: exited with RC).
  // Past `timeout`, or when `cancel` turns true, the worker is killed:
  // DEADLINE_EXCEEDED or CANCELLED. UNAVAILABLE when no worker could answer
  // (it did not start, died, or replied what is not a reply): the caller
  // runs the compiler once instead, which says what is wrong.
  absl::StatusOr<CommandResult> Run(const std::string& request, absl::Duration timeout,
                                    const std::atomic<bool>* cancel);

  int64_t started() const;  // workers started so far

 private:
  struct Worker {
    pid_t pid = 0;
    int fd = -1;
    int served = 0;
  };
  absl::StatusOr<Worker> Start();
  static void End(Worker w, bool kill_it);

  const std::vector<std::string> argv_;
  const int max_idle_;
  const int max_requests_;
  mutable absl::Mutex mu_;
  std::vector<Worker> idle_ ABSL_GUARDED_BY(mu_);
  int64_t started_ ABSL_GUARDED_BY(mu_) = 0;
};

// Where the NVRTC helper is: `configured`, else kiln_nvrtc beside the
// running program, else the build tree's.
std::string NvrtcHelper(const std::string& configured);

// The serving NVRTC helpers (`helper` [--fast-compile=LEVEL] --serve) of
// this process, for the CUDA backend: at most kMaxIdleNvrtcWorkers wait
// between compiles (per helper and level).
inline constexpr int kMaxIdleNvrtcWorkers = 16;
CompilerWorkers& NvrtcWorkers(const std::string& helper, const std::string& fast_compile = "");

// Whether `run` exited with status 0.
bool Succeeded(const CommandResult& run);

// INTERNAL for a failed compiler run: `tool` and `command`, how it ended and
// the first lines of its log in the message, the whole log as the payload
// kCompilerLogPayload (codegen.h).
absl::Status CompilerFailed(const std::string& tool, const std::string& command,
                            const CommandResult& run);

}  // namespace kiln::codegen

#endif  // KILN_COMPILER_CODEGEN_TOOLCHAIN_H_
