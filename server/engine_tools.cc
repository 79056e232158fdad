// The Engine's troubleshooting tools (docs/troubleshooting.md): request
// options (the function filter, injected faults), failed compiles kept for
// replay and minified in the background, graph-break reports.
#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/minify.h"
#include "common/status_macros.h"
#include "compiler/pipeline/fault.h"
#include "re2/re2.h"
#include "server/engine.h"

namespace kiln::server {
namespace {

constexpr size_t kMaxFunctionFilterBytes = 1024;
// What a failed compile's record keeps (record and replay).
constexpr size_t kMaxRecordedRequestBytes = 4 << 20;
constexpr size_t kMaxRecordedTraceBytes = 1 << 20;
// A graph report's parts (graph breaks): at most 128 jobs of 256 graphs of
// about 1.8 KiB each are held in memory, under 60 MiB.
constexpr size_t kMaxReportReasonBytes = 512;
constexpr int kMaxReportFrames = 8;
constexpr size_t kMaxReportFrameBytes = 160;

}  // namespace

absl::StatusOr<Engine::Filter> Engine::ApplyRequestOptions(const ir::Graph& graph,
                                                           v1::CompileOptions* options) const {
  std::string fault = options_.inject_fault, filter = options_.debug_function;
  bool fault_given = false;
  std::set<std::string> seen;
  for (const auto& o : options->options()) {
    if (!seen.insert(o.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("options.options: '", o.name().substr(0, 64), "' is given twice"));
    }
    if (o.name() == kInjectFaultOption) {
      if (absl::Status s = pipeline::ParseFault(o.value()).status(); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("options.options: ", s.message()));
      }
      fault_given = true;
    } else if (o.name() == kDebugFunctionOption) {
      filter = o.value();
    } else if (o.name() == kAutotuneOption) {
      if (o.value() != "on" && o.value() != "off") {
        return absl::InvalidArgumentError(absl::StrCat("options.options: ", kAutotuneOption, ": '",
                                                       o.value().substr(0, 64),
                                                       "' is not on or off"));
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("options.options: unknown option '", o.name().substr(0, 64), "' (known: ",
                       kAutotuneOption, ", ", kDebugFunctionOption, ", ", kInjectFaultOption, ")"));
    }
  }
  if (!fault.empty() && !fault_given) {
    auto* o = options->add_options();
    o->set_name(kInjectFaultOption);
    o->set_value(fault);
    std::sort(options->mutable_options()->begin(), options->mutable_options()->end(),
              [](const auto& a, const auto& b) { return a.name() < b.name(); });
  }
  if (filter.empty()) return Filter::kNone;
  ASSIGN_OR_RETURN(std::shared_ptr<const re2::RE2> re, CompileFunctionFilter(filter));
  if (re2::RE2::PartialMatch(graph.name(), *re)) return Filter::kMatched;
  options->set_backend("eager");
  return Filter::kEager;
}

absl::StatusOr<std::shared_ptr<const re2::RE2>> CompileFunctionFilter(const std::string& pattern) {
  if (pattern.size() > kMaxFunctionFilterBytes) {
    return absl::InvalidArgumentError(absl::StrCat("debug_function: the pattern has ",
                                                   pattern.size(), " bytes; the limit is ",
                                                   kMaxFunctionFilterBytes));
  }
  re2::RE2::Options o;
  o.set_log_errors(false);
  o.set_max_mem(1 << 20);
  auto re = std::make_shared<const re2::RE2>(pattern, o);
  if (!re->ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("debug_function: '", pattern, "' is not a regular expression: ", re->error()));
  }
  return re;
}

void Engine::PersistFailure(const v1::CompileRequest& req, const std::string& key,
                            const absl::Status& error,
                            const std::map<std::string, std::string>* trace) {
  if (req.namespace_() == kMinifyNamespace) return;
  v1::FailedCompile f;
  const int64_t now = absl::ToUnixMicros(absl::Now());
  int64_t id = last_failure_id_.load();
  while (!last_failure_id_.compare_exchange_weak(id, std::max(id + 1, now))) {
  }
  f.set_id(absl::StrFormat("%016x", std::max(id + 1, now)));
  f.set_unix_micros(now);
  f.set_error(std::string(error.message()));
  f.set_code(absl::StatusCodeToString(error.code()));
  f.set_key(key);
  f.set_namespace_(req.namespace_());
  f.set_compiler_version(KILN_COMPILER_VERSION);
  f.set_graph_name(req.graph().name().substr(0, 256));
  *f.mutable_request() = req;
  if (req.ByteSizeLong() > kMaxRecordedRequestBytes) {
    f.mutable_request()->clear_graph();
    f.set_request_dropped(true);
  }
  size_t budget = kMaxRecordedTraceBytes;
  for (const auto& [name, text] : trace ? *trace : std::map<std::string, std::string>{}) {
    if (text.size() > budget) continue;
    budget -= text.size();
    (*f.mutable_trace())[name] = text;
  }
  // A failure to keep the record must not change the reply.
  if (!cache_->RecordFailure(f).ok()) return;
  if (options_.minify_failures && error.code() == absl::StatusCode::kInternal && !key.empty() &&
      !f.request_dropped() && !frozen_) {
    MinifyInBackground(f);
  }
}

