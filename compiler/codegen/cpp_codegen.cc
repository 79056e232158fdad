// The C++ backend: loop::Kernels -> one C++ translation unit -> a shared
// object built by g++ (with OpenMP).
//
// Shape of one generated kernel (a pointwise add with a broadcast operand):
//
//   extern "C" void kernel_0(void* const* buffers, const int64_t* symbols) {
//     const int64_t s0 = symbols[0];
//     const float* buf0 = static_cast<const float*>(buffers[0]);  // x
//     const float* buf1 = static_cast<const float*>(buffers[1]);  // y
//     float* buf2 = static_cast<float*>(buffers[2]);  // out
//     const int64_t outer_n = s0;
//     const int64_t inner_n = 128;
//   #pragma omp parallel for schedule(static) if(outer_n * inner_n > 32768)
//     for (int64_t o = 0; o < outer_n; ++o) {
//       const int64_t o0 = o;
//       const int64_t b0 = o0 * 128;
//       // pass 0
//       const float* p0 = buf0 + b0;
//       const float* p1 = buf1;
//       float* p3 = buf2 + b0;
//   #pragma omp simd
//       for (int64_t i = 0; i < inner_n; ++i) {
//         const float t0 = p0[i];
//         const float t1 = p1[i];
//         const float t2 = (t0 + t1);
//         p3[i] = t2;
//       }
//     }
//   }
//
// Sweeps whose accesses all have inner stride 0 or 1 take the fast path
// above (`omp simd`, pointer arithmetic); a sweep with reductions runs in
// chunks of 32 lanes, each lane with its own accumulator (a Welford
// mean/M2 per lane merged with Chan's formula; over long rows, float32
// sums and Welfords folded into double lanes every 64 chunks), then a
// scalar tail. Others index the buffers with their strides in plain (or
// nested) loops, where float32 sums accumulate in double.
//
// Compile errors come back as INTERNAL whose message holds the first lines of
// the compiler's log; the whole log is the status payload kCompilerLogPayload.
//
// The prelude is in cpp_prelude.h; the KernelEmitter that writes a kernel
// is declared in cpp_codegen_internal.h and defined across cpp_codegen.cc
// (the function and its loop nest) and the cpp_emit_*.cc files.
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "compiler/codegen/c_family.h"
#include "compiler/codegen/codegen.h"
#include "compiler/codegen/cpp_codegen_internal.h"
#include "compiler/codegen/cpp_prelude.h"
#include "compiler/codegen/toolchain.h"

