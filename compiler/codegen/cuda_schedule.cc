#include "compiler/codegen/cuda_schedule.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/codegen/c_family.h"

namespace kiln::codegen {
namespace {

using loop::Kernel;
using loop::Stmt;
using loop::StmtKind;

// The most blocks a launch asks for (the grid-stride loops cover the rest).
constexpr int64_t kMaxGrid = int64_t{1} << 20;

// The longest row (in elements per thread) kept in registers.
constexpr int kMaxCachedPerThread = 16;
// Elements per thread a constant row is split into, when it fits a block:
// many independent loads per thread, and blocks small enough (a row of 4096
// takes 256 threads) that several rows are in flight on each SM.
constexpr int kRowElementsPerThread = 16;
// The same for a row read in 16-byte vectors and kept in registers across
// passes: two vectors per thread (8 float32 or 16 bfloat16 elements). On an
// H100, float32 rows of 4096 at 8 per thread (512 threads, occupancy full
// at 32 registers, see CudaKernelEmitter) ran softmax in 188 us against
// 222 us at 16 (53 registers, half occupancy), layer norm in 183 against
// 194; bfloat16 rows ran fastest at 16 per thread.
constexpr int kCachedVectorsPerThread = 2;
// The same for a one-pass row of 16-bit elements, which keeps nothing in
// registers across passes: 64 bytes per thread as in float32.
constexpr int kOnePassBytesPerThread = 64;

// Threads per block of a row kernel that sweeps its row by a loop.
constexpr int kLoopBlock = 256;

// Elements per thread of a row kernel with sums across rows.
constexpr int kAccumulatedPerThread = 8;

// Registers a thread holds for the next row's loads (Schedule::prefetch):
// four 16-byte vectors at most.
constexpr int kMaxPrefetchBytes = 64;
// Rows per block of a kernel that loads one row ahead, and the fewest
// blocks its launch keeps (as many as a GPU of 132 SMs holds at once at 16
// blocks each) before it gives a block more than one row: on an H200,
// bfloat16 softmax over [16384, 4096] took 75.8 us at two rows a block,
// 72.7 us at four and 74.1 us at eight; layer norm 71.2, 72.4 and 76.0 us.
constexpr int64_t kPrefetchRowsPerBlock = 4;
constexpr int64_t kPrefetchMinGrid = 2048;

// Registers a lane of a narrow column layout holds for per-row parameters
// (NarrowColumnGroups).
constexpr int kNarrowColumnParameters = 32;

bool Accumulates(const Kernel& k) {
  return std::any_of(k.stmts.begin(), k.stmts.end(),
                     [](const Stmt& s) { return s.kind == StmtKind::kAccumulate; });
}

// The stride of the last dimension of `strides` (0 when there is none).
const ir::SymInt& LastStride(const std::vector<ir::SymInt>& strides) {
  static const ir::SymInt kZero{int64_t{0}};
  return strides.empty() ? kZero : strides.back();
}

// Whether the kernel's inner loads mostly read along the outer space
// (adjacent rows adjacent in memory) rather than along their rows. A load
// that every row shares (its outer strides all 0: a column's scale by each
// row's value of a sum over the rows) reads one element per step whatever
// the layout, and does not count.
bool ReadsAcrossRows(const Kernel& k) {
  int across = 0, along = 0;
  for (const Stmt& s : k.stmts) {
    if (s.kind != StmtKind::kLoad || !s.inner) continue;
    if (std::all_of(s.index.outer_strides.begin(), s.index.outer_strides.end(),
                    [](const ir::SymInt& st) { return IsZero(st); })) {
      continue;
    }
    const ir::SymInt& inner = LastStride(s.index.inner_strides);
    if (IsOne(inner)) {
      ++along;
    } else if (!IsZero(inner) && IsOne(LastStride(s.index.outer_strides))) {
      ++across;
    }
  }
  return across > along;
}

// The stride of access `s` along dimension `dim` of the kernel's space
// (outer dimensions first, then inner ones); 0 when it has none.
const ir::SymInt& StrideAlong(const Kernel& k, const Stmt& s, int dim) {
  static const ir::SymInt kZero{int64_t{0}};
  const int n_outer = static_cast<int>(k.outer.size());
  const std::vector<ir::SymInt>& strides =
      dim < n_outer ? s.index.outer_strides : s.index.inner_strides;
  const size_t at = dim < n_outer ? dim : dim - n_outer;
  return at < strides.size() ? strides[at] : kZero;
}

// The vector width of a kernel swept `V` elements at a time along dimension
// `dim` of its space: every access moving along it has stride 1 there, and
// constant other strides and offset that keep each chunk of V aligned.
// With `checks` (a row of symbolic length, swept in chunks and then a tail
// loop), the size along `dim` need not be constant or divide by V, and the
// symbolic strides and offsets that must divide for aligned chunks go into
// `checks`, to be tested as the kernel runs.
int VectorWidth(const Kernel& k, int dim, std::vector<ir::SymInt>* checks = nullptr) {
  const int n_outer = static_cast<int>(k.outer.size());
  const ir::SymInt& size = dim < n_outer ? k.outer[dim] : k.inner[dim - n_outer];
  if (checks == nullptr && !size.is_constant()) return 1;
  // A gather's (a scatter's) lanes read (add) where their own indices say:
  // one element at a time. (Index values are computed lane by lane: CudaKernelEmitter adds
  // the lane's offset along `dim`.)
  if (std::any_of(k.stmts.begin(), k.stmts.end(), [](const Stmt& s) {
        return s.kind == StmtKind::kGather || s.kind == StmtKind::kScatterAdd;
      })) {
    return 1;
  }
  int widest = 0;
  for (const Stmt& s : k.stmts) {
    if (!MovesAlong(k, s, dim)) continue;
    if (!IsOne(StrideAlong(k, s, dim))) return 1;
    widest = std::max(widest, StorageBytes(k.buffers[s.buffer].dtype));
  }
  if (widest == 0) return 1;
  const int v = 16 / widest;
  if (checks == nullptr && size.constant() % v != 0) return 1;
  std::vector<ir::SymInt> symbolic;
  auto divides = [&](const ir::SymInt& x) {
    if (x.is_constant()) return x.constant() % v == 0;
    if (checks == nullptr) return false;
    if (std::find(symbolic.begin(), symbolic.end(), x) == symbolic.end()) symbolic.push_back(x);
    return true;
  };
  const int n = n_outer + static_cast<int>(k.inner.size());
  for (const Stmt& s : k.stmts) {
    if (!MovesAlong(k, s, dim)) continue;
    if (!divides(s.index.offset)) return 1;
    for (int d = 0; d < n; ++d) {
      if (d != dim && !divides(StrideAlong(k, s, d))) return 1;
    }
  }
  if (checks != nullptr) *checks = std::move(symbolic);
  return v;
}

// The last inner dimension, along which rows are swept.
int RowDim(const Kernel& k) { return static_cast<int>(k.outer.size() + k.inner.size()) - 1; }

// Whether a column-layout lane may take several rows: a one-pass kernel of
// constant sizes with no loads outside the sweep, whose every statement
// outside it is the reductions' epilogue (or a constant).
bool GroupsAllowed(const Kernel& k) {
  if (k.passes != 1) return false;
  bool constant = false;
  ConstantProduct(k.outer, &constant);
  if (!constant) return false;
  ConstantProduct(k.inner, &constant);
  if (!constant) return false;
  for (const Stmt& s : k.stmts) {
    if ((s.kind == StmtKind::kLoad || s.kind == StmtKind::kGather || s.kind == StmtKind::kIndex) &&
        !s.inner) {
      return false;
    }
  }
  return true;
}

// Groups of 32 rows a column-layout block takes (Schedule::column_groups):
// enough for each warp to read 512 adjacent bytes of its widest buffer per
// step, and no more groups than there are rows; 1 where GroupsAllowed says
// no.
int ColumnGroups(const Kernel& k) {
  if (!GroupsAllowed(k)) return 1;
  bool constant = false;
  const int64_t rows = ConstantProduct(k.outer, &constant);
  int widest = 0;
  for (const Stmt& s : k.stmts) {
    if (s.kind != StmtKind::kLoad && s.kind != StmtKind::kStore) continue;
    // Accesses that the 32 adjacent rows of a warp share (no stride along
    // the last outer dimension) do not count.
    if (MovesAlong(k, s, static_cast<int>(k.outer.size()) - 1)) {
      widest = std::max(widest, StorageBytes(k.buffers[s.buffer].dtype));
    }
  }
  if (widest == 0) return 1;
  int groups = std::max(1, 512 / (kColumnRows * widest));
  while (groups > 1 && int64_t{kColumnRows} * groups > rows) groups /= 2;
  return groups;
}

// Whether the `groups` rows a column-layout lane takes can be adjacent and
// read as one vector (Schedule::column_packed): the last outer dimension's
// size divides by `groups`; every load and store of the sweep that moves
// along it has stride 1 there, and constant other strides and offset that
// divide by `groups` (a chunk starts aligned where its buffer is: checked
// as the kernel runs).
bool ColumnPacked(const Kernel& k, int groups) {
  if (groups <= 1 || k.outer.empty()) return false;
  // Gathers and index values are one row at a time.
  if (std::any_of(k.stmts.begin(), k.stmts.end(), [](const Stmt& s) {
        return s.kind == StmtKind::kGather || s.kind == StmtKind::kIndex ||
               s.kind == StmtKind::kScatterAdd;
      })) {
    return false;
  }
  const int dim = static_cast<int>(k.outer.size()) - 1;
  if (!k.outer.back().is_constant() || k.outer.back().constant() % groups != 0) return false;
  const int n = static_cast<int>(k.outer.size() + k.inner.size());
  bool any = false;
  for (const Stmt& s : k.stmts) {
    if (!MovesAlong(k, s, dim)) continue;
    if (!IsOne(StrideAlong(k, s, dim))) return false;
    if (!s.index.offset.is_constant() || s.index.offset.constant() % groups != 0) return false;
    for (int d = 0; d < n; ++d) {
      if (d == dim) continue;
      const ir::SymInt& stride = StrideAlong(k, s, d);
      if (!stride.is_constant() || stride.constant() % groups != 0) return false;
    }
    any = true;
  }
  return any;
}

// Lanes of a warp along a packed column layout's rows
// (Schedule::column_lanes) when each lane takes `groups` of them: where the
// last outer dimension is E < 32 such chunks (E / groups lanes, a power of
// two) and every load of the sweep moving along it and along the sweep
// steps by E along the last inner dimension (the next step's chunk follows
// this one's in memory), E / groups; else kColumnRows. Not for Welford
// (its merge across lanes is the 32-lane one).
int ColumnLanes(const Kernel& k, int groups) {
  if (k.inner.empty() || !k.outer.back().is_constant()) return kColumnRows;
  const int dim = static_cast<int>(k.outer.size()) - 1;
  const int64_t e = k.outer.back().constant();
  const int64_t lanes = e / groups;
  if (e % groups != 0 || lanes >= kColumnRows || (lanes & (lanes - 1)) != 0) return kColumnRows;
  bool any = false;
  for (const Stmt& s : k.stmts) {
    if (IsWelford(s)) return kColumnRows;
    if (s.kind != StmtKind::kLoad || !MovesAlong(k, s, dim) || !MovesAlong(k, s, RowDim(k))) {
      continue;
    }
    const ir::SymInt& step = StrideAlong(k, s, RowDim(k));
    if (!step.is_constant() || step.constant() != e) return kColumnRows;
    any = true;
  }
  return any ? static_cast<int>(lanes) : kColumnRows;
}

// Rows each lane takes in a column layout of narrow rows: 16 bytes of the
// widest buffer that moves along the rows and along the sweep (the loads
// that stay put along the sweep, per-row parameters, are read as several
// vectors where wider); 1 where ColumnGroups takes no groups at all. A lane
// holds each parameter of each of its rows in a register for the whole
// sweep, so where they would take more than kNarrowColumnParameters, the
// chunks halve, down to 8 bytes: a bfloat16 conv net's two batch norms
// fused with their residual add, relu and the mean over pixels hold eight
// parameters, 64 registers at 8 rows a lane (96 in all, five blocks an SM:
// 34.7 us on an H100) and 32 at 4 (64 in all: 28.6 us, the sweep
// unrolled twice).
int NarrowColumnGroups(const Kernel& k) {
  if (!GroupsAllowed(k) || k.outer.empty()) return 1;
  const int dim = static_cast<int>(k.outer.size()) - 1;
  int widest = 0;
  std::set<int> parameters;
  for (const Stmt& s : k.stmts) {
    if (s.kind != StmtKind::kLoad && s.kind != StmtKind::kStore) continue;
    if (MovesAlong(k, s, dim) && MovesAlong(k, s, RowDim(k))) {
      widest = std::max(widest, StorageBytes(k.buffers[s.buffer].dtype));
    } else if (s.kind == StmtKind::kLoad && MovesAlong(k, s, dim)) {
      parameters.insert(s.buffer);
    }
  }
  if (widest == 0) return 1;
  int groups = std::max(1, 16 / widest);
  while (groups * widest > 8 &&
         groups * static_cast<int>(parameters.size()) > kNarrowColumnParameters) {
    groups /= 2;
  }
  return groups;
}

// A product of sizes as an expression of the plan's symbols.
std::string ProductExpr(const std::vector<ir::SymInt>& sizes) {
  int64_t constant = 1;
  std::vector<std::string> parts;
  for (const ir::SymInt& s : sizes) {
    if (s.is_constant()) {
      constant *= s.constant();
    } else {
      parts.push_back(absl::StrCat("(", s.expr(), ")"));
    }
  }
  if (constant != 1 || parts.empty()) parts.push_back(absl::StrCat(constant));
  return absl::StrJoin(parts, "*");
}

// The order of a pointwise kernel's dimensions in its first store's memory,
// slowest first, when it is not outer-then-inner: its strides by size (where
// some are symbolic, only its dimension of stride 1 moves, to the end), and
// no statement outside the sweep (those run once per row of
// outer-then-inner).
std::vector<int> OutputOrder(const Kernel& k) {
  const Stmt* store = nullptr;
  for (const Stmt& s : k.stmts) {
    if (!s.inner) return {};
    if (s.kind == StmtKind::kStore && store == nullptr) store = &s;
  }
  if (store == nullptr) return {};
  const size_t n_outer = k.outer.size(), n = n_outer + k.inner.size();
  std::vector<int64_t> strides(n, 0);
  bool symbolic = false;
  int unit = -1, units = 0;  // the dimension of stride 1, and how many have it
  for (size_t d = 0; d < n; ++d) {
    const std::vector<ir::SymInt>& st =
        d < n_outer ? store->index.outer_strides : store->index.inner_strides;
    const size_t at = d < n_outer ? d : d - n_outer;
    if (st.empty()) continue;
    if (!st[at].is_constant()) {
      symbolic = true;
      continue;
    }
    strides[d] = st[at].constant();
    if (std::abs(strides[d]) == 1) {
      unit = static_cast<int>(d);
      ++units;
    }
  }
  std::vector<int> order(n);
  for (size_t d = 0; d < n; ++d) order[d] = static_cast<int>(d);
  if (symbolic) {
    // Symbolic strides do not compare; the one dimension of stride 1 (a
    // transpose's) goes fastest, the others keep their order.
    if (units != 1 || unit == static_cast<int>(n) - 1) return {};
    order.erase(order.begin() + unit);
    order.push_back(unit);
    return order;
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return std::abs(strides[a]) > std::abs(strides[b]); });
  // Dimensions of stride 0 (broadcast) and size 1 keep their place in the
  // natural order when that is already the output's.
  for (size_t d = 0; d < n; ++d) {
    if (order[d] != static_cast<int>(d)) return order;
  }
  return {};
}

}  // namespace

