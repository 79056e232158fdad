// The C++ backend end to end: kernels built by hand, generated, compiled with
// g++, loaded with dlopen and run on random data against reference loops.
#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/types/optional.h"
#include "compiler/codegen/codegen.h"
#include "compiler/loop/kernel.h"
#include "compiler/loop/kernel_builder.h"
#include "gtest/gtest.h"

namespace kiln::codegen {
namespace {

using loop::Index;
using loop::Kernel;
using loop::ReduceOp;
using loop::Stmt;
using loop::StmtKind;

using loop::testing::C;
using loop::testing::E;
using loop::testing::Idx;
using loop::testing::KernelBuilder;

using KernelFn = void (*)(void* const*, const int64_t*);

// A compiled module opened with dlopen from a temporary file.
//
// libgomp is pinned first (RTLD_NODELETE): closing the last module that
// uses it would otherwise unload it under its idle pool threads.
class LoadedModule {
 public:
  static std::unique_ptr<LoadedModule> Open(const v1::CompiledModule& module) {
    static void* const gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NODELETE);
    (void)gomp;
    char path[] = "/tmp/kiln_codegen_test_XXXXXX.so";
    const int fd = mkstemps(path, 3);
    if (fd < 0) return nullptr;
    const std::string& bin = module.binary();
    size_t done = 0;
    while (done < bin.size()) {
      const ssize_t n = write(fd, bin.data() + done, bin.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    close(fd);
    void* handle = done == bin.size() ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
    unlink(path);
    if (handle == nullptr) {
      ADD_FAILURE() << "dlopen: " << dlerror();
      return nullptr;
    }
    return std::unique_ptr<LoadedModule>(new LoadedModule(handle));
  }
  ~LoadedModule() { dlclose(handle_); }
  KernelFn Fn(const std::string& name) const {
    return reinterpret_cast<KernelFn>(dlsym(handle_, name.c_str()));
  }

 private:
  explicit LoadedModule(void* handle) : handle_(handle) {}
  void* handle_;
};

double Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// Generates and compiles `kernels`, printing the compile time; on failure a
// test failure and nullptr.
std::unique_ptr<LoadedModule> Build(const std::vector<Kernel>& kernels,
                                    const std::vector<std::string>& symbols = {},
                                    std::string* source = nullptr,
                                    CppOptions options = CppOptions()) {
  std::unique_ptr<CodegenBackend> backend = MakeCppBackend(options);
  absl::StatusOr<std::string> code = backend->Generate(kernels, symbols);
  if (!code.ok()) {
    ADD_FAILURE() << code.status();
    return nullptr;
  }
  if (source != nullptr) *source = *code;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<v1::CompiledModule> module = backend->Compile(*code);
  const double ms = Ms(std::chrono::steady_clock::now() - start);
  if (!module.ok()) {
    ADD_FAILURE() << module.status() << "\n" << *code;
    return nullptr;
  }
  std::printf("[ compile  ] %s (%zu kernels): %.0f ms, %zu bytes of .so\n", kernels[0].name.c_str(),
              kernels.size(), ms, module->binary().size());
  EXPECT_EQ(module->language(), "c++");
  EXPECT_EQ(module->source(), *code);
  EXPECT_TRUE(absl::StrContains(module->compile_command(), "-O3"));
  return LoadedModule::Open(*module);
}

std::vector<float> Random(size_t n, uint32_t seed, float lo = -2, float hi = 2) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

int CountOf(absl::string_view text, absl::string_view what) {
  int n = 0;
  for (size_t at = text.find(what); at != absl::string_view::npos; at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

// |got - want| <= atol + rtol * |want|, element by element.
template <typename G, typename W>
void ExpectClose(const std::vector<G>& got, const std::vector<W>& want, double rtol = 1e-5,
                 double atol = 1e-5) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t k = 0; k < got.size(); ++k) {
    const double g = got[k], w = want[k];
    if (std::isnan(w) && std::isnan(g)) continue;
    if (!(std::abs(g - w) <= atol + rtol * std::abs(w))) {
      if (++bad <= 5) ADD_FAILURE() << "element " << k << ": got " << g << ", want " << w;
    }
  }
  EXPECT_EQ(bad, 0);
}

void Call(KernelFn fn, std::vector<void*> buffers, std::vector<int64_t> symbols = {}) {
  ASSERT_NE(fn, nullptr);
  fn(buffers.data(), symbols.data());
}

// ---------------------------------------------------------------------------

// out[a, b, c] = x[a, b, c] + y[b, c]: y broadcast over a (a zero stride).
Kernel BroadcastAdd(const std::string& name, int64_t A, int64_t B, int64_t Cn) {
  KernelBuilder kb(name, {C(A), C(B)}, {C(Cn)});
  const int x = kb.Buffer("x", v1::FLOAT32);
  const int y = kb.Buffer("y", v1::FLOAT32);
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  const int lx = kb.Load(x, Idx({C(B * Cn), C(Cn)}, {C(1)}));
  const int ly = kb.Load(y, Idx({C(0), C(Cn)}, {C(1)}));
  const int sum = kb.Op("add", {lx, ly});
  kb.Store(out, Idx({C(B * Cn), C(Cn)}, {C(1)}), sum);
  return kb.kernel();
}

TEST(CppCodegen, PointwiseAddWithBroadcast) {
  const int64_t A = 4, B = 50, Cn = 300;
  std::string source;
  auto module = Build({BroadcastAdd("add_bcast", A, B, Cn)}, {}, &source);
  ASSERT_NE(module, nullptr);
  EXPECT_TRUE(absl::StrContains(source, "#pragma omp simd")) << source;
  EXPECT_TRUE(absl::StrContains(source, "#pragma omp parallel for schedule(static)")) << source;
  std::vector<float> x = Random(A * B * Cn, 1), y = Random(B * Cn, 2), out(A * B * Cn);
  Call(module->Fn("add_bcast"), {x.data(), y.data(), out.data()});
  std::vector<double> want(out.size());
  for (int64_t a = 0; a < A; ++a) {
    for (int64_t k = 0; k < B * Cn; ++k) want[a * B * Cn + k] = double(x[a * B * Cn + k]) + y[k];
  }
  ExpectClose(out, want);
}

TEST(CppCodegen, WithoutOpenMp) {
  CppOptions options;
  options.openmp = false;
  std::string source;
  auto module = Build({BroadcastAdd("add_serial", 2, 3, 17)}, {}, &source, options);
  ASSERT_NE(module, nullptr);
  EXPECT_FALSE(absl::StrContains(source, "omp parallel"));
  EXPECT_TRUE(absl::StrContains(source, "#pragma omp simd"));
  std::vector<float> x = Random(2 * 3 * 17, 3), y = Random(3 * 17, 4), out(x.size());
  Call(module->Fn("add_serial"), {x.data(), y.data(), out.data()});
  std::vector<double> want(out.size());
  for (size_t k = 0; k < out.size(); ++k) want[k] = double(x[k]) + y[k % (3 * 17)];
  ExpectClose(out, want);
}

// out (f32) = float(double(exp(x)) * y + 1), y float64.
TEST(CppCodegen, ChainWithCast) {
  const int64_t R = 33, N = 129;
  KernelBuilder kb("chain", {C(R)}, {C(N)});
  const int x = kb.Buffer("x", v1::FLOAT32);
  const int y = kb.Buffer("y", v1::FLOAT64);
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  const int lx = kb.Load(x, Idx({C(N)}, {C(1)}));
  const int e = kb.Op("exp", {lx});
  const int c = kb.Op("cast", {e}, v1::FLOAT64);
  const int ly = kb.Load(y, Idx({C(N)}, {C(1)}));
  const int m = kb.Op("mul", {c, ly}, v1::FLOAT64);
  const int one = kb.Const(1, v1::FLOAT64);
  const int a = kb.Op("add", {m, one}, v1::FLOAT64);
  kb.Store(out, Idx({C(N)}, {C(1)}), a);
  auto module = Build({kb.kernel()});
  ASSERT_NE(module, nullptr);
  std::vector<float> xs = Random(R * N, 5), res(R * N);
  std::vector<float> yf = Random(R * N, 6);
  std::vector<double> ys(yf.begin(), yf.end());
  Call(module->Fn("chain"), {xs.data(), ys.data(), res.data()});
  std::vector<double> want(res.size());
  for (size_t k = 0; k < res.size(); ++k) want[k] = double(std::exp(xs[k])) * ys[k] + 1.0;
  ExpectClose(res, want);
}

// out[n, m] = 2 * x[m, n]: the load walks x with stride N (no fast path).
TEST(CppCodegen, TransposedLoad) {
  const int64_t M = 67, N = 45;
  KernelBuilder kb("transpose", {C(N)}, {C(M)});
  const int x = kb.Buffer("x", v1::FLOAT32);
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  const int lx = kb.Load(x, Idx({C(1)}, {C(N)}));
  const int two = kb.Const(2);
  const int m = kb.Op("mul", {lx, two});
  kb.Store(out, Idx({C(M)}, {C(1)}), m);
  std::string source;
  auto module = Build({kb.kernel()}, {}, &source);
  ASSERT_NE(module, nullptr);
  EXPECT_FALSE(absl::StrContains(source, "omp simd")) << source;
  EXPECT_TRUE(absl::StrContains(source, "buf0[o0 + i * 45]")) << source;
  std::vector<float> xs = Random(M * N, 7), res(M * N);
  Call(module->Fn("transpose"), {xs.data(), res.data()});
  std::vector<double> want(res.size());
  for (int64_t mm = 0; mm < M; ++mm) {
    for (int64_t n = 0; n < N; ++n) want[n * M + mm] = 2.0 * xs[mm * N + n];
  }
  ExpectClose(res, want);
}

// Row sums with a keepdim-style store, over one inner dim (fast path) and
// over two (nested loops, two outer dims).
TEST(CppCodegen, SumOverInnerDims) {
  const int64_t R = 77, N = 1000;
  KernelBuilder k1("row_sum", {C(R)}, {C(N)});
  {
    const int x = k1.Buffer("x", v1::FLOAT32);
    const int out = k1.Buffer("out", v1::FLOAT32, true);
    const int lx = k1.Load(x, Idx({C(N)}, {C(1)}));
    const int s = k1.Reduce(ReduceOp::kSum, lx);
    k1.At(0, false).Store(out, Idx({C(1)}, {}), s);
  }
  // x[3, 5, 4, 25] summed over the last two dims into out[3, 5, 1, 1].
  KernelBuilder k2("sum_2d", {C(3), C(5)}, {C(4), C(25)});
  {
    const int x = k2.Buffer("x", v1::FLOAT32);
    const int out = k2.Buffer("out", v1::FLOAT32, true);
    const int lx = k2.Load(x, Idx({C(500), C(100)}, {C(25), C(1)}));
    const int sq = k2.Op("mul", {lx, lx});
    const int s = k2.Reduce(ReduceOp::kSum, sq);
    k2.At(0, false).Store(out, Idx({C(5), C(1)}, {}), s);
  }
  std::string source;
  auto module = Build({k1.kernel(), k2.kernel()}, {}, &source);
  ASSERT_NE(module, nullptr);
  EXPECT_TRUE(absl::StrContains(source, "accl1[l] += ")) << source;  // one sum per lane
  // Two inner dims: nested loops, the innermost one simd.
  EXPECT_TRUE(absl::StrContains(source,
                                "#pragma omp simd reduction(+:acc2)\n"
                                "      for (int64_t i1 = 0; i1 < 25; ++i1)"))
      << source;

  std::vector<float> x1 = Random(R * N, 8), out1(R);
  Call(module->Fn("row_sum"), {x1.data(), out1.data()});
  std::vector<double> want1(R);
  double abs_total = 0;
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t n = 0; n < N; ++n) {
      want1[r] += x1[r * N + n];
      abs_total += std::abs(x1[r * N + n]);
    }
  }
  ExpectClose(out1, want1, 1e-5, 1e-6 * abs_total / R);

