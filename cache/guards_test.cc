#include "cache/guards.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compiler/ir/graph.h"
#include "google/protobuf/text_format.h"

namespace kiln::cache {
namespace {

template <typename Proto>
Proto Parse(const std::string& text) {
  Proto p;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &p)) << text;
  return p;
}

// Two inputs sharing the symbol s0: x is checked stride by stride, y for
// contiguity.
constexpr char kGuards[] = R"pb(
  tensors {
    name: "x"
    dtype: FLOAT32
    device { type: "cuda" index: 0 }
    sizes { expr: "s0" }
    sizes { int_value: 4 }
    stride_check: EXACT
    strides { int_value: 4 }
    strides { int_value: 1 }
    check_requires_grad: true
    requires_grad: false
  }
  tensors {
    name: "y"
    dtype: FLOAT32
    device { type: "cuda" index: 0 }
    sizes { expr: "s0" }
    sizes { int_value: 4 }
    stride_check: CONTIGUOUS
  }
  client_guard_digest: "digest-1"
)pb";

// Satisfies kGuards with s0 = 4.
constexpr char kInputs[] = R"pb(
  inputs {
    dtype: FLOAT32
    device { type: "cuda" index: 0 }
    sizes: [ 4, 4 ]
    strides: [ 4, 1 ]
  }
  inputs {
    dtype: FLOAT32
    device { type: "cuda" index: 0 }
    sizes: [ 4, 4 ]
    strides: [ 4, 1 ]
    requires_grad: true
  }
  client_guard_digest: "digest-1"
)pb";

// The failure CheckGuards reports, "" when all guards hold, or the error
// status prefixed with "error: ".
std::string Check(const v1::GuardSet& guards, const v1::InputSignature& inputs) {
  absl::StatusOr<std::optional<std::string>> r = CheckGuards(guards, inputs);
  if (!r.ok()) return absl::StrCat("error: ", r.status().ToString());
  return r->value_or("");
}

TEST(CheckGuardsTest, AcceptsMatchingInputs) {
  const auto guards = Parse<v1::GuardSet>(kGuards);
  EXPECT_TRUE(ValidateGuardSet(guards).ok()) << ValidateGuardSet(guards);
  absl::StatusOr<std::optional<std::string>> r =
      CheckGuards(guards, Parse<v1::InputSignature>(kInputs));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, std::nullopt);
}

