// Bounds on what one graph may describe. Every request is hostile until
// checked: these keep the work and memory of checking one graph bounded, and
// keep every size computation inside int64 (a product of sizes that would
// overflow is refused before anything multiplies it).
//
// The constants are ceilings: GraphLimits, which a server takes from its
// configuration, may lower them and never raise them. Thread-safe.
#ifndef KILN_COMPILER_IR_LIMITS_H_
#define KILN_COMPILER_IR_LIMITS_H_

#include <cstdint>

namespace kiln::ir {

// Dimensions of one tensor (ATen allows 64).
inline constexpr int64_t kMaxRank = 64;
// Elements of one tensor, and the bound on every size, |stride| and storage
// offset: 2^48, 256 Ti elements, far beyond any device, and small enough that
// a product of two such numbers still fits in int64.
inline constexpr int64_t kMaxElements = int64_t{1} << 48;
// Results of one node (split, unbind, ...).
inline constexpr int64_t kMaxOutputsPerNode = 4096;
// Characters of one symbolic size expression ("8*s77 + 1"): enough for any
// shape torch writes, and a bound on what parsing and error messages see.
inline constexpr int64_t kMaxExprLength = 1024;
// Nesting of one guard expression.
inline constexpr int64_t kMaxExprDepth = 256;
// Nodes of one graph, by default (no ceiling beyond the request's bytes).
inline constexpr int64_t kDefaultMaxNodes = 100000;

// What ir::Verify enforces: the ceilings above, or less.
struct GraphLimits {
  int64_t max_nodes = kDefaultMaxNodes;
  int64_t max_rank = kMaxRank;
  int64_t max_elements = kMaxElements;
  int64_t max_outputs_per_node = kMaxOutputsPerNode;
  int64_t max_expr_length = kMaxExprLength;
};

}  // namespace kiln::ir

#endif  // KILN_COMPILER_IR_LIMITS_H_
