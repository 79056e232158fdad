// Tests of CompiledFunction against libtorch's autograd.
//
// Each graph of tests/data/graphs/*.json is compiled by a real kilnd with
// the `aot_eager` backend, once with the inputs that require grad per its
// metadata and once with every floating-point input and parameter requiring
// grad (buffers never: they are updated in place). The CompiledFunction's
// forward and backward then run on fresh random inputs and random output
// gradients, and are compared (rtol 1e-4, atol 1e-5, float32) with the
// ORIGINAL graph run by the reference interpreter under autograd and
// differentiated by torch::autograd::grad: every output, every input after
// the run (buffers a graph updates), and every input gradient. Random ops
// draw the same values in both runs: the default CPU generator is reseeded
// before each. The seed of a run is printed with any failure.
#include "client/runtime/compiled_function.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/randn_like.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/runtime/interpreter.h"
#include "common/status_macros.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/graph.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/v1/service.pb.h"
#include "tests/integration/graphs.h"
#include "tests/integration/kilnd_process.h"

namespace kiln::runtime {
namespace {

using ::testing::HasSubstr;

constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;
// Gradients of the transformer block reach 5e3 with random weights and sum
// thousands of products through softmax's and LayerNorm's backward; two
// float32 evaluations in different orders (ATen's and the generated
// kernels') then differ by up to ~1e-4 of the largest gradient where one
// element is near 0. Measured over 120 runs at 1e-5: 4-14 failures per 60,
// with the largest difference 7.5e-5 of the scale.
constexpr double kGradAtol = 1e-4;

// ---------------------------------------------------------------------------
// Inputs.

at::ScalarType ScalarTypeOf(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT32:
      return at::kFloat;
    case v1::FLOAT64:
      return at::kDouble;
    case v1::INT64:
      return at::kLong;
    case v1::INT32:
      return at::kInt;
    case v1::BOOL:
      return at::kBool;
    default:
      ADD_FAILURE() << "no random inputs of dtype " << v1::DType_Name(dtype);
      return at::kFloat;
  }
}

std::vector<int64_t> ConcreteSizes(const ir::TensorMeta& meta) {
  std::vector<int64_t> sizes;
  for (const ir::SymInt& s : meta.sizes) {
    EXPECT_TRUE(s.is_constant()) << "symbolic size " << s.ToString();
    sizes.push_back(s.is_constant() ? s.constant() : 2);
  }
  return sizes;
}

// Exclusive upper bound for the values of integer input `v`: the number of
// rows of an embedding it indexes, the number of classes of an nll_loss it
// is the target of, 4 otherwise.
int64_t IntBound(const ir::Graph& g, ir::ValueId v) {
  auto ref = [](const ir::Node& n, size_t i) {
    const auto* id = i < n.args.size() ? std::get_if<ir::ValueId>(&n.args[i].kind) : nullptr;
    return id ? *id : ir::kNoValue;
  };
  for (const ir::Node& n : g.nodes()) {
    if (n.target == "aten.embedding.default" && ref(n, 1) == v && ref(n, 0) != ir::kNoValue) {
      return ConcreteSizes(g.value(ref(n, 0)).meta)[0];
    }
    if (n.target == "aten.nll_loss_forward.default" && ref(n, 1) == v &&
        ref(n, 0) != ir::kNoValue) {
      std::vector<int64_t> self = ConcreteSizes(g.value(ref(n, 0)).meta);
      return self.size() == 1 ? self[0] : self[1];
    }
  }
  return 4;
}

// Random inputs of the graph's declared metadata: floating-point inputs and
// parameters ~ N(0, 1); floating-point buffers (running statistics) ~
// U(0.5, 1.5), so that variances are positive; integers in [0, IntBound).
std::vector<at::Tensor> RandomInputs(const ir::Graph& g) {
  std::vector<at::Tensor> inputs;
  for (const ir::Input& in : g.inputs()) {
    const ir::TensorMeta& meta = g.value(in.value).meta;
    const at::ScalarType type = ScalarTypeOf(meta.dtype);
    const std::vector<int64_t> sizes = ConcreteSizes(meta);
    const auto options = at::TensorOptions().dtype(type);
    if (at::isFloatingType(type)) {
      inputs.push_back(in.kind == v1::Placeholder::BUFFER ? at::rand(sizes, options).add(0.5)
                                                          : at::randn(sizes, options));
    } else if (type == at::kBool) {
      inputs.push_back(at::randint(0, 2, sizes, options));
    } else {
      inputs.push_back(at::randint(0, IntBound(g, in.value), sizes, options));
    }
  }
  return inputs;
}

std::vector<at::Tensor> Clones(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : ts) out.push_back(t.clone());
  return out;
}