TEST(CheckGuardsTest, NamesTheFirstFailingGuard) {
  struct Case {
    std::string what;
    std::function<void(v1::GuardSet*, v1::InputSignature*)> mutate;
    std::string want;
  };
  using G = v1::GuardSet*;
  using S = v1::InputSignature*;
  const Case cases[] = {
      {"input count", [](G, S s) { s->add_inputs(); }, "expected 2 inputs, got 3"},
      {"dtype", [](G, S s) { s->mutable_inputs(0)->set_dtype(v1::FLOAT16); },
       "input 0 'x': dtype is FLOAT16, guard expects FLOAT32"},
      {"device type",
       [](G, S s) {
         s->mutable_inputs(1)->mutable_device()->set_type("cpu");
         s->mutable_inputs(1)->mutable_device()->set_index(-1);
       },
       "input 1 'y': device is cpu, guard expects cuda:0"},
      {"device index", [](G, S s) { s->mutable_inputs(0)->mutable_device()->set_index(1); },
       "input 0 'x': device is cuda:1, guard expects cuda:0"},
      {"cpu guard",
       [](G g, S) {
         g->mutable_tensors(0)->mutable_device()->set_type("cpu");
         g->mutable_tensors(0)->mutable_device()->set_index(-1);
       },
       "input 0 'x': device is cuda:0, guard expects cpu"},
      {"rank", [](G, S s) { s->mutable_inputs(0)->add_sizes(1); },
       "input 0 'x': rank is 3, guard expects 2"},
      {"constant size", [](G, S s) { s->mutable_inputs(1)->set_sizes(1, 5); },
       "input 1 'y': size[1] is 5, guard expects 4"},
      {"symbol bound by an earlier input", [](G, S s) { s->mutable_inputs(1)->set_sizes(0, 5); },
       "input 1 'y': size[0] is 5, but s0 = 4 (bound by input 0 'x' size[0])"},
      {"symbol bound earlier in the same input",
       [](G g, S) { g->mutable_tensors(0)->mutable_sizes(1)->set_expr("s0"); }, ""},
      {"exact stride", [](G, S s) { s->mutable_inputs(0)->set_strides(0, 1); },
       "input 0 'x': stride[0] is 1, guard expects 4"},
      {"stride count", [](G, S s) { s->mutable_inputs(0)->mutable_strides()->RemoveLast(); },
       "input 0 'x': stride count is 1, guard expects 2"},
      {"contiguity",
       [](G, S s) {
         s->mutable_inputs(1)->set_strides(0, 1);
         s->mutable_inputs(1)->set_strides(1, 4);
       },
       "input 1 'y': is not contiguous (strides [1, 4]), guard expects contiguous"},
      {"requires_grad", [](G, S s) { s->mutable_inputs(0)->set_requires_grad(true); },
       "input 0 'x': requires_grad is true, guard expects false"},
      {"requires_grad unchecked",
       [](G g, S s) {
         g->mutable_tensors(0)->set_check_requires_grad(false);
         s->mutable_inputs(0)->set_requires_grad(true);
       },
       ""},
      {"strides unchecked",
       [](G g, S s) {
         g->mutable_tensors(0)->set_stride_check(v1::TensorGuard::STRIDE_CHECK_UNSPECIFIED);
         s->mutable_inputs(0)->set_strides(0, 99);
       },
       ""},
      {"device unchecked without one in the guard",
       [](G g, S s) {
         g->mutable_tensors(0)->clear_device();
         s->mutable_inputs(0)->mutable_device()->set_type("meta");
       },
       ""},
      {"client digest", [](G, S s) { s->set_client_guard_digest("digest-2"); },
       "client guards differ"},
      {"unnamed input",
       [](G g, S s) {
         g->mutable_tensors(1)->clear_name();
         s->mutable_inputs(1)->set_dtype(v1::BFLOAT16);
       },
       "input 1: dtype is BFLOAT16, guard expects FLOAT32"},
      {"dtype before sizes",
       [](G, S s) {
         s->mutable_inputs(1)->set_sizes(1, 5);
         s->mutable_inputs(1)->set_dtype(v1::INT64);
       },
       "input 1 'y': dtype is INT64, guard expects FLOAT32"},
      {"inputs in order",
       [](G, S s) {
         s->mutable_inputs(1)->set_dtype(v1::INT64);
         s->mutable_inputs(0)->set_requires_grad(true);
       },
       "input 0 'x': requires_grad is true, guard expects false"},
      {"tensor guards before the digest",
       [](G, S s) {
         s->set_client_guard_digest("");
         s->mutable_inputs(1)->set_sizes(1, 5);
       },
       "input 1 'y': size[1] is 5, guard expects 4"},
  };
  for (const Case& c : cases) {
    auto guards = Parse<v1::GuardSet>(kGuards);
    auto inputs = Parse<v1::InputSignature>(kInputs);
    c.mutate(&guards, &inputs);
    EXPECT_EQ(Check(guards, inputs), c.want) << c.what;
  }
}

TEST(CheckGuardsTest, ContiguityIgnoresDimensionsOfSizeOne) {
  const auto guards = Parse<v1::GuardSet>(R"pb(
    tensors {
      name: "x"
      dtype: FLOAT32
      sizes { expr: "a" }
      sizes { expr: "b" }
      sizes { expr: "c" }
      stride_check: CONTIGUOUS
    })pb");
  struct Case {
    std::string inputs;
    bool contiguous;
  };
  const Case cases[] = {
      {"sizes: [2, 3, 4] strides: [12, 4, 1]", true},
      {"sizes: [2, 1, 4] strides: [4, 99, 1]", true},
      {"sizes: [1, 1, 1] strides: [7, 8, 9]", true},
      {"sizes: [2, 0, 4] strides: [5, 5, 5]", true},  // no elements
      {"sizes: [2, 3, 4] strides: [12, 1, 3]", false},
      {"sizes: [2, 3, 4] strides: [24, 8, 2]", false},
  };
  for (const Case& c : cases) {
    auto inputs = Parse<v1::InputSignature>("inputs { dtype: FLOAT32 " + c.inputs + " }");
    const std::string failure = Check(guards, inputs);
    if (c.contiguous) {
      EXPECT_EQ(failure, "") << c.inputs;
    } else {
      EXPECT_TRUE(absl::StartsWith(failure, "input 0 'x': is not contiguous (strides ["))
          << c.inputs << ": " << failure;
    }
  }
}

