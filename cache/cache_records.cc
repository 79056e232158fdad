// The records kept beside the cache's entries: failed compiles for record
// and replay ("r/<ns>/<id>") and graph-break reports ("b/<ns>/<job>").
#include <algorithm>
#include <map>
#include <memory>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cache/cache.h"
#include "cache/records.h"
#include "common/status_macros.h"
#include "rocksdb/db.h"
#include "rocksdb/iterator.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"

namespace kiln::cache {

using internal::FromRocks;
using internal::NowMicros;
using internal::Seal;
using internal::Unseal;

namespace {

std::string FailureKey(const std::string& ns, const std::string& id) {
  return absl::StrCat("r/", ns, "/", id);
}

}  // namespace

absl::Status Cache::RecordFailure(const v1::FailedCompile& failure) {
  absl::MutexLock w(&write_mu_);
  rocksdb::WriteBatch batch;
  const std::string mine = FailureKey(failure.namespace_(), failure.id());
  batch.Put(mine, Seal(failure));
  // Ids are the time in fixed-width hex: their order is age. The oldest
  // records beyond the namespace's limit go, and beyond the limit over all
  // namespaces (so that many namespaces cannot hold unbounded bytes).
  const std::string prefix = FailureKey(failure.namespace_(), "");
  std::vector<std::string> held;                         // this namespace's keys
  std::vector<std::pair<std::string, std::string>> all;  // (id, key), every namespace
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("r/"); it->Valid() && it->key().starts_with("r/"); it->Next()) {
    std::string key = it->key().ToString();
    if (key == mine) continue;
    if (absl::StartsWith(key, prefix)) held.push_back(key);
    all.emplace_back(key.substr(key.rfind('/') + 1), std::move(key));
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "listing failed compiles"));
  held.push_back(mine);
  std::sort(held.begin(), held.end());
  absl::flat_hash_set<std::string> dropped;
  for (size_t i = 0; i + kMaxFailuresPerNamespace < held.size(); ++i) dropped.insert(held[i]);
  all.emplace_back(failure.id(), mine);
  std::sort(all.begin(), all.end());
  size_t kept = all.size() - std::count_if(all.begin(), all.end(), [&](const auto& e) {
                  return dropped.contains(e.second);
                });
  for (size_t i = 0; kept > kMaxFailures && i < all.size(); ++i) {
    if (dropped.insert(all[i].second).second) --kept;
  }
  for (const std::string& key : dropped) batch.Delete(key);
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  return FromRocks(db_->Write(wo, &batch), "recording a failed compile");
}

absl::StatusOr<std::vector<v1::FailedCompile>> Cache::ListFailures(const std::string& ns) {
  std::vector<v1::FailedCompile> out;
  const std::string prefix = ns == "*" ? "r/" : FailureKey(ns, "");
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    v1::FailedCompile f;
    bool sealed = false;
    RETURN_IF_ERROR(Unseal(absl::string_view(it->value().data(), it->value().size()), &f, &sealed,
                           it->key().ToString()));
    out.push_back(std::move(f));
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "listing failed compiles"));
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.unix_micros() > b.unix_micros(); });
  return out;
}

absl::StatusOr<v1::FailedCompile> Cache::GetFailure(const std::string& ns, const std::string& id) {
  const std::string k = FailureKey(ns, id);
  std::string value;
  RETURN_IF_ERROR(FromRocks(db_->Get(rocksdb::ReadOptions(), k, &value),
                            absl::StrCat("failed compile ", id, " in namespace '", ns, "'")));
  v1::FailedCompile f;
  bool sealed = false;
  RETURN_IF_ERROR(Unseal(value, &f, &sealed, k));
  return f;
}

absl::Status Cache::RecordGraph(const std::string& ns, const v1::GraphReport& report) {
  const std::string rk = absl::StrCat("b/", ns, "/", report.job());
  absl::MutexLock l(&jobs_mu_);
  auto it = jobs_.find(rk);
  if (it == jobs_.end()) {
    if (jobs_.size() >= kMaxJobRecords) return absl::OkStatus();
    JobRecord record;
    std::string value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), rk, &value);
    bool sealed = false;
    if (s.ok() && !Unseal(value, &record.graphs, &sealed, rk).ok()) record.graphs.Clear();
    if (!s.ok() && !s.IsNotFound()) return FromRocks(s, absl::StrCat("reading ", rk));
    record.graphs.set_namespace_(ns);
    record.graphs.set_job(report.job());
    it = jobs_.emplace(rk, std::move(record)).first;
  }
  // Rows stay sorted by (function, graph).
  auto* rows = it->second.graphs.mutable_graphs();
  auto row = std::lower_bound(rows->begin(), rows->end(), report,
                              [](const v1::JobGraphs::Graph& g, const v1::GraphReport& r) {
                                return std::tie(g.function(), g.graph()) <
                                       std::tie(r.function(), r.graph());
                              });
  if (row == rows->end() || row->function() != report.function() ||
      row->graph() != report.graph()) {
    if (rows->size() >= kMaxGraphsPerJob) return absl::OkStatus();
    const int at = static_cast<int>(row - rows->begin());
    v1::JobGraphs::Graph* g = rows->Add();
    g->set_function(report.function());
    g->set_graph(report.graph());
    std::rotate(rows->begin() + at, rows->end() - 1, rows->end());
    row = rows->begin() + at;
  }
  row->set_graph_break(report.graph_break());
  row->set_reason(report.reason());
  *row->mutable_user_frames() = report.user_frames();
  row->set_reports(row->reports() + 1);
  row->set_last_unix_micros(NowMicros());
  it->second.dirty = true;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::JobGraphs>> Cache::ListJobGraphs(const std::string& ns,
                                                                const std::string& job) {
  std::map<std::string, v1::JobGraphs> out;
  const std::string prefix = ns == "*" ? "b/" : absl::StrCat("b/", ns, "/", job);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    const std::string rk = it->key().ToString();
    v1::JobGraphs graphs;
    bool sealed = false;
    if (!Unseal(absl::string_view(it->value().data(), it->value().size()), &graphs, &sealed, rk)
             .ok()) {
      continue;
    }
    out[rk] = std::move(graphs);
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "listing graph reports"));
  {
    absl::MutexLock l(&jobs_mu_);  // newer than what is on disk
    for (const auto& [rk, record] : jobs_) {
      if (absl::StartsWith(rk, prefix)) out[rk] = record.graphs;
    }
  }
  std::vector<v1::JobGraphs> jobs;
  for (auto& [rk, graphs] : out) {
    if (!job.empty() && graphs.job() != job) continue;
    jobs.push_back(std::move(graphs));
  }
  return jobs;
}

}  // namespace kiln::cache
