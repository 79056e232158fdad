// kilnctl: the command line of kilnd, for operators and scripts.
//
// Talks to the server through kiln::Client; computes keys and prints graphs
// locally with the server's own IR code. Output is tables for people, or the
// response message in protobuf JSON with --json. Exit status: 0 on success,
// 1 on any error or refusal (reported as "kilnctl: <CODE>: <message>" on
// stderr), 2 on a usage error.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/kilnctl.h"
#include "common/flags_usage.h"
#include "common/status_macros.h"
#include "compiler/ir/graph.h"
#include "compiler/ir/printer.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "kiln/v1/service.pb.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "address of kilnd");
ABSL_FLAG(bool, json, false, "print the response message as protobuf JSON");
ABSL_FLAG(std::string, token_file, "",
          "file holding the bearer token to send (default: $KILN_TOKEN, else none)");
ABSL_FLAG(std::string, tls_ca, "", "PEM root certificates of the server's TLS certificate");
ABSL_FLAG(std::string, backend, "",
          "backend for compile, lookup and key (eager, aot_eager, kiln); overrides the file's");
ABSL_FLAG(std::string, namespace, "",
          "cache namespace (tenant); \"\" is the default, "
          "\"*\" lists every namespace with ls and recompiles");
ABSL_FLAG(absl::Duration, deadline, absl::Seconds(60), "deadline of each call, retries included");
ABSL_FLAG(std::string, o, "", "trace, minify: the directory to write into");
ABSL_FLAG(std::string, after, "graph",
          "minify: graph (the graph as sent) or aot (its forward or backward graph)");

namespace kiln::kilnctl {

constexpr char kUsage[] = R"(usage: kilnctl [flags] COMMAND [ARGS]

commands:
  health            ask the server whether it is serving (grpc.health.v1)
  stats             cache counters, entries, variants, bytes, per-phase compile times
  freeze            serve only what is cached; never compile
  thaw              leave frozen mode
  ls                list cache entries (--namespace='*' for every namespace)
  show KEY          one entry: its variants and their guards
  evict KEY         drop an entry and all its variants
  compile FILE      compile the graph in FILE (--backend overrides the file's options)
  lookup FILE       look the graph up by its locally computed key; the signature is
                    the graph's input metadata, which must be concrete
  recompiles [KEY]  why variants were added, for KEY or for every entry
  key FILE          print the cache key of the graph in FILE, computed locally
  print FILE        print the graph in FILE readably
  trace KEY -o DIR  write the debug trace of KEY's most recent variant into DIR:
                    input, joint, forward and backward graphs, IR before and after
                    fusion with the fusion decisions, generated code, compile times
  failures          the failed compiles kilnd kept (newest first): id, time, code,
                    graph, key, error
  replay ID         compile failed request ID again (bypassing the cache) and say
                    whether it still fails, and how
  breaks [JOB]      the graphs each job (model) became, gathered from every process
                    that used the server, and why each ended: the graph breaks
  minify FILE|ID|KEY [--after=graph|aot] -o DIR
                    reduce a graph that fails to compile (a file, or a kept failure
                    by id or key) to the smallest subgraph failing the same way;
                    writes DIR/minified.json and DIR/repro.py

KEY is a full hex key or a unique prefix of one (ls shows 16 hex digits).
FILE is a kiln.v1.GraphFile {graph, guards, options} in protobuf JSON.
)";

constexpr char kFlagsUsage[] = R"(
flags:
  --server=ADDR     address of kilnd (default 127.0.0.1:50051)
  --json            print the response as protobuf JSON, for scripts
  --backend=B       backend for compile, lookup and key
  --namespace=NS    cache namespace (default: the default namespace "")
  --deadline=D      deadline of each call, retries included (default 60s)
)";

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

// ---------------------------------------------------------------------------
// Formatting

