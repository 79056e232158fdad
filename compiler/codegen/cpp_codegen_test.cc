// The C++ backend end to end: kernels built by hand, generated, compiled with
// g++, loaded with dlopen and run on random data against reference loops.
// Here pointwise kernels, reductions and the precision of their sums,
// softmax and layer norm over several passes, and symbolic sizes; the
// integer and half-precision dtypes in cpp_codegen_dtypes_test.cc, errors,
// the listing and determinism in cpp_codegen_errors_test.cc.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compiler/codegen/codegen.h"
#include "compiler/codegen/cpp_codegen_test_util.h"
#include "gtest/gtest.h"

namespace kiln::codegen::cpp_test {
namespace {

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
  const int e = kb.Op(ScalarOp::kExp, {lx});
  const int c = kb.Op(ScalarOp::kCast, {e}, v1::FLOAT64);
  const int ly = kb.Load(y, Idx({C(N)}, {C(1)}));
  const int m = kb.Op(ScalarOp::kMul, {c, ly}, v1::FLOAT64);
  const int one = kb.Const(1, v1::FLOAT64);
  const int a = kb.Op(ScalarOp::kAdd, {m, one}, v1::FLOAT64);
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
  const int m = kb.Op(ScalarOp::kMul, {lx, two});
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
    const int sq = k2.Op(ScalarOp::kMul, {lx, lx});
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
  const int p = kb.Op(ScalarOp::kMul, {kb.Load(x, Idx({}, {C(1)})), kb.Load(y, Idx({}, {C(1)}))});
  kb.Store(out, Idx({}, {C(1)}), kb.Op(ScalarOp::kSub, {p, kb.Load(c, Idx({}, {C(1)}))}));
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
  kb.Store(out, Idx({}, {C(1)}), kb.Op(ScalarOp::kExp, {kb.Load(x, Idx({}, {C(1)}))}));
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
  const int q = kb.Op(ScalarOp::kDiv, {kb.Load(x, Idx({C(N)}, {C(1)})), sum});
  kb.Store(out, Idx({C(N)}, {C(1)}), kb.Op(ScalarOp::kDiv, {q, kb.Load(y, Idx({C(N)}, {C(1)}))}));
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
    const int r = k1.Op(ScalarOp::kRelu, {lx});
    const int y = k1.Op(ScalarOp::kMul, {r, k1.Const(2)});
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

  for (const auto& [s0, s1] : {std::pair<int64_t, int64_t>{1, 1}, {37, 64}, {300, 129}}) {
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

}  // namespace
}  // namespace kiln::codegen::cpp_test