void Reseed(uint64_t seed) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
}

uint64_t FreshSeed() {
  static std::mt19937_64 seeds{std::random_device{}()};
  return seeds();
}

// ---------------------------------------------------------------------------
// Comparisons.

::testing::AssertionResult Close(const at::Tensor& got, const at::Tensor& want,
                                 double atol = kAtol) {
  if (!got.defined() || !want.defined()) {
    if (got.defined() == want.defined()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << (got.defined() ? "got a tensor, want undefined" : "got undefined, want a tensor");
  }
  if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type()) {
    return ::testing::AssertionFailure() << "got " << got.scalar_type() << got.sizes() << ", want "
                                         << want.scalar_type() << want.sizes();
  }
  const at::Tensor a = got.detach(), b = want.detach();
  if (!at::isFloatingType(a.scalar_type())) {
    if (a.equal(b)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "integer tensors differ";
  }
  // Float32 tolerance: relative per element, absolute at the tensor's own
  // scale (generated reductions sum in another order than ATen's, so a
  // gradient of magnitude 1e3 can differ by 1e-3 where its value is near 0).
  const double scale = std::max(1.0, b.abs().max().item<double>());
  if (at::allclose(a, b, kRtol, atol * scale)) return ::testing::AssertionSuccess();
  const at::Tensor diff = a.sub(b).abs();
  return ::testing::AssertionFailure()
         << "max |got - want| = " << diff.max().item<double>()
         << " (max |want| = " << b.abs().max().item<double>() << ") at flat index "
         << diff.flatten().argmax().item<int64_t>() << " of " << a.numel();
}

// A missing gradient and an all-zero one mean the same.
::testing::AssertionResult SameGradient(const at::Tensor& got, const at::Tensor& want) {
  if (got.defined() && !want.defined() && !got.detach().ne(0).any().item<bool>()) {
    return ::testing::AssertionSuccess();
  }
  if (!got.defined() && want.defined() && !want.detach().ne(0).any().item<bool>()) {
    return ::testing::AssertionSuccess();
  }
  return Close(got, want, kGradAtol);
}

// ---------------------------------------------------------------------------
// A kilnd for the whole binary.

class KilndFixture {
 public:
  KilndFixture() : kilnd_(dir_.path()) {
    ClientOptions o;
    o.address = kilnd_.address();
    o.deadline = absl::Seconds(120);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(o);
    if (!client.ok()) {
      std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
      std::abort();
    }
    client_ = *std::move(client);
  }

  absl::StatusOr<v1::Artifact> Compile(const v1::Graph& graph, const std::string& backend) const {
    v1::CompileRequest request;
    *request.mutable_graph() = graph;
    request.mutable_options()->set_backend(backend);
    ASSIGN_OR_RETURN(v1::CompileResponse response, client_->Compile(request));
    return response.artifact();
  }

 private:
  testing::TempDir dir_;
  testing::KilndProcess kilnd_;
  std::unique_ptr<Client> client_;
};

const KilndFixture& Kilnd() {
  // Started on first use; killed (and its directory removed) at exit.
  static const KilndFixture kilnd;
  return kilnd;
}

// Compiles with kilnd and builds the function; fails the test otherwise.
std::unique_ptr<CompiledFunction> MustCompile(const v1::Graph& graph, const std::string& backend,
                                              v1::Artifact* artifact_out = nullptr) {
  absl::StatusOr<v1::Artifact> artifact = Kilnd().Compile(graph, backend);
  EXPECT_TRUE(artifact.ok()) << graph.name() << ": " << artifact.status();
  if (!artifact.ok()) return nullptr;
  EXPECT_EQ(artifact->backend(), backend);
  absl::StatusOr<std::unique_ptr<CompiledFunction>> fn = CompiledFunction::Create(*artifact);
  EXPECT_TRUE(fn.ok()) << graph.name() << ": " << fn.status();
  if (artifact_out != nullptr) *artifact_out = *artifact;
  return fn.ok() ? *std::move(fn) : nullptr;
}

ir::Graph MustFromProto(const v1::Graph& proto) {
  absl::StatusOr<ir::Graph> g = ir::Graph::FromProto(proto);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : ir::Graph();
}

// ---------------------------------------------------------------------------
// Every graph file, against libtorch's autograd.

struct GraphCase {
  std::string file;                   // under tests/data/graphs
  bool all_inputs = false;            // every floating input and parameter requires grad
  std::string backend = "aot_eager";  // or "kiln": generated kernels
};

void PrintTo(const GraphCase& c, std::ostream* os) {
  *os << c.file << (c.all_inputs ? ", every floating input requiring grad" : "") << ", "
      << c.backend;
}

std::vector<GraphCase> GraphCases() {
  std::vector<std::string> files;
  const std::filesystem::path dir = std::filesystem::path(KILN_SOURCE_DIR) / "tests/data/graphs";
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".json") files.push_back(entry.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  std::vector<GraphCase> cases;
  for (const char* backend : {"aot_eager", "kiln"}) {
    for (const std::string& f : files) {
      cases.push_back({f, false, backend});
      cases.push_back({f, true, backend});
    }
  }
  return cases;
}

std::string CaseName(const ::testing::TestParamInfo<GraphCase>& info) {
  std::string name = info.param.file.substr(0, info.param.file.rfind('.'));
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name + (info.param.all_inputs ? "_all_inputs_need_grad" : "_grad_per_metadata") + "_" +
         info.param.backend;
}

class GraphFileTest : public ::testing::TestWithParam<GraphCase> {};

TEST_P(GraphFileTest, ForwardAndBackwardMatchLibtorchAutograd) {
  v1::Graph proto = testing::LoadGraphFile(GetParam().file).graph();
  if (GetParam().all_inputs) {
    bool changed = false;
    for (v1::Placeholder& in : *proto.mutable_inputs()) {
      v1::TensorMeta* meta = in.mutable_value()->mutable_meta();
      const bool floating = meta->dtype() == v1::FLOAT32 || meta->dtype() == v1::FLOAT64;
      if (floating && in.kind() != v1::Placeholder::BUFFER && !meta->requires_grad()) {
        meta->set_requires_grad(true);
        changed = true;
      }
    }
    if (!changed) GTEST_SKIP() << "every floating input already requires grad";
  }
  const ir::Graph graph = MustFromProto(proto);
  const int n = static_cast<int>(graph.inputs().size());
  std::vector<bool> requires_grad(n);
  int num_requiring = 0;
  for (int i = 0; i < n; ++i) {
    requires_grad[i] = graph.value(graph.inputs()[i].value).meta.requires_grad;
    num_requiring += requires_grad[i] ? 1 : 0;
  }
  std::cout << "[ graph    ] " << GetParam().file << ": " << num_requiring << " of " << n
            << " inputs require grad" << std::endl;

  v1::Artifact artifact;
  std::unique_ptr<CompiledFunction> fn = MustCompile(proto, GetParam().backend, &artifact);
  ASSERT_NE(fn, nullptr);
  ASSERT_EQ(fn->num_inputs(), n);
  // A kiln compile with no input needing a gradient is an inference artifact.
  const bool inference_only = GetParam().backend == "kiln" && num_requiring == 0;
  if (!inference_only) {
    EXPECT_EQ(fn->inputs_need_grad(), requires_grad);
  }

  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  Reseed(seed);
  const std::vector<at::Tensor> inputs = RandomInputs(graph);
  const uint64_t run_seed = FreshSeed();

  // Reference: the original graph under autograd.
  std::vector<at::Tensor> ref_inputs = Clones(inputs);
  std::vector<at::Tensor> leaves;
  for (int i = 0; i < n; ++i) {
    if (requires_grad[i]) {
      ref_inputs[i].requires_grad_(true);
      leaves.push_back(ref_inputs[i]);
    }
  }
  Reseed(run_seed);
  absl::StatusOr<std::vector<at::Tensor>> ref_out = RunGraph(graph, ref_inputs);
  ASSERT_TRUE(ref_out.ok()) << ref_out.status();

  // Compiled.
  std::vector<at::Tensor> cf_inputs = Clones(inputs);
  Reseed(run_seed);
  absl::StatusOr<CompiledFunction::ForwardResult> fwd = fn->forward(cf_inputs);
  ASSERT_TRUE(fwd.ok()) << fwd.status();

  ASSERT_EQ(fwd->outputs.size(), ref_out->size());
  ASSERT_EQ(fn->num_outputs(), static_cast<int>(ref_out->size()));
  for (size_t i = 0; i < ref_out->size(); ++i) {
    EXPECT_TRUE(Close(fwd->outputs[i], (*ref_out)[i])) << "output " << i;
    EXPECT_FALSE(fwd->outputs[i].defined() && fwd->outputs[i].requires_grad())
        << "output " << i << ": the forward runs without autograd";
  }
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(Close(cf_inputs[i], ref_inputs[i])) << "input " << i << " after the run";
  }
  if (inference_only) return;

  // Random gradients for the outputs that receive them.
  std::vector<at::Tensor> grad_outputs(ref_out->size());
  std::vector<at::Tensor> diff_outputs, diff_grads;
  for (size_t i = 0; i < ref_out->size(); ++i) {
    const at::Tensor& out = (*ref_out)[i];
    const bool receives = artifact.autograd().outputs_receive_grad(static_cast<int>(i));
    EXPECT_EQ(receives, out.defined() && out.requires_grad())
        << "output " << i << ": outputs_receive_grad disagrees with libtorch";
    if (!receives) continue;
    grad_outputs[i] = at::randn_like(out.detach());
    if (out.requires_grad()) {
      diff_outputs.push_back(out);
      diff_grads.push_back(grad_outputs[i]);
    }
  }
  std::vector<at::Tensor> want(n);
  if (!leaves.empty() && !diff_outputs.empty()) {
    std::vector<at::Tensor> g = torch::autograd::grad(diff_outputs, leaves, diff_grads,
                                                      /*retain_graph=*/false,
                                                      /*create_graph=*/false,
                                                      /*allow_unused=*/true);
    for (int i = 0, k = 0; i < n; ++i) {
      if (requires_grad[i]) want[i] = g[k++];
    }
  }

  absl::StatusOr<std::vector<at::Tensor>> got = fn->backward(fwd->saved, grad_outputs);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(static_cast<int>(got->size()), n);
  for (int i = 0; i < n; ++i) {
    const std::string& name = graph.value(graph.inputs()[i].value).name;
    if (!requires_grad[i]) {
      EXPECT_FALSE((*got)[i].defined()) << "input " << i << " (" << name << ") needs no grad";
      continue;
    }
    EXPECT_TRUE(SameGradient((*got)[i], want[i]))
        << "gradient of input " << i << " (" << name << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Graphs, GraphFileTest, ::testing::ValuesIn(GraphCases()), CaseName);

// ---------------------------------------------------------------------------
// Dropout: the same seed draws the same mask in the original graph and in
// the compiled forward, and the backward uses that mask.

ir::TensorMeta Meta(std::vector<int64_t> sizes, v1::DType dtype = v1::FLOAT32,
                    bool requires_grad = false) {
  return ir::ContiguousMeta(sizes, dtype, requires_grad);
}

// z = native_dropout(x, 0.5, train)[0] * w, x and w requiring grad.
v1::Graph DropoutGraph() {
  ir::GraphBuilder b("dropout_scale");
  const ir::ValueId x =
      b.AddInput(Meta({8, 16}, v1::FLOAT32, true), v1::Placeholder::USER_INPUT, "x");
  const ir::ValueId w = b.AddInput(Meta({16}, v1::FLOAT32, true), v1::Placeholder::PARAMETER, "w");
  const std::vector<ir::ValueId> d =
      b.AddNode("aten.native_dropout.default", {ir::Ref(x), ir::Float(0.5), ir::Bool(true)}, {},
                {Meta({8, 16}), Meta({8, 16}, v1::BOOL)});
  const ir::ValueId z =
      b.AddNode("aten.mul.Tensor", {ir::Ref(d[0]), ir::Ref(w)}, {}, {Meta({8, 16})})[0];
  b.AddOutput(z);
  return std::move(b).Build().ToProto();
}

TEST(CompiledFunctionTest, DropoutDrawsTheSameMaskAsTheReference) {
  const v1::Graph proto = DropoutGraph();
  const ir::Graph graph = MustFromProto(proto);
  std::unique_ptr<CompiledFunction> fn = MustCompile(proto, "aot_eager");
  ASSERT_NE(fn, nullptr);

  const at::Tensor x = at::randn({8, 16}), w = at::randn({16}), gz = at::randn({8, 16});
  const at::Tensor rx = x.clone().requires_grad_(true), rw = w.clone().requires_grad_(true);
  Reseed(1234);
  absl::StatusOr<std::vector<at::Tensor>> ref = RunGraph(graph, {rx, rw});
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::vector<at::Tensor> want =
      torch::autograd::grad({(*ref)[0]}, {rx, rw}, {gz}, false, false, true);

  Reseed(1234);
  absl::StatusOr<CompiledFunction::ForwardResult> fwd = fn->forward({x, w});
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  EXPECT_TRUE(Close(fwd->outputs[0], (*ref)[0]));
  // Some elements dropped, some kept: a real mask was drawn.
  const at::Tensor dropped = fwd->outputs[0].eq(0);
  EXPECT_TRUE(dropped.any().item<bool>());
  EXPECT_FALSE(dropped.all().item<bool>());

  absl::StatusOr<std::vector<at::Tensor>> got = fn->backward(fwd->saved, {gz});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameGradient((*got)[0], want[0])) << "dx";
  EXPECT_TRUE(SameGradient((*got)[1], want[1])) << "dw";
}

