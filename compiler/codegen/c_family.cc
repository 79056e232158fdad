#include "compiler/codegen/c_family.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "compiler/ir/sym_expr.h"

namespace kiln::codegen {
namespace {

using loop::Kernel;
using loop::ReduceOp;
using loop::ScalarOp;
using loop::ScalarOpName;
using loop::Stmt;
using loop::StmtKind;

}  // namespace

// ---------------------------------------------------------------------------
// Types.

const char* CName(CType t) {
  switch (t) {
    case CType::kF32:
      return "float";
    case CType::kF64:
      return "double";
    case CType::kI64:
      return "int64_t";
    case CType::kI32:
      return "int32_t";
    case CType::kI16:
      return "int16_t";
    case CType::kI8:
      return "int8_t";
    case CType::kU8:
      return "uint8_t";
    case CType::kBool:
      return "bool";
  }
  return "?";
}

int CBytes(CType t) {
  switch (t) {
    case CType::kF64:
    case CType::kI64:
      return 8;
    case CType::kF32:
    case CType::kI32:
      return 4;
    case CType::kI16:
      return 2;
    case CType::kI8:
    case CType::kU8:
    case CType::kBool:
      return 1;
  }
  return 8;
}

bool IsFloat(CType t) { return t == CType::kF32 || t == CType::kF64; }

int Rank(CType t) {
  switch (t) {
    case CType::kBool:
      return 0;
    case CType::kU8:
      return 1;
    case CType::kI8:
      return 2;
    case CType::kI16:
      return 3;
    case CType::kI32:
      return 4;
    case CType::kI64:
      return 5;
    case CType::kF32:
      return 6;
    case CType::kF64:
      return 7;
  }
  return 0;
}

absl::StatusOr<CType> ComputeType(v1::DType dtype, absl::string_view backend) {
  switch (dtype) {
    case v1::FLOAT32:
    case v1::FLOAT16:
    case v1::BFLOAT16:
      return CType::kF32;
    case v1::FLOAT64:
      return CType::kF64;
    case v1::INT64:
      return CType::kI64;
    case v1::INT32:
      return CType::kI32;
    case v1::INT16:
      return CType::kI16;
    case v1::INT8:
      return CType::kI8;
    case v1::UINT8:
      return CType::kU8;
    case v1::BOOL:
      return CType::kBool;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "dtype ", v1::DType_Name(dtype), " is not supported by the ", backend, " backend"));
  }
}

// The C++ type of one element in memory.
const char* StorageName(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT16:
    case v1::BFLOAT16:
      return "uint16_t";
    case v1::BOOL:
      return "uint8_t";
    default: {
      absl::StatusOr<CType> t = ComputeType(dtype, "");
      return t.ok() ? CName(*t) : "?";
    }
  }
}

// storage element -> compute value.
std::string FromStorage(v1::DType dtype, const std::string& x) {
  switch (dtype) {
    case v1::FLOAT16:
      return absl::StrCat("kiln_f16_to_f32(", x, ")");
    case v1::BFLOAT16:
      return absl::StrCat("kiln_bf16_to_f32(", x, ")");
    case v1::BOOL:
      return absl::StrCat("(", x, " != 0)");
    default:
      return x;
  }
}

// value of type `from` -> storage element of `dtype`.
std::string ToStorage(v1::DType dtype, CType from, const std::string& x) {
  switch (dtype) {
    case v1::FLOAT16:
      return absl::StrCat("kiln_f32_to_f16(",
                          from == CType::kF32 ? x : absl::StrCat("static_cast<float>(", x, ")"),
                          ")");
    case v1::BFLOAT16:
      return absl::StrCat("kiln_f32_to_bf16(",
                          from == CType::kF32 ? x : absl::StrCat("static_cast<float>(", x, ")"),
                          ")");
    case v1::BOOL:
      return absl::StrCat("static_cast<uint8_t>(", x, " != 0)");
    default: {
      const char* storage = StorageName(dtype);
      absl::StatusOr<CType> t = ComputeType(dtype, "");
      if (t.ok() && *t == from) return x;
      return absl::StrCat("static_cast<", storage, ">(", x, ")");
    }
  }
}