  std::vector<float> x2 = Random(3 * 5 * 100, 9), out2(15);
  Call(module->Fn("sum_2d"), {x2.data(), out2.data()});
  std::vector<double> want2(15);
  for (int64_t r = 0; r < 15; ++r) {
    for (int64_t k = 0; k < 100; ++k) want2[r] += double(x2[r * 100 + k]) * x2[r * 100 + k];
  }
  ExpectClose(out2, want2);
}

// A column sum (stride 2 along the reduced dim, so a plain loop) of 100,000
// copies of 0.1f: added one by one in float32 it drifts by about 1e-1; the
// double accumulator lands on the exact sum.
TEST(CppCodegen, StridedFloatSumAccumulatesInDouble) {
  const int64_t R = 100000;
  KernelBuilder kb("column_sum", {C(2)}, {C(R)});
  const int x = kb.Buffer("x", v1::FLOAT32);
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  const int s = kb.Reduce(ReduceOp::kSum, kb.Load(x, Idx({C(1)}, {C(2)})));
  kb.At(0, false).Store(out, Idx({C(1)}, {}), s);
  std::string source;
  auto module = Build({kb.kernel()}, {}, &source);
  ASSERT_NE(module, nullptr);
  EXPECT_TRUE(absl::StrContains(source, "double acc")) << source;
  std::vector<float> xs(2 * R, 0.1f), got(2);
  Call(module->Fn("column_sum"), {xs.data(), got.data()});
  const double exact = static_cast<double>(0.1f) * R;
  EXPECT_NEAR(got[0], exact, 1e-3);
  EXPECT_NEAR(got[1], exact, 1e-3);
}

// A row sum (contiguous: 32 float lanes) of 1,000,000 copies of 0.1f. With
// each lane adding every 32nd term in float it came out 22 too large
// (2.2e-4); folded into double lanes every 64 chunks it is off by 0.056
// (5.6e-7). ATen's cascade sum is off by 0.0063.
TEST(CppCodegen, ContiguousFloatSumOfALongRow) {
  const int64_t N = 1000000;
  KernelBuilder kb("row_sum", {C(1)}, {C(N)});
  const int x = kb.Buffer("x", v1::FLOAT32);
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  const int s = kb.Reduce(ReduceOp::kSum, kb.Load(x, Idx({C(N)}, {C(1)})));
  kb.At(0, false).Store(out, Idx({C(1)}, {}), s);
  std::string source;
  auto module = Build({kb.kernel()}, {}, &source);
  ASSERT_NE(module, nullptr);
  std::vector<float> xs(N, 0.1f), got(1);
  Call(module->Fn("row_sum"), {xs.data(), got.data()});
  EXPECT_TRUE(absl::StrContains(source, "accd1[l] += accl1[l]")) << source;
  const double exact = static_cast<double>(0.1f) * N;
  EXPECT_NEAR(got[0], exact, 1e-6 * exact);
}

// Welford mean and M2 of N values 1e4 + 0.5 (-1)^k + (k % 3) / 8 (all exact
// in float), along a strided dim (a plain loop) and along a contiguous row
// (32 float lanes).
TEST(CppCodegen, WelfordOverManyTermsKeepsItsStateInDouble) {
  const int64_t N = 1000000;
  std::vector<float> xs(2 * N);
  double mean = 0;
  for (int64_t k = 0; k < N; ++k) {
    xs[k] = 1e4f + (k % 2 ? 0.5f : -0.5f) + static_cast<float>(k % 3) / 8;
    mean += xs[k];
  }
  mean /= N;
  double m2 = 0;
  for (int64_t k = 0; k < N; ++k) m2 += (xs[k] - mean) * (xs[k] - mean);
  for (const bool strided : {true, false}) {
    SCOPED_TRACE(strided ? "strided" : "contiguous");
    std::vector<float> x(xs.begin(), xs.begin() + N);
    if (strided) {  // x[2k] = xs[k]
      x.assign(2 * N, 0.0f);
      for (int64_t k = 0; k < N; ++k) x[2 * k] = xs[k];
    }
    KernelBuilder kb("welford", {C(1)}, {C(N)});
    const int in = kb.Buffer("x", v1::FLOAT32);
    const int out = kb.Buffer("out", v1::FLOAT32, true);
    const int l = kb.Load(in, Idx({C(0)}, {C(strided ? 2 : 1)}));
    const int m = kb.Reduce(ReduceOp::kWelfordMean, l);
    const int q = kb.Reduce(ReduceOp::kWelfordM2, l);
    kb.At(0, false);
    kb.Store(out, Idx({C(0)}, {}), m);
    kb.Store(out, Idx({C(0)}, {}, C(1)), q);
    std::string source;
    auto module = Build({kb.kernel()}, {}, &source);
    ASSERT_NE(module, nullptr);
    EXPECT_TRUE(absl::StrContains(source, "double wm1 = 0, wq1 = 0;")) << source;
    std::vector<float> got(2);
    Call(module->Fn("welford"), {x.data(), got.data()});
    EXPECT_NEAR(got[0], mean, 1e-7 * mean);
    EXPECT_NEAR(got[1], m2, 1e-6 * m2);
  }
}

// out = x * y - c with c the rounded product x * y: every op rounds, so out
// is exactly 0; a fused multiply-add would leave the product's rounding
// error (nonzero for most of these inputs).
TEST(CppCodegen, ProductsAreRoundedBeforeTheyAreSubtracted) {
  const int64_t N = 1000;
  KernelBuilder kb("residual", {}, {C(N)});
  const int x = kb.Buffer("x", v1::FLOAT32);
  const int y = kb.Buffer("y", v1::FLOAT32);
  const int c = kb.Buffer("c", v1::FLOAT32);
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  const int p = kb.Op("mul", {kb.Load(x, Idx({}, {C(1)})), kb.Load(y, Idx({}, {C(1)}))});
  kb.Store(out, Idx({}, {C(1)}), kb.Op("sub", {p, kb.Load(c, Idx({}, {C(1)}))}));
  std::string source;
  auto module = Build({kb.kernel()}, {}, &source);
  ASSERT_NE(module, nullptr);
  std::vector<float> xs = Random(N, 21), ys = Random(N, 22), cs(N), got(N, 1.0f);
  for (int64_t k = 0; k < N; ++k) {
    volatile float product = xs[k] * ys[k];  // rounded to float here
    cs[k] = product;
  }
  Call(module->Fn("residual"), {xs.data(), ys.data(), cs.data(), got.data()});
  for (int64_t k = 0; k < N; ++k) ASSERT_EQ(got[k], 0.0f) << k;
}

// The inline float exp against exp in double, vectorized, over a dense
// sweep of [-90, 90] and the special values: within 1.35 ulp down to
// results of 2^-125.5, 0 below, inf above 88.72, NaN for NaN.
TEST(CppCodegen, FloatExpIsWithinOneAndAThirdUlp) {
  const int64_t N = 180001;
  KernelBuilder kb("exp_sweep", {}, {C(N + 6)});
  const int x = kb.Buffer("x", v1::FLOAT32);
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  kb.Store(out, Idx({}, {C(1)}), kb.Op("exp", {kb.Load(x, Idx({}, {C(1)}))}));
  std::string source;
  auto module = Build({kb.kernel()}, {}, &source);
  ASSERT_NE(module, nullptr);
  std::vector<float> xs(N + 6), got(N + 6);
  for (int64_t k = 0; k < N; ++k) xs[k] = -90.0f + 0.001f * static_cast<float>(k);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {
      std::numeric_limits<float>::quiet_NaN(), inf, -inf, 0.0f, -0.0f, 88.72f};
  std::copy(std::begin(specials), std::end(specials), xs.begin() + N);
  Call(module->Fn("exp_sweep"), {xs.data(), got.data()});
  double worst = 0;
  for (int64_t k = 0; k < N + 6; ++k) {
    const double want = std::exp(static_cast<double>(xs[k]));
    if (std::isnan(xs[k])) {
      EXPECT_TRUE(std::isnan(got[k]));
    } else if (want > std::numeric_limits<float>::max()) {
      EXPECT_EQ(got[k], inf) << "x = " << xs[k];
    } else if (want < 0x1.6a09e6p-126 && got[k] == 0.0f) {
      // Under 2^-125.5 (x < -86.99) the result may be 0: no subnormals.
      EXPECT_LT(xs[k], -86.98);
    } else {
      const float w = static_cast<float>(want);
      const double ulp = std::nextafter(w, inf) - w;
      worst = std::max(worst, std::abs(got[k] - want) / ulp);
      if (std::abs(got[k] - want) > 1.35 * ulp) {
        ADD_FAILURE() << "exp(" << xs[k] << ") = " << got[k] << ", want " << want;
        break;
      }
    }
  }
  std::printf("[ exp      ] largest error %.2f ulp\n", worst);
}

// Softmax over the last dim in three passes: max, sum(exp(x - max)), store.
Kernel Softmax(const std::string& name, ir::SymInt rows, ir::SymInt cols, ir::SymInt row_stride) {
  KernelBuilder kb(name, {rows}, {cols}, 3);
  const int x = kb.Buffer("x", v1::FLOAT32);
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  kb.At(0, true);
  const int l0 = kb.Load(x, Idx({row_stride}, {C(1)}));
  const int mx = kb.Reduce(ReduceOp::kMax, l0);
  kb.At(1, true);
  const int l1 = kb.Load(x, Idx({row_stride}, {C(1)}));
  const int d1 = kb.Op("sub", {l1, mx});
  const int e1 = kb.Op("exp", {d1});
  const int sum = kb.Reduce(ReduceOp::kSum, e1);
  kb.At(2, false);
  const int inv = kb.Op("reciprocal", {sum});
  kb.At(2, true);
  const int l2 = kb.Load(x, Idx({row_stride}, {C(1)}));
  const int d2 = kb.Op("sub", {l2, mx});
  const int e2 = kb.Op("exp", {d2});
  const int p = kb.Op("mul", {e2, inv});
  kb.Store(out, Idx({row_stride}, {C(1)}), p);
  return kb.kernel();
}

TEST(CppCodegen, SoftmaxInThreePasses) {
  const int64_t R = 64, N = 1000;
  std::string source;
  auto module = Build({Softmax("softmax", C(R), C(N), C(N))}, {}, &source);
  ASSERT_NE(module, nullptr);
  EXPECT_TRUE(absl::StrContains(source, "accl1[l] = t0 > accl1[l]")) << source;  // a max per lane
  // The exp pass fetches the next row for the max pass.
  EXPECT_TRUE(absl::StrContains(source, "const float* pf0 = buf0 + b0 + 1000;")) << source;
  EXPECT_TRUE(absl::StrContains(source, "__builtin_prefetch")) << source;
  std::vector<float> x = Random(R * N, 10, -5, 5), out(R * N);
  x[3] = -std::numeric_limits<float>::infinity();
  Call(module->Fn("softmax"), {x.data(), out.data()});
  std::vector<double> want(out.size());
  for (int64_t r = 0; r < R; ++r) {
    double mx = -INFINITY, sum = 0;
    for (int64_t n = 0; n < N; ++n) mx = std::max(mx, double(x[r * N + n]));
    for (int64_t n = 0; n < N; ++n) sum += std::exp(x[r * N + n] - mx);
    for (int64_t n = 0; n < N; ++n) want[r * N + n] = std::exp(x[r * N + n] - mx) / sum;
  }
  ExpectClose(out, want, 1e-5, 1e-7);
}

// out = x / sum(x over the row) / y: the division by the row's sum (a
// reduction of an earlier pass) is one reciprocal per row; the division by
// y, which changes along the row, stays a division.
TEST(CppCodegen, DivisionByARowValueIsOneReciprocalPerRow) {
  const int64_t R = 16, N = 300;
  KernelBuilder kb("normalize", {C(R)}, {C(N)}, 2);
  const int x = kb.Buffer("x", v1::FLOAT32);
  const int y = kb.Buffer("y", v1::FLOAT32);
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  kb.At(0, true);
  const int sum = kb.Reduce(ReduceOp::kSum, kb.Load(x, Idx({C(N)}, {C(1)})));
  kb.At(1, true);
  const int q = kb.Op("div", {kb.Load(x, Idx({C(N)}, {C(1)})), sum});
  kb.Store(out, Idx({C(N)}, {C(1)}), kb.Op("div", {q, kb.Load(y, Idx({C(N)}, {C(1)}))}));
  std::string source;
  auto module = Build({kb.kernel()}, {}, &source);
  ASSERT_NE(module, nullptr);
  EXPECT_EQ(CountOf(source, "float(1) / "), 1) << source;
  EXPECT_TRUE(absl::StrContains(source, " * rc")) << source;
  EXPECT_TRUE(absl::StrContains(source, " / t")) << source;  // the division by y
  std::vector<float> xs = Random(R * N, 21, 0.5, 2), ys = Random(R * N, 22, 0.5, 2), got(R * N);
  Call(module->Fn("normalize"), {xs.data(), ys.data(), got.data()});
  std::vector<double> want(got.size());
  for (int64_t r = 0; r < R; ++r) {
    double total = 0;
    for (int64_t k = 0; k < N; ++k) total += xs[r * N + k];
    for (int64_t k = 0; k < N; ++k) want[r * N + k] = xs[r * N + k] / total / ys[r * N + k];
  }
  ExpectClose(got, want, 1e-5, 0);
}

TEST(CppCodegen, MaxReductionPropagatesNan) {
  std::string source;
  auto module = Build({Softmax("softmax_nan", C(3), C(40), C(40))}, {}, &source);
  ASSERT_NE(module, nullptr);
  // Rows of 40: 32 lanes and a tail of 8. Row 0 has a NaN in a lane, row 1
  // in the tail, row 2 none.
  std::vector<float> x = Random(120, 11), out(120);
  x[17] = std::numeric_limits<float>::quiet_NaN();
  x[40 + 35] = std::numeric_limits<float>::quiet_NaN();
  Call(module->Fn("softmax_nan"), {x.data(), out.data()});
  for (int n = 0; n < 80; ++n) EXPECT_TRUE(std::isnan(out[n])) << n;
  for (int n = 80; n < 120; ++n) EXPECT_FALSE(std::isnan(out[n])) << n;
}

// Layer norm: its statistics from one Welford sweep (pass 0 a mean and M2
// per row) or, with `two_pass`, as the lowering makes them for short rows
// (pass 0 a sum, pass 1 the squared deviations from its mean); then rstd at
// the outer level (also stored), and a last pass (x - mean) * rstd * w + b.
Kernel LayerNorm(const std::string& name, int64_t N, bool two_pass = false) {
  KernelBuilder kb(name, {E("s0")}, {C(N)}, two_pass ? 3 : 2);
  const int x = kb.Buffer("x", v1::FLOAT32);
  const int w = kb.Buffer("w", v1::FLOAT32);
  const int b = kb.Buffer("b", v1::FLOAT32);
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  const int mean_out = kb.Buffer("mean", v1::FLOAT32, true);
  const int rstd_out = kb.Buffer("rstd", v1::FLOAT32, true);
  kb.At(0, true);
  const int l0 = kb.Load(x, Idx({C(N)}, {C(1)}));
  int mean, m2;
  if (two_pass) {
    const int sum = kb.Reduce(ReduceOp::kSum, l0);
    kb.At(0, false);
    mean = kb.Op("div", {sum, kb.Const(static_cast<double>(N))});
    kb.At(1, true);
    const int d = kb.Op("sub", {kb.Load(x, Idx({C(N)}, {C(1)})), mean});
    m2 = kb.Reduce(ReduceOp::kSum, kb.Op("mul", {d, d}));
    kb.At(1, false);
  } else {
    mean = kb.Reduce(ReduceOp::kWelfordMean, l0);
    m2 = kb.Reduce(ReduceOp::kWelfordM2, l0);
    kb.At(0, false);
  }
  const int n = kb.Const(static_cast<double>(N));
  const int var = kb.Op("div", {m2, n});
  const int eps = kb.Const(1e-5);
  const int ve = kb.Op("add", {var, eps});
  const int rstd = kb.Op("rsqrt", {ve});
  kb.Store(mean_out, Idx({C(1)}, {}), mean);
  kb.Store(rstd_out, Idx({C(1)}, {}), rstd);
  kb.At(two_pass ? 2 : 1, true);
  const int l1 = kb.Load(x, Idx({C(N)}, {C(1)}));
  const int d = kb.Op("sub", {l1, mean});
  const int nrm = kb.Op("mul", {d, rstd});
  const int lw = kb.Load(w, Idx({C(0)}, {C(1)}));
  const int lb = kb.Load(b, Idx({C(0)}, {C(1)}));
  const int y = kb.Op("add", {kb.Op("mul", {nrm, lw}), lb});
  kb.Store(out, Idx({C(N)}, {C(1)}), y);
  return kb.kernel();
}

// Runs layer_norm_<N> of `module` on 50 rows against a double reference.
void ExpectLayerNorm(const LoadedModule& module, int64_t N) {
  const int64_t R = 50;
  // An offset mean makes a naive sum-of-squares variance visibly wrong.
  std::vector<float> x = Random(R * N, 12, 99, 101), w = Random(N, 13), b = Random(N, 14);
  std::vector<float> out(R * N), mean(R), rstd(R);
  Call(module.Fn(absl::StrCat("layer_norm_", N)),
       {x.data(), w.data(), b.data(), out.data(), mean.data(), rstd.data()}, {R});
  std::vector<double> want(out.size()), want_mean(R), want_rstd(R);
  for (int64_t r = 0; r < R; ++r) {
    double m = 0, q = 0;
    for (int64_t k = 0; k < N; ++k) m += x[r * N + k];
    m /= N;
    for (int64_t k = 0; k < N; ++k) q += (x[r * N + k] - m) * (x[r * N + k] - m);
    const double rs = 1 / std::sqrt(q / N + 1e-5);
    want_mean[r] = m;
    want_rstd[r] = rs;
    for (int64_t k = 0; k < N; ++k) want[r * N + k] = (x[r * N + k] - m) * rs * w[k] + b[k];
  }
  ExpectClose(mean, want_mean);
  // rstd of values spread over [99, 101] in float32: the mean's rounding
  // (ulp 7.6e-6 near 100) bounds what any float32 kernel can do.
  ExpectClose(rstd, want_rstd, 1e-4, 0);
  ExpectClose(out, want, 1e-4, 1e-4);
}

TEST(CppCodegen, LayerNormWithWelford) {
  std::string source;
  auto module =
      Build({LayerNorm("layer_norm_1000", 1000), LayerNorm("layer_norm_7", 7)}, {"s0"}, &source);
  ASSERT_NE(module, nullptr);
  EXPECT_TRUE(absl::StrContains(source, "wml")) << source;  // the lane-wise Welford
  // Its only later sweep stores: no prefetch.
  EXPECT_FALSE(absl::StrContains(source, "__builtin_prefetch")) << source;
  for (const int64_t N : {1000, 7}) ExpectLayerNorm(*module, N);
}

TEST(CppCodegen, LayerNormInTwoPassesPrefetchesTheNextRow) {
  std::string source;
  auto module = Build({LayerNorm("layer_norm_1000", 1000, /*two_pass=*/true),
                       LayerNorm("layer_norm_7", 7, /*two_pass=*/true)},
                      {"s0"}, &source);
  ASSERT_NE(module, nullptr);
  EXPECT_FALSE(absl::StrContains(source, "wml")) << source;
  // The squared-deviations sweep (pass 1) stores nothing: it fetches the
  // next row for pass 0, once per kernel; the storing pass 2 does not.
  const std::string first = source.substr(0, source.find("layer_norm_7"));
  const size_t pass1 = first.find("// pass 1"), pass2 = first.find("// pass 2");
  ASSERT_NE(pass2, std::string::npos) << source;
  const size_t prefetch = first.find("__builtin_prefetch");
  EXPECT_TRUE(prefetch > pass1 && prefetch < pass2) << source;
  EXPECT_EQ(first.find("__builtin_prefetch", prefetch + 1), std::string::npos) << source;
  for (const int64_t N : {1000, 7}) ExpectLayerNorm(*module, N);
}

// Symbolic sizes: relu(x) * 2 over [s0, s1] and a strided slice
// x[:, ::2] of size [s0, (s1 - 1)//2 + 1], run at three sizes.
TEST(CppCodegen, SymbolicSizesAtThreeSizes) {
  KernelBuilder k1("relu2", {E("s0")}, {E("s1")});
  {
    const int x = k1.Buffer("x", v1::FLOAT32);
    const int out = k1.Buffer("out", v1::FLOAT32, true);
    const int lx = k1.Load(x, Idx({E("s1")}, {C(1)}));
    const int r = k1.Op("relu", {lx});
    const int y = k1.Op("mul", {r, k1.Const(2)});
    k1.Store(out, Idx({E("s1")}, {C(1)}), y);
  }
  KernelBuilder k2("slice2", {E("s0")}, {E("(s1 - 1)//2 + 1")});
  {
    const int x = k2.Buffer("x", v1::FLOAT32);
    const int out = k2.Buffer("out", v1::FLOAT32, true);
    const int lx = k2.Load(x, Idx({E("s1")}, {C(2)}));
    k2.Store(out, Idx({E("(s1 - 1)//2 + 1")}, {C(1)}), lx);
  }
  // out[k] = 7 for k < Max(s0, 2) + Mod(s0, 3): the translator's functions.
  KernelBuilder k3("fill", {}, {E("Max(s0, 2) + Mod(s0, 3)")});
  {
    const int out = k3.Buffer("out", v1::FLOAT32, true);
    k3.Store(out, Idx({}, {C(1)}), k3.Const(7));
  }
  std::string source;
  auto module = Build({k1.kernel(), k2.kernel(), k3.kernel()}, {"s0", "s1"}, &source);
  ASSERT_NE(module, nullptr);
  EXPECT_TRUE(absl::StrContains(source, "const int64_t s0 = symbols[0];")) << source;
  EXPECT_TRUE(absl::StrContains(source, "kiln_floordiv<int64_t>((s1 - INT64_C(1)), INT64_C(2))"))
      << source;
  EXPECT_TRUE(absl::StrContains(source, "std::max<int64_t>(s0, INT64_C(2))")) << source;

  for (const auto [s0, s1] : {std::pair<int64_t, int64_t>{1, 1}, {37, 64}, {300, 129}}) {
    SCOPED_TRACE(absl::StrCat("s0=", s0, " s1=", s1));
    std::vector<float> x = Random(s0 * s1, 15), out(s0 * s1);
    Call(module->Fn("relu2"), {x.data(), out.data()}, {s0, s1});
    std::vector<double> want(out.size());
    for (size_t k = 0; k < x.size(); ++k) want[k] = x[k] > 0 ? 2.0 * x[k] : 0.0;
    ExpectClose(out, want);

    const int64_t half = (s1 - 1) / 2 + 1;
    std::vector<float> sliced(s0 * half);
    Call(module->Fn("slice2"), {x.data(), sliced.data()}, {s0, s1});
    std::vector<double> want_sliced(sliced.size());
    for (int64_t r = 0; r < s0; ++r) {
      for (int64_t k = 0; k < half; ++k) want_sliced[r * half + k] = x[r * s1 + 2 * k];
    }
    ExpectClose(sliced, want_sliced, 0, 0);

    const int64_t filled = std::max<int64_t>(s0, 2) + s0 % 3;
    std::vector<float> fill(filled + 4, -1);
    Call(module->Fn("fill"), {fill.data()}, {s0, s1});
    for (int64_t k = 0; k < filled + 4; ++k) EXPECT_EQ(fill[k], k < filled ? 7 : -1) << k;
  }
}

int64_t PyFloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) --q;
  return q;
}

