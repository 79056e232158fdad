// The C++ backend's prelude (compiler/codegen/prelude/cpu.inc), compiled here
// on its own, as every generated translation unit begins with it: its
// float16 and bfloat16 conversions, its inline exp and the pointwise math
// written as ATen defines it. (This build has no AVX2 flags: libm stands in
// for libmvec, as the prelude says.)
#include "compiler/codegen/prelude/cpu.inc"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace {

bool IsNan16(uint16_t h, int exponent_bits) {
  const int mantissa_bits = 15 - exponent_bits;
  const uint16_t exponent =
      static_cast<uint16_t>((h >> mantissa_bits) & ((1 << exponent_bits) - 1));
  return exponent == (1 << exponent_bits) - 1 && (h & ((1 << mantissa_bits) - 1)) != 0;
}

TEST(PreludeTest, EveryBfloat16SurvivesTheRoundTrip) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = kiln_bf16_to_f32(static_cast<uint16_t>(h));
    if (IsNan16(static_cast<uint16_t>(h), 8)) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_EQ(kiln_f32_to_bf16(f), 0x7FC0);
      continue;
    }
    EXPECT_EQ(kiln_f32_to_bf16(f), h) << std::hex << h;
  }
}

TEST(PreludeTest, Bfloat16RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between 1 (even mantissa) and 1 + 2^-7: down.
  EXPECT_EQ(kiln_f32_to_bf16(1.0f + 0x1.0p-8f), 0x3F80);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
  EXPECT_EQ(kiln_f32_to_bf16(1.0f + 3 * 0x1.0p-8f), 0x3F82);
  EXPECT_EQ(kiln_f32_to_bf16(1.0f + 0x1.8p-8f), 0x3F81);  // past halfway: up
  EXPECT_EQ(kiln_f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(kiln_f32_to_bf16(-0.0f), 0x8000);
}

TEST(PreludeTest, EveryFloat16SurvivesTheRoundTrip) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = kiln_f16_to_f32(static_cast<uint16_t>(h));
    if (IsNan16(static_cast<uint16_t>(h), 5)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      continue;
    }
    EXPECT_EQ(kiln_f32_to_f16(f), h) << std::hex << h;
  }
}

TEST(PreludeTest, Float16ValuesAtItsEdges) {
  EXPECT_EQ(kiln_f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(kiln_f32_to_f16(65504.0f), 0x7BFF);    // the largest half
  EXPECT_EQ(kiln_f32_to_f16(65520.0f), 0x7C00);    // rounds to infinity
  EXPECT_EQ(kiln_f32_to_f16(0x1.0p-24f), 0x0001);  // the smallest subnormal
  EXPECT_EQ(kiln_f32_to_f16(0x1.0p-26f), 0x0000);  // below half of it: zero
  EXPECT_EQ(kiln_f32_to_f16(-2.0f), 0xC000);
  EXPECT_FLOAT_EQ(kiln_f16_to_f32(0x3555), 0.333251953125f);
  EXPECT_EQ(kiln_round_f16(1.0f + 0x1.0p-12f), 1.0f);  // halfway, to even
}

TEST(PreludeTest, ExpIsWithinTwoUlpsOverItsNormalRange) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-86.9f, 88.7f);
  for (int k = 0; k < 200000; ++k) {
    const float x = dist(rng);
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    const float got = kiln_exp(x);
    const float ulp = std::nextafter(want, std::numeric_limits<float>::infinity()) - want;
    ASSERT_LE(std::fabs(got - want), 2 * ulp) << "x = " << x;
  }
  EXPECT_EQ(kiln_exp(0.0f), 1.0f);
  EXPECT_EQ(kiln_exp(-100.0f), 0.0f);
  EXPECT_EQ(kiln_exp(100.0f), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(kiln_exp(std::numeric_limits<float>::quiet_NaN())));
}

TEST(PreludeTest, IntegerDivisionAndModuloArePythons) {
  EXPECT_EQ(kiln_floordiv<int64_t>(-7, 2), -4);
  EXPECT_EQ(kiln_floordiv<int64_t>(7, -2), -4);
  EXPECT_EQ(kiln_floordiv<int64_t>(7, 2), 3);
  EXPECT_EQ(kiln_mod<int64_t>(-7, 2), 1);
  EXPECT_EQ(kiln_mod<int64_t>(7, -2), -1);
  EXPECT_EQ(kiln_truncdiv<int64_t>(-7, 2), -3);
  // A kernel cannot raise: division by zero is 0.
  EXPECT_EQ(kiln_floordiv<int64_t>(5, 0), 0);
  EXPECT_EQ(kiln_mod<int64_t>(5, 0), 0);
  EXPECT_EQ(kiln_floordiv_float(-7.5f, 2.0f), -4.0f);
  EXPECT_EQ(kiln_floordiv_float(7.0f, 0.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(kiln_floordiv_float(-0.5f, 2.0f), -1.0f);
}

TEST(PreludeTest, IntegerPowers) {
  EXPECT_EQ(kiln_pow_int<int64_t>(2, 10), 1024);
  EXPECT_EQ(kiln_pow_int<int64_t>(-3, 3), -27);
  EXPECT_EQ(kiln_pow_int<int64_t>(-1, -3), -1);
  EXPECT_EQ(kiln_pow_int<int64_t>(1, -5), 1);
  EXPECT_EQ(kiln_pow_int<int64_t>(2, -1), 0);
}

TEST(PreludeTest, NanPropagatesThroughMaximumMinimumAndSign) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(kiln_maximum(nan, 1.0f)));
  EXPECT_TRUE(std::isnan(kiln_maximum(1.0f, nan)));
  EXPECT_TRUE(std::isnan(kiln_minimum(nan, 1.0f)));
  EXPECT_EQ(kiln_maximum(-1.0f, 2.0f), 2.0f);
  EXPECT_EQ(kiln_minimum(-1.0f, 2.0f), -1.0f);
  EXPECT_TRUE(std::isnan(kiln_sign(nan)));
  EXPECT_EQ(kiln_sign(-3.0f), -1.0f);
  EXPECT_EQ(kiln_sign(0.0f), 0.0f);
}

TEST(PreludeTest, ActivationsMatchTheirDefinitions) {
  for (double x : {-6.0, -1.5, -0.1, 0.0, 0.3, 2.0, 7.5}) {
    const double gelu = x * 0.5 * (1 + std::erf(x / std::sqrt(2.0)));
    const double tanh_gelu =
        0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    EXPECT_NEAR(kiln_gelu(x), gelu, 1e-12) << x;
    EXPECT_NEAR(kiln_gelu_tanh(x), tanh_gelu, 1e-12) << x;
    EXPECT_NEAR(kiln_sigmoid(x), 1 / (1 + std::exp(-x)), 1e-12) << x;
    EXPECT_NEAR(kiln_silu(x), x / (1 + std::exp(-x)), 1e-12) << x;
    EXPECT_NEAR(kiln_gelu(static_cast<float>(x)), gelu, 1e-5) << x;
  }
}

}  // namespace
