#include "tests/integration/kilnd_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace kiln::testing {

int ConnectLoopback(const std::string& address) {
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string RunShell(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "exit -1";
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  return out + "\nexit " + std::to_string(pclose(pipe));
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/kiln_test.XXXXXX";
  char* p = mkdtemp(tmpl);
  if (p == nullptr) std::abort();
  path_ = p;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

KilndProcess::KilndProcess(const std::string& data_dir, std::vector<std::string> extra) {
  int out[2];
  if (pipe(out) != 0) std::abort();
  const char* binary = std::getenv("KILND");  // another kilnd, or a wrapper (taskset)
  std::vector<std::string> args = {binary != nullptr && *binary != '\0' ? binary : KILND_PATH,
                                   "--listen=127.0.0.1:0", "--data_dir=" + data_dir};
  args.insert(args.end(), extra.begin(), extra.end());
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ == 0) {
    // kilnd dies with the test: a test ended by a crash or by a sanitizer
    // report (halt_on_error) would otherwise leave it running, holding
    // ctest's output pipe open until the test's timeout.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  FILE* f = fdopen(out[0], "r");
  char line[256];
  const std::string prefix = "kilnd listening on ";
  const std::string metrics_prefix = "kilnd metrics on ";
  auto rest = [](const char* text, size_t skip) {
    std::string s(text + skip);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    return s;
  };
  while (address_.empty()) {
    if (fgets(line, sizeof(line), f) == nullptr) {
      std::fprintf(stderr, "kilnd did not start (data_dir %s)\n", data_dir.c_str());
      std::abort();
    }
    if (std::string(line).rfind(metrics_prefix, 0) == 0) {
      metrics_address_ = rest(line, metrics_prefix.size());
    } else if (std::string(line).rfind(prefix, 0) == 0) {
      address_ = rest(line, prefix.size());
    }
  }
  fclose(f);
}

KilndProcess::~KilndProcess() {
  if (pid_ > 0) Kill();
}

int KilndProcess::Terminate() {
  SendTerm();
  return Wait();
}

void KilndProcess::SendTerm() { kill(pid_, SIGTERM); }

int KilndProcess::Wait() {
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void KilndProcess::Kill() {
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

}  // namespace kiln::testing