// x's size is 2*s0, but s0 is bound only by y, a later input.
constexpr char kDeferredGuards[] = R"pb(
  tensors {
    name: "x"
    dtype: FLOAT32
    sizes { expr: "2*s0" }
    sizes { expr: "s1" }
    stride_check: EXACT
    strides { expr: "s1" }
    strides { int_value: 1 }
  }
  tensors {
    name: "y"
    dtype: FLOAT32
    sizes { expr: "s0" }
    stride_check: EXACT
    strides { expr: "s2" }
  }
  tensors {
    name: "z"
    dtype: FLOAT32
    sizes { expr: "s2" }
    sizes { expr: "s0 + s1" }
  }
)pb";

std::string DeferredInputs(int x0, int x1, int x_stride0, int y0, int y_stride, int z0, int z1,
                           v1::DType y_dtype = v1::FLOAT32) {
  return absl::StrCat("inputs { dtype: FLOAT32 sizes: [", x0, ", ", x1, "] strides: [", x_stride0,
                      ", 1] } inputs { dtype: ", v1::DType_Name(y_dtype), " sizes: [", y0,
                      "] strides: [", y_stride, "] } inputs { dtype: FLOAT32 sizes: [", z0, ", ",
                      z1, "] }");
}

TEST(CheckGuardsTest, DefersExpressionsUntilTheirSymbolsAreBound) {
  const auto guards = Parse<v1::GuardSet>(kDeferredGuards);
  EXPECT_TRUE(ValidateGuardSet(guards).ok()) << ValidateGuardSet(guards);
  struct Case {
    std::string what;
    std::string inputs;
    std::string want;
  };
  const Case cases[] = {
      {"all hold", DeferredInputs(8, 3, 3, 4, 1, 1, 7), ""},
      {"deferred size", DeferredInputs(9, 3, 3, 4, 1, 1, 7),
       "input 0 'x': size[0] is 9, guard expects 2*s0 = 8 (s0 = 4)"},
      {"bare-symbol stride, bound by a size of the same input", DeferredInputs(8, 3, 4, 4, 1, 1, 7),
       "input 0 'x': stride[0] is 4, but s1 = 3 (bound by input 0 'x' size[1])"},
      {"stride bound by a later input", DeferredInputs(8, 3, 3, 4, 2, 1, 7),
       "input 1 'y': stride[0] is 2, guard expects s2 = 1 (s2 = 1)"},
      {"expression of symbols bound before", DeferredInputs(8, 3, 3, 4, 1, 1, 8),
       "input 2 'z': size[1] is 8, guard expects s0 + s1 = 7 (s0 = 4, s1 = 3)"},
      // Deferred checks come after every input's own checks.
      {"deferred after later inputs", DeferredInputs(9, 3, 3, 4, 1, 1, 7, v1::INT8),
       "input 1 'y': dtype is INT8, guard expects FLOAT32"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(Check(guards, Parse<v1::InputSignature>(c.inputs)), c.want) << c.what;
  }
}

constexpr char kShapeGuards[] = R"pb(
  tensors {
    name: "x"
    dtype: FLOAT32
    sizes { expr: "s0" }
    sizes { expr: "s1" }
  }
  tensors {
    name: "y"
    dtype: FLOAT32
    sizes { expr: "s2" }
  }
)pb";

