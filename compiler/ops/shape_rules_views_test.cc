// Tests of the shape rules of views and shape manipulation: view sizes and
// strides, expand, squeeze, slice, select, split, cat and stack.
#include <limits>
#include <string>
#include <vector>

#include "compiler/ir/builder.h"
#include "compiler/ir/graph.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_rules_test_util.h"
#include "compiler/ops/shape_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::ops::shape_rules_test {
namespace {

// ---------------------------------------------------------------------------
// Views.

TEST(ShapeRules, ViewInfersMinusOne) {
  struct Case {
    SymSizes in;
    SymSizes size;
    std::string want_sizes, want_strides;
  };
  const std::vector<Case> cases = {
      {ToSymSizes({4, 6}), ToSymSizes({-1, 3}), "[8, 3]", "[3, 1]"},
      {ToSymSizes({4, 6}), ToSymSizes({24}), "[24]", "[1]"},
      {ToSymSizes({2, 3, 4}), ToSymSizes({6, -1}), "[6, 4]", "[4, 1]"},
      {{S("s0"), C(16)}, {C(-1), C(4)}, "[4*s0, 4]", "[4, 1]"},
      {{S("s0"), C(16)}, {S("s0"), C(4), C(4)}, "[s0, 4, 4]", "[16, 4, 1]"},
      {{C(4), S("s0"), C(16)}, {C(-1), C(16)}, "[4*s0, 16]", "[16, 1]"},
      {ToSymSizes({}), ToSymSizes({1, 1}), "[1, 1]", "[1, 1]"},
  };
  for (const Case& c : cases) {
    Env env;
    auto x = env.In(Meta(v1::FLOAT32, c.in));
    SCOPED_TRACE(Str(c.in) + " -> " + Str(c.size));
    TensorMeta m = env.One("aten.view.default", {ir::Ref(x), Syms(c.size)});
    EXPECT_EQ(Str(m.sizes), c.want_sizes);
    EXPECT_EQ(Str(m.strides), c.want_strides);
  }
}

TEST(ShapeRules, ViewErrors) {
  Env env;
  auto x = env.In(v1::FLOAT32, {4, 6});
  auto r = env.Infer("aten.view.default", {ir::Ref(x), ir::Ints({5, -1})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("argument 'size': shape [5, -1] is invalid for input of size 24"));
  r = env.Infer("aten.view.default", {ir::Ref(x), ir::Ints({-1, -1})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("more than one -1"));
  r = env.Infer("aten.view.default", {ir::Ref(x), ir::Ints({5, 5})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("invalid for input of size 24"));

  // Symbolic counts a single term apart differ for every s0.
  auto sym = env.In(Meta(v1::FLOAT32, {S("s0"), C(16)}));
  r = env.Infer("aten.view.default", {ir::Ref(sym), Syms({S("s0"), C(8)})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("shape [s0, 8] is invalid for input of size 16*s0"));

  // A transposed tensor cannot merge its dimensions without a copy.
  auto t = env.Node("aten.t.default", {ir::Ref(x)})[0];
  r = env.Infer("aten.view.default", {ir::Ref(t), ir::Ints({24})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("argument 'size' [24] is not a view of 'self'"));
  // _unsafe_view is a fresh tensor's reshape: contiguous.
  TensorMeta u = env.One("aten._unsafe_view.default", {ir::Ref(t), ir::Ints({24})});
  EXPECT_EQ(Str(u.strides), "[1]");
  // Splitting a transposed dimension is a view.
  TensorMeta split = env.One("aten.view.default", {ir::Ref(t), ir::Ints({2, 3, 4})});
  EXPECT_EQ(Str(split.strides), "[3, 1, 6]");
}

TEST(ShapeRules, ViewStridesOfLayoutOps) {
  Env env;
  auto x = env.In(v1::FLOAT32, {2, 3, 4});  // strides [12, 4, 1]
  struct Case {
    std::string target;
    std::vector<Argument> args;  // after self
    std::string sizes, strides;
    int64_t offset = 0;
  };
  const std::vector<Case> cases = {
      {"aten.permute.default", {ir::Ints({2, 0, 1})}, "[4, 2, 3]", "[1, 12, 4]"},
      {"aten.permute.default", {ir::Ints({-1, 1, 0})}, "[4, 3, 2]", "[1, 4, 12]"},
      {"aten.transpose.int", {ir::Int(0), ir::Int(2)}, "[4, 3, 2]", "[1, 4, 12]"},
      {"aten.expand.default", {ir::Ints({5, 2, 3, 4})}, "[5, 2, 3, 4]", "[0, 12, 4, 1]"},
      {"aten.expand.default", {ir::Ints({-1, 3, -1})}, "[2, 3, 4]", "[12, 4, 1]"},
      {"aten.unsqueeze.default", {ir::Int(1)}, "[2, 1, 3, 4]", "[12, 12, 4, 1]"},
      {"aten.unsqueeze.default", {ir::Int(-1)}, "[2, 3, 4, 1]", "[12, 4, 1, 1]"},
      {"aten.slice.Tensor",
       {ir::Int(2), ir::Int(1), ir::Int(4), ir::Int(2)},
       "[2, 3, 2]",
       "[12, 4, 2]",
       1},
      {"aten.slice.Tensor", {ir::Int(1), ir::Int(-2)}, "[2, 2, 4]", "[12, 4, 1]", 4},
      {"aten.slice.Tensor",
       {ir::Int(0), ir::Int(0), ir::Int(std::numeric_limits<int64_t>::max())},
       "[2, 3, 4]",
       "[12, 4, 1]"},
      {"aten.slice.Tensor", {ir::Int(1), ir::Int(5), ir::Int(9)}, "[2, 0, 4]", "[12, 4, 1]", 12},
      {"aten.select.int", {ir::Int(1), ir::Int(-1)}, "[2, 4]", "[12, 1]", 8},
      {"aten.select.int", {ir::Int(0), ir::Int(1)}, "[3, 4]", "[4, 1]", 12},
      {"aten.as_strided.default",
       {ir::Ints({2, 2}), ir::Ints({1, 2}), ir::Int(3)},
       "[2, 2]",
       "[1, 2]",
       3},
      {"aten.alias.default", {}, "[2, 3, 4]", "[12, 4, 1]"},
      {"aten.squeeze.dim", {ir::Int(0)}, "[2, 3, 4]", "[12, 4, 1]"},
  };
  for (const Case& c : cases) {
    std::vector<Argument> args = {ir::Ref(x)};
    args.insert(args.end(), c.args.begin(), c.args.end());
    SCOPED_TRACE(c.target + " -> " + c.sizes);
    TensorMeta m = env.One(c.target, args);
    EXPECT_EQ(Str(m.sizes), c.sizes);
    EXPECT_EQ(Str(m.strides), c.strides);
    EXPECT_EQ(m.storage_offset, C(c.offset));
    EXPECT_EQ(m.dtype, v1::FLOAT32);
    EXPECT_EQ(m.device_type, "cpu");
  }
}

TEST(ShapeRules, ExpandSqueezeOfSizeOneDims) {
  Env env;
  auto x = env.In(v1::FLOAT32, {3, 1});
  TensorMeta e = env.One("aten.expand.default", {ir::Ref(x), ir::Ints({2, 3, 5})});
  EXPECT_EQ(Str(e.sizes), "[2, 3, 5]");
  EXPECT_EQ(Str(e.strides), "[0, 1, 0]");
  auto r = env.Infer("aten.expand.default", {ir::Ref(x), ir::Ints({4, 5})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("argument 'size'"));

  auto y = env.In(v1::FLOAT32, {1, 4, 1});
  EXPECT_EQ(Str(env.One("aten.squeeze.dims", {ir::Ref(y), ir::Ints({0, -1})}).sizes), "[4]");
  EXPECT_EQ(Str(env.One("aten.squeeze.dim", {ir::Ref(y), ir::Int(1)}).sizes), "[1, 4, 1]");
  EXPECT_EQ(Str(env.One("aten.t.default", {ir::Ref(x)}).strides), "[1, 1]");
}

TEST(ShapeRules, SymbolicSliceAndSelect) {
  Env env;
  auto x = env.In(Meta(v1::FLOAT32, {S("s0"), C(8)}));
  TensorMeta s = env.One("aten.slice.Tensor", {ir::Ref(x), ir::Int(0), ir::Int(2),
                                               ir::Int(std::numeric_limits<int64_t>::max())});
  EXPECT_EQ(Str(s.sizes), "[s0 - 2, 8]");
  EXPECT_EQ(s.storage_offset, C(16));
  TensorMeta t = env.One("aten.slice.Tensor", {ir::Ref(x), ir::Int(0), ir::Int(0), ir::Int(-1)});
  EXPECT_EQ(Str(t.sizes), "[s0 - 1, 8]");
  TensorMeta sel = env.One("aten.select.int", {ir::Ref(x), ir::Int(0), ir::Int(-1)});
  EXPECT_EQ(Str(sel.sizes), "[8]");
  EXPECT_EQ(sel.storage_offset, S("8*s0 - 8"));
}

TEST(ShapeRules, SelectAndPermuteErrors) {
  Env env;
  auto x = env.In(v1::FLOAT32, {4, 8});
  auto r = env.Infer("aten.select.int", {ir::Ref(x), ir::Int(0), ir::Int(4)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("argument 'index' is 4, out of range for dimension 0 of size 4"));
  r = env.Infer("aten.permute.default", {ir::Ref(x), ir::Ints({0, 0})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("argument 'dims' [0, 0] is not a permutation"));
}

TEST(ShapeRules, SplitWithSizes) {
  Env env;
  auto x = env.In(v1::FLOAT32, {4, 10});
  auto r =
      env.Infer("aten.split_with_sizes.default", {ir::Ref(x), ir::Ints({2, 3, 5}), ir::Int(1)});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  const char* want[] = {"[4, 2]", "[4, 3]", "[4, 5]"};
  const int64_t offsets[] = {0, 2, 5};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Str((*r)[i].sizes), want[i]);
    EXPECT_EQ(Str((*r)[i].strides), "[10, 1]");
    EXPECT_EQ((*r)[i].storage_offset, C(offsets[i]));
  }
  r = env.Infer("aten.split_with_sizes.default", {ir::Ref(x), ir::Ints({2, 3}), ir::Int(1)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("argument 'split_sizes' [2, 3] sums to 5, but dimension 1 of 'self' has "
                        "size 10"));

  r = env.Infer("aten.split.Tensor", {ir::Ref(x), ir::Int(4), ir::Int(-1)});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ(Str((*r)[2].sizes), "[4, 2]");
  EXPECT_EQ((*r)[2].storage_offset, C(8));

  r = env.Infer("aten.unbind.int", {ir::Ref(x)});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 4u);
  EXPECT_EQ(Str((*r)[3].sizes), "[10]");
  EXPECT_EQ((*r)[3].storage_offset, C(30));
}

TEST(ShapeRules, CatAndStack) {
  Env env;
  auto a = env.In(v1::FLOAT32, {2, 3});
  auto b = env.In(v1::FLOAT16, {4, 3});
  auto empty = env.In(v1::FLOAT32, {0});
  auto s = env.In(Meta(v1::FLOAT32, {S("s0"), C(3)}));
  TensorMeta cat = env.One("aten.cat.default", {Tensors({a, b, empty})});
  EXPECT_EQ(Str(cat.sizes), "[6, 3]");
  EXPECT_EQ(cat.dtype, v1::FLOAT32);
  EXPECT_EQ(Str(env.One("aten.cat.default", {Tensors({a, s})}).sizes), "[s0 + 2, 3]");
  auto r = env.Infer("aten.cat.default", {Tensors({a, b}), ir::Int(1)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("argument 'tensors' element 1 has size[0] 4, but element 0 has size[0] 2"));
  TensorMeta st = env.One("aten.stack.default", {Tensors({a, a}), ir::Int(-1)});
  EXPECT_EQ(Str(st.sizes), "[2, 3, 2]");
}

// The attention graph's permute/expand/view chain, with PyTorch's strides.
TEST(ShapeRules, ViewOfPermutedExpand) {
  Env env;
  auto k = env.In(v1::FLOAT32, {2, 16, 32});
  auto p = env.Node("aten.permute.default", {ir::Ref(k), ir::Ints({0, 2, 1})})[0];
  auto e = env.Node("aten.expand.default", {ir::Ref(p), ir::Ints({2, 32, 16})})[0];
  auto v = env.Node("aten.view.default", {ir::Ref(e), ir::Ints({2, 32, 16})})[0];
  EXPECT_EQ(Str(env.meta(v).strides), "[512, 1, 32]");
}

}  // namespace
}  // namespace kiln::ops::shape_rules_test
