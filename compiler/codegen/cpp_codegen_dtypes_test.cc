// The C++ backend end to end over int64, bool, float16 and bfloat16 buffers:
// comparisons stored as bool, Python floor division, counts, loads that
// widen half types to float and stores that round to nearest even.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "compiler/codegen/codegen.h"
#include "compiler/codegen/cpp_codegen_test_util.h"
#include "gtest/gtest.h"

namespace kiln::codegen::cpp_test {
namespace {

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
  const int gt = kb.Op(ScalarOp::kGt, {lx, ly}, v1::BOOL);
  const int both = kb.Op(ScalarOp::kAnd, {gt, lm}, v1::BOOL);
  kb.Store(gt_out, Idx({C(N)}, {C(1)}), both);
  const int q = kb.Op(ScalarOp::kDivFloor, {lx, kb.Const(-3, v1::INT64)}, v1::INT64);
  const int sel = kb.Op(ScalarOp::kWhere, {lm, q, ly}, v1::INT64);
  kb.Store(sel_out, Idx({C(N)}, {C(1)}), sel);
  const int as_int = kb.Op(ScalarOp::kCast, {lm}, v1::INT64);
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
    const int s = k1.Op(ScalarOp::kAdd, {lx, ly}, v1::FLOAT16);
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
    k2.Store(back, Idx({}, {C(1)}), k2.Op(ScalarOp::kCast, {lx}, v1::FLOAT16));
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

}  // namespace
}  // namespace kiln::codegen::cpp_test
