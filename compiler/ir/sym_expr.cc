#include "compiler/ir/sym_expr.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/ir/sym_expr_tree.h"

namespace kiln::ir {
namespace {

using Op = SymOp;
using Node = SymNode;

enum class Tok : uint8_t {
  kEnd,
  kInt,
  kName,
  kLParen,
  kRParen,
  kComma,
  kPlus,
  kMinus,
  kStar,
  kStarStar,
  kSlash,
  kSlashSlash,
  kPercent,
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
};

struct Token {
  Tok kind;
  size_t pos;              // byte offset into the text
  absl::string_view text;  // empty for kEnd
  int64_t value = 0;       // for kInt
};

bool IsNameStart(char c) { return absl::ascii_isalpha(c) || c == '_'; }
bool IsNameChar(char c) { return absl::ascii_isalnum(c) || c == '_'; }

bool IsKeyword(absl::string_view name) {
  return name == "and" || name == "or" || name == "not" || name == "True" || name == "False" ||
         name == "Min" || name == "Max";
}

class Parser {
 public:
  Parser(absl::string_view text, SymExpr::Tree* tree) : text_(text), tree_(tree) {}

  absl::Status Run() {
    RETURN_IF_ERROR(Lex());
    ASSIGN_OR_RETURN(int32_t root, ParseOr());
    const Token& t = tokens_[next_];
    if (t.kind != Tok::kEnd) {
      return Malformed(absl::StrCat("unexpected '", t.text, "'"), t.pos);
    }
    // Nodes are appended children first, so the root is already last.
    if (root != static_cast<int32_t>(tree_->nodes.size()) - 1) {
      return absl::InternalError("guard expression root is not the last node");
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Malformed(absl::string_view what, size_t pos) const {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed expression '", text_, "': ", what, " at column ", pos + 1));
  }

  // "expected X at column N, found 'Y'" (no "found" at the end of the text).
  absl::Status Expected(absl::string_view what, const Token& t) const {
    if (t.kind == Tok::kEnd) return Malformed(absl::StrCat("expected ", what), t.pos);
    return absl::InvalidArgumentError(absl::StrCat("malformed expression '", text_, "': expected ",
                                                   what, " at column ", t.pos + 1, ", found '",
                                                   t.text, "'"));
  }

  absl::Status Lex() {
    // The end of the text is reported just past its last non-blank character.
    const size_t end = absl::StripTrailingAsciiWhitespace(text_).size();
    size_t i = 0;
    while (true) {
      while (i < end && absl::ascii_isspace(text_[i])) ++i;
      if (i == end) break;
      const size_t start = i;
      const char c = text_[i];
      const char n = i + 1 < end ? text_[i + 1] : '\0';
      Tok kind;
      int64_t value = 0;
      if (absl::ascii_isdigit(c)) {
        while (i < end && absl::ascii_isdigit(text_[i])) {
          const int digit = text_[i] - '0';
          if (value > (std::numeric_limits<int64_t>::max() - digit) / 10) {
            while (i < end && absl::ascii_isdigit(text_[i])) ++i;
            return Malformed(
                absl::StrCat("integer ", text_.substr(start, i - start), " is out of range"),
                start);
          }
          value = value * 10 + digit;
          ++i;
        }
        if (i < end && IsNameChar(text_[i])) {
          return Malformed(absl::StrCat("unexpected character '", text_.substr(i, 1), "'"), i);
        }
        kind = Tok::kInt;
      } else if (IsNameStart(c)) {
        while (i < end && IsNameChar(text_[i])) ++i;
        kind = Tok::kName;
      } else {
        i += 1;
        switch (c) {
          case '(':
            kind = Tok::kLParen;
            break;
          case ')':
            kind = Tok::kRParen;
            break;
          case ',':
            kind = Tok::kComma;
            break;
          case '+':
            kind = Tok::kPlus;
            break;
          case '-':
            kind = Tok::kMinus;
            break;
          case '*':
            kind = n == '*' ? Tok::kStarStar : Tok::kStar;
            if (n == '*') i += 1;
            break;
          case '%':
            kind = Tok::kPercent;
            break;
          case '/':
            kind = n == '/' ? Tok::kSlashSlash : Tok::kSlash;
            if (n == '/') i += 1;
            break;
          case '=':
            if (n != '=') return Malformed("'=' is not an operator (equality is '==')", start);
            kind = Tok::kEq;
            i += 1;
            break;
          case '!':
            if (n != '=') return Malformed("unexpected character '!'", start);
            kind = Tok::kNe;
            i += 1;
            break;
          case '<':
            kind = n == '=' ? Tok::kLe : Tok::kLt;
            if (n == '=') i += 1;
            break;
          case '>':
            kind = n == '=' ? Tok::kGe : Tok::kGt;
            if (n == '=') i += 1;
            break;
          default:
            return Malformed(absl::StrCat("unexpected character '", text_.substr(start, 1), "'"),
                             start);
        }
      }
      tokens_.push_back(Token{kind, start, text_.substr(start, i - start), value});
    }
    tokens_.push_back(Token{Tok::kEnd, end, absl::string_view(), 0});
    return absl::OkStatus();
  }

  const Token& Peek() const { return tokens_[next_]; }
  bool PeekName(absl::string_view name) const {
    return Peek().kind == Tok::kName && Peek().text == name;
  }

  // Appends a node and returns its index; `pos` locates the error when the
  // node makes the tree too deep.
  absl::StatusOr<int32_t> Add(Op op, int32_t a, int32_t b, int64_t value, size_t pos) {
    const std::vector<int>& depths = tree_->depths;
    int depth = 1;
    if (a >= 0) depth = std::max(depth, depths[a] + 1);
    if (b >= 0) depth = std::max(depth, depths[b] + 1);
    if (depth > kMaxSymExprDepth) {
      return Malformed(absl::StrCat("expression nests deeper than ", kMaxSymExprDepth, " levels"),
                       pos);
    }
    tree_->nodes.push_back(Node{op, a, b, value});
    tree_->depths.push_back(depth);
    return static_cast<int32_t>(tree_->nodes.size() - 1);
  }

  // Bounds the parser's own recursion (parentheses, unary operators, `not`).
  class Nest {
   public:
    explicit Nest(int* depth) : depth_(depth) { ++*depth_; }
    ~Nest() { --*depth_; }
    bool too_deep() const { return *depth_ > kMaxSymExprDepth; }

   private:
    int* depth_;
  };

  absl::Status TooDeep(size_t pos) const {
    return Malformed(absl::StrCat("expression nests deeper than ", kMaxSymExprDepth, " levels"),
                     pos);
  }

  absl::StatusOr<int32_t> ParseOr() {
    ASSIGN_OR_RETURN(int32_t lhs, ParseAnd());
    while (PeekName("or")) {
      const size_t pos = tokens_[next_++].pos;
      ASSIGN_OR_RETURN(int32_t rhs, ParseAnd());
      ASSIGN_OR_RETURN(lhs, Add(Op::kOr, lhs, rhs, 0, pos));
    }
    return lhs;
  }

  absl::StatusOr<int32_t> ParseAnd() {
    ASSIGN_OR_RETURN(int32_t lhs, ParseNot());
    while (PeekName("and")) {
      const size_t pos = tokens_[next_++].pos;
      ASSIGN_OR_RETURN(int32_t rhs, ParseNot());
      ASSIGN_OR_RETURN(lhs, Add(Op::kAnd, lhs, rhs, 0, pos));
    }
    return lhs;
  }

  absl::StatusOr<int32_t> ParseNot() {
    if (!PeekName("not")) return ParseComparison();
    const size_t pos = tokens_[next_++].pos;
    Nest nest(&nesting_);
    if (nest.too_deep()) return TooDeep(pos);
    ASSIGN_OR_RETURN(int32_t operand, ParseNot());
    return Add(Op::kNot, operand, -1, 0, pos);
  }

  static std::optional<Op> ComparisonOp(Tok t) {
    switch (t) {
      case Tok::kEq:
        return Op::kEq;
      case Tok::kNe:
        return Op::kNe;
      case Tok::kLt:
        return Op::kLt;
      case Tok::kLe:
        return Op::kLe;
      case Tok::kGt:
        return Op::kGt;
      case Tok::kGe:
        return Op::kGe;
      default:
        return std::nullopt;
    }
  }

  absl::StatusOr<int32_t> ParseComparison() {
    ASSIGN_OR_RETURN(int32_t lhs, ParseSum());
    std::optional<Op> op = ComparisonOp(Peek().kind);
    if (!op) return lhs;
    const size_t pos = tokens_[next_++].pos;
    ASSIGN_OR_RETURN(int32_t rhs, ParseSum());
    if (ComparisonOp(Peek().kind)) {
      return Malformed("comparisons do not chain (use 'and')", Peek().pos);
    }
    return Add(*op, lhs, rhs, 0, pos);
  }

  absl::StatusOr<int32_t> ParseSum() {
    ASSIGN_OR_RETURN(int32_t lhs, ParseTerm());
    while (Peek().kind == Tok::kPlus || Peek().kind == Tok::kMinus) {
      const Token& t = tokens_[next_++];
      const Op op = t.kind == Tok::kPlus ? Op::kAdd : Op::kSub;
      ASSIGN_OR_RETURN(int32_t rhs, ParseTerm());
      ASSIGN_OR_RETURN(lhs, Add(op, lhs, rhs, 0, t.pos));
    }
    return lhs;
  }

  absl::StatusOr<int32_t> ParseTerm() {
    ASSIGN_OR_RETURN(int32_t lhs, ParseUnary());
    while (true) {
      Op op;
      switch (Peek().kind) {
        case Tok::kStar:
          op = Op::kMul;
          break;
        case Tok::kSlashSlash:
          op = Op::kFloorDiv;
          break;
        case Tok::kSlash:
          op = Op::kExactDiv;
          break;
        case Tok::kPercent:
          op = Op::kMod;
          break;
        default:
          return lhs;
      }
      const size_t pos = tokens_[next_++].pos;
      ASSIGN_OR_RETURN(int32_t rhs, ParseUnary());
      ASSIGN_OR_RETURN(lhs, Add(op, lhs, rhs, 0, pos));
    }
  }

  absl::StatusOr<int32_t> ParseUnary() {
    const Token& t = Peek();
    if (t.kind != Tok::kMinus && t.kind != Tok::kPlus) return ParsePower();
    ++next_;
    Nest nest(&nesting_);
    if (nest.too_deep()) return TooDeep(t.pos);
    ASSIGN_OR_RETURN(int32_t operand, ParseUnary());
    if (t.kind == Tok::kPlus) return operand;
    return Add(Op::kNeg, operand, -1, 0, t.pos);
  }

  // power := atom ['**' unary]: right-associative, and tighter than a unary
  // minus on its left (-2**2 == -4) but not on its right (2**-1 parses).
  absl::StatusOr<int32_t> ParsePower() {
    ASSIGN_OR_RETURN(int32_t base, ParseAtom());
    if (Peek().kind != Tok::kStarStar) return base;
    const Token& t = tokens_[next_++];
    Nest nest(&nesting_);
    if (nest.too_deep()) return TooDeep(t.pos);
    ASSIGN_OR_RETURN(int32_t exponent, ParseUnary());
    return Add(Op::kPow, base, exponent, 0, t.pos);
  }

  absl::StatusOr<int32_t> ParseAtom() {
    const Token& t = Peek();
    switch (t.kind) {
      case Tok::kInt:
        ++next_;
        return Add(Op::kConst, -1, -1, t.value, t.pos);
      case Tok::kLParen: {
        ++next_;
        Nest nest(&nesting_);
        if (nest.too_deep()) return TooDeep(t.pos);
        ASSIGN_OR_RETURN(int32_t inner, ParseOr());
        if (Peek().kind != Tok::kRParen) return Expected("')'", Peek());
        ++next_;
        return inner;
      }
      case Tok::kName:
        if (t.text == "True" || t.text == "False") {
          ++next_;
          return Add(Op::kConst, -1, -1, t.text == "True" ? 1 : 0, t.pos);
        }
        if (t.text == "Min" || t.text == "Max") return ParseCall();
        if (IsKeyword(t.text)) return Expected("an operand", t);
        if (tokens_[next_ + 1].kind == Tok::kLParen) return ParseCall();
        ++next_;
        return Add(Op::kSymbol, -1, -1, SymbolIndex(t.text), t.pos);
      default:
        return Expected("an operand", t);
    }
  }

  // FUNCTION '(' expr (',' expr)* ')', for the functions of the header.
  absl::StatusOr<int32_t> ParseCall() {
    const Token& name = tokens_[next_++];
    if (Peek().kind != Tok::kLParen) {
      return Expected(absl::StrCat("'(' after '", name.text, "'"), Peek());
    }
    ++next_;
    Nest nest(&nesting_);
    if (nest.too_deep()) return TooDeep(name.pos);
    std::vector<int32_t> args;
    while (true) {
      ASSIGN_OR_RETURN(int32_t arg, ParseOr());
      args.push_back(arg);
      if (Peek().kind != Tok::kComma) break;
      ++next_;
    }
    if (Peek().kind != Tok::kRParen) return Expected("',' or ')'", Peek());
    ++next_;
    const absl::string_view f = name.text;
    auto arity = [&](size_t n) -> absl::Status {
      if (args.size() == n) return absl::OkStatus();
      return Malformed(absl::StrCat("'", f, "' takes ", n, n == 1 ? " argument" : " arguments",
                                    ", not ", args.size()),
                       name.pos);
    };
    if (f == "Min" || f == "Max") {
      int32_t acc = args[0];
      for (size_t k = 1; k < args.size(); ++k) {
        ASSIGN_OR_RETURN(acc, Add(f == "Min" ? Op::kMin : Op::kMax, acc, args[k], 0, name.pos));
      }
      return acc;
    }
    std::optional<Op> binary;
    if (f == "Mod" || f == "PythonMod") binary = Op::kMod;
    if (f == "FloorDiv" || f == "floordiv") binary = Op::kFloorDiv;
    if (f == "CeilDiv") binary = Op::kCeilDiv;
    if (binary) {
      RETURN_IF_ERROR(arity(2));
      return Add(*binary, args[0], args[1], 0, name.pos);
    }
    if (f == "Abs") {
      RETURN_IF_ERROR(arity(1));
      return Add(Op::kAbs, args[0], -1, 0, name.pos);
    }
    if (f == "floor" || f == "ceiling" || f == "FloorToInt" || f == "CeilToInt" || f == "Integer") {
      RETURN_IF_ERROR(arity(1));
      return args[0];  // the identity on integers
    }
    return Malformed(absl::StrCat("unknown function '", f, "'"), name.pos);
  }

  int64_t SymbolIndex(absl::string_view name) {
    auto& symbols = tree_->symbols;
    for (size_t i = 0; i < symbols.size(); ++i) {
      if (symbols[i] == name) return static_cast<int64_t>(i);
    }
    symbols.emplace_back(name);
    return static_cast<int64_t>(symbols.size() - 1);
  }

  absl::string_view text_;
  SymExpr::Tree* tree_;
  std::vector<Token> tokens_;
  size_t next_ = 0;
  int nesting_ = 0;
};

enum class EvalError {
  kNone,
  kDivisionByZero,
  kModuloByZero,
  kOverflow,
  kInexactDivision,
  kNegativeExponent
};

// Python's a // b, for b != 0 and not (a == INT64_MIN and b == -1).
int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) --q;
  return q;
}

// Python's a % b (the sign of b), for b != 0.
int64_t FloorMod(int64_t a, int64_t b) {
  if (b == -1) return 0;  // INT64_MIN % -1 is undefined in C++
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

class Evaluator {
 public:
  Evaluator(const std::vector<Node>& nodes, const int64_t* symbol_values)
      : nodes_(nodes), symbols_(symbol_values) {}

  EvalError error() const { return error_; }

  // The value of node `i`; on failure sets error() and returns 0.
  int64_t Eval(int32_t i) {
    const Node& n = nodes_[i];
    switch (n.op) {
      case Op::kConst:
        return n.value;
      case Op::kSymbol:
        return symbols_[n.value];
      case Op::kNeg: {
        const int64_t v = Eval(n.a);
        if (v == std::numeric_limits<int64_t>::min()) return Fail(EvalError::kOverflow);
        return -v;
      }
      case Op::kNot:
        return Eval(n.a) == 0 ? 1 : 0;
      case Op::kAbs: {
        const int64_t v = Eval(n.a);
        if (v == std::numeric_limits<int64_t>::min()) return Fail(EvalError::kOverflow);
        return v < 0 ? -v : v;
      }
      case Op::kAnd: {
        if (Eval(n.a) == 0 || failed()) return 0;
        return Eval(n.b) != 0 ? 1 : 0;
      }
      case Op::kOr: {
        if (Eval(n.a) != 0) return failed() ? 0 : 1;
        return Eval(n.b) != 0 ? 1 : 0;
      }
      default:
        break;
    }
    const int64_t a = Eval(n.a);
    if (failed()) return 0;
    const int64_t b = Eval(n.b);
    if (failed()) return 0;
    int64_t r = 0;
    switch (n.op) {
      case Op::kAdd:
        if (__builtin_add_overflow(a, b, &r)) return Fail(EvalError::kOverflow);
        return r;
      case Op::kSub:
        if (__builtin_sub_overflow(a, b, &r)) return Fail(EvalError::kOverflow);
        return r;
      case Op::kMul:
        if (__builtin_mul_overflow(a, b, &r)) return Fail(EvalError::kOverflow);
        return r;
      case Op::kFloorDiv:
        if (b == 0) return Fail(EvalError::kDivisionByZero);
        if (b == -1 && a == std::numeric_limits<int64_t>::min()) {
          return Fail(EvalError::kOverflow);
        }
        return FloorDiv(a, b);
      case Op::kExactDiv:
        if (b == 0) return Fail(EvalError::kDivisionByZero);
        if (b == -1 && a == std::numeric_limits<int64_t>::min()) {
          return Fail(EvalError::kOverflow);
        }
        if (a % b != 0) return Fail(EvalError::kInexactDivision);
        return a / b;
      case Op::kCeilDiv: {
        // ceil(a / b) == -((-a) // b)
        if (b == 0) return Fail(EvalError::kDivisionByZero);
        if (a == std::numeric_limits<int64_t>::min()) return Fail(EvalError::kOverflow);
        if (b == -1) return -a;
        return -FloorDiv(-a, b);
      }
      case Op::kPow: {
        if (b < 0) return Fail(EvalError::kNegativeExponent);
        // Squaring, so that the time is logarithmic in the exponent.
        int64_t result = 1, base = a;
        for (int64_t e = b; e > 0; e >>= 1) {
          if ((e & 1) && __builtin_mul_overflow(result, base, &result)) {
            return Fail(EvalError::kOverflow);
          }
          if (e > 1 && __builtin_mul_overflow(base, base, &base)) return Fail(EvalError::kOverflow);
        }
        return result;
      }
      case Op::kMod:
        if (b == 0) return Fail(EvalError::kModuloByZero);
        return FloorMod(a, b);
      case Op::kEq:
        return a == b;
      case Op::kNe:
        return a != b;
      case Op::kLt:
        return a < b;
      case Op::kLe:
        return a <= b;
      case Op::kGt:
        return a > b;
      case Op::kGe:
        return a >= b;
      case Op::kMin:
        return std::min(a, b);
      case Op::kMax:
        return std::max(a, b);
      default:
        return Fail(EvalError::kOverflow);  // unreachable: handled above
    }
  }

 private:
  bool failed() const { return error_ != EvalError::kNone; }
  int64_t Fail(EvalError e) {
    if (!failed()) error_ = e;
    return 0;
  }

  const std::vector<Node>& nodes_;
  const int64_t* symbols_;
  EvalError error_ = EvalError::kNone;
};

absl::Status CannotEvaluate(absl::string_view text, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat("cannot evaluate '", text, "': ", reason));
}

}  // namespace

absl::StatusOr<SymExpr> SymExpr::Parse(absl::string_view text) {
  auto tree = std::make_shared<Tree>();
  tree->text = std::string(text);
  Parser parser(tree->text, tree.get());
  RETURN_IF_ERROR(parser.Run());
  return SymExpr(std::move(tree));
}

SymExpr SymExpr::Constant(int64_t value) {
  SymTreeBuilder b;
  b.Const(value);
  return SymExpr(b.Finish());
}

absl::StatusOr<SymExpr> SymExpr::Symbol(absl::string_view name) {
  if (!IsSymbolName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a symbol name"));
  }
  SymTreeBuilder b;
  b.Symbol(name);
  return SymExpr(b.Finish());
}

std::optional<int64_t> SymExpr::constant() const {
  const Node& n = tree_->nodes.back();
  if (n.op == Op::kConst) return n.value;
  if (n.op == Op::kNeg && tree_->nodes[n.a].op == Op::kConst &&
      tree_->nodes[n.a].value != std::numeric_limits<int64_t>::min()) {
    return -tree_->nodes[n.a].value;
  }
  return std::nullopt;
}

bool SymExpr::IsMonomial() const {
  const std::vector<Node>& nodes = tree_->nodes;
  int32_t i = tree_->root();
  if (nodes[i].op == Op::kNeg) i = nodes[i].a;
  bool has_symbol = false;
  std::vector<int32_t> stack = {i};
  while (!stack.empty()) {
    const Node& n = nodes[stack.back()];
    stack.pop_back();
    if (n.op == Op::kMul) {
      stack.push_back(n.a);
      stack.push_back(n.b);
    } else if (n.op == Op::kSymbol) {
      has_symbol = true;
    } else if (n.op != Op::kConst) {
      return false;
    }
  }
  return has_symbol;
}

int32_t SymTreeBuilder::Symbol(absl::string_view name) {
  auto& symbols = tree_->symbols;
  size_t i = 0;
  while (i < symbols.size() && symbols[i] != name) ++i;
  if (i == symbols.size()) symbols.emplace_back(name);
  return Add(SymOp::kSymbol, -1, -1, static_cast<int64_t>(i));
}

int32_t SymTreeBuilder::Add(SymOp op, int32_t a, int32_t b, int64_t value) {
  const std::vector<int>& depths = tree_->depths;
  int depth = 1;
  if (a >= 0) depth = std::max(depth, depths[a] + 1);
  if (b >= 0) depth = std::max(depth, depths[b] + 1);
  tree_->nodes.push_back(SymNode{op, a, b, value});
  tree_->depths.push_back(depth);
  return tree_->root();
}

int32_t SymTreeBuilder::Copy(const SymExpr::Tree& from, int32_t node) {
  // The subtree's nodes are a contiguous range ending at `node` only for
  // trees built children first without sharing, so copy by recursion, which
  // the depth bound keeps shallow.
  const SymNode& n = from.nodes[node];
  if (n.op == SymOp::kSymbol) return Symbol(from.symbols[n.value]);
  const int32_t a = n.a >= 0 ? Copy(from, n.a) : -1;
  const int32_t b = n.b >= 0 ? Copy(from, n.b) : -1;
  return Add(n.op, a, b, n.value);
}

std::shared_ptr<SymExpr::Tree> SymTreeBuilder::Finish() {
  std::shared_ptr<SymExpr::Tree> tree = std::move(tree_);
  tree->text = SymText(*tree, tree->root());
  tree_ = std::make_shared<SymExpr::Tree>();
  return tree;
}

absl::StatusOr<int64_t> SymExpr::Evaluate(const Bindings& bindings) const {
  return EvaluateWith([&bindings](absl::string_view name) -> std::optional<int64_t> {
    auto it = bindings.find(name);
    if (it == bindings.end()) return std::nullopt;
    return it->second;
  });
}

absl::StatusOr<int64_t> SymExpr::EvaluateWith(
    absl::FunctionRef<std::optional<int64_t>(absl::string_view)> lookup) const {
  absl::InlinedVector<int64_t, 8> values;
  values.reserve(tree_->symbols.size());
  for (const std::string& name : tree_->symbols) {
    std::optional<int64_t> v = lookup(name);
    if (!v) return CannotEvaluate(tree_->text, absl::StrCat("symbol '", name, "' is unbound"));
    values.push_back(*v);
  }
  Evaluator eval(tree_->nodes, values.data());
  const int64_t result = eval.Eval(static_cast<int32_t>(tree_->nodes.size() - 1));
  switch (eval.error()) {
    case EvalError::kNone:
      return result;
    case EvalError::kDivisionByZero:
      return CannotEvaluate(tree_->text, "division by zero");
    case EvalError::kModuloByZero:
      return CannotEvaluate(tree_->text, "modulo by zero");
    case EvalError::kOverflow:
      return CannotEvaluate(tree_->text, "integer overflow");
    case EvalError::kInexactDivision:
      return CannotEvaluate(tree_->text, "'/' of sizes that do not divide");
    case EvalError::kNegativeExponent:
      return CannotEvaluate(tree_->text, "negative exponent");
  }
  return result;
}

const std::vector<std::string>& SymExpr::symbols() const { return tree_->symbols; }

void SymExpr::CollectSymbols(std::vector<std::string>* out) const {
  for (const std::string& s : tree_->symbols) {
    if (std::find(out->begin(), out->end(), s) == out->end()) out->push_back(s);
  }
}

const std::string& SymExpr::text() const { return tree_->text; }

bool IsSymbolName(absl::string_view name) {
  if (name.empty() || !IsNameStart(name[0])) return false;
  for (char c : name) {
    if (!IsNameChar(c)) return false;
  }
  return !IsKeyword(name);
}

std::optional<absl::string_view> AsBareSymbol(absl::string_view text) {
  absl::string_view name = absl::StripAsciiWhitespace(text);
  if (!IsSymbolName(name)) return std::nullopt;
  return name;
}

}  // namespace kiln::ir
