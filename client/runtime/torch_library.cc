// The plan executor as a torch library: the Python package's runtime
// (kiln/_executor.py loads it with torch.ops.load_library). It registers
//
//   torch.classes.kiln_runtime.PlanExecutor(graph: Tensor, sm_arch: str)
//       graph: the serialized kiln.v1.CompiledGraph as a uint8 CPU tensor;
//       sm_arch: the artifact's target.sm_arch ("" for c++ plans).
//     .run(inputs: List[Tensor]) -> List[Tensor]
//     .num_inputs() -> int, .num_outputs() -> int
//   torch.ops.kiln_runtime.check_artifact(format_version, device_type, cpu_isa)
//       raises unless this runtime can run an artifact with that header
//       (CheckArtifactHeader, compiled_function.h)
//   torch.ops.kiln_runtime.module_loads() -> int
//       c++ modules the process-wide ModuleLoader has opened
//   torch.classes.kiln_runtime.SymExpr(text: str)
//       a symbolic size expression (compiler/ir/sym_expr.h), parsed once
//     .evaluate(names: List[str], values: List[int]) -> int
//     .symbols() -> List[str], .text() -> str, .to_text() -> str,
//     .to_python() -> str
//
// Errors are raised as Python exceptions carrying the executor's message:
// ValueError for INVALID_ARGUMENT (a plan or an input that breaks the
// contract), NotImplementedError for FAILED_PRECONDITION (a module this
// runtime or device cannot run), torch.OutOfMemoryError when the device is
// out of memory, RuntimeError for the rest.
//
// Nothing here uses Python's C API, so the library is independent of the
// Python version: it depends only on libtorch.
#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/runtime/compiled_function.h"
#include "client/runtime/module_loader.h"
#include "client/runtime/plan_executor.h"
#include "compiler/ir/sym_expr.h"
#include "kiln/v1/artifact.pb.h"

namespace kiln::runtime {
namespace {

[[noreturn]] void Raise(const absl::Status& status) {
  const std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
      TORCH_CHECK_VALUE(false, message);
    case absl::StatusCode::kFailedPrecondition:
      TORCH_CHECK_NOT_IMPLEMENTED(false, message);
    case absl::StatusCode::kResourceExhausted:
      TORCH_CHECK_WITH(OutOfMemoryError, false, message);
    default:
      TORCH_CHECK(false, message);
  }
  std::abort();  // unreachable: every TORCH_CHECK above throws
}

class TorchPlanExecutor : public torch::CustomClassHolder {
 public:
  TorchPlanExecutor(const at::Tensor& graph, std::string sm_arch) {
    TORCH_CHECK_VALUE(graph.device().is_cpu() && graph.scalar_type() == at::kByte &&
                          graph.dim() == 1 && graph.is_contiguous(),
                      "PlanExecutor takes the serialized CompiledGraph as a contiguous 1-d "
                      "uint8 CPU tensor");
    TORCH_CHECK_VALUE(graph.numel() <= INT32_MAX, "the serialized CompiledGraph is ", graph.numel(),
                      " bytes, over protobuf's limit of 2 GiB");
    v1::CompiledGraph proto;
    TORCH_CHECK_VALUE(proto.ParseFromArray(graph.data_ptr(), static_cast<int>(graph.numel())),
                      "the bytes are not a serialized kiln.v1.CompiledGraph");
    absl::StatusOr<std::unique_ptr<PlanExecutor>> executor = PlanExecutor::Create(proto, sm_arch);
    if (!executor.ok()) Raise(executor.status());
    executor_ = *std::move(executor);
  }

  std::vector<at::Tensor> Run(const std::vector<at::Tensor>& inputs) const {
    absl::StatusOr<std::vector<at::Tensor>> outputs = executor_->Run(inputs);
    if (!outputs.ok()) Raise(outputs.status());
    return *std::move(outputs);
  }

  int64_t NumInputs() const { return executor_->num_inputs(); }
  int64_t NumOutputs() const { return executor_->num_outputs(); }

 private:
  std::unique_ptr<PlanExecutor> executor_;
};

class TorchSymExpr : public torch::CustomClassHolder {
 public:
  explicit TorchSymExpr(const std::string& text) : expr_(Parse(text)) {}

  // `names` and `values` bind symbols pairwise; a symbol of the expression
  // that they leave unbound is an error, as in SymExpr::Evaluate.
  int64_t Evaluate(const std::vector<std::string>& names,
                   const std::vector<int64_t>& values) const {
    TORCH_CHECK_VALUE(names.size() == values.size(), "SymExpr.evaluate: ", names.size(),
                      " names but ", values.size(), " values");
    absl::StatusOr<int64_t> v =
        expr_.EvaluateWith([&](absl::string_view name) -> std::optional<int64_t> {
          for (size_t i = 0; i < names.size(); ++i) {
            if (names[i] == name) return values[i];
          }
          return std::nullopt;
        });
    if (!v.ok()) Raise(v.status());
    return *v;
  }
  std::vector<std::string> Symbols() const { return expr_.symbols(); }
  std::string Text() const { return expr_.text(); }
  std::string ToText() const { return expr_.ToText(); }
  std::string ToPython() const { return expr_.ToPython(); }

 private:
  static ir::SymExpr Parse(const std::string& text) {
    absl::StatusOr<ir::SymExpr> e = ir::SymExpr::Parse(text);
    if (!e.ok()) Raise(e.status());
    return *std::move(e);
  }

  ir::SymExpr expr_;
};

}  // namespace
}  // namespace kiln::runtime

TORCH_LIBRARY(kiln_runtime, m) {
  using kiln::runtime::TorchPlanExecutor;
  m.class_<TorchPlanExecutor>("PlanExecutor")
      .def(torch::init<at::Tensor, std::string>())
      .def("run", &TorchPlanExecutor::Run)
      .def("num_inputs", &TorchPlanExecutor::NumInputs)
      .def("num_outputs", &TorchPlanExecutor::NumOutputs);
  m.def("check_artifact(int format_version, str device_type, str cpu_isa) -> ()",
        [](int64_t format_version, const std::string& device_type, const std::string& cpu_isa) {
          const absl::Status status = kiln::runtime::CheckArtifactHeader(
              static_cast<uint32_t>(std::clamp<int64_t>(format_version, 0, UINT32_MAX)),
              device_type, cpu_isa);
          if (!status.ok()) kiln::runtime::Raise(status);
        });
  m.def("module_loads() -> int", [] { return kiln::runtime::ModuleLoader::Shared().loads(); });
  using kiln::runtime::TorchSymExpr;
  m.class_<TorchSymExpr>("SymExpr")
      .def(torch::init<std::string>())
      .def("evaluate", &TorchSymExpr::Evaluate)
      .def("symbols", &TorchSymExpr::Symbols)
      .def("text", &TorchSymExpr::Text)
      .def("to_text", &TorchSymExpr::ToText)
      .def("to_python", &TorchSymExpr::ToPython);
}
