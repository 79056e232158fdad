// PlanExecutor on plans with cuda modules, as far as a machine without a GPU
// can check them (the GPU suite, tests/gpu, runs them), and on externs whose
// results ATen lays out other than the graph says.
#include <ATen/ops/allclose.h>
#include <ATen/ops/randn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "client/runtime/cuda_module.h"
#include "client/runtime/plan_executor.h"
#include "client/runtime/plan_test_util.h"

namespace kiln::runtime {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using plan_test::Int;
using plan_test::Sym;

// x: float32 [s0] on `device`, s0 bound to its size; a cuda module (whose
// bytes are only loaded when a kernel runs) and one launch of "k" over x and
// y with the given grid and block.
v1::CompiledGraph CudaPlan(const std::vector<v1::SymInt>& grid,
                           const std::vector<v1::SymInt>& block,
                           const std::string& device = "cuda") {
  v1::CompiledGraph g;
  v1::CompiledModule* m = g.add_modules();
  m->set_language("cuda");
  m->set_binary("not loaded before a kernel runs");
  v1::ExecutionPlan* p = g.mutable_plan();
  v1::Value* x = p->add_inputs()->mutable_value();
  x->set_name("x");
  x->mutable_meta()->set_dtype(v1::FLOAT32);
  *x->mutable_meta()->add_sizes() = Sym("s0");
  *x->mutable_meta()->add_strides() = Int(1);
  x->mutable_meta()->mutable_device()->set_type(device);
  v1::SymbolBinding* b = p->add_symbols();
  b->set_symbol("s0");
  b->set_input(0);
  b->set_dim(0);
  v1::PlanStep::Alloc* a = p->add_steps()->mutable_alloc();
  a->set_value("y");
  a->set_dtype(v1::FLOAT32);
  *a->add_sizes() = Sym("s0");
  *a->add_strides() = Int(1);
  a->mutable_device()->set_type(device);
  a->mutable_device()->set_index(-1);
  v1::PlanStep::Launch* l = p->add_steps()->mutable_launch();
  l->set_module(0);
  l->set_symbol("k");
  l->add_buffers("x");
  l->add_buffers("y");
  for (const v1::SymInt& s : grid) *l->add_grid() = s;
  for (const v1::SymInt& s : block) *l->add_block() = s;
  p->add_outputs("y");
  return g;
}

absl::Status CreateStatus(const v1::CompiledGraph& g, absl::string_view arch = "sm_90") {
  return PlanExecutor::Create(g, arch).status();
}

TEST(CudaPlanTest, ACudaPlanIsCheckedAtCreateWithoutLoadingItsModule) {
  if (!CudaRuntimeAvailable()) GTEST_SKIP() << "runtime built without CUDA";
  absl::StatusOr<std::unique_ptr<PlanExecutor>> e =
      PlanExecutor::Create(CudaPlan({Sym("(s0 + 127) // 128")}, {Int(128)}), "sm_90");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->num_inputs(), 1);
  EXPECT_EQ((*e)->num_outputs(), 1);
}

TEST(CudaPlanTest, MalformedCudaPlansAreInvalidArguments) {
  if (!CudaRuntimeAvailable()) GTEST_SKIP() << "runtime built without CUDA";
  const v1::CompiledGraph ok = CudaPlan({Sym("s0")}, {Int(128)});
  // The launch's alignment and written flags, one each per buffer.
  auto aligned = [&](std::vector<int> alignment, std::vector<bool> written) {
    v1::CompiledGraph g = ok;
    v1::PlanStep::Launch* l = g.mutable_plan()->mutable_steps(1)->mutable_launch();
    for (int a : alignment) l->add_alignment(a);
    for (bool w : written) l->add_written(w);
    return g;
  };
  ASSERT_TRUE(CreateStatus(aligned({16, 0}, {false, true})).ok());
  struct Case {
    v1::CompiledGraph graph;
    std::string arch;
    std::string message;
  };
  const Case cases[] = {
      {ok, "", "modules[0]: a cuda module needs the artifact's target.sm_arch"},
      {ok, "gfx90a", "modules[0]: the artifact's sm_arch 'gfx90a' is not an SM arch"},
      {ok, "sm_9", "is not an SM arch"},
      {CudaPlan({Sym("s0"), Int(1)}, {Int(128)}), "sm_90",
       "step 1 (launch 'k'): a cuda launch needs one grid size and one constant block size"},
      {CudaPlan({Sym("s0")}, {Sym("s0")}), "sm_90", "one constant block size"},
      {CudaPlan({Sym("s0")}, {Int(2048)}), "sm_90",
       "step 1 (launch 'k'): block size 2048 is outside [1, 1024]"},
      {CudaPlan({Sym("s1 + 1")}, {Int(128)}), "sm_90",
       "step 1 (launch 'k'): grid[0]: 's1 + 1' uses the symbol 's1'"},
      {aligned({16}, {false}), "sm_90",
       "step 1 (launch 'k'): 1 alignments and 1 written flags for 2 buffers"},
      {aligned({16, 16}, {true}), "sm_90", "2 alignments and 1 written flags for 2 buffers"},
      {aligned({16, 12}, {false, true}), "sm_90",
       "step 1 (launch 'k'): alignment 12 of buffer 'y' is not 0 or a power of two up to 256"},
      {aligned({-4, 0}, {false, true}), "sm_90", "alignment -4 of buffer 'x'"},
      {aligned({1024, 0}, {false, true}), "sm_90", "alignment 1024 of buffer 'x'"},
  };
  for (const Case& c : cases) {
    absl::Status s = CreateStatus(c.graph, c.arch);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(c.message));
  }
  v1::CompiledGraph empty = ok;
  empty.mutable_modules(0)->clear_binary();
  EXPECT_THAT(CreateStatus(empty).message(),
              HasSubstr("modules[0]: the cuda module has no binary"));
}

