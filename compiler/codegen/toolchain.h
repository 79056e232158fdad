// Running a native compiler (g++, the NVRTC helper) for the code
// generators: scratch files that are deleted, and a child process in a
// process group of its own under a time limit, killed on cancellation.
//
// Internal to compiler/codegen. Thread-safe.
#ifndef KILN_COMPILER_CODEGEN_TOOLCHAIN_H_
#define KILN_COMPILER_CODEGEN_TOOLCHAIN_H_

#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
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

// Whether `run` exited with status 0.
bool Succeeded(const CommandResult& run);

// INTERNAL for a failed compiler run: `tool` and `command`, how it ended and
// the first lines of its log in the message, the whole log as the payload
// kCompilerLogPayload (codegen.h).
absl::Status CompilerFailed(const std::string& tool, const std::string& command,
                            const CommandResult& run);

}  // namespace kiln::codegen

#endif  // KILN_COMPILER_CODEGEN_TOOLCHAIN_H_
