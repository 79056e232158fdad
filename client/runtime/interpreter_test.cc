// Tests of the reference interpreter: each graph runs on fresh random inputs
// and is compared with the same computation written directly with ATen ops.
#include "client/runtime/interpreter.h"

#include <ATen/ops/batch_norm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "compiler/ir/builder.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/v1/service.pb.h"

namespace kiln::runtime {
namespace {

using ir::Argument;
using ir::Bool;
using ir::Float;
using ir::GraphBuilder;
using ir::Int;
using ir::Ints;
using ir::Kwarg;
using ir::Ref;
using ir::ValueId;
using ::testing::AllOf;
using ::testing::HasSubstr;

ir::TensorMeta Meta(std::vector<int64_t> sizes, v1::DType dtype = v1::FLOAT32) {
  return ir::ContiguousMeta(sizes, dtype);
}

Argument Str(std::string s) { return Argument{"", std::move(s)}; }
Argument Refs(std::vector<ValueId> vs) { return Argument{"", std::move(vs)}; }
Argument Dtype(v1::DType d) { return Argument{"", d}; }

bool Close(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         a.allclose(b, /*rtol=*/1e-5, /*atol=*/1e-6);
}

// Runs `graph` and expects it to succeed.
std::vector<at::Tensor> MustRun(const ir::Graph& graph, const std::vector<at::Tensor>& inputs) {
  absl::StatusOr<std::vector<at::Tensor>> out = RunGraph(graph, inputs);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *std::move(out) : std::vector<at::Tensor>{};
}

TEST(InterpreterTest, AddWithAlphaFromIntAndFloat) {
  for (Argument alpha : {Int(2), Float(0.5)}) {
    GraphBuilder b("add");
    ValueId x = b.AddInput(Meta({3, 4}));
    ValueId y = b.AddInput(Meta({3, 4}));
    ValueId out =
        b.AddNode("aten.add.Tensor", {Ref(x), Ref(y)}, {Kwarg("alpha", alpha)}, {Meta({3, 4})})[0];
    b.AddOutput(out);
    at::Tensor tx = at::randn({3, 4});
    at::Tensor ty = at::randn({3, 4});
    std::vector<at::Tensor> got = MustRun(std::move(b).Build(), {tx, ty});
    ASSERT_EQ(got.size(), 1u);
    const double a = std::holds_alternative<int64_t>(alpha.kind) ? 2.0 : 0.5;
    EXPECT_TRUE(Close(got[0], tx.add(ty, a)));
  }
}

TEST(InterpreterTest, Mm) {
  GraphBuilder b;
  ValueId x = b.AddInput(Meta({5, 3}));
  ValueId y = b.AddInput(Meta({3, 7}));
  b.AddOutput(b.AddNode("aten.mm.default", {Ref(x), Ref(y)}, {}, {Meta({5, 7})}, "mm")[0]);
  at::Tensor tx = at::randn({5, 3});
  at::Tensor ty = at::randn({3, 7});
  std::vector<at::Tensor> got = MustRun(std::move(b).Build(), {tx, ty});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(Close(got[0], tx.mm(ty)));
}

TEST(InterpreterTest, NativeLayerNormHasThreeOutputs) {
  GraphBuilder b;
  ValueId x = b.AddInput(Meta({4, 8}));
  ValueId w = b.AddInput(Meta({8}));
  ValueId bias = b.AddInput(Meta({8}));
  std::vector<ValueId> outs = b.AddNode("aten.native_layer_norm.default",
                                        {Ref(x), Ints({8}), Ref(w), Ref(bias), Float(1e-5)}, {},
                                        {Meta({4, 8}), Meta({4, 1}), Meta({4, 1})});
  ASSERT_EQ(outs.size(), 3u);
  b.AddOutput(outs[0]);
  at::Tensor tx = at::randn({4, 8});
  at::Tensor tw = at::randn({8});
  at::Tensor tb = at::randn({8});
  std::vector<at::Tensor> got = MustRun(std::move(b).Build(), {tx, tw, tb});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(Close(got[0], at::layer_norm(tx, {8}, tw, tb, 1e-5)));
}

TEST(InterpreterTest, SplitWithSizesReturnsAList) {
  GraphBuilder b;
  ValueId x = b.AddInput(Meta({6, 4}));
  std::vector<ValueId> parts = b.AddNode("aten.split_with_sizes.default", {Ref(x), Ints({2, 4})},
                                         {}, {Meta({2, 4}), Meta({4, 4})});
  b.AddOutput(parts[1]);
  b.AddOutput(parts[0]);
  at::Tensor tx = at::randn({6, 4});
  std::vector<at::Tensor> got = MustRun(std::move(b).Build(), {tx});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(Close(got[0], tx.narrow(0, 2, 4)));
  EXPECT_TRUE(Close(got[1], tx.narrow(0, 0, 2)));
}

TEST(InterpreterTest, CatTakesATensorList) {
  GraphBuilder b;
  ValueId x = b.AddInput(Meta({2, 3}));
  ValueId y = b.AddInput(Meta({2, 5}));
  b.AddOutput(b.AddNode("aten.cat.default", {Refs({x, y, x}), Int(1)}, {}, {Meta({2, 11})})[0]);
  at::Tensor tx = at::randn({2, 3});
  at::Tensor ty = at::randn({2, 5});
  std::vector<at::Tensor> got = MustRun(std::move(b).Build(), {tx, ty});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(Close(got[0], at::cat({tx, ty, tx}, 1)));
}

TEST(InterpreterTest, IndexTakesOptionalTensors) {
  GraphBuilder b;
  ValueId x = b.AddInput(Meta({3, 5}));
  ValueId idx = b.AddInput(Meta({4}, v1::INT64));
  b.AddOutput(
      b.AddNode("aten.index.Tensor", {Ref(x), Refs({ir::kNoValue, idx})}, {}, {Meta({3, 4})})[0]);
  at::Tensor tx = at::randn({3, 5});
  at::Tensor tidx = at::rand({4}).mul(5).to(at::kLong);
  std::vector<at::Tensor> got = MustRun(std::move(b).Build(), {tx, tidx});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(Close(got[0], tx.index_select(1, tidx)));
}

TEST(InterpreterTest, ToCopyWithDtypeKwarg) {
  GraphBuilder b;
  ValueId x = b.AddInput(Meta({3, 4}));
  b.AddOutput(b.AddNode("aten._to_copy.default", {Ref(x)}, {Kwarg("dtype", Dtype(v1::FLOAT64))},
                        {Meta({3, 4}, v1::FLOAT64)})[0]);
  at::Tensor tx = at::randn({3, 4});
  std::vector<at::Tensor> got = MustRun(std::move(b).Build(), {tx});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].scalar_type(), at::kDouble);
  EXPECT_TRUE(Close(got[0], tx.to(at::kDouble)));
}

