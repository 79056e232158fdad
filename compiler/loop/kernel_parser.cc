#include "compiler/loop/kernel_parser.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "compiler/ir/parse_text.h"
#include "compiler/ir/printer.h"
#include "compiler/ir/sym_expr.h"

namespace kiln::loop {
namespace {

// Each index holds a stride per dimension, so the dimensions are bounded to
// keep a kernel's memory linear in its text.
constexpr size_t kMaxDimensions = 64;

using ir::text::Error;
using ir::text::IsDigits;
using ir::text::IsIntegerLiteral;
using ir::text::kQuoteLimit;
using ir::text::Quote;

// Digits as an int: a count, a pass, a statement or buffer number.
absl::StatusOr<int> ParseNumber(int line, absl::string_view text, absl::string_view what) {
  int value = 0;
  if (!IsDigits(text)) return Error(line, absl::StrCat("expected ", what, ", got ", Quote(text)));
  if (!absl::SimpleAtoi(text, &value)) {
    return Error(line, absl::StrCat(what, " ", Quote(text), " is out of range"));
  }
  return value;
}

// Symbolic text, checked by ir::SymExpr.
absl::StatusOr<ir::SymInt> ParseSymbolic(int line, absl::string_view text, absl::string_view what) {
  if (text.empty()) return Error(line, absl::StrCat("expected ", what, ", got nothing"));
  absl::StatusOr<ir::SymExpr> expr = ir::SymExpr::Parse(text);
  if (!expr.ok()) {
    // SymExpr's message quotes the whole text; keep only its reason.
    absl::string_view why = expr.status().message();
    const size_t quoted = why.rfind("': ");
    if (quoted != absl::string_view::npos) why.remove_prefix(quoted + 3);
    return Error(line, absl::StrCat("malformed ", what, " ", Quote(text), ": ",
                                    why.substr(0, 2 * kQuoteLimit)));
  }
  return ir::SymInt{std::string(text)};
}

// An integer (a constant ir::SymInt) or symbolic text.
absl::StatusOr<ir::SymInt> ParseSize(int line, absl::string_view text, absl::string_view what) {
  if (!IsIntegerLiteral(text)) return ParseSymbolic(line, text, what);
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return Error(line, absl::StrCat(what, " ", Quote(text), " is out of range of int64"));
  }
  return ir::SymInt{value};
}

// Splits at the commas outside parentheses ("Max(s0, s1), 4"), each piece
// stripped of whitespace.
std::vector<absl::string_view> SplitTopLevel(absl::string_view text) {
  std::vector<absl::string_view> pieces;
  int depth = 0;
  size_t start = 0;
  for (size_t k = 0; k < text.size(); ++k) {
    if (text[k] == '(') ++depth;
    if (text[k] == ')') --depth;
    if (text[k] == ',' && depth == 0) {
      pieces.push_back(absl::StripAsciiWhitespace(text.substr(start, k - start)));
      start = k + 1;
    }
  }
  pieces.push_back(absl::StripAsciiWhitespace(text.substr(start)));
  return pieces;
}

// "[8, s0]" at the start of *text, consumed.
absl::StatusOr<std::vector<ir::SymInt>> ParseSizeList(int line, absl::string_view* text,
                                                      absl::string_view what) {
  const size_t close = text->find(']');
  if (!absl::StartsWith(*text, "[") || close == absl::string_view::npos) {
    return Error(line, absl::StrCat("expected '[...]' of ", what, " sizes, got ", Quote(*text)));
  }
  const absl::string_view list = text->substr(1, close - 1);
  text->remove_prefix(close + 1);
  std::vector<ir::SymInt> sizes;
  if (absl::StripAsciiWhitespace(list).empty()) return sizes;
  for (absl::string_view piece : SplitTopLevel(list)) {
    if (sizes.size() == kMaxDimensions) {
      return Error(line, absl::StrCat("more than ", kMaxDimensions, " ", what, " dimensions"));
    }
    ASSIGN_OR_RETURN(ir::SymInt size, ParseSize(line, piece, absl::StrCat(what, " size")));
    sizes.push_back(std::move(size));
  }
  return sizes;
}

absl::StatusOr<v1::DType> ParseDType(int line, absl::string_view text) {
  for (int d = v1::DType_MIN; d <= v1::DType_MAX; ++d) {
    if (!v1::DType_IsValid(d)) continue;
    const std::string name = ir::DTypeShortName(static_cast<v1::DType>(d));
    if (name != "?" && name == text) return static_cast<v1::DType>(d);
  }
  return Error(line, absl::StrCat("expected a dtype (f32, i64, b8, ...), got ", Quote(text)));
}

absl::StatusOr<ReduceOp> ParseReduceOp(int line, absl::string_view text) {
  if (text == "sum") return ReduceOp::kSum;
  if (text == "max") return ReduceOp::kMax;
  if (text == "min") return ReduceOp::kMin;
  if (text == "welford_mean") return ReduceOp::kWelfordMean;
  if (text == "welford_m2") return ReduceOp::kWelfordM2;
  return Error(line, absl::StrCat("expected a reduction (sum, max, min, welford_mean, "
                                  "welford_m2), got ",
                                  Quote(text)));
}

// A line of the text: its 1-based number and its text without surrounding
// whitespace.
struct Line {
  int number = 0;
  absl::string_view text;
};

// Parses the lines of one kernel.
class KernelParser {
 public:
  explicit KernelParser(absl::Span<const Line> lines) : lines_(lines) {}

