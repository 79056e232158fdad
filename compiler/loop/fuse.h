// Pass "fuse" (docs/architecture.md §5): the lowered nodes (lower.h)
// placed into kernels, greedily in topological order, and each kernel's
// loop IR (compiler/loop/kernel.h) built; views become index remaps over
// their base's storage and extern nodes stay steps of their own.
//
// For each node, the open kernels are tried newest first. A kernel is a
// candidate when joining it is legal, and joined when the target's policy
// finds it worth it; otherwise the node opens a kernel of its own:
//   - legal (fuse_values.cc): the node's output lies in the kernel's
//     iteration space (the whole space, or one value per row for reduction
//     results), every operand it reads from outside the kernel was produced
//     by a step scheduled before the kernel (so no cycle can form), and
//     nothing it reads is memory the kernel itself writes. A kernel may take
//     the shape of an order-preserving view of a value it computes
//     (reshape, flatten) to make a reader legal;
//   - profitable (FusionPolicy, supplied by the target): by default always
//     (every fusion removes a store and a load of a whole tensor), up to a
//     number of nodes per kernel when the target sets one.
// Vertical fusion takes a pointwise chain, and a reduction with its
// pointwise prologue and epilogue (softmax and layer norm are one kernel in
// several passes over each row); horizontal fusion puts siblings over the
// same iteration space in one kernel (they read their inputs once per
// point). Recomputation: a kernel reading a cheap pointwise value that
// another kernel computes computes it again from what that value reads (up
// to the policy's limits), so that the other kernel need not store it and
// the reader can fuse what follows; a broadcast of a per-row value is that
// value inside its kernel.
//
// Every decision is recorded, and every refusal with its reason, in
// `decisions` ("fuse: ...", "new kernel_N: ...; not fused: <kernel>:
// <reason>", "recompute: ...", "view: ...", "extern: ...").
//
// Pure function; thread-safe.
#ifndef KILN_COMPILER_LOOP_FUSE_H_
#define KILN_COMPILER_LOOP_FUSE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/ir/graph.h"
#include "compiler/loop/kernel.h"
#include "compiler/loop/lower.h"

namespace kiln::loop {

// A legal fusion, for the policy to weigh.
struct FusionCandidate {
  int kernel = 0;          // the open kernel the node may join
  int kernel_nodes = 0;    // nodes the kernel holds already
  bool reduction = false;  // the node is a reduction
};

// What the target finds worth doing among what is legal
// (target::Target::fusion_policy()).
struct FusionPolicy {
  // false: no node joins another's kernel (each runs in its own), and no
  // value is recomputed; for bisecting a wrong result down to fusion.
  bool fuse = true;
  // Nodes a kernel holds at most; 0: no limit.
  int max_kernel_nodes = 0;
  // Recomputation of a value another kernel computes: at most this many
  // nodes, reading at most this many whole-space tensors the reading kernel
  // does not read yet (two where the stored value would be one: the
  // producer need not write it, and the reader can fuse what follows).
  int max_recompute_nodes = 8;
  int max_recompute_loads = 2;
  // Rows whose mean and variance are computed in two sweeps (a sum, then
  // the squared deviations from its mean) rather than in one Welford sweep:
  // rows of the trailing, contiguous dims whose size is a constant of at
  // most this many elements (a norm layer's hidden size). The second sweep
  // reads the row from cache, so reading it twice costs little, and a plain
  // sum is cheaper than Welford's update (whose mean chain is a subtraction
  // and an FMA long). Two-pass is at least as accurate as Welford. Longer
  // rows, or rows of a symbolic size, keep Welford.
  int64_t two_pass_max_row = 16384;
  // A value that a later pass over the row reads again and that its node's
  // output is made of (a softmax's exp, divided by the row's sum) is stored
  // in that output's buffer and reloaded, rather than recomputed from the
  // inputs. Worth it where recomputing costs more than a store and a load
  // (a CPU's exp); a GPU keeps the row in registers or rereads the input
  // from cache, and recomputing costs it nothing but arithmetic.
  bool keep_in_output = true;

  // nullopt: join; else why not.
  std::optional<std::string> Refuse(const FusionCandidate& c) const;
};

struct FusedGraph {
  std::vector<Kernel> kernels;  // "kernel_<i>", in the order their steps run
  // In order: a kernel's launch, or a node left to ATen.
  struct Step {
    int kernel = -1;  // index into `kernels`; -1: an extern node
    int node = -1;    // the extern node's index in the graph
  };
  std::vector<Step> steps;
  // For each kernel, the graph values it computes (by ValueId).
  std::vector<std::vector<ir::ValueId>> computed;
  // Views: the materialized value each reads and its storage.
  std::map<ir::ValueId, ir::ValueId> view_root;
  // Values a kernel scatter-adds into: allocated filled with zeros.
  std::set<ir::ValueId> zeroed;
  std::vector<std::string> decisions;
};

// `nodes` is LowerNodes(graph)'s result.
absl::StatusOr<FusedGraph> Fuse(const ir::Graph& graph, const std::vector<NodeLowering>& nodes,
                                const FusionPolicy& policy = FusionPolicy());

// The decisions, the kernels and the steps, as readable text.
std::string PrintFused(const ir::Graph& graph, const FusedGraph& fused);

}  // namespace kiln::loop

#endif  // KILN_COMPILER_LOOP_FUSE_H_