bool HasReduction(const Kernel& k) {
  for (const Stmt& s : k.stmts) {
    if (s.kind == StmtKind::kReduce || s.kind == StmtKind::kAccumulate) return true;
  }
  return false;
}

bool IndexesFitInt32(const Kernel& k) {
  constexpr int64_t kLimit = int64_t{1} << 30;
  bool constant = false;
  const int64_t outer = ConstantProduct(k.outer, &constant);
  if (!constant) return false;
  const int64_t inner = ConstantProduct(k.inner, &constant);
  if (!constant || outer > kLimit || inner > kLimit || outer * inner > kLimit) return false;
  for (const Stmt& s : k.stmts) {
    // A gather's gathered terms are 64-bit (kiln_gather_index); the rest
    // of its address counts here.
    if (s.kind != StmtKind::kLoad && s.kind != StmtKind::kStore && s.kind != StmtKind::kGather &&
        s.kind != StmtKind::kIndex && s.kind != StmtKind::kScatterAdd) {
      continue;
    }
    if (!s.index.offset.is_constant()) return false;
    int64_t reach = std::abs(s.index.offset.constant());
    auto add = [&](const std::vector<ir::SymInt>& strides, const std::vector<ir::SymInt>& sizes) {
      for (size_t d = 0; d < strides.size() && d < sizes.size(); ++d) {
        if (!strides[d].is_constant()) return false;
        const int64_t extent = sizes[d].constant() > 0 ? sizes[d].constant() - 1 : 0;
        const int64_t stride = std::abs(strides[d].constant());
        if (stride > kLimit || (extent > 0 && stride > kLimit / extent)) return false;
        reach += stride * extent;
        if (reach > kLimit) return false;
      }
      return true;
    };
    if (reach > kLimit || !add(s.index.outer_strides, k.outer) ||
        !add(s.index.inner_strides, k.inner)) {
      return false;
    }
  }
  return true;
}

