#include "server/metrics.h"

#include <exception>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"

namespace kiln::server {
namespace {

prometheus::MetricFamily Family(const std::string& name, const std::string& help,
                                prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

void AddValue(prometheus::MetricFamily* f, double value,
              std::vector<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (f->type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f->metric.push_back(std::move(m));
}

}  // namespace

std::vector<prometheus::MetricFamily> EngineMetrics::Collect() const {
  const v1::StatsResponse s = engine_->Stats();
  const v1::CacheCounters& c = s.counters();
  std::vector<prometheus::MetricFamily> out;

  auto lookups = Family("kiln_lookups_total", "Lookups and compile probes by outcome",
                        prometheus::MetricType::Counter);
  for (const auto& [outcome, n] :
       std::vector<std::pair<const char*, uint64_t>>{{"hit", c.hits()},
                                                     {"guard_miss", c.guard_misses()},
                                                     {"full_miss", c.full_misses()},
                                                     {"frozen_miss", c.frozen_misses()},
                                                     {"cache_limit", c.cache_limit_hits()},
                                                     {"bypass", c.bypasses()}}) {
    AddValue(&lookups, static_cast<double>(n), {{"outcome", outcome}});
  }
  out.push_back(std::move(lookups));

  for (const auto& [name, help, n] : std::vector<std::tuple<const char*, const char*, uint64_t>>{
           {"kiln_compiles_total", "Compiles run", c.compiles()},
           {"kiln_compile_errors_total", "Compiles that failed", c.compile_errors()},
           {"kiln_corrupt_artifacts_total", "Artifacts quarantined", c.corrupt_artifacts()},
           {"kiln_evictions_total", "Variants evicted", c.evictions()},
           {"kiln_single_flight_joins_total", "Compiles that joined one in flight",
            c.single_flight_joins()},
           {"kiln_quick_compiles_total",
            "Artifacts compiled at a backend's quick level, each also compiled optimized",
            c.quick_compiles()},
           {"kiln_function_filter_matched_total",
            "Compiles whose graph name the function filter matched", c.function_filter_matched()},
           {"kiln_function_filter_eager_total",
            "Compiles the function filter sent to the eager backend", c.function_filter_eager()}}) {
    auto f = Family(name, help, prometheus::MetricType::Counter);
    AddValue(&f, static_cast<double>(n));
    out.push_back(std::move(f));
  }

  for (const auto& [name, help, v] : std::vector<std::tuple<const char*, const char*, double>>{
           {"kiln_cache_entries", "Cache keys held", static_cast<double>(s.entries())},
           {"kiln_cache_variants", "Variants held", static_cast<double>(s.variants())},
           {"kiln_cache_bytes", "Artifact bytes held", static_cast<double>(s.bytes())},
           {"kiln_cache_byte_budget", "Artifact bytes kept before eviction",
            static_cast<double>(s.byte_budget())},
           {"kiln_frozen", "1 when the server compiles nothing", s.frozen() ? 1.0 : 0.0},
           {"kiln_compiles_in_flight", "Compiles running or queued",
            static_cast<double>(s.in_flight())}}) {
    auto f = Family(name, help, prometheus::MetricType::Gauge);
    AddValue(&f, v);
    out.push_back(std::move(f));
  }

  if (s.has_kernel_cache()) {
    const v1::KernelCacheStats& k = s.kernel_cache();
    auto kernels = Family("kiln_kernels_total", "Kernels compiled, or served by the kernel cache",
                          prometheus::MetricType::Counter);
    AddValue(&kernels, static_cast<double>(k.hits()), {{"outcome", "reused"}});
    AddValue(&kernels, static_cast<double>(k.misses()), {{"outcome", "compiled"}});
    out.push_back(std::move(kernels));
    auto bytes = Family("kiln_kernel_cache_bytes", "Bytes of compiled kernels kept in memory",
                        prometheus::MetricType::Gauge);
    AddValue(&bytes, static_cast<double>(k.bytes()));
    out.push_back(std::move(bytes));
  }

  auto phases = Family("kiln_compile_phase_seconds", "Time spent per compile phase",
                       prometheus::MetricType::Histogram);
  for (const v1::PhaseStats& p : s.phases()) {
    const v1::Histogram& h = p.histogram();
    prometheus::ClientMetric m;
    m.label = {{"phase", p.phase()}};
    m.histogram.sample_count = h.count();
    m.histogram.sample_sum = h.sum() / 1e6;
    uint64_t cumulative = 0;
    for (int i = 0; i < h.bounds_size() && i < h.counts_size(); ++i) {
      cumulative += h.counts(i);
      m.histogram.bucket.push_back({cumulative, h.bounds(i) / 1e6});
    }
    m.histogram.bucket.push_back({h.count(), std::numeric_limits<double>::infinity()});
    phases.metric.push_back(std::move(m));
  }
  out.push_back(std::move(phases));
  return out;
}

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(
    const std::string& address, std::shared_ptr<EngineMetrics> metrics) {
  try {
    auto exposer = std::make_unique<prometheus::Exposer>(address);
    exposer->RegisterCollectable(metrics);
    return exposer;
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("metrics_listen: cannot serve metrics on ",
                                               address.substr(0, 200), ": ", e.what()));
  }
}

}  // namespace kiln::server
