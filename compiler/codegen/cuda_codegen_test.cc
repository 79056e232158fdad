// The CUDA backend without a GPU: what it generates for hand-built kernels
// (layouts, vector widths, launch sizes), and that NVRTC (in the kiln_nvrtc
// helper) compiles it into a CUBIN for sm_90. tests/gpu runs the kernels.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compiler/codegen/codegen.h"
#include "compiler/codegen/cuda_schedule.h"
#include "compiler/codegen/cuda_tuner.h"
#include "compiler/codegen/toolchain.h"
#include "compiler/ir/sym_expr.h"
#include "compiler/loop/kernel.h"
#include "compiler/loop/kernel_builder.h"
#include "gtest/gtest.h"

namespace kiln::codegen {
namespace {

using loop::Kernel;
using loop::ReduceOp;
using loop::ScalarOp;
using loop::testing::C;
using loop::testing::E;
using loop::testing::Idx;
using loop::testing::KernelBuilder;

std::unique_ptr<CodegenBackend> Backend() {
  CudaOptions options;
  options.sm_arch = "sm_90";
  return MakeCudaBackend(options);
}

// out = x * 2 + y, y broadcast over the rows.
Kernel Pointwise(ir::SymInt rows, int64_t cols, v1::DType dtype = v1::FLOAT32) {
  KernelBuilder kb("pointwise", {rows}, {C(cols)});
  const int x = kb.Buffer("x", dtype);
  const int y = kb.Buffer("y", dtype);
  const int out = kb.Buffer("out", dtype, true);
  const int lx = kb.Load(x, Idx({C(cols)}, {C(1)}));
  const int ly = kb.Load(y, Idx({C(0)}, {C(1)}));
  const int two = kb.Const(2);
  const int r = kb.Op(ScalarOp::kAdd, {kb.Op(ScalarOp::kMul, {lx, two}), ly});
  kb.Store(out, Idx({C(cols)}, {C(1)}), r);
  return kb.kernel();
}

// Softmax over rows of `cols` elements `row_stride` apart.
Kernel Softmax(int64_t rows, int64_t cols, ir::SymInt row_stride, ir::SymInt col_stride,
               std::string name = "softmax") {
  KernelBuilder kb(std::move(name), {C(rows)}, {C(cols)}, 3);
  const int x = kb.Buffer("x", v1::FLOAT32);
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  kb.At(0, true);
  const int mx = kb.Reduce(ReduceOp::kMax, kb.Load(x, Idx({row_stride}, {col_stride})));
  kb.At(1, true);
  const int e1 = kb.Op(ScalarOp::kExp,
                       {kb.Op(ScalarOp::kSub, {kb.Load(x, Idx({row_stride}, {col_stride})), mx})});
  const int sum = kb.Reduce(ReduceOp::kSum, e1);
  kb.At(2, true);
  const int e2 = kb.Op(ScalarOp::kExp,
                       {kb.Op(ScalarOp::kSub, {kb.Load(x, Idx({row_stride}, {col_stride})), mx})});
  kb.Store(out, Idx({row_stride}, {col_stride}), kb.Op(ScalarOp::kDiv, {e2, sum}));
  return kb.kernel();
}

// The number of times `needle` occurs in `text`.
size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

TEST(CudaCodegen, PointwiseMovesSixteenByteChunks) {
  auto backend = Backend();
  const Kernel k = Pointwise(C(64), 1024);
  auto source = backend->Generate({k}, {});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE(absl::StrContains(*source, "kiln_vload<4>(v")) << *source;
  EXPECT_TRUE(absl::StrContains(*source, "kiln_vstore<4>(")) << *source;
  auto launch = backend->Launch(k);
  ASSERT_TRUE(launch.ok());
  EXPECT_EQ(launch->block, 256);
  EXPECT_EQ(launch->grid, C(64 * 1024 / (256 * 4)));
  // The launcher aligns every buffer to its chunk: the kernel assumes it.
  EXPECT_EQ(launch->alignment, std::vector<int>(k.buffers.size(), 16));
  EXPECT_TRUE(absl::StrContains(*source, "constexpr bool aligned = true;")) << *source;
  // bfloat16: chunks of 8, two a thread, both loaded before either is
  // used; the grid halves.
  const Kernel k16 = Pointwise(C(64), 1024, v1::BFLOAT16);
  auto bf16 = backend->Generate({k16}, {});
  ASSERT_TRUE(bf16.ok());
  EXPECT_TRUE(absl::StrContains(*bf16, "kiln_vload<8>(g0[u], ")) << *bf16;
  EXPECT_TRUE(absl::StrContains(*bf16, "const auto& v0 = g0[u];")) << *bf16;
  EXPECT_LT(bf16->find("kiln_vload<8>(g1[u], "), bf16->find("const auto& v0 = g0[u];")) << *bf16;
  EXPECT_TRUE(absl::StrContains(*bf16, "kiln_vstore<8>(")) << *bf16;
  EXPECT_EQ(ScheduleOf(k16).chunks, 2);
  EXPECT_EQ(backend->Launch(k16)->grid, C(64 * 1024 / (256 * 8 * 2)));
  EXPECT_TRUE(backend->Compile(*bf16).ok());
  // A space that is not a whole number of steps: the last chunks are skipped.
  const Kernel odd = Pointwise(C(65), 1024, v1::BFLOAT16);
  EXPECT_EQ(backend->Launch(odd)->grid, C((65 * 1024 + 4095) / 4096));
  auto odd_source = backend->Generate({odd}, {});
  ASSERT_TRUE(odd_source.ok());
  EXPECT_TRUE(absl::StrContains(*odd_source, "if (x >= total) break;")) << *odd_source;
  // A grid that covers the space takes one step a thread; a symbolic one
  // may be capped, and loops.
  EXPECT_TRUE(absl::StrContains(*odd_source, "if (x0 >= total) return;")) << *odd_source;
  auto symbolic = backend->Generate({Pointwise(E("s0"), 1024, v1::BFLOAT16)}, {"s0"});
  ASSERT_TRUE(symbolic.ok()) << symbolic.status();
  EXPECT_TRUE(absl::StrContains(*symbolic, "x0 = total - x0 > step ? x0 + step : total"))
      << *symbolic;
  EXPECT_TRUE(backend->Compile(*symbolic).ok());
}

TEST(CudaCodegen, RowsThatDoNotDivideIntoChunksAreNotVectorized) {
  auto backend = Backend();
  auto source = backend->Generate({Pointwise(C(64), 1023)}, {});
  ASSERT_TRUE(source.ok());
  EXPECT_FALSE(absl::StrContains(*source, "kiln_vload<4>(v")) << *source;
  // No alignment is asked of its buffers.
  auto launch = backend->Launch(Pointwise(C(64), 1023));
  ASSERT_TRUE(launch.ok());
  EXPECT_TRUE(launch->alignment.empty());
}

// y = x.t() * 2 with y laid out as x (column-major in y's own view):
// consecutive threads take consecutive elements of y, so both the load and
// the store are coalesced.
TEST(CudaCodegen, PointwiseFollowsTheOutputsMemoryOrder) {
  KernelBuilder kb("transposed", {C(512)}, {C(1024)});
  const int x = kb.Buffer("x", v1::FLOAT32);
  const int y = kb.Buffer("y", v1::FLOAT32, true);
  const int l = kb.Load(x, Idx({C(1)}, {C(512)}));
  kb.Store(y, Idx({C(1)}, {C(512)}), kb.Op(ScalarOp::kMul, {l, kb.Const(2)}));
  auto source = Backend()->Generate({kb.kernel()}, {});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE(absl::StrContains(*source, "const int32_t i0 = x / 512;")) << *source;
  EXPECT_TRUE(absl::StrContains(*source, "const int32_t o0 = x % 512;")) << *source;
  // A row-major output keeps outer-then-inner.
  auto plain = Backend()->Generate({Pointwise(C(64), 1024)}, {});
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(absl::StrContains(*plain, "const int32_t o = x / inner_n;")) << *plain;
}

// Symbolic strides do not compare, but a transpose's dimension of stride 1
// still goes fastest: consecutive threads read and write consecutive
// elements.
TEST(CudaCodegen, ASymbolicTransposeFollowsTheOutputsDimensionOfStrideOne) {
  KernelBuilder kb("transposed", {E("s0")}, {E("s1")});
  const int x = kb.Buffer("x", v1::FLOAT32);
  const int y = kb.Buffer("y", v1::FLOAT32, true);
  const int l = kb.Load(x, Idx({C(1)}, {E("s0")}));
  kb.Store(y, Idx({C(1)}, {E("s0")}), kb.Op(ScalarOp::kMul, {l, kb.Const(2)}));
  auto source = Backend()->Generate({kb.kernel()}, {"s0", "s1"});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE(absl::StrContains(*source, "const int64_t i0 = x / s0;")) << *source;
  EXPECT_TRUE(absl::StrContains(*source, "const int64_t o0 = x % s0;")) << *source;
  // Row-major with symbolic strides keeps outer-then-inner.
  KernelBuilder rows("rows", {E("s0")}, {E("s1")});
  const int a = rows.Buffer("a", v1::FLOAT32);
  const int b = rows.Buffer("b", v1::FLOAT32, true);
  rows.Store(b, Idx({E("s1")}, {C(1)}), rows.Load(a, Idx({E("s1")}, {C(1)})));
  auto plain = Backend()->Generate({rows.kernel()}, {"s0", "s1"});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(absl::StrContains(*plain, "const int64_t o = x / inner_n;")) << *plain;
  EXPECT_TRUE(Backend()->Compile(*source).ok());
}

TEST(CudaCodegen, IndicesAre32BitsWhereEveryOffsetFits) {
  auto small = Backend()->Generate({Pointwise(C(64), 1024)}, {});
  ASSERT_TRUE(small.ok());
  EXPECT_TRUE(absl::StrContains(*small, "const int32_t total = outer_n * inner_n;")) << *small;
  // 2^21 x 1024 elements: past 2^30, 64-bit indices.
  auto large = Backend()->Generate({Pointwise(C(int64_t{1} << 21), 1024)}, {});
  ASSERT_TRUE(large.ok());
  EXPECT_TRUE(absl::StrContains(*large, "const int64_t total = outer_n * inner_n;")) << *large;
  // Symbolic sizes: 64-bit.
  auto symbolic = Backend()->Generate({Pointwise(E("s0"), 256)}, {"s0"});
  ASSERT_TRUE(symbolic.ok());
  EXPECT_TRUE(absl::StrContains(*symbolic, "const int64_t total")) << *symbolic;
}

TEST(CudaCodegen, SymbolicSizesAreKernelArgumentsAndGridExpressions) {
  auto backend = Backend();
  const Kernel k = Pointwise(E("s0"), 256);
  auto source = backend->Generate({k}, {"s0"});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE(absl::StrContains(*source, "const int64_t s0 = a.s[0];")) << *source;
  auto launch = backend->Launch(k);
  ASSERT_TRUE(launch.ok());
  ASSERT_FALSE(launch->grid.is_constant());
  EXPECT_EQ(launch->grid.expr(), "Min(((s0)*256 + 1023)//1024, 1048576)");
}

TEST(CudaCodegen, ShortRowsStayInRegistersAcrossPasses) {
  auto backend = Backend();
  const Kernel k = Softmax(512, 4096, C(4096), C(1));
  auto source = backend->Generate({k}, {});
  ASSERT_TRUE(source.ok()) << source.status();
  // 4096 float32 elements: 512 threads of two 4-element vectors, loaded
  // once, reread from registers; the row's 16 registers (its elements and
  // their exps) leave room for an SM's 2048 threads at 32 registers each.
  EXPECT_TRUE(absl::StrContains(*source, "__launch_bounds__(512, 4)")) << *source;
  EXPECT_TRUE(absl::StrContains(*source, "c0[8]")) << *source;
  EXPECT_TRUE(absl::StrContains(*source, "= c0[e];")) << *source;
  EXPECT_TRUE(absl::StrContains(*source, "kiln_block_reduce(")) << *source;
  auto launch = backend->Launch(k);
  ASSERT_TRUE(launch.ok());
  EXPECT_EQ(launch->block, 512);
  EXPECT_EQ(launch->grid, C(512));
  auto module = backend->Compile(*source);
  ASSERT_TRUE(module.ok()) << module.status();
}

// A thread's share of a row kept in registers is whole 16-byte vectors,
// also where the row does not split evenly over the block (768 bfloat16
// elements at 64 threads: two vectors each, the second only in half the
// lanes) and over several inner dims (a batch norm's [H, W] per channel).
TEST(CudaCodegen, RowsInRegistersAreReadInVectorsOfTheirLastDim) {
  KernelBuilder kb("centered_rows", {C(4096)}, {C(768)}, 2);
  const int x = kb.Buffer("x", v1::BFLOAT16);
  const int out = kb.Buffer("out", v1::BFLOAT16, true);
  kb.At(0, true);
  const int sum = kb.Reduce(ReduceOp::kSum, kb.Load(x, Idx({C(768)}, {C(1)})));
  kb.At(1, true);
  kb.Store(out, Idx({C(768)}, {C(1)}),
           kb.Op(ScalarOp::kSub, {kb.Load(x, Idx({C(768)}, {C(1)})), sum}));
  const Kernel k = kb.kernel();
  Schedule sched = ScheduleOf(k);
  EXPECT_EQ(sched.block, 64);
  EXPECT_EQ(sched.vector, 8);
  EXPECT_EQ(sched.per_thread, 16);
  auto source = Backend()->Generate({k}, {});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE(absl::StrContains(*source, "i = (lane + ec * 64) * 8;")) << *source;
  EXPECT_TRUE(absl::StrContains(*source, "kiln_vload<8>(")) << *source;
  auto module = Backend()->Compile(*source);
  EXPECT_TRUE(module.ok()) << module.status() << *source;

  KernelBuilder bn("channel_sums", {C(32)}, {C(8), C(64), C(64)});
  const int y = bn.Buffer("y", v1::BFLOAT16);
  const int o = bn.Buffer("o", v1::FLOAT32, true);
  bn.At(0, true);
  const int r = bn.Reduce(ReduceOp::kSum, bn.Load(y, Idx({C(4096)}, {C(131072), C(64), C(1)})));
  bn.At(0, false);
  bn.Store(o, Idx({C(1)}, {C(0), C(0), C(0)}), r);
  sched = ScheduleOf(bn.kernel());
  EXPECT_EQ(sched.vector, 8);
  EXPECT_GT(sched.per_thread, 0);
  EXPECT_EQ(sched.per_thread % 8, 0);
  auto channels = Backend()->Generate({bn.kernel()}, {});
  ASSERT_TRUE(channels.ok()) << channels.status();
  EXPECT_TRUE(absl::StrContains(*channels, "kiln_vload<8>(")) << *channels;
  EXPECT_TRUE(Backend()->Compile(*channels).ok());
}

// out = (x - sum(x)) * sum((x - sum(x))^2) * w over bfloat16 rows of
// `cols` (a layer norm's shape, three passes; `passes` 2: the first pass
// only), w the same for every row.
Kernel CenteredRows(ir::SymInt rows, int64_t cols, int passes = 3) {
  KernelBuilder kb("centered_rows", {rows}, {C(cols)}, passes);
  const int x = kb.Buffer("x", v1::BFLOAT16);
  const int w = kb.Buffer("w", v1::BFLOAT16);
  const int out = kb.Buffer("out", v1::BFLOAT16, true);
  kb.At(0, true);
  const int sum = kb.Reduce(ReduceOp::kSum, kb.Load(x, Idx({C(cols)}, {C(1)})));
  int scale = sum;
  if (passes == 3) {
    kb.At(1, true);
    const int d = kb.Op(ScalarOp::kSub, {kb.Load(x, Idx({C(cols)}, {C(1)})), sum});
    scale = kb.Reduce(ReduceOp::kSum, kb.Op(ScalarOp::kMul, {d, d}));
  }
  kb.At(passes - 1, true);
  const int centered = kb.Op(ScalarOp::kSub, {kb.Load(x, Idx({C(cols)}, {C(1)})), sum});
  kb.Store(out, Idx({C(cols)}, {C(1)}),
           kb.Op(ScalarOp::kMul,
                 {kb.Op(ScalarOp::kMul, {centered, scale}), kb.Load(w, Idx({C(0)}, {C(1)}))}));
  return kb.kernel();
}

// 16-bit rows in registers that wait on two block reductions take four
// rows a block, each block loading the next row's vectors of x (not of w,
// the same for every row) before it reduces the current one; at least
// 2048 blocks, so that short grids keep a row a block. Rows of one
// reduction, and rows that fill their SMs at 32 registers (float32 softmax
// at 512 threads), keep a row a block and no registers ahead.
TEST(CudaCodegen, SixteenBitRowsLoadTheNextRowAhead) {
  auto backend = Backend();
  const Kernel k = CenteredRows(C(16384), 4096);
  const Schedule sched = ScheduleOf(k);
  EXPECT_TRUE(sched.prefetch);
  EXPECT_EQ(PrefetchedLoads(k, sched), std::vector<int>{0});
  auto launch = backend->Launch(k);
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_EQ(launch->grid, C(4096));
  auto source = backend->Generate({k}, {});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(Count(*source, "alignas(16) uint16_t kiln_ahead"), 1) << *source;
  EXPECT_TRUE(absl::StrContains(*source, "if (o + gridDim.x < outer_n) {")) << *source;
  EXPECT_TRUE(absl::StrContains(*source, "const auto& v0 = kiln_row0[ec];")) << *source;
  auto module = backend->Compile(*source);
  EXPECT_TRUE(module.ok()) << module.status();

  EXPECT_EQ(backend->Launch(CenteredRows(C(1000), 4096))->grid, C(1000));
  EXPECT_EQ(backend->Launch(CenteredRows(C(12000), 4096))->grid, C(3000));
  auto symbolic = backend->Launch(CenteredRows(ir::SymInt{"s0"}, 4096));
  ASSERT_TRUE(symbolic.ok()) << symbolic.status();
  ASSERT_FALSE(symbolic->grid.is_constant());
  EXPECT_EQ(symbolic->grid.expr(), "Min(Max(Min((s0), 2048), ((s0) + 3)//4), 1048576)");
  // As the runtime evaluates it: the constant sizes' grids.
  absl::StatusOr<ir::SymExpr> grid = ir::SymExpr::Parse(symbolic->grid.expr());
  ASSERT_TRUE(grid.ok()) << grid.status();
  EXPECT_EQ(*grid->Evaluate({{"s0", 1000}}), 1000);
  EXPECT_EQ(*grid->Evaluate({{"s0", 12000}}), 3000);
  EXPECT_EQ(*grid->Evaluate({{"s0", 4000}}), 2048);

  EXPECT_FALSE(ScheduleOf(CenteredRows(C(16384), 4096, 2)).prefetch);
  EXPECT_EQ(backend->Launch(CenteredRows(C(16384), 4096, 2))->grid, C(16384));

  const Kernel f32 = Softmax(16384, 4096, C(4096), C(1));
  EXPECT_TRUE(FillsSms(ScheduleOf(f32)));
  EXPECT_FALSE(ScheduleOf(f32).prefetch);
  EXPECT_EQ(backend->Launch(f32)->grid, C(16384));
  auto plain = backend->Generate({f32}, {});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(absl::StrContains(*plain, "kiln_ahead")) << *plain;
}

// A row whose registers would not fit 32 per thread keeps the compiler's
// own register count: 16 elements per thread are not capped.
TEST(CudaCodegen, LongCachedRowsKeepTheirRegisters) {
  auto backend = Backend();
  Kernel k = Softmax(512, 4096, C(4096), C(1));
  k.block = 256;  // 16 per thread
  auto source = backend->Generate({k}, {});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE(absl::StrContains(*source, "c0[16]")) << *source;
  EXPECT_TRUE(absl::StrContains(*source, "__launch_bounds__(256)")) << *source;
}

// A row of symbolic length is swept in chunks too: aligned only when its
// stride divides by the width (checked as the kernel runs), with a tail loop
// for the row's last elements.
TEST(CudaCodegen, RowsOfSymbolicLengthAreSweptInChunksWithATail) {
  KernelBuilder kb("row_sum", {E("s0")}, {E("s1")});
  const int x = kb.Buffer("x", v1::BFLOAT16);
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  kb.At(0, true);
  const int sum = kb.Reduce(ReduceOp::kSum, kb.Load(x, Idx({E("s1")}, {C(1)})));
  kb.At(0, false);
  kb.Store(out, Idx({C(1)}, {C(0)}), sum);
  const Kernel k = kb.kernel();
  const Schedule sched = ScheduleOf(k);
  EXPECT_EQ(sched.vector, 8);  // 16 bytes of bfloat16
  EXPECT_TRUE(sched.vector_tail);
  ASSERT_EQ(sched.vector_checks.size(), 1u);
  EXPECT_EQ(sched.vector_checks[0], E("s1"));
  auto source = Backend()->Generate({k}, {"s0", "s1"});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE(absl::StrContains(*source, "const bool aligned = (((s1) % 8)) == 0;")) << *source;
  // The bfloat16 row is read in chunks of 16 bytes; the float32 sums are
  // stored one per row.
  EXPECT_EQ(SizeLaunch(k).alignment, (std::vector<int>{16, 0}));
  EXPECT_TRUE(absl::StrContains(*source, "kiln_vload<8>(")) << *source;
  EXPECT_TRUE(absl::StrContains(*source, "i = inner_n / 8 * 8 + lane; i < inner_n;")) << *source;
  EXPECT_TRUE(Backend()->Compile(*source).ok());
  // Two inner dimensions of symbolic sizes: element by element.
  KernelBuilder two("two_dims", {E("s0")}, {E("s1"), C(4)});
  const int y = two.Buffer("y", v1::FLOAT32);
  const int o = two.Buffer("o", v1::FLOAT32, true);
  two.At(0, true);
  const int r = two.Reduce(ReduceOp::kSum, two.Load(y, Idx({E("4*s1")}, {C(4), C(1)})));
  two.At(0, false);
  two.Store(o, Idx({C(1)}, {C(0), C(0)}), r);
  EXPECT_EQ(ScheduleOf(two.kernel()).vector, 1);
}

TEST(CudaCodegen, LongRowsAreSweptByALoopOfChunks) {
  auto backend = Backend();
  auto source = backend->Generate({Softmax(8, 100000, C(100000), C(1))}, {});
  ASSERT_TRUE(source.ok());
  EXPECT_FALSE(absl::StrContains(*source, "c0[")) << *source;
  // 256 threads, each loading four chunks before it uses any.
  EXPECT_EQ(ScheduleOf(Softmax(8, 100000, C(100000), C(1))).block, 256);
  EXPECT_TRUE(absl::StrContains(*source, "ch0 < inner_n / 4; ch0 += 1024")) << *source;
  EXPECT_TRUE(absl::StrContains(*source, "const int32_t ch = ch0 + u * 256;")) << *source;
  EXPECT_TRUE(absl::StrContains(*source, "kiln_vload<4>(g0[u], ")) << *source;
  EXPECT_TRUE(absl::StrContains(*source, "const auto& v0 = g0[u];")) << *source;
  EXPECT_TRUE(backend->Compile(*source).ok());
  // A row that does not divide into chunks: element by element.
  auto odd = backend->Generate({Softmax(8, 100001, C(100001), C(1))}, {});
  ASSERT_TRUE(odd.ok());
  EXPECT_TRUE(absl::StrContains(*odd, "i < inner_n; i += 256")) << *odd;
}

TEST(CudaCodegen, StridedRowsTakeTheColumnLayout) {
  auto backend = Backend();
  // Softmax over dim 0 of a [1000, 300] tensor: rows 1 apart, elements 300.
  const Kernel k = Softmax(300, 1000, C(1), C(300));
  auto source = backend->Generate({k}, {});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE(absl::StrContains(*source, "kiln_column_reduce(")) << *source;
  auto launch = backend->Launch(k);
  ASSERT_TRUE(launch.ok());
  EXPECT_EQ(launch->block, 1024);
  EXPECT_EQ(launch->grid, C((300 + 31) / 32));
}

// Sum and Welford variance over dim 0 of a [rows, cols] tensor of `dtype`.
// A column sweep of two streams (a GELU's gradient beside its bias's: the
// gradient and the matmul's output) is unrolled two steps, but not when its
// loads are 16-bit and its body calls a library function (erf, tanh...),
// whose copies for a second step doubled NVRTC's time for no speed.
Kernel TwoStreamColumnSum(v1::DType dtype, bool with_tanh) {
  KernelBuilder kb("two_stream_column_sum", {C(1024)}, {C(4096)});
  const int g = kb.Buffer("g", dtype);
  const int x = kb.Buffer("x", dtype);
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  kb.At(0, true);
  int value = kb.Load(x, Idx({C(1)}, {C(1024)}));
  if (with_tanh) value = kb.Op(ScalarOp::kTanh, {value});
  value = kb.Op(ScalarOp::kMul, {kb.Load(g, Idx({C(1)}, {C(1024)})), value});
  const int total = kb.Reduce(ReduceOp::kSum, value);
  kb.At(0, false);
  kb.Store(out, Idx({C(1)}, {}), total);
  return kb.kernel();
}

TEST(CudaCodegen, SixteenBitColumnSweepsOfLibraryFunctionsAreNotUnrolled) {
  auto backend = Backend();
  struct Case {
    v1::DType dtype;
    bool with_tanh;
    int unroll;
  };
  for (const Case& c : {Case{v1::BFLOAT16, true, 1}, Case{v1::BFLOAT16, false, 2},
                        Case{v1::FLOAT16, true, 1}, Case{v1::FLOAT32, true, 2}}) {
    SCOPED_TRACE(absl::StrCat(v1::DType_Name(c.dtype), c.with_tanh ? " with tanh" : ""));
    const Kernel k = TwoStreamColumnSum(c.dtype, c.with_tanh);
    ASSERT_TRUE(ScheduleOf(k).column_packed);
    auto source = backend->Generate({k}, {});
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_TRUE(absl::StrContains(
        *source, absl::StrCat("#pragma unroll ", c.unroll, "\n    for (int32_t i = lane;")))
        << *source;
    auto module = backend->Compile(*source);
    ASSERT_TRUE(module.ok()) << module.status();
  }
}

// A stream that nothing reads after the kernel (KernelBuffer::streamed) is
// loaded with streaming loads; the other keeps the cached ones. Both
// compile.
TEST(CudaCodegen, StreamedColumnsAreReadPastTheCachesKeeping) {
  auto backend = Backend();
  Kernel k = TwoStreamColumnSum(v1::BFLOAT16, false);
  ASSERT_TRUE(ScheduleOf(k).column_packed);
  k.buffers[1].streamed = true;  // x
  auto source = backend->Generate({k}, {});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE(absl::StrContains(*source, "kiln_vload_once<8>(v0, &buf1[")) << *source;
  EXPECT_TRUE(absl::StrContains(*source, "kiln_vload<8>(v1, &buf0[")) << *source;
  auto module = backend->Compile(*source);
  ASSERT_TRUE(module.ok()) << module.status();
}

Kernel ColumnStats(int64_t rows, int64_t cols, v1::DType dtype) {
  KernelBuilder kb("column_stats", {C(cols)}, {C(rows)});
  const int x = kb.Buffer("x", dtype);
  const int sum = kb.Buffer("sum", v1::FLOAT32, true);
  const int var = kb.Buffer("var", v1::FLOAT32, true);
  kb.At(0, true);
  const int load = kb.Load(x, Idx({C(1)}, {C(cols)}));
  const int total = kb.Reduce(ReduceOp::kSum, load);
  kb.Reduce(ReduceOp::kWelfordMean, load);
  const int m2 = kb.Reduce(ReduceOp::kWelfordM2, load);
  kb.At(0, false);
  kb.Store(sum, Idx({C(1)}, {}), total);
  kb.Store(var, Idx({C(1)}, {}), m2);
  return kb.kernel();
}

// The wide column layout combines every group's sums over the warps at
// once (kiln_column_reduce_groups) where G x 32 x 34 of them fit in the
// shared memory; Welford's statistics still one group at a time.
TEST(CudaCodegen, ColumnSumsCombineEveryGroupAtOnce) {
  auto backend = Backend();
  for (v1::DType dtype : {v1::BFLOAT16, v1::FLOAT32, v1::FLOAT64}) {
    SCOPED_TRACE(v1::DType_Name(dtype));
    const Kernel k = TwoStreamColumnSum(dtype, false);
    ASSERT_GT(ScheduleOf(k).column_groups, 1);
    auto source = backend->Generate({k}, {});
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_TRUE(absl::StrContains(*source, "kiln_column_reduce_groups(acc")) << *source;
    EXPECT_FALSE(absl::StrContains(*source, "= kiln_column_reduce(")) << *source;
    // bfloat16: 8 groups of float sums, 8 x 32 x 34 floats.
    if (dtype == v1::BFLOAT16) {
      EXPECT_TRUE(absl::StrContains(*source, "__shared__ double kiln_smem[4352];")) << *source;
    }
    auto module = backend->Compile(*source);
    ASSERT_TRUE(module.ok()) << module.status();
  }
  auto stats = backend->Generate({ColumnStats(4096, 1024, v1::BFLOAT16)}, {});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(absl::StrContains(*stats, "kiln_column_reduce_groups(acc")) << *stats;
  EXPECT_TRUE(absl::StrContains(*stats, "kiln_column_welford(wm")) << *stats;
}

TEST(CudaCodegen, ColumnsAreReadInGroupsOf512Bytes) {
  auto backend = Backend();
  // float32: 4 groups of 32 columns per block, 128 x 4 bytes per warp step;
  // 1000 columns leave the last block's last groups partly idle.
  const Kernel f32 = ColumnStats(4096, 1000, v1::FLOAT32);
  auto source = backend->Generate({f32}, {});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE(absl::StrContains(*source, "for (int g = 0; g < 4; ++g)")) << *source;
  EXPECT_TRUE(absl::StrContains(*source, "kiln_column_reduce_groups(acc")) << *source;
  EXPECT_TRUE(absl::StrContains(*source, "kiln_column_welford(wm")) << *source;
  auto launch = backend->Launch(f32);
  ASSERT_TRUE(launch.ok());
  EXPECT_EQ(launch->block, 1024);
  EXPECT_EQ(launch->grid, C((1000 + 127) / 128));
  EXPECT_EQ(launch->rows_per_block, 128);
  // bfloat16: 8 groups; 40 columns: one group.
  auto bf16 = backend->Launch(ColumnStats(4096, 1000, v1::BFLOAT16));
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(bf16->rows_per_block, 256);
  auto narrow = backend->Launch(ColumnStats(4096, 40, v1::BFLOAT16));
  ASSERT_TRUE(narrow.ok());
  EXPECT_EQ(narrow->rows_per_block, 32);
  // A kernel of several passes keeps one group.
  auto softmax = backend->Launch(Softmax(300, 1000, C(1), C(300)));
  ASSERT_TRUE(softmax.ok());
  EXPECT_EQ(softmax->rows_per_block, 32);
  auto module = backend->Compile(*source);
  ASSERT_TRUE(module.ok()) << module.status();
}

// Sum over dim 0 of a [rows, cols] tensor of `dtype`, each column scaled by
// `parameters` float32 parameters of its own (loads that stay put along the
// sweep).
Kernel ScaledColumnSum(int64_t rows, int64_t cols, v1::DType dtype, int parameters = 1) {
  KernelBuilder kb("scaled_column_sum", {C(cols)}, {C(rows)});
  const int x = kb.Buffer("x", dtype);
  std::vector<int> w;
  for (int p = 0; p < parameters; ++p) w.push_back(kb.Buffer(absl::StrCat("w", p), v1::FLOAT32));
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  kb.At(0, true);
  int value = kb.Load(x, Idx({C(1)}, {C(cols)}));
  for (int b : w) value = kb.Op(ScalarOp::kMul, {value, kb.Load(b, Idx({C(1)}, {C(0)}))});
  const int total = kb.Reduce(ReduceOp::kSum, value);
  kb.At(0, false);
  kb.Store(out, Idx({C(1)}, {}), total);
  return kb.kernel();
}

// Rows narrower than a warp's chunks (a channels-last mean: the channels
// of a pixel, then the next pixel's): a block of 128 threads takes one row
// of chunks, 16 bytes of x each, and a warp's other lanes take the next
// steps of the sweep, so that each warp step still reads 512 adjacent
// bytes. Rows that do not make a power of two of chunks keep 32 lanes, as
// does Welford.
TEST(CudaCodegen, NarrowRowsShareEachWarpWithTheNextStepsOfTheSweep) {
  auto backend = Backend();
  struct Case {
    v1::DType dtype;
    int64_t cols;
    int lanes, groups;
  };
  for (const Case& c : {Case{v1::FLOAT32, 64, 16, 4}, Case{v1::BFLOAT16, 32, 4, 8},
                        Case{v1::BFLOAT16, 8, 1, 8}, Case{v1::FLOAT32, 8, 2, 4}}) {
    SCOPED_TRACE(absl::StrCat(v1::DType_Name(c.dtype), " x ", c.cols));
    const Kernel k = ScaledColumnSum(4096, c.cols, c.dtype);
    const Schedule sched = ScheduleOf(k);
    EXPECT_EQ(sched.column_lanes, c.lanes);
    EXPECT_EQ(sched.column_groups, c.groups);
    auto source = backend->Generate({k}, {});
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_TRUE(
        absl::StrContains(*source, absl::StrCat("kiln_narrow_column_reduce<", c.lanes, ">(acc")))
        << *source;
    EXPECT_TRUE(absl::StrContains(*source, absl::StrCat("i += ", 128 / c.lanes, ")"))) << *source;
    auto launch = backend->Launch(k);
    ASSERT_TRUE(launch.ok());
    EXPECT_EQ(launch->block, kNarrowColumnBlock);
    EXPECT_EQ(launch->rows_per_block, c.cols);
    EXPECT_EQ(launch->grid, C(1));
    auto module = backend->Compile(*source);
    ASSERT_TRUE(module.ok()) << module.status();
  }
  EXPECT_EQ(ScheduleOf(ScaledColumnSum(4096, 48, v1::BFLOAT16)).column_lanes, kColumnRows);
  // Eight parameters a row: a lane takes 4 rows (8 bytes of bfloat16), not
  // 8, so that their 32 registers leave room for more blocks an SM; float32
  // keeps 16-byte chunks, its 4 rows' 32 registers within the bound. The
  // sweep, one stream however many parameters, is unrolled 4 steps.
  const Kernel many = ScaledColumnSum(4096, 32, v1::BFLOAT16, 8);
  EXPECT_EQ(ScheduleOf(many).column_groups, 4);
  EXPECT_EQ(ScheduleOf(many).column_lanes, 8);
  EXPECT_EQ(ScheduleOf(ScaledColumnSum(4096, 32, v1::FLOAT32, 8)).column_groups, 4);
  auto source = backend->Generate({many}, {});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE(absl::StrContains(*source, "#pragma unroll 4\n    for (int32_t i = lane;"))
      << *source;
  ASSERT_TRUE(backend->Compile(*source).ok());
  EXPECT_EQ(ScheduleOf(ScaledColumnSum(4096, 1024, v1::FLOAT32)).column_lanes, kColumnRows);
  EXPECT_EQ(ScheduleOf(ColumnStats(4096, 64, v1::FLOAT32)).column_lanes, kColumnRows);
}

// Where a lane's rows can be adjacent in memory, it takes adjacent ones and
// reads each step's as one 16-byte vector; rows that do not divide into
// vectors, and loads offset off a vector's boundary, keep the groups 32
// rows apart.
TEST(CudaCodegen, AdjacentColumnsAreReadAsOneVectorPerLane) {
  auto backend = Backend();
  for (auto [dtype, vector] : {std::pair{v1::FLOAT32, 4}, std::pair{v1::BFLOAT16, 8}}) {
    const Kernel k = ColumnStats(4096, 1024, dtype);
    EXPECT_TRUE(ScheduleOf(k).column_packed);
    auto source = backend->Generate({k}, {});
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_TRUE(absl::StrContains(*source, absl::StrCat("kiln_vload<", vector, ">(v"))) << *source;
    EXPECT_TRUE(absl::StrContains(*source, absl::StrCat("(threadIdx.x & 31) * ", vector, " + g")))
        << *source;
    auto module = backend->Compile(*source);
    ASSERT_TRUE(module.ok()) << module.status();
  }
  EXPECT_FALSE(ScheduleOf(ColumnStats(4096, 999, v1::FLOAT32)).column_packed);
  // Each column scaled by its row's value (a load that does not move along
  // the columns, read per element), and a load one element past a vector
  // boundary.
  for (int64_t offset : {0, 1}) {
    KernelBuilder kb("scaled_columns", {C(512)}, {C(2048)});
    const int x = kb.Buffer("x", v1::FLOAT32);
    const int r = kb.Buffer("r", v1::FLOAT32);
    const int out = kb.Buffer("out", v1::FLOAT32, true);
    kb.At(0, true);
    const int lx = kb.Load(x, Idx({C(1)}, {C(520)}, C(offset)));
    const int lr = kb.Load(r, Idx({C(0)}, {C(1)}));
    const int total = kb.Reduce(ReduceOp::kSum, kb.Op(ScalarOp::kMul, {lx, lr}));
    kb.At(0, false);
    kb.Store(out, Idx({C(1)}, {}), total);
    EXPECT_EQ(ScheduleOf(kb.kernel()).column_packed, offset == 0) << offset;
    // Packed: x's chunks of 4 columns are 16-byte vectors; r is read per
    // element and out written per element.
    EXPECT_EQ(SizeLaunch(kb.kernel()).alignment,
              offset == 0 ? (std::vector<int>{16, 0, 0}) : std::vector<int>{})
        << offset;
    auto source = backend->Generate({kb.kernel()}, {});
    ASSERT_TRUE(source.ok()) << source.status();
    auto module = backend->Compile(*source);
    ASSERT_TRUE(module.ok()) << module.status();
  }
}

// A softmax row kept in registers computes each exp once: the pass that
// divides reads the pass that sums them from registers.
TEST(CudaCodegen, LaterPassesReadCostlyValuesFromRegisters) {
  auto backend = Backend();
  auto source = backend->Generate({Softmax(512, 4096, C(4096), C(1))}, {});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(Count(*source, " = kiln_exp("), 1u) << *source;
  EXPECT_TRUE(absl::StrContains(*source, "[e] = t")) << *source;
}

// A layer norm of a residual sum of four tensors (GPT-2's): the later
// passes use the sum alone, so its registers are kept, not the four rows
// it was added from (64 registers a thread rather than 16), and the adds
// are not made again.
TEST(CudaCodegen, LaterPassesKeepTheFewestValuesThatCoverWhatTheyUse) {
  constexpr int64_t kCols = 768;
  KernelBuilder kb("add_layer_norm", {C(4096)}, {C(kCols)}, 3);
  std::vector<int> inputs;
  for (const char* name : {"a", "b", "c", "d"}) inputs.push_back(kb.Buffer(name, v1::BFLOAT16));
  const int sum_out = kb.Buffer("sum", v1::BFLOAT16, true);
  const int out = kb.Buffer("out", v1::BFLOAT16, true);
  auto summed = [&] {
    int s = kb.Load(inputs[0], Idx({C(kCols)}, {C(1)}));
    for (size_t i = 1; i < inputs.size(); ++i) {
      s = kb.Op(ScalarOp::kAdd, {s, kb.Load(inputs[i], Idx({C(kCols)}, {C(1)}))});
    }
    return s;
  };
  kb.At(0, true);
  const int s0 = summed();
  kb.Store(sum_out, Idx({C(kCols)}, {C(1)}), s0);
  const int total = kb.Reduce(ReduceOp::kSum, s0);
  kb.At(0, false);
  const int mean = kb.Op(ScalarOp::kDiv, {total, kb.Const(kCols)});
  kb.At(1, true);
  const int d1 = kb.Op(ScalarOp::kSub, {summed(), mean});
  const int squares = kb.Reduce(ReduceOp::kSum, kb.Op(ScalarOp::kMul, {d1, d1}));
  kb.At(1, false);
  const int rstd = kb.Op(ScalarOp::kRsqrt, {kb.Op(ScalarOp::kDiv, {squares, kb.Const(kCols)})});
  kb.At(2, true);
  kb.Store(out, Idx({C(kCols)}, {C(1)}),
           kb.Op(ScalarOp::kMul, {kb.Op(ScalarOp::kSub, {summed(), mean}), rstd}));
  auto backend = Backend();
  auto source = backend->Generate({kb.kernel()}, {});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(Count(*source, "    float c"), 1u) << *source;
  EXPECT_EQ(Count(*source, "kiln_vload<"), 4u) << *source;  // pass 0's only
  EXPECT_EQ(Count(*source, " + t"), 3u) << *source;         // the adds, in pass 0 alone
  auto module = backend->Compile(*source);
  ASSERT_TRUE(module.ok()) << module.status();
}

// A float32 softmax divides by the row's sum as a product with its
// reciprocal, computed once per row; a division by a value of the element
// stays a division.
TEST(CudaCodegen, Float32DivisionsByARowsValueAreProductsWithItsReciprocal) {
  auto backend = Backend();
  auto source = backend->Generate({Softmax(512, 4096, C(4096), C(1))}, {});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE(absl::StrContains(*source, " * (float(1) / t")) << *source;

  KernelBuilder kb("ratio", {C(64)}, {C(1024)});
  const int x = kb.Buffer("x", v1::FLOAT32);
  const int y = kb.Buffer("y", v1::FLOAT32);
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  kb.Store(out, Idx({C(1024)}, {C(1)}),
           kb.Op(ScalarOp::kDiv,
                 {kb.Load(x, Idx({C(1024)}, {C(1)})), kb.Load(y, Idx({C(1024)}, {C(1)}))}));
  auto ratio = backend->Generate({kb.kernel()}, {});
  ASSERT_TRUE(ratio.ok()) << ratio.status();
  EXPECT_FALSE(absl::StrContains(*ratio, "(float(1) / ")) << *ratio;
  EXPECT_TRUE(absl::StrContains(*ratio, " / t")) << *ratio;
}

// Kernels whose every result is stored in 16 bits take the approximations
// of namespace kiln_fast; float32 results keep the exact functions.
TEST(CudaCodegen, SixteenBitResultsTakeTheFastApproximations) {
  auto backend = Backend();
  const std::string marker = "namespace kiln_fast {\n\nstruct pointwise_args";
  auto bf16 = backend->Generate({Pointwise(C(64), 1024, v1::BFLOAT16)}, {});
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_TRUE(absl::StrContains(*bf16, marker)) << *bf16;
  auto f32 = backend->Generate({Pointwise(C(64), 1024)}, {});
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_FALSE(absl::StrContains(*f32, marker)) << *f32;
  auto module = backend->Compile(*bf16);
  ASSERT_TRUE(module.ok()) << module.status();
}

// A long row's Welford merges each vector chunk into the thread's mean and
// M2; a constant row of whole groups of chunks merges each group as one
// chunk, unguarded.
TEST(CudaCodegen, WelfordMergesEachChunkOrEachWholeGroup) {
  for (const int64_t n : {int64_t{100000}, int64_t{131072}}) {
    SCOPED_TRACE(n);
    // 100000 / 4 chunks are not whole groups of 4 x 256 threads; 131072 / 4 are.
    const bool whole = n == 131072;
    KernelBuilder kb("row_var", {C(8)}, {C(n)});
    const int x = kb.Buffer("x", v1::FLOAT32);
    const int var = kb.Buffer("var", v1::FLOAT32, true);
    kb.At(0, true);
    const int load = kb.Load(x, Idx({C(n)}, {C(1)}));
    kb.Reduce(ReduceOp::kWelfordMean, load);
    const int m2 = kb.Reduce(ReduceOp::kWelfordM2, load);
    kb.At(0, false);
    kb.Store(var, Idx({C(1)}, {}), m2);
    auto backend = Backend();
    auto source = backend->Generate({kb.kernel()}, {});
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_TRUE(absl::StrContains(*source, "kiln_vload<4>(g0[u], ")) << *source;
    EXPECT_EQ(absl::StrContains(*source, "if (ch < inner_n / 4)"), !whole) << *source;
    EXPECT_EQ(absl::StrContains(*source, "float wx1[16];"), whole) << *source;
    EXPECT_EQ(absl::StrContains(*source, "wx1[u * 4 + v] = t0;"), whole) << *source;
    EXPECT_EQ(absl::StrContains(*source, "wx1[v] = t0;"), !whole) << *source;
    EXPECT_TRUE(absl::StrContains(
        *source,
        absl::StrCat("kiln_welford_chunk(wm1, wq1, wn1, m, q, float(", whole ? 16 : 4, "));")))
        << *source;
    EXPECT_FALSE(absl::StrContains(*source, "+= d / wn1")) << *source;
    auto module = backend->Compile(*source);
    ASSERT_TRUE(module.ok()) << module.status();
  }
}

TEST(CudaCodegen, NvrtcBuildsACubinForSm90) {
  auto backend = Backend();
  auto source = backend->Generate(
      {Pointwise(E("s0"), 256), Softmax(300, 1000, C(1), C(300), "softmax_columns"),
       Softmax(512, 4096, C(4096), C(1), "softmax_rows")},
      {"s0"});
  ASSERT_TRUE(source.ok()) << source.status();
  auto module = backend->Compile(*source);
  ASSERT_TRUE(module.ok()) << module.status();
  EXPECT_EQ(module->language(), "cuda");
  ASSERT_GT(module->binary().size(), 4u);
  EXPECT_EQ(module->binary().substr(0, 4),
            "\x7f"
            "ELF");
  EXPECT_TRUE(absl::StrContains(module->compile_command(), "--arch=sm_90"));
}

// Reversed kernels (loop::Kernel::reversed, the sweep-order pass): every
// layout's blocks take their work from the last to the first, and compile.
TEST(CudaCodegen, ReversedSweepsTakeTheLastWorkFirstInEveryLayout) {
  auto backend = Backend();
  struct Case {
    Kernel kernel;
    std::string loop;  // what the reversed kernel's outer loop says
  };
  std::vector<Case> cases = {
      {Pointwise(C(64), 4096), "const int32_t x = ((chunks - 1 - c) * 256 + threadIdx.x) * 4;"},
      {Pointwise(E("s0"), 256), "if (x >= total) continue;"},
      {Softmax(512, 4096, C(4096), C(1), "rows"), "const int32_t o = outer_n - 1 - r;"},
      {Softmax(300, 1000, C(1), C(300), "columns"), "const int32_t tile = tiles - 1 - r;"},
      {ColumnStats(4096, 1000, v1::FLOAT32), "const int32_t tiles = (outer_n + 127) / 128;"},
      {ColumnStats(4096, 1024, v1::BFLOAT16), "const int32_t tile = tiles - 1 - r;"},
      {ScaledColumnSum(4096, 32, v1::BFLOAT16), "const int32_t tile = tiles - 1 - r;"},
  };
  std::vector<Kernel> kernels;
  for (size_t i = 0; i < cases.size(); ++i) {
    Case& c = cases[i];
    SCOPED_TRACE(c.kernel.name);
    auto plain = backend->Generate({c.kernel}, {"s0"});
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_FALSE(absl::StrContains(*plain, c.loop)) << *plain;
    c.kernel.reversed = true;
    auto source = backend->Generate({c.kernel}, {"s0"});
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_TRUE(absl::StrContains(*source, c.loop)) << *source;
    // The same launch: only the order of the work changes.
    auto before = backend->Launch(cases[i].kernel);
    c.kernel.reversed = false;
    auto after = backend->Launch(c.kernel);
    ASSERT_TRUE(before.ok() && after.ok());
    EXPECT_EQ(before->grid, after->grid);
    EXPECT_EQ(before->block, after->block);
    c.kernel.reversed = true;
    c.kernel.name = absl::StrCat("k", i);
    kernels.push_back(c.kernel);
  }
  auto source = backend->Generate(kernels, {"s0"});
  ASSERT_TRUE(source.ok()) << source.status();
  auto module = backend->Compile(*source);
  ASSERT_TRUE(module.ok()) << module.status();
}

// The autotuner's candidates: each block size is taken where the layout
// allows it, sizes the launch, and compiles; the column layout has none.
TEST(CudaCodegen, TunedBlockSizesAreTakenAndCompile) {
  auto backend = Backend();
  std::vector<Kernel> variants;
  for (const Kernel& k : {Pointwise(C(64), 4096), Softmax(512, 4096, C(4096), C(1), "rows"),
                          Softmax(8, 100000, C(100000), C(1), "long_rows")}) {
    const std::vector<int> candidates = BlockCandidates(k);
    ASSERT_GE(candidates.size(), 4u) << k.name;
    auto heuristic = backend->Launch(k);
    ASSERT_TRUE(heuristic.ok());
    EXPECT_NE(std::find(candidates.begin(), candidates.end(), heuristic->block), candidates.end())
        << k.name << " lacks the heuristic's block " << heuristic->block;
    for (int block : candidates) {
      Kernel v = k;
      v.name = k.name + "_b" + std::to_string(block);
      v.block = block;
      auto launch = backend->Launch(v);
      ASSERT_TRUE(launch.ok()) << launch.status();
      EXPECT_EQ(launch->block, block) << v.name;
      variants.push_back(std::move(v));
    }
  }
  // 4096 elements at 4, 8 and 16 per thread: 1024, 512 and 256 threads.
  const std::vector<int> rows = BlockCandidates(Softmax(512, 4096, C(4096), C(1)));
  for (int block : {256, 512, 1024}) {
    EXPECT_NE(std::find(rows.begin(), rows.end(), block), rows.end()) << block;
  }
  EXPECT_TRUE(BlockCandidates(Softmax(300, 1000, C(1), C(300))).empty());
  // A block that is not whole warps is not taken: the heuristic's is.
  Kernel odd = Softmax(512, 4096, C(4096), C(1));
  odd.block = 100;
  EXPECT_EQ(backend->Launch(odd)->block, 512);

  auto source = backend->Generate(variants, {});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE(absl::StrContains(*source, "__launch_bounds__(1024)")) << *source;
  auto module = backend->Compile(*source);
  ASSERT_TRUE(module.ok()) << module.status();
}

// Without a GPU there is nothing to time: the tuner says so. With one (on
// the GPU machine), a softmax is timed at every candidate and the choice is
// one of them, kept for the next compile of the same kernel.
TEST(CudaTuner, TimesCandidatesOnAGpuOrSaysWhyNot) {
  auto tuner = CudaTuner::Open(0);
  if (!tuner.ok()) {
    EXPECT_EQ(tuner.status().code(), absl::StatusCode::kUnavailable) << tuner.status();
    return;
  }
  auto backend = Backend();
  // 64 MiB of traffic: worth tuning; a small one is not.
  std::vector<Kernel> kernels = {Softmax(2048, 4096, C(4096), C(1)),
                                 Softmax(64, 4096, C(4096), C(1), "small")};
  std::vector<std::string> decisions;
  // The candidates compiled as three modules at once.
  ASSERT_TRUE((*tuner)->Tune(*backend, "sm_90", {}, &kernels, &decisions, 3).ok());
  ASSERT_EQ(decisions.size(), 2u);
  EXPECT_TRUE(absl::StrContains(decisions[0], "small keeps the heuristic: it moves under 32 MiB"))
      << decisions[0];
  EXPECT_TRUE(absl::StrContains(decisions[1], "1024: ")) << decisions[1];
  EXPECT_EQ(kernels[1].block, 0);
  const std::vector<int> candidates = BlockCandidates(kernels[0]);
  EXPECT_TRUE(kernels[0].block == 0 || std::find(candidates.begin(), candidates.end(),
                                                 kernels[0].block) != candidates.end());
  std::vector<Kernel> again = {Softmax(2048, 4096, C(4096), C(1), "other_name")};
  decisions.clear();
  ASSERT_TRUE((*tuner)->Tune(*backend, "sm_90", {}, &again, &decisions).ok());
  EXPECT_EQ(again[0].block, kernels[0].block);
  EXPECT_TRUE(absl::StrContains(decisions[0], "(tuned before)")) << decisions[0];
}

// NVRTC runs in a helper that stays: one compile after another starts no
// new one, and a compile error leaves it serving.
TEST(CudaCodegen, OneServingHelperCompilesModuleAfterModule) {
  CudaOptions options;
  options.helper = NvrtcHelper("");
  auto backend = MakeCudaBackend(options);
  auto source = backend->Generate({Pointwise(C(64), 1024)}, {});
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_TRUE(backend->Compile(*source).ok());
  const int64_t started = NvrtcWorkers(options.helper).started();
  ASSERT_GE(started, 1);
  EXPECT_FALSE(backend->Compile("extern \"C\" __global__ void k() { nope(); }\n").ok());
  for (int i = 0; i < 3; ++i) {
    auto module = backend->Compile(*source);
    ASSERT_TRUE(module.ok()) << module.status();
    EXPECT_FALSE(module->binary().empty());
  }
  EXPECT_EQ(NvrtcWorkers(options.helper).started(), started);
}

// A level of NVRTC's --Ofast-compile reaches its own serving helpers.
TEST(CudaCodegen, FastCompileLevelsHaveHelpersOfTheirOwn) {
  CudaOptions options;
  options.helper = NvrtcHelper("");
  options.fast_compile = "min";
  auto backend = MakeCudaBackend(options);
  auto source = backend->Generate({Softmax(512, 4096, C(4096), C(1))}, {});
  ASSERT_TRUE(source.ok()) << source.status();
  auto module = backend->Compile(*source);
  ASSERT_TRUE(module.ok()) << module.status();
  EXPECT_EQ(module->binary().substr(0, 4),
            "\x7f"
            "ELF");
  EXPECT_TRUE(absl::StrContains(module->compile_command(), "--fast-compile=min"))
      << module->compile_command();
  EXPECT_GE(NvrtcWorkers(options.helper, "min").started(), 1);
}

TEST(CudaCodegen, CompileErrorIsInternalWithNvrtcsLog) {
  auto backend = Backend();
  auto module = backend->Compile("extern \"C\" __global__ void k() { undefined_thing(); }\n");
  ASSERT_FALSE(module.ok());
  EXPECT_EQ(module.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(module.status().message(), "undefined_thing")) << module.status();
  EXPECT_TRUE(module.status().GetPayload(kCompilerLogPayload).has_value());
}

TEST(CudaCodegen, UnknownArchIsRefusedByTheHelper) {
  CudaOptions options;
  options.sm_arch = "sm_x";
  auto module = MakeCudaBackend(options)->Compile("__global__ void k() {}\n");
  ASSERT_FALSE(module.ok());
  EXPECT_TRUE(absl::StrContains(module.status().message(), "sm_x")) << module.status();
}

TEST(CudaCodegen, AnotherCudaVersionIsRefusedNamingBoth) {
  CudaOptions options;
  options.cuda_version = "9.1";
  auto module = MakeCudaBackend(options)->Compile("__global__ void k() {}\n");
  ASSERT_FALSE(module.ok());
  EXPECT_EQ(module.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(module.status().message(),
                                "cuda_version is 9.1, but this server's NVRTC is 13."))
      << module.status();
  options.cuda_version = "13.0";
  EXPECT_TRUE(MakeCudaBackend(options)->Compile("__global__ void k() {}\n").ok());
}

TEST(CudaCodegen, GenerateIsDeterministic) {
  auto backend = Backend();
  const std::vector<Kernel> kernels = {Pointwise(C(64), 1024), Softmax(512, 4096, C(4096), C(1))};
  auto a = backend->Generate(kernels, {});
  auto b = backend->Generate(kernels, {});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

}  // namespace
}  // namespace kiln::codegen
