#include "compiler/ir/schema.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "compiler/ir/verify.h"
#include "google/protobuf/text_format.h"

namespace kiln::ir {
namespace {

constexpr char kMeta[] =
    R"(meta { dtype: FLOAT32 sizes { int_value: 4 } sizes { int_value: 8 }
              strides { int_value: 8 } strides { int_value: 1 } device { type: "cpu" index: -1 } })";

std::string V(const std::string& name) { return "{ name: \"" + name + "\" " + kMeta + " }"; }

// A graph with inputs x, y, z and one node named `name` calling `target` with
// `args` (proto text: "args { tensor: \"x\" } kwargs { ... }") and producing
// `outputs` values o0, o1, ...; the graph returns o0.
v1::Graph OneNode(const std::string& name, const std::string& target, const std::string& args,
                  int outputs = 1) {
  std::string text;
  for (const char* in : {"x", "y", "z"}) text += std::string("inputs { value ") + V(in) + " }\n";
  text += "nodes { name: \"" + name + "\" target: \"" + target + "\" " + args;
  for (int i = 0; i < outputs; ++i) text += " outputs " + V("o" + std::to_string(i));
  text += " }\noutputs: \"o0\"\n";
  v1::Graph g;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &g)) << text;
  return g;
}

absl::Status BuildAndVerify(const v1::Graph& p) {
  auto g = Graph::FromProto(p);
  if (!g.ok()) return g.status();
  return Verify(*g);
}

// Short argument spellings for the cases below.
std::string T(const std::string& name) { return "args { tensor: \"" + name + "\" } "; }
std::string Arg(const std::string& kind) { return "args { " + kind + " } "; }
std::string Kw(const std::string& name, const std::string& kind) {
  return "kwargs { name: \"" + name + "\" " + kind + " } ";
}

TEST(SchemaTableTest, EveryEntryParses) {
  std::vector<std::string> targets = KnownTargets();
  ASSERT_FALSE(targets.empty());
  EXPECT_TRUE(std::is_sorted(targets.begin(), targets.end()));
  for (const std::string& target : targets) {
    const OpSchema* s = FindSchema(target);
    ASSERT_NE(s, nullptr) << target;
    EXPECT_EQ(s->target(), target);
    EXPECT_FALSE(s->name.empty()) << target;
    EXPECT_NE(s->overload, "default") << target;
    EXPECT_NE(s->num_returns, 0) << target;
    EXPECT_GE(s->num_returns, OpSchema::kListReturn) << target;
    EXPECT_FALSE(s->params.empty()) << target;
    std::set<std::string> names;
    bool seen_kwarg_only = false;
    for (const SchemaParam& p : s->params) {
      EXPECT_FALSE(p.name.empty()) << target;
      EXPECT_TRUE(names.insert(p.name).second) << target << " repeats " << p.name;
      // Keyword-only parameters come last, after the "*".
      if (seen_kwarg_only) {
        EXPECT_TRUE(p.kwarg_only) << target << " " << p.name;
      }
      seen_kwarg_only |= p.kwarg_only;
      // A printed type parses back to itself.
      auto again = ParseSchema("f(" + p.type.ToString() + " a) -> Tensor");
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_EQ(again->params[0].type.ToString(), p.type.ToString()) << target;
    }
  }
  EXPECT_EQ(FindSchema("aten.add.Tensor"), FindSchema("aten.add.Tensor"));
  EXPECT_EQ(FindSchema("aten.nonexistent.default"), nullptr);
}