  absl::StatusOr<Kernel> Parse() {
    RETURN_IF_ERROR(Header(lines_[0]));
    size_t i = 1;
    if (i < lines_.size() && absl::StartsWith(lines_[i].text, "nodes:")) {
      RETURN_IF_ERROR(Nodes(lines_[i]));
      ++i;
    }
    if (i == lines_.size() || lines_[i].text != "buffers:") {
      const int number = i < lines_.size() ? lines_[i].number : lines_.back().number + 1;
      return Error(number, absl::StrCat("expected 'buffers:' after the kernel's ",
                                        i == 1 ? "header" : "nodes"));
    }
    for (++i; i < lines_.size() && absl::StartsWith(lines_[i].text, "buf"); ++i) {
      RETURN_IF_ERROR(Buffer(lines_[i]));
    }
    for (; i < lines_.size(); ++i) RETURN_IF_ERROR(Statement(lines_[i]));
    return std::move(k_);
  }

 private:
  // "kernel <name>: outer [..] inner [..] passes <n>[ groups <g>][ block <threads>][ reversed]"
  absl::Status Header(const Line& line) {
    absl::string_view t = line.text;
    const int n = line.number;
    if (!absl::ConsumePrefix(&t, "kernel ")) {
      return Error(n, "expected 'kernel <name>: outer [...] inner [...] passes <n>'");
    }
    const size_t at = t.find(": outer ");
    if (at == absl::string_view::npos) {
      return Error(n, "expected ': outer [...]' after the kernel's name");
    }
    k_.name = std::string(t.substr(0, at));
    t.remove_prefix(at + 8);
    ASSIGN_OR_RETURN(k_.outer, ParseSizeList(n, &t, "outer"));
    if (!absl::ConsumePrefix(&t, " inner ")) {
      return Error(n, "expected ' inner [...]' after the outer sizes");
    }
    ASSIGN_OR_RETURN(k_.inner, ParseSizeList(n, &t, "inner"));
    if (!absl::ConsumePrefix(&t, " passes ")) {
      return Error(n, "expected ' passes <n>' after the inner sizes");
    }
    k_.reversed = absl::ConsumeSuffix(&t, " reversed");
    const size_t block = t.find(" block ");
    const size_t groups = t.substr(0, block).find(" groups ");
    ASSIGN_OR_RETURN(k_.passes,
                     ParseNumber(n, t.substr(0, std::min(groups, block)), "the number of passes"));
    if (k_.passes < 1) return Error(n, "expected at least 1 pass");
    if (groups != absl::string_view::npos) {
      const size_t end = block == absl::string_view::npos ? block : block - groups - 8;
      ASSIGN_OR_RETURN(k_.row_groups,
                       ParseNumber(n, t.substr(groups + 8, end), "the number of row groups"));
      if (k_.row_groups < 1) return Error(n, "expected at least 1 row group");
    }
    if (block != absl::string_view::npos) {
      ASSIGN_OR_RETURN(k_.block, ParseNumber(n, t.substr(block + 7), "the threads per block"));
      if (k_.block < 1) return Error(n, "expected at least 1 thread per block");
    }
    return absl::OkStatus();
  }

