// Tests of the plan executor on hand-built plans. The generated code is
// stood in for by a few kernels written here by hand to the kernel ABI
// (compiler/codegen/codegen.h) and compiled with g++ when the tests start;
// every result is compared with the same computation written with ATen ops.
#include "client/runtime/plan_executor.h"
#include "client/runtime/plan_test_util.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/sum.h>
#include <c10/core/GradMode.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/runtime/compiled_function.h"
#include "client/runtime/module_loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::runtime {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The kernels, following the ABI: buffers are data pointers, symbols[0] is
// s0. All tensors are float32 and contiguous unless said otherwise.
constexpr char kKernels[] = R"cc(
#include <cstdint>
  // y[i, j] = x[i, j] * 2 + b[j]; x, y: [s0, 4], b: [4].
  extern "C" void scale_add(void* const* buffers, const int64_t* symbols) {
    const float* x = static_cast<const float*>(buffers[0]);
    const float* b = static_cast<const float*>(buffers[1]);
    float* y = static_cast<float*>(buffers[2]);
    for (int64_t i = 0; i < symbols[0]; ++i) {
      for (int64_t j = 0; j < 4; ++j) y[i * 4 + j] = x[i * 4 + j] * 2.0f + b[j];
    }
  }
  // The same, with y column-major: y[i, j] at i + j * s0 (strides [1, s0]).
  extern "C" void scale_add_cm(void* const* buffers, const int64_t* symbols) {
    const float* x = static_cast<const float*>(buffers[0]);
    const float* b = static_cast<const float*>(buffers[1]);
    float* y = static_cast<float*>(buffers[2]);
    const int64_t s0 = symbols[0];
    for (int64_t i = 0; i < s0; ++i) {
      for (int64_t j = 0; j < 4; ++j) y[i + j * s0] = x[i * 4 + j] * 2.0f + b[j];
    }
  }
  // v = u + 1 over 3 * s0 elements.
  extern "C" void add_one_3(void* const* buffers, const int64_t* symbols) {
    const float* u = static_cast<const float*>(buffers[0]);
    float* v = static_cast<float*>(buffers[1]);
    for (int64_t k = 0; k < 3 * symbols[0]; ++k) v[k] = u[k] + 1.0f;
  }
  // r[k] = k for k < s0; r is int32.
  extern "C" void iota_s0(void* const* buffers, const int64_t* symbols) {
    int32_t* r = static_cast<int32_t*>(buffers[0]);
    for (int64_t k = 0; k < symbols[0]; ++k) r[k] = static_cast<int32_t>(k);
  }
)cc";