TEST(SchemaTableTest, CoversTheCoreOps) {
  const std::vector<std::string> targets = KnownTargets();
  const std::set<std::string> known(targets.begin(), targets.end());
  for (const char* op : {"abs.default",
                         "neg.default",
                         "exp.default",
                         "log.default",
                         "log1p.default",
                         "expm1.default",
                         "sqrt.default",
                         "rsqrt.default",
                         "reciprocal.default",
                         "sin.default",
                         "cos.default",
                         "tanh.default",
                         "sigmoid.default",
                         "relu.default",
                         "gelu.default",
                         "silu.default",
                         "erf.default",
                         "sign.default",
                         "pow.Tensor_Scalar",
                         "pow.Tensor_Tensor",
                         "clamp.default",
                         "add.Tensor",
                         "add.Scalar",
                         "sub.Tensor",
                         "mul.Tensor",
                         "mul.Scalar",
                         "div.Tensor",
                         "div.Tensor_mode",
                         "div.Scalar",
                         "maximum.default",
                         "minimum.default",
                         "eq.Tensor",
                         "eq.Scalar",
                         "ne.Tensor",
                         "ne.Scalar",
                         "lt.Tensor",
                         "lt.Scalar",
                         "le.Tensor",
                         "le.Scalar",
                         "gt.Tensor",
                         "gt.Scalar",
                         "ge.Tensor",
                         "ge.Scalar",
                         "where.self",
                         "logical_and.default",
                         "logical_or.default",
                         "logical_not.default",
                         "_to_copy.default",
                         "clone.default",
                         "fill.Scalar",
                         "masked_fill.Scalar",
                         "sum.dim_IntList",
                         "sum.default",
                         "mean.dim",
                         "amax.default",
                         "amin.default",
                         "var.correction",
                         "var_mean.correction",
                         "argmax.default",
                         "prod.dim_int",
                         "_softmax.default",
                         "_log_softmax.default",
                         "native_layer_norm.default",
                         "native_batch_norm.default",
                         "_native_batch_norm_legit_functional.default",
                         "_native_batch_norm_legit_no_training.default",
                         "nll_loss_forward.default",
                         "native_dropout.default",
                         "view.default",
                         "_unsafe_view.default",
                         "permute.default",
                         "expand.default",
                         "squeeze.dim",
                         "squeeze.dims",
                         "unsqueeze.default",
                         "slice.Tensor",
                         "select.int",
                         "split_with_sizes.default",
                         "cat.default",
                         "as_strided.default",
                         "alias.default",
                         "t.default",
                         "transpose.int",
                         "full.default",
                         "full_like.default",
                         "zeros_like.default",
                         "ones_like.default",
                         "arange.start_step",
                         "arange.default",
                         "scalar_tensor.default",
                         "empty_strided.default",
                         "mm.default",
                         "bmm.default",
                         "addmm.default",
                         "convolution.default",
                         "max_pool2d_with_indices.default",
                         "avg_pool2d.default",
                         "embedding.default",
                         "threshold_backward.default",
                         "gelu_backward.default",
                         "tanh_backward.default",
                         "sigmoid_backward.default",
                         "_softmax_backward_data.default",
                         "_log_softmax_backward_data.default",
                         "native_layer_norm_backward.default",
                         "native_batch_norm_backward.default",
                         "convolution_backward.default",
                         "max_pool2d_with_indices_backward.default",
                         "avg_pool2d_backward.default",
                         "embedding_dense_backward.default",
                         "native_dropout_backward.default",
                         "nll_loss_backward.default",
                         "rsub.Scalar",
                         "detach.default",
                         "lift_fresh_copy.default",
                         "new_zeros.default",
                         "index.Tensor"}) {
    EXPECT_TRUE(known.count(std::string("aten.") + op)) << op;
  }
}