  // "nodes: a, b"
  absl::Status Nodes(const Line& line) {
    absl::string_view t = line.text;
    absl::ConsumePrefix(&t, "nodes:");
    t = absl::StripLeadingAsciiWhitespace(t);
    if (t.empty()) return Error(line.number, "expected node names after 'nodes:'");
    for (absl::string_view node : absl::StrSplit(t, ", ")) k_.nodes.emplace_back(node);
    return absl::OkStatus();
  }

  // "buf<b> = <value> : <dtype>[ (written)]"
  absl::Status Buffer(const Line& line) {
    absl::string_view t = line.text;
    const int n = line.number;
    const std::string want = absl::StrCat("buf", k_.buffers.size());
    if (!absl::ConsumePrefix(&t, want) || !absl::ConsumePrefix(&t, " = ")) {
      return Error(n, absl::StrCat("expected '", want,
                                   " = <value> : <dtype>' (buffers are numbered in order), got ",
                                   Quote(line.text)));
    }
    KernelBuffer buffer;
    buffer.written = absl::ConsumeSuffix(&t, " (written)");
    const size_t at = t.rfind(" : ");
    if (at == absl::string_view::npos || at == 0) {
      return Error(n, absl::StrCat("expected '<value> : <dtype>' after '", want, " = '"));
    }
    buffer.value = std::string(t.substr(0, at));
    ASSIGN_OR_RETURN(buffer.dtype, ParseDType(n, t.substr(at + 3)));
    k_.buffers.push_back(std::move(buffer));
    return absl::OkStatus();
  }

