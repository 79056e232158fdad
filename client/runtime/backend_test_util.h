// Helpers of the kiln backend's end-to-end tests: a graph lowered,
// compiled to C++ with g++ and run by the plan executor, compared with the
// reference interpreter (ATen op by op) on the same inputs.
#ifndef KILN_CLIENT_RUNTIME_BACKEND_TEST_UTIL_H_
#define KILN_CLIENT_RUNTIME_BACKEND_TEST_UTIL_H_

#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "client/runtime/interpreter.h"
#include "client/runtime/plan_executor.h"
#include "compiler/codegen/codegen.h"
#include "compiler/ir/builder.h"
#include "compiler/loop/lowering.h"

namespace kiln::runtime::backend_test {

using ir::Ref;

inline ir::TensorMeta Meta(std::vector<ir::SymInt> sizes, v1::DType dtype = v1::FLOAT32,
                           std::vector<ir::SymInt> strides = {}) {
  ir::TensorMeta m;
  m.dtype = dtype;
  m.device_type = "cpu";
  m.sizes = std::move(sizes);
  if (strides.empty()) {
    strides.resize(m.sizes.size());
    int64_t stride = 1;
    for (int d = static_cast<int>(m.sizes.size()) - 1; d >= 0; --d) {
      strides[d] = ir::SymInt{stride};
      if (m.sizes[d].is_constant()) stride *= m.sizes[d].constant();
    }
  }
  m.strides = std::move(strides);
  return m;
}

inline std::vector<ir::SymInt> S(std::vector<int64_t> v) {
  std::vector<ir::SymInt> out;
  for (int64_t x : v) out.push_back(ir::SymInt{x});
  return out;
}

struct Compiled {
  std::unique_ptr<PlanExecutor> exec;
  loop::LoweredGraph lowered;
};

inline Compiled Compile(const ir::Graph& g,
                        const loop::FusionPolicy& policy = loop::FusionPolicy()) {
  Compiled c;
  auto lowered = loop::LowerGraph(g, ops::DefaultRegistry(), policy);
  EXPECT_TRUE(lowered.ok()) << lowered.status();
  if (!lowered.ok()) return c;
  c.lowered = *lowered;
  v1::CompiledGraph cg;
  *cg.mutable_plan() = lowered->plan;
  if (!lowered->kernels.empty()) {
    auto backend = codegen::MakeCppBackend({});
    auto source = backend->Generate(lowered->kernels, lowered->symbols);
    EXPECT_TRUE(source.ok()) << source.status();
    if (!source.ok()) return c;
    auto module = backend->Compile(*source);
    EXPECT_TRUE(module.ok()) << module.status();
    if (!module.ok()) return c;
    *cg.add_modules() = *std::move(module);
  }
  auto exec = PlanExecutor::Create(cg);
  EXPECT_TRUE(exec.ok()) << exec.status();
  if (exec.ok()) c.exec = *std::move(exec);
  return c;
}

// Runs `g` compiled and through the interpreter on the same inputs.
inline void ExpectSame(Compiled& c, const ir::Graph& g, const std::vector<at::Tensor>& inputs,
                       const std::string& what) {
  ASSERT_NE(c.exec, nullptr) << what;
  auto got = c.exec->Run(inputs);
  ASSERT_TRUE(got.ok()) << what << ": " << got.status();
  auto want = RunGraph(g, inputs);
  ASSERT_TRUE(want.ok()) << what << ": " << want.status();
  ASSERT_EQ(got->size(), want->size());
  for (size_t i = 0; i < got->size(); ++i) {
    const at::Tensor& a = (*got)[i];
    const at::Tensor& b = (*want)[i];
    ASSERT_EQ(a.sizes(), b.sizes()) << what << " output " << i;
    ASSERT_EQ(a.scalar_type(), b.scalar_type()) << what << " output " << i;
    if (a.is_floating_point()) {
      // Half types: kiln computes in float32 and rounds once at the store,
      // ATen rounds after every op, so they agree to half precision only.
      const bool half = a.scalar_type() == at::kHalf || a.scalar_type() == at::kBFloat16;
      const double rtol = a.scalar_type() == at::kDouble ? 1e-10 : half ? 2e-2 : 1e-5;
      const double atol = half ? 2e-2 : 1e-5;
      EXPECT_TRUE(
          at::allclose(a.to(at::kDouble), b.to(at::kDouble), rtol, atol, /*equal_nan=*/true))
          << what << " output " << i << "\n got " << a << "\nwant " << b;
    } else {
      EXPECT_TRUE(at::equal(a, b)) << what << " output " << i;
    }
  }
}

using GraphBody = std::function<void(ir::GraphBuilder&, const std::vector<ir::ValueId>&)>;

// The graph `body` builds over user inputs "in0", "in1", ... of `metas`.
inline ir::Graph BuildGraph(const std::string& what, const std::vector<ir::TensorMeta>& metas,
                            const GraphBody& body) {
  ir::GraphBuilder b(what);
  std::vector<ir::ValueId> ins;
  for (size_t i = 0; i < metas.size(); ++i) {
    ins.push_back(b.AddInput(metas[i], v1::Placeholder::USER_INPUT, "in" + std::to_string(i)));
  }
  body(b, ins);
  return std::move(b).Build();
}

inline void CheckOne(const std::string& what, const std::vector<ir::TensorMeta>& metas,
                     const GraphBody& body, const std::vector<at::Tensor>& inputs,
                     int expect_kernels = -1) {
  ir::Graph g = BuildGraph(what, metas, body);
  Compiled c = Compile(g);
  if (expect_kernels >= 0) {
    EXPECT_EQ(static_cast<int>(c.lowered.kernels.size()), expect_kernels) << what;
  }
  ExpectSame(c, g, inputs, what);
}

inline ir::ValueId Op(ir::GraphBuilder& b, const std::string& target,
                      std::vector<ir::Argument> args, std::vector<ir::Argument> kwargs = {},
                      int output = 0) {
  auto out = ops::Emit(b, ops::DefaultRegistry(), target, std::move(args), std::move(kwargs));
  EXPECT_TRUE(out.ok()) << target << ": " << out.status();
  return out.ok() ? (*out)[output] : ir::kNoValue;
}

inline at::Tensor Rand(std::vector<int64_t> sizes, at::ScalarType t = at::kFloat) {
  return at::randn(sizes, at::TensorOptions().dtype(t));
}

}  // namespace kiln::runtime::backend_test

#endif  // KILN_CLIENT_RUNTIME_BACKEND_TEST_UTIL_H_
