#include "cache/guard_expr.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kiln::cache {
namespace {

// Deeper expressions are refused, so that parsing and evaluation (both
// recursive) stay within a small, fixed amount of stack.
constexpr int kMaxDepth = 256;

enum class Op : uint8_t {
  kConst,
  kSymbol,  // leaves: `value` is the constant or the symbol's index
  kNeg,
  kNot,  // unary: operand in `a`
  kAdd,
  kSub,
  kMul,
  kFloorDiv,
  kMod,
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

struct Node {
  Op op;
  int32_t a = -1;
  int32_t b = -1;
  int64_t value = 0;
};

}  // namespace

struct SymExpr::Tree {
  std::string text;
  std::vector<Node> nodes;  // children before parents; the root is last
  std::vector<std::string> symbols;
};

namespace {

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
            kind = Tok::kStar;
            break;
          case '%':
            kind = Tok::kPercent;
            break;
          case '/':
            if (n != '/') {
              return Malformed("'/' is not an operator (floor division is '//')", start);
            }
            kind = Tok::kSlashSlash;
            i += 1;
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
    int depth = 1;
    if (a >= 0) depth = std::max(depth, depths_[a] + 1);
    if (b >= 0) depth = std::max(depth, depths_[b] + 1);
    if (depth > kMaxDepth) {
      return Malformed(absl::StrCat("expression nests deeper than ", kMaxDepth, " levels"), pos);
    }
    tree_->nodes.push_back(Node{op, a, b, value});
    depths_.push_back(depth);
    return static_cast<int32_t>(tree_->nodes.size() - 1);
  }

  // Bounds the parser's own recursion (parentheses, unary operators, `not`).
  class Nest {
   public:
    explicit Nest(int* depth) : depth_(depth) { ++*depth_; }
    ~Nest() { --*depth_; }
    bool too_deep() const { return *depth_ > kMaxDepth; }

   private:
    int* depth_;
  };

  absl::Status TooDeep(size_t pos) const {
    return Malformed(absl::StrCat("expression nests deeper than ", kMaxDepth, " levels"), pos);
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
    if (t.kind != Tok::kMinus && t.kind != Tok::kPlus) return ParseAtom();
    ++next_;
    Nest nest(&nesting_);
    if (nest.too_deep()) return TooDeep(t.pos);
    ASSIGN_OR_RETURN(int32_t operand, ParseUnary());
    if (t.kind == Tok::kPlus) return operand;
    return Add(Op::kNeg, operand, -1, 0, t.pos);
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
        if (t.text == "Min" || t.text == "Max") return ParseMinMax();
        if (IsKeyword(t.text)) return Expected("an operand", t);
        ++next_;
        return Add(Op::kSymbol, -1, -1, SymbolIndex(t.text), t.pos);
      default:
        return Expected("an operand", t);
    }
  }

  absl::StatusOr<int32_t> ParseMinMax() {
    const Token& name = tokens_[next_++];
    const Op op = name.text == "Min" ? Op::kMin : Op::kMax;
    if (Peek().kind != Tok::kLParen) {
      return Expected(absl::StrCat("'(' after '", name.text, "'"), Peek());
    }
    ++next_;
    Nest nest(&nesting_);
    if (nest.too_deep()) return TooDeep(name.pos);
    ASSIGN_OR_RETURN(int32_t acc, ParseOr());
    while (Peek().kind == Tok::kComma) {
      ++next_;
      ASSIGN_OR_RETURN(int32_t arg, ParseOr());
      ASSIGN_OR_RETURN(acc, Add(op, acc, arg, 0, name.pos));
    }
    if (Peek().kind != Tok::kRParen) return Expected("',' or ')'", Peek());
    ++next_;
    return acc;
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
  std::vector<int> depths_;  // parallel to tree_->nodes
  int nesting_ = 0;
};

enum class EvalError { kNone, kDivisionByZero, kModuloByZero, kOverflow };

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

}  // namespace kiln::cache