  // "%<j> = <value> : <dtype> [pass <p>, inner|outer]" or
  // "store buf<b>[<index>] = %<a> [pass <p>, inner|outer]".
  absl::Status Statement(const Line& line) {
    absl::string_view t = line.text;
    const int n = line.number;
    const int position = static_cast<int>(k_.stmts.size());
    if (!absl::StartsWith(t, "%") && !absl::StartsWith(t, "store ") &&
        !absl::StartsWith(t, "accumulate ") && !absl::StartsWith(t, "scatter_add ")) {
      return Error(
          n, absl::StrCat("expected a statement ('%", position,
                          " = ...', 'store ...' or 'accumulate ...'), got ", Quote(line.text)));
    }
    Stmt s;
    const size_t at = t.rfind(" [pass ");
    if (at == absl::string_view::npos || !absl::EndsWith(t, "]")) {
      return Error(n, "expected ' [pass <p>, inner|outer]' at the end of the statement");
    }
    absl::string_view where = t.substr(at + 7, t.size() - at - 8);
    t = t.substr(0, at);
    const size_t comma = where.find(", ");
    if (comma == absl::string_view::npos) {
      return Error(n, "expected ', inner' or ', outer' after the pass");
    }
    ASSIGN_OR_RETURN(s.pass, ParseNumber(n, where.substr(0, comma), "a pass number"));
    if (s.pass >= k_.passes) {
      return Error(n, absl::StrCat("pass ", s.pass, " of a kernel of ", k_.passes, " passes"));
    }
    where.remove_prefix(comma + 2);
    if (where != "inner" && where != "outer") {
      return Error(n, absl::StrCat("expected 'inner' or 'outer', got ", Quote(where)));
    }
    s.inner = where == "inner";

    if (absl::ConsumePrefix(&t, "store ")) {
      s.kind = StmtKind::kStore;
      RETURN_IF_ERROR(Access(n, &t, &s));
      if (!absl::ConsumePrefix(&t, " = ")) {
        return Error(n, "expected ' = %<value>' after the stored-to index");
      }
      RETURN_IF_ERROR(Args(n, t, position, 1, "store", &s.args));
      s.dtype = k_.buffers[s.buffer].dtype;
      k_.stmts.push_back(std::move(s));
      return absl::OkStatus();
    }

    if (absl::ConsumePrefix(&t, "scatter_add ")) {
      // "scatter_add buf<b>[<index>] by <terms> += %<value> : <dtype>"
      s.kind = StmtKind::kScatterAdd;
      RETURN_IF_ERROR(Access(n, &t, &s));
      const size_t colon = t.rfind(" : ");
      const size_t plus = t.rfind(" += ");
      if (colon == absl::string_view::npos || plus == absl::string_view::npos || plus > colon) {
        return Error(n, "expected ' += %<value> : <dtype>' after the scatter's indices");
      }
      ASSIGN_OR_RETURN(s.dtype, ParseDType(n, t.substr(colon + 3)));
      std::vector<int> value;
      RETURN_IF_ERROR(
          Args(n, t.substr(plus + 4, colon - plus - 4), position, 1, "scatter_add", &value));
      s.args = value;
      RETURN_IF_ERROR(GatherTerms(n, t.substr(0, plus), position, &s));
      if (!k_.buffers[s.buffer].written) {
        return Error(n, absl::StrCat("scatter_add into buf", s.buffer, ", not marked written"));
      }
      k_.stmts.push_back(std::move(s));
      return absl::OkStatus();
    }

    if (absl::ConsumePrefix(&t, "accumulate ")) {
      s.kind = StmtKind::kAccumulate;
      RETURN_IF_ERROR(Access(n, &t, &s));
      if (!absl::ConsumePrefix(&t, " += ")) {
        return Error(n, "expected ' += %<value> : <dtype>' after the accumulated-to index");
      }
      const size_t colon = t.rfind(" : ");
      if (colon == absl::string_view::npos) {
        return Error(n, "expected ' : <dtype>' after the accumulated value");
      }
      ASSIGN_OR_RETURN(s.dtype, ParseDType(n, t.substr(colon + 3)));
      RETURN_IF_ERROR(Args(n, t.substr(0, colon), position, 1, "accumulate", &s.args));
      k_.stmts.push_back(std::move(s));
      return absl::OkStatus();
    }

    absl::ConsumePrefix(&t, "%");
    const size_t eq = t.find(" = ");
    const absl::string_view number = t.substr(0, std::min(eq, t.find(' ')));
    if (eq == absl::string_view::npos || eq != number.size()) {
      return Error(n, absl::StrCat("expected ' = ' after '%", number.substr(0, kQuoteLimit), "'"));
    }
    if (number != absl::StrCat(position)) {
      return Error(n, absl::StrCat("expected %", position,
                                   " (statements, stores included, are numbered in order), got %",
                                   number.substr(0, kQuoteLimit)));
    }
    t.remove_prefix(eq + 3);
    const size_t colon = t.rfind(" : ");
    if (colon == absl::string_view::npos) {
      return Error(n, absl::StrCat("expected ' : <dtype>' after the value of %", position));
    }
    ASSIGN_OR_RETURN(s.dtype, ParseDType(n, t.substr(colon + 3)));
    t = t.substr(0, colon);

    if (absl::ConsumePrefix(&t, "load ")) {
      s.kind = StmtKind::kLoad;
      RETURN_IF_ERROR(Access(n, &t, &s));
      if (!t.empty()) return Error(n, absl::StrCat("unexpected ", Quote(t), " after the load"));
    } else if (absl::ConsumePrefix(&t, "index [")) {
      s.kind = StmtKind::kIndex;
      if (!absl::ConsumeSuffix(&t, "]")) return Error(n, "expected ']' after the index value");
      RETURN_IF_ERROR(Index(n, t, &s.index));
      if (s.dtype != v1::INT64 && s.dtype != v1::INT32) {
        return Error(n, "an index value is an integer (i64 or i32)");
      }
    } else if (absl::ConsumePrefix(&t, "gather ")) {
      s.kind = StmtKind::kGather;
      RETURN_IF_ERROR(Access(n, &t, &s));
      RETURN_IF_ERROR(GatherTerms(n, t, position, &s));
    } else if (absl::ConsumePrefix(&t, "constant ")) {
      s.kind = StmtKind::kConstant;
      if (t.empty() || t.find(' ') != absl::string_view::npos ||
          !absl::SimpleAtod(t, &s.constant)) {
        return Error(n, absl::StrCat("expected a number after 'constant', got ", Quote(t)));
      }
    } else if (absl::ConsumePrefix(&t, "reduce ")) {
      s.kind = StmtKind::kReduce;
      const size_t space = t.find(' ');
      ASSIGN_OR_RETURN(s.reduce, ParseReduceOp(n, t.substr(0, space)));
      if (space == absl::string_view::npos) {
        return Error(n, "expected '%<value>' after the reduction");
      }
      RETURN_IF_ERROR(Args(n, t.substr(space + 1), position, 1, "reduce", &s.args));
    } else {
      s.kind = StmtKind::kOp;
      const size_t space = t.find(' ');
      const absl::string_view name = t.substr(0, space);
      std::optional<ScalarOp> op = ParseScalarOp(name);
      if (!op) {
        return Error(
            n, absl::StrCat("expected load, gather, index, constant, reduce or a scalar op, got ",
                            Quote(name)));
      }
      s.op = *op;
      const ScalarOpInfo* info = FindScalarOp(s.op);
      const absl::string_view args =
          space == absl::string_view::npos ? absl::string_view() : t.substr(space + 1);
      RETURN_IF_ERROR(Args(n, args, position, info->arity, info->name, &s.args));
    }
    k_.stmts.push_back(std::move(s));
    return absl::OkStatus();
  }

