// libFuzzer target: a CompileRequest as kilnd parses and checks it (graph
// from proto with torch 2's conventions, verification and limits, shape
// rules against the metadata, cache key, guard set), and, for small graphs
// that pass, the kiln backend's lowering. Nothing may crash, hang or grow
// without bound; errors are fine.
#include <cstddef>
#include <cstdint>

#include "cache/guards.h"
#include "compiler/ir/canonical.h"
#include "compiler/ir/graph.h"
#include "compiler/ir/verify.h"
#include "compiler/loop/lowering.h"
#include "compiler/ops/registry.h"
#include "kiln/v1/service.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::v1::CompileRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  (void)kiln::cache::ValidateGuardSet(request.guards());
  auto graph = kiln::ir::Graph::FromProto(request.graph());
  if (!graph.ok()) return 0;
  if (!kiln::ir::Verify(*graph).ok()) return 0;
  if (!kiln::ops::CheckMetadata(kiln::ops::DefaultRegistry(), *graph).ok()) return 0;
  (void)kiln::ir::CacheKey(*graph, request.options());
  if (graph->nodes().size() <= 64) (void)kiln::loop::LowerGraph(*graph);
  return 0;
}
