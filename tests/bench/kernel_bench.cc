// kiln_kernel_bench: the `kiln` backend's generated CPU kernels against
// libtorch eager on the same graphs, the bandwidth they reach against a plain
// copy of the same bytes, and the server-side compile time with and without
// g++.
//
//   build/bin/kiln_kernel_bench [--rows=4096] [--cols=1024] [--reps=30] [--threads=N]
//       [--isa=x86-64-v3] [--graphs=a,b] [--dump_source=DIR]
//
// Eager is the same graph run op by op through ATen (the reference
// interpreter: the ops eager PyTorch dispatches to). Both sides get the same
// fresh random inputs; the median of --reps timed runs, taken in blocks of
// 10 that alternate between kiln, eager and the copy (see MedianMs).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/randn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/marshalling.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "client/runtime/interpreter.h"
#include "client/runtime/plan_executor.h"
#include "compiler/codegen/codegen.h"
#include "compiler/ir/builder.h"
#include "compiler/loop/lowering.h"

ABSL_FLAG(int64_t, rows, 4096, "rows of the activations");
ABSL_FLAG(int64_t, cols, 1024, "columns of the activations");
ABSL_FLAG(int, reps, 30, "timed runs per measurement");
ABSL_FLAG(int, threads, static_cast<int>(std::thread::hardware_concurrency()),
          "threads for both sides (ATen's intra-op pool and the kernels' OpenMP)");
ABSL_FLAG(std::string, isa, "x86-64-v3",
          "-march for the generated code: kilnd's default x86-64-v3, or e.g. native, x86-64-v4");
ABSL_FLAG(std::vector<std::string>, graphs, {},
          "run only these graphs (by graph name, e.g. softmax,layer_norm)");
ABSL_FLAG(std::string, dump_source, "",
          "if set, write each graph's generated C++ to DIR/<graph>.cc");

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;
using ir::Ref;

ir::TensorMeta Meta(std::vector<int64_t> sizes) { return ir::ContiguousMeta(sizes); }

ir::ValueId Op(ir::GraphBuilder& b, const std::string& target, std::vector<ir::Argument> args,
               int output = 0) {
  auto out = ops::Emit(b, ops::DefaultRegistry(), target, std::move(args));
  if (!out.ok()) {
    std::fprintf(stderr, "%s: %s\n", target.c_str(), out.status().ToString().c_str());
    std::exit(1);
  }
  return (*out)[output];
}

// Medians of the timed runs of several functions, taken in blocks of 10
// runs per function in turn (a x 10, b x 10, c x 10, a x 10, ...), each block
// after 5 untimed runs. Blocks keep each function in its steady state (the
// allocator recycling its own buffers; interleaving single runs made each
// pay page faults for the other's frees), and taking turns spreads the drift
// of a shared machine over all of them. The untimed runs let the caches
// settle on the function's own data: after the other functions' 64 MiB, the
// first two or three runs of a 32 MiB kernel here take up to 1.7x its
// steady time (those of the copy 2x), while eager's, slower, hardly change.
std::vector<double> MedianMs(const std::vector<std::function<void()>>& fns, int reps) {
  constexpr int kBlock = 10, kWarm = 5;
  std::vector<std::vector<double>> t(fns.size());
  for (int done = 0; done < reps; done += kBlock) {
    for (size_t k = 0; k < fns.size(); ++k) {
      for (int i = 0; i < kWarm; ++i) fns[k]();
      for (int i = 0; i < std::min(kBlock, reps - done); ++i) {
        const auto s = Clock::now();
        fns[k]();
        t[k].push_back(std::chrono::duration<double, std::milli>(Clock::now() - s).count());
      }
    }
  }
  std::vector<double> medians;
  for (auto& v : t) {
    std::sort(v.begin(), v.end());
    medians.push_back(v[v.size() / 2]);
  }
  return medians;
}

struct Case {
  std::string name;
  ir::Graph graph;
  std::vector<at::Tensor> inputs;
  bool memory_bound;
};