  // " by %3 in 100 step 64, %5 in s0 step 1": a gather's index operands,
  // each with its dimension's size and stride.
  absl::Status GatherTerms(int n, absl::string_view t, int position, Stmt* s) {
    if (!absl::ConsumePrefix(&t, " by ")) {
      return Error(n, "expected ' by %<index> in <size> step <stride>' after the gathered buffer");
    }
    s->gather_wraps = absl::ConsumeSuffix(&t, " wrapping");
    for (absl::string_view term : SplitTopLevel(t)) {
      const size_t in = term.find(" in "), step = term.find(" step ");
      if (in == absl::string_view::npos || step == absl::string_view::npos || step < in) {
        return Error(
            n, absl::StrCat("expected '%<index> in <size> step <stride>', got ", Quote(term)));
      }
      std::vector<int> arg;
      RETURN_IF_ERROR(Args(n, term.substr(0, in), position, 1, "gather", &arg));
      ASSIGN_OR_RETURN(ir::SymInt size,
                       ParseSize(n, term.substr(in + 4, step - in - 4), "gathered size"));
      ASSIGN_OR_RETURN(ir::SymInt stride, ParseSize(n, term.substr(step + 6), "gathered stride"));
      const v1::DType t = k_.stmts[arg[0]].dtype;
      if (t != v1::INT64 && t != v1::INT32) {
        return Error(n, absl::StrCat("gather index %", arg[0], " is ", ir::DTypeShortName(t),
                                     ", not an integer"));
      }
      s->args.push_back(arg[0]);
      s->gather_sizes.push_back(std::move(size));
      s->gather_strides.push_back(std::move(stride));
    }
    if (s->gather_sizes.empty()) return Error(n, "a gather takes at least one index operand");
    return absl::OkStatus();
  }

