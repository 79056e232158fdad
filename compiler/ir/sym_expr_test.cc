#include "compiler/ir/sym_expr.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kiln::ir {
namespace {

int64_t Eval(const std::string& text, const Bindings& b = {}) {
  absl::StatusOr<SymExpr> e = SymExpr::Parse(text);
  EXPECT_TRUE(e.ok()) << text << ": " << e.status();
  if (!e.ok()) return -999;
  absl::StatusOr<int64_t> v = e->Evaluate(b);
  EXPECT_TRUE(v.ok()) << text << ": " << v.status();
  return v.ok() ? *v : -999;
}

TEST(SymExprTest, EvaluatesWithPythonPrecedenceAndSemantics) {
  const Bindings b = {{"s0", 48}, {"s1", 3}, {"s_batch", 7}};
  struct Case {
    std::string text;
    int64_t want;
  };
  const Case cases[] = {
      {"42", 42},
      {"s0", 48},
      {"  s_batch ", 7},
      {"1 + 2 * 3", 7},
      {"(1 + 2) * 3", 9},
      {"10 - 3 - 2", 5},  // left-associative
      {"2*s0", 96},
      {"s0 // s1 * 2", 32},
      {"s0 - s1 % 2", 47},
      // Unary minus binds tighter than * // %: (-7) // 2.
      {"-7 // 2", -4},
      {"7 // -2", -4},
      {"-7 // -2", 3},
      {"7 // 2", 3},
      {"-8 // 2", -4},
      {"-7 % 3", 2},
      {"7 % -3", -2},
      {"-7 % -3", -1},
      {"7 % 3", 1},
      {"-6 % 3", 0},
      {"5 % -1", 0},
      {"--3", 3},
      {"+3 - -3", 6},
      {"-s1 * 2", -6},
      {"Min(s0, s1)", 3},
      {"Max(s0, s1)", 48},
      {"Min(5, 2, 9)", 2},
      {"Max(5, 2, 9, -1)", 9},
      {"Max(1, s1 - 10)", 1},
      {"Min(s0)", 48},
      {"Max(Min(4, s1), 2) * 10", 30},
      {"s0 == 48", 1},
      {"s0 != 48", 0},
      {"s1 < 3", 0},
      {"s1 <= 3", 1},
      {"s1 > 2", 1},
      {"s1 >= 4", 0},
      {"1 + 2 == 3", 1},  // arithmetic binds tighter than comparison
      {"s0 % 8 == 0", 1},
      {"s0 % 32 == 0", 0},
      {"True", 1},
      {"False", 0},
      {"True + True", 2},
      {"not False", 1},
      {"not 5", 0},
      {"not s0 == 48", 0},  // not (s0 == 48)
      {"not not 7", 1},
      {"1 and 2", 1},  // booleans are 0/1, not Python's operand
      {"s0 > 2 and s1 > 2", 1},
      {"s0 > 2 and s1 > 5", 0},
      {"s1 > 5 or s0 > 2", 1},
      {"0 or 0", 0},
      // `and` binds tighter than `or`; `not` tighter than `and`.
      {"True or True and False", 1},
      {"(True or True) and False", 0},
      {"not True and False", 0},
      {"not (True and False)", 1},
      {"Max(s0, s1) <= 4096 and s1 == s0", 0},
      // Short-circuit skips a division by zero.
      {"s1 != 3 and s0 // (s1 - 3) > 1", 0},
      {"s1 == 3 or s0 // (s1 - 3) > 1", 1},
      {"s1 != 3 and s0 % (s1 - 3) == 0", 0},
      {"9223372036854775807", std::numeric_limits<int64_t>::max()},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(Eval(c.text, b), c.want) << c.text;
  }
}

TEST(SymExprTest, MalformedExpressionsQuoteTheTextAndSayWhere) {
  struct Case {
    std::string text;
    std::string message;
  };
  const Case cases[] = {
      {"s0 % ", "malformed expression 's0 % ': expected an operand at column 5"},
      {"", "malformed expression '': expected an operand at column 1"},
      {"s0 %% 8", "malformed expression 's0 %% 8': expected an operand at column 5, found '%'"},
      {"s0 % 8 ==", "malformed expression 's0 % 8 ==': expected an operand at column 10"},
      {"(s0 + 1", "malformed expression '(s0 + 1': expected ')' at column 8"},
      {"s0 + 1)", "malformed expression 's0 + 1)': unexpected ')' at column 7"},
      {"s0 s1", "malformed expression 's0 s1': unexpected 's1' at column 4"},
      {"s0 / / 2", "malformed expression 's0 / / 2': expected an operand at column 6, found '/'"},
      {"s0 ** ", "malformed expression 's0 ** ': expected an operand at column 6"},
      {"Mod(s0)", "malformed expression 'Mod(s0)': 'Mod' takes 2 arguments, not 1 at column 1"},
      {"Sqrt(s0)", "malformed expression 'Sqrt(s0)': unknown function 'Sqrt' at column 1"},
      {"s0 = 2",
       "malformed expression 's0 = 2': '=' is not an operator (equality is '==') at "
       "column 4"},
      {"s0 $ 2", "malformed expression 's0 $ 2': unexpected character '$' at column 4"},
      {"1 < s0 < 4",
       "malformed expression '1 < s0 < 4': comparisons do not chain (use 'and') "
       "at column 8"},
      {"Min(s0, )", "malformed expression 'Min(s0, )': expected an operand at column 9, found ')'"},
      {"Min()", "malformed expression 'Min()': expected an operand at column 5, found ')'"},
      {"Max s0", "malformed expression 'Max s0': expected '(' after 'Max' at column 5, found 's0'"},
      {"Max(1 2)", "malformed expression 'Max(1 2)': expected ',' or ')' at column 7, found '2'"},
      {"s0 and", "malformed expression 's0 and': expected an operand at column 7"},
      {"and s0", "malformed expression 'and s0': expected an operand at column 1, found 'and'"},
      {"2s0", "malformed expression '2s0': unexpected character 's' at column 2"},
      {"99999999999999999999",
       "malformed expression '99999999999999999999': integer "
       "99999999999999999999 is out of range at column 1"},
      {"s0 == not s1",
       "malformed expression 's0 == not s1': expected an operand at column 7, "
       "found 'not'"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<SymExpr> e = SymExpr::Parse(c.text);
    ASSERT_FALSE(e.ok()) << c.text;
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_EQ(e.status().message(), c.message);
  }
}

TEST(SymExprTest, RefusesDeepNestingInsteadOfOverflowingTheStack) {
  const std::string parens = std::string(100000, '(') + "1" + std::string(100000, ')');
  absl::StatusOr<SymExpr> e = SymExpr::Parse(parens);
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(absl::StrContains(e.status().message(), "nests deeper than 256 levels"))
      << e.status();

  std::string chain = "1";
  for (int i = 0; i < 100000; ++i) chain += "+1";
  e = SymExpr::Parse(chain);
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(absl::StrContains(e.status().message(), "nests deeper than 256 levels"))
      << e.status();

  std::string nots;
  for (int i = 0; i < 100000; ++i) nots += "not ";
  e = SymExpr::Parse(nots + "1");
  ASSERT_FALSE(e.ok());

  // Moderate nesting is fine.
  EXPECT_EQ(Eval(std::string(100, '(') + "1" + std::string(100, ')')), 1);
}

TEST(SymExprTest, EvaluationErrorsNameTheProblem) {
  struct Case {
    std::string text;
    Bindings bindings;
    std::string message;
  };
  const Case cases[] = {
      {"2*s3", {{"s0", 1}}, "cannot evaluate '2*s3': symbol 's3' is unbound"},
      {"s0 + s1", {{"s0", 1}}, "cannot evaluate 's0 + s1': symbol 's1' is unbound"},
      // Every symbol must be bound, even one a short-circuit would skip.
      {"True or s9 > 0", {}, "cannot evaluate 'True or s9 > 0': symbol 's9' is unbound"},
      {"s0 // s1", {{"s0", 4}, {"s1", 0}}, "cannot evaluate 's0 // s1': division by zero"},
      {"s0 % 0", {{"s0", 4}}, "cannot evaluate 's0 % 0': modulo by zero"},
      {"9223372036854775807 + 1",
       {},
       "cannot evaluate '9223372036854775807 + 1': integer overflow"},
      {"s0 * s0", {{"s0", int64_t{1} << 40}}, "cannot evaluate 's0 * s0': integer overflow"},
      {"-s0 - 2",
       {{"s0", std::numeric_limits<int64_t>::max()}},
       "cannot evaluate '-s0 - 2': integer overflow"},
      {"s0 // -1",
       {{"s0", std::numeric_limits<int64_t>::min()}},
       "cannot evaluate 's0 // -1': integer overflow"},
      {"-s0",
       {{"s0", std::numeric_limits<int64_t>::min()}},
       "cannot evaluate '-s0': integer overflow"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<SymExpr> e = SymExpr::Parse(c.text);
    ASSERT_TRUE(e.ok()) << c.text << ": " << e.status();
    absl::StatusOr<int64_t> v = e->Evaluate(c.bindings);
    ASSERT_FALSE(v.ok()) << c.text;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_EQ(v.status().message(), c.message);
  }
  // INT64_MIN % -1 is 0 in Python and must not trap.
  EXPECT_EQ(Eval("s0 % -1", {{"s0", std::numeric_limits<int64_t>::min()}}), 0);
}

TEST(SymExprTest, CollectsSymbolsInOrderOfFirstAppearance) {
  absl::StatusOr<SymExpr> e = SymExpr::Parse("Max(s1, s0) <= 4096 and s1 == s_batch + s0");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->symbols(), (std::vector<std::string>{"s1", "s0", "s_batch"}));
  std::vector<std::string> out = {"s0", "s7"};
  e->CollectSymbols(&out);
  EXPECT_EQ(out, (std::vector<std::string>{"s0", "s7", "s1", "s_batch"}));
  EXPECT_EQ(e->text(), "Max(s1, s0) <= 4096 and s1 == s_batch + s0");

  absl::StatusOr<SymExpr> constant = SymExpr::Parse("Min(3, 4) + True");
  ASSERT_TRUE(constant.ok());
  EXPECT_TRUE(constant->symbols().empty());
}

TEST(SymExprTest, CopiesShareTheTreeAndEvaluateAlike) {
  absl::StatusOr<SymExpr> e = SymExpr::Parse("s0 * 2 + 1");
  ASSERT_TRUE(e.ok());
  SymExpr copy = *e;
  EXPECT_EQ(copy.text(), e->text());
  EXPECT_EQ(*copy.Evaluate({{"s0", 5}}), 11);
  EXPECT_EQ(*e->EvaluateWith([](absl::string_view name) -> std::optional<int64_t> {
    if (name == "s0") return 20;
    return std::nullopt;
  }),
            41);
}

TEST(SymExprTest, RecognisesBareSymbols) {
  EXPECT_EQ(AsBareSymbol("s0"), std::optional<absl::string_view>("s0"));
  EXPECT_EQ(AsBareSymbol(" s_batch\t"), std::optional<absl::string_view>("s_batch"));
  EXPECT_EQ(AsBareSymbol("_x9"), std::optional<absl::string_view>("_x9"));
  for (const char* not_bare :
       {"", " ", "4", "(s0)", "2*s0", "s0 s1", "-s0", "True", "Min", "and"}) {
    EXPECT_EQ(AsBareSymbol(not_bare), std::nullopt) << "'" << not_bare << "'";
  }
  EXPECT_TRUE(IsSymbolName("s1"));
  EXPECT_FALSE(IsSymbolName("not"));
  EXPECT_FALSE(IsSymbolName("s-1"));
}

// One case of tests/data/sym_expr_cases.txt, which the Python tests share.
struct SharedCase {
  int line;
  std::string text;
  Bindings bindings;
  std::optional<int64_t> value;  // nullopt: an error containing `error`
  std::string error;
};

std::vector<SharedCase> ReadSharedCases() {
  std::ifstream in(absl::StrCat(KILN_SOURCE_DIR, "/tests/data/sym_expr_cases.txt"));
  EXPECT_TRUE(in.good()) << "cannot read tests/data/sym_expr_cases.txt";
  std::vector<SharedCase> cases;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (absl::StripAsciiWhitespace(line).empty() || line[0] == '#') continue;
    std::vector<std::string> fields = absl::StrSplit(line, '|');
    if (fields.size() != 3) {
      ADD_FAILURE() << "line " << n << ": want 3 fields separated by '|': " << line;
      continue;
    }
    SharedCase c{n, fields[0], {}, std::nullopt, ""};
    for (absl::string_view binding : absl::StrSplit(fields[1], ' ', absl::SkipWhitespace())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(binding, '=');
      int64_t v = 0;
      EXPECT_TRUE(absl::SimpleAtoi(kv.second, &v)) << "line " << n << ": " << binding;
      c.bindings[kv.first] = v;
    }
    absl::string_view want = absl::StripAsciiWhitespace(fields[2]);
    if (absl::ConsumePrefix(&want, "error: ")) {
      c.error = std::string(want);
    } else {
      int64_t v = 0;
      EXPECT_TRUE(absl::SimpleAtoi(want, &v)) << "line " << n << ": " << want;
      c.value = v;
    }
    cases.push_back(std::move(c));
  }
  EXPECT_GT(cases.size(), 50u);
  return cases;
}

TEST(SymExprTest, SharedCases) {
  for (const SharedCase& c : ReadSharedCases()) {
    SCOPED_TRACE(absl::StrCat("sym_expr_cases.txt:", c.line, ": ", c.text));
    absl::StatusOr<SymExpr> e = SymExpr::Parse(c.text);
    ASSERT_TRUE(e.ok()) << e.status();
    absl::StatusOr<int64_t> v = e->Evaluate(c.bindings);
    if (c.value) {
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_EQ(*v, *c.value);
    } else {
      ASSERT_FALSE(v.ok()) << "evaluated to " << *v;
      EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_TRUE(absl::StrContains(v.status().message(), c.error)) << v.status();
    }
    // The canonical text parses back to an expression of the same value.
    absl::StatusOr<SymExpr> again = SymExpr::Parse(e->ToText());
    ASSERT_TRUE(again.ok()) << e->ToText() << ": " << again.status();
    absl::StatusOr<int64_t> w = again->Evaluate(c.bindings);
    EXPECT_EQ(w.ok(), v.ok()) << e->ToText();
    if (v.ok() && w.ok()) {
      EXPECT_EQ(*w, *v) << e->ToText();
    }
    EXPECT_EQ(again->ToText(), e->ToText());
    // The simplified form agrees wherever both evaluate.
    absl::StatusOr<int64_t> s = Simplify(*e).Evaluate(c.bindings);
    if (v.ok() && s.ok()) {
      EXPECT_EQ(*s, *v) << Simplify(*e).ToText();
    }
  }
}

std::string Text(const std::string& text) {
  absl::StatusOr<SymExpr> e = SymExpr::Parse(text);
  EXPECT_TRUE(e.ok()) << text << ": " << e.status();
  return e.ok() ? e->ToText() : "";
}

TEST(SymExprTest, PrintsCanonicalText) {
  EXPECT_EQ(Text("s0+1"), "s0 + 1");
  EXPECT_EQ(Text("((s0 - 1)//2) + 1"), "(s0 - 1)//2 + 1");
  EXPECT_EQ(Text("4 * s0 * s1+s1-2"), "4*s0*s1 + s1 - 2");
  EXPECT_EQ(Text("-(s0 // 2)"), "-(s0//2)");
  EXPECT_EQ(Text("-(s0 * s1)"), "-(s0*s1)");
  EXPECT_EQ(Text("-s0 * s1"), "-s0*s1");
  EXPECT_EQ(Text("-(-s0)"), "--s0");
  EXPECT_EQ(Text("a*(b*c)"), "a*(b*c)");
  EXPECT_EQ(Text("(a*b)*c"), "a*b*c");
  EXPECT_EQ(Text("-(-2*s0)"), "-(-2*s0)");
  // The text nests no deeper than the tree, so it parses again.
  const std::string deep = "s0*a" + std::string(250, '-') + "s1";
  EXPECT_EQ(Text(deep), "s0*a - " + std::string(249, '-') + "s1");
  EXPECT_EQ(Text("s0 - (s1 - 2)"), "s0 - (s1 - 2)");
  EXPECT_EQ(Text("(s0 - s1) - 2"), "s0 - s1 - 2");
  EXPECT_EQ(Text("s0 // (2 * s1)"), "s0//(2*s1)");
  EXPECT_EQ(Text("(s0 // 2) * s1"), "(s0//2)*s1");
  EXPECT_EQ(Text("s0 % 8 == 0"), "s0 % 8 == 0");
  EXPECT_EQ(Text("Mod(s0, 8)"), "s0 % 8");
  EXPECT_EQ(Text("Max(s0, s1, 2)"), "Max(Max(s0, s1), 2)");
  EXPECT_EQ(Text("(s0 + 1)**2"), "(s0 + 1)**2");
  EXPECT_EQ(Text("not (a or b) and c"), "not (a or b) and c");
  EXPECT_EQ(Text("(a == b) == c"), "(a == b) == c");
  EXPECT_EQ(Text("CeilDiv(s0, 4) * floor(s1)"), "CeilDiv(s0, 4)*s1");
  EXPECT_EQ(SymExpr::Constant(std::numeric_limits<int64_t>::min()).ToText(),
            "(-9223372036854775807 - 1)");
}

std::string Cpp(const std::string& text) {
  absl::StatusOr<SymExpr> e = SymExpr::Parse(text);
  EXPECT_TRUE(e.ok()) << text << ": " << e.status();
  if (!e.ok()) return "";
  absl::StatusOr<std::string> cpp =
      e->ToCpp("std::", [](absl::string_view s) -> absl::StatusOr<std::string> {
        if (s == "s9") return absl::InvalidArgumentError("unknown symbol 's9'");
        return absl::StrCat("sym_", s);
      });
  return cpp.ok() ? *cpp : std::string(cpp.status().message());
}

TEST(SymExprTest, PrintsCpp) {
  EXPECT_EQ(Cpp("(s1 - 1)//2 + 1"),
            "(kiln_floordiv<int64_t>((sym_s1 - INT64_C(1)), INT64_C(2)) + INT64_C(1))");
  EXPECT_EQ(Cpp("-s0 % 3"), "kiln_mod<int64_t>((-sym_s0), INT64_C(3))");
  EXPECT_EQ(Cpp("Max(s0, 2, s1)"),
            "std::max<int64_t>(std::max<int64_t>(sym_s0, INT64_C(2)), sym_s1)");
  EXPECT_EQ(Cpp("s0**2"), "kiln_pow_int<int64_t>(sym_s0, INT64_C(2))");
  EXPECT_EQ(Cpp("CeilDiv(s0, 4)"), "(-kiln_floordiv<int64_t>((-sym_s0), INT64_C(4)))");
  EXPECT_EQ(Cpp("s0 / 4"), "kiln_floordiv<int64_t>(sym_s0, INT64_C(4))");
  EXPECT_EQ(Cpp("s0 + s9"), "unknown symbol 's9'");
}

TEST(SymExprTest, PrintsPython) {
  absl::StatusOr<SymExpr> e = SymExpr::Parse("Max(s0 - 1, 0) // 4 + CeilDiv(s1, 2) * -s2");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->ToPython(), "((max((s0 - 1), 0) // 4) + ((-((-s1) // 2)) * (-s2)))");
}

