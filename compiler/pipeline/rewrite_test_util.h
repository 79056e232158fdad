// What the graph-rewrite tests (matmul-layouts, unfuse-addmm, conv-layouts,
// merge-sums, elide-copies) and the loop passes' tests that build graphs
// (fold-column-sums, cat-in-place) share: building a graph node by node through the
// op registry, contiguous copies, strides as integers, and counting a
// graph's nodes of a target.
#ifndef KILN_COMPILER_PIPELINE_REWRITE_TEST_UTIL_H_
#define KILN_COMPILER_PIPELINE_REWRITE_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "compiler/ir/builder.h"
#include "compiler/ops/registry.h"

namespace kiln::pipeline {

// `target` over `args` and `kwargs`, its metadata inferred; its first
// output (kNoValue and a test failure when the registry refuses it).
inline ir::ValueId Op(ir::GraphBuilder& b, const std::string& target,
                      std::vector<ir::Argument> args, std::vector<ir::Argument> kwargs = {}) {
  auto out = ops::Emit(b, ops::DefaultRegistry(), target, std::move(args), std::move(kwargs));
  EXPECT_TRUE(out.ok()) << target << ": " << out.status();
  return out.ok() ? (*out)[0] : ir::kNoValue;
}

// Contiguous metadata of `sizes` and `dtype` on `device` ("cpu", "cuda").
inline ir::TensorMeta DeviceMeta(const std::vector<int64_t>& sizes, v1::DType dtype,
                                 const std::string& device) {
  ir::TensorMeta m = ir::ContiguousMeta(sizes, dtype);
  m.device_type = device;
  return m;
}

// A contiguous copy of `x` (aten.clone, memory_format contiguous).
inline ir::ValueId Contiguous(ir::GraphBuilder& b, ir::ValueId x) {
  return Op(b, "aten.clone.default", {ir::Ref(x)},
            {ir::Argument{"memory_format", v1::CONTIGUOUS_FORMAT}});
}

// The strides of `m`, -1 for a symbolic one.
inline std::vector<int64_t> Strides(const ir::TensorMeta& m) {
  std::vector<int64_t> s;
  for (const ir::SymInt& x : m.strides) s.push_back(x.is_constant() ? x.constant() : -1);
  return s;
}

// The nodes of `g` whose target is `target`.
inline int Count(const ir::Graph& g, const std::string& target) {
  int n = 0;
  for (const ir::Node& node : g.nodes()) n += node.target == target;
  return n;
}

}  // namespace kiln::pipeline

#endif  // KILN_COMPILER_PIPELINE_REWRITE_TEST_UTIL_H_