// Compiles `source` into a shared object and returns its bytes.
std::string CompileSharedObject(const std::string& source) {
  char dir_template[] = "/tmp/kiln_plan_executor_test.XXXXXX";
  const char* dir = mkdtemp(dir_template);
  EXPECT_NE(dir, nullptr);
  if (dir == nullptr) return "";
  const std::string so = absl::StrCat(dir, "/kernels.so");
  const std::string command = absl::StrCat("g++ -O2 -shared -fPIC -x c++ - -o ", so);
  FILE* pipe = popen(command.c_str(), "w");
  EXPECT_NE(pipe, nullptr);
  if (pipe == nullptr) return "";
  fwrite(source.data(), 1, source.size(), pipe);
  const int rc = pclose(pipe);
  EXPECT_EQ(rc, 0) << command;
  std::ifstream in(so, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  unlink(so.c_str());
  rmdir(dir);
  EXPECT_FALSE(bytes.empty());
  return bytes;
}

// The kernels' shared object, compiled once for the whole test binary.
const std::string& KernelBinary() {
  static const std::string* const binary = new std::string(CompileSharedObject(kKernels));
  return *binary;
}

// The same kernels plus one more function, kiln_which: another binary.
const std::string& OtherBinary() {
  static const std::string* const binary = new std::string(CompileSharedObject(
      absl::StrCat(kKernels, "\nextern \"C\" int kiln_which() { return 2; }\n")));
  return *binary;
}

// ------------------------------------------------------------ plan building

using plan_test::Int;
using plan_test::Sym;
using Dims = std::vector<v1::SymInt>;

v1::Argument TensorArg(const std::string& name) {
  v1::Argument a;
  a.set_tensor(name);
  return a;
}
v1::Argument IntArg(int64_t v) {
  v1::Argument a;
  a.set_int_value(v);
  return a;
}
v1::Argument IntsArg(const std::vector<int64_t>& vs) {
  v1::Argument a;
  for (int64_t v : vs) a.mutable_ints()->add_values(v);
  return a;
}
v1::Argument SymIntsArg(const Dims& vs) {
  v1::Argument a;
  for (const v1::SymInt& v : vs) *a.mutable_sym_ints()->add_values() = v;
  return a;
}

// A CompiledGraph under construction.
class PlanMaker {
 public:
  explicit PlanMaker(const std::string& binary = KernelBinary()) {
    v1::CompiledModule* m = graph_.add_modules();
    m->set_language("c++");
    m->set_source(kKernels);
    m->set_binary(binary);
  }

  PlanMaker& Input(const std::string& name, const Dims& sizes, const Dims& strides,
                   v1::DType dtype = v1::FLOAT32) {
    v1::Value* v = plan()->add_inputs()->mutable_value();
    v->set_name(name);
    v1::TensorMeta* meta = v->mutable_meta();
    meta->set_dtype(dtype);
    for (const auto& s : sizes) *meta->add_sizes() = s;
    for (const auto& s : strides) *meta->add_strides() = s;
    meta->mutable_device()->set_type("cpu");
    meta->mutable_device()->set_index(-1);
    return *this;
  }
  PlanMaker& Bind(const std::string& symbol, int input, int dim) {
    v1::SymbolBinding* b = plan()->add_symbols();
    b->set_symbol(symbol);
    b->set_input(input);
    b->set_dim(dim);
    return *this;
  }
  PlanMaker& Alloc(const std::string& value, const Dims& sizes, const Dims& strides,
                   const std::string& reuse = "", v1::DType dtype = v1::FLOAT32) {
    v1::PlanStep::Alloc* a = plan()->add_steps()->mutable_alloc();
    a->set_value(value);
    a->set_dtype(dtype);
    for (const auto& s : sizes) *a->add_sizes() = s;
    for (const auto& s : strides) *a->add_strides() = s;
    a->mutable_device()->set_type("cpu");
    a->mutable_device()->set_index(-1);
    a->set_reuse(reuse);
    return *this;
  }
  PlanMaker& Launch(const std::string& symbol, const std::vector<std::string>& buffers,
                    int module = 0) {
    v1::PlanStep::Launch* l = plan()->add_steps()->mutable_launch();
    l->set_module(module);
    l->set_symbol(symbol);
    for (const auto& b : buffers) l->add_buffers(b);
    return *this;
  }
  PlanMaker& Extern(const std::string& name, const std::string& target,
                    const std::vector<v1::Argument>& args,
                    const std::vector<std::string>& outputs) {
    v1::Node* n = plan()->add_steps()->mutable_extern_call()->mutable_node();
    n->set_name(name);
    n->set_target(target);
    for (const auto& a : args) *n->add_args() = a;
    for (const auto& o : outputs) n->add_outputs()->set_name(o);
    return *this;
  }
  PlanMaker& View(const std::string& value, const std::string& base, const Dims& sizes,
                  const Dims& strides, const v1::SymInt& offset = Int(0)) {
    v1::PlanStep::View* v = plan()->add_steps()->mutable_view();
    v->set_value(value);
    v->set_base(base);
    for (const auto& s : sizes) *v->add_sizes() = s;
    for (const auto& s : strides) *v->add_strides() = s;
    *v->mutable_storage_offset() = offset;
    return *this;
  }
  PlanMaker& Free(const std::string& value) {
    plan()->add_steps()->mutable_free()->set_value(value);
    return *this;
  }
  PlanMaker& Outputs(const std::vector<std::string>& names) {
    for (const auto& n : names) plan()->add_outputs(n);
    return *this;
  }

  const v1::CompiledGraph& graph() const { return graph_; }

 private:
  v1::ExecutionPlan* plan() { return graph_.mutable_plan(); }
  v1::CompiledGraph graph_;
};

// Inputs x [s0, 4], b [4], w [4, 3]; s0 is size 0 of x.
PlanMaker MainInputs() {
  PlanMaker p;
  p.Input("x", {Sym("s0"), Int(4)}, {Int(4), Int(1)})
      .Input("b", {Int(4)}, {Int(1)})
      .Input("w", {Int(4), Int(3)}, {Int(3), Int(1)})
      .Bind("s0", 0, 0);
  return p;
}

// y = x * 2 + b (kernel); z = y @ w (extern); yt = y^T (view);
// zf = z.view(3 * s0) (extern with a symbolic argument).
v1::CompiledGraph MainPlan() {
  PlanMaker p = MainInputs();
  p.Alloc("y", {Sym("s0"), Int(4)}, {Int(4), Int(1)})
      .Launch("scale_add", {"x", "b", "y"})
      .Extern("mm", "aten.mm.default", {TensorArg("y"), TensorArg("w")}, {"z"})
      .View("yt", "y", {Int(4), Sym("s0")}, {Int(1), Int(4)})
      .Extern("flat", "aten.view.default", {TensorArg("z"), SymIntsArg({Sym("3*s0")})}, {"zf"})
      .Outputs({"y", "yt", "z", "zf"});
  return p.graph();
}

struct MainInputsAndExpected {
  std::vector<at::Tensor> inputs;
  at::Tensor y;  // x * 2 + b
  at::Tensor z;  // y @ w
};

MainInputsAndExpected MakeMain(int64_t s0) {
  MainInputsAndExpected m;
  at::Tensor x = at::randn({s0, 4});
  at::Tensor b = at::randn({4});
  at::Tensor w = at::randn({4, 3});
  m.inputs = {x, b, w};
  m.y = x * 2 + b;
  m.z = at::mm(m.y, w);
  return m;
}

bool Close(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         at::allclose(a, b, 1e-5, 1e-5);
}

// ---------------------------------------------------------------- running

TEST(PlanExecutorTest, KernelExternAndViewAtThreeSizes) {
  absl::StatusOr<std::unique_ptr<PlanExecutor>> exec = PlanExecutor::Create(MainPlan());
  ASSERT_TRUE(exec.ok()) << exec.status();
  EXPECT_EQ((*exec)->num_inputs(), 3);
  EXPECT_EQ((*exec)->num_outputs(), 4);
  for (int64_t s0 : {1, 5, 17}) {
    SCOPED_TRACE(absl::StrCat("s0 = ", s0));
    MainInputsAndExpected m = MakeMain(s0);
    absl::StatusOr<std::vector<at::Tensor>> out = (*exec)->Run(m.inputs);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->size(), 4u);
    const at::Tensor& y = (*out)[0];
    const at::Tensor& yt = (*out)[1];
    const at::Tensor& z = (*out)[2];
    const at::Tensor& zf = (*out)[3];
    EXPECT_TRUE(Close(y, m.y));
    EXPECT_EQ(y.strides(), at::IntArrayRef({4, 1}));
    // The view is a view: same memory, no copy.
    EXPECT_TRUE(Close(yt, m.y.t()));
    EXPECT_EQ(yt.strides(), at::IntArrayRef({1, 4}));
    EXPECT_EQ(yt.data_ptr(), y.data_ptr());
    EXPECT_TRUE(yt.storage().is_alias_of(y.storage()));
    EXPECT_TRUE(Close(z, m.z));
    EXPECT_TRUE(Close(zf, m.z.reshape({-1})));
    EXPECT_TRUE(zf.storage().is_alias_of(z.storage()));
  }
}

