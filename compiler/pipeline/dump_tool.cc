// kiln_dump_code: the generated code of graph files, for one target.
//
//   kiln_dump_code --target=cpu|cuda [--compile [--compile_jobs=N] [--kernel_cache]]
//                  [--times] [--share_kernels=false] --out=DIR GRAPH.json...
//
// For each graph (a kiln.v1.GraphFile in JSON), the kiln backend's compile as
// kilnd runs it (for cuda, with every tensor moved to the GPU): training graphs (an input that
// requires grad) split into forward and backward, each lowered, fused and generated. The source of
// each goes to DIR/<file>[.forward|.backward].<cc|cu>; with --compile it is
// also compiled by the target's toolchain (g++, or NVRTC for cuda). Exits 1
// naming the graph when a step fails.
//
// CI compiles every graph under tests/data for sm_90 with it; comparing two
// DIRs shows what a change to the compiler did to the generated code.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/flags_usage.h"
#include "common/status_macros.h"
#include "compiler/ir/canonical.h"
#include "compiler/pipeline/pipeline.h"
#include "google/protobuf/util/json_util.h"
#include "kiln/v1/service.pb.h"

ABSL_FLAG(std::string, target, "cpu", "device type: cpu or cuda");
ABSL_FLAG(std::string, sm_arch, "", "for cuda: the SM arch (default sm_90)");
ABSL_FLAG(bool, compile, false, "also compile the generated code");
ABSL_FLAG(std::string, out, "", "directory for the generated sources");
ABSL_FLAG(bool, share_kernels, true,
          "compile kernels of the same code once (false: each on its own, to measure what "
          "sharing saves)");
ABSL_FLAG(std::string, channels_last, "inference",
          "cuda: the graphs whose 16-bit convolutions run channels-last (inference, always, "
          "never)");
ABSL_FLAG(int, compile_jobs, 1, "with --compile: native compiler processes per graph");
ABSL_FLAG(bool, kernel_cache, false,
          "with --compile: kernels compiled for one graph serve the later graphs, as in kilnd "
          "(compiler/codegen/kernel_cache.h)");
ABSL_FLAG(bool, times, false,
          "print each graph's compile phases (ms) and its kernels: launched, compiled");
ABSL_FLAG(bool, trace, false,
          "also write the rest of the debug trace (graphs, fusion decisions, IR) as "
          "STEM.NAME");

namespace {

absl::Status DumpOne(const std::string& path, const std::string& out_dir,
                     kiln::codegen::KernelCache* kernel_cache) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << f.rdbuf();
  kiln::v1::GraphFile file;
  auto parsed = google::protobuf::util::JsonStringToMessage(text.str(), &file);
  if (!parsed.ok()) return absl::InvalidArgumentError(std::string(parsed.message()));
  kiln::v1::Graph proto = file.graph();
  if (absl::GetFlag(FLAGS_target) == "cuda") kiln::ir::MoveTensors(&proto, "cuda", 0);
  ASSIGN_OR_RETURN(kiln::ir::Graph graph, kiln::ir::Graph::FromProto(proto));

