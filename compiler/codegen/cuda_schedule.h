// How the CUDA backend maps a loop::Kernel onto threads (compiler/codegen/
// cuda_codegen.cc emits what this decides): its layout, block size,
// register caching and vector width, and the launch size that follows.
// Block sizes are the autotuner's where it chose them (loop::Kernel::block),
// else these heuristics.
//
//   - Pointwise kernels: a grid-stride loop of kPointwiseBlock threads over
//     the flattened space, each thread a chunk of `vector` elements.
//   - kRow: one block per row, its threads striding along the row (the row
//     is contiguous, or nearly so). A row of constant length up to
//     kMaxCachedPerThread elements per thread is swept in a fully unrolled
//     loop, and every load that a later pass repeats is kept in registers:
//     softmax and layer norm then read their row once. Longer rows are swept
//     by a loop over chunks, as are rows of symbolic length (their chunks'
//     alignment checked as the kernel runs, a tail loop after them).
//   - kColumn: 32 rows per block, one per lane of a warp, and the block's 32
//     warps striding along the rows together; for rows whose elements are
//     far apart while neighbouring rows are adjacent (a sum over the batch
//     dimension), so that each warp reads 32 adjacent elements at a time.
//     A one-pass kernel of constant sizes takes `column_groups` groups of
//     32 rows per block, each lane one row of every group: a warp then
//     reads 512 adjacent bytes per step (four 128-byte rows of float32,
//     eight 64-byte ones of bfloat16), which DRAM serves far better than
//     128 bytes scattered over many rows. Where the rows a lane takes can
//     be adjacent in memory (`column_packed`: the sweep's loads and stores
//     move along the last outer dimension with stride 1, and every other
//     stride and offset keeps a lane's rows in one aligned chunk), each
//     lane takes `column_groups` adjacent rows instead, read as one 16-byte
//     vector: the same 512 bytes per warp step in a quarter (float32) or an
//     eighth (16-bit) of the load instructions. Where the last outer
//     dimension is narrower than 32 such chunks and the rows are adjacent
//     along the last inner one too (a channels-last mean over H and W, 32
//     channels: 64 bytes of bfloat16 per pixel, the next pixel's after
//     them), a block of kNarrowColumnBlock threads takes one row of chunks
//     (`column_lanes` of them, a lane each) and its warp's other lanes take
//     the next steps of the sweep: each warp step still reads 512 adjacent
//     bytes (the conv net's mean, bfloat16 on an H100: 51 us against 55
//     us; written by hand with its per-channel parameters kept in registers
//     as float32, 34 us).
//
// Internal to compiler/codegen. Pure functions; thread-safe.
#ifndef KILN_COMPILER_CODEGEN_CUDA_SCHEDULE_H_
#define KILN_COMPILER_CODEGEN_CUDA_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "compiler/codegen/codegen.h"
#include "compiler/loop/kernel.h"

