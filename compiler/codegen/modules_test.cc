#include "compiler/codegen/modules.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "compiler/ir/canonical.h"
#include "compiler/ir/graph.h"
#include "compiler/pipeline/pipeline.h"
#include "google/protobuf/util/json_util.h"
#include "kiln/v1/service.pb.h"

namespace kiln::codegen {
namespace {

using pipeline::KilnOptions;
using pipeline::PhaseTimes;
using pipeline::RunKiln;
using pipeline::Trace;

TEST(DealByCost, BalancesTheLargestFirstAndLeavesNoPartEmpty) {
  // 9 | 5 2 1 | 4 3 1: the totals 9, 8 and 8.
  EXPECT_EQ(DealByCost({9, 5, 4, 3, 2, 1, 1}, 3), (std::vector<int>{0, 1, 2, 2, 1, 1, 2}));
  // Equal costs go round in order.
  EXPECT_EQ(DealByCost({1, 1, 1, 1}, 2), (std::vector<int>{0, 1, 0, 1}));
  // Zero costs still open a part each.
  EXPECT_EQ(DealByCost({0, 0, 0}, 8), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(DealByCost({7, 3}, 1), (std::vector<int>{0, 0}));
  EXPECT_EQ(DealByCost({7, 3}, 0), (std::vector<int>{0, 0}));
  EXPECT_TRUE(DealByCost({}, 4).empty());
}

// A backend whose compiles take 50 ms each and count how many
// run at once.
class CountingBackend : public CodegenBackend {
 public:
  std::string language() const override { return "counted"; }
  absl::StatusOr<std::string> Generate(const std::vector<loop::Kernel>& kernels,
                                       const std::vector<std::string>&) const override {
    std::vector<std::string> names;
    for (const loop::Kernel& k : kernels) names.push_back(k.name);
    return absl::StrJoin(names, " ");
  }
  absl::StatusOr<v1::CompiledModule> Compile(const std::string& source) const override {
    const int now = ++running_;
    int seen = most_.load();
    while (now > seen && !most_.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    --running_;
    ++compiles_;
    v1::CompiledModule module;
    module.set_source(source);
    module.set_binary("binary");
    return module;
  }
  int most() const { return most_.load(); }
  int compiles() const { return compiles_.load(); }

 private:
  mutable std::atomic<int> running_{0}, most_{0}, compiles_{0};
};

// Two graphs compiled at once (a training graph's halves), four modules
// each, in two slots: never more than two compiles at a time, and every
// module compiled.
TEST(CompileSlots, BoundTheCompilesOfEveryGraphThatSharesThem) {
  CountingBackend backend;
  std::vector<loop::Kernel> kernels(8);
  for (size_t i = 0; i < kernels.size(); ++i) kernels[i].name = absl::StrCat("kernel_", i);
  CompileSlots slots(2);
  absl::StatusOr<CompiledModules> first, second;
  std::thread other([&] { second = CompileModules(backend, kernels, {}, 4, &slots); });
  first = CompileModules(backend, kernels, {}, 4, &slots);
  other.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->modules.size(), 4u);
  EXPECT_EQ(second->modules.size(), 4u);
  EXPECT_EQ(backend.compiles(), 8);
  EXPECT_LE(backend.most(), 2);

  // Without slots, a graph's modules all compile at once.
  CountingBackend unbounded;
  ASSERT_TRUE(CompileModules(unbounded, kernels, {}, 4).ok());
  EXPECT_GT(unbounded.most(), 2);
}

// The graph of tests/data/graphs/`name` on `device`.
ir::Graph LoadGraph(const std::string& name, const std::string& device) {
  std::ifstream f(std::string(KILN_SOURCE_DIR) + "/tests/data/graphs/" + name);
  std::stringstream text;
  text << f.rdbuf();
  v1::GraphFile file;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &file).ok()) << name;
  v1::Graph proto = file.graph();
  if (device != "cpu") ir::MoveTensors(&proto, device, 0);
  absl::StatusOr<ir::Graph> graph = ir::Graph::FromProto(proto);
  EXPECT_TRUE(graph.ok()) << graph.status();
  return *std::move(graph);
}

// Every launch names a module that defines its kernel, and every module is
// launched from.
void ExpectLaunchesFindTheirKernels(const v1::CompiledGraph& compiled, int modules) {
  ASSERT_EQ(compiled.modules_size(), modules);
  std::set<int> used;
  int launches = 0;
  for (const v1::PlanStep& step : compiled.plan().steps()) {
    if (!step.has_launch()) continue;
    ++launches;
    const int m = step.launch().module();
    ASSERT_GE(m, 0);
    ASSERT_LT(m, modules);
    used.insert(m);
    EXPECT_NE(compiled.modules(m).source().find(step.launch().symbol() + "("), std::string::npos)
        << step.launch().symbol() << " is not in module " << m;
    for (int other = 0; other < modules; ++other) {
      if (other == m) continue;
      EXPECT_EQ(compiled.modules(other).source().find(step.launch().symbol() + "("),
                std::string::npos)
          << step.launch().symbol() << " is in module " << other << " too";
    }
  }
  EXPECT_EQ(launches, compiled.plan().kernels());
  EXPECT_EQ(static_cast<int>(used.size()), modules);
  // A kernel's vector accesses ask an alignment of its buffers, and say
  // which it writes, one of each per buffer; c++ kernels ask none.
  int aligned = 0;
  for (const v1::PlanStep& step : compiled.plan().steps()) {
    if (!step.has_launch() || step.launch().alignment().empty()) continue;
    const v1::PlanStep::Launch& l = step.launch();
    EXPECT_EQ(l.alignment_size(), l.buffers_size()) << l.symbol();
    EXPECT_EQ(l.written_size(), l.buffers_size()) << l.symbol();
    for (int a : l.alignment()) aligned += a == 16;
    EXPECT_EQ(compiled.modules(l.module()).language(), "cuda") << l.symbol();
  }
  if (compiled.modules(0).language() == "cuda") {
    EXPECT_GT(aligned, 0);
  }
  for (const v1::CompiledModule& m : compiled.modules()) EXPECT_FALSE(m.binary().empty());
}

class CompileModulesTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CompileModulesTest, ATrainingGraphCompilesAsSeveralModules) {
  const std::string device = GetParam();
  const ir::Graph graph = LoadGraph("transformer_block.json", device);
  v1::CompileOptions wanted;
  wanted.set_backend("kiln");
  wanted.mutable_target()->set_device_type(device);
  if (device == "cuda") wanted.mutable_target()->set_sm_arch("sm_90");
  const v1::CompileOptions normalized = ir::NormalizeOptions(wanted);