TEST(InterpreterTest, SumDimUsesKeepdimDefault) {
  GraphBuilder b;
  ValueId x = b.AddInput(Meta({3, 4}));
  // An int[1] parameter takes a list, or a single int broadcast to it.
  b.AddOutput(b.AddNode("aten.sum.dim_IntList", {Ref(x), Ints({1})}, {}, {Meta({3})})[0]);
  b.AddOutput(
      b.AddNode("aten.sum.dim_IntList", {Ref(x), Int(0), Bool(true)}, {}, {Meta({1, 4})})[0]);
  at::Tensor tx = at::randn({3, 4});
  std::vector<at::Tensor> got = MustRun(std::move(b).Build(), {tx});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].sizes(), at::IntArrayRef({3}));
  EXPECT_TRUE(Close(got[0], tx.sum({1})));
  EXPECT_TRUE(Close(got[1], tx.sum({0}, /*keepdim=*/true)));
}

TEST(InterpreterTest, WhereSelf) {
  GraphBuilder b;
  ValueId c = b.AddInput(Meta({3, 4}, v1::BOOL));
  ValueId x = b.AddInput(Meta({3, 4}));
  ValueId y = b.AddInput(Meta({3, 4}));
  b.AddOutput(b.AddNode("aten.where.self", {Ref(c), Ref(x), Ref(y)}, {}, {Meta({3, 4})})[0]);
  at::Tensor tx = at::randn({3, 4});
  at::Tensor ty = at::randn({3, 4});
  at::Tensor tc = at::randn({3, 4}).gt(0);
  std::vector<at::Tensor> got = MustRun(std::move(b).Build(), {tc, tx, ty});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(Close(got[0], at::where(tc, tx, ty)));
}