TEST(SchemaParseTest, ReadsTypesDefaultsMarkersAndReturns) {
  const OpSchema* add = FindSchema("aten.add.Tensor");
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(add->name, "add");
  EXPECT_EQ(add->overload, "Tensor");
  ASSERT_EQ(add->params.size(), 3u);
  EXPECT_EQ(add->num_positional(), 2);
  EXPECT_EQ(add->params[2].name, "alpha");
  EXPECT_TRUE(add->params[2].kwarg_only);
  EXPECT_EQ(add->params[2].type.base, SchemaType::Base::kScalar);
  EXPECT_EQ(add->params[2].default_value, "1");
  EXPECT_FALSE(add->params[2].required());
  EXPECT_TRUE(add->params[1].required());
  EXPECT_EQ(add->num_returns, 1);

  const OpSchema* ln = FindSchema("aten.native_layer_norm.default");
  ASSERT_NE(ln, nullptr);
  EXPECT_EQ(ln->overload, "");
  EXPECT_EQ(ln->num_returns, 3);
  EXPECT_EQ(ln->params[1].type.ToString(), "SymInt[]");
  EXPECT_TRUE(ln->params[2].type.optional);
  EXPECT_FALSE(ln->params[2].required());
  EXPECT_EQ(ln->params[4].type.base, SchemaType::Base::kFloat);

  const OpSchema* split = FindSchema("aten.split_with_sizes.default");
  ASSERT_NE(split, nullptr);
  EXPECT_EQ(split->params[0].name, "self");  // "Tensor(a -> *) self": the alias is dropped
  EXPECT_EQ(split->params[0].type.ToString(), "Tensor");
  EXPECT_EQ(split->params[2].default_value, "0");
  EXPECT_EQ(split->num_returns, OpSchema::kListReturn);

  const OpSchema* sum = FindSchema("aten.sum.dim_IntList");
  ASSERT_NE(sum, nullptr);
  EXPECT_EQ(sum->params[1].type.ToString(), "int[1]?");
  EXPECT_EQ(sum->params[1].type.list_size, 1);
  EXPECT_TRUE(sum->params[1].type.optional);

  const OpSchema* index = FindSchema("aten.index.Tensor");
  ASSERT_NE(index, nullptr);
  EXPECT_TRUE(index->params[1].type.element_optional);
  EXPECT_FALSE(index->params[1].type.optional);
  EXPECT_EQ(index->params[1].type.ToString(), "Tensor?[]");

  const OpSchema* bn = FindSchema("aten._native_batch_norm_legit_functional.default");
  ASSERT_NE(bn, nullptr);
  EXPECT_EQ(bn->num_returns, 5);  // two of them named

  const OpSchema* gelu = FindSchema("aten.gelu.default");
  ASSERT_NE(gelu, nullptr);
  EXPECT_EQ(gelu->params[1].default_value, "'none'");

  auto parsed = ParseSchema(
      "aten::foo.bar(Tensor(a!) self, Tensor(b!)? out, int[2] k=[1, 1], str s=\"a, b\") -> ()");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->target(), "aten.foo.bar");
  ASSERT_EQ(parsed->params.size(), 4u);
  EXPECT_TRUE(parsed->params[1].type.optional);
  EXPECT_EQ(parsed->params[2].default_value, "[1, 1]");
  EXPECT_EQ(parsed->params[3].default_value, "\"a, b\"");
  EXPECT_EQ(parsed->num_returns, 0);
}

TEST(SchemaParseTest, RejectsMalformedSchemas) {
  for (const char* bad : {
           "",
           "add(Tensor self",                          // unbalanced
           "add(Tensor self) Tensor",                  // no arrow
           "add(Tensor) -> Tensor",                    // no parameter name
           "add(Blob self) -> Tensor",                 // unknown type
           "add(Tensor self, Tensor self) -> Tensor",  // repeated name
           "add(Tensor self, *, *, int a) -> Tensor",  // two markers
           "add(Tensor self, int a=) -> Tensor",       // empty default
           "add(int[x] a) -> Tensor",                  // bad list size
           "add(int?[] a) -> Tensor",                  // optional elements outside Tensor lists
           "add.default(Tensor self) -> Tensor",       // "default" is no overload name
           "sym_size.int(Tensor self, int dim) -> SymInt",  // non-Tensor return
           "f(Tensor self) -> (Tensor[], Tensor)",          // list inside a tuple
       }) {
    auto s = ParseSchema(bad);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
  }
}

