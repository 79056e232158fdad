#include "server/engine.h"

#include <malloc.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cache/guards.h"
#include "common/hashing.h"
#include "common/status_macros.h"
#include "compiler/ir/canonical.h"
#include "compiler/ir/verify.h"
#include "compiler/ops/registry.h"

namespace kiln::server {
namespace {

std::string MissReasons(const std::string& key, int variants,
                        const std::vector<v1::VariantMiss>& misses) {
  std::vector<std::string> parts;
  for (const auto& m : misses) {
    parts.push_back(m.key().empty() ? absl::StrCat("variant ", m.variant(), ": ", m.failed_guard())
                                    : absl::StrCat("variant ", m.variant(), " of key ", m.key(),
                                                   " (same shape family): ", m.failed_guard()));
  }
  if (variants == 0) {
    return absl::StrCat("full miss: key ", key, " is not cached", parts.empty() ? "" : "; ",
                        absl::StrJoin(parts, "; "));
  }
  return absl::StrCat("guard miss on key ", key, " (", variants,
                      " variants): ", absl::StrJoin(parts, "; "));
}

// Graphs larger than this get no shape family: their records would cost
// more to store and compare than a compile saves.
constexpr size_t kMaxFamilyGraphBytes = 4 << 20;
constexpr size_t kMaxClientReasonBytes = 4096;

absl::Status Prefix(const absl::Status& s, absl::string_view prefix) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

// Structure, schemas, and the client's metadata against the op registry's
// shape rules.
absl::StatusOr<ir::Graph> BuildVerified(const v1::Graph& proto, const ir::GraphLimits& limits) {
  RETURN_IF_ERROR(ir::CheckNodeCount(proto.nodes_size(), limits));  // before anything is built
  ASSIGN_OR_RETURN(ir::Graph g, ir::Graph::FromProto(proto));
  RETURN_IF_ERROR(ir::Verify(g, limits));
  RETURN_IF_ERROR(ops::CheckMetadata(ops::DefaultRegistry(), g));
  return g;
}

v1::EntryInfo ToEntryInfo(const std::string& ns, const std::string& key, const v1::StoredEntry& e,
                          bool details) {
  v1::EntryInfo info;
  info.set_namespace_(ns);
  info.set_key(key);
  info.set_graph_name(e.graph_name());
  info.set_backend(e.backend());
  uint64_t bytes = 0;
  for (const auto& v : e.variants()) {
    v1::VariantInfo* vi = info.add_variants();
    vi->set_digest(v.digest());
    if (details) *vi->mutable_guards() = v.guards();
    vi->set_bytes(v.bytes());
    vi->set_created_unix_micros(v.created_unix_micros());
    vi->set_last_used_unix_micros(v.last_used_unix_micros());
    vi->set_hits(v.hits());
    vi->set_backend(e.backend());
    bytes += v.bytes();
  }
  info.set_bytes(bytes);
  if (details) {
    for (const auto& r : e.recompiles()) *info.add_recompiles() = r;
  }
  return info;
}

// The key of failures_ for a cache key in a namespace.
std::string FailureId(const std::string& ns, const std::string& key) {
  return absl::StrCat(ns, "\n", key);
}

}  // namespace

void Caller::MarkGone() {
  absl::MutexLock l(&mu_);
  if (gone_) return;
  gone_ = true;
  if (hook_) std::exchange(hook_, nullptr)();
}

bool Caller::gone() const {
  absl::MutexLock l(&mu_);
  return gone_;
}

void Caller::OnGone(std::function<void()> hook) {
  absl::MutexLock l(&mu_);
  if (gone_ && hook) {
    hook();
    return;
  }
  hook_ = std::move(hook);
}

Engine::Engine(const EngineOptions& options, cache::Cache* cache, cache::Stats* stats,
               BackendRegistry backends)
    : options_(options),
      cache_(cache),
      stats_(stats),
      backends_(std::move(backends)),
      frozen_(options.frozen),
      slots_(options.compile_workers, options.compile_queue_depth),
      background_(std::make_unique<WorkerPool>(std::max(1, options.compile_workers),
                                               options.compile_queue_depth,
                                               "background compile queue")) {}

Engine::~Engine() {
  {
    absl::MutexLock l(&background_mu_);
    stopping_ = true;
    for (Caller* caller : background_callers_) caller->MarkGone();
  }
  std::thread minifier;
  {
    absl::MutexLock l(&minify_mu_);
    minifier = std::move(minifier_);
  }
  if (minifier.joinable()) minifier.join();
}

absl::StatusOr<cache::VerifiedArtifact> Engine::ReadArtifact(const std::string& digest) {
  bool quarantined = false;
  absl::StatusOr<cache::VerifiedArtifact> artifact =
      cache_->ReadVerifiedArtifact(digest, &quarantined);
  if (quarantined) stats_->CountCorruptArtifacts(1);
  return artifact;
}

absl::StatusOr<v1::CompileResponse> Engine::Compile(const v1::CompileRequest& req, Caller* caller) {
  if (req.has_report()) RecordReport(req.namespace_(), req.report());
  bool compiling = false;
  absl::StatusOr<v1::CompileResponse> result = CompileUnrecorded(req, caller, &compiling);
  const absl::StatusCode code = result.status().code();
  if (!compiling &&
      (code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kUnimplemented ||
       code == absl::StatusCode::kInternal) &&
      cache::ValidateNamespace(req.namespace_()).ok()) {
    PersistFailure(req, "", result.status(), nullptr);
  }
  return result;
}

absl::StatusOr<v1::CompileResponse> Engine::CompileUnrecorded(const v1::CompileRequest& req,
                                                              Caller* caller, bool* compiling) {
  const std::string& ns = req.namespace_();
  RETURN_IF_ERROR(cache::ValidateNamespace(ns));
  PhaseTimes times;
  ASSIGN_OR_RETURN(ir::Graph graph, times.Time("verify", [&] {
    return BuildVerified(req.graph(), options_.graph_limits);
  }));
  v1::CompileOptions options = ir::NormalizeOptions(req.options(), &graph);
  RETURN_IF_ERROR(backends_.Find(options.backend()).status());
  ASSIGN_OR_RETURN(const Filter filter, ApplyRequestOptions(graph, &options));
  if (filter != Filter::kNone) stats_->CountFunctionFilter(filter == Filter::kMatched);
  const v1::GuardSet guards = req.has_guards() ? req.guards() : cache::DeriveGuards(graph);
  if (guards.tensors_size() != static_cast<int>(graph.inputs().size())) {
    return absl::InvalidArgumentError(absl::StrCat("guards: ", guards.tensors_size(),
                                                   " tensor guards for a graph of ",
                                                   graph.inputs().size(), " inputs"));
  }
  RETURN_IF_ERROR(Prefix(cache::ValidateGuardSet(guards, options_.expr_limits), "guards: "));
  const std::string key = times.Time("key", [&] { return ir::CacheKey(graph, options); });

  if (req.bypass_cache()) {
    if (frozen_ || req.frozen()) {
      stats_->Count(v1::FROZEN_MISS);
      return absl::FailedPreconditionError(
          "frozen: a bypass_cache request would compile, and a frozen server compiles nothing");
    }
    stats_->Count(v1::BYPASS);
    *compiling = true;
    return CompileMiss(Job{ns, graph, guards, options, key, v1::BYPASS, {}, std::move(times)},
                       caller);
  }

  // Probe the cache: a variant with these very guards, or, when the client
  // sent none, any variant that admits the graph's own input signature.
  const absl::StatusOr<v1::InputSignature> signature =
      req.has_signature() ? absl::StatusOr<v1::InputSignature>(req.signature())
                          : cache::SignatureFromGraph(graph);
  cache::ProbeRequest probe{ns, key};
  if (signature.ok()) probe.signature = *signature;
  if (req.has_guards() || !signature.ok()) probe.guards = guards;
  ASSIGN_OR_RETURN(cache::ProbeResult found, cache_->Probe(probe));
  stats_->CountCorruptArtifacts(found.quarantined);
  if (found.lookup.outcome == v1::HIT) {
    stats_->Count(v1::HIT);
    v1::CompileResponse resp;
    resp.set_key(key);
    resp.set_digest(found.lookup.digest);
    *resp.mutable_artifact() = std::move(found.artifact->artifact);
    resp.set_outcome(v1::HIT);
    return resp;
  }
  const int variants = found.lookup.variants;

  MissRecord record;
  record.misses = std::move(found.lookup.misses);
  record.client_reason = req.recompile_reason().substr(0, kMaxClientReasonBytes);
  Family family;
  if (options_.automatic_dynamic) {
    // Graphs over the limit get no family: skip them before copying them.
    if (req.graph().ByteSizeLong() <= kMaxFamilyGraphBytes) {
      family = times.Time("family", [&] { return FindFamily(ns, graph, options); });
    }
  }
  const bool other_key = family.record.has_value() && family.record->key() != key;
  // A client that keeps its sizes static gets its graph compiled as sent;
  // the family still words its recompile reasons.
  const bool symbols_allowed = !req.static_shapes();
  if (other_key && signature.ok()) {
    // Another graph of the family is cached: its variants, checked against
    // these inputs, are this compile's recompile reasons, and one that admits
    // them serves this graph when it is an instance of the family's graph.
    const absl::Status instance = cache::CheckInstance(family.record->graph(), family.positional);
    std::string admitting;  // the digest of the first variant that admits
    auto entry = cache_->GetEntry(ns, family.record->key());
    for (int i = 0; entry.ok() && i < entry->variants_size(); ++i) {
      v1::VariantMiss m;
      m.set_variant(i);
      m.set_digest(entry->variants(i).digest());
      m.set_key(family.record->key());
      auto failed = cache::CheckGuards(entry->variants(i).guards(), *signature);
      if (!failed.ok()) {
        m.set_failed_guard(std::string(failed.status().message()));
      } else if (failed->has_value()) {
        m.set_failed_guard(**failed);
      } else {
        if (instance.ok() && admitting.empty() && symbols_allowed) admitting = m.digest();
        m.set_failed_guard(
            !instance.ok()    ? absl::StrCat("its guards admit these inputs, but this graph is ",
                                             instance.message())
            : symbols_allowed ? "its guards admit these inputs and this graph is an instance of "
                                "its graph"
                              : "its guards admit these inputs and this graph is an instance of "
                                "its graph, but the request keeps its sizes static");
      }
      record.misses.push_back(std::move(m));
    }
    auto artifact = admitting.empty()
                        ? absl::StatusOr<cache::VerifiedArtifact>(absl::NotFoundError(""))
                        : ReadArtifact(admitting);
    if (artifact.ok()) {  // a corrupt one is quarantined: compile instead
      v1::CompileResponse resp;
      *resp.mutable_artifact() = std::move(artifact->artifact);
      cache_->RecordHit(ns, family.record->key(), admitting);
      if (!frozen_ && !req.frozen()) {
        // Under this graph's own key too, so that its next Lookup hits.
        cache::PublishRequest alias{
            ns, key, graph.name(), options.backend(), guards, std::move(artifact->bytes), {}};
        ASSIGN_OR_RETURN(const cache::Published published, cache_->Publish(alias));
        stats_->CountEvictions(published.evicted_variants);
      }
      stats_->Count(v1::HIT);
      resp.set_key(key);
      resp.set_digest(admitting);
      resp.set_outcome(v1::HIT);
      return resp;
    }
  }

  if (frozen_ || req.frozen()) {
    stats_->Count(v1::FROZEN_MISS);
    return absl::FailedPreconditionError(
        absl::StrCat(frozen_ ? "the server is frozen" : "the request is frozen",
                     " and compiles nothing: ", MissReasons(key, variants, record.misses)));
  }
  if (variants >= static_cast<int>(options_.cache_size_limit)) {
    stats_->Count(v1::CACHE_LIMIT);
    return absl::ResourceExhaustedError(
        absl::StrCat("cache_size_limit (", options_.cache_size_limit, ") reached for key ", key,
                     "; recompile reasons: ", MissReasons(key, variants, record.misses)));
  }
  // CompileMiss counts the miss: the variant may be published by an
  // identical compile before this one gets to run.
  const v1::LookupOutcome outcome = variants == 0 ? v1::FULL_MISS : v1::GUARD_MISS;
  if (other_key && symbols_allowed && family.record_static && family.positional_static) {
    // Automatic dynamic: the sizes that changed become symbols.
    auto general = cache::Generalize(family.record->graph(), family.positional);
    if (general.ok()) {
      v1::Graph proto = cache::ConstantsAsInts(general->graph);
      proto.set_name(graph.name());
      auto built = BuildVerified(proto, options_.graph_limits);
      if (built.ok()) {
        std::vector<std::string> dims;
        for (size_t k = 0; k < general->symbols.size(); ++k) {
          std::vector<std::string> where;
          for (auto [i, d] : general->dims[k]) {
            where.push_back(absl::StrCat(
                "input ", i, " '", graph.value(graph.inputs()[i].value).name, "' size[", d, "]"));
          }
          dims.push_back(absl::StrCat(general->symbols[k], ": ", absl::StrJoin(where, ", ")));
        }
        const std::string general_key = ir::CacheKey(*built, options);
        v1::GuardSet general_guards = cache::GeneralizeGuards(guards, *general);
        record.automatic_dynamic = absl::StrJoin(dims, "; ");
        record.family = family.id;
        record.family_record.set_key(general_key);
        *record.family_record.mutable_graph() = std::move(general->graph);
        record.alias_key = key;
        record.alias_guards = guards;
        *compiling = true;
        return CompileMissTiered(Job{ns, *built, general_guards, options, general_key, outcome,
                                     std::move(record), std::move(times)},
                                 caller, req.quick_first());
      }
    }
  }
  // The family's record becomes this graph, unless it is symbolic and this
  // graph is not: the most general graph seen serves the most.
  if (!family.id.empty() &&
      !(family.record.has_value() && !family.record_static && family.positional_static)) {
    record.family = family.id;
    record.family_record.set_key(key);
    *record.family_record.mutable_graph() = std::move(family.positional);
  }
  *compiling = true;
  return CompileMissTiered(
      Job{ns, graph, guards, options, key, outcome, std::move(record), std::move(times)}, caller,
      req.quick_first());
}

Engine::Family Engine::FindFamily(const std::string& ns, const ir::Graph& graph,
                                  const v1::CompileOptions& options) {
  Family f;
  f.positional = cache::PositionalForm(graph.ToProto());
  if (f.positional.ByteSizeLong() > kMaxFamilyGraphBytes) return f;
  f.id = cache::ShapeFamily(f.positional,
                            absl::StrCat(ir::DeterministicBytes(options), KILN_COMPILER_VERSION));
  // A record that cannot be read only loses the generalization; the next
  // publish of the family overwrites it.
  f.positional_static = cache::IsStatic(f.positional);
  auto record = cache_->GetFamily(ns, f.id);
  if (record.ok()) {
    f.record = *std::move(record);
    f.record_static = cache::IsStatic(f.record->graph());
  }
  return f;
}

std::string Engine::FlightKey(const Job& job) {
  return absl::StrCat(job.ns, "\n", job.key, "\n", ir::DeterministicBytes(job.guards),
                      job.outcome == v1::BYPASS ? "\nbypass" : "", job.quick ? "\nquick" : "");
}

absl::StatusOr<v1::CompileResponse> Engine::CompileMiss(Job job, Caller* caller) {
  const bool bypass = job.outcome == v1::BYPASS;
  const std::string flight_key = FlightKey(job);
  std::shared_ptr<Flight> flight;
  bool leader = false;
  {
    absl::MutexLock l(&flights_mu_);
    auto& slot = flights_[flight_key];
    // A flight whose callers all left is being cancelled: a new caller
    // starts a flight of its own instead of inheriting the cancellation.
    if (slot == nullptr || slot->cancel.load()) {
      slot = std::make_shared<Flight>();
      leader = true;
    }
    flight = slot;
    ++flight->waiters;
  }
  if (!leader) {
    if (!bypass && !job.quick) stats_->Count(job.outcome);
    stats_->CountSingleFlightJoin();
    return AwaitFlight(flight, caller);
  }

  // The leader compiles on its own thread. Its client leaving counts as one
  // caller gone, as a waiting caller's does: the last one cancels.
  ++in_flight_;
  if (caller != nullptr) caller->OnGone([flight] { flight->Leave(); });
  flight->result = RunJob(job, *flight);
  if (caller != nullptr) caller->OnGone(nullptr);
  FinishFlight(flight, flight_key);
  if (caller != nullptr && caller->gone()) {
    return absl::CancelledError("the client went away before the compile finished");
  }
  return flight->result;
}

absl::StatusOr<v1::CompileResponse> Engine::RunJob(Job& job, Flight& flight) {
  // A quick job is neither probed nor published, and the optimized compile
  // that runs beside it counts the miss.
  const bool bypass = job.outcome == v1::BYPASS || job.quick;
  const std::string& ns = job.ns;
  const std::string& key = job.key;
  const ir::Graph& graph = job.graph;
  const v1::CompileOptions& options = job.options;
  // A quick job takes no compile worker: its artifact is the graph for
  // ATen, built in milliseconds (server/backend.cc), so its caller is
  // answered at once however many compiles hold or wait for workers. (Where
  // it compiles quick kernels instead, the native compile slots bound them.)
  // Quick jobs are bounded by the background compiles they come with.
  absl::StatusOr<CompileSlots::Slot> slot =
      job.quick ? CompileSlots::Slot() : slots_.Acquire(&flight.cancel);
  if (!slot.ok()) {
    if (!bypass) stats_->Count(job.outcome);
    return slot.status();
  }
  v1::CompileResponse resp;
  resp.set_key(key);
  // A flight for the same guards may have published while this one waited.
  if (!bypass) {
    cache::ProbeRequest probe{ns, key};
    probe.guards = job.guards;
    auto found = cache_->Probe(probe);
    if (found.ok()) stats_->CountCorruptArtifacts(found->quarantined);
    if (found.ok() && found->lookup.outcome == v1::HIT) {
      // Served from the cache after all: a hit, not a miss.
      stats_->Count(v1::HIT);
      resp.set_digest(found->lookup.digest);
      resp.set_outcome(v1::HIT);
      *resp.mutable_artifact() = std::move(found->artifact->artifact);
      return resp;
    }
    stats_->Count(job.outcome);
  }
  if (flight.cancel.load()) {
    return absl::CancelledError("every client waiting for this compile went away");
  }
  ASSIGN_OR_RETURN(const Backend* backend, backends_.Find(options.backend()));
  std::map<std::string, std::string> trace;
  CompileInput input{graph, job.guards, options, key, &trace, &flight.cancel, job.quick};
  RequestLog* const log = options_.step_log;
  if (log) log->Step("compile", "begin", ns, key, graph.name(), options.backend());
  auto artifact = backend->Compile(input, &job.times);
  if (log) {
    log->Step("compile", "end", ns, key, graph.name(),
              absl::StatusCodeToString(artifact.status().code()));
  }
  if (absl::IsCancelled(artifact.status())) return artifact.status();
  stats_->CountCompile(artifact.ok());
  if (!artifact.ok() && job.quick) return artifact.status();
  if (!artifact.ok()) {
    if (ns != kMinifyNamespace) RecordFailure(ns, key, artifact.status(), trace);
    v1::CompileRequest request;
    graph.ToProto(request.mutable_graph());
    *request.mutable_guards() = job.guards;
    *request.mutable_options() = options;
    request.set_namespace_(ns);
    PersistFailure(request, key, artifact.status(), &trace);
    return artifact.status();
  }
  artifact->mutable_trace()->insert(trace.begin(), trace.end());
  for (const auto& p : job.times.phases()) *artifact->add_compile_times() = p;
  std::string bytes = ir::DeterministicBytes(*artifact);
  resp.set_outcome(job.outcome);
  if (job.quick) {
    stats_->CountQuickCompile();
    resp.set_quick(true);
    resp.set_digest(Sha256Hex(bytes));
    *resp.mutable_artifact() = *std::move(artifact);
    return resp;
  }
  if (bypass) {
    resp.set_digest(Sha256Hex(bytes));
  } else {
    const MissRecord& record = job.record;
    cache::PublishRequest pub{ns,         key,   graph.name(), options.backend(),
                              job.guards, bytes, record.misses};
    pub.automatic_dynamic = record.automatic_dynamic;
    pub.client_reason = record.client_reason;
    pub.family = record.family;
    pub.family_record = record.family_record;
    if (log) log->Step("store", "begin", ns, key, graph.name());
    ASSIGN_OR_RETURN(const cache::Published published,
                     job.times.Time("store", [&] { return cache_->Publish(pub); }));
    stats_->CountEvictions(published.evicted_variants);
    if (log) log->Step("store", "end", ns, key, graph.name());
    if (!record.alias_key.empty()) {
      cache::PublishRequest alias{ns,
                                  record.alias_key,
                                  graph.name(),
                                  options.backend(),
                                  record.alias_guards,
                                  std::move(bytes),
                                  {}};
      ASSIGN_OR_RETURN(const cache::Published aliased, cache_->Publish(alias));
      stats_->CountEvictions(aliased.evicted_variants);
    }
    resp.set_digest(published.digest);
  }
  for (const auto& p : job.times.phases()) stats_->RecordPhase(p.phase(), p.micros());
  // Statistics are written with every publish (and by the periodic flush).
  if (!bypass) (void)stats_->Flush();
  *resp.mutable_artifact() = *std::move(artifact);
  for (const auto& m : job.record.misses) *resp.add_misses() = m;
  return resp;
}

void Engine::FinishFlight(const std::shared_ptr<Flight>& flight, const std::string& flight_key) {
  {
    absl::MutexLock l(&flights_mu_);
    auto it = flights_.find(flight_key);
    if (it != flights_.end() && it->second == flight) flights_.erase(it);
  }
  flight->done.Notify();
  --in_flight_;
  // A large compile frees most of what it allocated; hand it back to the
  // system instead of keeping it in the allocator's free lists.
  malloc_trim(0);
}

absl::StatusOr<v1::CompileResponse> Engine::AwaitFlight(const std::shared_ptr<Flight>& flight,
                                                        Caller* caller) {
  while (!flight->done.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
    if (caller != nullptr && caller->gone()) {
      flight->Leave();
      return absl::CancelledError("the client went away before the compile finished");
    }
  }
  return flight->result;
}

absl::StatusOr<Engine::LookupReply> Engine::Lookup(const v1::LookupRequest& req) {
  const std::string& ns = req.namespace_();
  RETURN_IF_ERROR(cache::ValidateNamespace(ns));
  if (req.has_report()) RecordReport(ns, req.report());
  std::string key;
  v1::InputSignature signature = req.signature();
  int64_t key_micros = 0;
  switch (req.what_case()) {
    case v1::LookupRequest::kGraph: {
      const absl::Time start = absl::Now();
      const std::string id = Sha256Hex(absl::StrCat(ir::DeterministicBytes(req.graph()), "\n",
                                                    ir::DeterministicBytes(req.options())));
      if (req.has_signature()) {
        absl::MutexLock l(&keys_mu_);
        if (auto it = keys_.find(id); it != keys_.end()) key = it->second;
      }
      if (key.empty()) {
        ASSIGN_OR_RETURN(ir::Graph graph, BuildVerified(req.graph(), options_.graph_limits));
        v1::CompileOptions options = ir::NormalizeOptions(req.options(), &graph);
        RETURN_IF_ERROR(ApplyRequestOptions(graph, &options).status());
        key = ir::CacheKey(graph, options);
        if (!req.has_signature()) {
          ASSIGN_OR_RETURN(signature, cache::SignatureFromGraph(graph));
        }
        absl::MutexLock l(&keys_mu_);
        if (keys_.emplace(id, key).second) key_order_.push_back(id);
        if (key_order_.size() > kRememberedKeys) {
          keys_.erase(key_order_.front());
          key_order_.pop_front();
        }
      }
      key_micros = absl::ToInt64Microseconds(absl::Now() - start);
      break;
    }
    case v1::LookupRequest::kKey:
      key = req.key();
      if (!IsHexDigest(key)) {
        return absl::InvalidArgumentError(
            absl::StrCat("key: '", key, "' is not a hex SHA-256 (64 lowercase hex digits)"));
      }
      if (!req.has_signature()) {
        return absl::InvalidArgumentError("signature: required when looking up by key");
      }
      break;
    case v1::LookupRequest::WHAT_NOT_SET:
      return absl::InvalidArgumentError("what: give a graph or a key");
  }
  cache::ProbeRequest probe{ns, key, signature};
  probe.read_artifact = req.include_artifact();
  probe.parse_artifact = false;
  ASSIGN_OR_RETURN(cache::ProbeResult found, cache_->Probe(probe));
  stats_->CountCorruptArtifacts(found.quarantined);
  // A second artifact that cannot be served is the reply.
  if (found.unreadable.size() > 1) return found.unreadable.back();
  const cache::LookupResult& r = found.lookup;
  LookupReply reply;
  v1::LookupResponse& resp = reply.response;
  resp.set_key(key);
  resp.set_key_micros(key_micros);
  // A corrupt artifact was quarantined, its variants dropped: the reply is
  // what the cache holds now.
  if (!found.unreadable.empty()) resp.set_reason(std::string(found.unreadable[0].message()));
  if (found.artifact.has_value()) reply.artifact = std::move(found.artifact->bytes);
  if (r.outcome == v1::HIT) {
    stats_->Count(v1::HIT);
    resp.set_outcome(v1::HIT);
    resp.set_digest(r.digest);
    resp.set_reason("hit");
    return reply;
  }
  for (auto& m : r.misses) *resp.add_misses() = m;
  v1::LookupOutcome outcome = r.outcome;
  if (frozen_) {
    outcome = v1::FROZEN_MISS;
  } else if (r.variants >= static_cast<int>(options_.cache_size_limit)) {
    outcome = v1::CACHE_LIMIT;
  }
  stats_->Count(outcome);
  resp.set_outcome(outcome);
  std::string reason = MissReasons(key, r.variants, r.misses);
  if (outcome == v1::FROZEN_MISS) reason = absl::StrCat("frozen: ", reason);
  if (outcome == v1::CACHE_LIMIT) {
    reason = absl::StrCat("cache_size_limit (", options_.cache_size_limit, ") reached: ", reason);
  }
  if (!resp.reason().empty()) reason = absl::StrCat(resp.reason(), "; ", reason);
  resp.set_reason(reason);
  return reply;
}

absl::StatusOr<v1::GetArtifactResponse> Engine::GetArtifact(const v1::GetArtifactRequest& req,
                                                            bool scoped) {
  if (!IsHexDigest(req.digest())) {
    return absl::InvalidArgumentError(
        absl::StrCat("digest: '", req.digest().substr(0, 80), "' is not a hex SHA-256"));
  }
  if (scoped) {
    RETURN_IF_ERROR(cache::ValidateNamespace(req.namespace_()));
    ASSIGN_OR_RETURN(std::vector<cache::Cache::EntrySummary> entries,
                     cache_->List(req.namespace_()));
    bool named = false;
    for (const auto& e : entries) {
      for (const auto& v : e.entry.variants()) named = named || v.digest() == req.digest();
    }
    if (!named) {
      return absl::NotFoundError(absl::StrCat("artifact ", req.digest(),
                                              ": not found in namespace '", req.namespace_(), "'"));
    }
  }
  v1::GetArtifactResponse resp;
  ASSIGN_OR_RETURN(cache::VerifiedArtifact artifact, ReadArtifact(req.digest()));
  *resp.mutable_artifact() = std::move(artifact.artifact);
  resp.set_digest(req.digest());
  return resp;
}

v1::StatsResponse Engine::Stats() const {
  v1::StatsResponse resp;
  v1::StoredStats stats = stats_->record();
  *resp.mutable_counters() = stats.counters();
  for (const auto& p : stats.phases()) *resp.add_phases() = p;
  cache::Cache::Totals t = cache_->totals();
  resp.set_entries(t.entries);
  resp.set_variants(t.variants);
  resp.set_bytes(t.bytes);
  resp.set_byte_budget(cache_->byte_budget());
  resp.set_frozen(frozen_);
  resp.set_compiler_version(KILN_COMPILER_VERSION);
  resp.set_in_flight(in_flight_);
  if (options_.kernel_cache != nullptr) {
    const codegen::KernelCache::Stats k = options_.kernel_cache->stats();
    v1::KernelCacheStats* out = resp.mutable_kernel_cache();
    out->set_hits(k.hits);
    out->set_misses(k.misses);
    out->set_entries(k.entries);
    out->set_bytes(k.bytes);
    out->set_byte_budget(options_.kernel_cache->capacity());
    out->set_evictions(k.evictions);
  }
  return resp;
}

absl::StatusOr<v1::ListEntriesResponse> Engine::ListEntries(const v1::ListEntriesRequest& req) {
  if (req.namespace_() != "*") RETURN_IF_ERROR(cache::ValidateNamespace(req.namespace_()));
  ASSIGN_OR_RETURN(auto entries, cache_->List(req.namespace_()));
  v1::ListEntriesResponse resp;
  for (const auto& e : entries) *resp.add_entries() = ToEntryInfo(e.ns, e.key, e.entry, false);
  return resp;
}

void Engine::RecordFailure(const std::string& ns, const std::string& key, const absl::Status& error,
                           const std::map<std::string, std::string>& trace) {
  constexpr size_t kKept = 64;
  const std::string id = FailureId(ns, key);
  absl::MutexLock l(&failures_mu_);
  if (!failures_.count(id)) failure_order_.push_back(id);
  v1::FailedCompile& f = failures_[id];
  f.Clear();
  f.set_unix_micros(absl::ToUnixMicros(absl::Now()));
  f.set_error(std::string(error.message()));
  f.mutable_trace()->insert(trace.begin(), trace.end());
  while (failure_order_.size() > kKept) {
    failures_.erase(failure_order_.front());
    failure_order_.pop_front();
  }
}

absl::StatusOr<v1::GetEntryResponse> Engine::GetEntry(const v1::GetEntryRequest& req) {
  RETURN_IF_ERROR(cache::ValidateNamespace(req.namespace_()));
  if (!IsHexDigest(req.key())) {
    return absl::InvalidArgumentError(absl::StrCat("key: '", req.key(), "' is not a hex SHA-256"));
  }
  v1::GetEntryResponse resp;
  bool failed = false;
  {
    absl::MutexLock l(&failures_mu_);
    auto it = failures_.find(FailureId(req.namespace_(), req.key()));
    if (it != failures_.end()) {
      *resp.mutable_last_failure() = it->second;
      failed = true;
    }
  }
  auto e = cache_->GetEntry(req.namespace_(), req.key());
  if (absl::IsNotFound(e.status()) && failed) {
    resp.mutable_entry()->set_namespace_(req.namespace_());
    resp.mutable_entry()->set_key(req.key());
    return resp;
  }
  if (!e.ok()) return e.status();
  *resp.mutable_entry() = ToEntryInfo(req.namespace_(), req.key(), *e, true);
  return resp;
}

absl::StatusOr<v1::EvictResponse> Engine::Evict(const v1::EvictRequest& req) {
  RETURN_IF_ERROR(cache::ValidateNamespace(req.namespace_()));
  if (!IsHexDigest(req.key())) {
    return absl::InvalidArgumentError(absl::StrCat("key: '", req.key(), "' is not a hex SHA-256"));
  }
  ASSIGN_OR_RETURN(auto freed, cache_->Evict(req.namespace_(), req.key()));
  v1::EvictResponse resp;
  resp.set_variants(freed.first);
  resp.set_bytes(freed.second);
  return resp;
}

}  // namespace kiln::server