std::string HumanBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 4) {
    v /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

std::string HumanMicros(double micros) {
  if (micros < 1000) return absl::StrFormat("%.0f us", micros);
  if (micros < 1e6) return absl::StrFormat("%.2f ms", micros / 1e3);
  return absl::StrFormat("%.2f s", micros / 1e6);
}

std::string Timestamp(int64_t unix_micros) {
  if (unix_micros == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMicros(unix_micros),
                          absl::LocalTimeZone());
}

std::string Short(const std::string& hex) { return hex.substr(0, 16); }

std::string Namespace(const std::string& ns) { return ns.empty() ? "(default)" : ns; }

std::string YesNo(bool b) { return b ? "yes" : "no"; }

std::string DeviceString(const v1::Device& d) {
  if (d.type().empty()) return "?";
  return d.index() >= 0 ? absl::StrCat(d.type(), ":", d.index()) : d.type();
}

std::string SymList(const google::protobuf::RepeatedPtrField<v1::SymInt>& list) {
  return absl::StrJoin(list, ", ", [](std::string* out, const v1::SymInt& s) {
    out->append(ir::SymIntFromProto(s).ToString());
  });
}

// "x: f32[s0, 16] cpu contiguous requires_grad=false"
std::string GuardString(const v1::TensorGuard& g) {
  std::string s = absl::StrCat(g.name().empty() ? "?" : g.name(), ": ",
                               ir::DTypeShortName(g.dtype()), "[", SymList(g.sizes()), "]");
  if (g.has_device()) absl::StrAppend(&s, " ", DeviceString(g.device()));
  switch (g.stride_check()) {
    case v1::TensorGuard::EXACT:
      absl::StrAppend(&s, " strides (", SymList(g.strides()), ")");
      break;
    case v1::TensorGuard::CONTIGUOUS:
      absl::StrAppend(&s, " contiguous");
      break;
    default:
      break;
  }
  if (g.check_requires_grad()) {
    absl::StrAppend(&s, " requires_grad=", g.requires_grad() ? "true" : "false");
  }
  return s;
}

std::string Misses(const google::protobuf::RepeatedPtrField<v1::VariantMiss>& misses,
                   const std::string& indent) {
  std::string out;
  for (const v1::VariantMiss& m : misses) {
    absl::StrAppend(&out, indent, "variant ", m.variant(), " (", Short(m.digest()), ")",
                    m.key().empty() ? "" : absl::StrCat(" of key ", Short(m.key())), ": ",
                    m.failed_guard(), "\n");
  }
  return out;
}

absl::Status PrintJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  std::string json;
  const auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("cannot print ", message.GetTypeName(),
                                            " as JSON: ", status.message().as_string()));
  }
  std::cout << json;
  if (json.empty() || json.back() != '\n') std::cout << "\n";
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Inputs

absl::StatusOr<v1::GraphFile> ReadGraphFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": cannot read"));
  v1::GraphFile file;
  const auto status = google::protobuf::util::JsonStringToMessage(text.str(), &file);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": not a kiln.v1.GraphFile in protobuf JSON: ", status.message().as_string()));
  }
  if (!file.has_graph()) return absl::InvalidArgumentError(absl::StrCat(path, ": no graph"));
  return file;
}

// The file's options with --backend applied.
v1::CompileOptions OptionsFor(const v1::GraphFile& file) {
  v1::CompileOptions options = file.options();
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (!backend.empty()) options.set_backend(backend);
  return options;
}

bool IsFullKey(const std::string& key) {
  if (key.size() != 64) return false;
  for (char c : key) {
    if (!absl::ascii_isxdigit(c)) return false;
  }
  return true;
}

// A full key as is; a prefix resolved against the entries of `ns`.
absl::StatusOr<std::string> ResolveKey(const Client& client, const std::string& key,
                                       const std::string& ns) {
  if (IsFullKey(key)) return key;
  if (key.empty()) return absl::InvalidArgumentError("empty KEY");
  ASSIGN_OR_RETURN(v1::ListEntriesResponse list, client.ListEntries(ns));
  std::set<std::string> matches;
  for (const v1::EntryInfo& e : list.entries()) {
    if (absl::StartsWith(e.key(), key)) matches.insert(e.key());
  }
  // A key whose compile failed has no entry, but a kept failure.
  if (auto failures = client.ListFailures(ns); failures.ok()) {
    for (const v1::FailedCompile& f : failures->failures()) {
      if (!f.key().empty() && absl::StartsWith(f.key(), key)) matches.insert(f.key());
    }
  }
  if (matches.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no entry with key ", key, " in namespace ", Namespace(ns)));
  }
  if (matches.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("key prefix ", key, " is ambiguous: ", matches.size(), " entries match"));
  }
  return *matches.begin();
}

