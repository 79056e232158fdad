// SymExpr's printers: canonical text, C++ and Python (sym_expr.h).
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/ir/sym_expr.h"
#include "compiler/ir/sym_expr_tree.h"

namespace kiln::ir {
namespace {

using Op = SymOp;
using Node = SymNode;

constexpr int kAtom = 9;

const char* ComparisonText(Op op) {
  switch (op) {
    case Op::kEq:
      return "==";
    case Op::kNe:
      return "!=";
    case Op::kLt:
      return "<";
    case Op::kLe:
      return "<=";
    case Op::kGt:
      return ">";
    case Op::kGe:
      return ">=";
    default:
      return nullptr;
  }
}

bool IsTermOp(Op op) {
  return op == Op::kMul || op == Op::kFloorDiv || op == Op::kExactDiv || op == Op::kMod;
}

class TextPrinter {
 public:
  explicit TextPrinter(const SymExpr::Tree& tree) : tree_(tree) {}

  std::string Print(int32_t i) {
    const Node& n = tree_.nodes[i];
    switch (n.op) {
      case Op::kConst:
        // The literal 9223372036854775808 is out of range.
        if (n.value == std::numeric_limits<int64_t>::min()) return "(-9223372036854775807 - 1)";
        return absl::StrCat(n.value);
      case Op::kSymbol:
        return tree_.symbols[n.value];
      case Op::kNeg: {
        // "-s0", "-(s0*s1)", "-(s0//2)", "--s0". A product keeps its
        // parentheses ("-s0*s1" would parse as (-s0)*s1, which overflows
        // where the negated product need not); a negation of a negation
        // does not take any, so that the text nests no deeper than the tree.
        const bool bare = Atom(n.a) || SymPrecedence(tree_.nodes[n.a]) == 7;
        return absl::StrCat("-", Wrap(n.a, !bare));
      }
      case Op::kNot:
        return absl::StrCat("not ", Wrap(n.a, SymPrecedence(tree_.nodes[n.a]) < 3));
      case Op::kAbs:
        return absl::StrCat("Abs(", Print(n.a), ")");
      case Op::kMin:
      case Op::kMax:
        return absl::StrCat(n.op == Op::kMin ? "Min(" : "Max(", Print(n.a), ", ", Print(n.b), ")");
      case Op::kCeilDiv:
        return absl::StrCat("CeilDiv(", Print(n.a), ", ", Print(n.b), ")");
      case Op::kAdd:
      case Op::kSub:
        return absl::StrCat(Wrap(n.a, SymPrecedence(tree_.nodes[n.a]) < 5),
                            n.op == Op::kAdd ? " + " : " - ",
                            Wrap(n.b, SymPrecedence(tree_.nodes[n.b]) <= 5));
      case Op::kMul:
        // A leading negation or negative coefficient stays bare, as unary
        // minus binds tighter: "-2*s0", "-s0*s1" (that is (-s0)*s1). A
        // product on the right keeps its parentheses, so that the text
        // parses back to the same tree (and no deeper one): "a*(b*c)".
        return absl::StrCat(Wrap(n.a, !Bare(n.a) && SymPrecedence(tree_.nodes[n.a]) != 7), "*",
                            Wrap(n.b, !Atom(n.b)));
      case Op::kFloorDiv:
      case Op::kExactDiv:
      case Op::kMod: {
        const char* op = n.op == Op::kFloorDiv ? "//" : n.op == Op::kExactDiv ? "/" : " % ";
        return absl::StrCat(Wrap(n.a, !Bare(n.a)), op, Wrap(n.b, !Atom(n.b)));
      }
      case Op::kPow:
        return absl::StrCat(Wrap(n.a, !Atom(n.a)), "**", Wrap(n.b, !Atom(n.b)));
      case Op::kAnd:
      case Op::kOr: {
        const int p = n.op == Op::kAnd ? 2 : 1;
        return absl::StrCat(Wrap(n.a, SymPrecedence(tree_.nodes[n.a]) < p),
                            n.op == Op::kAnd ? " and " : " or ",
                            Wrap(n.b, SymPrecedence(tree_.nodes[n.b]) <= p));
      }
      default: {
        // Comparisons do not chain: both sides bind tighter.
        return absl::StrCat(Wrap(n.a, SymPrecedence(tree_.nodes[n.a]) <= 4), " ",
                            ComparisonText(n.op), " ",
                            Wrap(n.b, SymPrecedence(tree_.nodes[n.b]) <= 4));
      }
    }
  }

 private:
  std::string Wrap(int32_t i, bool parenthesize) {
    return parenthesize ? absl::StrCat("(", Print(i), ")") : Print(i);
  }
  bool Atom(int32_t i) const { return SymPrecedence(tree_.nodes[i]) == kAtom; }
  bool IsConstant(int32_t i) const { return tree_.nodes[i].op == Op::kConst; }
  // An operand of * // / % that needs no parentheses: an atom or a product.
  bool Bare(int32_t i) const { return Atom(i) || tree_.nodes[i].op == Op::kMul; }

  const SymExpr::Tree& tree_;
};

class CppPrinter {
 public:
  CppPrinter(const SymExpr::Tree& tree, absl::string_view ns,
             absl::FunctionRef<absl::StatusOr<std::string>(absl::string_view)> symbol)
      : tree_(tree), ns_(ns), symbol_(symbol) {}

