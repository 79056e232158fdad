// The one symbolic-integer expression type: sizes ("s0", "2*s0 + 1",
// "(s1 - 1)//2 + 1"), launch grids, and shape guards ("s0 % 8 == 0",
// "Max(s0, s1) <= 4096 and s1 == s0"). Shape rules, guards, codegen, the
// plan runtime and the Python package all parse with SymExpr::Parse, and
// each consumer prints a tree with its own printer (ToText, ToCpp, ToPython).
// See docs/architecture.md ("Symbolic sizes").
//
// The grammar, loosest binding first (Python's precedence and semantics):
//
//   expr       := or
//   or         := and ('or' and)*
//   and        := not ('and' not)*
//   not        := 'not' not | comparison
//   comparison := sum [('==' | '!=' | '<' | '<=' | '>' | '>=') sum]
//   sum        := term (('+' | '-') term)*
//   term       := unary (('*' | '//' | '/' | '%') unary)*
//   unary      := ('-' | '+') unary | power
//   power      := atom ['**' unary]
//   atom       := INTEGER | SYMBOL | 'True' | 'False' | '(' expr ')'
//               | FUNCTION '(' expr (',' expr)* ')'
//
// Functions, as sympy spells them in sizes: Min and Max (one or more
// arguments); Mod and PythonMod (a % b); FloorDiv and floordiv (a // b);
// CeilDiv (the ceiling of a / b); Abs; floor, ceiling, FloorToInt, CeilToInt
// and Integer, which are the identity on integers.
//
// Values are int64; booleans are the integers 0 and 1, and any nonzero value
// is true. `//` and `%` are Python's floor division and modulo (the result of
// `%` takes the sign of the divisor: -7 // 2 == -4, -7 % 3 == 2). `/` is exact
// division, as sympy writes the quotient of sizes that divide: evaluating it
// when they do not is an error. `**` takes a non-negative exponent. `and` and
// `or` short-circuit and yield 0 or 1. Comparisons do not chain: "a < b < c"
// is malformed. Symbols are identifiers ([A-Za-z_][A-Za-z0-9_]*) other than
// the keywords and, or, not, True, False, Min and Max.
//
// Parsing is linear in the length of the text and refuses nesting deeper
// than kMaxSymExprDepth and integers outside int64; evaluation refuses
// overflow. Every such refusal is INVALID_ARGUMENT.
//
// Thread-safety: a SymExpr is immutable; copies share the tree, and any
// number of threads may use one SymExpr concurrently.
#ifndef KILN_COMPILER_IR_SYM_EXPR_H_
#define KILN_COMPILER_IR_SYM_EXPR_H_

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

namespace kiln::ir {

// Deeper expressions are refused, so that parsing, evaluation and printing
// (all recursive) stay within a small, fixed amount of stack.
inline constexpr int kMaxSymExprDepth = 256;

// Symbol values by name. The comparator is transparent, so lookups by
// absl::string_view do not allocate.
using Bindings = std::map<std::string, int64_t, std::less<>>;

class SymExpr {
 public:
  // Parses `text`. A malformed expression is INVALID_ARGUMENT whose message
  // quotes the text and says what was expected where (1-based columns):
  //   malformed expression 's0 % ': expected an operand at column 5
  static absl::StatusOr<SymExpr> Parse(absl::string_view text);
  static SymExpr Constant(int64_t value);
  // INVALID_ARGUMENT unless IsSymbolName(name).
  static absl::StatusOr<SymExpr> Symbol(absl::string_view name);

  // The value when the expression is an integer literal, maybe negated
  // ("4", "-1"); nullopt otherwise.
  std::optional<int64_t> constant() const;
  // Whether the expression is a product of symbols and integers, maybe
  // negated ("s0", "-4*s0*s1"), and not a constant.
  bool IsMonomial() const;

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

  // The text the expression was parsed from, as given (ToText() for one
  // that was built).
  const std::string& text() const;

  // Printers, one per consumer.
  //
  // Guards, shape rules and the graph IR: canonical text in the grammar
  // above, with the fewest parentheses that keep the tree, except that
  // operands of * // / % ** other than atoms and products are parenthesized:
  //   "4*s0*s1 + s1 - 2", "(s0 - 1)//2 + 1", "-(s0//2)", "s0 % 8 == 0".
  // Parse(ToText()) evaluates as this expression does.
  std::string ToText() const;
  // C++ and CUDA C++: an int64_t expression. `ns` is the namespace of max,
  // min and abs ("std::" or "kiln_dev::"); the generated code's prelude
  // supplies kiln_floordiv, kiln_mod and kiln_pow_int. `symbol` gives each
  // symbol's C++ spelling, or an error, which is returned.
  absl::StatusOr<std::string> ToCpp(
      absl::string_view ns,
      absl::FunctionRef<absl::StatusOr<std::string>(absl::string_view)> symbol) const;
  // Python: an expression that eval() computes as Evaluate does (where
  // Evaluate succeeds), given the symbols as variables.
  std::string ToPython() const;

  // The syntax tree (compiler/ir/sym_expr_tree.h, internal).
  struct Tree;
  static SymExpr FromTree(std::shared_ptr<const Tree> tree) { return SymExpr(std::move(tree)); }
  const Tree& tree() const { return *tree_; }

 private:
  explicit SymExpr(std::shared_ptr<const Tree> tree) : tree_(std::move(tree)) {}

  std::shared_ptr<const Tree> tree_;  // never null
};

// Arithmetic that keeps sizes in a polynomial form: a sum of monomials with
// distinct factors, each a coefficient times symbols and other
// subexpressions sorted by their text, then a constant ("4*s0*s1 + s1 - 2").
// Terms keep the order they first appear in, so "s0 + s1" and "s1 + s0"
// stay different texts. Constants alone saturate at the int64 bounds instead
// of overflowing, so that a bad size from a request fails the checks that
// follow instead of wrapping; a polynomial whose coefficient would saturate,
// or whose form would nest deeper than kMaxSymExprDepth, is left as
// written. Products are expanded up to 64 monomials of up to 64 factors
// each; beyond, the product stays one factor, so that simplifying a hostile
// expression stays cheap.
SymExpr Simplify(const SymExpr& e);
SymExpr SymPlus(const SymExpr& a, const SymExpr& b);
SymExpr SymMinus(const SymExpr& a, const SymExpr& b);
SymExpr SymTimes(const SymExpr& a, const SymExpr& b);
// a // b: the exact quotient when every monomial of a divides by b (a single
// monomial); a//b as written otherwise. Division by the constant 0 gives 0,
// so that a bad size fails later checks rather than here.
SymExpr SymFloorDivide(const SymExpr& a, const SymExpr& b);

// Whether `name` is a valid symbol: an identifier that is not a keyword.
bool IsSymbolName(absl::string_view name);

// The symbol `text` consists of, ignoring surrounding whitespace ("s0",
// " s_batch "), as a view into `text`; nullopt when `text` is anything else
// (a number, "(s0)", "2*s0", a keyword). A size that is a bare symbol binds
// that symbol; any other size expression is evaluated.
std::optional<absl::string_view> AsBareSymbol(absl::string_view text);

}  // namespace kiln::ir

#endif  // KILN_COMPILER_IR_SYM_EXPR_H_
