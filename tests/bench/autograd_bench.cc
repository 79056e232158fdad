// Google Benchmark of the training stages of aot_eager: the joint graph and
// the min-cut partition, on forward graphs of about 5,000 nodes.
//
//   build/bin/kiln_autograd_bench
#include <benchmark/benchmark.h>

#include "compiler/autograd/joint_graph.h"
#include "compiler/autograd/partition.h"
#include "compiler/ir/builder.h"

namespace kiln {
namespace {

ir::TensorMeta Meta(std::vector<int64_t> sizes, bool requires_grad) {
  return ir::ContiguousMeta(sizes, v1::FLOAT32, requires_grad);
}

ir::ValueId Op(ir::GraphBuilder& b, const std::string& target, std::vector<ir::Argument> args,
               int output = 0) {
  return (*ops::Emit(b, ops::DefaultRegistry(), target, std::move(args)))[output];
}

// An MLP of `blocks` residual blocks, each: mm, add bias, layer norm, gelu,
// mm, add residual — about 8 nodes a block with the views.
ir::Graph MlpStack(int blocks) {
  ir::GraphBuilder b("mlp_stack");
  ir::ValueId x = b.AddInput(Meta({32, 256}, true), v1::Placeholder::USER_INPUT, "x");
  for (int i = 0; i < blocks; ++i) {
    ir::ValueId w1 = b.AddInput(Meta({256, 256}, true), v1::Placeholder::PARAMETER);
    ir::ValueId b1 = b.AddInput(Meta({256}, true), v1::Placeholder::PARAMETER);
    ir::ValueId g = b.AddInput(Meta({256}, true), v1::Placeholder::PARAMETER);
    ir::ValueId w2 = b.AddInput(Meta({256, 256}, true), v1::Placeholder::PARAMETER);
    ir::ValueId h = Op(b, "aten.mm.default", {ir::Ref(x), ir::Ref(w1)});
    h = Op(b, "aten.add.Tensor", {ir::Ref(h), ir::Ref(b1)});
    h = Op(b, "aten.native_layer_norm.default",
           {ir::Ref(h), ir::Ints({256}), ir::Ref(g), ir::NoneArg(), ir::Float(1e-5)});
    h = Op(b, "aten.gelu.default", {ir::Ref(h)});
    h = Op(b, "aten.mul.Scalar", {ir::Ref(h), ir::Float(0.5)});
    h = Op(b, "aten.mm.default", {ir::Ref(h), ir::Ref(w2)});
    x = Op(b, "aten.add.Tensor", {ir::Ref(x), ir::Ref(h)});
  }
  b.AddOutput(Op(b, "aten.sum.default", {ir::Ref(x)}));
  return std::move(b).Build();
}

ir::Graph PointwiseChain(int nodes) {
  ir::GraphBuilder b("chain");
  ir::ValueId v = b.AddInput(Meta({64, 64}, true), v1::Placeholder::USER_INPUT, "x");
  for (int i = 0; i < nodes - 1; ++i)
    v = Op(b, i % 2 ? "aten.sin.default" : "aten.cos.default", {ir::Ref(v)});
  b.AddOutput(Op(b, "aten.sum.default", {ir::Ref(v)}));
  return std::move(b).Build();
}

void Run(benchmark::State& state, const ir::Graph& g) {
  size_t saved = 0;
  for (auto _ : state) {
    auto joint = autograd::BuildJointGraph(g, {});
    auto p = autograd::PartitionJointGraph(*joint);
    saved = p->saved.size();
  }
  state.counters["forward_nodes"] = static_cast<double>(g.nodes().size());
  state.counters["saved"] = static_cast<double>(saved);
}

void BM_JointAndPartition_MlpStack(benchmark::State& state) {
  const ir::Graph g = MlpStack(static_cast<int>(state.range(0)));
  Run(state, g);
}
BENCHMARK(BM_JointAndPartition_MlpStack)->Arg(715)->Unit(benchmark::kMillisecond);

void BM_JointAndPartition_PointwiseChain(benchmark::State& state) {
  const ir::Graph g = PointwiseChain(static_cast<int>(state.range(0)));
  Run(state, g);
}
BENCHMARK(BM_JointAndPartition_PointwiseChain)->Arg(5000)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kiln

BENCHMARK_MAIN();