std::string Limit(CType t, const char* what, const Dialect& d) {
  return absl::StrCat(d.ns, "numeric_limits<", CName(t), ">::", what, "()");
}

// An int64 literal: plain when it is a small int, else INT64_C.
std::string IntLiteral(int64_t v) {
  if (v == std::numeric_limits<int64_t>::min()) return "(-INT64_C(9223372036854775807) - 1)";
  if (v >= 0 && v <= 0x7fffffff) return absl::StrCat(v);
  return absl::StrCat("INT64_C(", v, ")");
}

// Text from a request (a value or node name, a size expression) as it may
// appear in a // comment: printable ASCII but the backslash, which would
// continue the comment onto the next generated line.
std::string CommentText(absl::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e || c == '\\') c = '?';
  }
  return out;
}

std::string Literal(double v, CType t, const Dialect& d) {
  switch (t) {
    case CType::kF32:
    case CType::kF64: {
      if (std::isnan(v)) return Limit(t, "quiet_NaN", d);
      // A double beyond float's range is float's infinity, as ATen rounds it.
      const bool inf = t == CType::kF32 ? std::isinf(static_cast<float>(v)) : std::isinf(v);
      if (inf) return absl::StrCat(v < 0 ? "-" : "", Limit(t, "infinity", d));
      std::string s = t == CType::kF32 ? absl::StrFormat("%.9g", static_cast<float>(v))
                                       : absl::StrFormat("%.17g", v);
      if (s.find_first_of(".e") == std::string::npos) s += ".0";
      if (t == CType::kF32) s += "f";
      return s[0] == '-' ? absl::StrCat("(", s, ")") : s;
    }
    case CType::kBool:
      return v != 0 ? "true" : "false";
    default: {
      // Converting a double outside int64's range is undefined: clamp first.
      const double clamped = std::clamp(v, -9223372036854775808.0, 9223372036854774784.0);
      const int64_t i = static_cast<int64_t>(clamped);
      if (t == CType::kI64) return IntLiteral(i);
      return absl::StrCat("static_cast<", CName(t), ">(", i, ")");
    }
  }
}

// ---------------------------------------------------------------------------
// Symbols and SymInt expressions.

bool IsIdentifier(absl::string_view s) {
  if (s.empty() || !(absl::ascii_isalpha(s[0]) || s[0] == '_')) return false;
  for (char c : s) {
    if (!(absl::ascii_isalnum(c) || c == '_')) return false;
  }
  return true;
}

// Whether `name` could clash with an identifier the generator makes or a
// C++ keyword.
bool IsReservedName(const std::string& name) {
  static const char* const kWords[] = {
      "o",        "i",       "l",       "c",     "d",       "winv",    "outer_n",  "inner_n",
      "s",        "m",       "q",       "k",     "f",       "u",       "dl",       "buffers",
      "symbols",  "std",     "int",     "float", "double",  "char",    "bool",     "auto",
      "const",    "for",     "if",      "else",  "do",      "while",   "return",   "new",
      "delete",   "this",    "case",    "class", "struct",  "true",    "false",    "static_cast",
      "and",      "or",      "not",     "xor",   "int64_t", "uint8_t", "uint16_t", "uint32_t",
      "uint64_t", "int32_t", "int16_t", "int8_t"};
  for (const char* w : kWords) {
    if (name == w) return true;
  }
  if (absl::StartsWith(name, "kiln_") || absl::StartsWith(name, "INT") ||
      absl::StartsWith(name, "UINT")) {
    return true;
  }
  // Generated names: a prefix followed by digits ("t3", "buf0", "wml2").
  size_t letters = 0;
  while (letters < name.size() && absl::ascii_isalpha(name[letters])) ++letters;
  if (letters == 0 || letters == name.size()) return false;
  for (size_t k = letters; k < name.size(); ++k) {
    if (!absl::ascii_isdigit(name[k])) return false;
  }
  static const char* const kPrefixes[] = {
      "t",   "b",  "p",  "e",  "o",  "i",    "acc",  "nan", "buf",  "wm",  "wq",  "wn", "wml",
      "wql", "wc", "in", "rc", "pf", "accl", "nanl", "c",   "accd", "wmd", "wqd", "wkl"};
  const std::string prefix = name.substr(0, letters);
  for (const char* p : kPrefixes) {
    if (prefix == p) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------
// One kernel.

bool IsZero(const ir::SymInt& s) { return s.is_constant() && s.constant() == 0; }
bool IsOne(const ir::SymInt& s) { return s.is_constant() && s.constant() == 1; }

absl::StatusOr<std::string> TranslateExpr(absl::string_view text, const SymbolTable& symbols,
                                          std::set<int>* used, const Dialect& d) {
  absl::StatusOr<ir::SymExpr> e = ir::SymExpr::Parse(text);
  if (!e.ok()) return absl::InvalidArgumentError(absl::StrCat("size ", e.status().message()));
  return e->ToCpp(d.ns, [&](absl::string_view name) -> absl::StatusOr<std::string> {
    const int k = symbols.Find(std::string(name));
    if (k < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("size expression '", text, "': unknown symbol '", name, "'"));
    }
    used->insert(k);
    return symbols.CppName(k);
  });
}

absl::Status KernelError(const Kernel& k, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("kernel '", k.name, "': ", what));
}