// ---------------------------------------------------------------------------
// The API's contract.

v1::Graph MlpGraph() { return testing::LoadGraphFile("mlp.json").graph(); }

TEST(CompiledFunctionTest, EagerForwardEqualsRunGraph) {
  const v1::Graph proto = MlpGraph();
  const ir::Graph graph = MustFromProto(proto);
  std::unique_ptr<CompiledFunction> fn = MustCompile(proto, "eager");
  ASSERT_NE(fn, nullptr);
  EXPECT_EQ(fn->backend(), "eager");
  EXPECT_EQ(fn->inputs_need_grad(), std::vector<bool>(graph.inputs().size(), false));

  const std::vector<at::Tensor> inputs = RandomInputs(graph);
  absl::StatusOr<std::vector<at::Tensor>> want = RunGraph(graph, inputs);
  ASSERT_TRUE(want.ok()) << want.status();
  absl::StatusOr<CompiledFunction::ForwardResult> got = fn->forward(inputs);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->outputs.size(), want->size());
  for (size_t i = 0; i < want->size(); ++i) EXPECT_TRUE(Close(got->outputs[i], (*want)[i]));
  EXPECT_TRUE(got->saved.tensors().empty());

  absl::StatusOr<std::vector<at::Tensor>> grads = fn->backward(got->saved, {at::Tensor()});
  EXPECT_EQ(grads.status().code(), absl::StatusCode::kFailedPrecondition) << grads.status();
}

