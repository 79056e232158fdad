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
}
