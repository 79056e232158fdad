#include "compiler/codegen/modules.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "compiler/ir/canonical.h"
#include "compiler/ir/graph.h"
#include "compiler/loop/kernel_parser.h"
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
  std::string CompileIdentity() const override { return "counted"; }
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

// A quick artifact's compile (urgent) takes the next free slot before an
// optimized one that has waited longer.
TEST(CompileSlots, AnUrgentCompileGoesFirst) {
  CompileSlots slots(1);
  slots.Acquire();
  std::mutex mu;
  std::vector<std::string> order;
  auto take = [&](bool urgent, const char* who) {
    slots.Acquire(urgent);
    {
      std::lock_guard<std::mutex> l(mu);
      order.push_back(who);
    }
    slots.Release();
  };
  std::thread ordinary(take, false, "ordinary");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::thread urgent(take, true, "urgent");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  slots.Release();
  ordinary.join();
  urgent.join();
  EXPECT_EQ(order, (std::vector<std::string>{"urgent", "ordinary"}));
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

TEST(StripComments, LeavesCodeAndLiteralsAndDropsComments) {
  EXPECT_EQ(StripComments("a = 1;  // nodes: sum\nb = 2;"), "a = 1;   \nb = 2;");
  EXPECT_EQ(StripComments("x/* l_x_ */+y"), "x +y");
  EXPECT_EQ(StripComments("asm(\"mov // not a comment\"); // one"),
            "asm(\"mov // not a comment\");  ");
  EXPECT_EQ(StripComments("c = '/'; d = '\\''; // e"), "c = '/'; d = '\\'';  ");
  EXPECT_EQ(StripComments("s = \"a\\\"//b\"; /* open"), "s = \"a\\\"//b\";  ");
  EXPECT_EQ(StripComments(""), "");
}

KernelCache::Entry EntryOf(const std::string& symbol, size_t bytes) {
  KernelCache::Entry e;
  e.symbol = symbol;
  e.module.set_binary(std::string(bytes, 'b'));
  return e;
}

TEST(KernelCache, DropsTheLeastRecentlyUsedPastItsCapacity) {
  KernelCache cache(3000);
  cache.Insert("a", EntryOf("kernel_0", 1000));
  cache.Insert("b", EntryOf("kernel_1", 1000));
  ASSERT_TRUE(cache.Find("a").has_value());  // now b is the least recent
  cache.Insert("c", EntryOf("kernel_2", 1000));
  EXPECT_EQ(cache.stats().evictions, 1);
  EXPECT_FALSE(cache.Find("b").has_value());
  std::optional<KernelCache::Entry> a = cache.Find("a");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->symbol, "kernel_0");
  EXPECT_TRUE(cache.Find("c").has_value());
  KernelCache::Stats s = cache.stats();
  EXPECT_EQ(s.entries, 2);
  EXPECT_LE(s.bytes, 3000);
  EXPECT_EQ(s.hits, 3);
  EXPECT_EQ(s.misses, 1);

  // The same key again replaces its entry; one larger than the whole
  // capacity is not kept, and leaves the others alone.
  cache.Insert("a", EntryOf("kernel_9", 500));
  EXPECT_EQ(cache.Find("a")->symbol, "kernel_9");
  EXPECT_EQ(cache.stats().entries, 2);
  cache.Insert("huge", EntryOf("kernel_5", 5000));
  EXPECT_FALSE(cache.Find("huge").has_value());
  EXPECT_EQ(cache.stats().entries, 2);
}

// A row sum of x into out, under `name`, its node and buffers named after
// `tag`, scaled by `scale`.
loop::Kernel RowSum(const std::string& name, const std::string& tag, const std::string& scale) {
  absl::StatusOr<loop::Kernel> k = loop::ParseKernel(
      absl::StrCat("kernel ", name, ": outer [8] inner [32] passes 1\n", "nodes: sum_", tag, "\n",
                   "buffers:\n", "buf0 = x_", tag, " : f32\n", "buf1 = sum_", tag,
                   " : f32 (written)\n", "%0 = load buf0[o0*32 + i0*1 + 0] : f32 [pass 0, inner]\n",
                   "%1 = reduce sum %0 : f32 [pass 0, inner]\n", "%2 = constant ", scale,
                   " : f32 [pass 0, outer]\n", "%3 = mul %1, %2 : f32 [pass 0, outer]\n",
                   "store buf1[o0*1 + 0] = %3 [pass 0, outer]\n"));
  EXPECT_TRUE(k.ok()) << k.status();
  return *std::move(k);
}

class KernelCacheTest : public ::testing::TestWithParam<std::string> {};

// Kernels met again in another graph, under other names and with other
// node names, are served by the cache as they were compiled; a kernel
// that differs in a constant is compiled.
TEST_P(KernelCacheTest, ServesAKernelMetAgainUnderItsFirstName) {
  std::unique_ptr<CodegenBackend> backend;
  if (GetParam() == "cuda") {
    CudaOptions options;
    options.scratch_dir = ::testing::TempDir();
    backend = MakeCudaBackend(options);
  } else {
    CppOptions options;
    options.scratch_dir = ::testing::TempDir();
    backend = MakeCppBackend(options);
  }
  KernelCache cache(64 << 20);

  absl::StatusOr<CompiledModules> first =
      CompileModules(*backend, {RowSum("kernel_0", "a", "2.0"), RowSum("kernel_1", "a", "3.0")}, {},
                     4, nullptr, &cache);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->modules.size(), 2u);
  EXPECT_TRUE(first->reused.empty());
  EXPECT_EQ(cache.stats().entries, 2);

  // kernel_3 is kernel_1's code, kernel_4 is new.
  absl::StatusOr<CompiledModules> second =
      CompileModules(*backend, {RowSum("kernel_3", "b", "3.0"), RowSum("kernel_4", "b", "5.0")}, {},
                     4, nullptr, &cache);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->reused, (std::vector<std::string>{"kernel_3"}));
  EXPECT_EQ(second->symbol_of, (std::map<std::string, std::string>{{"kernel_3", "kernel_1"}}));
  ASSERT_EQ(second->modules.size(), 2u);
  // The compiled module comes first, the served one after it.
  EXPECT_EQ(second->module_of.at("kernel_4"), 0);
  EXPECT_EQ(second->module_of.at("kernel_3"), 1);
  const v1::CompiledModule& served = second->modules[1];
  EXPECT_EQ(served.binary(), first->modules[first->module_of.at("kernel_1")].binary());
  EXPECT_NE(served.source().find("kernel_1("), std::string::npos);
  EXPECT_NE(second->modules[0].source().find("kernel_4("), std::string::npos);
  EXPECT_EQ(cache.stats().hits, 1);
  EXPECT_EQ(cache.stats().misses, 3);

  // A kernel compiled with others in one module is not kept: only a
  // module of one kernel can serve one kernel.
  KernelCache shared(64 << 20);
  ASSERT_TRUE(CompileModules(*backend,
                             {RowSum("kernel_0", "a", "2.0"), RowSum("kernel_1", "a", "3.0")}, {},
                             1, nullptr, &shared)
                  .ok());
  EXPECT_EQ(shared.stats().entries, 0);
}

INSTANTIATE_TEST_SUITE_P(Targets, KernelCacheTest, ::testing::Values("cpu", "cuda"));

}  // namespace
}  // namespace kiln::codegen
