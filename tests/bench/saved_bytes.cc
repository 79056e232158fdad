// kiln_saved_bytes: bytes saved between forward and backward for each
// captured graph in a folder (default tests/data/graphs; those with inputs
// that need gradients): the min-cut partition against saving every forward
// value the backward reads.
//
//   build/bin/kiln_saved_bytes [--json] [DIR]
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "compiler/autograd/joint_graph.h"
#include "compiler/autograd/partition.h"
#include "tests/integration/graphs.h"

int main(int argc, char** argv) {
  bool json = false;
  std::string dir = absl::StrCat(KILN_SOURCE_DIR, "/tests/data/graphs");
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--json") {
      json = true;
    } else {
      dir = argv[i];
    }
  }
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".json") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  if (json) {
    std::printf("[\n");
  } else {
    std::printf(
        "| graph | forward nodes | save everything read (bytes) | min-cut (bytes) | saved values | "
        "recomputed |\n");
    std::printf("|---|---|---|---|---|---|\n");
  }
  bool first = true;
  for (const std::string& f : files) {
    kiln::v1::GraphFile file = kiln::testing::LoadGraphFileAt(f);
    auto g = kiln::ir::Graph::FromProto(file.graph());
    if (!g.ok()) {
      std::fprintf(stderr, "%s: %s\n", f.c_str(), g.status().ToString().c_str());
      return 1;
    }
    auto joint = kiln::autograd::BuildJointGraph(*g, {});
    if (!joint.ok()) {
      std::fprintf(stderr, "%s: %s\n", f.c_str(), joint.status().ToString().c_str());
      return 1;
    }
    if (joint->num_tangents == 0) continue;  // nothing needs a gradient
    kiln::autograd::PartitionOptions all;
    all.min_cut = false;
    auto naive = kiln::autograd::PartitionJointGraph(*joint, all);
    auto cut = kiln::autograd::PartitionJointGraph(*joint);
    if (!naive.ok() || !cut.ok()) {
      std::fprintf(stderr, "%s: partition failed\n", f.c_str());
      return 1;
    }
    const std::string name = std::filesystem::path(f).filename().string();
    if (json) {
      std::printf("%s  {\"graph\": \"%s\", \"save_all_bytes\": %lld, \"min_cut_bytes\": %lld}",
                  first ? "" : ",\n", name.c_str(), static_cast<long long>(naive->saved_bytes),
                  static_cast<long long>(cut->saved_bytes));
    } else {
      std::printf("| %s | %zu | %lld | %lld | %zu | %zu |\n", name.c_str(), g->nodes().size(),
                  static_cast<long long>(naive->saved_bytes),
                  static_cast<long long>(cut->saved_bytes), cut->saved.size(),
                  cut->recomputed.size());
    }
    first = false;
  }
  if (json) std::printf("\n]\n");
  return 0;
}
