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

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text) {
  if (text == "warning") return LogLevel::kWarning;
  if (text == "info") return LogLevel::kInfo;
  if (text == "debug") return LogLevel::kDebug;
  return absl::InvalidArgumentError(
      absl::StrCat("log_level: '", text.substr(0, 64), "' is not one of warning, info, debug"));
}

absl::StatusOr<std::unique_ptr<RequestLog>> RequestLog::Open(const std::string& path,
                                                             LogLevel level) {
  if (path == "-") return std::unique_ptr<RequestLog>(new RequestLog(stderr, false, level));
  FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open log ", path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<RequestLog>(new RequestLog(f, true, level));
}

RequestLog::~RequestLog() {
  if (owned_) std::fclose(file_);
}

void RequestLog::Write(const RequestRecord& r) {
  if (level_ == LogLevel::kWarning && r.code == absl::StatusCode::kOk) return;
  std::string line = absl::StrCat(
      "{\"ts\":", Json(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone())),
      ",\"rid\":", Json(r.rid), ",\"rpc\":", Json(r.rpc), ",\"ns\":", Json(r.ns),
      ",\"caller\":", Json(r.caller), ",\"code\":", Json(absl::StatusCodeToString(r.code)),
      absl::StrFormat(",\"ms\":%.3f", absl::ToDoubleMilliseconds(r.elapsed)));
  if (!r.detail.empty()) absl::StrAppend(&line, ",\"detail\":", Json(r.detail));
  WriteLine(line + "}\n");
}

void RequestLog::Step(absl::string_view step, absl::string_view event, absl::string_view ns,
                      absl::string_view key, absl::string_view graph, absl::string_view detail) {
  if (level_ != LogLevel::kDebug) return;
  std::string line = absl::StrCat(
      "{\"ts\":", Json(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone())),
      ",\"step\":", Json(step), ",\"event\":", Json(event), ",\"ns\":", Json(ns),
      ",\"key\":", Json(key), ",\"graph\":", Json(graph.substr(0, 256)));
  if (!detail.empty()) absl::StrAppend(&line, ",\"detail\":", Json(detail.substr(0, 1024)));
  WriteLine(line + "}\n");
}

void RequestLog::WriteLine(const std::string& line) {
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
