// The C++ backend's reductions: each accumulator's declaration before its
// sweep, its update inside it and its result after it; per-lane
// accumulators in chunked sweeps, float lanes folded into double lanes over
// long rows, and Welford's mean and M2 merged by Chan's formula.
#include <string>

#include "absl/strings/str_cat.h"
#include "compiler/codegen/c_family.h"
#include "compiler/codegen/cpp_codegen_internal.h"

namespace kiln::codegen::cpp_internal {

// The identity of max/min reduction j.
std::string KernelEmitter::ReduceInit(int j) const {
  const CType t = type_[j];
  const bool max = k_.stmts[j].reduce == ReduceOp::kMax;
  return IsFloat(t) ? absl::StrCat(max ? "-" : "", Limit(t, "infinity", kCppDialect))
                    : Limit(t, max ? "lowest" : "max", kCppDialect);
}

// Accumulator declarations of reduction j (before its sweep).
void KernelEmitter::DeclareAccumulator(int j, const Pass& pass, int depth, std::string* out) {
  const Stmt& s = k_.stmts[j];
  const CType t = type_[j];
  const char* T = CName(t);
  if (IsWelford(s)) {
    const int w = WelfordId(j);
    if (w != j) return;
    absl::StrAppend(out, Pad(depth), WelfordState(t), " wm", w, " = 0, wq", w,
                    " = 0;  // mean, M2\n", Pad(depth), "int64_t wn", w, " = 0;\n");
    if (pass.mode == SweepMode::kChunked) {
      absl::StrAppend(out, Pad(depth), T, " wml", w, "[", kLanes, "] = {}, wql", w, "[", kLanes,
                      "] = {};  // per lane\n");
    }
    if (FoldsIntoDouble(j)) {
      absl::StrAppend(out, Pad(depth), "double wmd", w, "[", kLanes, "] = {}, wqd", w, "[", kLanes,
                      "] = {};  // per lane, every block of chunks\n", Pad(depth), T, " wkl", w,
                      "[", kLanes, "] = {};  // per lane, the block's shift\n");
    }
    return;
  }
  if (pass.mode == SweepMode::kChunked) {
    const std::string init = s.reduce == ReduceOp::kSum ? std::string("0") : ReduceInit(j);
    absl::StrAppend(out, Pad(depth), T, " accl", j, "[", kLanes, "];  // per lane\n", Pad(depth),
                    "std::fill_n(accl", j, ", ", kLanes, ", ", T, "(", init, "));\n");
    if (s.reduce != ReduceOp::kSum && IsFloat(t)) {
      absl::StrAppend(out, Pad(depth), "int nanl", j, "[", kLanes, "] = {};\n");
    }
    if (FoldsIntoDouble(j)) {
      absl::StrAppend(out, Pad(depth), "double accd", j, "[", kLanes,
                      "] = {};  // per lane, every block of chunks\n");
    }
  }
  switch (s.reduce) {
    case ReduceOp::kSum:
      // A strided sweep adds its terms one after another: float32 rounding
      // error would grow with the count (a weight gradient summed over
      // every row is off by 1e-5 of its size). Those sums run in double;
      // the vectorized ones keep float partial sums per lane, folded into
      // double lanes every kFoldChunks chunks.
      if (t == CType::kF32) {
        absl::StrAppend(out, Pad(depth), "double acc", j, " = 0;\n");
        break;
      }
      absl::StrAppend(out, Pad(depth), T, " acc", j, " = 0;\n");
      break;
    case ReduceOp::kMax:
    case ReduceOp::kMin: {
      absl::StrAppend(out, Pad(depth), T, " acc", j, " = ", ReduceInit(j), ";\n");
      if (IsFloat(t)) absl::StrAppend(out, Pad(depth), "int nan", j, " = 0;\n");
      break;
    }
    default:
      break;
  }
}

// The update of reduction j inside the sweep.
std::string KernelEmitter::Accumulate(int j, bool chunk_body) const {
  const Stmt& s = k_.stmts[j];
  const CType t = type_[j];
  const std::string v = Cast(s.args[0], t);
  const std::string acc = absl::StrCat("acc", j);
  if (IsWelford(s)) {
    const int w = WelfordId(j);
    if (w != j) return "";
    const char* T = CName(t);
    if (chunk_body) {
      const std::string m = absl::StrCat("wml", w, "[l]"), q = absl::StrCat("wql", w, "[l]");
      std::string line = "{ ", u = v;
      if (FoldsIntoDouble(j)) {  // the lane takes its values less the block's shift
        absl::StrAppend(&line, "const ", T, " u = ", v, " - wkl", w, "[l]; ");
        u = "u";
      }
      return absl::StrCat(line, "const ", T, " d = ", u, " - ", m, "; ", m, " += d * winv; ", q,
                          " += d * (", u, " - ", m, "); }");
    }
    const char* S = WelfordState(t);
    return absl::StrCat("{ wn", w, " += 1; const ", S, " d = ", v, " - wm", w, "; wm", w,
                        " += d / static_cast<", S, ">(wn", w, "); wq", w, " += d * (", v, " - wm",
                        w, "); }");
  }
  if (chunk_body) {
    return Combine(j, absl::StrCat("accl", j, "[l]"), absl::StrCat("nanl", j, "[l]"), v,
                   absl::StrCat("(", v, " != ", v, ")"));
  }
  return Combine(j, acc, absl::StrCat("nan", j), v, absl::StrCat("(", v, " != ", v, ")"));
}

// The line folding `value` into sum/max/min reduction j's accumulator
// `acc`; a float max/min also ors `is_nan` into its NaN flag `nan`. Empty
// for other reductions.
std::string KernelEmitter::Combine(int j, const std::string& acc, const std::string& nan,
                                   const std::string& value, const std::string& is_nan) const {
  switch (k_.stmts[j].reduce) {
    case ReduceOp::kSum:
      return absl::StrCat(acc, " += ", value, ";");
    case ReduceOp::kMax:
    case ReduceOp::kMin: {
      const char* cmp = k_.stmts[j].reduce == ReduceOp::kMax ? ">" : "<";
      std::string line =
          absl::StrCat(acc, " = ", value, " ", cmp, " ", acc, " ? ", value, " : ", acc, ";");
      if (IsFloat(type_[j])) absl::StrAppend(&line, " ", nan, " |= ", is_nan, ";");
      return line;
    }
    default:
      return "";
  }
}

// Reduction results after the sweep.
void KernelEmitter::Finish(int j, int depth, std::string* out) const {
  const Stmt& s = k_.stmts[j];
  const CType t = type_[j];
  const char* T = CName(t);
  std::string value;
  if (IsWelford(s)) {
    const int w = WelfordId(j);
    value = absl::StrCat("static_cast<", T, ">(", s.reduce == ReduceOp::kWelfordMean ? "wm" : "wq",
                         w, ")");
  } else if ((s.reduce == ReduceOp::kMax || s.reduce == ReduceOp::kMin) && IsFloat(t)) {
    value = absl::StrCat("nan", j, " ? ", Limit(t, "quiet_NaN", kCppDialect), " : acc", j);
  } else if (s.reduce == ReduceOp::kSum && t == CType::kF32) {  // accumulated in double
    value = absl::StrCat("static_cast<float>(acc", j, ")");
  } else {
    value = absl::StrCat("acc", j);
  }
  absl::StrAppend(out, Pad(depth), "const ", T, " t", j, " = ", value, ";\n");
}

// Whether reduction j is a float sum, or the accumulator of a float
// Welford, in a chunked sweep of more than one block: its float lanes are
// folded into double lanes every kFoldChunks chunks. (A float lane that
// took every 32nd of a million terms would round at the size of its whole
// partial sum: 1,000,000 x 0.1f came out 2.2e-4 too large, and the
// variance of a million values offset by 1e4 6.8e-4 off.) A sweep of one
// block (a constant size of at most kFoldChunks chunks) merges its float
// lanes in double directly.
bool KernelEmitter::FoldsIntoDouble(int j) const {
  const Stmt& s = k_.stmts[j];
  if (s.kind != StmtKind::kReduce || type_[j] != CType::kF32 ||
      passes_[s.pass].mode != SweepMode::kChunked) {
    return false;
  }
  const ir::SymInt& n = k_.inner.back();
  if (k_.inner.size() == 1 && n.is_constant() && n.constant() <= kFoldChunks * kLanes) {
    return false;
  }
  return IsWelford(s) ? WelfordId(j) == j : s.reduce == ReduceOp::kSum;
}

// Folds the lanes of folded reduction j into its double lanes at the end
// of a block of chunks [c0, c1), and restarts them.
void KernelEmitter::FoldBlock(int j, int depth, std::string* out) const {
  const int L = kLanes;
  if (!IsWelford(k_.stmts[j])) {
    absl::StrAppend(out, Pad(depth), "for (int l = 0; l < ", L, "; ++l) { accd", j, "[l] += accl",
                    j, "[l]; accl", j, "[l] = 0; }\n");
    return;
  }
  // Chan's merge of the block (c1 - c0 chunks; its mean is the shift plus
  // the lane's) into the lanes' totals (c0 chunks). The next block starts
  // from 0, shifted by the mean so far: its float means then round at the
  // size of the spread, not of the mean (values 1e4 + small terms: M2 was
  // 2.4e-5 off unshifted).
  const std::string m = absl::StrCat("wml", j, "[l]"), q = absl::StrCat("wql", j, "[l]");
  const std::string dm = absl::StrCat("wmd", j, "[l]"), dq = absl::StrCat("wqd", j, "[l]");
  const std::string shift = absl::StrCat("wkl", j, "[l]");
  const std::string in = Pad(depth + 1);
  absl::StrAppend(
      out, Pad(depth), "for (int l = 0; l < ", L, "; ++l) {\n", in,
      "const double f = static_cast<double>(c1 - c0) / static_cast<double>(c1);\n", in,
      "const double dl = (static_cast<double>(", shift, ") + ", m, ") - ", dm, ";\n", in, dm,
      " += dl * f;\n", in, dq, " += ", q, " + dl * dl * static_cast<double>(c0) * f;\n", in, shift,
      " = static_cast<float>(", dm, ");\n", in, m, " = 0;\n", in, q, " = 0;\n", Pad(depth), "}\n");
}

CType KernelEmitter::WelfordType(const Pass& pass) const {
  for (int j : pass.inner) {
    if (IsWelford(k_.stmts[j])) return type_[j];
  }
  return CType::kF32;
}

}  // namespace kiln::codegen::cpp_internal
