// The CUDA backend's kernel function: its signature and launch bounds, its
// buffers and sizes, the pointwise form (a grid-stride loop), and the
// statements and element addresses every form shares.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "compiler/codegen/c_family.h"
#include "compiler/codegen/cuda_codegen_internal.h"
#include "compiler/codegen/cuda_schedule.h"

namespace kiln::codegen::cuda_internal {

absl::StatusOr<std::string> CudaKernelEmitter::Emit() {
  if (!IsIdentifier(k_.name) || absl::StartsWith(k_.name, "kiln_")) {
    return KernelError(k_, "the name is not a C identifier (or starts with kiln_)");
  }
  ASSIGN_OR_RETURN(KernelCheck check, CheckKernel(k_, "CUDA"));
  if (IndexesFitInt32(k_)) idx_ = "int32_t";
  type_ = std::move(check.type);
  after_ = std::move(check.after);
  if (k_.buffers.empty()) return KernelError(k_, "has no buffers");
  const Schedule sched = ScheduleOf(k_);
  const bool fast = StoresSixteenBitFloats(k_);
  if (fast) dialect_ = &kCudaFastDialect;
  std::string body;
  RETURN_IF_ERROR(HasReduction(k_) ? EmitReduction(sched, &body) : EmitPointwise(sched, &body));

  std::string out = absl::StrCat(
      fast ? "\n// Every floating-point result in 16 bits: the approximations of kiln_fast.\n"
             "namespace kiln_fast {\n"
           : "",
      "\nstruct ", k_.name, "_args {\n  void* b[", k_.buffers.size(), "];\n");
  if (symbols_.size() > 0) absl::StrAppend(&out, "  int64_t s[", symbols_.size(), "];\n");
  absl::StrAppend(&out, "};\n\nextern \"C\" __global__ void __launch_bounds__(",
                  LaunchBounds(sched), ") ", k_.name, "(const ", k_.name, "_args a) {\n");
  if (!k_.nodes.empty()) {
    absl::StrAppend(&out, "  // nodes: ", CommentText(absl::StrJoin(k_.nodes, ", ")), "\n");
  }
  for (int k : ints_.used_symbols()) {
    absl::StrAppend(&out, "  const int64_t ", symbols_.CppName(k), " = a.s[", k, "];\n");
  }
  for (size_t b = 0; b < k_.buffers.size(); ++b) {
    const loop::KernelBuffer& buf = k_.buffers[b];
    const std::string type = buf.written
                                 ? absl::StrCat(StorageName(buf.dtype), "*")
                                 : absl::StrCat("const ", StorageName(buf.dtype), "* __restrict__");
    const std::string cast = absl::StrCat(buf.written ? "" : "const ", StorageName(buf.dtype), "*");
    absl::StrAppend(&out, "  ", type, " buf", b, " = static_cast<", cast, ">(a.b[", b, "]);  // ",
                    CommentText(buf.value), "\n");
  }
  for (const std::string& decl : ints_.hoisted()) absl::StrAppend(&out, "  ", decl, "\n");
  absl::StrAppend(&out, body, "}\n", fast ? "\n}  // namespace kiln_fast\n" : "");
  return out;
}

absl::StatusOr<std::string> CudaKernelEmitter::Product(const std::vector<ir::SymInt>& sizes,
                                                       size_t from) {
  return ints_.Product(sizes, from);
}

absl::Status CudaKernelEmitter::Decompose(const std::vector<ir::SymInt>& sizes,
                                          const std::string& flat, const std::string& prefix,
                                          int depth, std::string* out) {
  std::vector<std::string> names;
  for (size_t k = 0; k < sizes.size(); ++k) names.push_back(absl::StrCat(prefix, k));
  return Decompose(sizes, names, flat, depth, out);
}

absl::Status CudaKernelEmitter::Decompose(const std::vector<ir::SymInt>& sizes,
                                          const std::vector<std::string>& names,
                                          const std::string& flat, int depth, std::string* out) {
  const size_t n = sizes.size();
  for (size_t k = 0; k < n; ++k) {
    std::string value = flat;
    if (n > 1) {
      ASSIGN_OR_RETURN(std::string div, Product(sizes, k + 1));
      ASSIGN_OR_RETURN(std::string size, Int(sizes[k]));
      if (div.find(' ') != std::string::npos) div = absl::StrCat("(", div, ")");
      if (k == 0) {
        value = absl::StrCat(flat, " / ", div);
      } else if (k + 1 == n) {
        value = absl::StrCat(flat, " % ", size);
      } else {
        value = absl::StrCat("(", flat, " / ", div, ") % ", size);
      }
    }
    absl::StrAppend(out, Pad(depth), "const ", idx_, " ", names[k], " = ", value, ";\n");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CudaKernelEmitter::Access(int j) {
  const Stmt& s = k_.stmts[j];
  std::vector<std::string> terms;
  auto add = [&](const std::string& var, const ir::SymInt& stride) -> absl::Status {
    if (IsZero(stride)) return absl::OkStatus();
    if (IsOne(stride)) {
      terms.push_back(var);
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(std::string st, Int(stride));
    terms.push_back(absl::StrCat(var, " * ", st));
    return absl::OkStatus();
  };
  for (size_t k = 0; k < s.index.outer_strides.size(); ++k) {
    RETURN_IF_ERROR(add(absl::StrCat("o", k), s.index.outer_strides[k]));
  }
  if (s.inner) {
    for (size_t k = 0; k < s.index.inner_strides.size(); ++k) {
      RETURN_IF_ERROR(add(absl::StrCat("i", k), s.index.inner_strides[k]));
    }
  }
  if (!IsZero(s.index.offset)) {
    ASSIGN_OR_RETURN(std::string off, Int(s.index.offset));
    terms.push_back(off);
  }
  return absl::StrCat("buf", s.buffer, "[", terms.empty() ? "0" : absl::StrJoin(terms, " + "), "]");
}

absl::StatusOr<std::string> CudaKernelEmitter::GatheredAccess(int j, size_t first) {
  const Stmt& s = k_.stmts[j];
  ASSIGN_OR_RETURN(std::string addr, Access(j));
  addr.pop_back();  // "bufN[base" and the gathered terms
  for (size_t k = first; k < s.args.size(); ++k) {
    ASSIGN_OR_RETURN(std::string size, Int(s.gather_sizes[k - first]));
    std::string term =
        absl::StrCat("kiln_gather_index(static_cast<int64_t>(", Val(s.args[k]), "), ", size, ", ",
                     s.gather_wraps ? "true" : "false", ", \"", k_.name, "\")");
    if (!IsOne(s.gather_strides[k - first])) {
      ASSIGN_OR_RETURN(std::string stride, Int(s.gather_strides[k - first]));
      term = absl::StrCat(term, " * ", stride);
    }
    absl::StrAppend(&addr, " + ", term);
  }
  return absl::StrCat(addr, "]");
}

absl::StatusOr<std::string> CudaKernelEmitter::Statement(int j, const std::string& guard,
                                                         const std::string& live) {
  const Stmt& s = k_.stmts[j];
  const char* T = CName(type_[j]);
  switch (s.kind) {
    case StmtKind::kLoad: {
      std::string addr;
      if (vectorized_.count(j) > 0) {
        addr = absl::StrCat("v", j, "[v]");
      } else {
        ASSIGN_OR_RETURN(addr, Access(j));
      }
      ASSIGN_OR_RETURN(std::string value,
                       LoadValue(k_.buffers[s.buffer].dtype, type_[j], addr, "CUDA"));
      if (!live.empty()) value = absl::StrCat("(", live, ") ? ", value, " : ", T, "(0)");
      return absl::StrCat("const ", T, " t", j, " = ", value, ";");
    }
    case StmtKind::kGather: {
      ASSIGN_OR_RETURN(std::string addr, GatheredAccess(j, 0));
      ASSIGN_OR_RETURN(std::string value,
                       LoadValue(k_.buffers[s.buffer].dtype, type_[j], addr, "CUDA"));
      if (!live.empty()) value = absl::StrCat("(", live, ") ? ", value, " : ", T, "(0)");
      return absl::StrCat("const ", T, " t", j, " = ", value, ";");
    }
    case StmtKind::kScatterAdd: {
      ASSIGN_OR_RETURN(std::string addr, GatheredAccess(j, 1));
      const v1::DType dtype = k_.buffers[s.buffer].dtype;
      const std::string value = Val(s.args[0]);
      std::string line;
      switch (dtype) {
        case v1::FLOAT16:
          line = absl::StrCat("kiln_atomic_add_f16(&", addr, ", static_cast<float>(", value, "));");
          break;
        case v1::BFLOAT16:
          line =
              absl::StrCat("kiln_atomic_add_bf16(&", addr, ", static_cast<float>(", value, "));");
          break;
        case v1::INT64:
          line = absl::StrCat("atomicAdd(reinterpret_cast<unsigned long long*>(&", addr,
                              "), static_cast<unsigned long long>(", value, "));");
          break;
        default:
          line = absl::StrCat("atomicAdd(&", addr, ", ", ToStorage(dtype, type_[s.args[0]], value),
                              ");");
      }
      if (!live.empty()) line = absl::StrCat("if (", live, ") ", line);
      return line;
    }
    case StmtKind::kIndex: {
      // Access's address without its buffer: "buf-1[" ... "]", at the
      // chunk's first element; lane v is v elements along the vector's dim.
      ASSIGN_OR_RETURN(std::string addr, Access(j));
      std::string value = addr.substr(addr.find('[') + 1, addr.size() - addr.find('[') - 2);
      if (vector_ > 1 && s.inner) {
        const int n_outer = static_cast<int>(k_.outer.size());
        const std::vector<ir::SymInt>& strides =
            vector_dim_ < n_outer ? s.index.outer_strides : s.index.inner_strides;
        const size_t at = vector_dim_ < n_outer ? vector_dim_ : vector_dim_ - n_outer;
        if (at < strides.size() && !IsZero(strides[at])) {
          ASSIGN_OR_RETURN(std::string stride, Int(strides[at]));
          value = absl::StrCat("(", value, ") + v * ", stride);
        }
      }
      return absl::StrCat("const ", T, " t", j, " = static_cast<", T, ">(", value, ");");
    }
    case StmtKind::kConstant:
      return absl::StrCat("const ", T, " t", j, " = ", Literal(s.constant, type_[j], kCudaDialect),
                          ";");
    case StmtKind::kOp: {
      ASSIGN_OR_RETURN(std::string e, ScalarOpExpr(k_, type_, j, *dialect_));
      return absl::StrCat("const ", T, " t", j, " = ", e, ";");
    }
    case StmtKind::kStore: {
      const int a = s.args[0];
      if (vectorized_.count(j) > 0) {
        return absl::StrCat("v", j,
                            "[v] = ", ToStorage(k_.buffers[s.buffer].dtype, type_[a], Val(a)), ";");
      }
      ASSIGN_OR_RETURN(std::string addr, Access(j));
      std::string line =
          absl::StrCat(addr, " = ", ToStorage(k_.buffers[s.buffer].dtype, type_[a], Val(a)), ";");
      std::string cond = s.inner ? "" : guard;
      if (!live.empty()) cond = cond.empty() ? live : absl::StrCat(cond, " && ", live);
      if (!cond.empty()) line = absl::StrCat("if (", cond, ") ", line);
      return line;
    }
    case StmtKind::kReduce:
    case StmtKind::kAccumulate:
      break;
  }
  return StmtError(k_, j, "internal: a reduction is not a plain statement");
}

absl::Status CudaKernelEmitter::Sizes(std::string* out) {
  ASSIGN_OR_RETURN(std::string outer_n, Product(k_.outer, 0));
  ASSIGN_OR_RETURN(std::string inner_n, Product(k_.inner, 0));
  absl::StrAppend(out, "  const ", idx_, " outer_n = ", outer_n, ";\n");
  absl::StrAppend(out, "  const ", idx_, " inner_n = ", inner_n, ";\n");
  return absl::OkStatus();
}

absl::Status CudaKernelEmitter::DeclareVectors(int vector, int dim,
                                               const std::vector<ir::SymInt>& checks,
                                               std::string* out) {
  for (size_t j = 0; j < k_.stmts.size(); ++j) {
    if (MovesAlong(k_, k_.stmts[j], dim)) vectorized_.insert(static_cast<int>(j));
  }
  vector_ = vector;
  vector_dim_ = dim;
  // The buffers' alignment is the launcher's (LaunchSize::alignment): only
  // symbolic strides and offsets are left to test.
  if (checks.empty()) {
    absl::StrAppend(out, "  constexpr bool aligned = true;\n");
    return absl::OkStatus();
  }
  std::vector<std::string> masks;
  for (const ir::SymInt& c : checks) {
    ASSIGN_OR_RETURN(std::string text, Int(c));
    masks.push_back(absl::StrCat("((", text, ") % ", vector, ")"));
  }
  absl::StrAppend(out, "  const bool aligned = (", absl::StrJoin(masks, " | "), ") == 0;\n");
  return absl::OkStatus();
}

absl::Status CudaKernelEmitter::VectorAccesses(const std::vector<int>& stmts, StmtKind kind,
                                               int vector, int depth, std::string* out) {
  for (int j : stmts) {
    const Stmt& s = k_.stmts[j];
    if (s.kind != kind || vectorized_.count(j) == 0) continue;
    ASSIGN_OR_RETURN(std::string addr, Access(j));
    const char* storage = StorageName(k_.buffers[s.buffer].dtype);
    if (kind == StmtKind::kLoad) {
      absl::StrAppend(out, Pad(depth), "alignas(16) ", storage, " v", j, "[", vector, "];\n",
                      Pad(depth), "kiln_vload<", vector, ">(v", j, ", &", addr, ", aligned);\n");
    } else {
      absl::StrAppend(out, Pad(depth), "kiln_vstore<", vector, ">(&", addr, ", v", j,
                      ", aligned);\n");
    }
  }
  return absl::OkStatus();
}

void CudaKernelEmitter::DeclareStoreChunks(const std::vector<int>& stmts, int vector, int depth,
                                           std::string* out) {
  for (int j : stmts) {
    const Stmt& s = k_.stmts[j];
    if (s.kind != StmtKind::kStore || vectorized_.count(j) == 0) continue;
    absl::StrAppend(out, Pad(depth), "alignas(16) ", StorageName(k_.buffers[s.buffer].dtype), " v",
                    j, "[", vector, "];\n");
  }
}

absl::Status CudaKernelEmitter::EmitPointwise(const Schedule& sched, std::string* out) {
  RETURN_IF_ERROR(Sizes(out));
  const int block = sched.block, vector = sched.vector;
  if (vector > 1) RETURN_IF_ERROR(DeclareVectors(vector, sched.vector_dim, {}, out));
  const std::string step = vector > 1 ? absl::StrCat(" * ", vector) : "";
  absl::StrAppend(out, "  const ", idx_, " total = outer_n * inner_n;\n");
  if (k_.reversed) {
    // Chunks of block * vector elements, the last first (loop::Kernel::reversed).
    const int64_t chunk = int64_t{block} * vector;
    absl::StrAppend(out, "  const ", idx_, " chunks = (total + ", chunk - 1, ") / ", chunk, ";\n",
                    "  for (", idx_, " c = blockIdx.x; c < chunks; c += gridDim.x) {\n",
                    "    const ", idx_, " x = ((chunks - 1 - c) * ", block, " + threadIdx.x)", step,
                    ";\n    if (x >= total) continue;\n");
  } else if (sched.chunks > 1) {
    return EmitPointwiseChunks(sched, out);
  } else {
    absl::StrAppend(out, "  for (", idx_, " x = (static_cast<", idx_, ">(blockIdx.x) * ", block,
                    " + threadIdx.x)", step, "; x < total;\n       x += static_cast<", idx_,
                    ">(gridDim.x) * ", block, step, ") {\n");
  }
  if (!sched.order.empty()) {
    // Consecutive threads take consecutive elements of the output.
    std::vector<ir::SymInt> sizes;
    std::vector<std::string> names;
    const int n_outer = static_cast<int>(k_.outer.size());
    for (int d : sched.order) {
      sizes.push_back(d < n_outer ? k_.outer[d] : k_.inner[d - n_outer]);
      names.push_back(d < n_outer ? absl::StrCat("o", d) : absl::StrCat("i", d - n_outer));
    }
    RETURN_IF_ERROR(Decompose(sizes, names, "x", 2, out));
  } else {
    absl::StrAppend(out, "    const ", idx_, " o = x / inner_n;\n", "    const ", idx_,
                    " i = x - o * inner_n;\n");
    RETURN_IF_ERROR(Decompose(k_.outer, "o", "o", 2, out));
    RETURN_IF_ERROR(Decompose(k_.inner, "i", "i", 2, out));
  }
  std::vector<int> all(k_.stmts.size());
  for (size_t j = 0; j < all.size(); ++j) all[j] = static_cast<int>(j);
  int depth = 2;
  std::string first = "i == 0";
  if (vector > 1) {
    RETURN_IF_ERROR(VectorAccesses(all, StmtKind::kLoad, vector, depth, out));
    DeclareStoreChunks(all, vector, depth, out);
    absl::StrAppend(out, "#pragma unroll\n    for (int v = 0; v < ", vector, "; ++v) {\n");
    depth = 3;
    first = "i == 0 && v == 0";
  }
  for (int j : all) {
    ASSIGN_OR_RETURN(std::string line, Statement(j, first));
    absl::StrAppend(out, Pad(depth), line, "\n");
  }
  if (vector > 1) {
    absl::StrAppend(out, "    }\n");
    RETURN_IF_ERROR(VectorAccesses(all, StmtKind::kStore, vector, 2, out));
  }
  absl::StrAppend(out, "  }\n");
  return absl::OkStatus();
}

absl::Status CudaKernelEmitter::EmitPointwiseChunks(const Schedule& sched, std::string* out) {
  const int block = sched.block, vector = sched.vector, chunks = sched.chunks;
  const int64_t stride = int64_t{block} * vector;  // between a thread's chunks
  const std::string first = absl::StrCat("(static_cast<", idx_, ">(blockIdx.x) * ", block * chunks,
                                         " + threadIdx.x) * ", vector);
  if (GridCoversSpace(k_)) {
    // The grid covers the space: one step a thread, no loop (on an H200,
    // the bfloat16 chain over [8192, 8192] took 110.1 us so, 117.1 us as a
    // grid-stride loop that runs once).
    absl::StrAppend(out, "  {\n    const ", idx_, " x0 = ", first,
                    ";\n    if (x0 >= total) return;\n");
  } else {
    // The step stops at `total` rather than past it: a 32-bit index of a
    // space near 2^30 elements stays in range.
    absl::StrAppend(out, "  const ", idx_, " step = static_cast<", idx_, ">(gridDim.x) * ",
                    stride * chunks, ";\n  for (", idx_, " x0 = ", first,
                    "; x0 < total;\n       x0 = total - x0 > step ? x0 + step : total) {\n");
  }
  std::vector<int> all(k_.stmts.size());
  for (size_t j = 0; j < all.size(); ++j) all[j] = static_cast<int>(j);
  // Every chunk's loads first, then each chunk's math and stores.
  std::vector<int> loads;
  for (int j : all) {
    const Stmt& s = k_.stmts[j];
    if (s.kind != StmtKind::kLoad || vectorized_.count(j) == 0) continue;
    loads.push_back(j);
    absl::StrAppend(out, "    alignas(16) ", StorageName(k_.buffers[s.buffer].dtype), " g", j, "[",
                    chunks, "][", vector, "];\n");
  }
  auto chunk = [&]() -> absl::Status {
    absl::StrAppend(out, "#pragma unroll\n    for (int u = 0; u < ", chunks, "; ++u) {\n",
                    "      const ", idx_, " x = x0 + u * ", stride, ";\n",
                    "      if (x >= total) break;\n      const ", idx_, " o = x / inner_n;\n",
                    "      const ", idx_, " i = x - o * inner_n;\n");
    RETURN_IF_ERROR(Decompose(k_.outer, "o", "o", 3, out));
    return Decompose(k_.inner, "i", "i", 3, out);
  };
  RETURN_IF_ERROR(chunk());
  for (int j : loads) {
    ASSIGN_OR_RETURN(std::string addr, Access(j));
    absl::StrAppend(out, Pad(3), "kiln_vload<", vector, ">(g", j, "[u], &", addr, ", aligned);\n");
  }
  absl::StrAppend(out, "    }\n");
  RETURN_IF_ERROR(chunk());
  for (int j : loads) absl::StrAppend(out, Pad(3), "const auto& v", j, " = g", j, "[u];\n");
  DeclareStoreChunks(all, vector, 3, out);
  absl::StrAppend(out, "#pragma unroll\n      for (int v = 0; v < ", vector, "; ++v) {\n");
  for (int j : all) {
    ASSIGN_OR_RETURN(std::string line, Statement(j, "i == 0 && v == 0"));
    absl::StrAppend(out, Pad(4), line, "\n");
  }
  absl::StrAppend(out, "      }\n");
  RETURN_IF_ERROR(VectorAccesses(all, StmtKind::kStore, vector, 3, out));
  absl::StrAppend(out, "    }\n  }\n");
  return absl::OkStatus();
}

bool CudaKernelEmitter::StoresSixteenBitFloats(const Kernel& k) {
  bool any = false;
  for (const Stmt& s : k.stmts) {
    // A sum across rows counts as a store: its partials are added up and
    // stored by another kernel.
    if (s.kind != StmtKind::kStore && s.kind != StmtKind::kAccumulate) continue;
    const v1::DType dtype = k.buffers[s.buffer].dtype;
    if (dtype != v1::FLOAT16 && dtype != v1::BFLOAT16) return false;
    any = true;
  }
  return any;
}

std::string CudaKernelEmitter::LaunchBounds(const Schedule& sched) const {
  if (k_.row_groups > 0) {
    return absl::StrCat(sched.block, ", ", std::max(1, kRowGroupThreadsPerSm / sched.block));
  }
  if (!FillsSms(sched) || cached_values_ > 16) return absl::StrCat(sched.block);
  return absl::StrCat(sched.block, ", ", kThreadsPerSm / sched.block);
}

}  // namespace kiln::codegen::cuda_internal
