// SymExpr's syntax tree, shared by its parser and evaluator (sym_expr.cc),
// its printers (sym_expr_print.cc) and its simplifier (sym_expr_simplify.cc).
// Not for use outside those files.
#ifndef KILN_COMPILER_IR_SYM_EXPR_TREE_H_
#define KILN_COMPILER_IR_SYM_EXPR_TREE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "compiler/ir/sym_expr.h"

namespace kiln::ir {

enum class SymOp : uint8_t {
  kConst,
  kSymbol,  // leaves: `value` is the constant or the symbol's index
  kNeg,
  kNot,
  kAbs,  // unary: operand in `a`
  kAdd,
  kSub,
  kMul,
  kFloorDiv,
  kExactDiv,  // '/': a / b where b divides a
  kCeilDiv,
  kMod,
  kPow,
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  kAnd,
  kOr,  // short-circuit
  kMin,
  kMax,  // Min(a, b, c) is stored as Min(Min(a, b), c)
};

struct SymNode {
  SymOp op;
  int32_t a = -1;
  int32_t b = -1;
  int64_t value = 0;
};

struct SymExpr::Tree {
  std::string text;
  std::vector<SymNode> nodes;  // children before parents; the root is last
  std::vector<std::string> symbols;
  std::vector<int> depths;  // parallel to nodes: the height of each subtree

  int32_t root() const { return static_cast<int32_t>(nodes.size()) - 1; }
};

// Appends trees node by node, children first, remapping symbols; keeps
// depths. Used to build new trees out of parts of others.
class SymTreeBuilder {
 public:
  SymTreeBuilder() : tree_(std::make_shared<SymExpr::Tree>()) {}

  int32_t Const(int64_t value) { return Add(SymOp::kConst, -1, -1, value); }
  int32_t Symbol(absl::string_view name);
  int32_t Unary(SymOp op, int32_t a) { return Add(op, a, -1, 0); }
  int32_t Binary(SymOp op, int32_t a, int32_t b) { return Add(op, a, b, 0); }
  // Copies the subtree of `from` rooted at `node`; returns its new index.
  int32_t Copy(const SymExpr::Tree& from, int32_t node);
  int32_t Add(SymOp op, int32_t a, int32_t b, int64_t value);

  const SymExpr::Tree& tree() const { return *tree_; }
  // The tree rooted at its last node, with `text` as its text (ToText of it
  // when empty).
  std::shared_ptr<SymExpr::Tree> Finish();

 private:
  std::shared_ptr<SymExpr::Tree> tree_;
};

// Binding strength, as in the grammar: or 1, and 2, not 3, comparisons 4,
// sums 5, terms 6, unary minus 7, power 8, atoms 9. A negative constant
// binds as a unary minus.
int SymPrecedence(const SymNode& n);

// The canonical text of the subtree at `node` (SymExpr::ToText).
std::string SymText(const SymExpr::Tree& tree, int32_t node);

}  // namespace kiln::ir

#endif  // KILN_COMPILER_IR_SYM_EXPR_TREE_H_
