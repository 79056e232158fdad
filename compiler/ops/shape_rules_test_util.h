// Test-only helpers of the op registry's shape-rule tests
// (shape_util_test.cc, shape_rules_*_test.cc, registry_test.cc): symbolic
// sizes and metadata in short form, argument makers, and Env, which builds a
// graph of inputs and runs the registry's shape rules on them.
#ifndef KILN_COMPILER_OPS_SHAPE_RULES_TEST_UTIL_H_
#define KILN_COMPILER_OPS_SHAPE_RULES_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/graph.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::ops::shape_rules_test {

using ir::Argument;
using ir::SymInt;
using ir::TensorMeta;
using ::testing::HasSubstr;

inline SymInt C(int64_t v) { return SymInt{v}; }
inline SymInt S(const char* e) { return SymInt{std::string(e)}; }

// Sizes as text for readable table entries: "[4, s0, 8]".
inline std::string Str(const SymSizes& s) { return SizesToString(s); }

inline TensorMeta Meta(v1::DType dtype, SymSizes sizes, std::string device = "cpu") {
  TensorMeta m;
  m.dtype = dtype;
  m.strides = ContiguousStrides(sizes);
  m.sizes = std::move(sizes);
  m.device_type = std::move(device);
  return m;
}

inline TensorMeta F32(std::vector<int64_t> sizes) { return Meta(v1::FLOAT32, ToSymSizes(sizes)); }

inline Argument Dtype(v1::DType d) { return Argument{"", d}; }
inline Argument Syms(SymSizes s) { return Argument{"", std::move(s)}; }
inline Argument Tensors(std::vector<ir::ValueId> v) { return Argument{"", std::move(v)}; }
inline Argument Bools(std::vector<bool> v) { return Argument{"", std::move(v)}; }
inline Argument StrArg(std::string s) { return Argument{"", std::move(s)}; }

// Builds a graph of inputs and runs the registry's shape rules on them.
class Env {
 public:
  ir::ValueId In(TensorMeta meta) { return b_.AddInput(meta); }
  ir::ValueId In(v1::DType dtype, std::vector<int64_t> sizes) {
    return In(Meta(dtype, ToSymSizes(sizes)));
  }

  absl::StatusOr<std::vector<TensorMeta>> Infer(const std::string& target,
                                                std::vector<Argument> args,
                                                std::vector<Argument> kwargs = {}) {
    return InferMetas(DefaultRegistry(), target, args, kwargs,
                      [this](ir::ValueId v) -> const TensorMeta& { return b_.value(v).meta; });
  }

  // The single output's metadata; fails the test on an error.
  TensorMeta One(const std::string& target, std::vector<Argument> args,
                 std::vector<Argument> kwargs = {}) {
    auto r = Infer(target, std::move(args), std::move(kwargs));
    EXPECT_TRUE(r.ok()) << target << ": " << r.status();
    if (!r.ok() || r->empty()) return TensorMeta{};
    EXPECT_EQ(r->size(), 1u) << target;
    return (*r)[0];
  }

  // Emits a node (outputs get rule metadata) and returns its outputs.
  std::vector<ir::ValueId> Node(const std::string& target, std::vector<Argument> args,
                                std::vector<Argument> kwargs = {}) {
    auto r = Emit(b_, DefaultRegistry(), target, std::move(args), std::move(kwargs));
    EXPECT_TRUE(r.ok()) << target << ": " << r.status();
    return r.ok() ? *r : std::vector<ir::ValueId>{};
  }

  const TensorMeta& meta(ir::ValueId v) const { return b_.value(v).meta; }
  ir::GraphBuilder& builder() { return b_; }

 private:
  ir::GraphBuilder b_;
};

}  // namespace kiln::ops::shape_rules_test

#endif  // KILN_COMPILER_OPS_SHAPE_RULES_TEST_UTIL_H_
