// The CUDA backend: loop::Kernels -> one CUDA C++ translation unit -> a CUBIN
// built by NVRTC (in the kiln_nvrtc helper process) for one SM arch. How a
// kernel maps onto threads (layout, block size, register caching, vector
// width, 32-bit indices, launch size) is decided in cuda_schedule.h; this
// file writes it.
//
// Shape of the generated kernels:
//   - Without reductions, a grid-stride loop over the flattened space, each
//     thread one element (or one 16-byte chunk):
//
//       struct kernel_0_args { void* b[3]; int64_t s[1]; };
//       extern "C" __global__ void __launch_bounds__(256) kernel_0(const kernel_0_args a) {
//         const int64_t s0 = a.s[0];
//         const float* __restrict__ buf0 = static_cast<const float*>(a.b[0]);  // x
//         ...
//         for (int64_t x = ...; x < outer_n * inner_n; x += gridDim.x * 256) {
//           const int64_t o = x / inner_n, i = x - o * inner_n;
//           loads, scalar ops, stores
//         }
//       }
//
//   - With reductions, one block per row (grid-stride over rows), or 32
//     rows per block in the column layout (several groups of 32 where the
//     schedule says so): each pass sweeps the row with the threads, every
//     thread keeping its own accumulators; they are then combined (warp
//     shuffles, then one value per warp through shared memory) so that
//     every thread holds the row's result for the statements after the
//     sweep, whose stores one thread makes. Welford's mean and M2 merge by
//     Chan's formula, per element or, in a sweep by vectors, per chunk.
//
// Values compute as on the CPU (c_family.h): float16 and bfloat16 in float32,
// stored as 16-bit patterns; sums accumulate in the compute type per thread
// and then in a tree. A kernel whose every store is 16-bit is generated
// inside namespace kiln_fast, whose exp and division are the hardware's
// approximations (the CUDA prelude says how close).
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "compiler/codegen/c_family.h"
#include "compiler/codegen/codegen.h"
#include "compiler/codegen/cuda_prelude.h"
#include "compiler/codegen/cuda_schedule.h"
#include "compiler/codegen/toolchain.h"

namespace kiln::codegen {
namespace {

using loop::Kernel;
using loop::ReduceOp;
using loop::Stmt;
using loop::StmtKind;

class CudaKernelEmitter {
 public:
  CudaKernelEmitter(const Kernel& kernel, const SymbolTable& symbols)
      : k_(kernel), symbols_(symbols) {}

  absl::StatusOr<std::string> Emit() {
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
      const std::string type =
          buf.written ? absl::StrCat(StorageName(buf.dtype), "*")
                      : absl::StrCat("const ", StorageName(buf.dtype), "* __restrict__");
      const std::string cast =
          absl::StrCat(buf.written ? "" : "const ", StorageName(buf.dtype), "*");
      absl::StrAppend(&out, "  ", type, " buf", b, " = static_cast<", cast, ">(a.b[", b, "]);  // ",
                      CommentText(buf.value), "\n");
    }
    for (const std::string& decl : ints_.hoisted()) absl::StrAppend(&out, "  ", decl, "\n");
    absl::StrAppend(&out, body, "}\n", fast ? "\n}  // namespace kiln_fast\n" : "");
    return out;
  }

 private:
  static std::string Pad(int depth) { return std::string(2 * depth, ' '); }
  std::string Val(int a) const { return absl::StrCat("t", a); }

  absl::StatusOr<std::string> Int(const ir::SymInt& s) { return ints_.Int(s); }
  absl::StatusOr<std::string> Product(const std::vector<ir::SymInt>& sizes, size_t from) {
    return ints_.Product(sizes, from);
  }