// int64 and bool buffers: a comparison stored as bool, where() with a
// Python floor division, and a count of true mask values per row.
TEST(CppCodegen, Int64AndBoolBuffers) {
  const int64_t R = 10, N = 37;
  KernelBuilder kb("ints", {C(R)}, {C(N)});
  const int x = kb.Buffer("x", v1::INT64);
  const int y = kb.Buffer("y", v1::INT64);
  const int mask = kb.Buffer("mask", v1::BOOL);
  const int gt_out = kb.Buffer("gt", v1::BOOL, true);
  const int sel_out = kb.Buffer("sel", v1::INT64, true);
  const int cnt_out = kb.Buffer("cnt", v1::INT64, true);
  const int lx = kb.Load(x, Idx({C(N)}, {C(1)}));
  const int ly = kb.Load(y, Idx({C(N)}, {C(1)}));
  const int lm = kb.Load(mask, Idx({C(N)}, {C(1)}));
  const int gt = kb.Op("gt", {lx, ly}, v1::BOOL);
  const int both = kb.Op("and", {gt, lm}, v1::BOOL);
  kb.Store(gt_out, Idx({C(N)}, {C(1)}), both);
  const int q = kb.Op("div_floor", {lx, kb.Const(-3, v1::INT64)}, v1::INT64);
  const int sel = kb.Op("where", {lm, q, ly}, v1::INT64);
  kb.Store(sel_out, Idx({C(N)}, {C(1)}), sel);
  const int as_int = kb.Op("cast", {lm}, v1::INT64);
  const int count = kb.Reduce(ReduceOp::kSum, as_int, v1::INT64);
  kb.At(0, false).Store(cnt_out, Idx({C(1)}, {}), count);
  auto module = Build({kb.kernel()});
  ASSERT_NE(module, nullptr);

  std::mt19937 gen(16);
  std::uniform_int_distribution<int64_t> dist(-50, 50);
  std::vector<int64_t> xs(R * N), ys(R * N), sels(R * N), cnt(R);
  std::vector<uint8_t> ms(R * N), gts(R * N);
  for (size_t k = 0; k < xs.size(); ++k) {
    xs[k] = dist(gen);
    ys[k] = dist(gen);
    ms[k] = dist(gen) > 0 ? 1 : 0;
  }
  Call(module->Fn("ints"), {xs.data(), ys.data(), ms.data(), gts.data(), sels.data(), cnt.data()});
  for (int64_t r = 0; r < R; ++r) {
    int64_t want_cnt = 0;
    for (int64_t n = 0; n < N; ++n) {
      const size_t k = r * N + n;
      EXPECT_EQ(gts[k], (xs[k] > ys[k] && ms[k]) ? 1 : 0) << k;
      EXPECT_EQ(sels[k], ms[k] ? PyFloorDiv(xs[k], -3) : ys[k]) << k;
      want_cnt += ms[k];
    }
    EXPECT_EQ(cnt[r], want_cnt) << r;
  }
}