  KilnOptions options;
  options.toolchain.scratch_dir = ::testing::TempDir();
  options.compile_jobs = 3;
  Trace trace;
  PhaseTimes times;
  v1::Artifact artifact;
  absl::Status s = RunKiln(graph, normalized.target(), options, &times, &trace, &artifact);
  ASSERT_TRUE(s.ok()) << s;
  // The forward has 6 kernels on cuda and 7 on cpu, the backward 10 and 13:
  // three modules each.
  ASSERT_GE(artifact.compiled_forward().plan().kernels(), 3);
  ASSERT_GE(artifact.compiled_backward().plan().kernels(), 3);
  ExpectLaunchesFindTheirKernels(artifact.compiled_forward(), 3);
  ExpectLaunchesFindTheirKernels(artifact.compiled_backward(), 3);
  // The trace keeps every kernel in one file.
  const std::string ext = device == "cuda" ? ".cu" : ".cc";
  for (const v1::PlanStep& step : artifact.compiled_backward().plan().steps()) {
    if (!step.has_launch()) continue;
    EXPECT_NE(trace["backward_generated_code" + ext].find(step.launch().symbol() + "("),
              std::string::npos);
  }

  // One job: one module, as before.
  options.compile_jobs = 1;
  v1::Artifact single;
  s = RunKiln(graph, normalized.target(), options, &times, &trace, &single);
  ASSERT_TRUE(s.ok()) << s;
  ExpectLaunchesFindTheirKernels(single.compiled_backward(), 1);
  EXPECT_EQ(single.compiled_backward().modules(0).source(), trace["backward_generated_code" + ext]);
}

INSTANTIATE_TEST_SUITE_P(Targets, CompileModulesTest, ::testing::Values("cpu", "cuda"));

}  // namespace
}  // namespace kiln::codegen
