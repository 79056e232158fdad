// Test-only harness of the gradient checks (grad_check_test.cc and the
// grad_check_*_test.cc case files): random inputs, graph helpers, Check
// (one op against libtorch's autograd; see grad_check_test.cc), and the
// functions that add each family's cases.
//
// Not thread-safe: one random generator and one set of notes per process.
#ifndef KILN_COMPILER_AUTOGRAD_GRAD_CHECK_TEST_UTIL_H_
#define KILN_COMPILER_AUTOGRAD_GRAD_CHECK_TEST_UTIL_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "compiler/autograd/joint_graph.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/graph.h"

namespace kiln::autograd::grad_check_test {

using ir::Argument;
using ir::ValueId;

inline constexpr double kRtol = 1e-7;
inline constexpr double kAtol = 1e-9;
inline constexpr int64_t kEnd = std::numeric_limits<int64_t>::max();

// ---------------------------------------------------------------------------
// Random inputs.

std::mt19937_64& Rng();

// A random size in [lo, hi].
int64_t Dim(int64_t lo = 2, int64_t hi = 5);

at::Tensor Randn(at::IntArrayRef sizes);
// Values in [0.5, 1.5): inside the domain of log, sqrt, pow...
at::Tensor Positive(at::IntArrayRef sizes);
// Values with |x| >= 0.5: safe divisors.
at::Tensor AwayFromZero(at::IntArrayRef sizes);
// An [a, b] tensor that is the transpose of a contiguous [b, a] one.
at::Tensor Transposed(int64_t a, int64_t b);
at::Tensor Indices(at::IntArrayRef sizes, int64_t n);
at::Tensor Mask(at::IntArrayRef sizes);

// ---------------------------------------------------------------------------
// Graph helpers.

v1::DType DTypeOf(at::ScalarType t);
ir::TensorMeta MetaOf(const at::Tensor& t, bool requires_grad);

Argument Str(std::string s);
Argument Refs(std::vector<ValueId> vs);
Argument DType(v1::DType d);
Argument Bools(std::vector<bool> b);
using ir::Bool;
using ir::Float;
using ir::Int;
using ir::Ints;
using ir::Kwarg;
using ir::NoneArg;
using ir::Ref;

std::string Describe(const at::Tensor& t);
std::string FirstLine(const std::string& s);

// Notes gathered over the run (printed at the end): findings that are not
// failures of the derivative rules.
std::set<std::string>& Notes();

// Every node of `g` has an output some node or a graph output reads.
void ExpectNoDeadNodes(const ir::Graph& g);

// Runs `g` with every value as an output and compares what ATen computed
// with each value's metadata.
void ExpectMetadataMatches(const ir::Graph& g, const std::vector<at::Tensor>& inputs);

// ---------------------------------------------------------------------------
// One-op checks.

struct In {
  at::Tensor value;
  bool grad;
};
In G(at::Tensor t);
In N(at::Tensor t);

struct Options {
  // One per forward output: which ones receive a tangent. Empty: those
  // libtorch says are differentiable.
  std::vector<bool> receive;
  // A random op: the joint graph's forward draws its own numbers, so only
  // `check_random` compares (given the joint graph's inputs and outputs).
  bool random = false;
  std::function<void(const std::vector<at::Tensor>& joint_inputs,
                     const std::vector<at::Tensor>& joint_outputs, const JointGraph& jg)>
      check_random;
  // The reference forward, for an op libtorch cannot differentiate itself:
  // the same function written with ops it can. Empty: the op through ATen.
  std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)> reference;
};

// `target` applied to `inputs` (input i is ir::Ref(i) in `args`/`kwargs`).
// Returns false when libtorch does not have the op (it is newer than this
// libtorch).
bool Check(const std::string& target, const std::vector<In>& inputs, std::vector<Argument> args,
           std::vector<Argument> kwargs = {}, const Options& options = {});

// ---------------------------------------------------------------------------
// The cases, one per op with a rule. Each returns false when this libtorch
// lacks the op.

using Case = std::function<bool()>;

bool Unary(const std::string& target, std::function<at::Tensor(at::IntArrayRef)> make);

// Each adds one family's cases to `c`, by target.
void AddPointwiseCases(std::map<std::string, Case>& c);  // grad_check_pointwise_test.cc
void AddReductionCases(std::map<std::string, Case>& c);  // grad_check_reductions_test.cc
void AddViewCases(std::map<std::string, Case>& c);       // grad_check_views_test.cc
void AddMatmulCases(std::map<std::string, Case>& c);     // grad_check_matmul_test.cc

}  // namespace kiln::autograd::grad_check_test

#endif  // KILN_COMPILER_AUTOGRAD_GRAD_CHECK_TEST_UTIL_H_