uint16_t F16Bits(float v) {  // exact for the normal values the test uses
  if (v == 0) return 0;
  uint32_t u;
  std::memcpy(&u, &v, 4);
  const uint32_t sign = (u >> 16) & 0x8000;
  const int32_t exp = static_cast<int32_t>((u >> 23) & 0xFF) - 127 + 15;
  return static_cast<uint16_t>(sign | (exp << 10) | ((u >> 13) & 0x3FF));
}
uint16_t Bf16Bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return static_cast<uint16_t>(u >> 16);
}

// float16 and bfloat16: loads widen to float, sums accumulate in float32,
// stores round to nearest even.
TEST(CppCodegen, HalfAndBfloat16) {
  const int64_t R = 6, N = 40;
  KernelBuilder k1("halves", {C(R)}, {C(N)});
  {
    const int x = k1.Buffer("x", v1::FLOAT16);
    const int y = k1.Buffer("y", v1::BFLOAT16);
    const int o16 = k1.Buffer("o16", v1::FLOAT16, true);
    const int obf = k1.Buffer("obf", v1::BFLOAT16, true);
    const int osum = k1.Buffer("osum", v1::FLOAT32, true);
    const int lx = k1.Load(x, Idx({C(N)}, {C(1)}));
    const int ly = k1.Load(y, Idx({C(N)}, {C(1)}));
    const int s = k1.Op("add", {lx, ly}, v1::FLOAT16);
    k1.Store(o16, Idx({C(N)}, {C(1)}), s);
    k1.Store(obf, Idx({C(N)}, {C(1)}), s);
    const int total = k1.Reduce(ReduceOp::kSum, s, v1::FLOAT32);
    k1.At(0, false).Store(osum, Idx({C(1)}, {}), total);
  }
  // Rounding: f32 in, f16 and bf16 out, and back.
  KernelBuilder k2("rounding", {}, {C(12)});
  {
    const int x = k2.Buffer("x", v1::FLOAT32);
    const int o16 = k2.Buffer("o16", v1::FLOAT16, true);
    const int obf = k2.Buffer("obf", v1::BFLOAT16, true);
    const int back = k2.Buffer("back", v1::FLOAT32, true);
    const int lx = k2.Load(x, Idx({}, {C(1)}));
    k2.Store(o16, Idx({}, {C(1)}), lx);
    k2.Store(obf, Idx({}, {C(1)}), lx);
    k2.Store(back, Idx({}, {C(1)}), k2.Op("cast", {lx}, v1::FLOAT16));
  }
  auto module = Build({k1.kernel(), k2.kernel()});
  ASSERT_NE(module, nullptr);

  std::mt19937 gen(17);
  std::uniform_int_distribution<int> dist(-64, 64);
  std::vector<uint16_t> xs(R * N), ys(R * N), o16(R * N), obf(R * N);
  std::vector<float> xv(R * N), yv(R * N), osum(R);
  for (size_t k = 0; k < xs.size(); ++k) {
    xv[k] = dist(gen) / 8.0f;
    yv[k] = dist(gen) / 8.0f;
    xs[k] = F16Bits(xv[k]);
    ys[k] = Bf16Bits(yv[k]);
  }
  Call(module->Fn("halves"), {xs.data(), ys.data(), o16.data(), obf.data(), osum.data()});
  for (int64_t r = 0; r < R; ++r) {
    float want_sum = 0;
    for (int64_t n = 0; n < N; ++n) {
      const size_t k = r * N + n;
      EXPECT_EQ(o16[k], F16Bits(xv[k] + yv[k])) << k;
      EXPECT_EQ(obf[k], Bf16Bits(xv[k] + yv[k])) << k;
      want_sum += xv[k] + yv[k];
    }
    EXPECT_EQ(osum[r], want_sum) << r;  // exact: multiples of 1/8
  }

  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> in = {0.1f,
                           65504.0f,
                           1e6f,
                           std::ldexp(1.0f, -24),
                           nan,
                           -0.0f,
                           65520.0f,
                           1.0f + std::ldexp(1.0f, -11),
                           1.0f + 3 * std::ldexp(1.0f, -11),
                           1.0f + std::ldexp(1.0f, -8),
                           1.0f + 3 * std::ldexp(1.0f, -8),
                           -2.5f};
  std::vector<uint16_t> h(12), bf(12);
  std::vector<float> back(12);
  Call(module->Fn("rounding"), {in.data(), h.data(), bf.data(), back.data()});
  const std::vector<uint16_t> want_h = {0x2E66, 0x7BFF, 0x7C00, 0x0001, 0x7E00, 0x8000,
                                        0x7C00, 0x3C00, 0x3C02, 0x3C04, 0x3C0C, 0xC100};
  const std::vector<uint16_t> want_bf = {0x3DCD, 0x4780, 0x4974, 0x3380, 0x7FC0, 0x8000,
                                         0x4780, 0x3F80, 0x3F80, 0x3F80, 0x3F82, 0xC020};
  for (int k = 0; k < 12; ++k) {
    EXPECT_EQ(h[k], want_h[k]) << "f16 of element " << k;
    EXPECT_EQ(bf[k], want_bf[k]) << "bf16 of element " << k;
  }
  EXPECT_EQ(back[0], 0.0999755859375f);
  EXPECT_EQ(back[3], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(back[6]));
  EXPECT_TRUE(std::isnan(back[4]));
}

