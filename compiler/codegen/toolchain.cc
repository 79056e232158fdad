#include "compiler/codegen/toolchain.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "compiler/codegen/codegen.h"

extern char** environ;

namespace kiln::codegen {

absl::Status WriteFile(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
  f.close();
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::InternalError(absl::StrCat("cannot read ", path));
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

namespace {

// Starts argv[0] (searched in PATH unless it holds a '/') in a process group
// of its own, with `in`, `out` and `err` as its descriptors 0, 1 and 2 (-1:
// /dev/null). Returns posix_spawnp's result, 0 on success.
int SpawnInGroup(const std::vector<std::string>& argv, int in, int out, int err, pid_t* pid) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  const int fds[3] = {in, out, err};
  for (int target = 0; target < 3; ++target) {
    if (fds[target] < 0) {
      posix_spawn_file_actions_addopen(&actions, target, "/dev/null",
                                       target == 0 ? O_RDONLY : O_WRONLY, 0);
    } else {
      posix_spawn_file_actions_adddup2(&actions, fds[target], target);
    }
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int rc = posix_spawnp(pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  return rc;
}

}  // namespace

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         absl::Duration timeout, const std::atomic<bool>* cancel) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  pid_t pid = 0;
  const int rc = SpawnInGroup(argv, -1, fds[1], fds[1], &pid);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return absl::InternalError(absl::StrCat("cannot run ", argv[0], ": ", std::strerror(rc)));
  }
  CommandResult result;
  const absl::Time deadline = absl::Now() + timeout;
  bool timed_out = false, cancelled = false;
  char chunk[4096];
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      timed_out = true;
      break;
    }
    if (cancel != nullptr && cancel->load()) {
      cancelled = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    // Wakes at least every 100 ms to look at `cancel`.
    const int wait_ms = static_cast<int>(
        std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, cancel != nullptr ? 100 : 1 << 30));
    const int ready = poll(&p, 1, wait_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue;  // the deadline is checked above
    const ssize_t got = read(fds[0], chunk, sizeof chunk);
    if (got > 0) {
      result.log.append(chunk, static_cast<size_t>(got));
    } else if (got == 0 || errno != EINTR) {
      break;
    }
  }
  close(fds[0]);
  if (timed_out || cancelled) kill(-pid, SIGKILL);
  while (waitpid(pid, &result.wait_status, 0) < 0) {
    if (errno != EINTR) {
      return absl::InternalError(absl::StrCat("waitpid: ", std::strerror(errno)));
    }
  }
  if (cancelled) {
    return absl::CancelledError(
        absl::StrCat(argv[0], " was killed: nobody waits for this compile any more"));
  }
  if (timed_out) {
    return absl::DeadlineExceededError(absl::StrCat(
        argv[0], " ran past its time limit of ", absl::FormatDuration(timeout), " and was killed"));
  }
  return result;
}

// ---------------------------------------------------------------------------

CompilerWorkers::~CompilerWorkers() {
  absl::MutexLock lock(&mu_);
  for (Worker& w : idle_) End(w, /*kill_it=*/false);
  idle_.clear();
}

int64_t CompilerWorkers::started() const {
  absl::MutexLock lock(&mu_);
  return started_;
}

absl::StatusOr<CompilerWorkers::Worker> CompilerWorkers::Start() {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return absl::UnavailableError(absl::StrCat("socketpair: ", std::strerror(errno)));
  }
  Worker w;
  const int rc = SpawnInGroup(argv_, sv[1], sv[1], -1, &w.pid);
  close(sv[1]);
  if (rc != 0) {
    close(sv[0]);
    return absl::UnavailableError(absl::StrCat("cannot run ", argv_[0], ": ", std::strerror(rc)));
  }
  w.fd = sv[0];
  absl::MutexLock lock(&mu_);
  ++started_;
  return w;
}

void CompilerWorkers::End(Worker w, bool kill_it) {
  // Without kill_it the worker ends at the end of its stdin.
  close(w.fd);
  if (kill_it) kill(-w.pid, SIGKILL);
  int status = 0;
  while (waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
  }
}