// ---------------------------------------------------------------------------
// Commands. Each returns the status the process reports.

absl::Status Health(const Client& client, const Invocation& inv) {
  RETURN_IF_ERROR(client.Health());
  std::cout << (inv.json ? "{\n  \"status\": \"SERVING\"\n}\n" : "SERVING\n");
  return absl::OkStatus();
}

absl::Status Stats(const Client& client, const Invocation& inv) {
  ASSIGN_OR_RETURN(v1::StatsResponse stats, client.Stats());
  if (inv.json) return PrintJson(stats);

  Table summary({"SERVER", ""});
  summary.Add({"compiler", stats.compiler_version()});
  summary.Add({"frozen", YesNo(stats.frozen())});
  summary.Add({"in flight", absl::StrCat(stats.in_flight())});
  summary.Add({"entries", absl::StrCat(stats.entries())});
  summary.Add({"variants", absl::StrCat(stats.variants())});
  summary.Add({"bytes", absl::StrCat(HumanBytes(stats.bytes()), " (", stats.bytes(), ")")});
  summary.Add({"byte budget", stats.byte_budget() == 0
                                  ? "unlimited"
                                  : absl::StrCat(HumanBytes(stats.byte_budget()), " (",
                                                 stats.byte_budget(), ")")});
  if (stats.has_kernel_cache()) {
    const v1::KernelCacheStats& k = stats.kernel_cache();
    summary.Add({"kernels reused", absl::StrCat(k.hits(), " (", k.misses(), " compiled)")});
    summary.Add({"kernel cache", absl::StrCat(k.entries(), " kernels, ", HumanBytes(k.bytes()),
                                              " of ", HumanBytes(k.byte_budget()))});
  }
  std::cout << summary.Render() << "\n";

  // Every counter the server reports, in the proto's order.
  Table counters({"COUNTER", "VALUE"}, {false, true});
  const google::protobuf::Descriptor* d = stats.counters().GetDescriptor();
  const google::protobuf::Reflection* r = stats.counters().GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_UINT64 || f->is_repeated()) {
      continue;
    }
    counters.Add({f->name(), absl::StrCat(r->GetUInt64(stats.counters(), f))});
  }
  std::cout << counters.Render();

  if (stats.phases_size() > 0) {
    Table phases({"PHASE", "COUNT", "TOTAL", "MEAN"}, {false, true, true, true});
    for (const v1::PhaseStats& p : stats.phases()) {
      const uint64_t n = p.histogram().count();
      phases.Add({p.phase(), absl::StrCat(n), HumanMicros(static_cast<double>(p.total_micros())),
                  n == 0 ? "-" : HumanMicros(static_cast<double>(p.total_micros()) / n)});
    }
    std::cout << "\n" << phases.Render();
  }
  return absl::OkStatus();
}

absl::Status Freeze(const Client& client, const Invocation& inv) {
  ASSIGN_OR_RETURN(v1::FreezeResponse r, client.Freeze());
  if (inv.json) return PrintJson(r);
  std::cout << "frozen: " << YesNo(r.frozen()) << "\n";
  return absl::OkStatus();
}

absl::Status Thaw(const Client& client, const Invocation& inv) {
  ASSIGN_OR_RETURN(v1::ThawResponse r, client.Thaw());
  if (inv.json) return PrintJson(r);
  std::cout << "frozen: " << YesNo(r.frozen()) << "\n";
  return absl::OkStatus();
}

absl::Status List(const Client& client, const Invocation& inv) {
  ASSIGN_OR_RETURN(v1::ListEntriesResponse list, client.ListEntries(inv.ns));
  if (inv.json) return PrintJson(list);
  if (list.entries_size() == 0) {
    std::cout << "no entries in "
              << (inv.ns == "*" ? "any namespace" : "namespace " + Namespace(inv.ns)) << "\n";
    return absl::OkStatus();
  }
  Table t({"NAMESPACE", "KEY", "GRAPH", "BACKEND", "VARIANTS", "BYTES"},
          {false, false, false, false, true, true});
  for (const v1::EntryInfo& e : list.entries()) {
    t.Add({Namespace(e.namespace_()), Short(e.key()), e.graph_name(), e.backend(),
           absl::StrCat(e.variants_size()), HumanBytes(e.bytes())});
  }
  std::cout << t.Render();
  return absl::OkStatus();
}