// ---------------------------------------------------------------------------
// Errors.

TEST(CppCodegen, UnknownOpIsInvalidArgumentNamingTheStatement) {
  KernelBuilder kb("bad_op", {C(4)}, {C(8)});
  const int x = kb.Buffer("x", v1::FLOAT32);
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  const int lx = kb.Load(x, Idx({C(8)}, {C(1)}));
  const int f = kb.Op("frobnicate", {lx});
  kb.Store(out, Idx({C(8)}, {C(1)}), f);
  absl::StatusOr<std::string> code = MakeCppBackend({})->Generate({kb.kernel()}, {});
  ASSERT_FALSE(code.ok());
  EXPECT_EQ(code.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(code.status().message(), "kernel 'bad_op'"));
  EXPECT_TRUE(absl::StrContains(code.status().message(), "statement %1"));
  EXPECT_TRUE(absl::StrContains(code.status().message(), "unknown op 'frobnicate'"))
      << code.status();
}

TEST(CppCodegen, MisplacedStatementsAreInvalidArgument) {
  {  // an inner statement reading its own pass's reduction
    KernelBuilder kb("early_read", {C(4)}, {C(8)});
    const int x = kb.Buffer("x", v1::FLOAT32);
    const int lx = kb.Load(x, Idx({C(8)}, {C(1)}));
    const int s = kb.Reduce(ReduceOp::kSum, lx);
    kb.Op("add", {lx, s});
    absl::StatusOr<std::string> code = MakeCppBackend({})->Generate({kb.kernel()}, {});
    EXPECT_EQ(code.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(code.status().message(), "statement %2")) << code.status();
  }
  {  // a size naming a symbol the plan does not have
    KernelBuilder kb("bad_symbol", {E("s7")}, {C(8)});
    kb.Buffer("x", v1::FLOAT32);
    absl::StatusOr<std::string> code = MakeCppBackend({})->Generate({kb.kernel()}, {"s0"});
    EXPECT_EQ(code.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(code.status().message(), "unknown symbol 's7'")) << code.status();
  }
  {  // a complex buffer
    KernelBuilder kb("complex", {C(4)}, {C(8)});
    kb.Buffer("z", v1::COMPLEX64);
    absl::StatusOr<std::string> code = MakeCppBackend({})->Generate({kb.kernel()}, {});
    EXPECT_EQ(code.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(code.status().message(), "COMPLEX64")) << code.status();
  }
}

