// The CUDA backend: loop::Kernels -> one CUDA C++ translation unit -> a CUBIN
// built by NVRTC (in the kiln_nvrtc helper process) for one SM arch.
//
// Shape of the generated kernels:
//   - Without reductions, one thread per point of outer x inner, in a
//     grid-stride loop over the flattened space:
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
//   - With reductions, one block per row (grid-stride over rows): each pass
//     sweeps the row with the block's threads, every thread keeping its own
//     accumulators; the block then combines them (warp shuffles, then one
//     value per warp through shared memory) so that every thread holds the
//     row's result for the statements after the sweep, whose stores thread 0
//     makes. Welford's mean and M2 merge by Chan's formula.
//
// Values compute as on the CPU (c_family.h): float16 and bfloat16 in float32,
// stored as 16-bit patterns; sums accumulate in the compute type per thread
// and then in a tree.
#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "compiler/codegen/c_family.h"
#include "compiler/codegen/codegen.h"
#include "compiler/codegen/cuda_prelude.h"
#include "compiler/codegen/toolchain.h"

namespace kiln::codegen {
namespace {

using loop::Kernel;
using loop::ReduceOp;
using loop::Stmt;
using loop::StmtKind;

// Threads per block of a pointwise kernel, and the most blocks a launch
// asks for (the grid-stride loop covers the rest).
constexpr int kPointwiseBlock = 256;
constexpr int64_t kMaxGrid = int64_t{1} << 20;

bool HasReduction(const Kernel& k) {
  for (const Stmt& s : k.stmts) {
    if (s.kind == StmtKind::kReduce) return true;
  }
  return false;
}

int64_t ConstantProduct(const std::vector<ir::SymInt>& sizes, bool* constant) {
  int64_t n = 1;
  *constant = true;
  for (const ir::SymInt& s : sizes) {
    if (!s.is_constant()) {
      *constant = false;
      continue;
    }
    n = s.constant() > 0 && n > (int64_t{1} << 50) / s.constant() ? (int64_t{1} << 50)
                                                                  : n * s.constant();
  }
  return n;
}

// Threads per block of a reduction kernel: the row rounded up to whole
// warps, at most 1024; 256 for a row of symbolic size.
int ReductionBlock(const Kernel& k) {
  bool constant = false;
  const int64_t row = ConstantProduct(k.inner, &constant);
  if (!constant) return 256;
  return static_cast<int>(std::clamp<int64_t>((row + 31) / 32 * 32, 32, 1024));
}

// A product of sizes as an expression of the plan's symbols.
std::string ProductExpr(const std::vector<ir::SymInt>& sizes) {
  int64_t constant = 1;
  std::vector<std::string> parts;
  for (const ir::SymInt& s : sizes) {
    if (s.is_constant()) {
      constant *= s.constant();
    } else {
      parts.push_back(absl::StrCat("(", s.expr(), ")"));
    }
  }
  if (constant != 1 || parts.empty()) parts.push_back(absl::StrCat(constant));
  return absl::StrJoin(parts, "*");
}

LaunchSize SizeLaunch(const Kernel& k) {
  LaunchSize size;
  const bool reduce = HasReduction(k);
  size.block = reduce ? ReductionBlock(k) : kPointwiseBlock;
  std::vector<ir::SymInt> space = k.outer;
  if (!reduce) space.insert(space.end(), k.inner.begin(), k.inner.end());
  bool constant = false;
  const int64_t n = ConstantProduct(space, &constant);
  if (constant) {
    const int64_t blocks = reduce ? n : (n + size.block - 1) / size.block;
    size.grid = ir::SymInt{std::min(blocks, kMaxGrid)};
    return size;
  }
  const std::string total = ProductExpr(space);
  size.grid = ir::SymInt{reduce ? absl::StrCat("Min(", total, ", ", kMaxGrid, ")")
                                : absl::StrCat("Min((", total, " + ", size.block - 1, ")//",
                                               size.block, ", ", kMaxGrid, ")")};
  return size;
}

class CudaKernelEmitter {
 public:
  CudaKernelEmitter(const Kernel& kernel, const SymbolTable& symbols)
      : k_(kernel), symbols_(symbols) {}