int StorageBytes(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT64:
    case v1::INT64:
      return 8;
    case v1::FLOAT32:
    case v1::INT32:
      return 4;
    case v1::FLOAT16:
    case v1::BFLOAT16:
    case v1::INT16:
      return 2;
    default:
      return 1;
  }
}

bool MovesAlongRow(const Stmt& s) {
  return (s.kind == StmtKind::kLoad || s.kind == StmtKind::kStore) && s.inner &&
         !IsZero(LastStride(s.index.inner_strides));
}

bool MovesAlong(const Kernel& k, const Stmt& s, int dim) {
  return (s.kind == StmtKind::kLoad || s.kind == StmtKind::kStore) && s.inner &&
         !IsZero(StrideAlong(k, s, dim));
}

namespace {

// The autotuner's choice (Kernel::block) when it is one this layout can
// take: a whole number of warps, at most 1024.
int TunedBlock(const Kernel& k) {
  // Sums across rows keep a register per element of the thread's share of
  // the row: the heuristic's block, which keeps the row in registers.
  if (k.row_groups > 0) return 0;
  return k.block >= 32 && k.block <= 1024 && k.block % 32 == 0 ? k.block : 0;
}

}  // namespace

Schedule ScheduleOf(const Kernel& k) {
  Schedule s;
  const int tuned = TunedBlock(k);
  if (!HasReduction(k)) {
    s.block = tuned > 0 ? tuned : kPointwiseBlock;
    s.order = OutputOrder(k);
    // Chunks run along the dimension consecutive threads take: the
    // output's fastest one.
    s.vector_dim = s.order.empty() ? RowDim(k) : s.order.back();
    if (!k.inner.empty()) s.vector = VectorWidth(k, s.vector_dim);
    if (s.vector == 8 && s.order.empty() && !k.reversed) s.chunks = 2;
    return s;
  }
  if (ReadsAcrossRows(k)) {
    s.layout = Layout::kColumn;
    s.block = 32 * kColumnRows;
    s.column_groups = ColumnGroups(k);
    s.column_packed = ColumnPacked(k, s.column_groups);
    // Narrow rows: each lane a chunk of 16 bytes of the buffers read along
    // the sweep.
    const int groups = NarrowColumnGroups(k);
    if (ColumnPacked(k, groups)) {
      const int lanes = ColumnLanes(k, groups);
      if (lanes < kColumnRows) {
        s.column_groups = groups;
        s.column_packed = true;
        s.column_lanes = lanes;
        s.block = kNarrowColumnBlock;
      }
    }
    return s;
  }
  // A long row, or one of symbolic length, is swept by a loop over chunks
  // of the vector width (4 chunks unrolled: several loads in flight).
  s.vector_dim = RowDim(k);
  s.vector = VectorWidth(k, s.vector_dim);
  if (tuned > 0) s.block = tuned;
  bool constant = false;
  const int64_t row = ConstantProduct(k.inner, &constant);
  if (!constant) {
    // 256 threads (or the tuned count), a loop; over one inner dimension of
    // symbolic length, in vectors with a tail.
    if (s.vector == 1 && k.inner.size() == 1) {
      s.vector = VectorWidth(k, s.vector_dim, &s.vector_checks);
      s.vector_tail = s.vector > 1;
    }
    return s;
  }
  int elements = kRowElementsPerThread;
  if (s.vector > 1) {
    elements = k.passes == 1 ? std::max(elements, kOnePassBytesPerThread * s.vector / 16)
                             : kCachedVectorsPerThread * s.vector;
  }
  // Sums across rows take a register per element a thread holds: 8
  // elements (one vector of 16-bit ones), as float32 rows kept in
  // registers have.
  if (Accumulates(k)) elements = std::max(kAccumulatedPerThread, s.vector);
  if (tuned == 0) {
    const int64_t threads = (row + elements - 1) / elements;
    s.block = static_cast<int>(std::clamp<int64_t>((threads + 31) / 32 * 32, 32, 1024));
  }
  // A thread's share is whole vectors (the row's length divides by the
  // width): a row of 768 bfloat16 at 64 threads takes two vectors each, the
  // second only in half the lanes, rather than 12 scalars. Over several
  // inner dims (a batch norm's [N, H, W]) a vector is a chunk of the last
  // one, which VectorWidth found to divide by the width.
  const int64_t vectors = row / s.vector;
  const int64_t per_thread = (vectors + s.block - 1) / s.block * s.vector;
  if (per_thread > std::max(kMaxCachedPerThread, elements)) {
    // A row too long for registers is swept by a loop, its loads in
    // groups (CudaKernelEmitter); blocks of kLoopBlock threads, as for rows
    // of symbolic length. On an H100, batch norm statistics over [128, 32,
    // 64, 64] float32 (512 slices of 32768) took 27.3 us at 256 threads
    // against 32.6 at 1024, whose 40 registers a thread let one block on
    // an SM at a time; Welford over [64, 2^20] bfloat16, 50.0 us against
    // 55.5.
    if (tuned == 0) s.block = std::min(s.block, kLoopBlock);
    return s;
  }
  s.per_thread = static_cast<int>(std::max<int64_t>(per_thread, 1));
  s.prefetch = !PrefetchedLoads(k, s).empty();
  return s;
}

