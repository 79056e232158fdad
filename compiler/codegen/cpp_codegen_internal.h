// Internal to compiler/codegen: the C++ backend's KernelEmitter, which
// writes one loop::Kernel as an extern "C" function. Its member functions
// are defined by part: cpp_codegen.cc the function and its loop nest,
// cpp_emit_statements.cc the statements and their addresses,
// cpp_emit_reductions.cc the accumulators of reductions, and
// cpp_emit_sweeps.cc the inner sweep of each pass in each of its modes.
#ifndef KILN_COMPILER_CODEGEN_CPP_CODEGEN_INTERNAL_H_
#define KILN_COMPILER_CODEGEN_CPP_CODEGEN_INTERNAL_H_

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "compiler/codegen/c_family.h"
#include "compiler/loop/kernel.h"

namespace kiln::codegen::cpp_internal {

using loop::Kernel;
using loop::ReduceOp;
using loop::Stmt;
using loop::StmtKind;

// Lanes of a vectorized reduction (contiguous sweeps keep one accumulator
// per lane, merged after the sweep): 32 float lanes are four AVX2 vectors
// (two AVX-512 ones), enough independent chains to hide the latency of a
// max or of Welford's sub/FMA chain, without spilling Welford's 2 x 32
// accumulators out of the 16 AVX2 registers. One accumulator would make
// a row's max wait 4 cycles per 8 elements.
constexpr int kLanes = 32;

// Chunks of kLanes between folds of a float sum's lanes into double: each
// float lane then adds at most 64 terms (2,048 elements per block; a row of
// 1,024 folds once), as ATen's cascade sum keeps its float partial sums
// short.
constexpr int kFoldChunks = 64;

// How an inner sweep is written.
enum class SweepMode {
  kSimd,     // one inner dim, unit/zero strides: `omp simd`, pointers
  kChunked,  // kSimd with reductions: 32-lane chunks, then a sequential tail
  kPlain,    // one inner dim, any strides
  kNested,   // zero or several inner dims: nested loops
};

class KernelEmitter {
 public:
  KernelEmitter(const Kernel& kernel, const SymbolTable& symbols, bool openmp)
      : k_(kernel), symbols_(symbols), openmp_(openmp) {}

  absl::StatusOr<std::string> Emit();

 private:
  absl::Status KernelError(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("kernel '", k_.name, "': ", what));
  }
  absl::Status StmtError(int j, absl::string_view what) const {
    return KernelError(absl::StrCat("statement %", j, ": ", what));
  }

  // Per pass, the statements by place.
  struct Pass {
    std::vector<int> before;  // outer level, before the sweep
    std::vector<int> inner;   // the sweep
    std::vector<int> after;   // outer level, after it
    SweepMode mode = SweepMode::kNested;
    bool has_welford = false;
    bool has_reduction = false;  // any reduction, Welford or not
    int number = 0;
  };

  // ---- the loop nest (cpp_codegen.cc) -------------------------------------

  absl::Status Validate();
  absl::Status EmitBody(std::string* out);

  // ---- integer expressions ----------------------------------------------

  // C++ text of an int64 value: a literal, a symbol, or a hoisted local.
  absl::StatusOr<std::string> Int(const ir::SymInt& s) { return ints_.Int(s); }

  absl::StatusOr<std::string> Term(const std::string& var, const ir::SymInt& stride);

  // Product of sizes as text ("1" when empty); constants folded.
  absl::StatusOr<std::string> Product(const std::vector<ir::SymInt>& sizes, size_t from) {
    return ints_.Product(sizes, from);
  }

  // ---- statements (cpp_emit_statements.cc) --------------------------------

  static std::string Pad(int depth) { return std::string(2 * depth, ' '); }

  std::string Val(int a) const { return absl::StrCat("t", a); }

  std::string Cast(int a, CType to) const;
  absl::StatusOr<std::string> OpExpr(int j) const;

  int WelfordId(int j) const { return codegen::WelfordId(k_, j); }

  const ir::SymInt& Stride(const std::vector<ir::SymInt>& strides, size_t k) const {
    static const ir::SymInt kZero{int64_t{0}};
    return strides.empty() ? kZero : strides[k];
  }

  absl::StatusOr<std::string> InnerOffset(const loop::Index& index);
  absl::StatusOr<std::string> Access(int j, SweepMode mode);
  absl::StatusOr<std::string> GatheredAccess(int j, SweepMode mode, size_t first, std::string* line,
                                             std::string* ok);
  absl::StatusOr<std::string> Statement(int j, SweepMode mode);

  // ---- reductions (cpp_emit_reductions.cc) --------------------------------

  // The type of a Welford's running mean and M2 (and of a chunked sweep's
  // merged lanes): double for float32, whose one-by-one updates would
  // round at the size of the mean (the variance of a channel over 65,536
  // strided values of mean 3 and deviation 2 was 1.4e-5 off).
  static const char* WelfordState(CType t) { return t == CType::kF32 ? "double" : CName(t); }

  std::string ReduceInit(int j) const;
  void DeclareAccumulator(int j, const Pass& pass, int depth, std::string* out);
  std::string Accumulate(int j, bool chunk_body) const;
  std::string Combine(int j, const std::string& acc, const std::string& nan,
                      const std::string& value, const std::string& is_nan) const;
  void Finish(int j, int depth, std::string* out) const;
  bool FoldsIntoDouble(int j) const;
  void FoldBlock(int j, int depth, std::string* out) const;
  CType WelfordType(const Pass& pass) const;

  // ---- sweeps (cpp_emit_sweeps.cc) ----------------------------------------

  bool Contiguous(const Pass& pass) const;
  bool InnermostContiguous(const Pass& pass) const;
  absl::Status DeclarePointer(int j, int depth, std::string* out);
  std::string SimdPragma(const Pass& pass) const;
  absl::Status SweepBody(const Pass& pass, SweepMode mode, bool chunk_body, int depth,
                         std::string* out);
  absl::Status EmitSweep(const Pass& pass, int depth, std::string* out);
  void DeclareReciprocals(const Pass& pass, int depth, std::string* out);
  absl::StatusOr<std::vector<std::string>> DeclarePrefetches(const Pass& pass, int depth,
                                                             std::string* out);

  const Kernel& k_;
  const SymbolTable& symbols_;
  const bool openmp_;
  std::vector<CType> type_;        // value type of each statement
  std::vector<bool> after_;        // outer level: after its pass's sweep
  std::vector<std::string> base_;  // per access: the row's base offset ("0", "b3")
  std::vector<Pass> passes_;
  std::set<int> reciprocal_;  // divisions inside a sweep by a row-invariant value
  bool gathers_ = false;      // the kernel has gathers: it checks their indices
  IntExprs ints_{k_, symbols_, kCppDialect};
};

}  // namespace kiln::codegen::cpp_internal

#endif  // KILN_COMPILER_CODEGEN_CPP_CODEGEN_INTERNAL_H_