namespace kiln::codegen {

enum class Layout { kRow, kColumn };

// Rows per block in the column layout.
inline constexpr int kColumnRows = 32;
// Threads per block in the column layout of narrow rows.
inline constexpr int kNarrowColumnBlock = 128;

struct Schedule {
  Layout layout = Layout::kRow;
  int block = 256;
  int per_thread = 0;  // kRow over a constant row: elements per thread; 0: a loop
  // Elements each thread reads and writes as one vector (16 bytes of the
  // widest vectorized buffer) where every access moving along dimension
  // `vector_dim` is contiguous there and every chunk starts aligned; 1:
  // none.
  int vector = 1;
  // A row of symbolic length (kRow, one inner dimension) swept in vectors:
  // the symbolic strides and offsets the chunks' alignment also depends on,
  // checked as the kernel runs (it reads and writes elements where one does
  // not divide by `vector`), and a loop over the row's last inner_n % vector
  // elements after the chunks.
  std::vector<ir::SymInt> vector_checks;
  bool vector_tail = false;
  // The dimension of the kernel's space (outer ones first, then inner ones)
  // that vectors run along: the last inner one, or for a pointwise kernel
  // with an `order`, the output's fastest.
  int vector_dim = 0;
  // Pointwise kernels whose output is laid out in another order than
  // outer-then-inner (a transpose): the dimensions (outer ones first, then
  // inner ones) from the slowest-varying to the fastest in the output's
  // memory, so that consecutive threads write consecutive elements. Empty:
  // outer then inner.
  std::vector<int> order;
  // kColumn: groups of 32 rows each block takes, each lane one row of
  // every group (the groups 32 rows apart); 1 for any other layout.
  int column_groups = 1;
  // kColumn with groups: each lane's rows adjacent instead (lane l of the
  // block's tile takes rows l * column_groups + g), and the sweep's loads
  // and stores that move along the last outer dimension access vectors of
  // column_groups elements.
  bool column_packed = false;
  // kColumn: lanes of a warp along the block's rows (kColumnRows), or, for
  // packed rows whose last outer dimension is narrower than a warp's
  // chunks (kNarrowColumnBlock threads), the lanes that take one chunk
  // each, the warp's others taking the next steps of the same rows.
  int column_lanes = kColumnRows;
  // kRow over a row kept in registers whose first pass reads whole rows
  // of buffers the kernel does not write (PrefetchedLoads): each block
  // takes several rows, and loads the next row's vectors of those buffers
  // before it reduces the current one, so that the loads of one row are
  // in flight while the block waits on the barriers of the last. The
  // launch gives such kernels fewer blocks (SizeLaunch). On an H200,
  // bfloat16 softmax over [16384, 4096] took 90.3 us one row a block and
  // 72.7 us four rows a block with the next row's loads ahead; layer norm
  // 81.6 us and 72.4 us.
  bool prefetch = false;
  // Pointwise: the vectors each thread takes per step of its grid-stride
  // loop, all loaded before any is used. Two for vectors of 16-bit
  // elements: half the bytes of a float32 vector in flight per load, and
  // twice the elements to compute on (on an H200, a bfloat16 sigmoid of a
  // GELU times a tensor over [8192, 8192] took 119.3 us one vector a thread
  // and 112.5 us two; the float32 one 186.8 us and 188.7 us).
  int chunks = 1;
};

// Threads per block of a pointwise kernel.
inline constexpr int kPointwiseBlock = 256;

// Threads an SM holds at once (sm_90).
inline constexpr int kThreadsPerSm = 2048;

// Threads per SM a kernel with row groups (loop::Kernel::row_groups) is
// given: its launch asks for 1024 / block blocks per SM (a register cap of
// 64), and a target gives it that many groups per SM, every block resident
// at once.
inline constexpr int kRowGroupThreadsPerSm = 1024;

// The product of `sizes`, capped at 2^50; *constant says whether every size
// is a constant (the product is then of the constant ones alone).
int64_t ConstantProduct(const std::vector<ir::SymInt>& sizes, bool* constant);

bool HasReduction(const loop::Kernel& k);
// The schedule of `k`: the heuristic's, with the threads per block the
// autotuner chose (k.block) where the layout takes them.
Schedule ScheduleOf(const loop::Kernel& k);
// The threads per block worth timing for `k` (compiler/codegen/
// cuda_tuner.h), the heuristic's among them; empty when its layout has one
// block size only (kColumn).
std::vector<int> BlockCandidates(const loop::Kernel& k);
// Whether access statements a and b read or write the same element of the
// same buffer.
bool SameElement(const loop::Stmt& a, const loop::Stmt& b);
// Whether a pointwise kernel's grid (SizeLaunch) covers its space, each
// thread taking one step of Schedule::chunks vectors: every size constant,
// and no more blocks than a launch asks for.
bool GridCoversSpace(const loop::Kernel& k);
// Whether a row kept in registers is launched to fill its SMs (2048
// threads each, at most 32 registers a thread): 8 elements or fewer a
// thread, in blocks that divide 2048 (CudaKernelEmitter::LaunchBounds).
bool FillsSms(const Schedule& s);
// The loads of `k` that a schedule with `prefetch` issues one row ahead:
// first-pass vector loads of buffers the kernel does not write, moving
// along the row and with a row of their own, one of each set of loads of
// the same element; empty when the schedule takes a row per block, when
// they would hold more than kMaxPrefetchBytes per thread, when the kernel
// FillsSms (its registers are at the cap already), or when it has fewer
// than three passes (one block reduction to wait on).
std::vector<int> PrefetchedLoads(const loop::Kernel& k, const Schedule& s);
// The grid and block `k` is generated for, and the alignment its vector
// accesses assume of each buffer.
LaunchSize SizeLaunch(const loop::Kernel& k);
// Whether every index the kernel computes (the flattened space, each
// access's element offset, a grid-stride step past the end) stays below
// 2^30: all sizes, strides and offsets constant. Such kernels index in 32
// bits.
bool IndexesFitInt32(const loop::Kernel& k);
// Bytes of one element of `dtype` in memory.
int StorageBytes(v1::DType dtype);
// Whether access statement `s` moves along the last inner dimension (it is
// then vectorized).
bool MovesAlongRow(const loop::Stmt& s);
// Whether access statement `s` moves along dimension `dim` of the kernel's
// space (outer dimensions first, then inner ones).
bool MovesAlong(const loop::Kernel& k, const loop::Stmt& s, int dim);

}  // namespace kiln::codegen

#endif  // KILN_COMPILER_CODEGEN_CUDA_SCHEDULE_H_
