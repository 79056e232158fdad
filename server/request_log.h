// Structured request logs: one JSON object per line, appended to a file (or
// stderr for "-"), for the request log (every Compile and Lookup) and the
// audit log (every admin call: Freeze, Thaw, Evict, with the caller).
//
//   {"ts":"2026-11-24T20:20:01.123Z","rid":"5f0c...","rpc":"Compile","ns":"team-a",
//    "caller":"trainer","code":"OK","ms":812.4}
//
// The request id is the client's "x-request-id" metadata (at most 64
// printable characters), else one made here. Thread-safe.
#ifndef KILN_SERVER_REQUEST_LOG_H_
#define KILN_SERVER_REQUEST_LOG_H_

#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"

namespace kiln::server {

struct RequestRecord {
  std::string rid;
  std::string rpc;
  std::string ns;
  std::string caller;
  absl::StatusCode code = absl::StatusCode::kOk;
  absl::Duration elapsed;
  std::string detail;  // optional (an evicted key, ...)
};

class RequestLog {
 public:
  // "-" writes to stderr; any other path is appended to.
  static absl::StatusOr<std::unique_ptr<RequestLog>> Open(const std::string& path);
  ~RequestLog();

  void Write(const RequestRecord& r);

 private:
  RequestLog(FILE* f, bool owned) : file_(f), owned_(owned) {}
  absl::Mutex mu_;
  FILE* const file_ ABSL_PT_GUARDED_BY(mu_);
  const bool owned_;
};

// The caller's x-request-id, sanitized, or a new random id.
std::string RequestId(const grpc::ServerContextBase& ctx);

}  // namespace kiln::server

#endif  // KILN_SERVER_REQUEST_LOG_H_