absl::Status StmtError(const Kernel& k, int j, absl::string_view what) {
  return KernelError(k, absl::StrCat("statement %", j, ": ", what));
}

std::string CastValue(const std::vector<CType>& type, int a, CType to) {
  const std::string v = absl::StrCat("t", a);
  if (type[a] == to) return v;
  if (to == CType::kBool) return absl::StrCat("(", v, " != 0)");
  return absl::StrCat("static_cast<", CName(to), ">(", v, ")");
}

absl::StatusOr<std::string> LoadValue(v1::DType dtype, CType type, const std::string& element,
                                      absl::string_view backend) {
  std::string value = FromStorage(dtype, element);
  ASSIGN_OR_RETURN(CType stored, ComputeType(dtype, backend));
  if (stored == type) return value;
  return type == CType::kBool ? absl::StrCat("(", value, " != 0)")
                              : absl::StrCat("static_cast<", CName(type), ">(", value, ")");
}

bool IsWelford(const Stmt& s) {
  return s.kind == StmtKind::kReduce &&
         (s.reduce == ReduceOp::kWelfordMean || s.reduce == ReduceOp::kWelfordM2);
}

int WelfordId(const Kernel& kernel, int j) {
  const Stmt& s = kernel.stmts[j];
  for (int q = 0; q < j; ++q) {
    const Stmt& t = kernel.stmts[q];
    if (IsWelford(t) && t.pass == s.pass && t.args[0] == s.args[0]) return q;
  }
  return j;
}

absl::StatusOr<std::string> IntExprs::Int(const ir::SymInt& s) {
  if (s.is_constant()) return IntLiteral(s.constant());
  absl::StatusOr<std::string> text = TranslateExpr(s.expr(), symbols_, &used_, d_);
  if (!text.ok()) return KernelError(k_, text.status().message());
  if (IsIdentifier(*text)) return *text;
  auto it = names_.find(*text);
  if (it != names_.end()) return it->second;
  const std::string name = absl::StrCat("e", names_.size());
  names_.emplace(*text, name);
  decls_.push_back(
      absl::StrCat("const int64_t ", name, " = ", *text, ";  // ", CommentText(s.expr())));
  return name;
}

absl::StatusOr<std::string> IntExprs::Product(const std::vector<ir::SymInt>& sizes, size_t from) {
  int64_t constant = 1;
  std::vector<std::string> parts;
  for (size_t k = from; k < sizes.size(); ++k) {
    if (sizes[k].is_constant()) {
      constant *= sizes[k].constant();
    } else {
      ASSIGN_OR_RETURN(std::string t, Int(sizes[k]));
      parts.push_back(t);
    }
  }
  if (constant != 1 || parts.empty()) parts.push_back(IntLiteral(constant));
  return absl::StrJoin(parts, " * ");
}