namespace kiln::codegen {
namespace cpp_internal {

absl::StatusOr<std::string> KernelEmitter::Emit() {
  RETURN_IF_ERROR(Validate());
  std::string body;
  RETURN_IF_ERROR(EmitBody(&body));

  std::string out = absl::StrCat("\nextern \"C\" void ", k_.name,
                                 "(void* const* buffers, const int64_t* symbols) {\n");
  if (!k_.nodes.empty()) {
    absl::StrAppend(&out, "  // nodes: ", CommentText(absl::StrJoin(k_.nodes, ", ")), "\n");
  }
  for (int k : ints_.used_symbols()) {
    absl::StrAppend(&out, "  const int64_t ", symbols_.CppName(k), " = symbols[", k, "];\n");
  }
  for (size_t b = 0; b < k_.buffers.size(); ++b) {
    const loop::KernelBuffer& buf = k_.buffers[b];
    const std::string type = absl::StrCat(buf.written ? "" : "const ", StorageName(buf.dtype), "*");
    absl::StrAppend(&out, "  ", type, " buf", b, " = static_cast<", type, ">(buffers[", b,
                    "]);  // ", CommentText(buf.value), "\n");
  }
  for (const std::string& decl : ints_.hoisted()) absl::StrAppend(&out, "  ", decl, "\n");
  if (gathers_) absl::StrAppend(&out, "  kiln_gather_check gather_check;\n");
  absl::StrAppend(&out, body);
  // An index out of range was read as 0 (never out of bounds); the error,
  // raised after the parallel loop, names it.
  if (gathers_) absl::StrAppend(&out, "  gather_check.raise(\"", k_.name, "\");\n");
  absl::StrAppend(&out, "}\n");
  return out;
}

absl::Status KernelEmitter::Validate() {
  ASSIGN_OR_RETURN(KernelCheck check, CheckKernel(k_, "C++"));
  if (k_.row_groups > 0) {
    // The CUDA target's fusion only (compiler/loop/fold_column_sums.h).
    return codegen::KernelError(k_, "sums across row groups are not generated as C++");
  }
  type_ = std::move(check.type);
  after_ = std::move(check.after);
  return absl::OkStatus();
}

absl::Status KernelEmitter::EmitBody(std::string* out) {
  const int n = static_cast<int>(k_.stmts.size());
  // Sizes.
  for (const auto& s : k_.outer) RETURN_IF_ERROR(Int(s).status());
  for (const auto& s : k_.inner) RETURN_IF_ERROR(Int(s).status());
  ASSIGN_OR_RETURN(std::string outer_n, Product(k_.outer, 0));
  ASSIGN_OR_RETURN(std::string inner_n, Product(k_.inner, 0));
  std::string loops;
  absl::StrAppend(&loops, "  const int64_t outer_n = ", outer_n, ";\n");
  absl::StrAppend(&loops, "  const int64_t inner_n = ", inner_n, ";\n");
  if (openmp_) {
    absl::StrAppend(&loops,
                    "#pragma omp parallel for schedule(static) if(outer_n * inner_n > 32768)\n");
  }
  absl::StrAppend(&loops, "  for (int64_t o = 0; o < outer_n; ++o) {\n");

  // The outer coordinates that some access uses.
  const size_t n_outer = k_.outer.size();
  std::vector<bool> used(n_outer, false);
  for (const Stmt& s : k_.stmts) {
    if (s.kind != StmtKind::kLoad && s.kind != StmtKind::kStore && s.kind != StmtKind::kGather &&
        s.kind != StmtKind::kIndex && s.kind != StmtKind::kScatterAdd) {
      continue;
    }
    gathers_ = gathers_ || s.kind == StmtKind::kGather || s.kind == StmtKind::kScatterAdd;
    for (size_t k = 0; k < s.index.outer_strides.size(); ++k) {
      if (!IsZero(s.index.outer_strides[k])) used[k] = true;
    }
  }
  for (size_t k = 0; k < n_outer; ++k) {
    if (!used[k]) continue;
    // o_k = (o / product of the later sizes) % size_k, dropping what is
    // not needed for the first and the last dimension.
    std::string value = "o";
    if (n_outer > 1) {
      ASSIGN_OR_RETURN(std::string div, Product(k_.outer, k + 1));
      ASSIGN_OR_RETURN(std::string size, Int(k_.outer[k]));
      if (div.find(' ') != std::string::npos) div = absl::StrCat("(", div, ")");
      if (k == 0) {
        value = absl::StrCat("o / ", div);
      } else if (k + 1 == n_outer) {
        value = absl::StrCat("o % ", size);
      } else {
        value = absl::StrCat("(o / ", div, ") % ", size);
      }
    }
    absl::StrAppend(&loops, "    const int64_t o", k, " = ", value, ";\n");
  }

  // Row base offsets of every access, shared when equal.
  base_.assign(n, "0");
  std::map<std::string, std::string> bases;
  for (int j = 0; j < n; ++j) {
    const Stmt& s = k_.stmts[j];
    if (s.kind != StmtKind::kLoad && s.kind != StmtKind::kStore && s.kind != StmtKind::kGather &&
        s.kind != StmtKind::kIndex && s.kind != StmtKind::kScatterAdd) {
      continue;
    }
    std::vector<std::string> terms;
    for (size_t k = 0; k < s.index.outer_strides.size(); ++k) {
      if (IsZero(s.index.outer_strides[k])) continue;
      ASSIGN_OR_RETURN(std::string t, Term(absl::StrCat("o", k), s.index.outer_strides[k]));
      terms.push_back(t);
    }
    if (!IsZero(s.index.offset)) {
      ASSIGN_OR_RETURN(std::string off, Int(s.index.offset));
      terms.push_back(off);
    }
    if (terms.empty()) continue;
    const std::string text = absl::StrJoin(terms, " + ");
    if (IsIdentifier(text)) {  // "o0": no local needed
      base_[j] = text;
      continue;
    }
    auto it = bases.find(text);
    if (it == bases.end()) {
      const std::string name = absl::StrCat("b", bases.size());
      it = bases.emplace(text, name).first;
      absl::StrAppend(&loops, "    const int64_t ", name, " = ", text, ";\n");
    }
    base_[j] = it->second;
  }

  // Statements by pass and place.
  passes_.assign(k_.passes, Pass{});
  for (int p = 0; p < k_.passes; ++p) passes_[p].number = p;
  for (int j = 0; j < n; ++j) {
    const Stmt& s = k_.stmts[j];
    Pass& p = passes_[s.pass];
    if (s.inner) {
      p.inner.push_back(j);
      if (IsWelford(s)) p.has_welford = true;
      if (s.kind == StmtKind::kReduce) p.has_reduction = true;
    } else {
      (after_[j] ? p.after : p.before).push_back(j);
    }
  }
  for (Pass& p : passes_) {
    if (k_.inner.size() != 1) {
      p.mode = SweepMode::kNested;
    } else if (Contiguous(p)) {
      p.mode = p.has_reduction ? SweepMode::kChunked : SweepMode::kSimd;
    } else {
      p.mode = SweepMode::kPlain;
    }
  }

  const int depth = 2;
  for (int p = 0; p < k_.passes; ++p) {
    const Pass& pass = passes_[p];
    absl::StrAppend(&loops, Pad(depth), "// pass ", p, "\n");
    for (int j : pass.before) {
      ASSIGN_OR_RETURN(std::string line, Statement(j, SweepMode::kPlain));
      absl::StrAppend(&loops, Pad(depth), line, "\n");
    }
    if (!pass.inner.empty()) {
      for (int j : pass.inner) {
        if (k_.stmts[j].kind == StmtKind::kReduce) DeclareAccumulator(j, pass, depth, &loops);
      }
      DeclareReciprocals(pass, depth, &loops);
      RETURN_IF_ERROR(EmitSweep(pass, depth, &loops));
      for (int j : pass.inner) {
        if (k_.stmts[j].kind == StmtKind::kReduce) Finish(j, depth, &loops);
      }
    }
    for (int j : pass.after) {
      ASSIGN_OR_RETURN(std::string line, Statement(j, SweepMode::kPlain));
      absl::StrAppend(&loops, Pad(depth), line, "\n");
    }
  }
  absl::StrAppend(&loops, "  }\n");
  *out = std::move(loops);
  return absl::OkStatus();
}

}  // namespace cpp_internal

namespace {

using cpp_internal::KernelEmitter;
using loop::Kernel;

class CppBackend : public CodegenBackend {
 public:
  explicit CppBackend(CppOptions options) : options_(std::move(options)) {}