int64_t ConstantProduct(const std::vector<ir::SymInt>& sizes, bool* constant) {
  int64_t n = 1;
  *constant = true;
  for (const ir::SymInt& s : sizes) {
    if (!s.is_constant()) {
      *constant = false;
      continue;
    }
    n = s.constant() > 0 && n > (int64_t{1} << 50) / s.constant() ? (int64_t{1} << 50)
                                                                  : n * s.constant();
  }
  return n;
}

bool SameElement(const Stmt& a, const Stmt& b) {
  return a.buffer == b.buffer && a.index.outer_strides == b.index.outer_strides &&
         a.index.inner_strides == b.index.inner_strides && a.index.offset == b.index.offset;
}

bool GridCoversSpace(const Kernel& k) {
  std::vector<ir::SymInt> space = k.outer;
  space.insert(space.end(), k.inner.begin(), k.inner.end());
  bool constant = false;
  const int64_t n = ConstantProduct(space, &constant);
  const Schedule s = ScheduleOf(k);
  const int64_t per_block = int64_t{s.block} * s.vector * s.chunks;
  return constant && (n + per_block - 1) / per_block <= kMaxGrid;
}

bool FillsSms(const Schedule& s) {
  return s.layout == Layout::kRow && s.per_thread > 0 && s.per_thread <= 8 &&
         kThreadsPerSm % s.block == 0;
}