TEST(CompiledFunctionTest, WrongInputCountIsInvalidArgument) {
  const v1::Graph proto = MlpGraph();
  std::unique_ptr<CompiledFunction> fn = MustCompile(proto, "aot_eager");
  ASSERT_NE(fn, nullptr);
  std::vector<at::Tensor> inputs = RandomInputs(MustFromProto(proto));
  inputs.pop_back();
  absl::StatusOr<CompiledFunction::ForwardResult> r = fn->forward(inputs);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("takes 7 inputs, got 6"));
}

TEST(CompiledFunctionTest, BackwardChecksItsArguments) {
  const v1::Graph proto = MlpGraph();
  const ir::Graph graph = MustFromProto(proto);
  std::unique_ptr<CompiledFunction> fn = MustCompile(proto, "aot_eager");
  std::unique_ptr<CompiledFunction> other = MustCompile(proto, "aot_eager");
  ASSERT_NE(fn, nullptr);
  ASSERT_NE(other, nullptr);
  absl::StatusOr<CompiledFunction::ForwardResult> fwd = fn->forward(RandomInputs(graph));
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  ASSERT_EQ(fwd->outputs.size(), 1u);
  const at::Tensor g = at::randn_like(fwd->outputs[0]);

  absl::StatusOr<std::vector<at::Tensor>> r = fn->backward(fwd->saved, {g, g});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("one gradient per forward output (1), got 2"));

  r = fn->backward(fwd->saved, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();

  r = fn->backward(fwd->saved, {at::randn({3})});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("grad_outputs[0]"));

  r = fn->backward(CompiledFunction::Saved(), {g});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  r = other->backward(fwd->saved, {g});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("Saved"));

  // The Saved is still usable after all that.
  r = fn->backward(fwd->saved, {g});
  EXPECT_TRUE(r.ok()) << r.status();
}