  // Lines defining <prefix><k> for each dimension of `sizes` from the flat
  // index `flat` (row-major).
  absl::Status Decompose(const std::vector<ir::SymInt>& sizes, const std::string& flat,
                         const std::string& prefix, int depth, std::string* out) {
    std::vector<std::string> names;
    for (size_t k = 0; k < sizes.size(); ++k) names.push_back(absl::StrCat(prefix, k));
    return Decompose(sizes, names, flat, depth, out);
  }
  // The same with a name per dimension.
  absl::Status Decompose(const std::vector<ir::SymInt>& sizes,
                         const std::vector<std::string>& names, const std::string& flat, int depth,
                         std::string* out) {
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

  // The element address of access j.
  absl::StatusOr<std::string> Access(int j) {
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
    return absl::StrCat("buf", s.buffer, "[", terms.empty() ? "0" : absl::StrJoin(terms, " + "),
                        "]");
  }

  // Statement j (not a reduction) as a line. Outer-level stores are made by
  // one thread: `guard` is the condition. With `live`, loads and stores are
  // made only where it holds (loads read 0 elsewhere).
  absl::StatusOr<std::string> Statement(int j, const std::string& guard,
                                        const std::string& live = "") {
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
      case StmtKind::kConstant:
        return absl::StrCat("const ", T, " t", j, " = ",
                            Literal(s.constant, type_[j], kCudaDialect), ";");
      case StmtKind::kOp: {
        ASSIGN_OR_RETURN(std::string e, ScalarOpExpr(k_, type_, j, *dialect_));
        return absl::StrCat("const ", T, " t", j, " = ", e, ";");
      }
      case StmtKind::kStore: {
        const int a = s.args[0];
        if (vectorized_.count(j) > 0) {
          return absl::StrCat(
              "v", j, "[v] = ", ToStorage(k_.buffers[s.buffer].dtype, type_[a], Val(a)), ";");
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
        break;
    }
    return StmtError(k_, j, "internal: a reduction is not a plain statement");
  }

  absl::Status Sizes(std::string* out) {
    ASSIGN_OR_RETURN(std::string outer_n, Product(k_.outer, 0));
    ASSIGN_OR_RETURN(std::string inner_n, Product(k_.inner, 0));
    absl::StrAppend(out, "  const ", idx_, " outer_n = ", outer_n, ";\n");
    absl::StrAppend(out, "  const ", idx_, " inner_n = ", inner_n, ";\n");
    return absl::OkStatus();
  }

  // The flag that every vectorized buffer is aligned to its chunk, and every
  // value of `checks` divides by the vector width (kernels fall back to
  // element accesses otherwise), and the accesses vectorized.
  absl::Status DeclareVectors(int vector, int dim, const std::vector<ir::SymInt>& checks,
                              std::string* out) {
    std::vector<std::string> masks;
    std::set<int> buffers;
    for (size_t j = 0; j < k_.stmts.size(); ++j) {
      if (!MovesAlong(k_, k_.stmts[j], dim)) continue;
      vectorized_.insert(static_cast<int>(j));
      buffers.insert(k_.stmts[j].buffer);
    }
    for (int b : buffers) {
      masks.push_back(absl::StrCat("(reinterpret_cast<uint64_t>(buf", b, ") & ",
                                   vector * StorageBytes(k_.buffers[b].dtype) - 1, ")"));
    }
    for (const ir::SymInt& c : checks) {
      ASSIGN_OR_RETURN(std::string text, Int(c));
      masks.push_back(absl::StrCat("((", text, ") % ", vector, ")"));
    }
    absl::StrAppend(out, "  const bool aligned = (", absl::StrJoin(masks, " | "), ") == 0;\n");
    return absl::OkStatus();
  }

  // Chunk arrays and vector loads of the vectorized loads among `stmts`
  // (before the element loop), or vector stores (after it).
  absl::Status VectorAccesses(const std::vector<int>& stmts, StmtKind kind, int vector, int depth,
                              std::string* out) {
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

  void DeclareStoreChunks(const std::vector<int>& stmts, int vector, int depth, std::string* out) {
    for (int j : stmts) {
      const Stmt& s = k_.stmts[j];
      if (s.kind != StmtKind::kStore || vectorized_.count(j) == 0) continue;
      absl::StrAppend(out, Pad(depth), "alignas(16) ", StorageName(k_.buffers[s.buffer].dtype),
                      " v", j, "[", vector, "];\n");
    }
  }

  absl::Status EmitPointwise(const Schedule& sched, std::string* out) {
    RETURN_IF_ERROR(Sizes(out));
    const int block = sched.block, vector = sched.vector;
    if (vector > 1) RETURN_IF_ERROR(DeclareVectors(vector, sched.vector_dim, {}, out));
    const std::string step = vector > 1 ? absl::StrCat(" * ", vector) : "";
    absl::StrAppend(out, "  const ", idx_, " total = outer_n * inner_n;\n", "  for (", idx_,
                    " x = (static_cast<", idx_, ">(blockIdx.x) * ", block, " + threadIdx.x)", step,
                    "; x < total;\n       x += static_cast<", idx_, ">(gridDim.x) * ", block, step,
                    ") {\n");
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

  int WelfordId(int j) const { return codegen::WelfordId(k_, j); }

  std::string Identity(int j) const {
    const CType t = type_[j];
    switch (k_.stmts[j].reduce) {
      case ReduceOp::kMax:
        return IsFloat(t) ? absl::StrCat("-", Limit(t, "infinity", kCudaDialect))
                          : Limit(t, "lowest", kCudaDialect);
      case ReduceOp::kMin:
        return IsFloat(t) ? Limit(t, "infinity", kCudaDialect) : Limit(t, "max", kCudaDialect);
      default:
        return absl::StrCat(CName(t), "(0)");
    }
  }
  static const char* Combiner(ReduceOp op) {
    return op == ReduceOp::kMax ? "kiln_max()" : op == ReduceOp::kMin ? "kiln_min()" : "kiln_add()";
  }

  // Whether every store of `k` is into a float16 or bfloat16 buffer (an
  // integer or bool result, exact, could flip on an approximation).
  static bool StoresSixteenBitFloats(const Kernel& k) {
    bool any = false;
    for (const Stmt& s : k.stmts) {
      if (s.kind != StmtKind::kStore) continue;
      const v1::DType dtype = k.buffers[s.buffer].dtype;
      if (dtype != v1::FLOAT16 && dtype != v1::BFLOAT16) return false;
      any = true;
    }
    return any;
  }

  static bool Costly(loop::ScalarOp op) {
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
      case ScalarOp::kGelu:
      case ScalarOp::kGeluTanh:
      case ScalarOp::kSilu:
      case ScalarOp::kSqrt:
      case ScalarOp::kRsqrt:
      case ScalarOp::kReciprocal:
      case ScalarOp::kDiv:
      case ScalarOp::kPow:
        return true;
      default:
        return false;
    }
  }

  // Whether load statements a and b read the same element as the same type.
  bool SameLoad(int a, int b) const {
    const Stmt& x = k_.stmts[a];
    const Stmt& y = k_.stmts[b];
    return x.buffer == y.buffer && type_[a] == type_[b] &&
           x.index.outer_strides == y.index.outer_strides &&
           x.index.inner_strides == y.index.inner_strides && x.index.offset == y.index.offset;
  }

  absl::Status EmitReduction(const Schedule& sched, std::string* out) {
    RETURN_IF_ERROR(Sizes(out));
    const bool column = sched.layout == Layout::kColumn;
    const bool cached = sched.per_thread > 0;
    // Shared memory for the combination of one value per warp (kRow) or
    // 32 x 32 values (kColumn, padded), three for Welford.
    absl::StrAppend(out, "  __shared__ double kiln_smem[", column ? 3 * 32 * 33 : 96, "];\n");
    if (sched.vector > 1) {
      RETURN_IF_ERROR(DeclareVectors(sched.vector, sched.vector_dim, sched.vector_checks, out));
    }
    std::string live;
    // kColumn in groups: each lane takes one row of each of `groups` groups
    // of 32 rows, its accumulators arrays indexed by the group g (`at`);
    // packed, `groups` adjacent rows, read as vectors.
    const int groups = column ? sched.column_groups : 1;
    const bool packed = groups > 1 && sched.column_packed;
    const std::string at = groups > 1 ? "[g]" : "";
    // The first row of the lane's chunk (packed), or the row of group g,
    // and whether it exists, at `depth`.
    auto group_row = [&](int depth, bool chunk = false) -> absl::Status {
      const std::string row =
          packed ? absl::StrCat("(threadIdx.x & 31) * ", groups, chunk ? "" : " + g")
                 : "g * 32 + (threadIdx.x & 31)";
      absl::StrAppend(out, Pad(depth), "const ", idx_, " o = tile * ", 32 * groups, " + ", row,
                      ";\n", Pad(depth), "const bool live = o < outer_n;\n");
      return Decompose(k_.outer, "o", "o", depth, out);
    };
    if (packed) {
      RETURN_IF_ERROR(DeclareVectors(groups, static_cast<int>(k_.outer.size()) - 1, {}, out));
    }
    if (groups > 1) {
      absl::StrAppend(out, "  const int lane = threadIdx.x >> 5;  // along the rows\n", "  for (",
                      idx_, " tile = blockIdx.x; tile * ", 32 * groups,
                      " < outer_n; tile += gridDim.x) {\n");
    } else if (column) {
      absl::StrAppend(out, "  const int lane = threadIdx.x >> 5;  // along the rows\n", "  for (",
                      idx_, " tile = blockIdx.x; tile * 32 < outer_n; tile += gridDim.x) {\n",
                      "    const ", idx_, " o = tile * 32 + (threadIdx.x & 31);\n",
                      "    const bool live = o < outer_n;\n");
      live = "live";
    } else {
      absl::StrAppend(out, "  const int lane = threadIdx.x;\n", "  for (", idx_,
                      " o = blockIdx.x; o < outer_n; o += gridDim.x) {\n");
    }
    if (groups == 1) RETURN_IF_ERROR(Decompose(k_.outer, "o", "o", 2, out));
    const std::string store_guard = column ? "lane == 0" : "threadIdx.x == 0";
    const int lanes = column ? kColumnRows : sched.block;
    const int n = static_cast<int>(k_.stmts.size());
    // A statement of a later pass -> the earlier pass's statement whose
    // registers it reads: loads a later pass repeats, and the ops it repeats
    // whose values it uses for something new (softmax's exp, computed in the
    // pass that sums it, is read back in the pass that divides it).
    std::vector<int> cache_of(n, -1);
    if (cached) {
      // The first statement of the sweeps that computes the value j does.
      std::vector<int> same(n);
      for (int j = 0; j < n; ++j) {
        same[j] = j;
        const Stmt& s = k_.stmts[j];
        if (!s.inner || s.kind == StmtKind::kReduce || s.kind == StmtKind::kStore) continue;
        if (s.kind == StmtKind::kOp && s.op == loop::ScalarOp::kCast &&
            type_[s.args[0]] == type_[j] && same[s.args[0]] != s.args[0]) {
          same[j] = same[s.args[0]];  // a copy of a repeated value is that value
          continue;
        }
        for (int q = 0; q < j; ++q) {
          const Stmt& t = k_.stmts[q];
          if (same[q] != q || !t.inner || t.kind != s.kind || type_[q] != type_[j]) continue;
          bool equal = false;
          if (s.kind == StmtKind::kLoad) {
            equal = SameLoad(q, j);
          } else if (s.kind == StmtKind::kConstant) {
            equal = t.constant == s.constant;
          } else {
            equal = t.op == s.op && t.dtype == s.dtype && t.args.size() == s.args.size();
            for (size_t a = 0; equal && a < s.args.size(); ++a) {
              equal = same[t.args[a]] == same[s.args[a]];
            }
          }
          if (equal) {
            same[j] = q;
            break;
          }
        }
      }
      // Whether an op's value takes a transcendental function or a division
      // to compute: worth registers across passes (an add is not).
      std::vector<bool> costly(n, false);
      for (int j = 0; j < n; ++j) {
        const Stmt& s = k_.stmts[j];
        if (s.kind != StmtKind::kOp || !s.inner) continue;
        costly[j] = Costly(s.op);
        for (int a : s.args) costly[j] = costly[j] || costly[a];
      }
      for (int j = 0; j < n; ++j) {
        const Stmt& s = k_.stmts[j];
        const int q = same[j];
        if (q == j || k_.stmts[q].pass >= s.pass) continue;
        if (s.kind != StmtKind::kLoad && !(s.kind == StmtKind::kOp && costly[q])) continue;
        bool needed = s.kind == StmtKind::kLoad;
        for (int u = j + 1; u < n && !needed; ++u) {
          const std::vector<int>& args = k_.stmts[u].args;
          needed = same[u] == u && std::find(args.begin(), args.end(), j) != args.end();
        }
        if (needed) cache_of[j] = q;
      }
    }
    for (int p = 0; p < k_.passes; ++p) {
      std::vector<int> before, inner, after;
      for (int j = 0; j < n; ++j) {
        const Stmt& s = k_.stmts[j];
        if (s.pass != p) continue;
        (s.inner ? inner : after_[j] ? after : before).push_back(j);
      }
      absl::StrAppend(out, "    // pass ", p, "\n");
      for (int j : before) {
        ASSIGN_OR_RETURN(std::string line, Statement(j, store_guard, live));
        absl::StrAppend(out, "    ", line, "\n");
      }
      if (inner.empty()) {
        for (int j : after) {
          ASSIGN_OR_RETURN(std::string line, Statement(j, store_guard, live));
          absl::StrAppend(out, "    ", line, "\n");
        }
        continue;
      }
      // What a later pass reads again is kept: registers c<j>[e].
      std::vector<int> keep;
      if (cached) {
        for (int j : inner) {
          if (cache_of[j] >= 0) continue;
          if (std::find(cache_of.begin(), cache_of.end(), j) != cache_of.end()) keep.push_back(j);
        }
        for (int j : keep) {
          absl::StrAppend(out, "    ", CName(type_[j]), " c", j, "[", sched.per_thread, "];\n");
          cached_values_ += sched.per_thread;
        }
      }
      for (int j : inner) {
        const Stmt& s = k_.stmts[j];
        if (s.kind != StmtKind::kReduce) continue;
        const char* T = CName(type_[j]);
        if (groups > 1) {
          const std::string each = absl::StrCat(
              "[", groups, "] = {",
              absl::StrJoin(
                  std::vector<std::string>(groups, IsWelford(s) ? std::string("0") : Identity(j)),
                  ", "),
              "}");
          if (!IsWelford(s)) {
            absl::StrAppend(out, "    ", T, " acc", j, each, ";\n");
          } else if (WelfordId(j) == j) {
            absl::StrAppend(out, "    ", T, " wm", j, each, ", wq", j, each, ", wn", j, each,
                            ";  // mean, M2, count\n");
          }
        } else if (IsWelford(s)) {
          if (WelfordId(j) == j) {
            absl::StrAppend(out, "    ", T, " wm", j, " = 0, wq", j, " = 0, wn", j,
                            " = 0;  // mean, M2, count\n");
          }
        } else {
          absl::StrAppend(out, "    ", T, " acc", j, " = ", Identity(j), ";\n");
        }
      }
      const int vector = sched.vector;
      std::vector<int> fresh;  // the sweep's statements that are not read from registers
      for (int j : inner) {
        if (cache_of[j] < 0) fresh.push_back(j);
      }
      int depth = 4;
      // In a sweep by vectors, Welford's inputs of a chunk are gathered
      // (wx<j>[v]) and the chunk's mean and M2 merged into the thread's once
      // per chunk: one division per chunk rather than per element.
      std::vector<int> welford;
      for (int j : inner) {
        if (IsWelford(k_.stmts[j]) && WelfordId(j) == j) welford.push_back(j);
      }
      auto gather_welford = [&]() {
        for (int j : welford) {
          absl::StrAppend(out, Pad(4), CName(type_[j]), " wx", j, "[", vector, "];\n");
        }
      };
      if (cached && vector > 1) {
        absl::StrAppend(out, "#pragma unroll\n    for (int ec = 0; ec < ",
                        sched.per_thread / vector, "; ++ec) {\n      const ", idx_,
                        " i = (lane + ec * ", lanes, ") * ", vector,
                        ";\n      if (i < inner_n) {\n");
        RETURN_IF_ERROR(Decompose(k_.inner, "i", "i", 4, out));
        RETURN_IF_ERROR(VectorAccesses(fresh, StmtKind::kLoad, vector, 4, out));
        DeclareStoreChunks(fresh, vector, 4, out);
        gather_welford();
        absl::StrAppend(out, "#pragma unroll\n        for (int v = 0; v < ", vector,
                        "; ++v) {\n          const int e = ec * ", vector, " + v;\n");
        depth = 5;
      } else if (cached) {
        absl::StrAppend(out, "#pragma unroll\n    for (int e = 0; e < ", sched.per_thread,
                        "; ++e) {\n      const ", idx_, " i = lane + e * ", lanes, ";\n",
                        "      if (i < inner_n) {\n");
        RETURN_IF_ERROR(Decompose(k_.inner, "i", "i", 4, out));
      } else if (vector > 1) {
        absl::StrAppend(out, "#pragma unroll 4\n    for (", idx_, " ch = lane; ch < inner_n / ",
                        vector, "; ch += ", lanes, ") {\n      const ", idx_, " i = ch * ", vector,
                        ";\n      {\n");
        RETURN_IF_ERROR(Decompose(k_.inner, "i", "i", 4, out));
        RETURN_IF_ERROR(VectorAccesses(fresh, StmtKind::kLoad, vector, 4, out));
        DeclareStoreChunks(fresh, vector, 4, out);
        gather_welford();
        absl::StrAppend(out, "#pragma unroll\n        for (int v = 0; v < ", vector, "; ++v) {\n");
        depth = 5;
      } else if (groups > 1) {
        // Every group's element of the step's row: 512 adjacent bytes.
        // Packed, steps unrolled to about four vector loads per lane in
        // flight (64 bytes, as four unrolled steps of scalars were): a sum
        // over one buffer unrolls 4 steps, a kernel reading two buffers 2,
        // one reading three or more (an RMS norm's weight gradient beside
        // its dx) none: its body, copied for 8 groups and 2 steps, took
        // NVRTC 0.3 s more per module than for 8 groups and 1.
        // The sweep's distinct loads moving along the rows (one of each
        // set of loads of the same element), read as vectors when packed.
        std::vector<int> chunked;
        for (int j : fresh) {
          if (!packed || k_.stmts[j].kind != StmtKind::kLoad || vectorized_.count(j) == 0) continue;
          if (std::none_of(chunked.begin(), chunked.end(), [&](int q) { return SameLoad(q, j); })) {
            chunked.push_back(j);
          }
        }
        const int unroll = packed ? std::clamp(4 / std::max<int>(1, chunked.size()), 1, 4) : 4;
        absl::StrAppend(out, "#pragma unroll ", unroll, "\n    for (", idx_,
                        " i = lane; i < inner_n; i += ", lanes, ") {\n      {\n");
        RETURN_IF_ERROR(Decompose(k_.inner, "i", "i", 4, out));
        if (packed) {
          // The lane's chunk of each load moving along the rows, as one
          // vector; a chunk is wholly live or not (rows divide into them).
          // The stores moving along them gather each chunk and write it
          // after the groups.
          RETURN_IF_ERROR(group_row(4, true));
          for (int j : fresh) {
            const Stmt& s = k_.stmts[j];
            if (vectorized_.count(j) == 0) continue;
            if (s.kind == StmtKind::kLoad) {
              const int q = *std::find_if(chunked.begin(), chunked.end(),
                                          [&](int c) { return SameLoad(c, j); });
              if (q != j) {
                absl::StrAppend(out, Pad(4), "const auto& v", j, " = v", q, ";\n");
                continue;
              }
            }
            absl::StrAppend(out, Pad(4), "alignas(16) ", StorageName(k_.buffers[s.buffer].dtype),
                            " v", j, "[", groups, "];\n");
            if (s.kind != StmtKind::kLoad) continue;
            ASSIGN_OR_RETURN(std::string addr, Access(j));
            absl::StrAppend(out, Pad(4), "if (live) kiln_vload<", groups, ">(v", j, ", &", addr,
                            ", aligned);\n");
          }
        }
        absl::StrAppend(out, "#pragma unroll\n        for (int g = 0; g < ", groups, "; ++g) {\n");
        if (packed) {
          absl::StrAppend(out, "          const int v = g;  // the element of each chunk\n");
        }
        RETURN_IF_ERROR(group_row(5));
        live = "live";
        depth = 5;
      } else {
        // Unrolled: several rows' loads in flight per thread (a column
        // sweep reads one element per row).
        absl::StrAppend(out, "#pragma unroll 4\n    for (", idx_, " i = lane; ",
                        column ? "live && " : "", "i < inner_n; i += ", lanes, ") {\n      {\n");
        RETURN_IF_ERROR(Decompose(k_.inner, "i", "i", 4, out));
      }
      // The sweep's statements for one element (at `depth`).
      auto body = [&](int depth, bool chunk) -> absl::Status {
        const std::string pad = Pad(depth);
        for (int j : inner) {
          const Stmt& s = k_.stmts[j];
          if (s.kind != StmtKind::kReduce) {
            if (cache_of[j] >= 0) {
              absl::StrAppend(out, pad, "const ", CName(type_[j]), " t", j, " = c", cache_of[j],
                              "[e];\n");
              continue;
            }
            ASSIGN_OR_RETURN(std::string line, Statement(j, "", live));
            absl::StrAppend(out, pad, line, "\n");
            if (std::find(keep.begin(), keep.end(), j) != keep.end()) {
              absl::StrAppend(out, pad, "c", j, "[e] = t", j, ";\n");
            }
            continue;
          }
          const std::string v = CastValue(type_, s.args[0], type_[j]);
          if (IsWelford(s)) {
            if (WelfordId(j) != j) continue;
            const char* T = CName(type_[j]);
            if (chunk) {
              absl::StrAppend(out, pad, "wx", j, "[v] = ", v, ";\n");
              continue;
            }
            absl::StrAppend(out, pad, "{ wn", j, at, " += ", T, "(1); const ", T, " d = ", v,
                            " - wm", j, at, "; wm", j, at, " += d / wn", j, at, "; wq", j, at,
                            " += d * (", v, " - wm", j, at, "); }\n");
          } else {
            absl::StrAppend(out, pad, "acc", j, at, " = ", Combiner(s.reduce), "(acc", j, at, ", ",
                            v, ");\n");
          }
        }
        return absl::OkStatus();
      };
      RETURN_IF_ERROR(body(depth, vector > 1));
      if (vector > 1 || groups > 1) absl::StrAppend(out, "        }\n");
      if (packed) {
        for (int j : fresh) {
          const Stmt& s = k_.stmts[j];
          if (s.kind != StmtKind::kStore || vectorized_.count(j) == 0) continue;
          ASSIGN_OR_RETURN(std::string addr, Access(j));
          absl::StrAppend(out, Pad(4), "if (live) kiln_vstore<", groups, ">(&", addr, ", v", j,
                          ", aligned);\n");
        }
      }
      if (vector > 1) {
        for (int j : welford) {
          const char* T = CName(type_[j]);
          absl::StrAppend(out, Pad(4), "{\n", Pad(5), T, " s = 0, q = 0;\n", "#pragma unroll\n",
                          Pad(5), "for (int v = 0; v < ", vector, "; ++v) s += wx", j, "[v];\n",
                          Pad(5), "const ", T, " m = s / ", T, "(", vector, ");\n",
                          "#pragma unroll\n", Pad(5), "for (int v = 0; v < ", vector,
                          "; ++v) q += (wx", j, "[v] - m) * (wx", j, "[v] - m);\n", Pad(5),
                          "kiln_welford_merge(wm", j, ", wq", j, ", wn", j, ", m, q, ", T, "(",
                          vector, "));\n", Pad(4), "}\n");
        }
      }
      if (vector > 1) RETURN_IF_ERROR(VectorAccesses(fresh, StmtKind::kStore, vector, 4, out));
      absl::StrAppend(out, "      }\n    }\n");
      if (sched.vector_tail) {
        // A row of symbolic length: its last inner_n % vector elements one
        // by one.
        const std::set<int> chunked = vectorized_;
        vectorized_.clear();
        absl::StrAppend(out, "    for (", idx_, " i = inner_n / ", vector, " * ", vector,
                        " + lane; i < inner_n; i += ", lanes, ") {\n      {\n");
        RETURN_IF_ERROR(Decompose(k_.inner, "i", "i", 4, out));
        RETURN_IF_ERROR(body(4, false));
        absl::StrAppend(out, "      }\n    }\n");
        vectorized_ = chunked;
      }
      // The combination and the epilogue, for each group in turn.
      std::string pad = "    ";
      if (groups > 1) {
        absl::StrAppend(out, "#pragma unroll\n    for (int g = 0; g < ", groups, "; ++g) {\n");
        RETURN_IF_ERROR(group_row(3));
        pad = "      ";
      }
      for (int j : inner) {
        const Stmt& s = k_.stmts[j];
        if (s.kind != StmtKind::kReduce) continue;
        const char* T = CName(type_[j]);
        if (IsWelford(s)) {
          const int w = WelfordId(j);
          if (w == j) {
            absl::StrAppend(out, pad, column ? "kiln_column_welford" : "kiln_block_welford", "(wm",
                            j, at, ", wq", j, at, ", wn", j, at, ", kiln_smem);\n");
          }
          absl::StrAppend(out, pad, "const ", T, " t", j, " = ",
                          s.reduce == ReduceOp::kWelfordMean ? "wm" : "wq", w, at, ";\n");
        } else if (column) {
          absl::StrAppend(out, pad, "const ", T, " t", j, " = kiln_column_reduce(acc", j, at, ", ",
                          Combiner(s.reduce), ", kiln_smem);\n");
        } else {
          absl::StrAppend(out, pad, "const ", T, " t", j, " = kiln_block_reduce(acc", j, ", ",
                          Combiner(s.reduce), ", ", T, "(", Identity(j), "), kiln_smem);\n");
        }
      }
      for (int j : after) {
        ASSIGN_OR_RETURN(std::string line, Statement(j, store_guard, live));
        absl::StrAppend(out, pad, line, "\n");
      }
      if (groups > 1) absl::StrAppend(out, "    }\n");
    }
    absl::StrAppend(out, "  }\n");
    return absl::OkStatus();
  }

  // __launch_bounds__'s arguments: the block size, and for a row kept in
  // registers at up to 8 elements per thread, in at most 16 registers, as
  // many blocks as fill an SM's 2048 threads, which caps registers at 32
  // per thread. Such a row then fits with a few bytes spilled at most
  // (float32 softmax on an H100: 8 bytes, and 188 us against 206 us
  // uncapped at 38 registers and three quarters occupancy); 16 elements
  // per thread would spill far more (bfloat16 layer norm: 56 bytes, 23%
  // slower).
  std::string LaunchBounds(const Schedule& sched) const {
    constexpr int kThreadsPerSm = 2048;
    if (sched.per_thread == 0 || sched.per_thread > 8 || cached_values_ > 16 ||
        kThreadsPerSm % sched.block != 0) {
      return absl::StrCat(sched.block);
    }
    return absl::StrCat(sched.block, ", ", kThreadsPerSm / sched.block);
  }

  const Kernel& k_;
  int cached_values_ = 0;  // registers per thread of the row kept across passes
  const SymbolTable& symbols_;
  std::vector<CType> type_;
  std::vector<bool> after_;
  std::set<int> vectorized_;     // accesses read or written as chunks of the vector width
  std::string idx_ = "int64_t";  // the type of indices: int32_t where IndexesFitInt32
  IntExprs ints_{k_, symbols_, kCudaDialect};
  const Dialect* dialect_ = &kCudaDialect;
};

// The CUDA version ("13.0") of the NVRTC that `helper` runs, asked once per
// helper.
absl::StatusOr<std::string> NvrtcVersion(const std::string& helper, absl::Duration timeout) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* versions = new std::map<std::string, std::string>();
  {
    absl::MutexLock lock(&mu);
    auto it = versions->find(helper);
    if (it != versions->end()) return it->second;
  }
  const std::vector<std::string> argv = {helper, "--version"};
  ASSIGN_OR_RETURN(CommandResult run, RunCommand(argv, timeout, nullptr));
  if (!Succeeded(run)) return CompilerFailed("NVRTC", absl::StrJoin(argv, " "), run);
  const std::string version(absl::StripAsciiWhitespace(run.log));
  absl::MutexLock lock(&mu);
  (*versions)[helper] = version;
  return version;
}

}  // namespace

std::string NvrtcHelper(const std::string& configured) {
  if (!configured.empty()) return configured;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path beside = self.parent_path() / "kiln_nvrtc";
    if (std::filesystem::exists(beside, ec)) return beside.string();
  }
  return KILN_NVRTC_HELPER_BUILD_PATH;
}

CompilerWorkers& NvrtcWorkers(const std::string& helper, const std::string& fast_compile) {
  static absl::Mutex mu(absl::kConstInit);
  // Never destroyed: the workers end with kilnd (their stdin closes).
  static auto* workers =
      new std::map<std::pair<std::string, std::string>, std::unique_ptr<CompilerWorkers>>();
  absl::MutexLock lock(&mu);
  std::unique_ptr<CompilerWorkers>& w = (*workers)[{helper, fast_compile}];
  if (w == nullptr) {
    std::vector<std::string> argv = {helper};
    if (!fast_compile.empty()) argv.push_back(absl::StrCat("--fast-compile=", fast_compile));
    argv.push_back("--serve");
    w = std::make_unique<CompilerWorkers>(std::move(argv), kMaxIdleNvrtcWorkers);
  }
  return *w;
}

namespace {

class CudaBackend : public CodegenBackend {
 public:
  explicit CudaBackend(CudaOptions options) : options_(std::move(options)) {}

