// PlanExecutor (plan_executor.h).
//
// Create loads the modules, parses the inputs' metadata and builds the
// steps (plan_steps.h). Run checks the inputs, computes the symbols and runs
// the steps over an environment indexed by slot.
#include "client/runtime/plan_executor.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/as_strided.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/GradMode.h>

#include <exception>
#include <string>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/runtime/plan_steps.h"
#include "common/status_macros.h"

namespace kiln::runtime {
using plan_internal::AllocStep;
using plan_internal::Annotate;
using plan_internal::Binding;
using plan_internal::BuildPlan;
using plan_internal::BuiltPlan;
using plan_internal::CudaLaunchStep;
using plan_internal::Dim;
using plan_internal::ExternStep;
using plan_internal::FreeStep;
using plan_internal::Input;
using plan_internal::Ints;
using plan_internal::LaunchStep;
using plan_internal::Module;
using plan_internal::Step;
using plan_internal::SymbolTable;
using plan_internal::ViewStep;
namespace {

// Whether values of two devices live in the same memory as far as a plan is
// concerned: same type, and same index when both name one.
bool SameDevice(const c10::Device& a, const c10::Device& b) {
  return a.type() == b.type() && (!a.has_index() || !b.has_index() || a.index() == b.index());
}

// torch's name of a dtype: "torch.float32".
std::string DtypeName(at::ScalarType t) { return "torch." + c10::getDtypeNames(t).first; }

std::string IntsString(at::IntArrayRef v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) absl::StrAppend(&s, i ? ", " : "", v[i]);
  return s + "]";
}

// `t` in fresh memory at the same strides: a copy of the bytes its elements
// span (any overlap of its elements is kept), at the start of a block of
// the caching allocator, which is aligned to 512 bytes.
at::Tensor AlignedCopy(const at::Tensor& t) {
  const int64_t item = t.element_size();
  const int64_t bytes =
      static_cast<int64_t>(at::detail::computeStorageNbytes(t.sizes(), t.strides(), item));
  const at::TensorOptions raw = t.options().dtype(at::kByte);
  at::Tensor span = at::empty({0}, raw).set_(t.storage(), t.storage_offset() * item, {bytes}, {1});
  at::Tensor copy = at::empty({bytes}, raw);
  copy.copy_(span);
  return at::empty({0}, t.options()).set_(copy.storage(), 0, t.sizes(), t.strides());
}

}  // namespace

struct PlanExecutor::Impl {
  std::vector<Module> modules;  // keeps the code loaded
  SymbolTable symbols;          // distinct symbols, in kernel order
  std::vector<Binding> bindings;
  std::vector<Input> inputs;  // slots 0..n-1
  std::vector<Step> steps;
  std::vector<int> outputs;  // slots
  int num_slots = 0;
  bool reuses = false;  // whether any Alloc reuses storage

  absl::Status CheckInputs(const std::vector<at::Tensor>& in) const;
  absl::StatusOr<std::vector<int64_t>> ResolveSymbols(const std::vector<at::Tensor>& in) const;
  absl::Status CheckSizes(const std::vector<at::Tensor>& in,
                          const std::vector<int64_t>& values) const;
  absl::StatusOr<Ints> Evaluate(const std::vector<Dim>& dims, const std::vector<int64_t>& values,
                                bool sizes) const;
  absl::Status RunStep(const Step& step, const std::vector<int64_t>& values,
                       std::vector<at::Tensor>& env, std::vector<at::Tensor>& dead) const;
};

PlanExecutor::PlanExecutor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PlanExecutor::~PlanExecutor() = default;

int PlanExecutor::num_inputs() const { return static_cast<int>(impl_->inputs.size()); }
int PlanExecutor::num_outputs() const { return static_cast<int>(impl_->outputs.size()); }

absl::StatusOr<std::unique_ptr<PlanExecutor>> PlanExecutor::Create(const v1::CompiledGraph& graph,
                                                                   absl::string_view sm_arch) {
  return Create(graph, ModuleLoader::Shared(), sm_arch);
}