TEST(InterpreterTest, Softmax) {
  GraphBuilder b;
  ValueId x = b.AddInput(Meta({3, 4}));
  b.AddOutput(
      b.AddNode("aten._softmax.default", {Ref(x), Int(-1), Bool(false)}, {}, {Meta({3, 4})})[0]);
  at::Tensor tx = at::randn({3, 4});
  std::vector<at::Tensor> got = MustRun(std::move(b).Build(), {tx});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(Close(got[0], tx.softmax(-1)));
}

TEST(InterpreterTest, GeluDefaultAndTanh) {
  GraphBuilder b;
  ValueId x = b.AddInput(Meta({16}));
  b.AddOutput(b.AddNode("aten.gelu.default", {Ref(x)}, {}, {Meta({16})})[0]);
  b.AddOutput(b.AddNode("aten.gelu.default", {Ref(x)}, {Kwarg("approximate", Str("tanh"))},
                        {Meta({16})})[0]);
  at::Tensor tx = at::randn({16}).mul(3);
  std::vector<at::Tensor> got = MustRun(std::move(b).Build(), {tx});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(Close(got[0], at::gelu(tx)));
  EXPECT_TRUE(Close(got[1], at::gelu(tx, "tanh")));
  EXPECT_FALSE(got[0].equal(got[1]));
}

TEST(InterpreterTest, NativeDropoutInTrainMode) {
  GraphBuilder b;
  ValueId x = b.AddInput(Meta({64, 64}));
  std::vector<ValueId> outs =
      b.AddNode("aten.native_dropout.default", {Ref(x), Float(0.25), Bool(true)}, {},
                {Meta({64, 64}), Meta({64, 64}, v1::BOOL)});
  b.AddOutput(outs[0]);
  b.AddOutput(outs[1]);
  at::Tensor tx = at::randn({64, 64});
  std::vector<at::Tensor> got = MustRun(std::move(b).Build(), {tx});
  ASSERT_EQ(got.size(), 2u);
  const at::Tensor& out = got[0];
  const at::Tensor& mask = got[1];
  EXPECT_EQ(mask.scalar_type(), at::kBool);
  EXPECT_TRUE(Close(out, tx.mul(mask).div(0.75)));
  // Some dropped, most kept (p = 0.25 over 4096 elements).
  const double kept = mask.to(at::kDouble).mean().item<double>();
  EXPECT_GT(kept, 0.6);
  EXPECT_LT(kept, 0.9);
}