  // "%0, %3": exactly `arity` operands, each an earlier statement that is
  // not a store.
  absl::Status Args(int n, absl::string_view text, int position, int arity, absl::string_view what,
                    std::vector<int>* args) {
    int count = 0;
    if (!text.empty()) {
      for (absl::string_view piece : absl::StrSplit(text, ", ")) {
        if (++count > arity) break;
        absl::string_view digits = piece;
        if (!absl::ConsumePrefix(&digits, "%") || !IsDigits(digits)) {
          return Error(n, absl::StrCat("expected an operand '%<statement>' of ", what, ", got ",
                                       Quote(piece)));
        }
        int a = 0;
        if (!absl::SimpleAtoi(digits, &a) || a >= position) {
          return Error(n, absl::StrCat("operand %", digits.substr(0, kQuoteLimit),
                                       " is not a statement before %", position));
        }
        if (k_.stmts[a].kind == StmtKind::kStore || k_.stmts[a].kind == StmtKind::kAccumulate ||
            k_.stmts[a].kind == StmtKind::kScatterAdd) {
          return Error(n,
                       absl::StrCat("operand %", a, " is a ",
                                    k_.stmts[a].kind == StmtKind::kStore        ? "store"
                                    : k_.stmts[a].kind == StmtKind::kScatterAdd ? "scatter-add"
                                                                                : "sum across rows",
                                    ", which has no value"));
        }
        args->push_back(a);
      }
    }
    if (count != arity) {
      return Error(n, absl::StrCat(what, " takes ", arity, " operand", arity == 1 ? "" : "s",
                                   count > arity ? ", got more" : absl::StrCat(", got ", count)));
    }
    return absl::OkStatus();
  }

  // "buf<b>[<index>]" at the start of *t, consumed, into s->buffer and
  // s->index.
  absl::Status Access(int n, absl::string_view* t, Stmt* s) {
    const size_t open = t->find('[');
    absl::string_view name = t->substr(0, open);
    if (!absl::ConsumePrefix(&name, "buf") || open == absl::string_view::npos) {
      return Error(n, absl::StrCat("expected 'buf<b>[<index>]', got ", Quote(*t)));
    }
    ASSIGN_OR_RETURN(s->buffer, ParseNumber(n, name, "a buffer number"));
    if (s->buffer >= static_cast<int>(k_.buffers.size())) {
      return Error(n, absl::StrCat("buf", s->buffer, " is not one of the kernel's ",
                                   k_.buffers.size(), " buffers"));
    }
    const size_t close = t->find(']', open);
    if (close == absl::string_view::npos) {
      return Error(n, absl::StrCat("expected ']' after the index of buf", s->buffer));
    }
    RETURN_IF_ERROR(Index(n, t->substr(open + 1, close - open - 1), &s->index));
    t->remove_prefix(close + 1);
    return absl::OkStatus();
  }