absl::StatusOr<std::unique_ptr<PlanExecutor>> PlanExecutor::Create(const v1::CompiledGraph& graph,
                                                                   ModuleLoader& loader,
                                                                   absl::string_view sm_arch) {
  auto impl = std::make_unique<Impl>();
  const v1::ExecutionPlan& plan = graph.plan();

  for (int m = 0; m < graph.modules_size(); ++m) {
    const v1::CompiledModule& module = graph.modules(m);
    const std::string where = absl::StrCat("modules[", m, "]");
    Module loaded;
    if (module.language() == "cuda") {
      if (sm_arch.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": a cuda module needs the artifact's target.sm_arch"));
      }
      absl::StatusOr<std::shared_ptr<CudaModule>> cuda =
          CudaModule::Shared(module.binary(), sm_arch);
      if (!cuda.ok()) return Annotate(cuda.status(), where);
      loaded.cuda = *std::move(cuda);
    } else if (module.language() == "c++") {
      absl::StatusOr<std::shared_ptr<const LoadedModule>> cpu = loader.Load(module.binary());
      if (!cpu.ok()) return Annotate(cpu.status(), where);
      loaded.cpu = *std::move(cpu);
    } else {
      return absl::FailedPreconditionError(absl::StrCat(where, ": language '", module.language(),
                                                        "': this runtime loads c++ and cuda"));
    }
    impl->modules.push_back(std::move(loaded));
  }

  for (int i = 0; i < plan.symbols_size(); ++i) {
    const v1::SymbolBinding& b = plan.symbols(i);
    const std::string where = absl::StrCat("plan.symbols[", i, "] ('", b.symbol(), "')");
    if (!ir::IsSymbolName(b.symbol())) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not a symbol name"));
    }
    if (b.input() < 0 || b.input() >= plan.inputs_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": input ", b.input(), " out of range"));
    }
    const int rank = plan.inputs(b.input()).value().meta().sizes_size();
    if (b.dim() < 0 || b.dim() >= rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": dim ", b.dim(), " out of range (input ", b.input(), " has rank ", rank, ")"));
    }
    auto [it, added] = impl->symbols.emplace(b.symbol(), static_cast<int>(impl->symbols.size()));
    impl->bindings.push_back(Binding{it->second, b.input(), b.dim()});
  }

  for (int i = 0; i < plan.inputs_size(); ++i) {
    const v1::Value& v = plan.inputs(i).value();
    const std::string where = absl::StrCat("plan.inputs[", i, "] ('", v.name(), "')");
    Input in;
    in.name = v.name();
    absl::StatusOr<at::ScalarType> dtype = ScalarTypeFromProto(v.meta().dtype());
    if (!dtype.ok()) return Annotate(dtype.status(), where);
    in.dtype = *dtype;
    in.device_type = v.meta().device().type();
    if (in.device_type == "cpu") in.device = c10::DeviceType::CPU;
    if (in.device_type == "cuda") in.device = c10::DeviceType::CUDA;
    for (int k = 0; k < v.meta().sizes_size(); ++k) {
      absl::StatusOr<Dim> d = Dim::Parse(v.meta().sizes(k), impl->symbols);
      if (!d.ok()) return Annotate(d.status(), absl::StrCat(where, ": sizes[", k, "]"));
      in.sizes.push_back(*std::move(d));
    }
    if (v.meta().strides_size() == v.meta().sizes_size()) {
      for (int k = 0; k < v.meta().strides_size(); ++k) {
        absl::StatusOr<Dim> d = Dim::Parse(v.meta().strides(k), impl->symbols);
        if (!d.ok()) return Annotate(d.status(), absl::StrCat(where, ": strides[", k, "]"));
        in.strides.push_back(*std::move(d));
      }
    }
    impl->inputs.push_back(std::move(in));
  }

  ASSIGN_OR_RETURN(BuiltPlan built, BuildPlan(plan, impl->symbols, impl->modules));
  impl->steps = std::move(built.steps);
  impl->outputs = std::move(built.outputs);
  impl->num_slots = built.num_slots;
  impl->reuses = built.reuses;
  return std::unique_ptr<PlanExecutor>(new PlanExecutor(std::move(impl)));
}

