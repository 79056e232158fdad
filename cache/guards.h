// Guards: whether a compiled variant may serve a call with given inputs.
//
// A v1::GuardSet is stored with each variant. On every cache lookup
// CheckGuards evaluates it against the caller's v1::InputSignature and either
// accepts, or names the first guard that fails in words a user can act on:
//
//   input 1 'y': size[0] is 5, but s0 = 4 (bound by input 0 'x' size[0])
//
// Size symbols ("s0") bind on first sight, in input order; size expressions
// ("2*s0") and shape guards ("s0 % 8 == 0") are SymExpr text (sym_expr.h).
//
// Thread-safety: all functions here are pure; they keep no state and may be
// called concurrently.
#ifndef KILN_CACHE_GUARDS_H_
#define KILN_CACHE_GUARDS_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/ir/graph.h"
#include "kiln/v1/guards.pb.h"

namespace kiln::cache {

// Checks that `guards` is well formed, for when a GuardSet is stored: every
// size, stride and shape-guard expression parses; every symbol such an
// expression uses is bound by some tensor guard's size that is a bare symbol
// (in any input: later inputs may bind symbols used earlier); an EXACT stride
// check has one stride per size. Errors are INVALID_ARGUMENT naming the guard:
//   shape guard 0 's3 > 2' uses symbol 's3', which no input size binds
//   tensor guard 1 'w' size[0]: malformed expression '2*': ...
//
// First, every expression is within `limits` (a server's configuration):
//   shape guard 2: an expression of 5000 characters, over the limit of 1024
//   (max_expr_length)
struct ExprLimits {
  int64_t max_length = 1024;
  int64_t max_depth = 256;  // parentheses nested; the parser's own bound
};
absl::Status ValidateGuardSet(const v1::GuardSet& guards, const ExprLimits& limits = {});

// Evaluates `guards` against `inputs`. Returns nullopt when every guard holds,
// otherwise the first failing guard in words, e.g.
//   input 0 'x': size[0] is 48, guard 's0 % 32 == 0' fails (s0 = 48)
// Checks run in this order, stopping at the first failure: the input count;
// then for each input in order its dtype, device (only when the guard has
// one; type and index), rank, each size, strides (per stride_check) and
// requires_grad (when check_requires_grad); then size and stride expressions
// that use a symbol first bound by a later input; then the shape guards in
// order; then the client guard digest. Inputs are named by the guard's name,
// or by index alone when it has none. An expression that cannot be evaluated
// for these sizes (division by zero, overflow) fails its guard.
//
// An error status means the guards themselves are malformed (INVALID_ARGUMENT,
// worded as ValidateGuardSet words it). Expressions are parsed as they are
// reached, so a malformed guard after the first failing one goes unreported:
// validate guard sets when they are stored. Work is linear in the size of the
// guards; on the success path the only allocations are one symbol table and
// the parsing of size expressions and shape guards (constant and bare-symbol
// sizes are not parsed).
absl::StatusOr<std::optional<std::string>> CheckGuards(const v1::GuardSet& guards,
                                                       const v1::InputSignature& inputs);

// The guards a graph's own input metadata implies: one TensorGuard per graph
// input, in order, named after the input value, with its dtype, device (when
// the metadata has one), sizes copied as they are (constants or symbolic
// expressions), an EXACT stride check with the strides copied, and
// check_requires_grad with the metadata's requires_grad. No shape guards.
// Expects a verified graph (ir::Verify); should an input's stride count differ
// from its rank anyway, its strides are left unchecked.
v1::GuardSet DeriveGuards(const ir::Graph& graph);

// The concrete signature the graph's input metadata describes. Fails with
// INVALID_ARGUMENT naming the input when a size, stride or storage offset is
// symbolic. SignatureFromGraph(g) passes DeriveGuards(g).
absl::StatusOr<v1::InputSignature> SignatureFromGraph(const ir::Graph& graph);

}  // namespace kiln::cache

#endif  // KILN_CACHE_GUARDS_H_