TEST(CppCodegen, CompilerErrorIsInternalWithTheLog) {
  absl::StatusOr<v1::CompiledModule> module =
      MakeCppBackend({})->Compile("extern \"C\" void f() { this is not C++; }\n");
  ASSERT_FALSE(module.ok());
  EXPECT_EQ(module.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(module.status().message(), "g++ failed")) << module.status();
  EXPECT_TRUE(absl::StrContains(module.status().message(), "error")) << module.status();
  absl::optional<absl::Cord> log = module.status().GetPayload("kiln.dev/compiler-log");
  ASSERT_TRUE(log.has_value());
  EXPECT_TRUE(absl::StrContains(std::string(*log), "error"));
}

TEST(CppCodegen, MissingCompilerIsInternal) {
  CppOptions options;
  options.compiler = "kiln-no-such-compiler";
  absl::StatusOr<v1::CompiledModule> module = MakeCppBackend(options)->Compile("int x;\n");
  EXPECT_EQ(module.status().code(), absl::StatusCode::kInternal);
}

// ---------------------------------------------------------------------------
// The listing, determinism and Generate's speed.

TEST(PrintKernel, ListsSizesBuffersAndStatements) {
  const std::string text = loop::PrintKernel(BroadcastAdd("add_bcast", 4, 50, 300));
  EXPECT_TRUE(absl::StrContains(text, "kernel add_bcast: outer [4, 50] inner [300] passes 1"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "buf2 = out : f32 (written)")) << text;
  EXPECT_TRUE(absl::StrContains(text,
                                "%0 = load buf0[o0*15000 + o1*300 + i0*1 + 0] : f32 "
                                "[pass 0, inner]"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "%1 = load buf1[o1*300 + i0*1 + 0]")) << text;
  EXPECT_TRUE(absl::StrContains(text, "%2 = add %0, %1 : f32 [pass 0, inner]")) << text;
  EXPECT_TRUE(absl::StrContains(text, "store buf2[o0*15000 + o1*300 + i0*1 + 0] = %2")) << text;

  const std::string ln = loop::PrintKernel(LayerNorm("ln", 7));
  EXPECT_TRUE(absl::StrContains(ln, "%2 = reduce welford_m2 %0 : f32 [pass 0, inner]")) << ln;
  EXPECT_TRUE(absl::StrContains(ln, "store buf4[o0*1 + 0] = %1 [pass 0, outer]")) << ln;
}

