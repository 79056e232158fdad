// The steps a PlanExecutor runs (plan_executor.h) and the builder that makes
// them from a plan: internal to the executor (plan_executor.cc,
// plan_builder.cc).
//
// BuildPlan turns the plan into a list of Steps over value slots (a slot per
// value name, inputs first) with every expression parsed into a Dim and
// every function resolved; on the way it walks the plan once with the state
// of each slot (undefined, live, freed, reused), which is where every plan
// error is found.
#ifndef KILN_CLIENT_RUNTIME_PLAN_STEPS_H_
#define KILN_CLIENT_RUNTIME_PLAN_STEPS_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/runtime/cuda_module.h"
#include "client/runtime/interpreter.h"
#include "client/runtime/module_loader.h"
#include "common/status_macros.h"
#include "compiler/ir/sym_expr.h"
#include "kiln/v1/artifact.pb.h"

namespace kiln::runtime::plan_internal {

// The kernel ABI (compiler/codegen/codegen.h).
using KernelFn = void (*)(void* const* buffers, const int64_t* symbols);

using SymbolTable = absl::flat_hash_map<std::string, int>;  // name -> index
using Ints = absl::InlinedVector<int64_t, 6>;

// `status` with `context` in front of its message, same code.
inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

// A SymInt ready to evaluate: a constant, a bare symbol, or an expression.
class Dim {
 public:
  static absl::StatusOr<Dim> Parse(const v1::SymInt& proto, const SymbolTable& symbols) {
    Dim d;
    if (proto.value_case() != v1::SymInt::kExpr) {
      d.constant_ = proto.int_value();
      return d;
    }
    return Parse(proto.expr(), symbols);
  }

  static absl::StatusOr<Dim> Parse(const std::string& text, const SymbolTable& symbols) {
    Dim d;
    if (std::optional<absl::string_view> bare = ir::AsBareSymbol(text)) {
      auto it = symbols.find(*bare);
      if (it == symbols.end()) return Unbound(text, *bare);
      d.symbol_ = it->second;
      return d;
    }
    ASSIGN_OR_RETURN(ir::SymExpr expr, ir::SymExpr::Parse(text));
    for (const std::string& s : expr.symbols()) {
      if (!symbols.contains(s)) return Unbound(text, s);
    }
    d.expr_ = std::move(expr);
    return d;
  }

  absl::StatusOr<int64_t> Evaluate(const std::vector<int64_t>& values,
                                   const SymbolTable& symbols) const {
    if (symbol_ >= 0) return values[symbol_];
    if (!expr_.has_value()) return constant_;
    return expr_->EvaluateWith([&](absl::string_view name) -> std::optional<int64_t> {
      auto it = symbols.find(name);
      if (it == symbols.end()) return std::nullopt;
      return values[it->second];
    });
  }

 private:
  static absl::Status Unbound(absl::string_view text, absl::string_view symbol) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' uses the symbol '", symbol,
                                                   "', which no plan.symbols binding defines"));
  }

  int64_t constant_ = 0;
  int symbol_ = -1;                  // index into the symbol values
  std::optional<ir::SymExpr> expr_;  // set for an expression
};

struct AllocStep {
  int slot;
  at::TensorOptions options;
  std::vector<Dim> sizes;
  std::vector<Dim> strides;
  int reuse = -1;     // the freed slot whose storage to reuse, or -1
  bool zero = false;  // filled with zeros (a scatter-add's target)
};

struct LaunchStep {
  KernelFn fn;
  std::vector<int> buffers;
  std::vector<std::string> buffer_names;  // for messages
};

// A kernel of a cuda module: its buffers must be on one GPU; the grid is
// an expression of the symbols, the block a constant.
struct CudaLaunchStep {
  std::unique_ptr<CudaKernel> kernel;
  std::vector<int> buffers;
  std::vector<std::string> buffer_names;  // for messages
  Dim grid;
  int block = 0;
  // Per buffer (or empty): the bytes its data pointer must be a multiple
  // of (0: any), and whether the kernel writes it. A buffer that is not
  // aligned is copied to memory that is for the launch, and back after it
  // where written.
  std::vector<int> alignment;
  std::vector<bool> written;
};

struct ViewStep {
  int slot;
  int base;
  std::vector<Dim> sizes;
  std::vector<Dim> strides;
  Dim offset;
};

struct ExternStep {
  BoundOp op;                                   // its node names slots
  absl::flat_hash_map<std::string, Dim> exprs;  // its symbolic arguments
  // (slot, dtype) of the outputs whose dtype the graph gives: a few ATen
  // kernels disagree with torch's meta functions (batch norm's new running
  // statistics of bfloat16 buffers are bfloat16 on CUDA, float32 by its
  // meta), and the plan's later steps rely on the graph's dtypes.
  std::vector<std::pair<int, at::ScalarType>> dtypes;
  // (slot, strides) of the outputs whose strides the graph gives: kernels
  // read an extern's result by those strides, so a result ATen laid out
  // otherwise (an op whose kernel choice depends on the device, such as
  // fused attention's fallbacks) is copied into that layout.
  std::vector<std::pair<int, std::vector<Dim>>> layouts;
};

struct FreeStep {
  int slot;
  bool keep = false;  // an Alloc reuses its storage: keep it until then
};

struct Step {
  std::string label;  // "step 3 (launch 'k0')"
  std::variant<AllocStep, LaunchStep, CudaLaunchStep, ViewStep, ExternStep, FreeStep> kind;
};

struct Input {
  std::string name;
  at::ScalarType dtype;
  std::string device_type;  // empty: any
  // device_type's enum where it names one of these (a fast check);
  // otherwise compared by name.
  c10::DeviceType device = c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES;
  std::vector<Dim> sizes;
  std::vector<Dim> strides;  // empty: not checked
};

struct Binding {
  int symbol;  // index into the symbol values
  int input;
  int dim;
};

// A module of the graph: a loaded shared object (c++) or a CUBIN (cuda).
struct Module {
  std::shared_ptr<const LoadedModule> cpu;
  std::shared_ptr<CudaModule> cuda;
};

// A plan made ready to run.
struct BuiltPlan {
  std::vector<Step> steps;
  std::vector<int> outputs;  // slots
  int num_slots = 0;
  bool reuses = false;  // whether any Alloc reuses storage
};

// The steps of `plan`, whose inputs take slots 0..n-1; `symbols` are the
// distinct symbols in kernel order, `modules` the graph's modules. Errors as
// PlanExecutor::Create gives them.
absl::StatusOr<BuiltPlan> BuildPlan(const v1::ExecutionPlan& plan, const SymbolTable& symbols,
                                    const std::vector<Module>& modules);

}  // namespace kiln::runtime::plan_internal

#endif  // KILN_CLIENT_RUNTIME_PLAN_STEPS_H_
