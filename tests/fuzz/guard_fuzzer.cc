// libFuzzer target: guard and size expressions (compiler/ir/sym_expr.h), parsed,
// evaluated with a few bindings, printed and simplified. Parsing must stay
// linear in the input; the canonical text must parse back to an expression of
// the same value, and the simplified form must agree wherever it evaluates.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "compiler/ir/sym_expr.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto expr = kiln::ir::SymExpr::Parse(text);
  if (!expr.ok()) return 0;
  auto again = kiln::ir::SymExpr::Parse(expr->ToText());
  if (!again.ok()) std::abort();  // the canonical text must parse
  const kiln::ir::SymExpr simple = kiln::ir::Simplify(*expr);
  (void)expr->ToPython();
  (void)expr->ToCpp(
      "std::", [](absl::string_view s) -> absl::StatusOr<std::string> { return std::string(s); });
  for (int64_t v : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1} << 40, int64_t{-3}}) {
    kiln::ir::Bindings b{{"s0", v}, {"s1", v + 1}, {"s77", 2 * v}};
    auto value = expr->Evaluate(b);
    auto reparsed = again->Evaluate(b);
    if (value.ok() != reparsed.ok() || (value.ok() && *value != *reparsed)) std::abort();
    auto simplified = simple.Evaluate(b);
    // Simplify folds with saturation, so only values inside the bounds must agree.
    if (value.ok() && simplified.ok() && *value != *simplified && *simplified != INT64_MAX &&
        *simplified != INT64_MIN) {
      std::abort();
    }
  }
  return 0;
}