  std::string language() const override { return "c++"; }

  absl::StatusOr<std::string> Generate(const std::vector<loop::Kernel>& kernels,
                                       const std::vector<std::string>& symbols) const override {
    return GenerateUnit(kCppPrelude, kernels, symbols,
                        [&](const Kernel& kernel, const SymbolTable& table) {
                          return KernelEmitter(kernel, table, options_.openmp).Emit();
                        });
  }

  absl::StatusOr<v1::CompiledModule> Compile(const std::string& source) const override {
    ASSIGN_OR_RETURN(TempFile src, TempFile::Create(options_.scratch_dir, ".cc"));
    ASSIGN_OR_RETURN(TempFile so, TempFile::Create(options_.scratch_dir, ".so"));
    RETURN_IF_ERROR(WriteFile(src.path(), source));
    const std::vector<std::string> argv = {
        options_.compiler, options_.optimization,
        absl::StrCat("-march=", options_.isa.empty() ? "native" : options_.isa),
        options_.openmp ? "-fopenmp" : "-fopenmp-simd", "-fno-math-errno",
        // Floating-point operations never trap (kernels do not enable FP
        // exceptions): lets gcc turn kiln_exp's range selects into blends.
        "-fno-trapping-math",
        // Every op rounds its result, as ATen's ops do one by one: gcc would
        // otherwise fuse a * b - c into one FMA, and x * y less the mean of
        // x * y over one element would not be 0. (kiln_exp's FMAs are
        // explicit.) No measurable cost in the benchmarked kernels.
        "-ffp-contract=off",
        // Unroll-and-jam of a chunk loop around an `omp simd` lane loop
        // leaves the lane loop scalar (the Welford sweep gets 2x slower).
        "-fno-loop-unroll-and-jam", "-shared", "-fPIC", "-o", so.path(), src.path(), "-lmvec"};
    const std::string command = absl::StrJoin(argv, " ");
    ASSIGN_OR_RETURN(CommandResult run, RunCommand(argv, options_.timeout, options_.cancel));
    if (!Succeeded(run)) return CompilerFailed(options_.compiler, command, run);
    ASSIGN_OR_RETURN(std::string binary, ReadFile(so.path()));
    v1::CompiledModule module;
    module.set_language(language());
    module.set_source(source);
    module.set_binary(std::move(binary));
    module.set_compile_command(command);
    return module;
  }

  std::string CompileIdentity() const override {
    return absl::StrCat(options_.compiler, " ", options_.optimization,
                        " -march=", options_.isa.empty() ? "native" : options_.isa,
                        options_.openmp ? " -fopenmp" : " -fopenmp-simd");
  }

 private:
  const CppOptions options_;
};

}  // namespace

std::unique_ptr<CodegenBackend> MakeCppBackend(const CppOptions& options) {
  return std::make_unique<CppBackend>(options);
}

}  // namespace kiln::codegen