TEST(CompiledFunctionTest, UndefinedGradOutputMeansZeros) {
  const v1::Graph proto = MlpGraph();
  const ir::Graph graph = MustFromProto(proto);
  std::unique_ptr<CompiledFunction> fn = MustCompile(proto, "aot_eager");
  ASSERT_NE(fn, nullptr);
  absl::StatusOr<CompiledFunction::ForwardResult> fwd = fn->forward(RandomInputs(graph));
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  absl::StatusOr<std::vector<at::Tensor>> none = fn->backward(fwd->saved, {at::Tensor()});
  absl::StatusOr<std::vector<at::Tensor>> zeros =
      fn->backward(fwd->saved, {at::zeros_like(fwd->outputs[0])});
  ASSERT_TRUE(none.ok()) << none.status();
  ASSERT_TRUE(zeros.ok()) << zeros.status();
  for (size_t i = 0; i < none->size(); ++i) {
    EXPECT_EQ((*none)[i].defined(), fn->inputs_need_grad()[i]) << "input " << i;
    EXPECT_TRUE(Close((*none)[i], (*zeros)[i])) << "input " << i;
  }
}

// Forwards and backwards interleaved, from two threads: each backward uses
// its own forward's saved values.
TEST(CompiledFunctionTest, InterleavedCallsKeepTheirOwnSavedValues) {
  const v1::Graph proto = MlpGraph();
  const ir::Graph graph = MustFromProto(proto);
  std::unique_ptr<CompiledFunction> fn = MustCompile(proto, "aot_eager");
  ASSERT_NE(fn, nullptr);
  const std::vector<at::Tensor> a = RandomInputs(graph), b = RandomInputs(graph);
  const at::Tensor g = at::randn({8, 32});

  auto run_alone = [&](const std::vector<at::Tensor>& in) {
    auto f = fn->forward(in);
    EXPECT_TRUE(f.ok()) << f.status();
    auto r = fn->backward(f->saved, {g});
    EXPECT_TRUE(r.ok()) << r.status();
    return *r;
  };
  const std::vector<at::Tensor> want_a = run_alone(a), want_b = run_alone(b);

  auto fa = fn->forward(a);
  auto fb = fn->forward(b);
  ASSERT_TRUE(fa.ok() && fb.ok());
  absl::StatusOr<std::vector<at::Tensor>> got_a, got_b;
  std::thread ta([&] { got_b = fn->backward(fb->saved, {g}); });
  std::thread tb([&] { got_a = fn->backward(fa->saved, {g}); });
  ta.join();
  tb.join();
  ASSERT_TRUE(got_a.ok()) << got_a.status();
  ASSERT_TRUE(got_b.ok()) << got_b.status();
  for (size_t i = 0; i < want_a.size(); ++i) {
    EXPECT_TRUE(Close((*got_a)[i], want_a[i])) << "a, input " << i;
    EXPECT_TRUE(Close((*got_b)[i], want_b[i])) << "b, input " << i;
  }
}