TEST(InterpreterTest, ValuesLiveUntilTheirLastUse) {
  GraphBuilder b;
  ValueId x = b.AddInput(Meta({4}));
  ValueId r = b.AddNode("aten.relu.default", {Ref(x)}, {}, {Meta({4})})[0];
  ValueId s = b.AddNode("aten.add.Tensor", {Ref(r), Ref(r)}, {}, {Meta({4})})[0];
  ValueId n = b.AddNode("aten.neg.default", {Ref(x)}, {}, {Meta({4})})[0];  // read by nothing
  (void)n;
  ValueId m = b.AddNode("aten.mul.Tensor", {Ref(r), Ref(s)}, {}, {Meta({4})})[0];
  b.AddOutput(m);
  b.AddOutput(r);
  b.AddOutput(x);
  b.AddOutput(m);
  absl::StatusOr<std::unique_ptr<Interpreter>> interp = Interpreter::Create(std::move(b).Build());
  ASSERT_TRUE(interp.ok()) << interp.status();
  for (int run = 0; run < 2; ++run) {
    at::Tensor tx = at::randn({4});
    absl::StatusOr<std::vector<at::Tensor>> got = (*interp)->Run({tx});
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), 4u);
    at::Tensor tr = tx.relu();
    EXPECT_TRUE(Close((*got)[0], tr.mul(tr.add(tr))));
    EXPECT_TRUE(Close((*got)[1], tr));
    EXPECT_TRUE((*got)[2].is_same(tx));
    EXPECT_TRUE((*got)[3].is_same((*got)[0]));
  }
}

// --- The captured graphs of tests/data/graphs -------------------------------

ir::Graph LoadGraphFile(const std::string& name) {
  const std::string path = std::string(KILN_SOURCE_DIR) + "/tests/data/graphs/" + name + ".json";
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  v1::GraphFile file;
  const auto parsed = google::protobuf::util::JsonStringToMessage(text.str(), &file);
  EXPECT_TRUE(parsed.ok()) << path << ": " << parsed.ToString();
  absl::StatusOr<ir::Graph> graph = ir::Graph::FromProto(file.graph());
  EXPECT_TRUE(graph.ok()) << path << ": " << graph.status();
  return graph.ok() ? *std::move(graph) : ir::Graph();
}

// Random inputs of the graph's declared shapes and dtypes, by name. Buffers
// are positive (running variances); integer inputs are zero.
struct Inputs {
  std::vector<at::Tensor> list;
  std::map<std::string, at::Tensor> by_name;
};

Inputs RandomInputs(const ir::Graph& graph, bool honour_requires_grad = false) {
  Inputs inputs;
  for (const ir::Input& input : graph.inputs()) {
    const ir::Value& value = graph.value(input.value);
    std::vector<int64_t> sizes;
    for (const ir::SymInt& s : value.meta.sizes) sizes.push_back(s.constant());
    at::Tensor t;
    if (value.meta.dtype == v1::INT64) {
      t = at::zeros(sizes, at::kLong);
    } else if (input.kind == v1::Placeholder::BUFFER) {
      t = at::rand(sizes).add(0.5);
    } else {
      t = at::randn(sizes);
    }
    if (honour_requires_grad && value.meta.requires_grad) t.requires_grad_(true);
    inputs.list.push_back(t);
    inputs.by_name[value.name] = t;
  }
  return inputs;
}

at::Tensor Mlp(const std::map<std::string, at::Tensor>& in) {
  at::Tensor h = in.at("fc1_bias").addmm(in.at("x"), in.at("fc1_weight").t());
  h = at::layer_norm(h, {64}, in.at("norm_weight"), in.at("norm_bias"), 1e-5);
  h = at::gelu(h);
  return in.at("fc2_bias").addmm(h, in.at("fc2_weight").t());
}

TEST(InterpreterGraphFileTest, Mlp) {
  ir::Graph graph = LoadGraphFile("mlp");
  Inputs in = RandomInputs(graph);
  std::vector<at::Tensor> got = MustRun(graph, in.list);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(Close(got[0], Mlp(in.by_name)));
}

TEST(InterpreterGraphFileTest, RmsNorm) {
  ir::Graph graph = LoadGraphFile("rmsnorm");
  Inputs in = RandomInputs(graph);
  std::vector<at::Tensor> got = MustRun(graph, in.list);
  ASSERT_EQ(got.size(), 1u);
  const at::Tensor& x = in.by_name.at("x");
  at::Tensor want =
      x.mul(x.pow(2).mean({-1}, /*keepdim=*/true).add(1e-6).rsqrt()).mul(in.by_name.at("weight"));
  EXPECT_TRUE(Close(got[0], want));
}

