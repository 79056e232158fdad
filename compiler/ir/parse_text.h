// What the parsers of the printed IRs share (ops::ParseReadable for graphs,
// loop::ParseKernel for kernels): how an error names its line and quotes
// the text it refuses, and the integer literals both print.
#ifndef KILN_COMPILER_IR_PARSE_TEXT_H_
#define KILN_COMPILER_IR_PARSE_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace kiln::ir::text {

// Errors quote at most this much of the text they refuse.
inline constexpr size_t kQuoteLimit = 40;

inline std::string Quote(absl::string_view s) {
  if (s.size() <= kQuoteLimit) return absl::StrCat("'", s, "'");
  return absl::StrCat("'", s.substr(0, kQuoteLimit), "...'");
}

// INVALID_ARGUMENT "line <line>: <what>".
inline absl::Status Error(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", what));
}

inline bool IsDigits(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// An optional minus and digits: how a constant ir::SymInt prints.
inline bool IsIntegerLiteral(absl::string_view s) {
  absl::ConsumePrefix(&s, "-");
  return IsDigits(s);
}

}  // namespace kiln::ir::text

#endif  // KILN_COMPILER_IR_PARSE_TEXT_H_