std::vector<int> PrefetchedLoads(const Kernel& k, const Schedule& s) {
  std::vector<int> out;
  if (s.layout != Layout::kRow || s.per_thread == 0 || s.vector == 1 || k.reversed ||
      k.row_groups > 0) {
    return out;
  }
  // Rows that fill their SMs have 2048 threads' loads in flight on each
  // already, and no registers to spare: on an H200, float32 softmax over
  // [16384, 4096] at 512 threads took 130.8 us one row a block, 135.3 us
  // loading ahead at three blocks an SM and 162.1 us at four (spilled).
  if (FillsSms(s)) return out;
  // A row that waits on one block reduction (an RMS norm, a sum) keeps its
  // loads in flight well enough: bfloat16 RMS norm over [16384, 4096] took
  // 69.7 us a row a block and 70.2 us loading ahead, and NVRTC 20-40 ms
  // more for the module. Two reductions (a layer norm's mean and variance,
  // softmax's maximum and sum) leave the block idle twice.
  if (k.passes < 3) return out;
  int bytes = 0;
  for (size_t j = 0; j < k.stmts.size(); ++j) {
    const Stmt& st = k.stmts[j];
    if (st.kind != StmtKind::kLoad || st.pass != 0 || !MovesAlong(k, st, s.vector_dim) ||
        k.buffers[st.buffer].written) {
      continue;
    }
    // A parameter read the same for every row (a norm's weight) is not
    // ahead of anything.
    const std::vector<ir::SymInt>& outer = st.index.outer_strides;
    if (std::all_of(outer.begin(), outer.end(), [](const ir::SymInt& d) { return IsZero(d); })) {
      continue;
    }
    const bool again =
        std::any_of(out.begin(), out.end(), [&](int q) { return SameElement(k.stmts[q], st); });
    if (again) continue;
    out.push_back(static_cast<int>(j));
    bytes += s.per_thread * StorageBytes(k.buffers[st.buffer].dtype);
  }
  if (bytes > kMaxPrefetchBytes) out.clear();
  return out;
}

