// The C++ backend's errors (bad kernels, a failing or missing compiler, a
// compiler past its time limit), the kernel listing, and Generate's
// determinism and speed.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/types/optional.h"
#include "compiler/codegen/codegen.h"
#include "compiler/codegen/cpp_codegen_test_util.h"
#include "compiler/loop/kernel.h"
#include "gtest/gtest.h"

namespace kiln::codegen::cpp_test {
namespace {

// ---------------------------------------------------------------------------
// Errors.

TEST(CppCodegen, UnknownOpIsInvalidArgumentNamingTheStatement) {
  KernelBuilder kb("bad_op", {C(4)}, {C(8)});
  const int x = kb.Buffer("x", v1::FLOAT32);
  const int out = kb.Buffer("out", v1::FLOAT32, true);
  const int lx = kb.Load(x, Idx({C(8)}, {C(1)}));
  const int f = kb.Op(static_cast<ScalarOp>(200), {lx});  // outside the enum
  kb.Store(out, Idx({C(8)}, {C(1)}), f);
  absl::StatusOr<std::string> code = MakeCppBackend({})->Generate({kb.kernel()}, {});
  ASSERT_FALSE(code.ok());
  EXPECT_EQ(code.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(code.status().message(), "kernel 'bad_op'"));
  EXPECT_TRUE(absl::StrContains(code.status().message(), "statement %1"));
  EXPECT_TRUE(absl::StrContains(code.status().message(), "unknown op 200")) << code.status();
}

TEST(CppCodegen, MisplacedStatementsAreInvalidArgument) {
  {  // an inner statement reading its own pass's reduction
    KernelBuilder kb("early_read", {C(4)}, {C(8)});
    const int x = kb.Buffer("x", v1::FLOAT32);
    const int lx = kb.Load(x, Idx({C(8)}, {C(1)}));
    const int s = kb.Reduce(ReduceOp::kSum, lx);
    kb.Op(ScalarOp::kAdd, {lx, s});
    absl::StatusOr<std::string> code = MakeCppBackend({})->Generate({kb.kernel()}, {});
    EXPECT_EQ(code.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(code.status().message(), "statement %2")) << code.status();
  }
  {  // a size naming a symbol the plan does not have
    KernelBuilder kb("bad_symbol", {E("s7")}, {C(8)});
    kb.Buffer("x", v1::FLOAT32);
    absl::StatusOr<std::string> code = MakeCppBackend({})->Generate({kb.kernel()}, {"s0"});
    EXPECT_EQ(code.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(code.status().message(), "unknown symbol 's7'")) << code.status();
  }
  {  // a complex buffer
    KernelBuilder kb("complex", {C(4)}, {C(8)});
    kb.Buffer("z", v1::COMPLEX64);
    absl::StatusOr<std::string> code = MakeCppBackend({})->Generate({kb.kernel()}, {});
    EXPECT_EQ(code.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(code.status().message(), "COMPLEX64")) << code.status();
  }
}

TEST(CppCodegen, CompilerErrorIsInternalWithTheLog) {
  absl::StatusOr<v1::CompiledModule> module =
      MakeCppBackend({})->Compile("extern \"C\" void f() { this is not C++; }\n");
  ASSERT_FALSE(module.ok());
  EXPECT_EQ(module.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(module.status().message(), "g++ failed")) << module.status();
  EXPECT_TRUE(absl::StrContains(module.status().message(), "error")) << module.status();
  absl::optional<absl::Cord> log = module.status().GetPayload("kiln.dev/compiler-log");
  ASSERT_TRUE(log.has_value());
  EXPECT_TRUE(absl::StrContains(std::string(*log), "error"));
}

TEST(CppCodegen, MissingCompilerIsInternal) {
  CppOptions options;
  options.compiler = "kiln-no-such-compiler";
  absl::StatusOr<v1::CompiledModule> module = MakeCppBackend(options)->Compile("int x;\n");
  EXPECT_EQ(module.status().code(), absl::StatusCode::kInternal);
}

// ---------------------------------------------------------------------------
// The listing, determinism and Generate's speed.

TEST(PrintKernel, ListsSizesBuffersAndStatements) {
  const std::string text = loop::PrintKernel(BroadcastAdd("add_bcast", 4, 50, 300));
  EXPECT_TRUE(absl::StrContains(text, "kernel add_bcast: outer [4, 50] inner [300] passes 1"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "buf2 = out : f32 (written)")) << text;
  EXPECT_TRUE(absl::StrContains(text,
                                "%0 = load buf0[o0*15000 + o1*300 + i0*1 + 0] : f32 "
                                "[pass 0, inner]"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "%1 = load buf1[o1*300 + i0*1 + 0]")) << text;
  EXPECT_TRUE(absl::StrContains(text, "%2 = add %0, %1 : f32 [pass 0, inner]")) << text;
  EXPECT_TRUE(absl::StrContains(text, "store buf2[o0*15000 + o1*300 + i0*1 + 0] = %2")) << text;

  const std::string ln = loop::PrintKernel(LayerNorm("ln", 7));
  EXPECT_TRUE(absl::StrContains(ln, "%2 = reduce welford_m2 %0 : f32 [pass 0, inner]")) << ln;
  EXPECT_TRUE(absl::StrContains(ln, "store buf4[o0*1 + 0] = %1 [pass 0, outer]")) << ln;
}

TEST(CppCodegen, GenerateIsDeterministicAndFast) {
  std::vector<Kernel> kernels;
  for (int k = 0; k < 100; ++k) {
    kernels.push_back(k % 2 == 0
                          ? Softmax(absl::StrCat("softmax_", k), E("s0"), C(128 + k), C(128 + k))
                          : LayerNorm(absl::StrCat("ln_", k), 64 + k));
  }
  std::unique_ptr<CodegenBackend> backend = MakeCppBackend({});
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> a = backend->Generate(kernels, {"s0"});
  const double ms = Ms(std::chrono::steady_clock::now() - start);
  ASSERT_TRUE(a.ok()) << a.status();
  std::printf("[ generate ] 100 kernels: %.2f ms, %zu bytes of source\n", ms, a->size());
  absl::StatusOr<std::string> b = backend->Generate(kernels, {"s0"});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*a, *b);
}

// A compiler that never finishes (and starts a child that would outlive a
// kill of the compiler alone) is killed, with its child, at the time limit.
TEST(CppCodegen, TheCompilerRunsUnderATimeLimit) {
  char dir[] = "/tmp/kiln_codegen_timeout.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string script = std::string(dir) + "/slow-g++";
  const std::string marker = std::string(dir) + "/child-finished";
  {
    FILE* f = std::fopen(script.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f, "#!/bin/sh\n(sleep 3; touch '%s') &\nsleep 60\n", marker.c_str());
    std::fclose(f);
    ASSERT_EQ(chmod(script.c_str(), 0755), 0);
  }
  CppOptions options;
  options.compiler = script;
  options.scratch_dir = dir;
  options.timeout = absl::Milliseconds(500);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<v1::CompiledModule> module = MakeCppBackend(options)->Compile("int x;\n");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(module.status().code(), absl::StatusCode::kDeadlineExceeded) << module.status();
  EXPECT_TRUE(absl::StrContains(module.status().message(), "ran past its time limit of 500ms"))
      << module.status();
  EXPECT_LT(seconds, 3.0);
  sleep(4);
  EXPECT_NE(access(marker.c_str(), F_OK), 0) << "the compiler's child outlived the kill";
  // Only the script is left: the source and object files were removed.
  int entries = 0;
  for (DIR* d = opendir(dir); d != nullptr;) {
    dirent* e = readdir(d);
    if (e == nullptr) {
      closedir(d);
      break;
    }
    if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") ++entries;
  }
  EXPECT_EQ(entries, 1);
  unlink(script.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace kiln::codegen::cpp_test
