#include "compiler/target/target.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/cuda_driver.h"

namespace kiln::target {
namespace {

class CpuTarget final : public Target {
 public:
  explicit CpuTarget(v1::Target proto) : proto_(std::move(proto)) {}
  std::string device_type() const override { return "cpu"; }
  const v1::Target& proto() const override { return proto_; }

  std::unique_ptr<codegen::CodegenBackend> MakeCodegen(
      const ToolchainOptions& options) const override {
    codegen::CppOptions cpp;
    cpp.isa = proto_.cpu_isa();
    cpp.scratch_dir = options.scratch_dir;
    cpp.timeout = options.timeout;
    cpp.cancel = options.cancel;
    cpp.compiler = options.cpp_compiler;
    if (options.quick) cpp.optimization = "-O1";
    return codegen::MakeCppBackend(cpp);
  }

 private:
  const v1::Target proto_;
};

class CudaTarget final : public Target {
 public:
  explicit CudaTarget(v1::Target proto) : proto_(std::move(proto)) {}
  std::string device_type() const override { return "cuda"; }
  const v1::Target& proto() const override { return proto_; }

  std::unique_ptr<codegen::CodegenBackend> MakeCodegen(
      const ToolchainOptions& options) const override {
    codegen::CudaOptions cuda;
    cuda.sm_arch = proto_.sm_arch();
    cuda.cuda_version = proto_.cuda_version();
    cuda.helper = options.nvrtc_helper;
    cuda.fast_compile = options.nvrtc_fast_compile.empty() && options.quick
                            ? codegen::kQuickNvrtcLevel
                            : options.nvrtc_fast_compile;
    cuda.scratch_dir = options.scratch_dir;
    cuda.timeout = options.timeout;
    cuda.cancel = options.cancel;
    return codegen::MakeCudaBackend(cuda);
  }
  // An H100's or H200's (sm_90). A kernel of fewer blocks leaves SMs idle.
  int64_t multiprocessors() const override { return 132; }
  loop::FusionPolicy fusion_policy() const override {
    loop::FusionPolicy policy;
    policy.keep_in_output = false;
    // Arithmetic is cheap beside a GPU's memory traffic: a batch norm's
    // output under its ReLU and a residual add (11 nodes from the two
    // convolutions' outputs) is computed again in its gradient's kernel
    // rather than stored by a kernel of its own and read back.
    policy.max_recompute_nodes = 24;
    policy.max_recompute_loads = 3;
    return policy;
  }

 private:
  const v1::Target proto_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Target>> SelectTarget(const v1::Target& wanted,
                                                     const ir::Graph& graph) {
  const std::string& device = wanted.device_type();
  if (device != "cpu" && device != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("options.target.device_type: '",
                                                   absl::CHexEscape(device.substr(0, 64)),
                                                   "' is not a device kiln generates code for "
                                                   "(cpu, cuda)"));
  }
  for (const ir::Value& v : graph.values()) {
    if (v.meta.device_type.empty() || v.meta.device_type == device) continue;
    // Values on the CPU in a CUDA graph are 0-dim constants ATen moves
    // itself (a scalar tensor operand); anything else is a mismatch.
    if (device == "cuda" && v.meta.device_type == "cpu" && v.meta.sizes.empty()) continue;
    return absl::InvalidArgumentError(absl::StrCat("value '", v.name.substr(0, 256), "' is on ",
                                                   v.meta.device_type.substr(0, 64),
                                                   " but options.target.device_type is ", device,
                                                   ": compile for the device the tensors are on"));
  }
  if (device == "cpu") return std::make_unique<CpuTarget>(wanted);
  if (!cuda::ParseSmArch(wanted.sm_arch()).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("options.target.sm_arch: '",
                                                   absl::CHexEscape(wanted.sm_arch().substr(0, 64)),
                                                   "' is not an SM arch like sm_90"));
  }
  return std::make_unique<CudaTarget>(wanted);
}

}  // namespace kiln::target