TEST(PlanExecutorTest, OutputsHaveThePromisedStrides) {
  PlanMaker p = MainInputs();
  p.Alloc("y", {Sym("s0"), Int(4)}, {Int(1), Sym("s0")})
      .Launch("scale_add_cm", {"x", "b", "y"})
      .Outputs({"y"});
  absl::StatusOr<std::unique_ptr<PlanExecutor>> exec = PlanExecutor::Create(p.graph());
  ASSERT_TRUE(exec.ok()) << exec.status();
  for (int64_t s0 : {2, 6, 9}) {
    MainInputsAndExpected m = MakeMain(s0);
    absl::StatusOr<std::vector<at::Tensor>> out = (*exec)->Run(m.inputs);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ((*out)[0].strides(), at::IntArrayRef({1, s0}));
    EXPECT_TRUE(Close((*out)[0], m.y));
  }
}

TEST(PlanExecutorTest, AllocReusesTheStorageOfAFreedValue) {
  PlanMaker p = MainInputs();
  p.Alloc("t", {Sym("s0"), Int(4)}, {Int(4), Int(1)})
      .Launch("scale_add", {"x", "b", "t"})
      .Extern("mm", "aten.mm.default", {TensorArg("t"), TensorArg("w")}, {"u"})
      .Free("t")
      .Alloc("v", {Sym("s0"), Int(3)}, {Int(3), Int(1)}, /*reuse=*/"t")
      .Launch("add_one_3", {"u", "v"})
      .Free("u")
      // Another dtype over u's storage.
      .Alloc("r", {Sym("s0")}, {Int(1)}, /*reuse=*/"u", v1::INT32)
      .Launch("iota_s0", {"r"})
      .Outputs({"v", "r"});
  absl::StatusOr<std::unique_ptr<PlanExecutor>> exec = PlanExecutor::Create(p.graph());
  ASSERT_TRUE(exec.ok()) << exec.status();
  for (int64_t s0 : {1, 4, 11}) {
    SCOPED_TRACE(absl::StrCat("s0 = ", s0));
    MainInputsAndExpected m = MakeMain(s0);
    absl::StatusOr<std::vector<at::Tensor>> out = (*exec)->Run(m.inputs);
    ASSERT_TRUE(out.ok()) << out.status();
    const at::Tensor& v = (*out)[0];
    const at::Tensor& r = (*out)[1];
    EXPECT_TRUE(Close(v, m.z + 1));
    EXPECT_EQ(v.strides(), at::IntArrayRef({3, 1}));
    // v lies over t's storage ([s0, 4] floats), not a fresh [s0, 3] one.
    EXPECT_EQ(v.storage().nbytes(), static_cast<size_t>(s0 * 4 * 4));
    EXPECT_EQ(r.scalar_type(), at::kInt);
    EXPECT_TRUE(at::equal(r, at::arange(s0, at::kInt)));
    EXPECT_EQ(r.storage().nbytes(), static_cast<size_t>(s0 * 3 * 4));  // u's
  }
}

