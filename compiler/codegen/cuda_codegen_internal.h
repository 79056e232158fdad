// Internal to compiler/codegen: the CUDA backend's CudaKernelEmitter, which
// writes one loop::Kernel as a __global__ function (cuda_codegen.cc says
// what the generated kernels look like). Its member functions are defined
// by part: cuda_emit_kernel.cc the function, its pointwise form and the
// statements and their addresses; cuda_emit_reductions.cc the kernels with
// reductions (rows, columns, the registers kept across passes).
#ifndef KILN_COMPILER_CODEGEN_CUDA_CODEGEN_INTERNAL_H_
#define KILN_COMPILER_CODEGEN_CUDA_CODEGEN_INTERNAL_H_

#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "compiler/codegen/c_family.h"
#include "compiler/codegen/cuda_schedule.h"
#include "compiler/loop/kernel.h"

namespace kiln::codegen::cuda_internal {

using loop::Kernel;
using loop::ReduceOp;
using loop::Stmt;
using loop::StmtKind;

class CudaKernelEmitter {
 public:
  CudaKernelEmitter(const Kernel& kernel, const SymbolTable& symbols)
      : k_(kernel), symbols_(symbols) {}

  absl::StatusOr<std::string> Emit();

 private:
  // ---- the function, its statements and addresses (cuda_emit_kernel.cc) --

  static std::string Pad(int depth) { return std::string(2 * depth, ' '); }
  std::string Val(int a) const { return absl::StrCat("t", a); }

  absl::StatusOr<std::string> Int(const ir::SymInt& s) { return ints_.Int(s); }
  absl::StatusOr<std::string> Product(const std::vector<ir::SymInt>& sizes, size_t from);

  // Lines defining <prefix><k> for each dimension of `sizes` from the flat
  // index `flat` (row-major).
  absl::Status Decompose(const std::vector<ir::SymInt>& sizes, const std::string& flat,
                         const std::string& prefix, int depth, std::string* out);
  // The same with a name per dimension.
  absl::Status Decompose(const std::vector<ir::SymInt>& sizes,
                         const std::vector<std::string>& names, const std::string& flat, int depth,
                         std::string* out);

  // The element address of access j.
  absl::StatusOr<std::string> Access(int j);
  // A gather's or scatter-add's address: Access(j) with the gathered terms
  // of args[first..] added, each checked by kiln_gather_index.
  absl::StatusOr<std::string> GatheredAccess(int j, size_t first);

  // Statement j (not a reduction) as a line. Outer-level stores are made by
  // one thread: `guard` is the condition. With `live`, loads and stores are
  // made only where it holds (loads read 0 elsewhere).
  absl::StatusOr<std::string> Statement(int j, const std::string& guard,
                                        const std::string& live = "");

  absl::Status Sizes(std::string* out);

  // The accesses vectorized, and the flag that every value of `checks`
  // divides by the vector width (kernels fall back to element accesses
  // otherwise): a constant without checks. The buffers are aligned to a
  // chunk by the launcher (LaunchSize::alignment).
  absl::Status DeclareVectors(int vector, int dim, const std::vector<ir::SymInt>& checks,
                              std::string* out);

  // Chunk arrays and vector loads of the vectorized loads among `stmts`
  // (before the element loop), or vector stores (after it).
  absl::Status VectorAccesses(const std::vector<int>& stmts, StmtKind kind, int vector, int depth,
                              std::string* out);

  void DeclareStoreChunks(const std::vector<int>& stmts, int vector, int depth, std::string* out);

  absl::Status EmitPointwise(const Schedule& sched, std::string* out);

  // Whether every store of `k` is into a float16 or bfloat16 buffer (an
  // integer or bool result, exact, could flip on an approximation).
  static bool StoresSixteenBitFloats(const Kernel& k);

  // __launch_bounds__'s arguments: the block size, and for a row kept in
  // registers at up to 8 elements per thread, in at most 16 registers, as
  // many blocks as fill an SM's 2048 threads, which caps registers at 32
  // per thread. Such a row then fits with a few bytes spilled at most
  // (float32 softmax on an H100: 8 bytes, and 188 us against 206 us
  // uncapped at 38 registers and three quarters occupancy); 16 elements
  // per thread would spill far more (bfloat16 layer norm: 56 bytes, 23%
  // slower).
  std::string LaunchBounds(const Schedule& sched) const;

  // ---- reductions (cuda_emit_reductions.cc) -------------------------------

  int WelfordId(int j) const { return codegen::WelfordId(k_, j); }

  // The identity of reduction j, and the functor that combines two values.
  std::string Identity(int j) const;
  static const char* Combiner(ReduceOp op);

  // Whether `op` takes a transcendental function or a division: a value
  // worth registers across passes (an add is not).
  static bool Costly(loop::ScalarOp op);

  // Whether load statements a and b read the same element as the same type.
  bool SameLoad(int a, int b) const;

  // For a row kept in registers: each statement of a later pass -> the
  // earlier pass's statement whose registers it reads, kNotCached (computed
  // in its pass) or kSkipped (a repeat of an earlier value that its pass
  // does not need). The fewest values that cover what later passes use of
  // earlier ones are kept, never computing a load or a costly op twice:
  // softmax keeps its input and its exp, a layer norm of a sum of four
  // tensors the sum.
  static constexpr int kNotCached = -1;
  static constexpr int kSkipped = -2;
  std::vector<int> CacheOf() const;
  absl::Status EmitReduction(const Schedule& sched, std::string* out);
  // A pointwise kernel whose threads take sched.chunks vectors a step.
  absl::Status EmitPointwiseChunks(const Schedule& sched, std::string* out);
  // A kernel with row groups (loop::Kernel::row_groups): the registers of
  // its sums across rows, before the row loop, and each block's partial
  // sums stored after it.
  absl::Status DeclareRowSums(const Schedule& sched, std::string* out);
  absl::Status StoreRowSums(const Schedule& sched, std::string* out);
  // The vectors of `loads` (PrefetchedLoads) of row `row` into registers
  // kiln_ahead<j>[chunk][element], declared first at depth 1 (before the
  // row loop); at `depth` inside it, the next row's.
  absl::Status LoadRowAhead(const Schedule& sched, const std::vector<int>& loads, const char* row,
                            int depth, std::string* out);

  const Kernel& k_;
  const SymbolTable& symbols_;
  std::vector<CType> type_;
  std::vector<bool> after_;
  std::set<int> vectorized_;  // accesses read or written as chunks of the vector width
  // The vector width and the dimension it runs along (DeclareVectors); lane
  // `v` of a chunk is `v` elements along it from the chunk's first.
  int vector_ = 1;
  int vector_dim_ = -1;
  std::string idx_ = "int64_t";  // the type of indices: int32_t where IndexesFitInt32
  IntExprs ints_{k_, symbols_, kCudaDialect};
  const Dialect* dialect_ = &kCudaDialect;
  int cached_values_ = 0;  // registers per thread of the row kept across passes
};

}  // namespace kiln::codegen::cuda_internal

#endif  // KILN_COMPILER_CODEGEN_CUDA_CODEGEN_INTERNAL_H_