TEST(CheckArgumentsTest, BadNodesNameTheNodeAndArgument) {
  struct Case {
    std::string name;
    std::string target;
    std::string args;
    int outputs;
    std::string expect;
  };
  const std::string xy = T("x") + T("y");
  const std::vector<Case> cases = {
      {"add_1", "aten.add.Tensor", xy + Kw("alpah", "int_value: 2"), 1,
       "node 'add_1': aten.add.Tensor has no argument 'alpah'"},
      {"add_1", "aten.add.Tensor", T("x") + Arg("none {}"), 1,
       "node 'add_1' argument 1 'other': aten.add.Tensor takes Tensor, got None"},
      {"add_1", "aten.add.Tensor", xy + Kw("alpha", "string_value: \"two\""), 1,
       "node 'add_1' argument 'alpha': aten.add.Tensor takes Scalar, got a string"},
      {"add_1", "aten.add.Tensor", xy + Arg("int_value: 1"), 1,  // alpha is keyword-only
       "node 'add_1': aten.add.Tensor takes 2 positional arguments, got 3"},
      {"relu", "aten.relu.default", xy, 1,
       "node 'relu': aten.relu.default takes 1 positional argument, got 2"},
      {"add_1", "aten.add.Tensor", xy + Kw("other", "tensor: \"z\""), 1,
       "node 'add_1': aten.add.Tensor argument 'other' is given twice"},
      {"add_1", "aten.add.Tensor", xy + Kw("alpha", "int_value: 1") + Kw("alpha", "int_value: 2"),
       1, "node 'add_1': aten.add.Tensor argument 'alpha' is given twice"},
      {"add_1", "aten.add.Tensor", T("x"), 1,
       "node 'add_1': aten.add.Tensor is missing required argument 1 'other' (Tensor)"},
      {"add_1", "aten.add.Tensor", xy, 2,
       "node 'add_1': aten.add.Tensor returns 1 tensor, node has 2 outputs"},
      {"ln", "aten.native_layer_norm.default",
       T("x") + Arg("ints { values: 8 }") + T("y") + T("z") + Arg("float_value: 1e-5"), 1,
       "node 'ln': aten.native_layer_norm.default returns 3 tensors, node has 1 output"},
      {"ln", "aten.native_layer_norm.default",
       T("x") + Arg("ints { values: 8 }") + Arg("int_value: 0") + T("z") + Arg("float_value: 1e-5"),
       3,
       "node 'ln' argument 2 'weight': aten.native_layer_norm.default takes Tensor?, got an int"},
      {"ln", "aten.native_layer_norm.default", T("x") + Arg("ints { values: 8 }") + T("y") + T("z"),
       3, "node 'ln': aten.native_layer_norm.default is missing required argument 4 'eps' (float)"},
      {"ln", "aten.native_layer_norm.default",
       T("x") + Arg("floats { values: 8 }") + T("y") + T("z") + Arg("float_value: 1e-5"), 3,
       "node 'ln' argument 1 'normalized_shape': aten.native_layer_norm.default takes SymInt[], "
       "got a float list"},
      {"sm", "aten._softmax.default", T("x") + Arg("float_value: 1") + Arg("bool_value: false"), 1,
       "node 'sm' argument 1 'dim': aten._softmax.default takes int, got a float"},
      {"sm", "aten._softmax.default", T("x") + Arg("int_value: 1") + Arg("int_value: 0"), 1,
       "node 'sm' argument 2 'half_to_float': aten._softmax.default takes bool, got an int"},
      {"smb", "aten._softmax_backward_data.default", xy + Arg("int_value: 1"), 1,
       "node 'smb': aten._softmax_backward_data.default is missing required argument 3 "
       "'input_dtype' (ScalarType)"},
      {"cp", "aten._to_copy.default", T("x") + Kw("dtype", "int_value: 6"), 1,
       "node 'cp' argument 'dtype': aten._to_copy.default takes ScalarType?, got an int"},
      {"cp", "aten._to_copy.default", T("x") + Kw("device", "string_value: \"cuda\""), 1,
       "node 'cp' argument 'device': aten._to_copy.default takes Device?, got a string"},
      {"cp", "aten._to_copy.default", T("x") + Kw("memory_format", "layout: STRIDED"), 1,
       "node 'cp' argument 'memory_format': aten._to_copy.default takes MemoryFormat?, got a "
       "layout"},
      {"cat", "aten.cat.default", Arg("tensors { names: \"x\" names: \"\" }"), 1,
       "node 'cat' argument 0 'tensors': aten.cat.default takes Tensor[], got a tensor list with "
       "None"},
      {"cat", "aten.cat.default", T("x"), 1,
       "node 'cat' argument 0 'tensors': aten.cat.default takes Tensor[], got a tensor"},
      {"idx", "aten.index.Tensor", T("x") + T("y"), 1,
       "node 'idx' argument 1 'indices': aten.index.Tensor takes Tensor?[], got a tensor"},
      {"perm", "aten.permute.default", T("x") + Arg("floats { values: 1 values: 0 }"), 1,
       "node 'perm' argument 1 'dims': aten.permute.default takes int[], got a float list"},
      {"perm", "aten.permute.default", T("x") + Arg("int_value: 1"), 1,
       "node 'perm' argument 1 'dims': aten.permute.default takes int[], got an int"},
      {"lnb", "aten.native_layer_norm_backward.default",
       T("x") + T("y") + Arg("ints { values: 8 }") + T("z") + T("z") + T("y") + T("y") +
           Arg("ints { values: 1 values: 1 values: 1 }"),
       3,
       "node 'lnb' argument 7 'output_mask': aten.native_layer_norm_backward.default takes "
       "bool[3], "
       "got an int list"},
      {"g", "aten.gelu.default", T("x") + Kw("approximate", "int_value: 0"), 1,
       "node 'g' argument 'approximate': aten.gelu.default takes str, got an int"},
      {"b", "aten.bernoulli.p", T("x") + Kw("generator", "int_value: 0"), 1,
       "node 'b' argument 'generator': aten.bernoulli.p takes Generator?, got an int"},
      {"full", "aten.full.default", Arg("sym_ints { values { expr: \"s0\" } }") + T("x"), 1,
       "node 'full' argument 1 'fill_value': aten.full.default takes Scalar, got a tensor"},
      {"split", "aten.split_with_sizes.default",
       T("x") + Arg("ints { values: 2 values: 2 }") + Arg("sym_int { expr: \"s0\" }") +
           Arg("int_value: 0"),
       2, "node 'split': aten.split_with_sizes.default takes 3 positional arguments, got 4"},
  };
  for (const Case& c : cases) {
    absl::Status s = BuildAndVerify(OneNode(c.name, c.target, c.args, c.outputs));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.target << ": " << s;
    EXPECT_EQ(s.message(), c.expect) << c.target;
  }
}