TEST(PlanExecutorTest, ReuseFallsBackToAFreshTensorWhenUnsafeOrTooSmall) {
  PlanMaker p = MainInputs();
  p.Alloc("t", {Sym("s0"), Int(4)}, {Int(4), Int(1)})
      .Launch("scale_add", {"x", "b", "t"})
      .View("tv", "t", {Sym("s0"), Int(4)}, {Int(4), Int(1)})
      .Free("t")
      // tv still shows t's storage: reusing it would clobber tv.
      .Alloc("r", {Sym("s0")}, {Int(1)}, /*reuse=*/"t", v1::INT32)
      .Launch("iota_s0", {"r"})
      .Alloc("q", {Sym("s0"), Int(4)}, {Int(4), Int(1)})
      .Launch("scale_add", {"x", "b", "q"})
      .Free("q")
      // Larger than q.
      .Alloc("big", {Sym("s0"), Int(8)}, {Int(8), Int(1)}, /*reuse=*/"q")
      .Outputs({"tv", "r", "big"});
  absl::StatusOr<std::unique_ptr<PlanExecutor>> exec = PlanExecutor::Create(p.graph());
  ASSERT_TRUE(exec.ok()) << exec.status();
  const int64_t s0 = 6;
  MainInputsAndExpected m = MakeMain(s0);
  absl::StatusOr<std::vector<at::Tensor>> out = (*exec)->Run(m.inputs);
  ASSERT_TRUE(out.ok()) << out.status();
  const at::Tensor& tv = (*out)[0];
  const at::Tensor& r = (*out)[1];
  const at::Tensor& big = (*out)[2];
  EXPECT_TRUE(Close(tv, m.y));
  EXPECT_FALSE(r.storage().is_alias_of(tv.storage()));
  EXPECT_EQ(r.storage().nbytes(), static_cast<size_t>(s0 * 4));
  EXPECT_TRUE(at::equal(r, at::arange(s0, at::kInt)));
  EXPECT_EQ(big.sizes(), at::IntArrayRef({s0, 8}));
  EXPECT_EQ(big.storage().nbytes(), static_cast<size_t>(s0 * 8 * 4));
}

TEST(PlanExecutorTest, ExpressionsUseFloorSemantics) {
  // A view of rows [s0 // 2, s0) of y, offset (s0 // 2) * 4.
  PlanMaker p = MainInputs();
  p.Alloc("y", {Sym("s0"), Int(4)}, {Int(4), Int(1)})
      .Launch("scale_add", {"x", "b", "y"})
      .View("tail", "y", {Sym("s0 - s0 // 2"), Int(4)}, {Int(4), Int(1)}, Sym("(s0 // 2) * 4"))
      .Outputs({"tail"});
  absl::StatusOr<std::unique_ptr<PlanExecutor>> exec = PlanExecutor::Create(p.graph());
  ASSERT_TRUE(exec.ok()) << exec.status();
  for (int64_t s0 : {1, 5, 8}) {
    MainInputsAndExpected m = MakeMain(s0);
    absl::StatusOr<std::vector<at::Tensor>> out = (*exec)->Run(m.inputs);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(Close((*out)[0], m.y.slice(0, s0 / 2)));
  }
}

