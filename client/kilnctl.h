// kilnctl's pieces shared by its source files: the parsed command line, the
// table printer and formatting helpers (kilnctl.cc), and the troubleshooting
// commands (kilnctl_tools.cc: failures, replay, breaks, minify).
#ifndef KILN_CLIENT_KILNCTL_H_
#define KILN_CLIENT_KILNCTL_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "client/client.h"
#include "google/protobuf/message.h"
#include "kiln/v1/service.pb.h"

ABSL_DECLARE_FLAG(std::string, server);
ABSL_DECLARE_FLAG(std::string, backend);
ABSL_DECLARE_FLAG(std::string, o);
ABSL_DECLARE_FLAG(std::string, after);

namespace kiln::kilnctl {

struct Invocation {
  std::string command;
  std::vector<std::string> args;  // after the command
  std::string ns;
  bool json = false;
};

// Columns separated by two spaces, padded to the widest cell; numeric
// columns are right-aligned. The last column is not padded.
class Table {
 public:
  Table(std::vector<std::string> header, std::vector<bool> right_aligned = {})
      : right_(std::move(right_aligned)) {
    right_.resize(header.size(), false);
    rows_.push_back(std::move(header));
  }
  void Add(std::vector<std::string> row) {
    row.resize(rows_[0].size());
    rows_.push_back(std::move(row));
  }
  std::string Render() const {
    std::vector<size_t> width(rows_[0].size(), 0);
    for (const auto& row : rows_) {
      for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    }
    std::string out;
    for (const auto& row : rows_) {
      std::string line;
      for (size_t c = 0; c < row.size(); ++c) {
        const bool last = c + 1 == row.size();
        const std::string pad(width[c] - row[c].size(), ' ');
        if (right_[c]) {
          line += pad + row[c];
        } else {
          line += row[c];
          if (!last) line += pad;
        }
        if (!last) line += "  ";
      }
      out += std::string(absl::StripTrailingAsciiWhitespace(line)) + "\n";
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
  std::vector<bool> right_;
};

std::string Timestamp(int64_t unix_micros);
std::string Short(const std::string& hex);     // the first 16 hex digits
std::string Namespace(const std::string& ns);  // "(default)" for ""
absl::Status PrintJson(const google::protobuf::Message& message);
absl::StatusOr<v1::GraphFile> ReadGraphFile(const std::string& path);
v1::CompileOptions OptionsFor(const v1::GraphFile& file);  // with --backend

// kilnctl_tools.cc
absl::Status Failures(const Client& client, const Invocation& inv);
absl::Status Replay(const Client& client, const Invocation& inv);
absl::Status Breaks(const Client& client, const Invocation& inv);
absl::Status Minify(const Client& client, const Invocation& inv);

}  // namespace kiln::kilnctl

#endif  // KILN_CLIENT_KILNCTL_H_