TEST(CppCodegen, GenerateIsDeterministicAndFast) {
  std::vector<Kernel> kernels;
  for (int k = 0; k < 100; ++k) {
    kernels.push_back(k % 2 == 0
                          ? Softmax(absl::StrCat("softmax_", k), E("s0"), C(128 + k), C(128 + k))
                          : LayerNorm(absl::StrCat("ln_", k), 64 + k));
  }
  std::unique_ptr<CodegenBackend> backend = MakeCppBackend({});
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> a = backend->Generate(kernels, {"s0"});
  const double ms = Ms(std::chrono::steady_clock::now() - start);
  ASSERT_TRUE(a.ok()) << a.status();
  std::printf("[ generate ] 100 kernels: %.2f ms, %zu bytes of source\n", ms, a->size());
  absl::StatusOr<std::string> b = backend->Generate(kernels, {"s0"});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*a, *b);
}

}  // namespace
}  // namespace kiln::codegen

namespace kiln::codegen {
namespace {

// A compiler that never finishes (and starts a child that would outlive a
// kill of the compiler alone) is killed, with its child, at the time limit.
TEST(CppCodegen, TheCompilerRunsUnderATimeLimit) {
  char dir[] = "/tmp/kiln_codegen_timeout.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string script = std::string(dir) + "/slow-g++";
  const std::string marker = std::string(dir) + "/child-finished";
  {
    FILE* f = std::fopen(script.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f, "#!/bin/sh\n(sleep 3; touch '%s') &\nsleep 60\n", marker.c_str());
    std::fclose(f);
    ASSERT_EQ(chmod(script.c_str(), 0755), 0);
  }
  CppOptions options;
  options.compiler = script;
  options.scratch_dir = dir;
  options.timeout = absl::Milliseconds(500);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<v1::CompiledModule> module = MakeCppBackend(options)->Compile("int x;\n");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(module.status().code(), absl::StatusCode::kDeadlineExceeded) << module.status();
  EXPECT_TRUE(absl::StrContains(module.status().message(), "ran past its time limit of 500ms"))
      << module.status();
  EXPECT_LT(seconds, 3.0);
  sleep(4);
  EXPECT_NE(access(marker.c_str(), F_OK), 0) << "the compiler's child outlived the kill";
  // Only the script is left: the source and object files were removed.
  int entries = 0;
  for (DIR* d = opendir(dir); d != nullptr;) {
    dirent* e = readdir(d);
    if (e == nullptr) {
      closedir(d);
      break;
    }
    if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") ++entries;
  }
  EXPECT_EQ(entries, 1);
  unlink(script.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace kiln::codegen