void Run(const Case& c, int reps) {
  const auto t0 = Clock::now();
  auto lowered = loop::LowerGraph(c.graph);
  if (!lowered.ok()) {
    std::fprintf(stderr, "%s: %s\n", c.name.c_str(), lowered.status().ToString().c_str());
    std::exit(1);
  }
  codegen::CppOptions options;
  options.isa = absl::GetFlag(FLAGS_isa);
  auto backend = codegen::MakeCppBackend(options);
  auto source = backend->Generate(lowered->kernels, lowered->symbols);
  const double compile_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (const std::string dir = absl::GetFlag(FLAGS_dump_source); !dir.empty()) {
    std::ofstream(dir + "/" + c.graph.name() + ".cc") << *source;
  }
  const auto t1 = Clock::now();
  auto module = backend->Compile(*source);
  const double gxx_ms = std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
  if (!module.ok()) {
    std::fprintf(stderr, "%s: %s\n", c.name.c_str(), module.status().ToString().c_str());
    std::exit(1);
  }
  v1::CompiledGraph cg;
  *cg.mutable_plan() = lowered->plan;
  *cg.add_modules() = *module;
  auto exec = runtime::PlanExecutor::Create(cg);
  auto interp = runtime::Interpreter::Create(c.graph);
  if (!exec.ok() || !interp.ok()) {
    std::fprintf(stderr, "%s: cannot run\n", c.name.c_str());
    std::exit(1);
  }
  // Same answers first.
  auto got = (*exec)->Run(c.inputs);
  auto want = (*interp)->Run(c.inputs);
  if (!got.ok() || !want.ok() || !at::allclose((*got)[0], (*want)[0], 1e-4, 1e-4)) {
    std::fprintf(stderr, "%s: compiled result differs from eager\n", c.name.c_str());
    std::exit(1);
  }

  // Bytes a fused kernel must move: the inputs once, the outputs once.
  double bytes = 0;
  for (const auto& t : c.inputs) bytes += static_cast<double>(t.nbytes());
  for (const auto& t : *got) bytes += static_cast<double>(t.nbytes());
  at::Tensor src = at::randn({static_cast<int64_t>(bytes / 8)});
  at::Tensor dst = at::empty_like(src);
  const std::vector<double> ms =
      MedianMs({[&] { (void)(*exec)->Run(c.inputs); }, [&] { (void)(*interp)->Run(c.inputs); },
                [&] { dst.copy_(src); }},  // reads and writes `bytes`
               reps);
  const double kiln_ms = ms[0], eager_ms = ms[1], copy_ms = ms[2];
  const double gbps = bytes / (kiln_ms * 1e-3) / 1e9;
  const double copy_gbps = bytes / (copy_ms * 1e-3) / 1e9;
  // Bandwidth says nothing about a graph whose time is a matmul.
  const std::string bw = c.memory_bound ? absl::StrFormat("%.1f | %.1f | %.0f%%", gbps, copy_gbps,
                                                          100.0 * gbps / copy_gbps)
                                        : std::string("— | — | —");
  std::printf("| %s | %zu | %.3f | %.3f | %.2fx | %s | %.2f | %.0f |\n", c.name.c_str(),
              lowered->kernels.size(), eager_ms, kiln_ms, eager_ms / kiln_ms, bw.c_str(),
              compile_ms, gxx_ms);
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace kiln;
  const int64_t n = absl::GetFlag(FLAGS_rows), d = absl::GetFlag(FLAGS_cols);
  const int reps = absl::GetFlag(FLAGS_reps);
  // Without this, ATen picks its own count (on some machines 1) and sets it
  // on this thread, and the kernels' OpenMP regions inherit it.
  at::set_num_threads(absl::GetFlag(FLAGS_threads));
  auto randn = [](std::vector<int64_t> s) { return at::randn(s); };
  std::vector<Case> cases;
  {
    ir::GraphBuilder b("layer_norm");
    auto x = b.AddInput(Meta({n, d}), v1::Placeholder::USER_INPUT, "x");
    auto w = b.AddInput(Meta({d}), v1::Placeholder::PARAMETER, "w");
    auto bias = b.AddInput(Meta({d}), v1::Placeholder::PARAMETER, "b");
    b.AddOutput(Op(b, "aten.native_layer_norm.default",
                   {Ref(x), ir::Ints({d}), Ref(w), Ref(bias), ir::Float(1e-5)}));
    cases.push_back(
        {"LayerNorm", std::move(b).Build(), {randn({n, d}), randn({d}), randn({d})}, true});
  }
  {
    ir::GraphBuilder b("rms_norm");
    auto x = b.AddInput(Meta({n, d}), v1::Placeholder::USER_INPUT, "x");
    auto w = b.AddInput(Meta({d}), v1::Placeholder::PARAMETER, "w");
    auto sq = Op(b, "aten.pow.Tensor_Scalar", {Ref(x), ir::Float(2.0)});
    auto m = Op(b, "aten.mean.dim", {Ref(sq), ir::Ints({-1}), ir::Bool(true)});
    auto r =
        Op(b, "aten.rsqrt.default", {Ref(Op(b, "aten.add.Scalar", {Ref(m), ir::Float(1e-6)}))});
    auto y = Op(b, "aten.mul.Tensor", {Ref(x), Ref(r)});
    b.AddOutput(Op(b, "aten.mul.Tensor", {Ref(y), Ref(w)}));
    cases.push_back({"RMSNorm", std::move(b).Build(), {randn({n, d}), randn({d})}, true});
  }
  {
    ir::GraphBuilder b("softmax");
    auto x = b.AddInput(Meta({n, d}), v1::Placeholder::USER_INPUT, "x");
    b.AddOutput(Op(b, "aten._softmax.default", {Ref(x), ir::Int(-1), ir::Bool(false)}));
    cases.push_back({"softmax", std::move(b).Build(), {randn({n, d})}, true});
  }
  {
    // Not a target: the floor under softmax. Softmax computes exactly these
    // exponentials (and a max and a sum per row); when this alone takes
    // longer than the copy, softmax is bound by exp throughput, not memory.
    ir::GraphBuilder b("exp");
    auto x = b.AddInput(Meta({n, d}), v1::Placeholder::USER_INPUT, "x");
    b.AddOutput(Op(b, "aten.exp.default", {Ref(x)}));
    cases.push_back({"exp (softmax's floor)", std::move(b).Build(), {randn({n, d})}, true});
  }
  {
    ir::GraphBuilder b("gelu_after_matmul");
    const int64_t m = n / 8;
    auto x = b.AddInput(Meta({m, d}), v1::Placeholder::USER_INPUT, "x");
    auto w = b.AddInput(Meta({d, d}), v1::Placeholder::PARAMETER, "w");
    auto bias = b.AddInput(Meta({d}), v1::Placeholder::PARAMETER, "b");
    auto h = Op(b, "aten.mm.default", {Ref(x), Ref(w)});
    h = Op(b, "aten.add.Tensor", {Ref(h), Ref(bias)});
    b.AddOutput(Op(b, "aten.gelu.default", {Ref(h)}));
    cases.push_back({"GELU after matmul",
                     std::move(b).Build(),
                     {randn({m, d}), randn({d, d}), randn({d})},
                     false});
  }
  {
    ir::GraphBuilder b("mlp_block");
    const int64_t m = n / 8;
    auto x = b.AddInput(Meta({m, d}), v1::Placeholder::USER_INPUT, "x");
    auto w1 = b.AddInput(Meta({d, d}), v1::Placeholder::PARAMETER, "w1");
    auto b1 = b.AddInput(Meta({d}), v1::Placeholder::PARAMETER, "b1");
    auto g = b.AddInput(Meta({d}), v1::Placeholder::PARAMETER, "g");
    auto beta = b.AddInput(Meta({d}), v1::Placeholder::PARAMETER, "beta");
    auto w2 = b.AddInput(Meta({d, d}), v1::Placeholder::PARAMETER, "w2");
    auto h = Op(b, "aten.mm.default", {Ref(x), Ref(w1)});
    h = Op(b, "aten.add.Tensor", {Ref(h), Ref(b1)});
    h = Op(b, "aten.native_layer_norm.default",
           {Ref(h), ir::Ints({d}), Ref(g), Ref(beta), ir::Float(1e-5)});
    h = Op(b, "aten.gelu.default", {Ref(h)});
    h = Op(b, "aten.mm.default", {Ref(h), Ref(w2)});
    b.AddOutput(Op(b, "aten.add.Tensor", {Ref(x), Ref(h)}));
    cases.push_back(
        {"MLP block",
         std::move(b).Build(),
         {randn({m, d}), randn({d, d}), randn({d}), randn({d}), randn({d}), randn({d, d})},
         false});
  }
  std::printf(
      "kiln_kernel_bench: activations [%lld, %lld] float32, median of %d runs, %d threads, "
      "kernels for -march=%s\n\n",
      static_cast<long long>(n), static_cast<long long>(d), reps, at::get_num_threads(),
      absl::GetFlag(FLAGS_isa).c_str());
  std::printf(
      "| graph | kernels | eager ms | kiln ms | speed-up | kiln GB/s | copy GB/s | of copy | "
      "compile ms (no g++) | g++ ms |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  const std::vector<std::string> only = absl::GetFlag(FLAGS_graphs);
  for (const Case& c : cases) {
    if (only.empty() || std::find(only.begin(), only.end(), c.graph.name()) != only.end())
      Run(c, reps);
  }
  return 0;
}