absl::Status Show(const Client& client, const Invocation& inv) {
  ASSIGN_OR_RETURN(std::string key, ResolveKey(client, inv.args[0], inv.ns));
  absl::StatusOr<v1::GetEntryResponse> got = client.GetEntry(key, inv.ns);
  // Its failed compiles kept for replay.
  std::vector<v1::FailedCompile> kept;
  if (auto failures = client.ListFailures(inv.ns); failures.ok()) {
    for (const v1::FailedCompile& f : failures->failures()) {
      if (f.key() == key) kept.push_back(f);
    }
  }
  if (absl::IsNotFound(got.status()) && !kept.empty()) {
    // Only kept failures (the entry's own in-memory one is gone with a restart).
    got = v1::GetEntryResponse();
    got->mutable_entry()->set_key(key);
    got->mutable_entry()->set_namespace_(inv.ns);
  }
  if (!got.ok()) return got.status();
  const v1::GetEntryResponse& r = *got;
  if (inv.json) return PrintJson(r);
  const v1::EntryInfo& e = r.entry();
  Table head({"ENTRY", ""});
  head.Add({"namespace", Namespace(e.namespace_())});
  head.Add({"key", e.key()});
  head.Add({"graph", e.graph_name()});
  head.Add({"backend", e.backend()});
  head.Add({"bytes", absl::StrCat(HumanBytes(e.bytes()), " (", e.bytes(), ")")});
  head.Add({"variants", absl::StrCat(e.variants_size())});
  head.Add({"recompiles", absl::StrCat(e.recompiles_size())});
  std::cout << head.Render();
  // Its failed compiles, and what their minification found.
  for (const v1::FailedCompile& f : kept) {
    std::cout << "\nfailed compile " << f.id() << " (" << Timestamp(f.unix_micros())
              << "): " << f.code() << ": " << f.error().substr(0, f.error().find('\n')) << "\n";
    if (f.has_minified()) {
      std::cout << "  minified in the background to " << f.minified().graph().nodes_size()
                << " nodes: kilnctl minify " << f.id() << " -o DIR writes it with its repro\n";
    }
  }
  if (e.variants_size() == 0) return absl::OkStatus();

  Table t({"VARIANT", "DIGEST", "BACKEND", "BYTES", "HITS", "CREATED", "LAST USED"},
          {true, false, false, true, true, false, false});
  for (int i = 0; i < e.variants_size(); ++i) {
    const v1::VariantInfo& v = e.variants(i);
    t.Add({absl::StrCat(i), Short(v.digest()), v.backend(), HumanBytes(v.bytes()),
           absl::StrCat(v.hits()), Timestamp(v.created_unix_micros()),
           Timestamp(v.last_used_unix_micros())});
  }
  std::cout << "\n" << t.Render();
  for (int i = 0; i < e.variants_size(); ++i) {
    const v1::GuardSet& g = e.variants(i).guards();
    std::cout << "\nguards of variant " << i << ":\n";
    for (const v1::TensorGuard& tg : g.tensors()) std::cout << "  " << GuardString(tg) << "\n";
    for (const std::string& sg : g.shape_guards()) std::cout << "  " << sg << "\n";
    if (!g.client_guard_digest().empty()) {
      std::cout << "  client guards: " << g.client_guard_digest().size() << "-byte digest\n";
    }
  }
  return absl::OkStatus();
}

absl::Status Evict(const Client& client, const Invocation& inv) {
  ASSIGN_OR_RETURN(std::string key, ResolveKey(client, inv.args[0], inv.ns));
  ASSIGN_OR_RETURN(v1::EvictResponse r, client.Evict(key, inv.ns));
  if (inv.json) return PrintJson(r);
  std::cout << "evicted " << Short(key) << ": " << r.variants() << " variant"
            << (r.variants() == 1 ? "" : "s") << ", " << HumanBytes(r.bytes()) << "\n";
  return absl::OkStatus();
}