  absl::StatusOr<std::string> Print(int32_t i) {
    const Node& n = tree_.nodes[i];
    if (n.op == Op::kConst) {
      if (n.value == std::numeric_limits<int64_t>::min()) return std::string("INT64_MIN");
      return absl::StrCat("INT64_C(", n.value, ")");
    }
    if (n.op == Op::kSymbol) return symbol_(tree_.symbols[n.value]);
    ASSIGN_OR_RETURN(std::string a, Print(n.a));
    switch (n.op) {
      case Op::kNeg:
        return absl::StrCat("(-", a, ")");
      case Op::kNot:
        return absl::StrCat("static_cast<int64_t>(", a, " == 0)");
      case Op::kAbs:
        return absl::StrCat(ns_, "abs(", a, ")");
      default:
        break;
    }
    ASSIGN_OR_RETURN(std::string b, Print(n.b));
    switch (n.op) {
      case Op::kAdd:
        return absl::StrCat("(", a, " + ", b, ")");
      case Op::kSub:
        return absl::StrCat("(", a, " - ", b, ")");
      case Op::kMul:
        return absl::StrCat("(", a, " * ", b, ")");
      case Op::kFloorDiv:
      case Op::kExactDiv:  // exact: floor division gives the quotient
        return absl::StrCat("kiln_floordiv<int64_t>(", a, ", ", b, ")");
      case Op::kCeilDiv:
        return absl::StrCat("(-kiln_floordiv<int64_t>((-", a, "), ", b, "))");
      case Op::kMod:
        return absl::StrCat("kiln_mod<int64_t>(", a, ", ", b, ")");
      case Op::kPow:
        return absl::StrCat("kiln_pow_int<int64_t>(", a, ", ", b, ")");
      case Op::kMin:
      case Op::kMax:
        return absl::StrCat(ns_, n.op == Op::kMin ? "min" : "max", "<int64_t>(", a, ", ", b, ")");
      case Op::kAnd:
        return absl::StrCat("static_cast<int64_t>(", a, " != 0 && ", b, " != 0)");
      case Op::kOr:
        return absl::StrCat("static_cast<int64_t>(", a, " != 0 || ", b, " != 0)");
      default:
        return absl::StrCat("static_cast<int64_t>(", a, " ", ComparisonText(n.op), " ", b, ")");
    }
  }

 private:
  const SymExpr::Tree& tree_;
  absl::string_view ns_;
  absl::FunctionRef<absl::StatusOr<std::string>(absl::string_view)> symbol_;
};

// Fully parenthesized, so that Python's precedence never matters.
std::string PrintPython(const SymExpr::Tree& tree, int32_t i) {
  const Node& n = tree.nodes[i];
  if (n.op == Op::kConst) {
    return n.value < 0 ? absl::StrCat("(", n.value, ")") : absl::StrCat(n.value);
  }
  if (n.op == Op::kSymbol) return tree.symbols[n.value];
  const std::string a = PrintPython(tree, n.a);
  switch (n.op) {
    case Op::kNeg:
      return absl::StrCat("(-", a, ")");
    case Op::kNot:
      return absl::StrCat("int(", a, " == 0)");
    case Op::kAbs:
      return absl::StrCat("abs(", a, ")");
    default:
      break;
  }
  const std::string b = PrintPython(tree, n.b);
  switch (n.op) {
    case Op::kAdd:
      return absl::StrCat("(", a, " + ", b, ")");
    case Op::kSub:
      return absl::StrCat("(", a, " - ", b, ")");
    case Op::kMul:
      return absl::StrCat("(", a, " * ", b, ")");
    case Op::kFloorDiv:
    case Op::kExactDiv:
      return absl::StrCat("(", a, " // ", b, ")");
    case Op::kCeilDiv:
      return absl::StrCat("(-((-", a, ") // ", b, "))");
    case Op::kMod:
      return absl::StrCat("(", a, " % ", b, ")");
    case Op::kPow:
      return absl::StrCat("(", a, " ** ", b, ")");
    case Op::kMin:
      return absl::StrCat("min(", a, ", ", b, ")");
    case Op::kMax:
      return absl::StrCat("max(", a, ", ", b, ")");
    case Op::kAnd:
      return absl::StrCat("int(", a, " != 0 and ", b, " != 0)");
    case Op::kOr:
      return absl::StrCat("int(", a, " != 0 or ", b, " != 0)");
    default:
      return absl::StrCat("int(", a, " ", ComparisonText(n.op), " ", b, ")");
  }
}

}  // namespace

int SymPrecedence(const SymNode& n) {
  switch (n.op) {
    case Op::kConst:
      return n.value < 0 ? 7 : kAtom;
    case Op::kOr:
      return 1;
    case Op::kAnd:
      return 2;
    case Op::kNot:
      return 3;
    case Op::kAdd:
    case Op::kSub:
      return 5;
    case Op::kNeg:
      return 7;
    case Op::kPow:
      return 8;
    case Op::kSymbol:
    case Op::kAbs:
    case Op::kMin:
    case Op::kMax:
    case Op::kCeilDiv:
      return kAtom;
    default:
      return IsTermOp(n.op) ? 6 : 4;  // the rest are comparisons
  }
}

std::string SymText(const SymExpr::Tree& tree, int32_t node) {
  return TextPrinter(tree).Print(node);
}

std::string SymExpr::ToText() const { return SymText(*tree_, tree_->root()); }

absl::StatusOr<std::string> SymExpr::ToCpp(
    absl::string_view ns,
    absl::FunctionRef<absl::StatusOr<std::string>(absl::string_view)> symbol) const {
  return CppPrinter(*tree_, ns, symbol).Print(tree_->root());
}

std::string SymExpr::ToPython() const { return PrintPython(*tree_, tree_->root()); }

}  // namespace kiln::ir