TEST(CompiledFunctionTest, MissingGraphOrUnknownBackendIsFailedPrecondition) {
  v1::Artifact eager;
  eager.set_backend("eager");
  auto fn = CompiledFunction::Create(eager);
  EXPECT_EQ(fn.status().code(), absl::StatusCode::kFailedPrecondition) << fn.status();
  EXPECT_THAT(fn.status().message(), HasSubstr("artifact.graph"));

  v1::Artifact aot;
  aot.set_backend("aot_eager");
  fn = CompiledFunction::Create(aot);
  EXPECT_EQ(fn.status().code(), absl::StatusCode::kFailedPrecondition) << fn.status();
  EXPECT_THAT(fn.status().message(), HasSubstr("artifact.autograd"));

  absl::StatusOr<v1::Artifact> compiled = Kilnd().Compile(MlpGraph(), "aot_eager");
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  v1::Artifact no_backward = *compiled;
  no_backward.mutable_autograd()->clear_backward();
  fn = CompiledFunction::Create(no_backward);
  EXPECT_EQ(fn.status().code(), absl::StatusCode::kFailedPrecondition) << fn.status();
  EXPECT_THAT(fn.status().message(), HasSubstr("artifact.autograd.backward"));

  // A kiln artifact runs its compiled graphs, which this one lacks.
  v1::Artifact kiln = *compiled;
  kiln.set_backend("kiln");
  fn = CompiledFunction::Create(kiln);
  EXPECT_EQ(fn.status().code(), absl::StatusCode::kFailedPrecondition) << fn.status();
  EXPECT_THAT(fn.status().message(), HasSubstr("artifact.compiled"));

  v1::Artifact unknown = *compiled;
  unknown.set_backend("bogus");
  fn = CompiledFunction::Create(unknown);
  EXPECT_EQ(fn.status().code(), absl::StatusCode::kFailedPrecondition) << fn.status();
  EXPECT_THAT(fn.status().message(), HasSubstr("'bogus'"));

  v1::Artifact newer = *compiled;
  newer.set_format_version(newer.format_version() + 100);
  fn = CompiledFunction::Create(newer);
  EXPECT_EQ(fn.status().code(), absl::StatusCode::kFailedPrecondition) << fn.status();
}

