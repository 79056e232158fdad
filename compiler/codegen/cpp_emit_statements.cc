// The C++ backend's statements: loads, constants, scalar ops and stores as
// lines of C++, with the address of each access in each sweep mode.
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "compiler/codegen/c_family.h"
#include "compiler/codegen/cpp_codegen_internal.h"

namespace kiln::codegen::cpp_internal {

// "x * stride", simplified for strides 1.
absl::StatusOr<std::string> KernelEmitter::Term(const std::string& var, const ir::SymInt& stride) {
  if (IsOne(stride)) return var;
  ASSIGN_OR_RETURN(std::string st, Int(stride));
  return absl::StrCat(var, " * ", st);
}

// Operand `a` converted to `to`.
std::string KernelEmitter::Cast(int a, CType to) const {
  if (type_[a] == to) return Val(a);
  if (to == CType::kBool) return absl::StrCat("(", Val(a), " != 0)");
  return absl::StrCat("static_cast<", CName(to), ">(", Val(a), ")");
}

absl::StatusOr<std::string> KernelEmitter::OpExpr(int j) const {
  const Stmt& s = k_.stmts[j];
  if (s.op == loop::ScalarOp::kDiv && reciprocal_.count(j)) {
    return absl::StrCat("(", Cast(s.args[0], type_[j]), " * rc", j, ")");
  }
  return ScalarOpExpr(k_, type_, j, kCppDialect);
}

// The inner-stride part of an access address in loop modes kPlain and
// kNested ("i * 64", "i0 * 4 + i1").
absl::StatusOr<std::string> KernelEmitter::InnerOffset(const loop::Index& index) {
  std::vector<std::string> terms;
  for (size_t k = 0; k < k_.inner.size(); ++k) {
    const ir::SymInt& st = Stride(index.inner_strides, k);
    if (IsZero(st)) continue;
    const std::string var = k_.inner.size() == 1 ? "i" : absl::StrCat("i", k);
    ASSIGN_OR_RETURN(std::string t, Term(var, st));
    terms.push_back(t);
  }
  return absl::StrJoin(terms, " + ");
}

// The address of access j, for the loop mode.
absl::StatusOr<std::string> KernelEmitter::Access(int j, SweepMode mode) {
  const Stmt& s = k_.stmts[j];
  const std::string& base = base_[j];
  if (s.inner && (mode == SweepMode::kSimd || mode == SweepMode::kChunked)) {
    const bool unit = !IsZero(Stride(s.index.inner_strides, 0));
    return absl::StrCat("p", j, unit ? "[i]" : "[0]");
  }
  std::string offset;
  if (s.inner) {
    ASSIGN_OR_RETURN(offset, InnerOffset(s.index));
  }
  std::string addr = base == "0"      ? offset
                     : offset.empty() ? base
                                      : absl::StrCat(base, " + ", offset);
  if (addr.empty()) addr = "0";
  return absl::StrCat("buf", s.buffer, "[", addr, "]");
}

// A gather's or scatter-add's address: Access(j, mode) with the gathered
// terms of args[first..]. Each index is checked into g<j>_<k>
// (kiln_gather_index: -1 when out of range), declared in `line`; `ok` is
// the condition that all are in range.
absl::StatusOr<std::string> KernelEmitter::GatheredAccess(int j, SweepMode mode, size_t first,
                                                          std::string* line, std::string* ok) {
  const Stmt& s = k_.stmts[j];
  ASSIGN_OR_RETURN(std::string addr, Access(j, mode));
  addr.pop_back();  // "bufN[base" and the gathered terms
  for (size_t k = first; k < s.args.size(); ++k) {
    const std::string g = absl::StrCat("g", j, "_", k - first);
    ASSIGN_OR_RETURN(std::string size, Int(s.gather_sizes[k - first]));
    absl::StrAppend(line, "const int64_t ", g, " = kiln_gather_index(static_cast<int64_t>(",
                    Val(s.args[k]), "), ", size, ", ", s.gather_wraps ? "true" : "false",
                    ", gather_check); ");
    ASSIGN_OR_RETURN(std::string term, Term(g, s.gather_strides[k - first]));
    absl::StrAppend(&addr, " + ", term);
    absl::StrAppend(ok, k == first ? "" : " && ", g, " >= 0");
  }
  return absl::StrCat(addr, "]");
}

// One statement that is not a reduction, as a line.
absl::StatusOr<std::string> KernelEmitter::Statement(int j, SweepMode mode) {
  const Stmt& s = k_.stmts[j];
  const char* T = CName(type_[j]);
  switch (s.kind) {
    case StmtKind::kLoad: {
      ASSIGN_OR_RETURN(std::string addr, Access(j, mode));
      ASSIGN_OR_RETURN(std::string value,
                       LoadValue(k_.buffers[s.buffer].dtype, type_[j], addr, "C++"));
      return absl::StrCat("const ", T, " t", j, " = ", value, ";");
    }
    case StmtKind::kGather: {
      // Each index in range, or -1: the load is skipped, the kernel raises
      // the error after its loop.
      std::string line, ok;
      ASSIGN_OR_RETURN(std::string addr, GatheredAccess(j, mode, 0, &line, &ok));
      ASSIGN_OR_RETURN(std::string value,
                       LoadValue(k_.buffers[s.buffer].dtype, type_[j], addr, "C++"));
      return absl::StrCat(line, "const ", T, " t", j, " = (", ok, ") ? ", T, "(", value, ") : ", T,
                          "(0);");
    }
    case StmtKind::kScatterAdd: {
      // Each position checked as a gather's; duplicates from other threads
      // add up atomically: `omp atomic` for 32- and 64-bit elements, a
      // compare-and-swap loop for 16-bit floats.
      std::string line = "{ ", ok;
      ASSIGN_OR_RETURN(std::string addr, GatheredAccess(j, mode, 1, &line, &ok));
      const v1::DType dtype = k_.buffers[s.buffer].dtype;
      const std::string value = Val(s.args[0]);
      if (dtype == v1::FLOAT16 || dtype == v1::BFLOAT16) {
        const std::string sum = ToStorage(
            dtype, CType::kF32,
            absl::StrCat("(", FromStorage(dtype, "o"), " + static_cast<float>(", value, "))"));
        absl::StrAppend(&line, "if (", ok, ") { uint16_t* p = &", addr,
                        "; uint16_t o = __atomic_load_n(p, __ATOMIC_RELAXED), n; do { n = ", sum,
                        "; } while (!__atomic_compare_exchange_n(p, &o, n, false, "
                        "__ATOMIC_RELAXED, __ATOMIC_RELAXED)); } }");
        return line;
      }
      absl::StrAppend(&line, "if (", ok, ") {\n#pragma omp atomic\n", addr,
                      " += ", ToStorage(dtype, type_[s.args[0]], value), ";\n} }");
      return line;
    }
    case StmtKind::kIndex: {
      std::string offset;
      if (s.inner) {
        ASSIGN_OR_RETURN(offset, InnerOffset(s.index));
      }
      const std::string& base = base_[j];
      std::string value = base == "0"      ? offset
                          : offset.empty() ? base
                                           : absl::StrCat(base, " + ", offset);
      if (value.empty()) value = "0";
      return absl::StrCat("const ", T, " t", j, " = static_cast<", T, ">(", value, ");");
    }
    case StmtKind::kConstant:
      return absl::StrCat("const ", T, " t", j, " = ", Literal(s.constant, type_[j], kCppDialect),
                          ";");
    case StmtKind::kOp: {
      ASSIGN_OR_RETURN(std::string e, OpExpr(j));
      return absl::StrCat("const ", T, " t", j, " = ", e, ";");
    }
    case StmtKind::kStore: {
      ASSIGN_OR_RETURN(std::string addr, Access(j, mode));
      const int a = s.args[0];
      return absl::StrCat(addr, " = ", ToStorage(k_.buffers[s.buffer].dtype, type_[a], Val(a)),
                          ";");
    }
    case StmtKind::kReduce:
    case StmtKind::kAccumulate:
      break;
  }
  return StmtError(j, "internal: a reduction is not a plain statement");
}

}  // namespace kiln::codegen::cpp_internal