TEST(InterpreterGraphFileTest, Attention) {
  ir::Graph graph = LoadGraphFile("attention");
  Inputs in = RandomInputs(graph);
  std::vector<at::Tensor> got = MustRun(graph, in.list);
  ASSERT_EQ(got.size(), 1u);
  const at::Tensor& q = in.by_name.at("q");
  const at::Tensor& k = in.by_name.at("k");
  const at::Tensor& v = in.by_name.at("v");
  at::Tensor want = q.bmm(k.transpose(1, 2)).div(std::sqrt(32.0)).softmax(-1).bmm(v);
  EXPECT_TRUE(Close(got[0], want));
}

TEST(InterpreterGraphFileTest, ConvBlock) {
  ir::Graph graph = LoadGraphFile("conv_block");
  Inputs in = RandomInputs(graph);
  std::vector<at::Tensor> got = MustRun(graph, in.list);
  ASSERT_EQ(got.size(), 1u);
  const auto& t = in.by_name;
  at::Tensor conv = at::convolution(t.at("x"), t.at("conv_weight"), t.at("conv_bias"), {1, 1},
                                    {1, 1}, {1, 1}, false, {0, 0}, 1);
  at::Tensor want = at::batch_norm(conv, t.at("bn_weight"), t.at("bn_bias"),
                                   t.at("bn_running_mean"), t.at("bn_running_var"),
                                   /*training=*/false, 0.1, 1e-5, /*cudnn_enabled=*/false)
                        .relu();
  EXPECT_TRUE(Close(got[0], want));
}

TEST(InterpreterGraphFileTest, InputsRequiringGradGiveOutputsWithGradFn) {
  ir::Graph graph = LoadGraphFile("mlp");
  Inputs in = RandomInputs(graph, /*honour_requires_grad=*/true);
  ASSERT_TRUE(in.by_name.at("fc1_weight").requires_grad());
  std::vector<at::Tensor> got = MustRun(graph, in.list);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].requires_grad());
  EXPECT_NE(got[0].grad_fn(), nullptr);

  // The gradients match those of the same computation in ATen.
  got[0].sum().backward();
  std::map<std::string, at::Tensor> ref;
  for (const auto& [name, t] : in.by_name) {
    ref[name] = t.detach().clone().requires_grad_(t.requires_grad());
  }
  Mlp(ref).sum().backward();
  for (const char* name : {"fc1_weight", "fc1_bias", "norm_weight", "fc2_weight"}) {
    ASSERT_TRUE(in.by_name.at(name).grad().defined()) << name;
    EXPECT_TRUE(Close(in.by_name.at(name).grad(), ref.at(name).grad())) << name;
  }
  EXPECT_FALSE(in.by_name.at("x").grad().defined());
}

// --- Errors ---------------------------------------------------------------

TEST(InterpreterErrorTest, UnknownOperatorIsNotFound) {
  GraphBuilder b;
  ValueId x = b.AddInput(Meta({3}));
  b.AddOutput(b.AddNode("aten.no_such_op.default", {Ref(x)}, {}, {Meta({3})}, "bogus")[0]);
  absl::StatusOr<std::unique_ptr<Interpreter>> interp = Interpreter::Create(std::move(b).Build());
  EXPECT_EQ(interp.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(interp.status().message(),
              AllOf(HasSubstr("'bogus'"), HasSubstr("aten.no_such_op.default")));
}

TEST(InterpreterErrorTest, UnknownOverloadIsNotFound) {
  GraphBuilder b;
  ValueId x = b.AddInput(Meta({3}));
  b.AddOutput(b.AddNode("aten.add.NoSuchOverload", {Ref(x), Ref(x)}, {}, {Meta({3})}, "a")[0]);
  EXPECT_EQ(RunGraph(std::move(b).Build(), {at::randn({3})}).status().code(),
            absl::StatusCode::kNotFound);
}

ir::Graph MmGraph() {
  GraphBuilder b;
  ValueId x = b.AddInput(Meta({2, 3}));
  ValueId y = b.AddInput(Meta({3, 4}));
  b.AddOutput(b.AddNode("aten.mm.default", {Ref(x), Ref(y)}, {}, {Meta({2, 4})}, "mm")[0]);
  return std::move(b).Build();
}

TEST(InterpreterErrorTest, WrongInputCountIsInvalidArgument) {
  absl::StatusOr<std::vector<at::Tensor>> out = RunGraph(MmGraph(), {at::randn({2, 3})});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("takes 2 inputs, got 1"));
}