TEST(CompiledFunctionTest, InconsistentAutogradBookkeepingIsInvalidArgument) {
  absl::StatusOr<v1::Artifact> compiled = Kilnd().Compile(MlpGraph(), "aot_eager");
  ASSERT_TRUE(compiled.ok()) << compiled.status();

  v1::Artifact a = *compiled;
  a.mutable_autograd()->set_num_forward_outputs(a.autograd().num_forward_outputs() + 1);
  auto fn = CompiledFunction::Create(a);
  EXPECT_EQ(fn.status().code(), absl::StatusCode::kInvalidArgument) << fn.status();

  a = *compiled;
  a.mutable_autograd()->set_grad_input_index(0, 99);
  fn = CompiledFunction::Create(a);
  EXPECT_EQ(fn.status().code(), absl::StatusCode::kInvalidArgument) << fn.status();
  EXPECT_THAT(fn.status().message(), HasSubstr("grad_input_index[0]"));

  a = *compiled;
  a.mutable_autograd()->mutable_inputs_need_grad()->RemoveLast();
  fn = CompiledFunction::Create(a);
  EXPECT_EQ(fn.status().code(), absl::StatusCode::kInvalidArgument) << fn.status();
}

}  // namespace
}  // namespace kiln::runtime

namespace kiln::runtime {
namespace {

std::string ReadText(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// kilnd signs what it sends; CreateVerified loads only what checks out.
TEST(CompiledFunctionTest, OnlyArtifactsKilndSignedAreLoaded) {
  testing::TempDir dir;
  const std::string key = dir.path() + "/key.pem", pub = dir.path() + "/pub.pem",
                    other = dir.path() + "/other.pem", other_pub = dir.path() + "/other_pub.pem";
  const std::string make =
      absl::StrCat("openssl genpkey -algorithm ed25519 -out ", key, " && openssl pkey -in ", key,
                   " -pubout -out ", pub, " && openssl genpkey -algorithm ed25519 -out ", other,
                   " && openssl pkey -in ", other, " -pubout -out ", other_pub, " 2>/dev/null");
  ASSERT_EQ(std::system(make.c_str()), 0);
  testing::KilndProcess kilnd(dir.path() + "/data", {"--signing_key_file=" + key});
  ClientOptions o;
  o.address = kilnd.address();
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  v1::CompileRequest request;
  *request.mutable_graph() = testing::LoadGraphFile("rmsnorm.json").graph();
  request.mutable_options()->set_backend("kiln");
  auto response = (*client)->Compile(request);
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_FALSE(response->signature().empty());

  auto fn = CompiledFunction::CreateVerified(response->artifact(), response->digest(),
                                             response->signature(), ReadText(pub));
  EXPECT_TRUE(fn.ok()) << fn.status();
  auto wrong_key = CompiledFunction::CreateVerified(response->artifact(), response->digest(),
                                                    response->signature(), ReadText(other_pub));
  EXPECT_EQ(wrong_key.status().code(), absl::StatusCode::kPermissionDenied) << wrong_key.status();
  auto unsigned_ =
      CompiledFunction::CreateVerified(response->artifact(), response->digest(), "", ReadText(pub));
  EXPECT_EQ(unsigned_.status().code(), absl::StatusCode::kPermissionDenied);
  v1::Artifact planted = response->artifact();
  (*planted.mutable_trace())["planted"] = "code";
  auto tampered = CompiledFunction::CreateVerified(planted, response->digest(),
                                                   response->signature(), ReadText(pub));
  EXPECT_EQ(tampered.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(tampered.status().message(), "hash to")) << tampered.status();
  EXPECT_EQ(kilnd.Terminate(), 0);
}

}  // namespace
}  // namespace kiln::runtime
