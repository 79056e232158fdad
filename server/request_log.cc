#include "server/request_log.h"

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace kiln::server {
namespace {

// A JSON string literal of `s` (request text is hostile: every byte outside
// printable ASCII, quotes and backslashes are escaped).
std::string Json(absl::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c > 0x7e) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace

absl::StatusOr<std::unique_ptr<RequestLog>> RequestLog::Open(const std::string& path) {
  if (path == "-") return std::unique_ptr<RequestLog>(new RequestLog(stderr, false));
  FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open log ", path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<RequestLog>(new RequestLog(f, true));
}

RequestLog::~RequestLog() {
  if (owned_) std::fclose(file_);
}

void RequestLog::Write(const RequestRecord& r) {
  std::string line = absl::StrCat(
      "{\"ts\":", Json(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone())),
      ",\"rid\":", Json(r.rid), ",\"rpc\":", Json(r.rpc), ",\"ns\":", Json(r.ns),
      ",\"caller\":", Json(r.caller), ",\"code\":", Json(absl::StatusCodeToString(r.code)),
      absl::StrFormat(",\"ms\":%.3f", absl::ToDoubleMilliseconds(r.elapsed)));
  if (!r.detail.empty()) absl::StrAppend(&line, ",\"detail\":", Json(r.detail));
  line += "}\n";
  absl::MutexLock l(&mu_);
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

std::string RequestId(const grpc::ServerContextBase& ctx) {
  const auto& metadata = ctx.client_metadata();
  auto it = metadata.find("x-request-id");
  if (it != metadata.end()) {
    std::string id;
    for (char c : absl::string_view(it->second.data(), it->second.size()).substr(0, 64)) {
      id += (c > 0x20 && c < 0x7f) ? c : '?';
    }
    if (!id.empty()) return id;
  }
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("%016x", rng());
}

}  // namespace kiln::server
