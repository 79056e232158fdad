// Symbolic size expressions, as they appear in guards: "s0", "2*s0",
// "s0 % 8 == 0", "Max(s0, s1) <= 4096 and s1 == s0".
//
// SymExpr::Parse turns the text into a small immutable syntax tree;
// Evaluate computes its value for given symbol values. The grammar, loosest
// binding first (Python's precedence and semantics):
//
//   expr       := or
//   or         := and ('or' and)*
//   and        := not ('and' not)*
//   not        := 'not' not | comparison
//   comparison := sum [('==' | '!=' | '<' | '<=' | '>' | '>=') sum]
//   sum        := term (('+' | '-') term)*
//   term       := unary (('*' | '//' | '%') unary)*
//   unary      := ('-' | '+') unary | atom
//   atom       := INTEGER | SYMBOL | 'True' | 'False' | '(' expr ')'
//               | ('Min' | 'Max') '(' expr (',' expr)* ')'
//
// Values are int64; booleans are the integers 0 and 1, and any nonzero value
// is true. `//` and `%` are Python's floor division and modulo (the result of
// `%` takes the sign of the divisor: -7 // 2 == -4, -7 % 3 == 2). `and` and
// `or` short-circuit and yield 0 or 1. Comparisons do not chain: "a < b < c"
// is malformed. Symbols are identifiers ([A-Za-z_][A-Za-z0-9_]*) other than
// the keywords and, or, not, True, False, Min and Max.
//
// Thread-safety: a SymExpr is immutable after Parse; copies share the tree,
// and any number of threads may evaluate one SymExpr concurrently.
#ifndef KILN_CACHE_GUARD_EXPR_H_
#define KILN_CACHE_GUARD_EXPR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln::cache {

// Symbol values by name. The comparator is transparent, so lookups by
// absl::string_view do not allocate.
using Bindings = std::map<std::string, int64_t, std::less<>>;

class SymExpr {
 public:
  // Parses `text`. A malformed expression is INVALID_ARGUMENT whose message
  // quotes the text and says what was expected where (1-based columns):
  //   malformed expression 's0 % ': expected an operand at column 5
  static absl::StatusOr<SymExpr> Parse(absl::string_view text);

  // The value of the expression. Every symbol the expression uses must be
  // bound, even one a short-circuit would skip. Errors are INVALID_ARGUMENT,
  // worded "cannot evaluate '<text>': <reason>", where the reason is one of
  //   symbol 's3' is unbound | division by zero | modulo by zero |
  //   integer overflow
  absl::StatusOr<int64_t> Evaluate(const Bindings& bindings) const;
  // As Evaluate, looking each symbol up through `lookup` (nullopt when it is
  // unbound), once per distinct symbol. Allocates nothing unless it fails
  // (for expressions of up to 8 distinct symbols).
  absl::StatusOr<int64_t> EvaluateWith(
      absl::FunctionRef<std::optional<int64_t>(absl::string_view)> lookup) const;

  // The distinct symbols the expression uses, in order of first appearance.
  const std::vector<std::string>& symbols() const;
  // Appends to *out each symbol of symbols() that *out does not yet hold.
  void CollectSymbols(std::vector<std::string>* out) const;

  // The text the expression was parsed from, as given.
  const std::string& text() const;

  // The syntax tree; defined in guard_expr.cc.
  struct Tree;

 private:
  explicit SymExpr(std::shared_ptr<const Tree> tree) : tree_(std::move(tree)) {}

  std::shared_ptr<const Tree> tree_;  // never null
};

// Whether `name` is a valid symbol: an identifier that is not a keyword.
bool IsSymbolName(absl::string_view name);

// The symbol `text` consists of, ignoring surrounding whitespace ("s0",
// " s_batch "), as a view into `text`; nullopt when `text` is anything else
// (a number, "(s0)", "2*s0", a keyword). A size that is a bare symbol binds
// that symbol; any other size expression is evaluated.
std::optional<absl::string_view> AsBareSymbol(absl::string_view text);

}  // namespace kiln::cache

#endif  // KILN_CACHE_GUARD_EXPR_H_
