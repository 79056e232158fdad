// Split reductions (compiler/loop/split_reductions.h) end to end: kernels
// split with a policy that splits everything it may, generated as C++,
// compiled with g++, run by the plan executor and compared with the
// reference interpreter on fresh random inputs; and generated as CUDA C++
// and compiled by NVRTC, where it is installed.
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "client/runtime/interpreter.h"
#include "client/runtime/plan_executor.h"
#include "compiler/codegen/codegen.h"
#include "compiler/ir/builder.h"
#include "compiler/loop/lowering.h"
#include "compiler/loop/split_reductions.h"
#include "compiler/ops/registry.h"

namespace kiln::runtime {
namespace {

using ir::Ref;

ir::TensorMeta Meta(std::vector<int64_t> sizes, v1::DType dtype = v1::FLOAT32) {
  ir::TensorMeta m;
  m.dtype = dtype;
  m.device_type = "cpu";
  int64_t stride = 1;
  m.strides.resize(sizes.size());
  for (size_t d = sizes.size(); d-- > 0;) {
    m.strides[d] = ir::SymInt{stride};
    stride *= sizes[d];
  }
  for (int64_t s : sizes) m.sizes.push_back(ir::SymInt{s});
  return m;
}

ir::ValueId Op(ir::GraphBuilder& b, const std::string& target, std::vector<ir::Argument> args,
               std::vector<ir::Argument> kwargs = {}) {
  auto out = ops::Emit(b, ops::DefaultRegistry(), target, std::move(args), std::move(kwargs));
  EXPECT_TRUE(out.ok()) << target << ": " << out.status();
  return out.ok() ? (*out)[0] : ir::kNoValue;
}

ir::Argument Dims(std::vector<int64_t> dims) { return ir::Ints(std::move(dims)); }

// Every reduction kernel launches one block, and wants 4.
loop::SplitPolicy Eager() {
  loop::SplitPolicy p;
  p.blocks = [](const loop::Kernel&) -> std::optional<int64_t> { return 1; };
  p.split_below = 4;
  p.min_blocks = 4;
  p.min_slice = 8;
  return p;
}

struct Case {
  std::string name;
  std::vector<ir::TensorMeta> inputs;
  std::function<void(ir::GraphBuilder&, const std::vector<ir::ValueId>&)> body;
  int splits;                           // kernels the policy must split
  int added = -1;                       // kernels the splits add (-1: one per split)
  std::vector<std::string> names = {};  // input names (default in0, in1, ...)
};

void Check(const Case& c) {
  SCOPED_TRACE(c.name);
  ir::GraphBuilder b(c.name);
  std::vector<ir::ValueId> ins;
  std::vector<at::Tensor> inputs;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const std::string name = i < c.names.size() ? c.names[i] : "in" + std::to_string(i);
    ins.push_back(b.AddInput(c.inputs[i], v1::Placeholder::USER_INPUT, name));
    std::vector<int64_t> sizes;
    for (const ir::SymInt& s : c.inputs[i].sizes) sizes.push_back(s.constant());
    const bool bf16 = c.inputs[i].dtype == v1::BFLOAT16;
    inputs.push_back(at::randn(sizes).to(bf16 ? at::kBFloat16 : at::kFloat));
  }
  c.body(b, ins);
  const ir::Graph g = std::move(b).Build();

  absl::StatusOr<loop::LoweredGraph> lowered = loop::LowerGraph(g);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  const size_t before = lowered->kernels.size();
  loop::SplitReductions(Eager(), &*lowered);
  // As the pipeline does: the memory plan again, to free the partials.
  loop::PlanMemory(&lowered->plan);
  int splits = 0;
  for (const std::string& d : lowered->decisions) splits += absl::StartsWith(d, "split: ");
  EXPECT_EQ(splits, c.splits) << absl::StrJoin(lowered->decisions, "\n");
  EXPECT_EQ(lowered->kernels.size(), before + (c.added < 0 ? splits : c.added));
  EXPECT_EQ(lowered->plan.kernels(), static_cast<int>(lowered->kernels.size()));