absl::Status Compile(const Client& client, const Invocation& inv) {
  const std::string& path = inv.args[0];
  ASSIGN_OR_RETURN(v1::GraphFile file, ReadGraphFile(path));
  v1::CompileRequest request;
  *request.mutable_graph() = file.graph();
  if (file.has_guards()) *request.mutable_guards() = file.guards();
  *request.mutable_options() = OptionsFor(file);
  request.set_namespace_(inv.ns);
  ASSIGN_OR_RETURN(v1::CompileResponse r, client.Compile(request));
  if (inv.json) return PrintJson(r);

  const v1::Artifact& a = r.artifact();
  Table t({"COMPILE", ""});
  t.Add({"outcome", v1::LookupOutcome_Name(r.outcome())});
  t.Add({"key", r.key()});
  t.Add({"digest", r.digest()});
  t.Add({"backend", a.backend()});
  if (!a.compile_times().empty()) {
    t.Add({"compile times",
           absl::StrJoin(a.compile_times(), ", ", [](std::string* out, const v1::PhaseTime& p) {
             absl::StrAppend(out, p.phase(), " ", HumanMicros(static_cast<double>(p.micros())));
           })});
  }
  std::cout << t.Render();
  if (r.misses_size() > 0) std::cout << "misses:\n" << Misses(r.misses(), "  ");
  auto print = [](const v1::Graph& proto, absl::string_view what) -> absl::Status {
    auto graph = ir::Graph::FromProto(proto);
    if (!graph.ok()) {
      return absl::DataLossError(absl::StrCat("the artifact's ", what,
                                              " graph does not load: ", graph.status().message()));
    }
    std::cout << "\n" << ir::PrintReadable(*graph);
    return absl::OkStatus();
  };
  if (a.has_autograd()) {
    const v1::AutogradGraphs& ag = a.autograd();
    std::cout << "\nsaved for backward (" << ag.saved_size() << " values, "
              << HumanBytes(static_cast<uint64_t>(ag.saved_bytes()))
              << "): " << absl::StrJoin(ag.saved(), ", ") << "\n";
    if (ag.recomputed_size() > 0) {
      std::cout << "recomputed in backward: " << absl::StrJoin(ag.recomputed(), ", ") << "\n";
    }
    RETURN_IF_ERROR(print(ag.forward(), "forward"));
    RETURN_IF_ERROR(print(ag.backward(), "backward"));
  } else if (a.has_graph()) {
    RETURN_IF_ERROR(print(a.graph(), ""));
  }
  return absl::OkStatus();
}

absl::Status Lookup(const Client& client, const Invocation& inv) {
  const std::string& path = inv.args[0];
  ASSIGN_OR_RETURN(v1::GraphFile file, ReadGraphFile(path));
  auto signature = SignatureFromMetadata(file.graph());
  if (!signature.ok()) {
    return absl::Status(signature.status().code(),
                        absl::StrCat(path, ": ", signature.status().message()));
  }
  // Client-side guards, when the file carries them, travel as their digest.
  signature->set_client_guard_digest(file.guards().client_guard_digest());
  ASSIGN_OR_RETURN(v1::LookupResponse r,
                   client.LookupGraph(file.graph(), OptionsFor(file), *signature, inv.ns));
  if (inv.json) return PrintJson(r);
  Table t({"LOOKUP", ""});
  t.Add({"outcome", v1::LookupOutcome_Name(r.outcome())});
  t.Add({"key", r.key()});
  if (!r.digest().empty()) t.Add({"digest", r.digest()});
  if (!r.reason().empty()) t.Add({"reason", r.reason()});
  std::cout << t.Render();
  if (r.misses_size() > 0) std::cout << "misses:\n" << Misses(r.misses(), "  ");
  return absl::OkStatus();
}

void PrintRecompiles(const v1::EntryInfo& e) {
  std::cout << Short(e.key()) << "  " << (e.graph_name().empty() ? "?" : e.graph_name())
            << "  namespace " << Namespace(e.namespace_()) << ": " << e.recompiles_size()
            << " recompile" << (e.recompiles_size() == 1 ? "" : "s") << "\n";
  for (const v1::RecompileReason& rc : e.recompiles()) {
    std::cout << "  " << Timestamp(rc.unix_micros()) << "  added variant " << Short(rc.digest())
              << "\n"
              << Misses(rc.misses(), "    ");
    if (!rc.automatic_dynamic().empty()) {
      std::cout << "    automatic dynamic: " << rc.automatic_dynamic() << "\n";
    }
    if (!rc.client_reason().empty()) std::cout << "    client: " << rc.client_reason() << "\n";
  }
}

