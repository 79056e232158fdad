// Structured request logs: one JSON object per line, appended to a file (or
// stderr for "-"), for the request log (every Compile and Lookup) and the
// audit log (every admin call: Freeze, Thaw, Evict, with the caller).
//
//   {"ts":"2026-11-24T20:20:01.123Z","rid":"5f0c...","rpc":"Compile","ns":"team-a",
//    "caller":"trainer","code":"OK","ms":812.4}
//
// The request id is the client's "x-request-id" metadata (at most 64
// printable characters), else one made here.
//
// Levels (kilnd --log_level): warning writes only the requests that failed;
// info every request; debug also the steps of each compile job, each begun
// and ended, so that a compile that hangs or crashes kilnd is the last one
// begun and not ended:
//
//   {"ts":"...","step":"compile","event":"begin","ns":"","key":"8fc8...","graph":"forward_0_0"}
//
// Thread-safe.
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

enum class LogLevel { kWarning, kInfo, kDebug };

// "warning", "info" or "debug"; INVALID_ARGUMENT otherwise.
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text);

class RequestLog {
 public:
  // "-" writes to stderr; any other path is appended to.
  static absl::StatusOr<std::unique_ptr<RequestLog>> Open(const std::string& path,
                                                          LogLevel level = LogLevel::kInfo);
  ~RequestLog();

  void Write(const RequestRecord& r);
  // A step of a compile job ("compile", "store"), at debug level.
  void Step(absl::string_view step, absl::string_view event, absl::string_view ns,
            absl::string_view key, absl::string_view graph, absl::string_view detail = "");
  bool debug() const { return level_ == LogLevel::kDebug; }

 private:
  RequestLog(FILE* f, bool owned, LogLevel level) : file_(f), owned_(owned), level_(level) {}
  void WriteLine(const std::string& line);
  absl::Mutex mu_;
  FILE* const file_ ABSL_PT_GUARDED_BY(mu_);
  const bool owned_;
  const LogLevel level_;
};

// The caller's x-request-id, sanitized, or a new random id.
std::string RequestId(const grpc::ServerContextBase& ctx);

}  // namespace kiln::server

#endif  // KILN_SERVER_REQUEST_LOG_H_