absl::StatusOr<CommandResult> CompilerWorkers::Run(const std::string& request,
                                                   absl::Duration timeout,
                                                   const std::atomic<bool>* cancel) {
  Worker w;
  {
    absl::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      w = idle_.back();
      idle_.pop_back();
    }
  }
  if (w.pid == 0) {
    ASSIGN_OR_RETURN(w, Start());
  }
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(w.fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      End(w, /*kill_it=*/true);
      return absl::UnavailableError(absl::StrCat(argv_[0], " took no request"));
    }
    sent += static_cast<size_t>(n);
  }
  const absl::Time deadline = absl::Now() + timeout;
  std::string reply;
  size_t header = std::string::npos;  // where the log begins
  size_t log_bytes = 0;
  int exit_code = 0;
  char chunk[4096];
  while (header == std::string::npos || reply.size() < header + log_bytes) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      End(w, /*kill_it=*/true);
      return absl::DeadlineExceededError(absl::StrCat(argv_[0], " ran past its time limit of ",
                                                      absl::FormatDuration(timeout),
                                                      " and was killed"));
    }
    if (cancel != nullptr && cancel->load()) {
      End(w, /*kill_it=*/true);
      return absl::CancelledError(
          absl::StrCat(argv_[0], " was killed: nobody waits for this compile any more"));
    }
    pollfd p{w.fd, POLLIN, 0};
    const int wait_ms = static_cast<int>(
        std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, cancel != nullptr ? 100 : 1 << 30));
    const int ready = poll(&p, 1, wait_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue;
    const ssize_t got = read(w.fd, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      End(w, /*kill_it=*/true);
      return absl::UnavailableError(absl::StrCat(argv_[0], " ended without a reply"));
    }
    reply.append(chunk, static_cast<size_t>(got));
    if (header == std::string::npos) {
      const size_t eol = reply.find('\n');
      if (eol == std::string::npos) {
        if (reply.size() <= 64) continue;
      } else {
        std::vector<absl::string_view> words =
            absl::StrSplit(absl::string_view(reply).substr(0, eol), absl::MaxSplits(' ', 1));
        uint64_t bytes = 0;
        if (words.size() == 2 && absl::SimpleAtoi(words[0], &exit_code) && exit_code >= 0 &&
            exit_code < 256 && absl::SimpleAtoi(words[1], &bytes) && bytes < (64u << 20)) {
          header = eol + 1;
          log_bytes = static_cast<size_t>(bytes);
          continue;
        }
      }
      End(w, /*kill_it=*/true);
      return absl::UnavailableError(absl::StrCat(argv_[0], " replied what is not a reply"));
    }
  }
  CommandResult result;
  result.wait_status = exit_code << 8;  // as waitpid reports exit(exit_code)
  result.log = reply.substr(header, log_bytes);
  if (reply.size() > header + log_bytes) {
    End(w, /*kill_it=*/true);  // more than it was asked for: not to be trusted again
    return result;
  }
  absl::MutexLock lock(&mu_);
  if (++w.served < max_requests_ && static_cast<int>(idle_.size()) < max_idle_) {
    idle_.push_back(w);
  } else {
    End(w, /*kill_it=*/false);
  }
  return result;
}

bool Succeeded(const CommandResult& run) {
  return WIFEXITED(run.wait_status) && WEXITSTATUS(run.wait_status) == 0;
}

absl::Status CompilerFailed(const std::string& tool, const std::string& command,
                            const CommandResult& run) {
  const std::string how = WIFEXITED(run.wait_status)
                              ? absl::StrCat("exit status ", WEXITSTATUS(run.wait_status))
                              : absl::StrCat("signal ", WTERMSIG(run.wait_status));
  std::vector<absl::string_view> lines = absl::StrSplit(run.log, '\n', absl::SkipEmpty());
  constexpr size_t kShown = 20;
  std::string head =
      absl::StrJoin(lines.begin(), lines.begin() + std::min(lines.size(), kShown), "\n");
  if (lines.size() > kShown) {
    absl::StrAppend(&head, "\n... ", lines.size() - kShown, " more lines in the status payload ",
                    kCompilerLogPayload);
  }
  absl::Status status =
      absl::InternalError(absl::StrCat(tool, " failed (", how, "): ", command, "\n", head));
  status.SetPayload(kCompilerLogPayload, absl::Cord(run.log));
  return status;
}

}  // namespace kiln::codegen