TEST(InterpreterErrorTest, AtenShapeErrorIsInternalNamingTheNode) {
  absl::StatusOr<std::vector<at::Tensor>> out =
      RunGraph(MmGraph(), {at::randn({2, 3}), at::randn({4, 5})});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(out.status().message(),
              AllOf(HasSubstr("node 'mm' (aten.mm.default): "), HasSubstr("2x3 and 4x5"),
                    ::testing::Not(HasSubstr("\n"))));
}

absl::Status CreateOneNode(const std::string& target, std::vector<Argument> args,
                           std::vector<Argument> kwargs, int num_outputs = 1) {
  GraphBuilder b;
  ValueId x = b.AddInput(Meta({2, 2}));
  for (Argument& a : args) {
    if (std::holds_alternative<ValueId>(a.kind)) a.kind = x;
  }
  std::vector<ValueId> outs =
      b.AddNode(target, std::move(args), std::move(kwargs),
                std::vector<ir::TensorMeta>(num_outputs, Meta({2, 2})), "n");
  for (ValueId v : outs) b.AddOutput(v);
  return Interpreter::Create(std::move(b).Build()).status();
}

TEST(InterpreterErrorTest, ArgumentsThatDoNotFitTheSchema) {
  const ValueId kX = 0;  // CreateOneNode points every tensor at its input
  absl::Status s = CreateOneNode("aten.mm.default", {Ref(kX), Int(3)}, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("node 'n'"), HasSubstr("'mat2'"),
                                 HasSubstr("expects Tensor, got an int")));

  s = CreateOneNode("aten.mm.default", {Ref(kX)}, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("missing required argument 'mat2'"));

  s = CreateOneNode("aten.add.Tensor", {Ref(kX), Ref(kX)}, {Kwarg("beta", Int(1))});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("no parameter named 'beta'"));

  s = CreateOneNode("aten.add.Tensor", {Ref(kX), Ref(kX), Int(2)}, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("at most 2 positional arguments"));

  s = CreateOneNode("aten.mm.default", {Ref(kX), Ref(kX)}, {}, /*num_outputs=*/2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("returns 1 tensors, the node names 2"));

  EXPECT_TRUE(CreateOneNode("aten.mm.default", {Ref(kX), Ref(kX)}, {}).ok());
}

TEST(InterpreterErrorTest, SymbolicArgumentsAreRefusedAtRun) {
  GraphBuilder b;
  ValueId x = b.AddInput(Meta({2, 3}));
  Argument size{"", std::vector<ir::SymInt>{ir::SymInt{std::string("s0")}, ir::SymInt{int64_t{3}}}};
  b.AddOutput(b.AddNode("aten.view.default", {Ref(x), size}, {}, {Meta({2, 3})}, "view")[0]);
  absl::StatusOr<std::unique_ptr<Interpreter>> interp = Interpreter::Create(std::move(b).Build());
  ASSERT_TRUE(interp.ok()) << interp.status();
  absl::StatusOr<std::vector<at::Tensor>> out = (*interp)->Run({at::randn({2, 3})});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(),
              AllOf(HasSubstr("node 'view'"), HasSubstr("'size'"), HasSubstr("s0")));
}

}  // namespace
}  // namespace kiln::runtime