void Engine::MinifyInBackground(const v1::FailedCompile& f) {
  absl::MutexLock l(&minify_mu_);
  if (minifying_) return;  // one at a time: a burst of failures minifies its first
  if (minifier_.joinable()) minifier_.join();
  minifying_ = true;
  minifier_ = std::thread([this, f] {
    v1::CompileRequest request = f.request();
    request.set_namespace_(kMinifyNamespace);
    auto m = MinifyCompileError(
        [this](const v1::CompileRequest& r) -> absl::StatusOr<v1::CompileResponse> {
          if (stopping_) return absl::CancelledError("kilnd is stopping");
          return Compile(r);
        },
        request, "graph");
    if (m.ok()) {
      auto record = cache_->GetFailure(f.namespace_(), f.id());
      if (record.ok()) {
        *record->mutable_minified()->mutable_graph() = m->request.graph();
        *record->mutable_minified()->mutable_options() = m->request.options();
        record->set_minified_error(std::string(m->error.message()));
        (void)cache_->RecordFailure(*record);
      }
    }
    absl::MutexLock done(&minify_mu_);
    minifying_ = false;
  });
}

absl::StatusOr<v1::ListFailuresResponse> Engine::ListFailures(const v1::ListFailuresRequest& req) {
  if (req.namespace_() != "*") RETURN_IF_ERROR(cache::ValidateNamespace(req.namespace_()));
  ASSIGN_OR_RETURN(std::vector<v1::FailedCompile> all, cache_->ListFailures(req.namespace_()));
  v1::ListFailuresResponse resp;
  for (v1::FailedCompile& f : all) {
    f.clear_trace();
    f.clear_request();
    *resp.add_failures() = std::move(f);
  }
  return resp;
}

absl::StatusOr<v1::GetFailureResponse> Engine::GetFailure(const v1::GetFailureRequest& req) {
  RETURN_IF_ERROR(cache::ValidateNamespace(req.namespace_()));
  if (req.id().size() != 16 || !std::all_of(req.id().begin(), req.id().end(),
                                            [](char c) { return absl::ascii_isxdigit(c); })) {
    return absl::InvalidArgumentError(
        absl::StrCat("id: '", req.id().substr(0, 64), "' is not 16 hex digits"));
  }
  v1::GetFailureResponse resp;
  ASSIGN_OR_RETURN(*resp.mutable_failure(), cache_->GetFailure(req.namespace_(), req.id()));
  return resp;
}

void Engine::RecordReport(const std::string& ns, const v1::GraphReport& report) {
  if (!cache::ValidateNamespace(ns).ok()) return;
  auto clip = [](const std::string& s, size_t n) { return s.substr(0, n); };
  v1::GraphReport r;
  r.set_job(report.job().empty() ? "(unnamed)" : clip(report.job(), 128));
  r.set_function(clip(report.function(), 256));
  r.set_graph(clip(report.graph(), 256));
  r.set_graph_break(report.graph_break());
  r.set_reason(clip(report.reason(), kMaxReportReasonBytes));
  for (int i = std::max(0, report.user_frames_size() - kMaxReportFrames);
       i < report.user_frames_size(); ++i) {
    r.add_user_frames(clip(report.user_frames(i), kMaxReportFrameBytes));
  }
  // Reports are advice: one that cannot be kept changes no reply.
  (void)cache_->RecordGraph(ns, r);
}

absl::StatusOr<v1::GraphBreaksResponse> Engine::GraphBreaks(const v1::GraphBreaksRequest& req) {
  if (req.namespace_() != "*") RETURN_IF_ERROR(cache::ValidateNamespace(req.namespace_()));
  ASSIGN_OR_RETURN(std::vector<v1::JobGraphs> jobs,
                   cache_->ListJobGraphs(req.namespace_(), req.job()));
  v1::GraphBreaksResponse resp;
  for (auto& j : jobs) *resp.add_jobs() = std::move(j);
  return resp;
}

}  // namespace kiln::server