  std::string language() const override { return "cuda"; }

  absl::StatusOr<std::string> Generate(const std::vector<loop::Kernel>& kernels,
                                       const std::vector<std::string>& symbols) const override {
    return GenerateUnit(kCudaPrelude, kernels, symbols,
                        [](const Kernel& kernel, const SymbolTable& table) {
                          return CudaKernelEmitter(kernel, table).Emit();
                        });
  }

  absl::StatusOr<v1::CompiledModule> Compile(const std::string& source) const override {
    ASSIGN_OR_RETURN(TempFile src, TempFile::Create(options_.scratch_dir, ".cu"));
    ASSIGN_OR_RETURN(TempFile cubin, TempFile::Create(options_.scratch_dir, ".cubin"));
    RETURN_IF_ERROR(WriteFile(src.path(), source));
    const std::string helper = NvrtcHelper(options_.helper);
    if (!options_.cuda_version.empty()) {
      ASSIGN_OR_RETURN(std::string version, NvrtcVersion(helper, options_.timeout));
      if (version != options_.cuda_version) {
        return absl::FailedPreconditionError(
            absl::StrCat("options.target.cuda_version is ", options_.cuda_version,
                         ", but this server's NVRTC is ", version, ": compile with cuda_version ",
                         version, " or on a server that has ", options_.cuda_version));
      }
    }
    std::vector<std::string> argv = {helper};
    if (!options_.fast_compile.empty()) {
      argv.push_back(absl::StrCat("--fast-compile=", options_.fast_compile));
    }
    for (const std::string& a :
         {absl::StrCat("--arch=", options_.sm_arch), std::string("-o"), cubin.path(), src.path()}) {
      argv.push_back(a);
    }
    const std::string command = absl::StrJoin(argv, " ");
    // A serving helper first; the helper run once when none can serve.
    absl::StatusOr<CommandResult> run = absl::UnavailableError("");
    const std::string request =
        absl::StrCat(options_.sm_arch, "\n", src.path(), "\n", cubin.path(), "\n");
    if (absl::StrContains(options_.sm_arch, '\n') || absl::StrContains(src.path(), '\n') ||
        absl::StrContains(cubin.path(), '\n')) {
      run = absl::UnavailableError("a line break in a path");
    } else {
      run = NvrtcWorkers(helper, options_.fast_compile)
                .Run(request, options_.timeout, options_.cancel);
    }
    if (absl::IsUnavailable(run.status())) {
      run = RunCommand(argv, options_.timeout, options_.cancel);
    }
    if (!run.ok()) return run.status();
    if (!Succeeded(*run)) return CompilerFailed("NVRTC", command, *run);
    ASSIGN_OR_RETURN(std::string binary, ReadFile(cubin.path()));
    v1::CompiledModule module;
    module.set_language(language());
    module.set_source(source);
    module.set_binary(std::move(binary));
    module.set_compile_command(command);
    return module;
  }

  absl::StatusOr<LaunchSize> Launch(const loop::Kernel& kernel) const override {
    return SizeLaunch(kernel);
  }

 private:
  const CudaOptions options_;
};

}  // namespace

std::unique_ptr<CodegenBackend> MakeCudaBackend(const CudaOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

int WarmCudaCompiles(const CudaOptions& options, int helpers) {
  helpers = std::min(helpers, kMaxIdleNvrtcWorkers);  // more would not stay
  const CudaBackend backend(options);
  std::atomic<int> compiled{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < helpers; ++i) {
    threads.emplace_back([&] {
      if (backend.Compile("extern \"C\" __global__ void kiln_warm(float* x) { x[0] = 1.0f; }\n")
              .ok()) {
        ++compiled;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return compiled.load();
}

}  // namespace kiln::codegen
