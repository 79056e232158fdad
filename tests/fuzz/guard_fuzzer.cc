// libFuzzer target: guard and size expressions (compiler/ir/sym_expr.h), parsed
// and evaluated with a few bindings. Parsing must stay linear in the input.
#include <cstddef>
#include <cstdint>
#include <string>

#include "compiler/ir/sym_expr.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto expr = kiln::ir::SymExpr::Parse(text);
  if (!expr.ok()) return 0;
  for (int64_t v : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1} << 40, int64_t{-3}}) {
    kiln::ir::Bindings b{{"s0", v}, {"s1", v + 1}, {"s77", 2 * v}};
    (void)expr->Evaluate(b);
  }
  return 0;
}