TEST(PlanExecutorTest, RunIsThreadSafe) {
  absl::StatusOr<std::unique_ptr<PlanExecutor>> exec = PlanExecutor::Create(MainPlan());
  ASSERT_TRUE(exec.ok()) << exec.status();
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        MainInputsAndExpected m = MakeMain(1 + (t * 7 + i) % 13);
        absl::StatusOr<std::vector<at::Tensor>> out = (*exec)->Run(m.inputs);
        if (!out.ok() || !Close((*out)[2], m.z)) ++failures[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_THAT(failures, ::testing::Each(0));
}

TEST(PlanExecutorTest, OutputsCarryNoGradFn) {
  absl::StatusOr<std::unique_ptr<PlanExecutor>> exec = PlanExecutor::Create(MainPlan());
  ASSERT_TRUE(exec.ok()) << exec.status();
  MainInputsAndExpected m = MakeMain(3);
  m.inputs[2].set_requires_grad(true);
  absl::StatusOr<std::vector<at::Tensor>> out = (*exec)->Run(m.inputs);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE((*out)[2].requires_grad());
}

// An extern whose ATen kernel returns another dtype than the node's metadata
// (as batch norm's running statistics do on CUDA) yields the node's dtype:
// the plan's later steps were compiled for it.
TEST(PlanExecutorTest, ExternOutputsTakeTheDtypeTheGraphGives) {
  PlanMaker p;
  p.Input("x", {Int(3), Int(4)}, {Int(4), Int(1)})
      .Extern("r", "aten.relu.default", {TensorArg("x")}, {"y"})
      .Outputs({"y"});
  v1::CompiledGraph graph = p.graph();
  v1::TensorMeta* meta = graph.mutable_plan()
                             ->mutable_steps(0)
                             ->mutable_extern_call()
                             ->mutable_node()
                             ->mutable_outputs(0)
                             ->mutable_meta();
  meta->set_dtype(v1::FLOAT64);
  absl::StatusOr<std::unique_ptr<PlanExecutor>> exec = PlanExecutor::Create(graph);
  ASSERT_TRUE(exec.ok()) << exec.status();
  const at::Tensor x = at::randn({3, 4});
  absl::StatusOr<std::vector<at::Tensor>> out = (*exec)->Run({x});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].scalar_type(), at::kDouble);
  EXPECT_TRUE(at::allclose((*out)[0], at::relu(x).to(at::kDouble)));
}

// ------------------------------------------------------------- run errors

absl::Status RunMain(const std::vector<at::Tensor>& inputs) {
  absl::StatusOr<std::unique_ptr<PlanExecutor>> exec = PlanExecutor::Create(MainPlan());
  if (!exec.ok()) return exec.status();
  return (*exec)->Run(inputs).status();
}

TEST(PlanExecutorErrorTest, WrongInputsAreInvalidArguments) {
  const at::Tensor x = at::randn({3, 4});
  const at::Tensor b = at::randn({4});
  const at::Tensor w = at::randn({4, 3});
  ASSERT_TRUE(RunMain({x, b, w}).ok());

  absl::Status s = RunMain({x, b});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("takes 3 inputs, got 2"));

  s = RunMain({x.to(at::kDouble), b, w});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("input 0 ('x')"), HasSubstr("torch.float64")));

  s = RunMain({x, b.unsqueeze(0), w});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("input 1 ('b')"), HasSubstr("rank 2")));

  s = RunMain({x, at::randn({5}), w});  // b's size is a constant 4
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("input 1 ('b') dim 0 is 5"), HasSubstr("expects 4")));

  s = RunMain({at::randn({4, 3}).t(), b, w});  // the kernel reads x row-major
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("input 0 ('x') dim 0 has stride 1"), HasSubstr("expects 4")));

  s = RunMain({x, at::Tensor(), w});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("input 1 ('b') is an undefined tensor"));

  s = RunMain({x, b, at::empty({4, 3}, at::TensorOptions().device(at::kMeta))});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("input 2 ('w') is on meta; the plan expects cpu"));
}

TEST(PlanExecutorErrorTest, BindingsOfOneSymbolMustAgree) {
  PlanMaker p;
  p.Input("x", {Sym("s0"), Int(4)}, {Int(4), Int(1)})
      .Input("y", {Sym("s0"), Int(4)}, {Int(4), Int(1)})
      .Bind("s0", 0, 0)
      .Bind("s0", 1, 0)
      .Extern("add", "aten.add.Tensor", {TensorArg("x"), TensorArg("y")}, {"z"})
      .Outputs({"z"});
  absl::StatusOr<std::unique_ptr<PlanExecutor>> exec = PlanExecutor::Create(p.graph());
  ASSERT_TRUE(exec.ok()) << exec.status();
  absl::StatusOr<std::vector<at::Tensor>> ok = (*exec)->Run({at::randn({3, 4}), at::randn({3, 4})});
  ASSERT_TRUE(ok.ok()) << ok.status();
  absl::StatusOr<std::vector<at::Tensor>> out =
      (*exec)->Run({at::randn({3, 4}), at::randn({5, 4})});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(),
              AllOf(HasSubstr("input 1 ('y') dim 0 is 5"), HasSubstr("symbol s0 is 3"),
                    HasSubstr("input 0 ('x') dim 0")));
}