  absl::StatusOr<std::string> Emit() {
    if (!IsIdentifier(k_.name) || absl::StartsWith(k_.name, "kiln_")) {
      return KernelError(k_, "the name is not a C identifier (or starts with kiln_)");
    }
    ASSIGN_OR_RETURN(KernelCheck check, CheckKernel(k_, "CUDA"));
    type_ = std::move(check.type);
    after_ = std::move(check.after);
    if (k_.buffers.empty()) return KernelError(k_, "has no buffers");
    const LaunchSize launch = SizeLaunch(k_);
    std::string body;
    RETURN_IF_ERROR(HasReduction(k_) ? EmitReduction(launch.block, &body)
                                     : EmitPointwise(launch.block, &body));

    std::string out =
        absl::StrCat("\nstruct ", k_.name, "_args {\n  void* b[", k_.buffers.size(), "];\n");
    if (symbols_.size() > 0) absl::StrAppend(&out, "  int64_t s[", symbols_.size(), "];\n");
    absl::StrAppend(&out, "};\n\nextern \"C\" __global__ void __launch_bounds__(", launch.block,
                    ") ", k_.name, "(const ", k_.name, "_args a) {\n");
    if (!k_.nodes.empty()) {
      absl::StrAppend(&out, "  // nodes: ", CommentText(absl::StrJoin(k_.nodes, ", ")), "\n");
    }
    for (int k : used_symbols_) {
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
    for (const std::string& decl : hoisted_decls_) absl::StrAppend(&out, "  ", decl, "\n");
    absl::StrAppend(&out, body, "}\n");
    return out;
  }

 private:
  static std::string Pad(int depth) { return std::string(2 * depth, ' '); }
  std::string Val(int a) const { return absl::StrCat("t", a); }

  // CUDA text of an int64 value: a literal, a symbol, or a hoisted local.
  absl::StatusOr<std::string> Int(const ir::SymInt& s) {
    if (s.is_constant()) return IntLiteral(s.constant());
    absl::StatusOr<std::string> text =
        TranslateExpr(s.expr(), symbols_, &used_symbols_, kCudaDialect);
    if (!text.ok()) return KernelError(k_, text.status().message());
    if (IsIdentifier(*text)) return *text;
    auto it = hoisted_.find(*text);
    if (it != hoisted_.end()) return it->second;
    const std::string name = absl::StrCat("e", hoisted_.size());
    hoisted_.emplace(*text, name);
    hoisted_decls_.push_back(
        absl::StrCat("const int64_t ", name, " = ", *text, ";  // ", CommentText(s.expr())));
    return name;
  }

  absl::StatusOr<std::string> Product(const std::vector<ir::SymInt>& sizes, size_t from) {
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

  // Lines defining <prefix><k> for each dimension of `sizes` from the flat
  // index `flat` (row-major).
  absl::Status Decompose(const std::vector<ir::SymInt>& sizes, const std::string& flat,
                         const std::string& prefix, int depth, std::string* out) {
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
      absl::StrAppend(out, Pad(depth), "const int64_t ", prefix, k, " = ", value, ";\n");
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
  // one thread: `guard` is the condition.
  absl::StatusOr<std::string> Statement(int j, const std::string& guard) {
    const Stmt& s = k_.stmts[j];
    const char* T = CName(type_[j]);
    switch (s.kind) {
      case StmtKind::kLoad: {
        ASSIGN_OR_RETURN(std::string addr, Access(j));
        const v1::DType bdt = k_.buffers[s.buffer].dtype;
        std::string value = FromStorage(bdt, addr);
        ASSIGN_OR_RETURN(CType bt, ComputeType(bdt, "CUDA"));
        if (bt != type_[j]) {
          value = type_[j] == CType::kBool ? absl::StrCat("(", value, " != 0)")
                                           : absl::StrCat("static_cast<", T, ">(", value, ")");
        }
        return absl::StrCat("const ", T, " t", j, " = ", value, ";");
      }
      case StmtKind::kConstant:
        return absl::StrCat("const ", T, " t", j, " = ",
                            Literal(s.constant, type_[j], kCudaDialect), ";");
      case StmtKind::kOp: {
        ASSIGN_OR_RETURN(std::string e, ScalarOpExpr(k_, type_, j, kCudaDialect));
        return absl::StrCat("const ", T, " t", j, " = ", e, ";");
      }
      case StmtKind::kStore: {
        ASSIGN_OR_RETURN(std::string addr, Access(j));
        const int a = s.args[0];
        std::string line =
            absl::StrCat(addr, " = ", ToStorage(k_.buffers[s.buffer].dtype, type_[a], Val(a)), ";");
        if (!s.inner && !guard.empty()) line = absl::StrCat("if (", guard, ") ", line);
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
    absl::StrAppend(out, "  const int64_t outer_n = ", outer_n, ";\n");
    absl::StrAppend(out, "  const int64_t inner_n = ", inner_n, ";\n");
    return absl::OkStatus();
  }

  absl::Status EmitPointwise(int block, std::string* out) {
    RETURN_IF_ERROR(Sizes(out));
    absl::StrAppend(out, "  const int64_t total = outer_n * inner_n;\n",
                    "  for (int64_t x = static_cast<int64_t>(blockIdx.x) * ", block,
                    " + threadIdx.x; x < total;\n       x += static_cast<int64_t>(gridDim.x) * ",
                    block, ") {\n", "    const int64_t o = x / inner_n;\n",
                    "    const int64_t i = x - o * inner_n;\n");
    RETURN_IF_ERROR(Decompose(k_.outer, "o", "o", 2, out));
    RETURN_IF_ERROR(Decompose(k_.inner, "i", "i", 2, out));
    for (size_t j = 0; j < k_.stmts.size(); ++j) {
      ASSIGN_OR_RETURN(std::string line, Statement(static_cast<int>(j), "i == 0"));
      absl::StrAppend(out, "    ", line, "\n");
    }
    absl::StrAppend(out, "  }\n");
    return absl::OkStatus();
  }

  static bool IsWelford(const Stmt& s) {
    return s.kind == StmtKind::kReduce &&
           (s.reduce == ReduceOp::kWelfordMean || s.reduce == ReduceOp::kWelfordM2);
  }
  // The Welford accumulator of reduction j: the first Welford statement of
  // its pass over the same operand.
  int WelfordId(int j) const {
    const Stmt& s = k_.stmts[j];
    for (int q = 0; q < j; ++q) {
      const Stmt& t = k_.stmts[q];
      if (IsWelford(t) && t.pass == s.pass && t.args[0] == s.args[0]) return q;
    }
    return j;
  }

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

  absl::Status EmitReduction(int block, std::string* out) {
    RETURN_IF_ERROR(Sizes(out));
    // 32 values of the widest accumulator, three for Welford.
    absl::StrAppend(out, "  __shared__ double kiln_smem[96];\n",
                    "  for (int64_t o = blockIdx.x; o < outer_n; o += gridDim.x) {\n");
    RETURN_IF_ERROR(Decompose(k_.outer, "o", "o", 2, out));
    const int n = static_cast<int>(k_.stmts.size());
    for (int p = 0; p < k_.passes; ++p) {
      std::vector<int> before, inner, after;
      for (int j = 0; j < n; ++j) {
        const Stmt& s = k_.stmts[j];
        if (s.pass != p) continue;
        (s.inner ? inner : after_[j] ? after : before).push_back(j);
      }
      absl::StrAppend(out, "    // pass ", p, "\n");
      for (int j : before) {
        ASSIGN_OR_RETURN(std::string line, Statement(j, "threadIdx.x == 0"));
        absl::StrAppend(out, "    ", line, "\n");
      }
      if (!inner.empty()) {
        for (int j : inner) {
          const Stmt& s = k_.stmts[j];
          if (s.kind != StmtKind::kReduce) continue;
          const char* T = CName(type_[j]);
          if (IsWelford(s)) {
            if (WelfordId(j) == j) {
              absl::StrAppend(out, "    ", T, " wm", j, " = 0, wq", j, " = 0, wn", j,
                              " = 0;  // mean, M2, count\n");
            }
          } else {
            absl::StrAppend(out, "    ", T, " acc", j, " = ", Identity(j), ";\n");
          }
        }
        absl::StrAppend(out, "    for (int64_t i = threadIdx.x; i < inner_n; i += ", block,
                        ") {\n");
        RETURN_IF_ERROR(Decompose(k_.inner, "i", "i", 3, out));
        for (int j : inner) {
          const Stmt& s = k_.stmts[j];
          if (s.kind != StmtKind::kReduce) {
            ASSIGN_OR_RETURN(std::string line, Statement(j, ""));
            absl::StrAppend(out, "      ", line, "\n");
            continue;
          }
          const std::string v = CastValue(type_, s.args[0], type_[j]);
          if (IsWelford(s)) {
            if (WelfordId(j) != j) continue;
            const char* T = CName(type_[j]);
            absl::StrAppend(out, "      { wn", j, " += ", T, "(1); const ", T, " d = ", v, " - wm",
                            j, "; wm", j, " += d / wn", j, "; wq", j, " += d * (", v, " - wm", j,
                            "); }\n");
          } else {
            absl::StrAppend(out, "      acc", j, " = ", Combiner(s.reduce), "(acc", j, ", ", v,
                            ");\n");
          }
        }
        absl::StrAppend(out, "    }\n");
        for (int j : inner) {
          const Stmt& s = k_.stmts[j];
          if (s.kind != StmtKind::kReduce) continue;
          const char* T = CName(type_[j]);
          if (IsWelford(s)) {
            const int w = WelfordId(j);
            if (w == j) {
              absl::StrAppend(out, "    kiln_block_welford(wm", j, ", wq", j, ", wn", j,
                              ", kiln_smem);\n");
            }
            absl::StrAppend(out, "    const ", T, " t", j, " = ",
                            s.reduce == ReduceOp::kWelfordMean ? "wm" : "wq", w, ";\n");
          } else {
            absl::StrAppend(out, "    const ", T, " t", j, " = kiln_block_reduce(acc", j, ", ",
                            Combiner(s.reduce), ", ", T, "(", Identity(j), "), kiln_smem);\n");
          }
        }
      }
      for (int j : after) {
        ASSIGN_OR_RETURN(std::string line, Statement(j, "threadIdx.x == 0"));
        absl::StrAppend(out, "    ", line, "\n");
      }
    }
    absl::StrAppend(out, "  }\n");
    return absl::OkStatus();
  }

  const Kernel& k_;
  const SymbolTable& symbols_;
  std::vector<CType> type_;
  std::vector<bool> after_;
  std::set<int> used_symbols_;
  std::map<std::string, std::string> hoisted_;
  std::vector<std::string> hoisted_decls_;
};

// Where the NVRTC helper is: `configured`, else kiln_nvrtc beside the
// running program, else the build tree's.
std::string FindHelper(const std::string& configured) {
  if (!configured.empty()) return configured;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path beside = self.parent_path() / "kiln_nvrtc";
    if (std::filesystem::exists(beside, ec)) return beside.string();
  }
  return KILN_NVRTC_HELPER_BUILD_PATH;
}

class CudaBackend : public CodegenBackend {
 public:
  explicit CudaBackend(CudaOptions options) : options_(std::move(options)) {}

  std::string language() const override { return "cuda"; }

  absl::StatusOr<std::string> Generate(const std::vector<loop::Kernel>& kernels,
                                       const std::vector<std::string>& symbols) const override {
    ASSIGN_OR_RETURN(SymbolTable table, SymbolTable::Create(symbols));
    std::string out = kCudaPrelude;
    std::set<std::string> names;
    for (const Kernel& kernel : kernels) {
      if (!names.insert(kernel.name).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("kernel '", kernel.name, "' is defined twice"));
      }
      CudaKernelEmitter emitter(kernel, table);
      ASSIGN_OR_RETURN(std::string code, emitter.Emit());
      out += code;
    }
    return out;
  }

  absl::StatusOr<v1::CompiledModule> Compile(const std::string& source) const override {
    ASSIGN_OR_RETURN(TempFile src, TempFile::Create(options_.scratch_dir, ".cu"));
    ASSIGN_OR_RETURN(TempFile cubin, TempFile::Create(options_.scratch_dir, ".cubin"));
    RETURN_IF_ERROR(WriteFile(src.path(), source));
    const std::string helper = FindHelper(options_.helper);
    const std::vector<std::string> argv = {helper, absl::StrCat("--arch=", options_.sm_arch), "-o",
                                           cubin.path(), src.path()};
    const std::string command = absl::StrJoin(argv, " ");
    ASSIGN_OR_RETURN(CommandResult run, RunCommand(argv, options_.timeout, options_.cancel));
    if (!Succeeded(run)) return CompilerFailed("NVRTC", command, run);
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

}  // namespace kiln::codegen
