// The CUDA backend's gathers and index values (loop::StmtKind::kGather,
// kIndex) without a GPU: what it generates, and that NVRTC compiles it for
// sm_90. A gather is read one element a lane; an index value in a
// vectorized kernel is each lane's own. tests/gpu runs them.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compiler/codegen/codegen.h"
#include "compiler/codegen/cuda_schedule.h"
#include "compiler/loop/kernel_parser.h"

namespace kiln::codegen {
namespace {

std::unique_ptr<CodegenBackend> Backend() {
  CudaOptions options;
  options.sm_arch = "sm_90";
  return MakeCudaBackend(options);
}

loop::Kernel Parse(const std::string& text) {
  absl::StatusOr<loop::Kernel> k = loop::ParseKernel(text);
  EXPECT_TRUE(k.ok()) << k.status();
  return k.ok() ? *std::move(k) : loop::Kernel{};
}

TEST(CudaGather, EmbeddingRowsOneElementALaneWithTheirIndicesChecked) {
  // out[t, d] = weight[ids[t], d] * 2: a bfloat16 row of 1024 would move
  // in chunks of 8; gathered, it moves an element a lane.
  const loop::Kernel k = Parse(R"(kernel embed: outer [64] inner [1024] passes 1
  buffers:
    buf0 = weight : bf16
    buf1 = ids : i64
    buf2 = out : bf16 (written)
  %0 = load buf1[o0*1 + 0] : i64 [pass 0, inner]
  %1 = gather buf0[i0*1 + 0] by %0 in 50000 step 1024 : bf16 [pass 0, inner]
  %2 = constant 2 : f32 [pass 0, inner]
  %3 = cast %1 : f32 [pass 0, inner]
  %4 = mul %3, %2 : f32 [pass 0, inner]
  store buf2[o0*1024 + i0*1 + 0] = %4 [pass 0, inner]
)");
  EXPECT_EQ(ScheduleOf(k).vector, 1);
  auto backend = Backend();
  auto source = backend->Generate({k}, {});
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE(absl::StrContains(
      *source, "kiln_gather_index(static_cast<int64_t>(t0), 50000, false, \"embed\") * 1024"))
      << *source;
  const std::string body = source->substr(source->find("embed("));
  EXPECT_FALSE(absl::StrContains(body, "kiln_vload<")) << body;
  auto module = backend->Compile(*source);
  EXPECT_TRUE(module.ok()) << module.status();
}

TEST(CudaGather, IndexValuesAreEachLanesOwnInVectorizedKernels) {
  // A causal mask from two index values over a softmax's rows (bfloat16,
  // chunks of 8): the column index of lane v is v past its chunk's first.
  const loop::Kernel k = Parse(R"(kernel causal: outer [8, 256] inner [256] passes 3
  buffers:
    buf0 = x : bf16
    buf1 = out : bf16 (written)
  %0 = load buf0[o0*65536 + o1*256 + i0*1 + 0] : bf16 [pass 0, inner]
  %1 = cast %0 : f32 [pass 0, inner]
  %2 = index [o1*1 + 0] : i64 [pass 0, inner]
  %3 = index [i0*1 + 0] : i64 [pass 0, inner]
  %4 = gt %3, %2 : b8 [pass 0, inner]
  %5 = constant -inf : f32 [pass 0, inner]
  %6 = where %4, %5, %1 : f32 [pass 0, inner]
  %7 = reduce max %6 : f32 [pass 0, inner]
  %8 = load buf0[o0*65536 + o1*256 + i0*1 + 0] : bf16 [pass 1, inner]
  %9 = cast %8 : f32 [pass 1, inner]
  %10 = index [o1*1 + 0] : i64 [pass 1, inner]
  %11 = index [i0*1 + 0] : i64 [pass 1, inner]
  %12 = gt %11, %10 : b8 [pass 1, inner]
  %13 = constant -inf : f32 [pass 1, inner]
  %14 = where %12, %13, %9 : f32 [pass 1, inner]
  %15 = sub %14, %7 : f32 [pass 1, inner]
  %16 = exp %15 : f32 [pass 1, inner]
  %17 = reduce sum %16 : f32 [pass 1, inner]
  %18 = load buf0[o0*65536 + o1*256 + i0*1 + 0] : bf16 [pass 2, inner]
  %19 = cast %18 : f32 [pass 2, inner]
  %20 = index [o1*1 + 0] : i64 [pass 2, inner]
  %21 = index [i0*1 + 0] : i64 [pass 2, inner]
  %22 = gt %21, %20 : b8 [pass 2, inner]
  %23 = constant -inf : f32 [pass 2, inner]
  %24 = where %22, %23, %19 : f32 [pass 2, inner]
  %25 = sub %24, %7 : f32 [pass 2, inner]
  %26 = exp %25 : f32 [pass 2, inner]
  %27 = div %26, %17 : f32 [pass 2, inner]
  store buf1[o0*65536 + o1*256 + i0*1 + 0] = %27 [pass 2, inner]
)");
  EXPECT_EQ(ScheduleOf(k).vector, 8);
  auto backend = Backend();
  auto source = backend->Generate({k}, {});
  ASSERT_TRUE(source.ok()) << source.status();
  // The column index moves with the lane; the row index does not.
  EXPECT_TRUE(absl::StrContains(*source, "static_cast<int64_t>((i0) + v * 1)")) << *source;
  EXPECT_TRUE(absl::StrContains(*source, "static_cast<int64_t>(o1)")) << *source;
  auto module = backend->Compile(*source);
  EXPECT_TRUE(module.ok()) << module.status();
}

TEST(CudaGather, ScatterAddsAreAtomicInEveryDtype) {
  // An embedding's gradient: rows of grad added into the table's rows the
  // ids name, atomically (ids repeat).
  for (const char* dtype : {"f32", "bf16", "f16", "f64", "i64"}) {
    SCOPED_TRACE(dtype);
    const loop::Kernel k = Parse(absl::StrCat(R"(kernel scatter: outer [64] inner [256] passes 1
  buffers:
    buf0 = grad : )",
                                              dtype, R"(
    buf1 = ids : i64
    buf2 = table : )",
                                              dtype, R"( (written)
  %0 = load buf0[o0*256 + i0*1 + 0] : )",
                                              dtype, R"( [pass 0, inner]
  %1 = load buf1[o0*1 + 0] : i64 [pass 0, inner]
  scatter_add buf2[i0*1 + 0] by %1 in 1000 step 256 += %0 : )",
                                              dtype, R"( [pass 0, inner]
)"));
    EXPECT_EQ(ScheduleOf(k).vector, 1);
    auto backend = Backend();
    auto source = backend->Generate({k}, {});
    ASSERT_TRUE(source.ok()) << source.status();
    const std::string body = source->substr(source->find("scatter("));
    EXPECT_TRUE(absl::StrContains(body, "atomicAdd(") ||
                absl::StrContains(body, "kiln_atomic_add_"))
        << body;
    EXPECT_TRUE(absl::StrContains(body, "kiln_gather_index(")) << body;
    auto module = backend->Compile(*source);
    EXPECT_TRUE(module.ok()) << module.status();
  }
}

}  // namespace
}  // namespace kiln::codegen
