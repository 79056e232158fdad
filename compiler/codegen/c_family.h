// What the C-family code generators (C++ for CPUs, CUDA C++ for GPUs) share:
// the types values are computed and stored in, literals, names, the
// translation of SymInt expressions into int64 arithmetic, the check of a
// loop::Kernel's statements, and the scalar ops as expressions. Each
// language names its math library through a Dialect (C++: std::sqrt; CUDA:
// kiln_dev::sqrt, defined in its prelude); everything else is spelled the
// same in both, the preludes defining the kiln_* helpers for their device.
//
// Internal to compiler/codegen. Pure functions; thread-safe.
#ifndef KILN_COMPILER_CODEGEN_C_FAMILY_H_
#define KILN_COMPILER_CODEGEN_C_FAMILY_H_

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "compiler/ir/graph.h"
#include "compiler/loop/kernel.h"

namespace kiln::codegen {

struct Dialect {
  const char* ns;  // the namespace of numeric_limits, sqrt, abs, max, ...
  // Floating-point division as a call of this function; nullptr: `/`.
  const char* div = nullptr;
  // A float32 division in the sweep by a value that the sweep does not
  // change (a constant, a row's reduction or a value computed from
  // reductions after their sweep) as a product with its reciprocal, which
  // the compiler computes once: a float32 division is about ten
  // instructions, and a softmax does one per element. The product is
  // within 1.5 ulp of the quotient (a division's 0.5) for divisors of
  // magnitude 2^-126 to 2^126; below that the reciprocal overflows (a row
  // sum that is subnormal gives inf where the quotient is finite), above it
  // loses bits. The reciprocal is a division (`/`) even where `div` is set:
  // the compiler computes it once only as such.
  bool invariant_reciprocal = false;
};
inline constexpr Dialect kCppDialect{"std::"};
inline constexpr Dialect kCudaDialect{"kiln_dev::", nullptr, true};
// CUDA kernels generated inside namespace kiln_fast (the CUDA prelude).
inline constexpr Dialect kCudaFastDialect{"kiln_dev::", "kiln_div", true};

// The type a value is computed in. float16 and bfloat16 compute (and
// accumulate) in float32; bool is stored as one byte.
enum class CType { kF32, kF64, kI64, kI32, kI16, kI8, kU8, kBool };

const char* CName(CType t);
// sizeof of the C type.
int CBytes(CType t);
bool IsFloat(CType t);
// Rank for promotion of comparison operands.
int Rank(CType t);
// INVALID_ARGUMENT naming the dtype and `backend` for a dtype it cannot
// compute in.
absl::StatusOr<CType> ComputeType(v1::DType dtype, absl::string_view backend);
// The type of one element in memory ("uint16_t" for float16 and bfloat16).
const char* StorageName(v1::DType dtype);
// storage element -> compute value.
std::string FromStorage(v1::DType dtype, const std::string& x);
// value of type `from` -> storage element of `dtype`.
std::string ToStorage(v1::DType dtype, CType from, const std::string& x);
std::string Limit(CType t, const char* what, const Dialect& d);
// An int64 literal: plain when it is a small int, else INT64_C.
std::string IntLiteral(int64_t v);
// Text from a request as it may appear in a // comment.
std::string CommentText(absl::string_view text);
std::string Literal(double v, CType t, const Dialect& d);
bool IsIdentifier(absl::string_view s);
// Whether `name` could clash with an identifier the generators make or a
// keyword.
bool IsReservedName(const std::string& name);

// The plan's symbols and their C++ names.
class SymbolTable {
 public:
  static absl::StatusOr<SymbolTable> Create(const std::vector<std::string>& symbols) {
    SymbolTable table;
    std::set<std::string> taken;
    for (size_t k = 0; k < symbols.size(); ++k) {
      const std::string& name = symbols[k];
      if (name.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("symbol ", k, " has an empty name"));
      }
      if (!table.index_.emplace(name, static_cast<int>(k)).second) {
        return absl::InvalidArgumentError(absl::StrCat("symbol '", name, "' is listed twice"));
      }
      std::string id;
      for (char c : name) id += (absl::ascii_isalnum(c) || c == '_') ? c : '_';
      if (!IsIdentifier(id) || IsReservedName(id)) id = absl::StrCat("sym_", id);
      std::string unique = id;
      for (int n = 1; taken.count(unique) > 0; ++n) unique = absl::StrCat(id, "_", n);
      taken.insert(unique);
      table.cpp_names_.push_back(unique);
    }
    return table;
  }

