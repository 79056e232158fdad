#include "server/listener.h"

#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/server_posix.h"

namespace kiln::server {
namespace {

// Descriptors this process has open.
int64_t OpenFiles() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return 0;
  int64_t n = 0;
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n - 3;  // ".", ".." and the directory's own descriptor
}

int64_t SoftOpenFileLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return 1 << 20;
  return static_cast<int64_t>(r.rlim_cur);
}

}  // namespace

int64_t RaiseOpenFileLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
  return SoftOpenFileLimit();
}

absl::StatusOr<std::unique_ptr<Listener>> Listener::Bind(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen: '", address.substr(0, 200), "' is not host:port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen: cannot resolve '", host.substr(0, 200), "': ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addrs(found, freeaddrinfo);
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 4096) != 0) {
      last_error = std::strerror(errno);
      close(fd);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
    const int bound_port = bound.ss_family == AF_INET6
                               ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                               : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    int wake[2];
    if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
      close(fd);
      return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
    }
    return std::unique_ptr<Listener>(new Listener(fd, bound_port, wake[0], wake[1]));
  }
  return absl::UnavailableError(
      absl::StrCat("listen: cannot listen on ", address.substr(0, 200), ": ", last_error));
}

Listener::Listener(int fd, int port, int wake_read, int wake_write)
    : fd_(fd), port_(port), wake_read_(wake_read), wake_write_(wake_write) {}

Listener::~Listener() {
  Stop();
  close(fd_);
  close(wake_read_);
  close(wake_write_);
}

void Listener::Start(grpc::Server* server, int fd_reserve) {
  thread_ = std::thread([this, server, fd_reserve] { Loop(server, fd_reserve); });
}

void Listener::Stop() {
  if (!thread_.joinable()) return;
  const char byte = 1;
  (void)!write(wake_write_, &byte, 1);
  thread_.join();
}

void Listener::Loop(grpc::Server* server, int fd_reserve) {
  absl::Duration backoff = absl::Milliseconds(10);
  while (true) {
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) {
      absl::SleepFor(absl::Milliseconds(10));
      continue;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) {
        // Out of descriptors or memory: the connection waits in the backlog
        // while others close.
        std::fprintf(stderr, "kilnd: accept: %s; retrying in %s\n", std::strerror(errno),
                     absl::FormatDuration(backoff).c_str());
        absl::SleepFor(backoff);
        backoff = std::min(backoff * 2, absl::Seconds(1));
      }
      continue;  // EAGAIN, ECONNABORTED, EINTR...: the next one
    }
    backoff = absl::Milliseconds(10);
    const int64_t limit = SoftOpenFileLimit();
    if (OpenFiles() > limit - std::min<int64_t>(fd_reserve, limit / 4)) {
      ++shed_;
      close(conn);
      continue;
    }
    const int one = 1;
    setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    grpc::AddInsecureChannelFromFd(server, conn);
  }
}

}  // namespace kiln::server