absl::Status Recompiles(const Client& client, const Invocation& inv) {
  if (!inv.args.empty()) {
    ASSIGN_OR_RETURN(std::string key, ResolveKey(client, inv.args[0], inv.ns));
    ASSIGN_OR_RETURN(v1::GetEntryResponse r, client.GetEntry(key, inv.ns));
    if (inv.json) return PrintJson(r);
    PrintRecompiles(r.entry());
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(v1::ListEntriesResponse list, client.ListEntries(inv.ns));
  v1::ListEntriesResponse full;  // the entries with their recompile details
  for (const v1::EntryInfo& e : list.entries()) {
    ASSIGN_OR_RETURN(v1::GetEntryResponse r, client.GetEntry(e.key(), e.namespace_()));
    *full.add_entries() = r.entry();
  }
  if (inv.json) return PrintJson(full);
  int shown = 0;
  for (const v1::EntryInfo& e : full.entries()) {
    if (e.recompiles_size() == 0) continue;
    if (shown++ > 0) std::cout << "\n";
    PrintRecompiles(e);
  }
  if (shown == 0) std::cout << "no recompiles in " << full.entries_size() << " entries\n";
  return absl::OkStatus();
}

absl::Status Key(const Invocation& inv) {
  const std::string& path = inv.args[0];
  ASSIGN_OR_RETURN(v1::GraphFile file, ReadGraphFile(path));
  auto key = Client::Key(file.graph(), OptionsFor(file));
  if (!key.ok()) {
    return absl::Status(key.status().code(), absl::StrCat(path, ": ", key.status().message()));
  }
  if (inv.json) {
    std::cout << "{\n  \"key\": \"" << *key << "\"\n}\n";
  } else {
    std::cout << *key << "\n";
  }
  return absl::OkStatus();
}

absl::Status Print(const Invocation& inv) {
  const std::string& path = inv.args[0];
  ASSIGN_OR_RETURN(v1::GraphFile file, ReadGraphFile(path));
  if (inv.json) return PrintJson(file.graph());
  auto graph = ir::Graph::FromProto(file.graph());
  if (!graph.ok()) {
    return absl::Status(graph.status().code(), absl::StrCat(path, ": ", graph.status().message()));
  }
  std::cout << ir::PrintReadable(*graph);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------

// The debug trace the compile stored in the artifact, one file per stage.
absl::Status Trace(const Client& client, const Invocation& inv) {
  const std::string dir = absl::GetFlag(FLAGS_o);
  if (dir.empty())
    return absl::InvalidArgumentError("trace: give the output directory with -o DIR");
  ASSIGN_OR_RETURN(std::string key, ResolveKey(client, inv.args[0], inv.ns));
  ASSIGN_OR_RETURN(v1::GetEntryResponse entry, client.GetEntry(key, inv.ns));
  std::map<std::string, std::string> files;
  if (entry.entry().variants_size() == 0) {
    // Only a failed compile: its error and the trace it got as far as.
    if (!entry.has_last_failure()) {
      return absl::NotFoundError(absl::StrCat("entry ", key, " has no variants"));
    }
    files.insert(entry.last_failure().trace().begin(), entry.last_failure().trace().end());
    files["error.txt"] = entry.last_failure().error() + "\n";
  } else {
    ASSIGN_OR_RETURN(v1::GetArtifactResponse got,
                     client.GetArtifact(entry.entry().variants(0).digest()));
    const v1::Artifact& a = got.artifact();
    files.insert(a.trace().begin(), a.trace().end());
    std::string times;
    for (const auto& p : a.compile_times()) {
      absl::StrAppend(&times, p.phase(), " ", p.micros(), " us\n");
    }
    files["compile_times.txt"] = times;
    if (a.has_graph()) {
      auto g = ir::Graph::FromProto(a.graph());
      if (g.ok()) files.emplace("input_graph.txt", ir::PrintReadable(*g));
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::FailedPreconditionError(
        absl::StrCat("trace: cannot create ", dir, ": ", ec.message()));
  for (const auto& [name, text] : files) {
    std::ofstream out(std::filesystem::path(dir) / name);
    out << text;
    if (!out) return absl::InternalError(absl::StrCat("trace: cannot write ", name, " in ", dir));
    std::cout << (std::filesystem::path(dir) / name).string() << "\n";
  }
  return absl::OkStatus();
}

struct Command {
  const char* name;
  size_t min_args;
  size_t max_args;
  const char* args_usage;
  absl::Status (*remote)(const Client&, const Invocation&);  // needs the server
  absl::Status (*local)(const Invocation&);                  // or runs here
};

constexpr Command kCommands[] = {
    {"health", 0, 0, "", Health, nullptr},
    {"stats", 0, 0, "", Stats, nullptr},
    {"freeze", 0, 0, "", Freeze, nullptr},
    {"thaw", 0, 0, "", Thaw, nullptr},
    {"ls", 0, 0, "", List, nullptr},
    {"show", 1, 1, "KEY", Show, nullptr},
    {"evict", 1, 1, "KEY", Evict, nullptr},
    {"compile", 1, 1, "FILE", Compile, nullptr},
    {"lookup", 1, 1, "FILE", Lookup, nullptr},
    {"recompiles", 0, 1, "[KEY]", Recompiles, nullptr},
    {"key", 1, 1, "FILE", nullptr, Key},
    {"print", 1, 1, "FILE", nullptr, Print},
    {"trace", 1, 1, "KEY -o DIR", Trace, nullptr},
    {"failures", 0, 0, "", Failures, nullptr},
    {"replay", 1, 1, "ID", Replay, nullptr},
    {"breaks", 0, 1, "[JOB]", Breaks, nullptr},
    {"minify", 1, 1, "FILE|ID|KEY -o DIR", Minify, nullptr},
};

int Fail(const absl::Status& status) {
  std::cerr << "kilnctl: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
            << "\n";
  return kExitError;
}

int UsageError(const std::string& message) {
  if (!message.empty()) std::cerr << "kilnctl: " << message << "\n\n";
  std::cerr << kUsage << kFlagsUsage;
  return kExitUsage;
}

int Main(int argc, char** argv) {
  kiln::UseFlagsDefinedIn("client/kilnctl.cc");
  absl::SetProgramUsageMessage(kUsage);  // --help adds the flags itself
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() < 2) return UsageError("");

  Invocation inv;
  inv.command = positional[1];
  inv.args.assign(positional.begin() + 2, positional.end());
  inv.ns = absl::GetFlag(FLAGS_namespace);
  inv.json = absl::GetFlag(FLAGS_json);

  const Command* command = nullptr;
  for (const Command& c : kCommands) {
    if (inv.command == c.name) command = &c;
  }
  if (command == nullptr) return UsageError(absl::StrCat("unknown command '", inv.command, "'"));
  if (inv.args.size() < command->min_args || inv.args.size() > command->max_args) {
    return UsageError(absl::StrCat("usage: kilnctl ", command->name,
                                   *command->args_usage ? " " : "", command->args_usage));
  }

  if (command->local != nullptr) {
    const absl::Status status = command->local(inv);
    return status.ok() ? 0 : Fail(status);
  }

  ClientOptions options;
  options.address = absl::GetFlag(FLAGS_server);
  options.deadline = absl::GetFlag(FLAGS_deadline);
  auto read = [](const std::string& path, std::string* out) -> absl::Status {
    std::ifstream f(path, std::ios::binary);
    if (!f) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
    out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    return absl::OkStatus();
  };
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    if (absl::Status s = read(path, &options.token); !s.ok()) return Fail(s);
    options.token = std::string(absl::StripAsciiWhitespace(options.token));
  } else if (const char* token = std::getenv("KILN_TOKEN"); token != nullptr) {
    options.token = token;
  }
  if (const std::string path = absl::GetFlag(FLAGS_tls_ca); !path.empty()) {
    if (absl::Status s = read(path, &options.tls_root_certs); !s.ok()) return Fail(s);
  }
  auto client = Client::Connect(options);
  if (!client.ok()) return Fail(client.status());
  const absl::Status status = command->remote(**client, inv);
  return status.ok() ? 0 : Fail(status);
}

}  // namespace kiln::kilnctl

int main(int argc, char** argv) { return kiln::kilnctl::Main(argc, argv); }