TEST(CheckGuardsTest, ShapeGuardFailuresNameTheBindingInput) {
  struct Case {
    std::string guard;
    int x0, x1, y0;
    std::string want;
  };
  const Case cases[] = {
      {"s0 % 32 == 0", 48, 3, 1,
       "input 0 'x': size[0] is 48, guard 's0 % 32 == 0' fails (s0 = 48)"},
      {"s0 % 32 == 0", 64, 3, 1, ""},
      {"s0 + s1 < 10", 48, 3, 1,
       "input 0 'x': size[0] is 48, guard 's0 + s1 < 10' fails (s0 = 48, s1 = 3)"},
      {"s1 * s0 < 100", 48, 3, 1,
       "input 0 'x': size[1] is 3, guard 's1 * s0 < 100' fails (s1 = 3, s0 = 48)"},
      {"Max(s2, s0) <= 32 and s2 == s0", 16, 3, 17,
       "input 1 'y': size[0] is 17, guard 'Max(s2, s0) <= 32 and s2 == s0' fails (s2 = 17, s0 = "
       "16)"},
      {"Max(s2, s0) <= 32 and s2 == s0", 16, 3, 16, ""},
      {"1 == 2", 1, 1, 1, "guard '1 == 2' fails"},
      {"s0 // (s1 - 3) > 0", 48, 3, 1,
       "input 0 'x': size[0] is 48, guard 's0 // (s1 - 3) > 0' cannot be evaluated: division by "
       "zero (s0 = 48, s1 = 3)"},
      {"s1 == 3 or s0 // (s1 - 3) > 0", 48, 3, 1, ""},
  };
  for (const Case& c : cases) {
    auto guards = Parse<v1::GuardSet>(kShapeGuards);
    guards.add_shape_guards("s0 >= 1");  // holds, then the guard under test
    guards.add_shape_guards(c.guard);
    auto inputs = Parse<v1::InputSignature>(
        absl::StrCat("inputs { dtype: FLOAT32 sizes: [", c.x0, ", ", c.x1,
                     "] } inputs { dtype: FLOAT32 sizes: [", c.y0, "] }"));
    EXPECT_EQ(Check(guards, inputs), c.want) << c.guard;
  }
}

TEST(CheckGuardsTest, ShapeGuardsRunInOrderAfterTensorGuardsAndBeforeTheDigest) {
  auto guards = Parse<v1::GuardSet>(kShapeGuards);
  guards.add_shape_guards("s1 > 5");
  guards.add_shape_guards("s0 > 5");
  guards.set_client_guard_digest("d");
  auto inputs = Parse<v1::InputSignature>(
      "inputs { dtype: FLOAT32 sizes: [1, 1] } inputs { dtype: FLOAT32 sizes: [1] }");
  EXPECT_EQ(Check(guards, inputs), "input 0 'x': size[1] is 1, guard 's1 > 5' fails (s1 = 1)");
  inputs.mutable_inputs(1)->set_dtype(v1::FLOAT64);
  EXPECT_EQ(Check(guards, inputs), "input 1 'y': dtype is FLOAT64, guard expects FLOAT32");
  inputs.mutable_inputs(1)->set_dtype(v1::FLOAT32);
  inputs.mutable_inputs(0)->set_sizes(0, 6);
  inputs.mutable_inputs(0)->set_sizes(1, 6);
  EXPECT_EQ(Check(guards, inputs), "client guards differ");
  inputs.set_client_guard_digest("d");
  EXPECT_EQ(Check(guards, inputs), "");
}

TEST(CheckGuardsTest, MalformedGuardsAreErrors) {
  struct Case {
    std::string guards;
    std::string want;
  };
  const Case cases[] = {
      {R"pb(tensors {
              name: "x"
              sizes { expr: "s0" }
            }
            shape_guards: "s0 %% 8 ==")pb",
       "error: INVALID_ARGUMENT: shape guard 0 's0 %% 8 ==': malformed expression 's0 %% 8 ==': "
       "expected an operand at column 5, found '%'"},
      {R"pb(tensors {
              name: "x"
              sizes { expr: "s0" }
            }
            shape_guards: "s3 > 2")pb",
       "error: INVALID_ARGUMENT: shape guard 0 's3 > 2' uses symbol 's3', which no input size "
       "binds"},
      {R"pb(tensors {
              name: "x"
              sizes { expr: "2*s9" }
            })pb",
       "error: INVALID_ARGUMENT: tensor guard 0 'x' size[0] '2*s9' uses symbol 's9', which no "
       "input size binds"},
      {R"pb(tensors {
              name: "x"
              sizes { expr: "2*" }
            })pb",
       "error: INVALID_ARGUMENT: tensor guard 0 'x' size[0]: malformed expression '2*': expected "
       "an operand at column 3"},
      {R"pb(tensors {
              name: "x"
              sizes { int_value: 5 }
              stride_check: EXACT
            })pb",
       "error: INVALID_ARGUMENT: tensor guard 0 'x': stride_check EXACT needs one stride per size "
       "(1), has 0"},
  };
  const auto inputs = Parse<v1::InputSignature>("inputs { sizes: 5 strides: 1 }");
  for (const Case& c : cases) {
    EXPECT_EQ(Check(Parse<v1::GuardSet>(c.guards), inputs), c.want) << c.guards;
  }
}