std::vector<int> BlockCandidates(const Kernel& k) {
  if ((HasReduction(k) && ReadsAcrossRows(k)) || k.row_groups > 0) return {};
  std::vector<int> out = {128, 256, 512, 1024};
  bool constant = false;
  const int64_t row = ConstantProduct(k.inner, &constant);
  if (HasReduction(k) && constant) {
    // Rows kept in registers at 4 to 16 elements per thread.
    for (int64_t per_thread : {4, 8, 16}) {
      const int64_t threads = (row + per_thread - 1) / per_thread;
      out.push_back(static_cast<int>(std::clamp<int64_t>((threads + 31) / 32 * 32, 32, 1024)));
    }
  }
  Kernel heuristic = k;
  heuristic.block = 0;
  out.push_back(ScheduleOf(heuristic).block);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

namespace {

// Of a kernel scheduled as `s`: the vector width and the dimension of its
// space its vector accesses run along (1 and -1 where it has none).
std::pair<int, int> VectorAccesses(const Kernel& k, const Schedule& s) {
  if (s.layout == Layout::kColumn) {
    if (s.column_packed && s.column_groups > 1) {
      return {s.column_groups, static_cast<int>(k.outer.size()) - 1};
    }
    return {1, -1};
  }
  return s.vector > 1 ? std::pair<int, int>{s.vector, s.vector_dim} : std::pair<int, int>{1, -1};
}

// Per buffer: the bytes of one vector access (at most 16), which its data
// pointer must be a multiple of; 0 for a buffer without vector accesses.
std::vector<int> BufferAlignment(const Kernel& k, const Schedule& s) {
  const auto [vector, dim] = VectorAccesses(k, s);
  if (vector == 1) return {};
  std::vector<int> out(k.buffers.size(), 0);
  for (const Stmt& st : k.stmts) {
    if (!MovesAlong(k, st, dim)) continue;
    out[st.buffer] = std::min(16, vector * StorageBytes(k.buffers[st.buffer].dtype));
  }
  return out;
}

}  // namespace

LaunchSize SizeLaunch(const Kernel& k) {
  const Schedule sched = ScheduleOf(k);
  LaunchSize size;
  size.block = sched.block;
  size.alignment = BufferAlignment(k, sched);
  const bool reduce = HasReduction(k);
  // Work items: points (pointwise), rows (kRow) or groups of 32 rows.
  const int64_t per_block = !reduce ? int64_t{sched.block} * sched.vector * sched.chunks
                            : sched.layout == Layout::kColumn
                                ? sched.column_lanes * sched.column_groups
                                : 1;
  if (reduce) size.rows_per_block = per_block;
  size.row_in_registers = reduce && sched.layout == Layout::kRow && sched.per_thread > 0;
  if (k.row_groups > 0) {
    // Each group's partial sums come from one block.
    size.grid = ir::SymInt{k.row_groups};
    return size;
  }
  std::vector<ir::SymInt> space = k.outer;
  if (!reduce) space.insert(space.end(), k.inner.begin(), k.inner.end());
  bool constant = false;
  const int64_t n = ConstantProduct(space, &constant);
  if (sched.prefetch) {
    // Several rows a block (Schedule::prefetch), as many blocks as a GPU
    // holds at once at least.
    if (constant) {
      size.grid =
          ir::SymInt{std::min(std::max(std::min(n, kPrefetchMinGrid),
                                       (n + kPrefetchRowsPerBlock - 1) / kPrefetchRowsPerBlock),
                              kMaxGrid)};
      return size;
    }
    const std::string total = ProductExpr(space);
    size.grid = ir::SymInt{absl::StrCat("Min(Max(Min(", total, ", ", kPrefetchMinGrid, "), (",
                                        total, " + ", kPrefetchRowsPerBlock - 1, ")//",
                                        kPrefetchRowsPerBlock, "), ", kMaxGrid, ")")};
    return size;
  }
  if (constant) {
    size.grid = ir::SymInt{std::min((n + per_block - 1) / per_block, kMaxGrid)};
    return size;
  }
  const std::string total = ProductExpr(space);
  size.grid = ir::SymInt{per_block == 1 ? absl::StrCat("Min(", total, ", ", kMaxGrid, ")")
                                        : absl::StrCat("Min((", total, " + ", per_block - 1, ")//",
                                                       per_block, ", ", kMaxGrid, ")")};
  return size;
}

}  // namespace kiln::codegen