std::string Simplified(const std::string& text) {
  absl::StatusOr<SymExpr> e = SymExpr::Parse(text);
  EXPECT_TRUE(e.ok()) << text << ": " << e.status();
  return e.ok() ? Simplify(*e).ToText() : "";
}

TEST(SymExprTest, SimplifiesToCanonicalPolynomials) {
  EXPECT_EQ(Simplified("s1 + s0 - s1 + 2*s0"), "3*s0");
  EXPECT_EQ(Simplified("s0*s1 + s1*s0"), "2*s0*s1");
  EXPECT_EQ(Simplified("(s0 + 1)*(s0 - 1)"), "s0*s0 - 1");
  EXPECT_EQ(Simplified("-(s0 - 4)"), "-s0 + 4");
  EXPECT_EQ(Simplified("2*(s0//2) - (s0//2)"), "s0//2");
  EXPECT_EQ(Simplified("s0 - s0"), "0");
  EXPECT_EQ(Simplified("Max(s0, 1)*16"), "16*Max(s0, 1)");
  // Spacing does not matter.
  EXPECT_EQ(Simplified("s0+1+1"), Simplified("s0 + 2"));
  // A product of sums past 64 monomials stays a product.
  const std::string big = "(a + b + c + d + e + f + g + h + i)*(a + b + c + d + e + f + g + h + i)";
  EXPECT_EQ(Simplified(big),
            "(a + b + c + d + e + f + g + h + i)*(a + b + c + d + e + f + g + h + i)");
}