TEST(PlanExecutorErrorTest, AnAtenErrorNamesTheStep) {
  PlanMaker p = MainInputs();
  p.Extern("mm", "aten.mm.default", {TensorArg("x"), TensorArg("x")}, {"z"}).Outputs({"z"});
  absl::StatusOr<std::unique_ptr<PlanExecutor>> exec = PlanExecutor::Create(p.graph());
  ASSERT_TRUE(exec.ok()) << exec.status();
  absl::StatusOr<std::vector<at::Tensor>> out = (*exec)->Run(MakeMain(3).inputs);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(out.status().message(),
              AllOf(HasSubstr("step 0 (extern 'mm')"), HasSubstr("3x4 and 3x4")));
}

// ---------------------------------------------------------- create errors

absl::Status CreateStatus(const PlanMaker& p) { return PlanExecutor::Create(p.graph()).status(); }

TEST(PlanExecutorErrorTest, AMissingKernelIsNotFound) {
  PlanMaker p = MainInputs();
  p.Alloc("y", {Sym("s0"), Int(4)}, {Int(4), Int(1)})
      .Launch("no_such_kernel", {"x", "b", "y"})
      .Outputs({"y"});
  absl::Status s = CreateStatus(p);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("step 1"), HasSubstr("'no_such_kernel'")));
}

TEST(PlanExecutorErrorTest, AnUnknownOperatorIsNotFound) {
  PlanMaker p = MainInputs();
  p.Extern("bogus", "aten.no_such_op.default", {TensorArg("x")}, {"y"}).Outputs({"y"});
  absl::Status s = CreateStatus(p);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("step 0 (extern 'bogus')"), HasSubstr("no_such_op")));
}

TEST(PlanExecutorErrorTest, MalformedPlansAreInvalidArguments) {
  {  // a symbol no binding defines
    PlanMaker p = MainInputs();
    p.Alloc("y", {Sym("s1"), Int(4)}, {Int(4), Int(1)}).Outputs({"y"});
    absl::Status s = CreateStatus(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), AllOf(HasSubstr("step 0 (alloc 'y')"), HasSubstr("'s1'")));
  }
  {  // a malformed expression
    PlanMaker p = MainInputs();
    p.Alloc("y", {Sym("s0 +"), Int(4)}, {Int(4), Int(1)}).Outputs({"y"});
    EXPECT_EQ(CreateStatus(p).code(), absl::StatusCode::kInvalidArgument);
  }
  {  // a value read before it is defined
    PlanMaker p = MainInputs();
    p.Launch("scale_add", {"x", "b", "y"}).Outputs({"x"});
    absl::Status s = CreateStatus(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), AllOf(HasSubstr("step 0"), HasSubstr("'y' is not defined")));
  }
  {  // a value read after it is freed
    PlanMaker p = MainInputs();
    p.Alloc("y", {Sym("s0"), Int(4)}, {Int(4), Int(1)})
        .Free("y")
        .Launch("scale_add", {"x", "b", "y"})
        .Outputs({"x"});
    absl::Status s = CreateStatus(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), AllOf(HasSubstr("step 2"), HasSubstr("'y' was freed")));
  }
  {  // a value defined twice
    PlanMaker p = MainInputs();
    p.Alloc("x", {Int(1)}, {Int(1)}).Outputs({"x"});
    EXPECT_THAT(CreateStatus(p).message(), HasSubstr("'x' is defined twice"));
  }
  {  // reuse of a live value, and of an input
    PlanMaker p = MainInputs();
    p.Alloc("y", {Int(1)}, {Int(1)}).Alloc("z", {Int(1)}, {Int(1)}, "y").Outputs({"z"});
    EXPECT_THAT(CreateStatus(p).message(), HasSubstr("reuse names 'y'"));
    PlanMaker q = MainInputs();
    q.Free("b").Alloc("z", {Int(1)}, {Int(1)}, "b").Outputs({"z"});
    EXPECT_THAT(CreateStatus(q).message(), HasSubstr("reuse names 'b'"));
  }
  {  // a module out of range
    PlanMaker p = MainInputs();
    p.Launch("scale_add", {"x"}, /*module=*/3).Outputs({"x"});
    EXPECT_THAT(CreateStatus(p).message(), HasSubstr("module 3 out of range"));
  }
  {  // a binding of a dim the input lacks
    PlanMaker p = MainInputs();
    p.Bind("s1", 1, 1).Outputs({"x"});
    EXPECT_THAT(CreateStatus(p).message(), HasSubstr("plan.symbols[1] ('s1'): dim 1 out of range"));
  }
  {  // an output that was freed
    PlanMaker p = MainInputs();
    p.Free("x").Outputs({"x"});
    EXPECT_THAT(CreateStatus(p).message(), HasSubstr("plan.outputs[0]"));
  }
}