TEST(CudaPlanTest, ACudaKernelRefusesHostBuffers) {
  if (!CudaRuntimeAvailable()) GTEST_SKIP() << "runtime built without CUDA";
  absl::StatusOr<std::unique_ptr<PlanExecutor>> e =
      PlanExecutor::Create(CudaPlan({Sym("s0")}, {Int(128)}, "cpu"), "sm_90");
  ASSERT_TRUE(e.ok()) << e.status();
  absl::StatusOr<std::vector<at::Tensor>> out = (*e)->Run({at::randn({8})});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(),
              AllOf(HasSubstr("step 1 (launch 'k')"), HasSubstr("buffer 'x' is on cpu"),
                    HasSubstr("a cuda kernel needs defined tensors on one GPU")));
}

TEST(CudaPlanTest, AnUnknownLanguageIsAFailedPrecondition) {
  v1::CompiledGraph g = CudaPlan({Sym("s0")}, {Int(128)});
  g.mutable_modules(0)->set_language("rocm");
  absl::Status s = CreateStatus(g);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("modules[0]: language 'rocm'"));
}

// t = aten.t(x) with x [4, 3]: ATen returns the transposed view, strides
// [1, 3]; the graph gives t the strides [4, 1], which kernels would address
// it by, so the executor copies it into that layout.
TEST(ExternLayoutTest, AnExternResultIsCopiedIntoTheStridesTheGraphGives) {
  v1::CompiledGraph g;
  v1::ExecutionPlan* p = g.mutable_plan();
  v1::Value* x = p->add_inputs()->mutable_value();
  x->set_name("x");
  x->mutable_meta()->set_dtype(v1::FLOAT32);
  for (int64_t s : {4, 3}) *x->mutable_meta()->add_sizes() = Int(s);
  for (int64_t s : {3, 1}) *x->mutable_meta()->add_strides() = Int(s);
  for (const char* name : {"t"}) {
    v1::Node* n = p->add_steps()->mutable_extern_call()->mutable_node();
    n->set_name(name);
    n->set_target("aten.t.default");
    n->add_args()->set_tensor("x");
    v1::Value* out = n->add_outputs();
    out->set_name(name);
    out->mutable_meta()->set_dtype(v1::FLOAT32);
    for (int64_t s : {3, 4}) *out->mutable_meta()->add_sizes() = Int(s);
    for (int64_t s : {4, 1}) *out->mutable_meta()->add_strides() = Int(s);
  }
  p->add_outputs("t");
  absl::StatusOr<std::unique_ptr<PlanExecutor>> e = PlanExecutor::Create(g);
  ASSERT_TRUE(e.ok()) << e.status();
  const at::Tensor in = at::randn({4, 3});
  absl::StatusOr<std::vector<at::Tensor>> out = (*e)->Run({in});
  ASSERT_TRUE(out.ok()) << out.status();
  const at::Tensor& t = (*out)[0];
  EXPECT_EQ(t.strides(), (std::vector<int64_t>{4, 1}));
  EXPECT_TRUE(at::allclose(t, in.t()));
  EXPECT_NE(t.data_ptr(), in.data_ptr()) << "a copy, not the view";
}

}  // namespace
}  // namespace kiln::runtime
