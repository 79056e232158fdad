// The captured graphs under tests/data/graphs, for the tests that run every
// one of them. Tests that include this define KILN_SOURCE_DIR (the
// checkout's root) in their CMake target.
#ifndef KILN_TESTS_DATA_GRAPH_FILES_H_
#define KILN_TESTS_DATA_GRAPH_FILES_H_

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace kiln::testing {

// The paths of tests/data/graphs/*.json, sorted.
inline std::vector<std::string> TestGraphFiles() {
  std::vector<std::string> paths;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(KILN_SOURCE_DIR) + "/tests/data/graphs")) {
    if (entry.path().extension() == ".json") paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace kiln::testing

#endif  // KILN_TESTS_DATA_GRAPH_FILES_H_