// ------------------------------------------------------------ the loader

TEST(ModuleLoaderTest, LoadsEachBinaryOnce) {
  ModuleLoader loader;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::unique_ptr<PlanExecutor>> exec = PlanExecutor::Create(MainPlan(), loader);
    ASSERT_TRUE(exec.ok()) << exec.status();
  }
  EXPECT_EQ(loader.loads(), 1);

  // Another binary defining the same names: loaded on its own, and each
  // handle finds its own code.
  absl::StatusOr<std::shared_ptr<const LoadedModule>> a = loader.Load(KernelBinary());
  absl::StatusOr<std::shared_ptr<const LoadedModule>> b = loader.Load(OtherBinary());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(loader.loads(), 2);
  EXPECT_NE(a->get(), b->get());
  EXPECT_NE((*a)->Symbol("scale_add").value(), (*b)->Symbol("scale_add").value());
  EXPECT_EQ((*a)->Symbol("kiln_which").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<void*> which = (*b)->Symbol("kiln_which");
  ASSERT_TRUE(which.ok()) << which.status();
  EXPECT_EQ(reinterpret_cast<int (*)()>(*which)(), 2);

  // The process-wide loader caches too.
  ASSERT_TRUE(PlanExecutor::Create(MainPlan()).ok());
  const int64_t before = ModuleLoader::Shared().loads();
  ASSERT_TRUE(PlanExecutor::Create(MainPlan()).ok());
  EXPECT_EQ(ModuleLoader::Shared().loads(), before);
}

TEST(ModuleLoaderTest, ABinaryThatIsNoSharedObjectIsInternal) {
  ModuleLoader loader;
  absl::StatusOr<std::shared_ptr<const LoadedModule>> m = loader.Load("not an ELF file");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(m.status().message(), HasSubstr("dlopen"));
  EXPECT_EQ(loader.Load("").status().code(), absl::StatusCode::kInvalidArgument);
}

// Modules come and go (each loader unloads what it loaded when it goes);
// the memfd paths they were opened from are reused, and each load must
// still get its own binary, not an object loaded earlier from that path.
TEST(ModuleLoaderTest, ModulesLoadedAfterOthersWereUnloadedAreTheirOwn) {
  for (int i = 0; i < 6; ++i) {
    SCOPED_TRACE(absl::StrCat("round ", i));
    const bool other = i % 2 == 1;
    ModuleLoader loader;
    absl::StatusOr<std::shared_ptr<const LoadedModule>> module =
        loader.Load(other ? OtherBinary() : KernelBinary());
    ASSERT_TRUE(module.ok()) << module.status();
    EXPECT_EQ((*module)->Symbol("kiln_which").ok(), other);
    EXPECT_TRUE((*module)->Symbol("scale_add").ok());
    v1::CompiledGraph graph = MainPlan();
    graph.mutable_modules(0)->set_binary(other ? OtherBinary() : KernelBinary());
    absl::StatusOr<std::unique_ptr<PlanExecutor>> exec = PlanExecutor::Create(graph, loader);
    ASSERT_TRUE(exec.ok()) << exec.status();
    EXPECT_EQ(loader.loads(), 1);
    MainInputsAndExpected m = MakeMain(4);
    absl::StatusOr<std::vector<at::Tensor>> out = (*exec)->Run(m.inputs);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(Close((*out)[2], m.z));
  }
}

// ----------------------------------------------------- CompiledFunction

v1::Artifact KilnArtifact() {
  v1::Artifact a;
  a.set_format_version(1);
  a.set_backend("kiln");
  a.mutable_graph()->set_name("main");
  return a;
}

TEST(CompiledFunctionKilnTest, InferenceRunsThePlan) {
  v1::Artifact artifact = KilnArtifact();
  *artifact.mutable_compiled() = MainPlan();
  absl::StatusOr<std::unique_ptr<CompiledFunction>> fn = CompiledFunction::Create(artifact);
  ASSERT_TRUE(fn.ok()) << fn.status();
  EXPECT_EQ((*fn)->num_inputs(), 3);
  EXPECT_EQ((*fn)->num_outputs(), 4);
  for (int64_t s0 : {1, 5, 17}) {
    MainInputsAndExpected m = MakeMain(s0);
    absl::StatusOr<CompiledFunction::ForwardResult> r = (*fn)->forward(m.inputs);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(Close(r->outputs[0], m.y));
    EXPECT_TRUE(Close(r->outputs[2], m.z));
  }
  MainInputsAndExpected m = MakeMain(2);
  EXPECT_EQ((*fn)->backward({}, {}).status().code(), absl::StatusCode::kFailedPrecondition);

  // It cannot give outputs a grad_fn; under no_grad it runs.
  m.inputs[2].set_requires_grad(true);
  absl::StatusOr<CompiledFunction::ForwardResult> r = (*fn)->forward(m.inputs);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("input 2 requires grad"));
  c10::AutoGradMode no_grad(false);
  EXPECT_TRUE((*fn)->forward(m.inputs).ok());
}

