// kilnd's Prometheus metrics: at every scrape, the Engine's statistics (the
// same numbers as the Stats RPC) as Prometheus families, served over HTTP by
// prometheus-cpp's exposer (`--metrics_listen=127.0.0.1:9464`, path
// /metrics).
//
//   kiln_lookups_total{outcome="hit|guard_miss|full_miss|frozen_miss|cache_limit|bypass"}
//   kiln_compiles_total, kiln_compile_errors_total, kiln_corrupt_artifacts_total,
//   kiln_evictions_total, kiln_single_flight_joins_total           (counters)
//   kiln_cache_entries, kiln_cache_variants, kiln_cache_bytes,
//   kiln_cache_byte_budget, kiln_frozen, kiln_compiles_in_flight   (gauges)
//   kiln_compile_phase_seconds{phase="verify|key|lower|..."}      (histograms)
//
// Thread-safe: Collect may run on any thread; it only reads the Engine.
#ifndef KILN_SERVER_METRICS_H_
#define KILN_SERVER_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "server/engine.h"

namespace kiln::server {

class EngineMetrics : public prometheus::Collectable {
 public:
  // `engine` must outlive this.
  explicit EngineMetrics(const Engine* engine) : engine_(engine) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const Engine* engine_;
};

// Serves `metrics` at http://`address`/metrics until destroyed.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(
    const std::string& address, std::shared_ptr<EngineMetrics> metrics);

}  // namespace kiln::server

#endif  // KILN_SERVER_METRICS_H_