TEST(ValidateGuardSetTest, NamesTheMalformedGuard) {
  struct Case {
    std::string guards;
    std::string want;  // "" when valid
  };
  const Case cases[] = {
      {kGuards, ""},
      {kDeferredGuards, ""},
      {R"pb(tensors {
              name: "x"
              sizes { expr: "s0" }
            }
            shape_guards: "s0 >= 2"
            shape_guards: "s0 %% 8 ==")pb",
       "shape guard 1 's0 %% 8 ==': malformed expression 's0 %% 8 ==': expected an operand at "
       "column 5, found '%'"},
      {R"pb(tensors {
              name: "x"
              sizes { expr: "s0" }
            }
            shape_guards: "s3 > 2")pb",
       "shape guard 0 's3 > 2' uses symbol 's3', which no input size binds"},
      {R"pb(tensors {
              name: "x"
              sizes { expr: "s0" }
            }
            tensors {
              name: "w"
              sizes { expr: "s0 +" }
            })pb",
       "tensor guard 1 'w' size[0]: malformed expression 's0 +': expected an operand at column 5"},
      {R"pb(tensors {
              sizes { expr: "s0" }
              stride_check: EXACT
              strides { expr: "s5" }
            })pb",
       "tensor guard 0 stride[0] 's5' uses symbol 's5', which no input size binds"},
      {R"pb(tensors {
              name: "x"
              sizes { expr: "(s0)" }
            })pb",
       "tensor guard 0 'x' size[0] '(s0)' uses symbol 's0', which no input size binds"},
      {R"pb(tensors {
              name: "x"
              sizes { int_value: 1 }
              sizes { int_value: 2 }
              stride_check: EXACT
              strides { int_value: 1 }
            })pb",
       "tensor guard 0 'x': stride_check EXACT needs one stride per size (2), has 1"},
  };
  for (const Case& c : cases) {
    absl::Status s = ValidateGuardSet(Parse<v1::GuardSet>(c.guards));
    if (c.want.empty()) {
      EXPECT_TRUE(s.ok()) << s;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.guards;
      EXPECT_EQ(s.message(), c.want);
    }
  }
}

TEST(CheckGuardsTest, ScalesLinearlyWithInputs) {
  // 20000 inputs sharing one symbol, each also checked against an expression.
  v1::GuardSet guards;
  v1::InputSignature inputs;
  for (int i = 0; i < 20000; ++i) {
    v1::TensorGuard* g = guards.add_tensors();
    g->set_dtype(v1::FLOAT32);
    g->add_sizes()->set_expr("s0");
    g->add_sizes()->set_expr(i == 0 ? "s1" : "s1 + 1 - 1");
    v1::TensorSignature* t = inputs.add_inputs();
    t->set_dtype(v1::FLOAT32);
    t->add_sizes(3);
    t->add_sizes(5);
  }
  EXPECT_EQ(Check(guards, inputs), "");
  inputs.mutable_inputs(19999)->set_sizes(1, 6);
  EXPECT_EQ(Check(guards, inputs),
            "input 19999: size[1] is 6, guard expects s1 + 1 - 1 = 5 (s1 = 5)");
}

constexpr char kGraph[] = R"pb(
  name: "scale"
  inputs {
    kind: USER_INPUT
    value {
      name: "x"
      meta {
        dtype: FLOAT32
        sizes { int_value: 4 }
        sizes { int_value: 8 }
        strides { int_value: 8 }
        strides { int_value: 1 }
        device { type: "cpu" index: -1 }
      }
    }
  }
  inputs {
    kind: PARAMETER
    value {
      name: "w"
      meta {
        dtype: FLOAT32
        sizes { int_value: 8 }
        strides { int_value: 1 }
        device { type: "cpu" index: -1 }
        requires_grad: true
      }
    }
  }
  nodes {
    name: "mul"
    target: "aten.mul.Tensor"
    args { tensor: "x" }
    args { tensor: "w" }
    outputs {
      name: "out"
      meta {
        dtype: FLOAT32
        sizes { int_value: 4 }
        sizes { int_value: 8 }
        strides { int_value: 8 }
        strides { int_value: 1 }
        device { type: "cpu" index: -1 }
        requires_grad: true
      }
    }
  }
  outputs: "out"
)pb";