  // "o0*64 + i0*(s1 - 1) + 0": stride terms, then the offset.
  absl::Status Index(int n, absl::string_view text, loop::Index* index) {
    index->outer_strides.assign(k_.outer.size(), ir::SymInt{int64_t{0}});
    index->inner_strides.assign(k_.inner.size(), ir::SymInt{int64_t{0}});
    std::vector<bool> seen_outer(k_.outer.size()), seen_inner(k_.inner.size());
    while (text.size() >= 2 && (text[0] == 'o' || text[0] == 'i') &&
           absl::ascii_isdigit(static_cast<unsigned char>(text[1]))) {
      size_t star = 1;
      while (star < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[star]))) {
        ++star;
      }
      if (star == text.size() || text[star] != '*') break;  // the offset, a symbol
      const bool outer = text[0] == 'o';
      const absl::string_view var = text.substr(0, star);
      const std::string what = absl::StrCat("stride of ", var.substr(0, kQuoteLimit));
      ASSIGN_OR_RETURN(const int dim, ParseNumber(n, var.substr(1), "a dimension"));
      const size_t dims = outer ? k_.outer.size() : k_.inner.size();
      if (static_cast<size_t>(dim) >= dims) {
        return Error(n, absl::StrCat(var, " is not one of the kernel's ", dims,
                                     outer ? " outer" : " inner", " dimensions"));
      }
      std::vector<bool>& seen = outer ? seen_outer : seen_inner;
      if (seen[dim]) return Error(n, absl::StrCat(var, " appears twice in the index"));
      seen[dim] = true;
      text.remove_prefix(star + 1);
      ir::SymInt stride;
      if (absl::StartsWith(text, "(")) {
        // Parenthesized: symbolic text, the parentheses not its own.
        size_t close = 0;
        int depth = 0;
        for (size_t k = 0; k < text.size() && close == 0; ++k) {
          if (text[k] == '(') ++depth;
          if (text[k] == ')' && --depth == 0) close = k;
        }
        if (close == 0) return Error(n, absl::StrCat("unbalanced '(' in ", what));
        ASSIGN_OR_RETURN(stride, ParseSymbolic(n, text.substr(1, close - 1), what));
        text.remove_prefix(close + 1);
      } else {
        const size_t plus = text.find(" + ");
        if (plus == absl::string_view::npos) {
          return Error(n, absl::StrCat("expected ' + <offset>' after ", what));
        }
        ASSIGN_OR_RETURN(stride, ParseSize(n, text.substr(0, plus), what));
        text.remove_prefix(plus);
      }
      if (!absl::ConsumePrefix(&text, " + ")) {
        return Error(n, absl::StrCat("expected ' + ' after ", what));
      }
      (outer ? index->outer_strides : index->inner_strides)[dim] = std::move(stride);
    }
    ASSIGN_OR_RETURN(index->offset, ParseSize(n, text, "offset"));
    return absl::OkStatus();
  }

  absl::Span<const Line> lines_;
  Kernel k_;
};

struct ParsedKernel {
  int line = 0;  // of its header
  Kernel kernel;
};

absl::StatusOr<std::vector<ParsedKernel>> ParseAll(absl::string_view text) {
  std::vector<Line> lines;
  int number = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    lines.push_back({++number, absl::StripAsciiWhitespace(raw)});
  }
  std::vector<ParsedKernel> out;
  std::vector<Line> group;
  for (size_t i = 0; i < lines.size();) {
    const Line& line = lines[i];
    if (line.text.empty() || absl::StartsWith(line.text, "#")) {
      ++i;
      continue;
    }
    if (!absl::StartsWith(line.text, "kernel ")) {
      return Error(line.number, absl::StrCat("expected 'kernel <name>: outer [...] inner [...] "
                                             "passes <n>', got ",
                                             Quote(line.text)));
    }
    group.assign(1, line);
    for (++i;
         i < lines.size() && !lines[i].text.empty() && !absl::StartsWith(lines[i].text, "kernel ");
         ++i) {
      if (!absl::StartsWith(lines[i].text, "#")) group.push_back(lines[i]);
    }
    ASSIGN_OR_RETURN(Kernel kernel, KernelParser(group).Parse());
    out.push_back({line.number, std::move(kernel)});
  }
  return out;
}

}  // namespace

absl::StatusOr<Kernel> ParseKernel(absl::string_view text) {
  ASSIGN_OR_RETURN(std::vector<ParsedKernel> kernels, ParseAll(text));
  if (kernels.empty()) {
    return Error(1, "expected 'kernel <name>: outer [...] inner [...] passes <n>'");
  }
  if (kernels.size() > 1) {
    return Error(kernels[1].line, "expected one kernel, found a second");
  }
  return std::move(kernels[0].kernel);
}

absl::StatusOr<std::vector<Kernel>> ParseKernels(absl::string_view text) {
  ASSIGN_OR_RETURN(std::vector<ParsedKernel> parsed, ParseAll(text));
  std::vector<Kernel> kernels;
  for (ParsedKernel& p : parsed) kernels.push_back(std::move(p.kernel));
  return kernels;
}

}  // namespace kiln::loop