  // The symbol's position, or -1.
  int Find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? -1 : it->second;
  }
  const std::string& CppName(int k) const { return cpp_names_[k]; }
  int size() const { return static_cast<int>(cpp_names_.size()); }

 private:
  std::map<std::string, int> index_;
  std::vector<std::string> cpp_names_;
};

// `text`, a size expression (compiler/ir/sym_expr.h: "(s1 - 1)//2 + 1",
// "Max(s0, 2)"), as int64 arithmetic (SymExpr::ToCpp); the symbols it reads
// are added to `used`. INVALID_ARGUMENT naming the expression and what is
// wrong with it.
absl::StatusOr<std::string> TranslateExpr(absl::string_view text, const SymbolTable& symbols,
                                          std::set<int>* used, const Dialect& d);

bool IsZero(const ir::SymInt& s);
bool IsOne(const ir::SymInt& s);

// A kernel's statements, checked: each one's compute type, and for
// outer-level statements whether they come after their pass's sweep.
struct KernelCheck {
  std::vector<CType> type;
  std::vector<bool> after;
};
// INVALID_ARGUMENT naming the kernel and the statement when the kernel is
// malformed (operands, passes, buffers, indices, dtypes `backend` cannot
// compute in).
absl::StatusOr<KernelCheck> CheckKernel(const loop::Kernel& kernel, absl::string_view backend);

absl::Status KernelError(const loop::Kernel& k, absl::string_view what);
absl::Status StmtError(const loop::Kernel& k, int j, absl::string_view what);

// Statement `a`'s value ("t<a>") converted to `to`.
std::string CastValue(const std::vector<CType>& type, int a, CType to);

// Storage element `element` of a buffer of `dtype` as a value of `type`.
absl::StatusOr<std::string> LoadValue(v1::DType dtype, CType type, const std::string& element,
                                      absl::string_view backend);

// Whether `op` calls a transcendental function (tens of cycles per element):
// a sweep computing one is bound by arithmetic rather than by memory.
bool IsTranscendental(loop::ScalarOp op);

// Whether `s` is a Welford reduction (its mean or its M2).
bool IsWelford(const loop::Stmt& s);
// The Welford accumulator of reduction j: the first Welford statement of its
// pass over the same operand.
int WelfordId(const loop::Kernel& kernel, int j);

// The int64 expressions of one kernel: literals, symbols (recorded in
// used_symbols()), or locals hoisted to the kernel's top (hoisted(): their
// declarations, in order, shared when equal).
class IntExprs {
 public:
  IntExprs(const loop::Kernel& kernel, const SymbolTable& symbols, const Dialect& dialect)
      : k_(kernel), symbols_(symbols), d_(dialect) {}
  // The text of `s`; INVALID_ARGUMENT naming the kernel for a malformed one.
  absl::StatusOr<std::string> Int(const ir::SymInt& s);
  // The product of sizes[from..] as text ("1" when empty); constants folded.
  absl::StatusOr<std::string> Product(const std::vector<ir::SymInt>& sizes, size_t from);
  const std::set<int>& used_symbols() const { return used_; }
  const std::vector<std::string>& hoisted() const { return decls_; }

 private:
  const loop::Kernel& k_;
  const SymbolTable& symbols_;
  const Dialect& d_;
  std::set<int> used_;
  std::map<std::string, std::string> names_;  // expression -> local name
  std::vector<std::string> decls_;
};

// One translation unit: `prelude`, then `emit` of every kernel in order.
// INVALID_ARGUMENT for a kernel name given twice or a malformed symbol list.
absl::StatusOr<std::string> GenerateUnit(
    const char* prelude, const std::vector<loop::Kernel>& kernels,
    const std::vector<std::string>& symbols,
    const std::function<absl::StatusOr<std::string>(const loop::Kernel&, const SymbolTable&)>&
        emit);

// The expression of scalar-op statement j, over its operands' values.
absl::StatusOr<std::string> ScalarOpExpr(const loop::Kernel& kernel, const std::vector<CType>& type,
                                         int j, const Dialect& d);

}  // namespace kiln::codegen

#endif  // KILN_COMPILER_CODEGEN_C_FAMILY_H_