TEST(SymExprTest, SimplifyLeavesWhatItCannotKeepFaithful) {
  // A coefficient that would saturate: the difference is not 0, it
  // overflows wherever s0 != 0.
  EXPECT_EQ(Simplified("s0*9223372036854775807*2 - s0*9223372036854775807"),
            "s0*9223372036854775807*2 - s0*9223372036854775807");
  // 300 terms in a balanced sum parse at a depth of 10; as one chain of
  // terms they would nest 300 deep, so the sum stays as written.
  std::vector<std::string> terms;
  for (int i = 0; i < 300; ++i) terms.push_back(absl::StrCat("s", i));
  while (terms.size() > 1) {
    std::vector<std::string> next;
    for (size_t i = 0; i + 1 < terms.size(); i += 2) {
      next.push_back(absl::StrCat("(", terms[i], " + ", terms[i + 1], ")"));
    }
    if (terms.size() % 2 == 1) next.push_back(terms.back());
    terms = std::move(next);
  }
  absl::StatusOr<SymExpr> wide = SymExpr::Parse(terms[0]);
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_TRUE(SymExpr::Parse(Simplify(*wide).ToText()).ok());
  // Python prints negative constants in parentheses: (-2)**2 is 4.
  EXPECT_EQ(SymExpr::Constant(-3).ToPython(), "(-3)");
}