  v1::CompiledGraph cg;
  *cg.mutable_plan() = lowered->plan;
  auto backend = codegen::MakeCppBackend({});
  absl::StatusOr<std::string> source = backend->Generate(lowered->kernels, lowered->symbols);
  ASSERT_TRUE(source.ok()) << source.status();
  absl::StatusOr<v1::CompiledModule> module = backend->Compile(*source);
  ASSERT_TRUE(module.ok()) << module.status();
  *cg.add_modules() = *std::move(module);
  absl::StatusOr<std::unique_ptr<PlanExecutor>> exec = PlanExecutor::Create(cg);
  ASSERT_TRUE(exec.ok()) << exec.status();
  absl::StatusOr<std::vector<at::Tensor>> got = (*exec)->Run(inputs);
  ASSERT_TRUE(got.ok()) << got.status();
  absl::StatusOr<std::vector<at::Tensor>> want = RunGraph(g, inputs);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(got->size(), want->size());
  for (size_t i = 0; i < got->size(); ++i) {
    const at::Tensor& a = (*got)[i];
    const at::Tensor& w = (*want)[i];
    ASSERT_EQ(a.sizes(), w.sizes()) << "output " << i;
    const bool half = a.scalar_type() == at::kBFloat16;
    EXPECT_TRUE(
        at::allclose(a.to(at::kDouble), w.to(at::kDouble), half ? 2e-2 : 1e-4, half ? 2e-2 : 1e-4))
        << "output " << i << "\n got " << a << "\nwant " << w;
  }

