// The C++ backend's sweeps: how a pass's inner statements are looped over in
// each SweepMode (omp simd over pointers, 32-lane chunks with a scalar tail,
// a strided loop, nested loops), with the reciprocals and the prefetches of
// the next row declared before a sweep.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/codegen/c_family.h"
#include "compiler/codegen/cpp_codegen_internal.h"

namespace kiln::codegen::cpp_internal {

using loop::ScalarOp;

// Whether pass `pass` may take the fast path: every inner access has a
// constant inner stride of 0 or 1 (stores: 1).
bool KernelEmitter::Contiguous(const Pass& pass) const {
  if (k_.inner.size() != 1) return false;
  for (int j : pass.inner) {
    const Stmt& s = k_.stmts[j];
    // Gathers and index values take the plain loops' full addresses.
    if (s.kind == StmtKind::kGather || s.kind == StmtKind::kIndex ||
        s.kind == StmtKind::kScatterAdd) {
      return false;
    }
    if (s.kind != StmtKind::kLoad && s.kind != StmtKind::kStore) continue;
    const ir::SymInt& st = Stride(s.index.inner_strides, 0);
    if (IsOne(st)) continue;
    if (IsZero(st) && s.kind == StmtKind::kLoad) continue;
    return false;
  }
  return true;
}

// Whether the innermost of several inner loops may be `omp simd`: no
// Welford (its update is sequential), and every access has a constant
// stride of 0 or 1 (stores: 1) in the last inner dimension.
bool KernelEmitter::InnermostContiguous(const Pass& pass) const {
  if (k_.inner.size() < 2 || pass.has_welford) return false;
  const size_t last = k_.inner.size() - 1;
  for (int j : pass.inner) {
    const Stmt& s = k_.stmts[j];
    if (s.kind == StmtKind::kGather || s.kind == StmtKind::kIndex ||
        s.kind == StmtKind::kScatterAdd) {
      return false;
    }
    if (s.kind != StmtKind::kLoad && s.kind != StmtKind::kStore) continue;
    const ir::SymInt& st = Stride(s.index.inner_strides, last);
    if (IsOne(st)) continue;
    if (IsZero(st) && s.kind == StmtKind::kLoad) continue;
    return false;
  }
  return true;
}

// Fast-path pointer of access j: its buffer plus the row's base offset.
absl::Status KernelEmitter::DeclarePointer(int j, int depth, std::string* out) {
  const Stmt& s = k_.stmts[j];
  if (s.kind != StmtKind::kLoad && s.kind != StmtKind::kStore) return absl::OkStatus();
  const loop::KernelBuffer& buf = k_.buffers[s.buffer];
  const std::string type = absl::StrCat(buf.written ? "" : "const ", StorageName(buf.dtype), "*");
  absl::StrAppend(out, Pad(depth), type, " p", j, " = buf", s.buffer,
                  base_[j] == "0" ? "" : absl::StrCat(" + ", base_[j]), ";\n");
  return absl::OkStatus();
}

// The `omp simd` pragma with the pass's reductions.
std::string KernelEmitter::SimdPragma(const Pass& pass) const {
  std::string pragma = "#pragma omp simd";
  for (int j : pass.inner) {
    const Stmt& s = k_.stmts[j];
    if (s.kind != StmtKind::kReduce || IsWelford(s)) continue;
    switch (s.reduce) {
      case ReduceOp::kSum:
        absl::StrAppend(&pragma, " reduction(+:acc", j, ")");
        break;
      case ReduceOp::kMax:
      case ReduceOp::kMin:
        absl::StrAppend(&pragma, " reduction(", s.reduce == ReduceOp::kMax ? "max" : "min", ":acc",
                        j, ")");
        if (IsFloat(type_[j])) absl::StrAppend(&pragma, " reduction(|:nan", j, ")");
        break;
      default:
        break;
    }
  }
  return pragma + "\n";
}

// The sweep body: the pass's inner statements.
absl::Status KernelEmitter::SweepBody(const Pass& pass, SweepMode mode, bool chunk_body, int depth,
                                      std::string* out) {
  for (int j : pass.inner) {
    if (k_.stmts[j].kind == StmtKind::kReduce) {
      const std::string line = Accumulate(j, chunk_body);
      if (!line.empty()) absl::StrAppend(out, Pad(depth), line, "\n");
      continue;
    }
    ASSIGN_OR_RETURN(std::string line, Statement(j, mode));
    absl::StrAppend(out, Pad(depth), line, "\n");
  }
  return absl::OkStatus();
}

absl::Status KernelEmitter::EmitSweep(const Pass& pass, int depth, std::string* out) {
  const int n_inner = static_cast<int>(k_.inner.size());
  switch (pass.mode) {
    case SweepMode::kSimd: {
      for (int j : pass.inner) RETURN_IF_ERROR(DeclarePointer(j, depth, out));
      absl::StrAppend(out, SimdPragma(pass));
      absl::StrAppend(out, Pad(depth), "for (int64_t i = 0; i < inner_n; ++i) {\n");
      RETURN_IF_ERROR(SweepBody(pass, pass.mode, false, depth + 1, out));
      absl::StrAppend(out, Pad(depth), "}\n");
      return absl::OkStatus();
    }
    case SweepMode::kChunked: {
      for (int j : pass.inner) RETURN_IF_ERROR(DeclarePointer(j, depth, out));
      const std::string wc = absl::StrCat("wc", pass.number);
      const int L = kLanes;
      absl::StrAppend(out, Pad(depth), "const int64_t ", wc, " = inner_n / ", L,
                      ";  // full chunks of ", L, " lanes\n");
      ASSIGN_OR_RETURN(std::vector<std::string> prefetch, DeclarePrefetches(pass, depth, out));
      std::vector<int> folds;
      for (int j : pass.inner) {
        if (FoldsIntoDouble(j)) folds.push_back(j);
      }
      // With float sums or Welfords, the chunks run in blocks; each
      // block's lanes are folded into the double lanes and restarted.
      const int d = folds.empty() ? depth : depth + 1;
      if (!folds.empty()) {
        absl::StrAppend(out, Pad(depth), "for (int64_t c0 = 0; c0 < ", wc, "; c0 += ", kFoldChunks,
                        ") {\n", Pad(d), "const int64_t c1 = std::min<int64_t>(", wc, ", c0 + ",
                        kFoldChunks, ");\n", Pad(d), "for (int64_t c = c0; c < c1; ++c) {\n");
      } else {
        absl::StrAppend(out, Pad(d), "for (int64_t c = 0; c < ", wc, "; ++c) {\n");
      }
      for (const std::string& pf : prefetch) {
        absl::StrAppend(out, Pad(d + 1), "for (int k = 0; k < ", L, " * int(sizeof(*", pf,
                        ")); k += 64) __builtin_prefetch(reinterpret_cast<const char*>(", pf,
                        " + c * ", L, ") + k);\n");
      }
      if (pass.has_welford) {
        absl::StrAppend(out, Pad(d + 1), "const ", CName(WelfordType(pass)),
                        " winv = 1 / static_cast<", CName(WelfordType(pass)), ">(c",
                        folds.empty() ? "" : " - c0", " + 1);\n");
      }
      absl::StrAppend(out, "#pragma omp simd\n");  // lanes are independent
      absl::StrAppend(out, Pad(d + 1), "for (int64_t l = 0; l < ", L, "; ++l) {\n");
      absl::StrAppend(out, Pad(d + 2), "const int64_t i = c * ", L, " + l;\n");
      RETURN_IF_ERROR(SweepBody(pass, pass.mode, true, d + 2, out));
      absl::StrAppend(out, Pad(d + 1), "}\n", Pad(d), "}\n");
      if (!folds.empty()) {
        for (int j : folds) FoldBlock(j, d, out);
        absl::StrAppend(out, Pad(depth), "}\n");
      }
      // Merge the lanes (equal counts) with Chan's formula.
      for (int j : pass.inner) {
        const Stmt& s = k_.stmts[j];
        if (!IsWelford(s) || WelfordId(j) != j) continue;
        const bool folded = FoldsIntoDouble(j);
        const char* T = WelfordState(type_[j]);
        const std::string lm = absl::StrCat(folded ? "wmd" : "wml", j);
        const std::string lq = absl::StrCat(folded ? "wqd" : "wql", j);
        absl::StrAppend(out, Pad(depth), "if (", wc, " > 0) {\n");
        // The mean of the lane means, summed as offsets from lane 0: the
        // means themselves are large next to their spread, and a plain sum
        // of them rounds at 32x their magnitude.
        absl::StrAppend(out, Pad(depth + 1), T, " s = 0;\n", Pad(depth + 1), "for (int l = 1; l < ",
                        L, "; ++l) s += ", lm, "[l] - ", lm, "[0];\n");
        absl::StrAppend(out, Pad(depth + 1), "const ", T, " m = ", lm, "[0] + s / ", L, ";\n");
        absl::StrAppend(out, Pad(depth + 1), T, " q = 0;\n", Pad(depth + 1), "for (int l = 0; l < ",
                        L, "; ++l) {\n", Pad(depth + 2), "const ", T, " d = ", lm, "[l] - m;\n",
                        Pad(depth + 2), "q += ", lq, "[l] + d * d * static_cast<", T, ">(", wc,
                        ");\n", Pad(depth + 1), "}\n");
        absl::StrAppend(out, Pad(depth + 1), "wm", j, " = m;\n", Pad(depth + 1), "wq", j, " = q;\n",
                        Pad(depth + 1), "wn", j, " = ", wc, " * ", L, ";\n", Pad(depth), "}\n");
      }
      absl::StrAppend(out, Pad(depth), "for (int64_t i = ", wc, " * ", L,
                      "; i < inner_n; ++i) {  // the tail\n");
      RETURN_IF_ERROR(SweepBody(pass, pass.mode, false, depth + 1, out));
      absl::StrAppend(out, Pad(depth), "}\n");
      // The other reductions: the tail's accumulator and the lanes'.
      for (int j : pass.inner) {
        const Stmt& s = k_.stmts[j];
        if (s.kind != StmtKind::kReduce || IsWelford(s)) continue;
        const std::string line =
            Combine(j, absl::StrCat("acc", j), absl::StrCat("nan", j),
                    absl::StrCat(FoldsIntoDouble(j) ? "accd" : "accl", j, "[l]"),
                    absl::StrCat("nanl", j, "[l]"));
        absl::StrAppend(out, Pad(depth), "for (int l = 0; l < ", L, "; ++l) { ", line, " }\n");
      }
      return absl::OkStatus();
    }
    case SweepMode::kPlain: {
      absl::StrAppend(out, Pad(depth), "for (int64_t i = 0; i < inner_n; ++i) {\n");
      RETURN_IF_ERROR(SweepBody(pass, pass.mode, false, depth + 1, out));
      absl::StrAppend(out, Pad(depth), "}\n");
      return absl::OkStatus();
    }
    case SweepMode::kNested: {
      for (int k = 0; k < n_inner; ++k) {
        ASSIGN_OR_RETURN(std::string size, Int(k_.inner[k]));
        if (k == n_inner - 1 && InnermostContiguous(pass)) {
          absl::StrAppend(out, SimdPragma(pass));
        }
        absl::StrAppend(out, Pad(depth + k), "for (int64_t i", k, " = 0; i", k, " < ", size,
                        "; ++i", k, ") {\n");
      }
      if (n_inner == 0) absl::StrAppend(out, Pad(depth), "{  // a sweep of one point\n");
      const int body_depth = depth + std::max(n_inner, 1);
      RETURN_IF_ERROR(SweepBody(pass, pass.mode, false, body_depth, out));
      for (int k = std::max(n_inner, 1) - 1; k >= 0; --k) {
        absl::StrAppend(out, Pad(depth + k), "}\n");
      }
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

// A floating division inside the sweep by a value computed once per row
// (softmax's sum, a norm's scale) becomes one division before the sweep
// and a multiplication per element, as ATen's own softmax does: a divide
// costs about ten multiplies. The result may differ from x / d in the last
// bit.
void KernelEmitter::DeclareReciprocals(const Pass& pass, int depth, std::string* out) {
  for (int j : pass.inner) {
    const Stmt& s = k_.stmts[j];
    if (s.kind != StmtKind::kOp || s.op != ScalarOp::kDiv || !IsFloat(type_[j])) continue;
    // Row-invariant: an outer-level value, or a reduction finished by an
    // earlier pass.
    const Stmt& d = k_.stmts[s.args[1]];
    const bool invariant = !d.inner || (d.kind == StmtKind::kReduce && d.pass < pass.number);
    if (!invariant) continue;
    const char* T = CName(type_[j]);
    absl::StrAppend(out, Pad(depth), "const ", T, " rc", j, " = ", T, "(1) / ",
                    Cast(s.args[1], type_[j]), ";\n");
    reciprocal_.insert(j);
  }
}

// Rows are read from memory by a kernel's first pass and from cache by the
// later ones, and a row of 4 KiB starts a new page, where the hardware
// prefetchers stop. A later sweep that computes transcendental functions
// (softmax's exponentials) is bound by arithmetic, and one that stores
// nothing (layer norm's squared deviations) reads only cache: either has
// memory bandwidth to spare. The first such sweep prefetches the next row
// of the first pass's loads (one row on along the last outer dim), so that
// the next first pass finds them in cache. Other sweeps are not used: their
// stores need the same bandwidth (prefetching in layer norm's normalizing
// sweep made it slower). Declares the pointers to the next rows; returns
// their names.
absl::StatusOr<std::vector<std::string>> KernelEmitter::DeclarePrefetches(const Pass& pass,
                                                                          int depth,
                                                                          std::string* out) {
  std::vector<std::string> names;
  if (pass.number == 0 || k_.outer.empty() || k_.inner.size() != 1) return names;
  auto spare_bandwidth = [&](const Pass& p) {
    bool heavy = false, stores = false;
    for (int j : p.inner) {
      const Stmt& s = k_.stmts[j];
      heavy = heavy || (s.kind == StmtKind::kOp && IsTranscendental(s.op));
      stores = stores || s.kind == StmtKind::kStore;
    }
    return heavy || !stores;
  };
  for (int q = 1; q < pass.number; ++q) {
    if (spare_bandwidth(passes_[q])) return names;  // an earlier sweep prefetches
  }
  if (!spare_bandwidth(pass)) return names;
  std::set<std::string> seen;
  for (int j : passes_[0].inner) {
    const Stmt& s = k_.stmts[j];
    if (s.kind != StmtKind::kLoad || !IsOne(Stride(s.index.inner_strides, 0))) continue;
    if (s.index.outer_strides.empty() || IsZero(s.index.outer_strides.back())) continue;
    ASSIGN_OR_RETURN(std::string step, Int(s.index.outer_strides.back()));
    const std::string addr = absl::StrCat(
        "buf", s.buffer, base_[j] == "0" ? "" : absl::StrCat(" + ", base_[j]), " + ", step);
    if (!seen.insert(addr).second) continue;
    const std::string name = absl::StrCat("pf", j);
    absl::StrAppend(out, Pad(depth), "const ", StorageName(k_.buffers[s.buffer].dtype), "* ", name,
                    " = ", addr, ";  // the next row\n");
    names.push_back(name);
  }
  return names;
}

}  // namespace kiln::codegen::cpp_internal
