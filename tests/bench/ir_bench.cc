// Google Benchmark of the graph IR's per-request work: building the IR from
// its wire form, verification, and the cache key.
//
//   build/bin/kiln_ir_bench
#include <benchmark/benchmark.h>

#include "compiler/ir/canonical.h"
#include "compiler/ir/graph.h"
#include "compiler/ir/verify.h"
#include "tests/integration/graphs.h"

namespace kiln {
namespace {

void BM_FromProto(benchmark::State& state) {
  const v1::Graph g = testing::ChainGraph(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(ir::Graph::FromProto(g));
}
BENCHMARK(BM_FromProto)->Arg(100)->Arg(1000)->Unit(benchmark::kMicrosecond);

void BM_Verify(benchmark::State& state) {
  const ir::Graph g = *ir::Graph::FromProto(testing::ChainGraph(static_cast<int>(state.range(0))));
  for (auto _ : state) benchmark::DoNotOptimize(ir::Verify(g));
}
BENCHMARK(BM_Verify)->Arg(100)->Arg(1000)->Unit(benchmark::kMicrosecond);

void BM_CacheKey(benchmark::State& state) {
  const ir::Graph g = *ir::Graph::FromProto(testing::ChainGraph(static_cast<int>(state.range(0))));
  for (auto _ : state) benchmark::DoNotOptimize(ir::CacheKey(g, v1::CompileOptions()));
}
BENCHMARK(BM_CacheKey)->Arg(100)->Arg(1000)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kiln

BENCHMARK_MAIN();