  // The same kernels as CUDA C++, compiled by NVRTC where it is installed.
  auto nvrtc = codegen::MakeCudaBackend(codegen::CudaOptions());
  absl::StatusOr<std::string> cu = nvrtc->Generate(lowered->kernels, lowered->symbols);
  ASSERT_TRUE(cu.ok()) << cu.status();
  absl::StatusOr<v1::CompiledModule> cubin = nvrtc->Compile(*cu);
  if (!cubin.ok() && absl::StrContains(cubin.status().message(), "libnvrtc")) {
    GTEST_SKIP() << "NVRTC is not installed: " << cubin.status();
  }
  ASSERT_TRUE(cubin.ok()) << cubin.status();
}

TEST(SplitReductionsTest, ColumnSum) {
  Check({"column sum",
         {Meta({64, 48})},
         [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
           b.AddOutput(Op(b, "aten.sum.dim_IntList", {Ref(in[0]), Dims({0})}));
         },
         1});
}

TEST(SplitReductionsTest, RowMeanOfAProductWithItsEpilogue) {
  Check({"row mean",
         {Meta({6, 96}), Meta({6, 96})},
         [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
           ir::ValueId p = Op(b, "aten.mul.Tensor", {Ref(in[0]), Ref(in[1])});
           ir::ValueId m = Op(b, "aten.mean.dim", {Ref(p), Dims({-1})});
           b.AddOutput(Op(b, "aten.sqrt.default", {Ref(Op(b, "aten.abs.default", {Ref(m)}))}));
         },
         1});
}

TEST(SplitReductionsTest, MaxAndMinSiblingsShareTheSplit) {
  Check({"amax and amin",
         {Meta({32, 10})},
         [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
           b.AddOutput(Op(b, "aten.amax.default", {Ref(in[0]), Dims({0})}));
           b.AddOutput(Op(b, "aten.amin.default", {Ref(in[0]), Dims({0})}));
         },
         1});
}

TEST(SplitReductionsTest, SeveralInnerDimensions) {
  Check({"sum over N, H, W",
         {Meta({8, 4, 6, 5})},
         [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
           b.AddOutput(Op(b, "aten.sum.dim_IntList", {Ref(in[0]), Dims({0, 2, 3})}));
         },
         1});
}

TEST(SplitReductionsTest, KernelsThatAlsoStoreTheWholeSpace) {
  Check({"relu and its column sum",
         {Meta({40, 12})},
         [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
           ir::ValueId r = Op(b, "aten.relu.default", {Ref(in[0])});
           b.AddOutput(r);
           b.AddOutput(Op(b, "aten.sum.dim_IntList", {Ref(r), Dims({0})}));
         },
         1});
}

TEST(SplitReductionsTest, EpilogueReadsPerRowValues) {
  Check({"sum times weight plus bias",
         {Meta({64, 16}), Meta({16}), Meta({16})},
         [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
           ir::ValueId s = Op(b, "aten.sum.dim_IntList", {Ref(in[0]), Dims({0})});
           ir::ValueId m = Op(b, "aten.mul.Tensor", {Ref(s), Ref(in[1])});
           b.AddOutput(Op(b, "aten.add.Tensor", {Ref(m), Ref(in[2])}));
         },
         1});
}

TEST(SplitReductionsTest, BFloat16AccumulatesInFloat) {
  Check({"bfloat16 column sum",
         {Meta({128, 24}, v1::BFLOAT16)},
         [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
           b.AddOutput(Op(b, "aten.sum.dim_IntList", {Ref(in[0]), Dims({0})}));
         },
         1});
}

ir::ValueId Var(ir::GraphBuilder& b, ir::ValueId x, std::vector<int64_t> dims, bool keep) {
  return Op(b, "aten.var.correction", {Ref(x), Dims(std::move(dims))},
            {ir::Kwarg("correction", ir::Int(0)), ir::Kwarg("keepdim", ir::Bool(keep))});
}

ir::ValueId Mean(ir::GraphBuilder& b, ir::ValueId x, std::vector<int64_t> dims, bool keep) {
  return Op(b, "aten.mean.dim", {Ref(x), Dims(std::move(dims)), ir::Bool(keep)});
}

// Rows longer than the two-pass limit use Welford: the slices' means and
// M2s merge by Chan's formula.
TEST(SplitReductionsTest, WelfordVarianceAndMeanOfLongRows) {
  Check({"welford rows",
         {Meta({4, 32768})},
         [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
           b.AddOutput(Op(b, "aten.add.Tensor",
                          {Ref(Var(b, in[0], {-1}, false)), Ref(Mean(b, in[0], {-1}, false))}));
         },
         1});
}

// Batch norm's statistics per channel, then every element normalized with
// them: a second pass, run over the whole space by its own kernel.
TEST(SplitReductionsTest, BatchNormStatisticsThenTheNormalizedSpace) {
  Check({"batch norm",
         {Meta({32, 4, 32, 32})},
         [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
           ir::ValueId m = Mean(b, in[0], {0, 2, 3}, true);
           ir::ValueId v = Var(b, in[0], {0, 2, 3}, true);
           ir::ValueId centered = Op(b, "aten.sub.Tensor", {Ref(in[0]), Ref(m)});
           ir::ValueId rstd = Op(b, "aten.rsqrt.default",
                                 {Ref(Op(b, "aten.add.Scalar", {Ref(v), ir::Float(1e-5)}))});
           b.AddOutput(Op(b, "aten.mul.Tensor", {Ref(centered), Ref(rstd)}));
           b.AddOutput(m);
           b.AddOutput(v);
         },
         1,
         2});
}

TEST(SplitReductionsTest, RowSumThenEveryElementDivided) {
  Check({"row sum then divide",
         {Meta({4, 4096})},
         [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
           ir::ValueId e = Op(b, "aten.exp.default", {Ref(in[0])});
           ir::ValueId s = Op(b, "aten.sum.dim_IntList", {Ref(e), Dims({-1}), ir::Bool(true)});
           b.AddOutput(Op(b, "aten.div.Tensor", {Ref(e), Ref(s)}));
         },
         1,
         2});
}

// The new buffers take names no value of the plan has.
TEST(SplitReductionsTest, NewBuffersDoNotTakeTheNamesOfGraphValues) {
  Check({"names taken",
         {Meta({64, 48}), Meta({48}), Meta({48})},
         [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
           ir::ValueId s = Op(b, "aten.sum.dim_IntList", {Ref(in[0]), Dims({0})});
           b.AddOutput(Op(b, "aten.add.Tensor",
                          {Ref(Op(b, "aten.add.Tensor", {Ref(s), Ref(in[1])})), Ref(in[2])}));
         },
         1,
         -1,
         {"x", "kernel_0_partial0", "kernel_0_partial0_1"}});
}

TEST(SplitReductionsTest, MultiPassKernelsStayWhole) {
  Check({"softmax",
         {Meta({4, 64})},
         [](ir::GraphBuilder& b, const std::vector<ir::ValueId>& in) {
           b.AddOutput(Op(b, "aten._softmax.default", {Ref(in[0]), ir::Int(-1), ir::Bool(false)}));
         },
         0});
}

}  // namespace
}  // namespace kiln::runtime