TEST(CheckArgumentsTest, GoodNodesPass) {
  const std::string xy = T("x") + T("y");
  const std::string ln_args = Arg("sym_ints { values { expr: \"s0\" } values { int_value: 8 } }");
  struct Case {
    std::string target;
    std::string args;
    int outputs;
  };
  const std::vector<Case> cases = {
      {"aten.add.Tensor", xy + Kw("alpha", "int_value: 2"), 1},
      {"aten.add.Tensor", xy + Kw("alpha", "float_value: 0.5"), 1},
      {"aten.add.Tensor", T("x") + Kw("other", "tensor: \"y\""), 1},
      {"aten.add.Scalar", T("x") + Arg("sym_int { expr: \"s0\" }") + Arg("bool_value: true"), 1},
      {"aten.native_layer_norm.default",
       T("x") + ln_args + Arg("none {}") + T("z") + Arg("float_value: 1e-5"), 3},
      {"aten.native_layer_norm.default",
       T("x") + Arg("ints { values: 8 }") + T("y") + T("z") + Arg("int_value: 0"),
       3},  // float takes an int
      {"aten.split_with_sizes.default", T("x") + Arg("ints { values: 1 values: 1 values: 2 }"), 3},
      {"aten.split_with_sizes.default",
       T("x") + Arg("ints { values: 4 }") + Kw("dim", "int_value: 0"), 1},
      {"aten.sum.dim_IntList", T("x") + Arg("ints { values: 0 values: 1 }"), 1},
      {"aten.sum.dim_IntList",
       T("x") + Arg("ints { values: 1 }") + Arg("bool_value: true") + Kw("dtype", "dtype: FLOAT64"),
       1},
      {"aten.sum.dim_IntList", T("x") + Arg("none {}"), 1},
      {"aten.sum.dim_IntList", T("x") + Arg("int_value: 1"), 1},  // int[1] takes a single int
      {"aten.amax.default", T("x") + Arg("ints {}"), 1},
      {"aten.amax.default", T("x") + Arg("sym_ints {}"), 1},  // an empty list of any kind
      {"aten.div.Tensor_mode", xy, 1},  // optional without a default may be left out
      {"aten.div.Tensor_mode", xy + Kw("rounding_mode", "string_value: \"floor\""), 1},
      {"aten.div.Tensor_mode", xy + Kw("rounding_mode", "none {}"), 1},
      {"aten.clamp.default", T("x") + Arg("float_value: 0"), 1},
      {"aten.clamp.default", T("x") + Kw("max", "int_value: 6"), 1},
      {"aten._to_copy.default",
       T("x") + Kw("dtype", "dtype: FLOAT16") + Kw("layout", "layout: STRIDED") +
           Kw("device", "device { type: \"cuda\" index: 0 }") +
           Kw("memory_format", "memory_format: CHANNELS_LAST") + Kw("pin_memory", "none {}"),
       1},
      {"aten.index.Tensor", T("x") + Arg("tensors { names: \"\" names: \"y\" }"), 1},
      {"aten.cat.default", Arg("tensors { names: \"x\" names: \"y\" }") + Kw("dim", "int_value: 1"),
       1},
      {"aten.max_pool2d_with_indices.default", T("x") + Arg("int_value: 2"), 2},
      {"aten.max_pool2d_with_indices.default",
       T("x") + Arg("ints { values: 3 values: 3 }") + Arg("ints { values: 2 values: 2 }") +
           Arg("sym_ints { values { int_value: 1 } values { int_value: 1 } }"),
       2},
      {"aten.full.default",
       Arg("sym_ints { values { expr: \"s0\" } values { int_value: 4 } }") + Arg("float_value: 0") +
           Kw("dtype", "dtype: FLOAT32") + Kw("device", "device { type: \"cpu\" index: -1 }"),
       1},
      {"aten.slice.Tensor",
       T("x") + Arg("int_value: 0") + Arg("int_value: 0") + Arg("sym_int { expr: \"s0\" }"), 1},
      {"aten.var.correction",
       T("x") + Arg("ints { values: 1 }") + Kw("correction", "int_value: 0") +
           Kw("keepdim", "bool_value: true"),
       1},
      {"aten.native_dropout.default", T("x") + Arg("float_value: 0.1") + Arg("bool_value: true"),
       2},
      {"aten.bernoulli.p", T("x") + Kw("generator", "none {}"), 1},
      {"aten._softmax_backward_data.default", xy + Arg("int_value: -1") + Arg("dtype: FLOAT32"), 1},
      {"aten.convolution_backward.default",
       T("x") + T("y") + T("z") + Arg("none {}") + Arg("ints { values: 1 values: 1 }") +
           Arg("ints { values: 0 values: 0 }") + Arg("ints { values: 1 values: 1 }") +
           Arg("bool_value: false") + Arg("ints { values: 0 values: 0 }") + Arg("int_value: 1") +
           Arg("bools { values: true values: true values: false }"),
       3},
      // Targets outside the table are not checked.
      {"aten.not_in_the_table.default", Arg("string_value: \"anything\"") + Kw("q", "none {}"), 4},
      {"custom.op.default", T("x"), 2},
  };
  for (const Case& c : cases) {
    absl::Status s = BuildAndVerify(OneNode("n", c.target, c.args, c.outputs));
    EXPECT_TRUE(s.ok()) << c.target << " " << c.args << ": " << s;
  }
}

}  // namespace
}  // namespace kiln::ir
