#include "cache/guard_expr.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"

namespace kiln::cache {
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
      {"s0 / 2",
       "malformed expression 's0 / 2': '/' is not an operator (floor division is "
       "'//') at column 4"},
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

}  // namespace
}  // namespace kiln::cache
