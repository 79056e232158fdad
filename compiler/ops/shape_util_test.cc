// Tests of shape_util.h's symbolic arithmetic and contiguous strides.
#include "compiler/ops/shape_util.h"
#include "compiler/ops/shape_rules_test_util.h"
#include "gtest/gtest.h"

namespace kiln::ops::shape_rules_test {
namespace {

// ---------------------------------------------------------------------------
// shape_util: symbolic arithmetic.

TEST(SymArith, FoldsConstantsAndKeepsProductsCanonical) {
  EXPECT_EQ(SymMul(C(16), S("s0")), S("16*s0"));
  EXPECT_EQ(SymMul(C(2), S("16*s0")), S("32*s0"));
  EXPECT_EQ(SymMul(S("s1"), S("4*s0")), S("4*s0*s1"));
  EXPECT_EQ(SymMul(S("s0"), C(0)), C(0));
  EXPECT_EQ(SymMul(S("s0"), C(1)), S("s0"));
  EXPECT_EQ(SymAdd(S("s0"), C(4)), S("s0 + 4"));
  EXPECT_EQ(SymAdd(C(4), S("s0")), S("s0 + 4"));
  EXPECT_EQ(SymAdd(S("s0 + 2"), C(-3)), S("s0 - 1"));
  EXPECT_EQ(SymSub(SymAdd(S("s1"), C(2)), C(2)), S("s1"));
  EXPECT_EQ(SymAdd(S("s0"), S("s0")), S("2*s0"));
  EXPECT_EQ(SymSub(S("s0"), S("s1")), S("s0 - s1"));
  EXPECT_EQ(SymSub(S("s0"), S("s0")), C(0));
  EXPECT_EQ(SymMul(C(2), S("s0 + 1")), S("2*s0 + 2"));
  EXPECT_EQ(SymFloorDiv(S("32*s0"), C(16)), S("2*s0"));
  EXPECT_EQ(SymFloorDiv(S("4*s0*s1"), S("s1")), S("4*s0"));
  EXPECT_EQ(SymFloorDiv(S("s0 - 1"), C(2)), S("(s0 - 1)//2"));
  EXPECT_EQ(SymAdd(SymFloorDiv(S("s0 - 1"), C(2)), C(1)), S("(s0 - 1)//2 + 1"));
  EXPECT_EQ(SymFloorDiv(C(-7), C(2)), C(-4));
  EXPECT_EQ(Numel({C(4), S("s0"), C(2)}), S("8*s0"));
}

TEST(ContiguousStrides, ConstantAndSymbolic) {
  EXPECT_EQ(Str(ContiguousStrides(ToSymSizes({2, 3, 4}))), "[12, 4, 1]");
  EXPECT_EQ(Str(ContiguousStrides(ToSymSizes({2, 0, 3}))), "[3, 3, 1]");
  EXPECT_EQ(Str(ContiguousStrides({C(4), S("s0"), C(16)})), "[16*s0, 16, 1]");
  EXPECT_EQ(Str(ContiguousStrides({S("s0"), S("s1"), C(8)})), "[8*s1, 8, 1]");
  EXPECT_EQ(Str(ContiguousStrides({})), "[]");
}

// ---------------------------------------------------------------------------
// shape_util: channels-last layouts.

TEST(ChannelsLastTest, FollowsC10sRule) {
  auto meta = [](std::vector<int64_t> sizes, std::vector<int64_t> strides) {
    ir::TensorMeta m = ir::ContiguousMeta(std::move(sizes), v1::FLOAT32);
    m.strides.clear();
    for (int64_t s : strides) m.strides.push_back(C(s));
    return m;
  };
  EXPECT_TRUE(IsChannelsLast(meta({2, 3, 4, 5}, {60, 1, 15, 3})));
  EXPECT_FALSE(IsChannelsLast(meta({2, 3, 4, 5}, {60, 20, 5, 1})));
  // One pixel: [N, C, 1, 1] contiguous is not channels-last, its
  // channels-last strides are.
  EXPECT_FALSE(IsChannelsLast(meta({2, 3, 1, 1}, {3, 1, 1, 1})));
  EXPECT_TRUE(IsChannelsLast(meta({2, 3, 1, 1}, {3, 1, 3, 3})));
  // [N, 1, 1, 1]: ambiguous, contiguous.
  EXPECT_FALSE(IsChannelsLast(meta({2, 1, 1, 1}, {1, 1, 1, 1})));
  // A symbolic batch keeps the layout.
  ir::TensorMeta symbolic = meta({2, 3, 4, 5}, {60, 1, 15, 3});
  symbolic.sizes[0] = S("s0");
  EXPECT_TRUE(IsChannelsLast(symbolic));
  EXPECT_EQ(PreservedStrides(symbolic), symbolic.strides);
  EXPECT_FALSE(IsChannelsLast(meta({2, 3, 4}, {12, 4, 1})));
}

}  // namespace
}  // namespace kiln::ops::shape_rules_test
