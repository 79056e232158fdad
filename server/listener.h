// kilnd's own accept loop for its plaintext port. gRPC 1.51's listener stops
// for good after one failed accept (EMFILE: about a thousand idle
// connections under the default open-file limit), so kilnd accepts
// connections itself and hands each to gRPC (AddInsecureChannelFromFd):
//   - an accept error never stops the loop: EMFILE, ENFILE and ENOMEM back off
//     and retry while the kernel queues new connections;
//   - near the process's open-file limit (fewer than `fd_reserve`, at most a
//     quarter of the limit, descriptors left, which RocksDB and the native
//     compiler need) a new connection is closed at once rather than handed
//     over.
//
// Thread-safe: Start and Stop from one thread; the loop runs on its own.
#ifndef KILN_SERVER_LISTENER_H_
#define KILN_SERVER_LISTENER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "grpcpp/server.h"

namespace kiln::server {

class Listener {
 public:
  // Binds and listens on "host:port" (port 0 picks one).
  static absl::StatusOr<std::unique_ptr<Listener>> Bind(const std::string& address);
  ~Listener();

  int port() const { return port_; }
  // Connections refused because the open-file limit was near.
  uint64_t shed() const { return shed_.load(); }

  // Accepts into `server` (started, with no listening port of its own) until
  // Stop. `server` must outlive Stop.
  void Start(grpc::Server* server, int fd_reserve = 128);
  void Stop();

 private:
  Listener(int fd, int port, int wake_read, int wake_write);
  void Loop(grpc::Server* server, int fd_reserve);

  const int fd_;
  const int port_;
  const int wake_read_, wake_write_;
  std::atomic<uint64_t> shed_{0};
  std::thread thread_;
};

// Raises the soft open-file limit to the hard one; returns the new soft limit.
int64_t RaiseOpenFileLimit();

}  // namespace kiln::server

#endif  // KILN_SERVER_LISTENER_H_
