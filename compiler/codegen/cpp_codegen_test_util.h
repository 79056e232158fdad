// Test support for the C++ backend's tests (cpp_codegen*_test.cc, one test
// executable): compiling kernels and opening the module with dlopen, random
// data, comparisons, and the kernels that several of the tests build.
#ifndef KILN_COMPILER_CODEGEN_CPP_CODEGEN_TEST_UTIL_H_
#define KILN_COMPILER_CODEGEN_CPP_CODEGEN_TEST_UTIL_H_

#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "compiler/codegen/codegen.h"
#include "compiler/loop/kernel.h"
#include "compiler/loop/kernel_builder.h"
#include "gtest/gtest.h"

namespace kiln::codegen::cpp_test {

using loop::Index;
using loop::Kernel;
using loop::ReduceOp;
using loop::ScalarOp;
using loop::Stmt;
using loop::StmtKind;

using loop::testing::C;
using loop::testing::E;
using loop::testing::Idx;
using loop::testing::KernelBuilder;

using KernelFn = void (*)(void* const*, const int64_t*);

// A compiled module opened with dlopen from a temporary file.
//
// libgomp is pinned first (RTLD_NODELETE): closing the last module that
// uses it would otherwise unload it under its idle pool threads.
class LoadedModule {
 public:
  static std::unique_ptr<LoadedModule> Open(const v1::CompiledModule& module) {
    static void* const gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NODELETE);
    (void)gomp;
    char path[] = "/tmp/kiln_codegen_test_XXXXXX.so";
    const int fd = mkstemps(path, 3);
    if (fd < 0) return nullptr;
    const std::string& bin = module.binary();
    size_t done = 0;
    while (done < bin.size()) {
      const ssize_t n = write(fd, bin.data() + done, bin.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    close(fd);
    void* handle = done == bin.size() ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
    unlink(path);
    if (handle == nullptr) {
      ADD_FAILURE() << "dlopen: " << dlerror();
      return nullptr;
    }
    return std::unique_ptr<LoadedModule>(new LoadedModule(handle));
  }
  ~LoadedModule() { dlclose(handle_); }
  KernelFn Fn(const std::string& name) const {
    return reinterpret_cast<KernelFn>(dlsym(handle_, name.c_str()));
  }

 private:
  explicit LoadedModule(void* handle) : handle_(handle) {}
  void* handle_;
};

inline double Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// Generates and compiles `kernels`, printing the compile time; on failure a
// test failure and nullptr.
inline std::unique_ptr<LoadedModule> Build(const std::vector<Kernel>& kernels,
                                           const std::vector<std::string>& symbols = {},
                                           std::string* source = nullptr,
                                           CppOptions options = CppOptions()) {
  std::unique_ptr<CodegenBackend> backend = MakeCppBackend(options);
  absl::StatusOr<std::string> code = backend->Generate(kernels, symbols);
  if (!code.ok()) {
    ADD_FAILURE() << code.status();
    return nullptr;
  }
  if (source != nullptr) *source = *code;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<v1::CompiledModule> module = backend->Compile(*code);
  const double ms = Ms(std::chrono::steady_clock::now() - start);
  if (!module.ok()) {
    ADD_FAILURE() << module.status() << "\n" << *code;
    return nullptr;
  }
  std::printf("[ compile  ] %s (%zu kernels): %.0f ms, %zu bytes of .so\n", kernels[0].name.c_str(),
              kernels.size(), ms, module->binary().size());
  EXPECT_EQ(module->language(), "c++");
  EXPECT_EQ(module->source(), *code);
  EXPECT_TRUE(absl::StrContains(module->compile_command(), "-O3"));
  return LoadedModule::Open(*module);
}

inline std::vector<float> Random(size_t n, uint32_t seed, float lo = -2, float hi = 2) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline int CountOf(absl::string_view text, absl::string_view what) {
  int n = 0;
  for (size_t at = text.find(what); at != absl::string_view::npos; at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

// |got - want| <= atol + rtol * |want|, element by element.
template <typename G, typename W>
void ExpectClose(const std::vector<G>& got, const std::vector<W>& want, double rtol = 1e-5,
                 double atol = 1e-5) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t k = 0; k < got.size(); ++k) {
    const double g = got[k], w = want[k];
    if (std::isnan(w) && std::isnan(g)) continue;
    if (!(std::abs(g - w) <= atol + rtol * std::abs(w))) {
      if (++bad <= 5) ADD_FAILURE() << "element " << k << ": got " << g << ", want " << w;
    }
  }
  EXPECT_EQ(bad, 0);
}

inline void Call(KernelFn fn, std::vector<void*> buffers, std::vector<int64_t> symbols = {}) {
  ASSERT_NE(fn, nullptr);
  fn(buffers.data(), symbols.data());
}

// ---------------------------------------------------------------------------
// Kernels that several test files build.

// out[a, b, c] = x[a, b, c] + y[b, c]: y broadcast over a (a zero stride).
inline Kernel BroadcastAdd(const std::string& name, int64_t A, int64_t B, int64_t Cn) {
  KernelBuilder kb(name, {C(A), C(B)}, {C(Cn)});
  const int x = kb.Buffer("x", v1::FLOAT32);
  const int y = kb.Buffer("y", v1::FLOAT32);
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  const int lx = kb.Load(x, Idx({C(B * Cn), C(Cn)}, {C(1)}));
  const int ly = kb.Load(y, Idx({C(0), C(Cn)}, {C(1)}));
  const int sum = kb.Op(ScalarOp::kAdd, {lx, ly});
  kb.Store(out, Idx({C(B * Cn), C(Cn)}, {C(1)}), sum);
  return kb.kernel();
}

// Softmax over the last dim in three passes: max, sum(exp(x - max)), store.
inline Kernel Softmax(const std::string& name, ir::SymInt rows, ir::SymInt cols,
                      ir::SymInt row_stride) {
  KernelBuilder kb(name, {rows}, {cols}, 3);
  const int x = kb.Buffer("x", v1::FLOAT32);
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  kb.At(0, true);
  const int l0 = kb.Load(x, Idx({row_stride}, {C(1)}));
  const int mx = kb.Reduce(ReduceOp::kMax, l0);
  kb.At(1, true);
  const int l1 = kb.Load(x, Idx({row_stride}, {C(1)}));
  const int d1 = kb.Op(ScalarOp::kSub, {l1, mx});
  const int e1 = kb.Op(ScalarOp::kExp, {d1});
  const int sum = kb.Reduce(ReduceOp::kSum, e1);
  kb.At(2, false);
  const int inv = kb.Op(ScalarOp::kReciprocal, {sum});
  kb.At(2, true);
  const int l2 = kb.Load(x, Idx({row_stride}, {C(1)}));
  const int d2 = kb.Op(ScalarOp::kSub, {l2, mx});
  const int e2 = kb.Op(ScalarOp::kExp, {d2});
  const int p = kb.Op(ScalarOp::kMul, {e2, inv});
  kb.Store(out, Idx({row_stride}, {C(1)}), p);
  return kb.kernel();
}

// Layer norm: its statistics from one Welford sweep (pass 0 a mean and M2
// per row) or, with `two_pass`, as the lowering makes them for short rows
// (pass 0 a sum, pass 1 the squared deviations from its mean); then rstd at
// the outer level (also stored), and a last pass (x - mean) * rstd * w + b.
inline Kernel LayerNorm(const std::string& name, int64_t N, bool two_pass = false) {
  KernelBuilder kb(name, {E("s0")}, {C(N)}, two_pass ? 3 : 2);
  const int x = kb.Buffer("x", v1::FLOAT32);
  const int w = kb.Buffer("w", v1::FLOAT32);
  const int b = kb.Buffer("b", v1::FLOAT32);
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  const int mean_out = kb.Buffer("mean", v1::FLOAT32, true);
  const int rstd_out = kb.Buffer("rstd", v1::FLOAT32, true);
  kb.At(0, true);
  const int l0 = kb.Load(x, Idx({C(N)}, {C(1)}));
  int mean, m2;
  if (two_pass) {
    const int sum = kb.Reduce(ReduceOp::kSum, l0);
    kb.At(0, false);
    mean = kb.Op(ScalarOp::kDiv, {sum, kb.Const(static_cast<double>(N))});
    kb.At(1, true);
    const int d = kb.Op(ScalarOp::kSub, {kb.Load(x, Idx({C(N)}, {C(1)})), mean});
    m2 = kb.Reduce(ReduceOp::kSum, kb.Op(ScalarOp::kMul, {d, d}));
    kb.At(1, false);
  } else {
    mean = kb.Reduce(ReduceOp::kWelfordMean, l0);
    m2 = kb.Reduce(ReduceOp::kWelfordM2, l0);
    kb.At(0, false);
  }
  const int n = kb.Const(static_cast<double>(N));
  const int var = kb.Op(ScalarOp::kDiv, {m2, n});
  const int eps = kb.Const(1e-5);
  const int ve = kb.Op(ScalarOp::kAdd, {var, eps});
  const int rstd = kb.Op(ScalarOp::kRsqrt, {ve});
  kb.Store(mean_out, Idx({C(1)}, {}), mean);
  kb.Store(rstd_out, Idx({C(1)}, {}), rstd);
  kb.At(two_pass ? 2 : 1, true);
  const int l1 = kb.Load(x, Idx({C(N)}, {C(1)}));
  const int d = kb.Op(ScalarOp::kSub, {l1, mean});
  const int nrm = kb.Op(ScalarOp::kMul, {d, rstd});
  const int lw = kb.Load(w, Idx({C(0)}, {C(1)}));
  const int lb = kb.Load(b, Idx({C(0)}, {C(1)}));
  const int y = kb.Op(ScalarOp::kAdd, {kb.Op(ScalarOp::kMul, {nrm, lw}), lb});
  kb.Store(out, Idx({C(N)}, {C(1)}), y);
  return kb.kernel();
}

}  // namespace kiln::codegen::cpp_test

#endif  // KILN_COMPILER_CODEGEN_CPP_CODEGEN_TEST_UTIL_H_
