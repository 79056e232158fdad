// Test support: loop::Kernels written statement by statement, for the code
// generators' tests.
#ifndef KILN_COMPILER_LOOP_KERNEL_BUILDER_H_
#define KILN_COMPILER_LOOP_KERNEL_BUILDER_H_

#include <string>
#include <utility>
#include <vector>

#include "compiler/loop/kernel.h"

namespace kiln::loop::testing {

inline ir::SymInt C(int64_t v) { return ir::SymInt{v}; }
inline ir::SymInt E(const char* expr) { return ir::SymInt{std::string(expr)}; }

inline Index Idx(std::vector<ir::SymInt> outer, std::vector<ir::SymInt> inner,
                 ir::SymInt offset = C(0)) {
  Index index;
  index.outer_strides = std::move(outer);
  index.inner_strides = std::move(inner);
  index.offset = std::move(offset);
  return index;
}

// Builds a Kernel statement by statement; At() sets the pass and level of
// what follows.
class KernelBuilder {
 public:
  KernelBuilder(std::string name, std::vector<ir::SymInt> outer, std::vector<ir::SymInt> inner,
                int passes = 1) {
    k_.name = std::move(name);
    k_.outer = std::move(outer);
    k_.inner = std::move(inner);
    k_.passes = passes;
  }

  int Buffer(std::string value, v1::DType dtype, bool written = false) {
    k_.buffers.push_back({std::move(value), dtype, written});
    return static_cast<int>(k_.buffers.size()) - 1;
  }
  KernelBuilder& At(int pass, bool inner) {
    pass_ = pass;
    inner_ = inner;
    return *this;
  }
  int Load(int buffer, Index index) {
    Stmt s = Base(StmtKind::kLoad, k_.buffers[buffer].dtype);
    s.buffer = buffer;
    s.index = std::move(index);
    return Add(std::move(s));
  }
  int Const(double value, v1::DType dtype = v1::FLOAT32) {
    Stmt s = Base(StmtKind::kConstant, dtype);
    s.constant = value;
    return Add(std::move(s));
  }
  int Op(ScalarOp op, std::vector<int> args, v1::DType dtype = v1::FLOAT32) {
    Stmt s = Base(StmtKind::kOp, dtype);
    s.op = op;
    s.args = std::move(args);
    return Add(std::move(s));
  }
  int Reduce(ReduceOp reduce, int arg, v1::DType dtype = v1::FLOAT32) {
    Stmt s = Base(StmtKind::kReduce, dtype);
    s.reduce = reduce;
    s.args = {arg};
    return Add(std::move(s));
  }
  void Store(int buffer, Index index, int value) {
    Stmt s = Base(StmtKind::kStore, k_.buffers[buffer].dtype);
    s.buffer = buffer;
    s.index = std::move(index);
    s.args = {value};
    Add(std::move(s));
  }
  const Kernel& kernel() const { return k_; }

 private:
  Stmt Base(StmtKind kind, v1::DType dtype) const {
    Stmt s;
    s.kind = kind;
    s.pass = pass_;
    s.inner = inner_;
    s.dtype = dtype;
    return s;
  }
  int Add(Stmt s) {
    k_.stmts.push_back(std::move(s));
    return static_cast<int>(k_.stmts.size()) - 1;
  }

  Kernel k_;
  int pass_ = 0;
  bool inner_ = true;
};

}  // namespace kiln::loop::testing

#endif  // KILN_COMPILER_LOOP_KERNEL_BUILDER_H_