// out = y * y with y = x * 2 + b; the backward gets y (saved) and dout:
// dy = 2 * y * dout, dx = 2 * dy, db = sum(dy, 0).
TEST(CompiledFunctionKilnTest, TrainingRunsTheForwardAndBackwardPlans) {
  v1::Artifact artifact = KilnArtifact();
  PlanMaker fwd;
  fwd.Input("x", {Sym("s0"), Int(4)}, {Int(4), Int(1)})
      .Input("b", {Int(4)}, {Int(1)})
      .Bind("s0", 0, 0)
      .Alloc("y", {Sym("s0"), Int(4)}, {Int(4), Int(1)})
      .Launch("scale_add", {"x", "b", "y"})
      .Extern("sq", "aten.mul.Tensor", {TensorArg("y"), TensorArg("y")}, {"out"})
      .Outputs({"out", "y"});
  PlanMaker bwd;
  bwd.Input("y", {Sym("s0"), Int(4)}, {Int(4), Int(1)})
      .Input("dout", {Sym("s0"), Int(4)}, {Int(4), Int(1)})
      .Bind("s0", 0, 0)
      .Bind("s0", 1, 0)
      .Extern("m0", "aten.mul.Tensor", {TensorArg("y"), TensorArg("dout")}, {"t0"})
      .Extern("m1", "aten.mul.Scalar", {TensorArg("t0"), IntArg(2)}, {"dy"})
      .Free("t0")
      .Extern("m2", "aten.mul.Scalar", {TensorArg("dy"), IntArg(2)}, {"dx"})
      .Extern("s", "aten.sum.dim_IntList", {TensorArg("dy"), IntsArg({0})}, {"db"})
      .Outputs({"dx", "db"});
  *artifact.mutable_compiled_forward() = fwd.graph();
  *artifact.mutable_compiled_backward() = bwd.graph();
  v1::AutogradGraphs* ag = artifact.mutable_autograd();
  ag->set_num_forward_outputs(1);
  ag->add_saved("y");
  ag->add_inputs_need_grad(true);
  ag->add_inputs_need_grad(true);
  ag->add_outputs_receive_grad(true);
  ag->add_grad_input_index(0);
  ag->add_grad_input_index(1);

  absl::StatusOr<std::unique_ptr<CompiledFunction>> fn = CompiledFunction::Create(artifact);
  ASSERT_TRUE(fn.ok()) << fn.status();
  for (int64_t s0 : {1, 5, 17}) {
    SCOPED_TRACE(absl::StrCat("s0 = ", s0));
    at::Tensor x = at::randn({s0, 4});
    at::Tensor b = at::randn({4});
    at::Tensor dout = at::randn({s0, 4});
    at::Tensor y = x * 2 + b;
    absl::StatusOr<CompiledFunction::ForwardResult> r = (*fn)->forward({x, b});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->outputs.size(), 1u);
    EXPECT_TRUE(Close(r->outputs[0], y * y));
    absl::StatusOr<std::vector<at::Tensor>> grads = (*fn)->backward(r->saved, {dout});
    ASSERT_TRUE(grads.ok()) << grads.status();
    const at::Tensor dy = 2 * y * dout;
    EXPECT_TRUE(Close((*grads)[0], 2 * dy));
    EXPECT_TRUE(Close((*grads)[1], at::sum(dy, {0})));
  }

  // The bookkeeping is checked against the plans.
  artifact.mutable_autograd()->add_saved("extra");
  absl::StatusOr<std::unique_ptr<CompiledFunction>> bad = CompiledFunction::Create(artifact);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  v1::Artifact missing = KilnArtifact();
  *missing.mutable_compiled_forward() = fwd.graph();
  EXPECT_THAT(CompiledFunction::Create(missing).status().message(),
              HasSubstr("artifact.compiled_backward is missing"));
}

TEST(CompiledFunctionKilnTest, PlanErrorsNameTheField) {
  v1::Artifact artifact = KilnArtifact();
  PlanMaker p = MainInputs();
  p.Launch("no_such_kernel", {"x"}).Outputs({"x"});
  *artifact.mutable_compiled() = p.graph();
  absl::Status s = CompiledFunction::Create(artifact).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("artifact.compiled: step 0"));
  EXPECT_EQ(CompiledFunction::Create(KilnArtifact()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kiln::runtime