TEST(SymExprTest, ArithmeticFoldsAndSaturates) {
  const SymExpr s0 = *SymExpr::Symbol("s0");
  const SymExpr s1 = *SymExpr::Symbol("s1");
  const SymExpr two = SymExpr::Constant(2);
  EXPECT_EQ(SymTimes(SymPlus(s0, two), s1).ToText(), "s0*s1 + 2*s1");
  EXPECT_EQ(SymMinus(SymTimes(two, s0), s0).ToText(), "s0");
  EXPECT_EQ(SymFloorDivide(SymTimes(SymExpr::Constant(16), s0), SymExpr::Constant(4)).ToText(),
            "4*s0");
  EXPECT_EQ(SymFloorDivide(SymPlus(s0, SymExpr::Constant(-1)), two).ToText(), "(s0 - 1)//2");
  EXPECT_EQ(SymFloorDivide(s0, SymExpr::Constant(0)).ToText(), "s0//0");
  EXPECT_EQ(SymFloorDivide(SymExpr::Constant(7), SymExpr::Constant(0)).constant(), 0);
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(SymTimes(SymExpr::Constant(max), two).constant(), max);
  EXPECT_EQ(SymPlus(SymExpr::Constant(max), two).constant(), max);
  EXPECT_FALSE(SymExpr::Symbol("not").ok());
  EXPECT_EQ(SymExpr::Constant(-3).constant(), -3);
  EXPECT_EQ(SymExpr::Parse("-3")->constant(), -3);
  EXPECT_EQ(SymExpr::Parse("s0")->constant(), std::nullopt);
}

}  // namespace
}  // namespace kiln::ir
