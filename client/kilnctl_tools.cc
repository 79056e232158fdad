// kilnctl's troubleshooting commands (docs/troubleshooting.md): failed
// compiles kept by kilnd, replay, graph-break reports, the minifier.
#include <filesystem>
#include <iostream>
#include <set>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/kilnctl.h"
#include "client/minify.h"
#include "common/status_macros.h"

namespace kiln::kilnctl {
namespace {

// The kept failure named by an id, or by a key or a prefix of one.
absl::StatusOr<v1::FailedCompile> FindFailure(const Client& client, const std::string& name,
                                              const std::string& ns) {
  ASSIGN_OR_RETURN(v1::ListFailuresResponse all, client.ListFailures(ns));
  for (const v1::FailedCompile& f : all.failures()) {
    if (f.id() == name || (name.size() >= 8 && absl::StartsWith(f.key(), name))) {
      ASSIGN_OR_RETURN(v1::GetFailureResponse got, client.GetFailure(f.id(), f.namespace_()));
      if (got.failure().request_dropped()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "failure ", f.id(), ": its request was over the size kilnd keeps; it has no graph"));
      }
      return got.failure();
    }
  }
  return absl::NotFoundError(absl::StrCat("no kept failure has id or key '", name, "'"));
}

}  // namespace

absl::Status Failures(const Client& client, const Invocation& inv) {
  ASSIGN_OR_RETURN(v1::ListFailuresResponse r, client.ListFailures(inv.ns));
  if (inv.json) return PrintJson(r);
  if (r.failures_size() == 0) {
    std::cout << "no failed compiles\n";
    return absl::OkStatus();
  }
  Table t({"ID", "TIME", "NAMESPACE", "CODE", "GRAPH", "KEY", "MINIFIED", "ERROR"});
  for (const v1::FailedCompile& f : r.failures()) {
    t.Add({f.id(), Timestamp(f.unix_micros()), Namespace(f.namespace_()), f.code(),
           f.graph_name().empty() ? "?" : f.graph_name(), f.key().empty() ? "-" : Short(f.key()),
           f.has_minified() ? absl::StrCat(f.minified().graph().nodes_size(), " nodes") : "-",
           f.error().substr(0, f.error().find('\n')).substr(0, 160)});
  }
  std::cout << t.Render();
  return absl::OkStatus();
}

absl::Status Replay(const Client& client, const Invocation& inv) {
  ASSIGN_OR_RETURN(v1::FailedCompile f, FindFailure(client, inv.args[0], inv.ns));
  v1::CompileRequest request = f.request();
  request.set_bypass_cache(true);
  auto again = client.Compile(request);
  std::cout << "failure " << f.id() << " (" << Timestamp(f.unix_micros()) << ", "
            << f.compiler_version() << "): " << f.code() << ": " << f.error() << "\n";
  if (again.ok()) {
    std::cout << "replay: compiles now (key " << again->key() << ")\n";
    return absl::OkStatus();
  }
  const bool same = absl::StatusCodeToString(again.status().code()) == f.code() &&
                    again.status().message() == f.error();
  std::cout << "replay: still fails" << (same ? ", the same way" : ", differently") << ": "
            << absl::StatusCodeToString(again.status().code()) << ": " << again.status().message()
            << "\n";
  return absl::OkStatus();
}

absl::Status Breaks(const Client& client, const Invocation& inv) {
  ASSIGN_OR_RETURN(v1::GraphBreaksResponse r,
                   client.GraphBreaks(inv.ns, inv.args.empty() ? "" : inv.args[0]));
  if (inv.json) return PrintJson(r);
  if (r.jobs_size() == 0) {
    std::cout << "no graph reports\n";
    return absl::OkStatus();
  }
  for (const v1::JobGraphs& job : r.jobs()) {
    std::set<std::string> functions;
    int breaks = 0;
    for (const auto& g : job.graphs()) {
      functions.insert(g.function());
      breaks += g.graph_break();
    }
    std::cout << "job " << job.job() << " (namespace " << Namespace(job.namespace_())
              << "): " << job.graphs_size() << " graph" << (job.graphs_size() == 1 ? "" : "s")
              << " from " << functions.size() << " function" << (functions.size() == 1 ? "" : "s")
              << ", " << breaks << " graph break" << (breaks == 1 ? "" : "s") << "\n";
    for (const auto& g : job.graphs()) {
      std::cout << "  " << g.graph() << " (" << g.function() << ", reported " << g.reports()
                << " time" << (g.reports() == 1 ? "" : "s") << ")";
      if (g.graph_break()) {
        std::cout << ": graph break: " << g.reason().substr(0, g.reason().find('\n'));
        if (g.user_frames_size() > 0) {
          std::cout << "\n    at " << g.user_frames(g.user_frames_size() - 1);
        }
      }
      std::cout << "\n";
    }
  }
  return absl::OkStatus();
}

absl::Status Minify(const Client& client, const Invocation& inv) {
  const std::string dir = absl::GetFlag(FLAGS_o);
  if (dir.empty())
    return absl::InvalidArgumentError("minify: give the output directory with -o DIR");
  const std::string& what = inv.args[0];
  v1::CompileRequest request;
  if (std::filesystem::exists(what)) {
    ASSIGN_OR_RETURN(v1::GraphFile file, ReadGraphFile(what));
    *request.mutable_graph() = file.graph();
    *request.mutable_options() = OptionsFor(file);
  } else {
    ASSIGN_OR_RETURN(v1::FailedCompile f, FindFailure(client, what, inv.ns));
    request = f.request();
    if (f.has_minified() && absl::GetFlag(FLAGS_after) == "graph") {
      // Minified in the background already: start from its result.
      *request.mutable_graph() = f.minified().graph();
    }
    if (!absl::GetFlag(FLAGS_backend).empty()) {
      request.mutable_options()->set_backend(absl::GetFlag(FLAGS_backend));
    }
  }
  request.set_namespace_(inv.ns);
  ASSIGN_OR_RETURN(
      Minified m,
      MinifyCompileError([&client](const v1::CompileRequest& r) { return client.Compile(r); },
                         request, absl::GetFlag(FLAGS_after)));
  ASSIGN_OR_RETURN(std::vector<std::string> written,
                   WriteRepro(dir, m, absl::GetFlag(FLAGS_server)));
  std::cout << "minified the " << (m.stage == "graph" ? "" : m.stage + " ") << "graph from "
            << m.nodes_before << " to " << m.request.graph().nodes_size() << " nodes in "
            << m.compiles << " compiles; it fails with " << absl::StatusCodeToString(m.error.code())
            << ": " << m.error.message().substr(0, m.error.message().find('\n')) << "\n";
  for (const std::string& path : written) std::cout << path << "\n";
  return absl::OkStatus();
}

}  // namespace kiln::kilnctl
