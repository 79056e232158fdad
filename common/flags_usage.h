// --help for the project's binaries. Abseil's --help lists the flags defined
// in a file named like the program (kilnd: "kilnd.cc"), and names each file by
// the path it was compiled from. UseFlagsDefinedIn makes --help list the flags
// of one source file (relative to the repository: "server/main.cc") and name
// files relative to the repository, never by a build machine's path.
//
// Call once in main, before absl::ParseCommandLine.
#ifndef KILN_COMMON_FLAGS_USAGE_H_
#define KILN_COMMON_FLAGS_USAGE_H_

#include <string>

#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace kiln {

// `file` as it is named in the repository: the part from the last
// "server/", "client/", "compiler/", "cache/", "tests/" or "common/" on.
inline std::string RepositoryPath(absl::string_view file) {
  size_t best = absl::string_view::npos;
  for (absl::string_view dir : {"server/", "client/", "compiler/", "cache/", "tests/", "common/"}) {
    const size_t at = file.rfind(dir);
    if (at != absl::string_view::npos && (at == 0 || file[at - 1] == '/') &&
        (best == absl::string_view::npos || at > best)) {
      best = at;
    }
  }
  return std::string(best == absl::string_view::npos ? file : file.substr(best));
}

inline void UseFlagsDefinedIn(const char* main_file) {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [main_file](absl::string_view file) {
    return RepositoryPath(file) == main_file;
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  config.normalize_filename = [](absl::string_view file) { return RepositoryPath(file); };
  absl::SetFlagsUsageConfig(config);
}

}  // namespace kiln

#endif  // KILN_COMMON_FLAGS_USAGE_H_