absl::StatusOr<std::string> GenerateUnit(
    const char* prelude, const std::vector<loop::Kernel>& kernels,
    const std::vector<std::string>& symbols,
    const std::function<absl::StatusOr<std::string>(const loop::Kernel&, const SymbolTable&)>&
        emit) {
  ASSIGN_OR_RETURN(SymbolTable table, SymbolTable::Create(symbols));
  std::string out = prelude;
  std::set<std::string> names;
  for (const Kernel& kernel : kernels) {
    if (!names.insert(kernel.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("kernel '", kernel.name, "' is defined twice"));
    }
    ASSIGN_OR_RETURN(std::string code, emit(kernel, table));
    out += code;
  }
  return out;
}

namespace {

absl::Status ValidateIndex(const Kernel& k_, int j, const loop::Index& index) {
  const Stmt& s = k_.stmts[j];
  if (!index.outer_strides.empty() && index.outer_strides.size() != k_.outer.size()) {
    return StmtError(
        k_, j,
        absl::StrCat("index has ", index.outer_strides.size(), " outer strides, the kernel has ",
                     k_.outer.size(), " outer dimensions"));
  }
  if (!index.inner_strides.empty() && index.inner_strides.size() != k_.inner.size()) {
    return StmtError(
        k_, j,
        absl::StrCat("index has ", index.inner_strides.size(), " inner strides, the kernel has ",
                     k_.inner.size(), " inner dimensions"));
  }
  if (!s.inner) {
    for (const auto& st : index.inner_strides) {
      if (!IsZero(st)) {
        return StmtError(k_, j, "an outer-level access has a nonzero inner stride");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<KernelCheck> CheckKernel(const Kernel& k_, absl::string_view backend) {
  KernelCheck check;
  std::vector<CType>& type_ = check.type;
  std::vector<bool>& after_ = check.after;
  if (!IsIdentifier(k_.name) || absl::StartsWith(k_.name, "kiln_")) {
    return KernelError(k_, "the name is not a C identifier (or starts with kiln_)");
  }
  if (k_.passes < 1) return KernelError(k_, absl::StrCat("passes is ", k_.passes));
  for (size_t b = 0; b < k_.buffers.size(); ++b) {
    absl::StatusOr<CType> t = ComputeType(k_.buffers[b].dtype, backend);
    if (!t.ok()) return KernelError(k_, absl::StrCat("buffer ", b, ": ", t.status().message()));
  }
  const int n = static_cast<int>(k_.stmts.size());
  type_.assign(n, CType::kF32);
  after_.assign(n, false);
  for (int j = 0; j < n; ++j) {
    const Stmt& s = k_.stmts[j];
    if (s.pass < 0 || s.pass >= k_.passes) {
      return StmtError(k_, j, absl::StrCat("pass ", s.pass, " is outside [0, ", k_.passes, ")"));
    }
    if (s.kind != StmtKind::kStore) {
      absl::StatusOr<CType> t = ComputeType(s.dtype, backend);
      if (!t.ok()) return StmtError(k_, j, t.status().message());
      type_[j] = *t;
    }
    // Operand count.
    size_t want = 0;
    switch (s.kind) {
      case StmtKind::kLoad:
      case StmtKind::kConstant:
        want = 0;
        break;
      case StmtKind::kIndex:
        want = 0;
        if (s.dtype != v1::INT64 && s.dtype != v1::INT32) {
          return StmtError(k_, j, "an index value must be of an integer dtype");
        }
        RETURN_IF_ERROR(ValidateIndex(k_, j, s.index));
        break;
      case StmtKind::kReduce:
      case StmtKind::kStore:
      case StmtKind::kAccumulate:
        want = 1;
        break;
      case StmtKind::kGather:
      case StmtKind::kScatterAdd:
        want = s.gather_strides.size() + (s.kind == StmtKind::kScatterAdd ? 1 : 0);
        if (s.gather_strides.empty() || s.gather_sizes.size() != s.gather_strides.size()) {
          return StmtError(k_, j,
                           absl::StrCat("a gather has ", s.gather_strides.size(), " strides and ",
                                        s.gather_sizes.size(), " sizes; one of each per index"));
        }
        break;
      case StmtKind::kOp: {
        const loop::ScalarOpInfo* info = loop::FindScalarOp(s.op);
        if (info == nullptr) {
          return StmtError(k_, j, absl::StrCat("unknown op ", static_cast<int>(s.op)));
        }
        want = info->arity;
        if (info->needs_float && !IsFloat(type_[j])) {
          return StmtError(k_, j,
                           absl::StrCat("op '", info->name, "' needs a floating dtype, not ",
                                        v1::DType_Name(s.dtype)));
        }
        break;
      }
    }
    if (s.args.size() != want) {
      return StmtError(k_, j, absl::StrCat("takes ", want, " operands, has ", s.args.size()));
    }
    const bool accumulates = s.kind == StmtKind::kAccumulate;
    if (accumulates) {
      if (k_.row_groups < 1) {
        return StmtError(k_, j, "sums across rows in a kernel without row groups");
      }
      if (!s.inner) return StmtError(k_, j, "a sum across rows must be an inner statement");
      if (!IsFloat(type_[j])) return StmtError(k_, j, "a sum across rows must be of a float dtype");
      for (size_t d = 1; d < s.index.outer_strides.size(); ++d) {
        if (!IsZero(s.index.outer_strides[d])) {
          return StmtError(k_, j,
                           "a sum across rows has an outer stride past the first (its group's)");
        }
      }
    }
    const bool reads = s.kind == StmtKind::kLoad || s.kind == StmtKind::kGather;
    if (reads || s.kind == StmtKind::kStore || s.kind == StmtKind::kScatterAdd || accumulates) {
      if (s.buffer < 0 || s.buffer >= static_cast<int>(k_.buffers.size())) {
        return StmtError(k_, j, absl::StrCat("buffer ", s.buffer, " is out of range"));
      }
      if (!reads && !k_.buffers[s.buffer].written) {
        return StmtError(k_, j,
                         absl::StrCat("stores to buf", s.buffer, ", which is not marked written"));
      }
      RETURN_IF_ERROR(ValidateIndex(k_, j, s.index));
    }
    if (s.kind == StmtKind::kReduce && !s.inner) {
      return StmtError(k_, j, "a reduction must be an inner statement");
    }
    if (s.kind == StmtKind::kScatterAdd && !s.inner) {
      return StmtError(k_, j, "a scatter-add must be an inner statement");
    }
    if (s.kind == StmtKind::kGather || s.kind == StmtKind::kScatterAdd) {
      for (size_t q = s.kind == StmtKind::kScatterAdd ? 1 : 0; q < s.args.size(); ++q) {
        const int a = s.args[q];
        if (a >= 0 && a < j && k_.stmts[a].dtype != v1::INT64 && k_.stmts[a].dtype != v1::INT32) {
          return StmtError(k_, j,
                           absl::StrCat("gathers by %", a, " of dtype ",
                                        v1::DType_Name(k_.stmts[a].dtype), ", not an integer"));
        }
      }
    }
    // Where each operand is visible.
    for (int a : s.args) {
      if (a < 0 || a >= j) {
        return StmtError(k_, j, absl::StrCat("operand %", a, " is not an earlier statement"));
      }
      const Stmt& arg = k_.stmts[a];
      if (arg.kind == StmtKind::kStore || arg.kind == StmtKind::kAccumulate ||
          arg.kind == StmtKind::kScatterAdd) {
        return StmtError(k_, j,
                         absl::StrCat("operand %", a, " is a ",
                                      arg.kind == StmtKind::kStore ? "store" : "sum across rows"));
      }
      if (arg.pass > s.pass) {
        return StmtError(k_, j, absl::StrCat("reads %", a, " of a later pass"));
      }
      if (arg.kind == StmtKind::kReduce) {
        if (arg.pass == s.pass) {
          if (s.inner) {
            return StmtError(k_, j,
                             absl::StrCat("reads the reduction %", a, " inside its own sweep"));
          }
          after_[j] = true;
        }
      } else if (arg.inner) {
        if (!s.inner || arg.pass != s.pass) {
          return StmtError(k_, j,
                           absl::StrCat("reads %", a, ", a value of the sweep of pass ", arg.pass,
                                        ", outside that sweep"));
        }
      } else if (arg.pass == s.pass && after_[a]) {
        if (s.inner) {
          return StmtError(k_, j,
                           absl::StrCat("reads %", a, ", which is computed after the sweep"));
        }
        after_[j] = true;
      }
    }
  }
  return check;
}

absl::StatusOr<std::string> ScalarOpExpr(const Kernel& k_, const std::vector<CType>& type_, int j,
                                         const Dialect& d) {
  const Stmt& s = k_.stmts[j];
  auto Cast = [&](int a, CType to) { return CastValue(type_, a, to); };
  auto Val = [](int a) { return absl::StrCat("t", a); };
  const CType rt = type_[j];
  const char* name = ScalarOpName(s.op);
  const char* T = CName(rt);
  auto x = [&](int n) { return Cast(s.args[n], rt); };
  auto fn = [&](absl::string_view f) { return absl::StrCat(f, "(", x(0), ")"); };
  auto bin = [&](absl::string_view o) { return absl::StrCat("(", x(0), " ", o, " ", x(1), ")"); };
  auto call2 = [&](absl::string_view f) { return absl::StrCat(f, "(", x(0), ", ", x(1), ")"); };
  // Operands compared in the higher-ranked of their types.
  auto compare = [&](absl::string_view o) {
    const int a = s.args[0], b = s.args[1];
    const CType common = Rank(type_[a]) >= Rank(type_[b]) ? type_[a] : type_[b];
    return absl::StrCat("(", Cast(a, common), " ", o, " ", Cast(b, common), ")");
  };
  const bool flt = IsFloat(rt);
  const bool boolean = rt == CType::kBool;
  auto refuse = [&]() {
    return StmtError(k_, j,
                     absl::StrCat("op '", name, "' is not defined for ", v1::DType_Name(s.dtype)));
  };

  switch (s.op) {
    case ScalarOp::kExp:
      return fn("kiln_exp");
    case ScalarOp::kSqrt:
      return fn(absl::StrCat(d.ns, "sqrt"));
    case ScalarOp::kLog:
    case ScalarOp::kLog1p:
    case ScalarOp::kExpm1:
    case ScalarOp::kSin:
    case ScalarOp::kCos:
    case ScalarOp::kTanh:
    case ScalarOp::kErf:
    case ScalarOp::kSigmoid:
    case ScalarOp::kGelu:
    case ScalarOp::kGeluTanh:
    case ScalarOp::kSilu:
      return fn(absl::StrCat("kiln_", name));
    case ScalarOp::kRsqrt:
      return absl::StrCat("(", T, "(1) / ", d.ns, "sqrt(", x(0), "))");
    case ScalarOp::kReciprocal:
      return absl::StrCat("(", T, "(1) / ", x(0), ")");
    case ScalarOp::kNeg:
      if (boolean) return refuse();
      return absl::StrCat("(-", x(0), ")");
    case ScalarOp::kAbs:
      if (flt) return fn(absl::StrCat(d.ns, "abs"));
      if (boolean || rt == CType::kU8) return x(0);
      return absl::StrCat("(", x(0), " < 0 ? -", x(0), " : ", x(0), ")");
    case ScalarOp::kRelu:
      if (boolean) return x(0);
      return absl::StrCat("(", x(0), " < ", T, "(0) ? ", T, "(0) : ", x(0), ")");
    case ScalarOp::kSign:
      return boolean ? x(0) : fn("kiln_sign");
    case ScalarOp::kFloor:
    case ScalarOp::kCeil:
      return flt ? fn(absl::StrCat(d.ns, name)) : x(0);
    case ScalarOp::kNot:
      return absl::StrCat("!", Cast(s.args[0], CType::kBool));
    case ScalarOp::kIsnan: {
      const int a = s.args[0];
      if (!IsFloat(type_[a])) return std::string("false");
      return absl::StrCat("(", Val(a), " != ", Val(a), ")");
    }
    case ScalarOp::kAdd:
      return boolean ? bin("||") : bin("+");
    case ScalarOp::kSub:
      if (boolean) return refuse();
      return bin("-");
    case ScalarOp::kMul:
      return boolean ? bin("&&") : bin("*");
    case ScalarOp::kDiv: {
      const Stmt& divisor = k_.stmts[s.args[1]];
      if (d.invariant_reciprocal && rt == CType::kF32 && s.inner &&
          (!divisor.inner || divisor.kind == StmtKind::kConstant ||
           divisor.kind == StmtKind::kReduce)) {
        return absl::StrCat("(", x(0), " * (", T, "(1) / ", x(1), "))");
      }
      return flt && d.div != nullptr ? call2(d.div) : bin("/");
    }
    case ScalarOp::kDivFloor:
      if (boolean) return refuse();
      return call2(flt ? "kiln_floordiv_float" : "kiln_floordiv");
    case ScalarOp::kDivTrunc:
      if (boolean) return refuse();
      return flt ? absl::StrCat(d.ns, "trunc(", x(0), " / ", x(1), ")") : call2("kiln_truncdiv");
    case ScalarOp::kPow:
      if (boolean) return refuse();
      return call2(flt ? absl::StrCat(d.ns, "pow") : std::string("kiln_pow_int"));
    case ScalarOp::kMax:
      return call2(flt ? std::string("kiln_maximum") : absl::StrCat(d.ns, "max"));
    case ScalarOp::kMin:
      return call2(flt ? std::string("kiln_minimum") : absl::StrCat(d.ns, "min"));
    case ScalarOp::kEq:
      return compare("==");
    case ScalarOp::kNe:
      return compare("!=");
    case ScalarOp::kLt:
      return compare("<");
    case ScalarOp::kLe:
      return compare("<=");
    case ScalarOp::kGt:
      return compare(">");
    case ScalarOp::kGe:
      return compare(">=");
    case ScalarOp::kAnd:
      if (flt) return refuse();
      return bin(boolean ? "&&" : "&");
    case ScalarOp::kOr:
      if (flt) return refuse();
      return bin(boolean ? "||" : "|");
    case ScalarOp::kXor:
      if (flt) return refuse();
      return bin(boolean ? "!=" : "^");
    case ScalarOp::kWhere:
      return absl::StrCat("(", Cast(s.args[0], CType::kBool), " ? ", x(1), " : ", x(2), ")");
    case ScalarOp::kCast:
      if (s.dtype == v1::FLOAT16) return absl::StrCat("kiln_round_f16(", x(0), ")");
      if (s.dtype == v1::BFLOAT16) return absl::StrCat("kiln_round_bf16(", x(0), ")");
      return x(0);
  }
  return StmtError(k_, j, absl::StrCat("unknown op ", static_cast<int>(s.op)));
}

bool IsTranscendental(loop::ScalarOp op) {
  using loop::ScalarOp;
  switch (op) {
    case ScalarOp::kExp:
    case ScalarOp::kLog:
    case ScalarOp::kLog1p:
    case ScalarOp::kExpm1:
    case ScalarOp::kSin:
    case ScalarOp::kCos:
    case ScalarOp::kTanh:
    case ScalarOp::kErf:
    case ScalarOp::kSigmoid:
    case ScalarOp::kSilu:
    case ScalarOp::kGelu:
    case ScalarOp::kGeluTanh:
      return true;
    case ScalarOp::kNeg:
    case ScalarOp::kAbs:
    case ScalarOp::kSqrt:
    case ScalarOp::kRsqrt:
    case ScalarOp::kReciprocal:
    case ScalarOp::kRelu:
    case ScalarOp::kSign:
    case ScalarOp::kFloor:
    case ScalarOp::kCeil:
    case ScalarOp::kNot:
    case ScalarOp::kIsnan:
    case ScalarOp::kAdd:
    case ScalarOp::kSub:
    case ScalarOp::kMul:
    case ScalarOp::kDiv:
    case ScalarOp::kDivFloor:
    case ScalarOp::kDivTrunc:
    case ScalarOp::kPow:
    case ScalarOp::kMax:
    case ScalarOp::kMin:
    case ScalarOp::kEq:
    case ScalarOp::kNe:
    case ScalarOp::kLt:
    case ScalarOp::kLe:
    case ScalarOp::kGt:
    case ScalarOp::kGe:
    case ScalarOp::kAnd:
    case ScalarOp::kOr:
    case ScalarOp::kXor:
    case ScalarOp::kWhere:
    case ScalarOp::kCast:
      return false;
  }
  return false;
}

}  // namespace kiln::codegen