  kiln::v1::CompileOptions wanted;
  wanted.set_backend("kiln");
  wanted.mutable_target()->set_device_type(absl::GetFlag(FLAGS_target));
  wanted.mutable_target()->set_sm_arch(absl::GetFlag(FLAGS_sm_arch));
  const kiln::v1::CompileOptions normalized = kiln::ir::NormalizeOptions(wanted);
  kiln::pipeline::KilnOptions options;
  options.compile = absl::GetFlag(FLAGS_compile);
  options.share_kernels = absl::GetFlag(FLAGS_share_kernels);
  options.compile_jobs = std::max(1, absl::GetFlag(FLAGS_compile_jobs));
  options.kernel_cache = kernel_cache;
  ASSIGN_OR_RETURN(options.channels_last,
                   kiln::pipeline::ParseChannelsLast(absl::GetFlag(FLAGS_channels_last)));
  options.toolchain.scratch_dir = std::filesystem::temp_directory_path().string();
  kiln::pipeline::Trace trace;
  kiln::pipeline::PhaseTimes times;
  kiln::v1::Artifact artifact;
  RETURN_IF_ERROR(
      kiln::pipeline::RunKiln(graph, normalized.target(), options, &times, &trace, &artifact));
  const std::string stem = std::filesystem::path(path).stem().string();
  int written = 0;
  for (const auto& [name, contents] : trace) {
    const size_t at = name.find("generated_code");
    if (at == std::string::npos) {
      if (!absl::GetFlag(FLAGS_trace)) continue;
      std::ofstream o(std::filesystem::path(out_dir) / absl::StrCat(stem, ".", name),
                      std::ios::trunc);
      o << contents;
      if (!o) return absl::InternalError(absl::StrCat("cannot write into ", out_dir));
      continue;
    }
    std::string out = stem;
    if (at > 0) absl::StrAppend(&out, ".", name.substr(0, at - 1));  // "forward_" -> ".forward"
    absl::StrAppend(&out, name.substr(name.rfind('.')));
    std::ofstream o(std::filesystem::path(out_dir) / out, std::ios::trunc);
    o << contents;
    if (!o) return absl::InternalError(absl::StrCat("cannot write into ", out_dir));
    ++written;
  }
  std::cout << path << ": " << written << " source(s)" << (options.compile ? ", compiled" : "")
            << "\n";
  if (absl::GetFlag(FLAGS_times)) {
    for (const kiln::v1::PhaseTime& t : times.phases()) {
      std::cout << "  phase " << t.phase() << " " << t.micros() / 1000.0 << " ms\n";
    }
    const kiln::v1::CompiledGraph* graphs[] = {&artifact.compiled(), &artifact.compiled_forward(),
                                               &artifact.compiled_backward()};
    for (const kiln::v1::CompiledGraph* g : graphs) {
      std::set<std::pair<int, std::string>> kernels;  // a symbol is its module's
      int launched = 0;
      for (const kiln::v1::PlanStep& step : g->plan().steps()) {
        if (!step.has_launch()) continue;
        ++launched;
        kernels.emplace(step.launch().module(), step.launch().symbol());
      }
      if (launched > 0) {
        std::cout << "  kernels launched " << launched << " compiled " << kernels.size() << "\n";
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  kiln::UseFlagsDefinedIn("compiler/pipeline/dump_tool.cc");
  absl::SetProgramUsageMessage(
      "writes the kiln backend's generated code for graph files.\n"
      "Usage: kiln_dump_code --target=cpu|cuda [--sm_arch=sm_90] [--compile] --out=DIR "
      "GRAPH.json...");
  std::vector<char*> files = absl::ParseCommandLine(argc, argv);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty() || files.size() < 2) {
    std::cerr << "kiln_dump_code: --out=DIR and at least one graph file are needed\n";
    return 2;
  }
  std::filesystem::create_directories(out);
  std::unique_ptr<kiln::codegen::KernelCache> kernel_cache;
  if (absl::GetFlag(FLAGS_kernel_cache)) {
    kernel_cache = std::make_unique<kiln::codegen::KernelCache>(int64_t{1} << 30);
  }
  int failed = 0;
  for (size_t i = 1; i < files.size(); ++i) {
    absl::Status s = DumpOne(files[i], out, kernel_cache.get());
    if (!s.ok()) {
      std::cerr << files[i] << ": " << s << "\n";
      ++failed;
    }
    if (kernel_cache != nullptr && absl::GetFlag(FLAGS_times)) {
      const kiln::codegen::KernelCache::Stats k = kernel_cache->stats();
      std::cout << "  kernel cache so far: " << k.hits << " reused, " << k.misses << " compiled\n";
    }
  }
  return failed == 0 ? 0 : 1;
}