ir::Graph BuildGraph(const std::string& text) {
  absl::StatusOr<ir::Graph> g = ir::Graph::FromProto(Parse<v1::Graph>(text));
  EXPECT_TRUE(g.ok()) << g.status();
  return *std::move(g);
}

TEST(DeriveGuardsTest, GraphPassesItsOwnGuards) {
  const ir::Graph graph = BuildGraph(kGraph);
  const v1::GuardSet guards = DeriveGuards(graph);
  ASSERT_EQ(guards.tensors_size(), 2);
  const v1::TensorGuard& x = guards.tensors(0);
  EXPECT_EQ(x.name(), "x");
  EXPECT_EQ(x.dtype(), v1::FLOAT32);
  EXPECT_EQ(x.device().type(), "cpu");
  EXPECT_EQ(x.device().index(), -1);
  ASSERT_EQ(x.sizes_size(), 2);
  EXPECT_EQ(x.sizes(1).int_value(), 8);
  EXPECT_EQ(x.stride_check(), v1::TensorGuard::EXACT);
  ASSERT_EQ(x.strides_size(), 2);
  EXPECT_EQ(x.strides(0).int_value(), 8);
  EXPECT_TRUE(x.check_requires_grad());
  EXPECT_FALSE(x.requires_grad());
  EXPECT_EQ(guards.tensors(1).name(), "w");
  EXPECT_TRUE(guards.tensors(1).requires_grad());
  EXPECT_EQ(guards.shape_guards_size(), 0);
  EXPECT_TRUE(ValidateGuardSet(guards).ok());

  absl::StatusOr<v1::InputSignature> sig = SignatureFromGraph(graph);
  ASSERT_TRUE(sig.ok()) << sig.status();
  ASSERT_EQ(sig->inputs_size(), 2);
  EXPECT_EQ(sig->inputs(0).sizes_size(), 2);
  EXPECT_EQ(sig->inputs(0).strides(0), 8);
  EXPECT_TRUE(sig->inputs(1).requires_grad());
  EXPECT_EQ(Check(guards, *sig), "");

  v1::InputSignature changed = *sig;
  changed.mutable_inputs(0)->set_sizes(1, 9);
  EXPECT_EQ(Check(guards, changed), "input 0 'x': size[1] is 9, guard expects 8");
  changed = *sig;
  changed.mutable_inputs(1)->set_requires_grad(false);
  EXPECT_EQ(Check(guards, changed), "input 1 'w': requires_grad is false, guard expects true");
}

TEST(DeriveGuardsTest, SymbolicSizesBecomeSymbolGuards) {
  std::string text = kGraph;
  // x: [s0, 8]; w: [8]; out: [s0, 8].
  const std::string four = "sizes { int_value: 4 }";
  for (size_t at = text.find(four); at != std::string::npos; at = text.find(four)) {
    text.replace(at, four.size(), "sizes { expr: \"s0\" }");
  }
  const ir::Graph graph = BuildGraph(text);

  absl::StatusOr<v1::InputSignature> sig = SignatureFromGraph(graph);
  ASSERT_FALSE(sig.ok());
  EXPECT_EQ(sig.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sig.status().message(),
            "input 0 'x': size[0] is symbolic (s0); a signature needs concrete values");

  const v1::GuardSet guards = DeriveGuards(graph);
  EXPECT_EQ(guards.tensors(0).sizes(0).expr(), "s0");
  EXPECT_TRUE(ValidateGuardSet(guards).ok());
  auto inputs = Parse<v1::InputSignature>(R"pb(
    inputs {
      dtype: FLOAT32
      device { type: "cpu" index: -1 }
      sizes: [ 16, 8 ]
      strides: [ 8, 1 ]
    }
    inputs {
      dtype: FLOAT32
      device { type: "cpu" index: -1 }
      sizes: [ 8 ]
      strides: [ 1 ]
      requires_grad: true
    }
  )pb");
  EXPECT_EQ(Check(guards, inputs), "");
  inputs.mutable_inputs(0)->mutable_device()->set_index(0);
  EXPECT_EQ(Check(guards, inputs), "input 0 'x': device is cpu:0, guard expects cpu");
}

}  // namespace
}  // namespace kiln::cache