absl::Status PlanExecutor::Impl::CheckInputs(const std::vector<at::Tensor>& in) const {
  if (in.size() != inputs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the plan takes ", inputs.size(), " inputs, got ", in.size()));
  }
  for (size_t i = 0; i < in.size(); ++i) {
    const Input& want = inputs[i];
    const at::Tensor& t = in[i];
    // Every call checks every input: the message is made only for one that
    // fails.
    auto label = [&] { return absl::StrCat("input ", i, " ('", want.name, "')"); };
    if (!t.defined()) {
      return absl::InvalidArgumentError(absl::StrCat(label(), " is an undefined tensor"));
    }
    if (t.scalar_type() != want.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(label(), " is ", DtypeName(t.scalar_type()),
                                                     "; the plan expects ", DtypeName(want.dtype)));
    }
    if (t.dim() != static_cast<int64_t>(want.sizes.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat(label(), " has rank ", t.dim(), "; the plan expects ", want.sizes.size()));
    }
    if (!want.device_type.empty() && t.device().type() != want.device &&
        c10::DeviceTypeName(t.device().type(), /*lower_case=*/true) != want.device_type) {
      return absl::InvalidArgumentError(absl::StrCat(label(), " is on ", t.device().str(),
                                                     "; the plan expects ", want.device_type));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> PlanExecutor::Impl::ResolveSymbols(
    const std::vector<at::Tensor>& in) const {
  std::vector<int64_t> values(symbols.size(), 0);
  std::vector<int> bound_by(symbols.size(), -1);  // index into bindings
  for (size_t k = 0; k < bindings.size(); ++k) {
    const Binding& b = bindings[k];
    const int64_t size = in[b.input].size(b.dim);
    if (bound_by[b.symbol] < 0) {
      values[b.symbol] = size;
      bound_by[b.symbol] = static_cast<int>(k);
      continue;
    }
    if (values[b.symbol] != size) {
      const Binding& first = bindings[bound_by[b.symbol]];
      std::string name;
      for (const auto& [n, index] : symbols) {
        if (index == b.symbol) name = n;
      }
      return absl::InvalidArgumentError(
          absl::StrCat("input ", b.input, " ('", inputs[b.input].name, "') dim ", b.dim, " is ",
                       size, ", but symbol ", name, " is ", values[b.symbol], " from input ",
                       first.input, " ('", inputs[first.input].name, "') dim ", first.dim));
    }
  }
  return values;
}

absl::StatusOr<Ints> PlanExecutor::Impl::Evaluate(const std::vector<Dim>& dims,
                                                  const std::vector<int64_t>& values,
                                                  bool sizes) const {
  Ints out;
  out.reserve(dims.size());
  for (size_t k = 0; k < dims.size(); ++k) {
    ASSIGN_OR_RETURN(int64_t v, dims[k].Evaluate(values, symbols));
    if (sizes && v < 0) {
      return absl::InvalidArgumentError(absl::StrCat("size ", k, " evaluates to ", v));
    }
    out.push_back(v);
  }
  return out;
}

absl::Status PlanExecutor::Impl::CheckSizes(const std::vector<at::Tensor>& in,
                                            const std::vector<int64_t>& values) const {
  for (size_t i = 0; i < in.size(); ++i) {
    const Input& want = inputs[i];
    const at::Tensor& t = in[i];
    auto label = [&] { return absl::StrCat("input ", i, " ('", want.name, "')"); };
    for (size_t d = 0; d < want.sizes.size(); ++d) {
      absl::StatusOr<int64_t> size = want.sizes[d].Evaluate(values, symbols);
      if (size.ok() && *size < 0) {
        size = absl::InvalidArgumentError(absl::StrCat("size ", d, " evaluates to ", *size));
      }
      if (!size.ok()) return Annotate(size.status(), label());
      if (t.size(d) != *size) {
        return absl::InvalidArgumentError(absl::StrCat(label(), " dim ", d, " is ", t.size(d),
                                                       "; the plan expects ", *size, " (sizes ",
                                                       IntsString(t.sizes()), ")"));
      }
    }
    // The stride of a dim of size 0 or 1 never moves an address, and a
    // tensor without elements has none to address (autograd's gradient of
    // an empty output may come with any strides).
    if (t.numel() == 0) continue;
    for (size_t d = 0; d < want.strides.size(); ++d) {
      if (t.size(d) <= 1) continue;
      absl::StatusOr<int64_t> stride = want.strides[d].Evaluate(values, symbols);
      if (!stride.ok()) return Annotate(stride.status(), label());
      if (t.stride(d) != *stride) {
        return absl::InvalidArgumentError(absl::StrCat(label(), " dim ", d, " has stride ",
                                                       t.stride(d), "; the plan expects ", *stride,
                                                       " (strides ", IntsString(t.strides()), ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status PlanExecutor::Impl::RunStep(const Step& step, const std::vector<int64_t>& values,
                                         std::vector<at::Tensor>& env,
                                         std::vector<at::Tensor>& dead) const {
  if (const auto* s = std::get_if<AllocStep>(&step.kind)) {
    ASSIGN_OR_RETURN(Ints sizes, Evaluate(s->sizes, values, /*sizes=*/true));
    ASSIGN_OR_RETURN(Ints strides, Evaluate(s->strides, values, /*sizes=*/false));
    if (s->reuse >= 0) {
      at::Tensor old = std::move(dead[s->reuse]);
      // Only when nothing else (a view, another name) shares the storage.
      if (old.defined() && old.use_count() == 1 && old.storage().use_count() == 1 &&
          SameDevice(old.device(), s->options.device())) {
        const size_t needed = at::detail::computeStorageNbytes(
            sizes, strides, c10::elementSize(c10::typeMetaToScalarType(s->options.dtype())));
        if (needed <= old.storage().nbytes()) {
          at::Tensor t = at::empty({0}, s->options);
          t.set_(old.storage(), /*storage_offset=*/0, sizes, strides);
          if (s->zero) t.zero_();
          env[s->slot] = std::move(t);
          return absl::OkStatus();
        }
      }
    }
    env[s->slot] = at::empty_strided(sizes, strides, s->options);
    if (s->zero) env[s->slot].zero_();
    return absl::OkStatus();
  }

  if (const auto* s = std::get_if<LaunchStep>(&step.kind)) {
    absl::InlinedVector<void*, 8> buffers;
    buffers.reserve(s->buffers.size());
    for (size_t k = 0; k < s->buffers.size(); ++k) {
      const at::Tensor& t = env[s->buffers[k]];
      if (!t.defined() || !t.is_cpu()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "buffer '", s->buffer_names[k], "' is ",
            t.defined() ? absl::StrCat("on ", t.device().str()) : std::string("undefined"),
            "; a c++ kernel needs a defined tensor in host memory"));
      }
      buffers.push_back(t.data_ptr());
    }
    // A kernel that gathers throws when an index is out of range
    // (compiler/codegen/prelude/cpu.inc), after its loops.
    try {
      s->fn(buffers.data(), values.data());
    } catch (const std::exception& e) {
      return absl::OutOfRangeError(e.what());
    }
    return absl::OkStatus();
  }

  if (const auto* s = std::get_if<CudaLaunchStep>(&step.kind)) {
    absl::InlinedVector<uint64_t, 16> params;
    params.reserve(s->buffers.size() + values.size());
    // (buffer, its aligned copy) of the buffers that were not aligned.
    absl::InlinedVector<std::pair<size_t, at::Tensor>, 2> copies;
    int device = -1;
    for (size_t k = 0; k < s->buffers.size(); ++k) {
      const at::Tensor& t = env[s->buffers[k]];
      if (!t.defined() || !t.is_cuda() || (device >= 0 && t.get_device() != device)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "buffer '", s->buffer_names[k], "' is ",
            t.defined() ? absl::StrCat("on ", t.device().str()) : std::string("undefined"),
            "; a cuda kernel needs defined tensors on one GPU",
            device >= 0 ? absl::StrCat(" (cuda:", device, ")") : std::string()));
      }
      device = t.get_device();
      uint64_t ptr = reinterpret_cast<uint64_t>(t.data_ptr());
      const uint64_t alignment = s->alignment.empty() ? 0 : s->alignment[k];
      if (alignment > 1 && ptr % alignment != 0 && t.numel() > 0) {
        copies.emplace_back(k, AlignedCopy(t));
        ptr = reinterpret_cast<uint64_t>(copies.back().second.data_ptr());
      }
      params.push_back(ptr);
    }
    if (device < 0) return absl::InvalidArgumentError("a cuda kernel needs a buffer");
    for (int64_t v : values) params.push_back(static_cast<uint64_t>(v));
    ASSIGN_OR_RETURN(int64_t grid, s->grid.Evaluate(values, symbols));
    RETURN_IF_ERROR(s->kernel->Launch(device, grid, s->block, params.data(), params.size()));
    for (const auto& [k, copy] : copies) {
      if (s->written[k]) env[s->buffers[k]].copy_(copy);
    }
    return absl::OkStatus();
  }

  if (const auto* s = std::get_if<ViewStep>(&step.kind)) {
    ASSIGN_OR_RETURN(Ints sizes, Evaluate(s->sizes, values, /*sizes=*/true));
    ASSIGN_OR_RETURN(Ints strides, Evaluate(s->strides, values, /*sizes=*/false));
    ASSIGN_OR_RETURN(int64_t offset, s->offset.Evaluate(values, symbols));
    env[s->slot] = at::as_strided(env[s->base], sizes, strides, offset);
    return absl::OkStatus();
  }

  if (const auto* s = std::get_if<ExternStep>(&step.kind)) {
    RETURN_IF_ERROR(s->op.Call(env, [&](const std::string& expr) -> absl::StatusOr<int64_t> {
      auto it = s->exprs.find(expr);
      if (it == s->exprs.end()) {  // SymbolicExprs() names every one
        return absl::InternalError("expression not prepared at Create");
      }
      return it->second.Evaluate(values, symbols);
    }));
    for (const auto& [slot, dtype] : s->dtypes) {
      at::Tensor& t = env[slot];
      if (t.defined() && t.scalar_type() != dtype) t = t.to(dtype);
    }
    for (const auto& [slot, dims] : s->layouts) {
      at::Tensor& t = env[slot];
      if (!t.defined() || t.dim() != static_cast<int64_t>(dims.size())) continue;
      ASSIGN_OR_RETURN(Ints strides, Evaluate(dims, values, /*sizes=*/false));
      bool differs = false;
      for (int64_t d = 0; d < t.dim(); ++d) {
        // Dimensions of size 0 or 1 have no layout.
        differs |= t.size(d) > 1 && t.stride(d) != strides[d];
      }
      if (differs) t = at::empty_strided(t.sizes(), strides, t.options()).copy_(t);
    }
    return absl::OkStatus();
  }

  const auto& s = std::get<FreeStep>(step.kind);
  if (s.keep) {
    dead[s.slot] = std::move(env[s.slot]);
  } else {
    env[s.slot].reset();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<at::Tensor>> PlanExecutor::Run(
    const std::vector<at::Tensor>& inputs) const {
  const Impl& impl = *impl_;
  RETURN_IF_ERROR(impl.CheckInputs(inputs));
  ASSIGN_OR_RETURN(std::vector<int64_t> values, impl.ResolveSymbols(inputs));
  RETURN_IF_ERROR(impl.CheckSizes(inputs, values));

  c10::AutoGradMode no_grad(false);
  // Every ATen call of the plan goes straight to its kernel, past autograd's
  // and view tracking's layers (0.2-0.3 us a call): the plan's tensors
  // carry no gradient, and the caller records what autograd must know
  // (compiled.py's autograd function) around the whole run.
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  std::vector<at::Tensor> env(impl.num_slots);
  std::vector<at::Tensor> dead(impl.reuses ? impl.num_slots : 0);
  for (size_t i = 0; i < inputs.size(); ++i) env[i] = inputs[i];
  for (const Step& step : impl.steps) {
    absl::Status status;
    try {
      status = impl.RunStep(step, values, env, dead);
    } catch (const c10::OutOfMemoryError& e) {
      const absl::string_view what = e.what_without_backtrace();
      status = absl::ResourceExhaustedError(what.substr(0, what.find('\n')));
    } catch (const c10::Error& e) {
      const absl::string_view what = e.what_without_backtrace();
      status = absl::InternalError(what.substr(0, what.find('\n')));
    } catch (const std::exception& e) {
      const absl::string_view what = e.what();
      status = absl::InternalError(what.substr(0, what.find('\n')));
    }
    if (!status.ok()) return Annotate(status, step.label);
  }

  std::vector<at::Tensor> outputs;
  outputs.reserve(impl.outputs.size());
  for (int slot : impl.outputs) outputs.push_back(env[slot]);
  return outputs;
}

}  // namespace kiln::runtime
