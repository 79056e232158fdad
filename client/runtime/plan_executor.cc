// PlanExecutor (plan_executor.h).
//
// Create turns the plan into a list of Steps over value slots (a slot per
// value name, inputs first) with every expression parsed into a Dim and
// every function resolved; on the way it walks the plan once with the
// state of each slot (undefined, live, freed, reused), which is where every
// plan error is found. Run checks the inputs, computes the symbols and runs
// the steps over an environment indexed by slot.
#include "client/runtime/plan_executor.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/as_strided.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/GradMode.h>

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cache/guard_expr.h"
#include "client/runtime/interpreter.h"
#include "common/status_macros.h"
#include "compiler/ir/graph.h"

namespace kiln::runtime {
namespace {

// The kernel ABI (compiler/codegen/codegen.h).
using KernelFn = void (*)(void* const* buffers, const int64_t* symbols);

using SymbolTable = absl::flat_hash_map<std::string, int>;  // name -> index
using Ints = absl::InlinedVector<int64_t, 6>;

// `status` with `context` in front of its message, same code.
absl::Status Annotate(const absl::Status& status, absl::string_view context) {
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
    if (std::optional<absl::string_view> bare = cache::AsBareSymbol(text)) {
      auto it = symbols.find(*bare);
      if (it == symbols.end()) return Unbound(text, *bare);
      d.symbol_ = it->second;
      return d;
    }
    ASSIGN_OR_RETURN(cache::SymExpr expr, cache::SymExpr::Parse(text));
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
  int symbol_ = -1;                     // index into the symbol values
  std::optional<cache::SymExpr> expr_;  // set for an expression
};

struct AllocStep {
  int slot;
  at::TensorOptions options;
  std::vector<Dim> sizes;
  std::vector<Dim> strides;
  int reuse = -1;  // the freed slot whose storage to reuse, or -1
};

struct LaunchStep {
  KernelFn fn;
  std::vector<int> buffers;
  std::vector<std::string> buffer_names;  // for messages
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
};

struct FreeStep {
  int slot;
  bool keep = false;  // an Alloc reuses its storage: keep it until then
};

struct Step {
  std::string label;  // "step 3 (launch 'k0')"
  std::variant<AllocStep, LaunchStep, ViewStep, ExternStep, FreeStep> kind;
};

struct Input {
  std::string name;
  at::ScalarType dtype;
  std::string device_type;  // empty: any
  std::vector<Dim> sizes;
  std::vector<Dim> strides;  // empty: not checked
};

struct Binding {
  int symbol;  // index into the symbol values
  int input;
  int dim;
};

// Whether values of two devices live in the same memory as far as a plan is
// concerned: same type, and same index when both name one.
bool SameDevice(const c10::Device& a, const c10::Device& b) {
  return a.type() == b.type() && (!a.has_index() || !b.has_index() || a.index() == b.index());
}

std::string IntsString(at::IntArrayRef v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) absl::StrAppend(&s, i ? ", " : "", v[i]);
  return s + "]";
}

// Builds the Steps; the state of every slot along the plan is known here.
class PlanBuilder {
 public:
  PlanBuilder(const v1::ExecutionPlan& plan, const SymbolTable& symbols,
              const std::vector<std::shared_ptr<const LoadedModule>>& modules)
      : plan_(plan), symbols_(symbols), modules_(modules) {}

  // Defines the plan's inputs, in order; they take slots 0..n-1.
  absl::Status DefineInputs() {
    for (int i = 0; i < plan_.inputs_size(); ++i) {
      RETURN_IF_ERROR(
          Define(plan_.inputs(i).value().name(), absl::StrCat("plan.inputs[", i, "]")).status());
      is_input_.back() = true;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<Step>> BuildSteps() {
    std::vector<Step> steps;
    steps.reserve(plan_.steps_size());
    for (int i = 0; i < plan_.steps_size(); ++i) {
      const v1::PlanStep& p = plan_.steps(i);
      Step step;
      switch (p.kind_case()) {
        case v1::PlanStep::kAlloc: {
          step.label = absl::StrCat("step ", i, " (alloc '", p.alloc().value(), "')");
          ASSIGN_OR_RETURN(AllocStep s, Alloc(p.alloc(), step.label, steps));
          step.kind = std::move(s);
          break;
        }
        case v1::PlanStep::kLaunch: {
          step.label = absl::StrCat("step ", i, " (launch '", p.launch().symbol(), "')");
          ASSIGN_OR_RETURN(LaunchStep s, Launch(p.launch(), step.label));
          step.kind = std::move(s);
          break;
        }
        case v1::PlanStep::kExternCall: {
          step.label = absl::StrCat("step ", i, " (extern '", p.extern_call().node().name(), "')");
          ASSIGN_OR_RETURN(ExternStep s, Extern(p.extern_call().node(), step.label));
          step.kind = std::move(s);
          break;
        }
        case v1::PlanStep::kView: {
          step.label = absl::StrCat("step ", i, " (view '", p.view().value(), "')");
          ASSIGN_OR_RETURN(ViewStep s, View(p.view(), step.label));
          step.kind = std::move(s);
          break;
        }
        case v1::PlanStep::kFree: {
          step.label = absl::StrCat("step ", i, " (free '", p.free().value(), "')");
          ASSIGN_OR_RETURN(int slot, Use(p.free().value(), step.label));
          state_[slot] = State::kFreed;
          freed_by_[slot] = static_cast<int>(steps.size());
          step.kind = FreeStep{slot};
          break;
        }
        case v1::PlanStep::KIND_NOT_SET:
          return absl::InvalidArgumentError(absl::StrCat("step ", i, " has no kind"));
      }
      steps.push_back(std::move(step));
    }
    return steps;
  }

  absl::StatusOr<std::vector<int>> Outputs() {
    std::vector<int> outputs;
    for (int i = 0; i < plan_.outputs_size(); ++i) {
      ASSIGN_OR_RETURN(int slot, Use(plan_.outputs(i), absl::StrCat("plan.outputs[", i, "]")));
      outputs.push_back(slot);
    }
    return outputs;
  }

  int num_slots() const { return static_cast<int>(state_.size()); }

 private:
  enum class State { kLive, kFreed, kReused };

  absl::StatusOr<int> Define(const std::string& name, absl::string_view where) {
    if (name.empty())
      return absl::InvalidArgumentError(absl::StrCat(where, ": a value has no name"));
    const int slot = num_slots();
    if (!slots_.emplace(name, slot).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the value '", name, "' is defined twice"));
    }
    state_.push_back(State::kLive);
    is_input_.push_back(false);
    freed_by_.push_back(-1);
    return slot;
  }

  // The slot of a live value.
  absl::StatusOr<int> Use(const std::string& name, absl::string_view where) {
    auto it = slots_.find(name);
    if (it == slots_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the value '", name, "' is not defined before it"));
    }
    if (state_[it->second] != State::kLive) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the value '", name, "' was freed before it"));
    }
    return it->second;
  }

  absl::StatusOr<std::vector<Dim>> Dims(const google::protobuf::RepeatedPtrField<v1::SymInt>& ps,
                                        absl::string_view where, absl::string_view field) {
    std::vector<Dim> dims;
    dims.reserve(ps.size());
    for (int k = 0; k < ps.size(); ++k) {
      absl::StatusOr<Dim> d = Dim::Parse(ps[k], symbols_);
      if (!d.ok()) return Annotate(d.status(), absl::StrCat(where, ": ", field, "[", k, "]"));
      dims.push_back(*std::move(d));
    }
    return dims;
  }

  absl::StatusOr<AllocStep> Alloc(const v1::PlanStep::Alloc& p, const std::string& where,
                                  std::vector<Step>& steps) {
    AllocStep s;
    absl::StatusOr<at::ScalarType> dtype = ScalarTypeFromProto(p.dtype());
    if (!dtype.ok()) return Annotate(dtype.status(), where);
    c10::Device device(c10::kCPU);
    if (p.has_device() && !p.device().type().empty()) {
      try {
        device = c10::Device(p.device().index() >= 0
                                 ? absl::StrCat(p.device().type(), ":", p.device().index())
                                 : p.device().type());
      } catch (const std::exception&) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": unknown device '", p.device().type(), "'"));
      }
    }
    s.options = at::TensorOptions().dtype(*dtype).device(device);
    ASSIGN_OR_RETURN(s.sizes, Dims(p.sizes(), where, "sizes"));
    ASSIGN_OR_RETURN(s.strides, Dims(p.strides(), where, "strides"));
    if (s.sizes.size() != s.strides.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", s.sizes.size(), " sizes but ", s.strides.size(), " strides"));
    }
    if (!p.reuse().empty()) {
      auto it = slots_.find(p.reuse());
      if (it == slots_.end() || state_[it->second] != State::kFreed || is_input_[it->second]) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": reuse names '", p.reuse(),
            "', which is not a freed value the plan allocated (or it was reused already)"));
      }
      s.reuse = it->second;
      state_[s.reuse] = State::kReused;
      std::get<FreeStep>(steps[freed_by_[s.reuse]].kind).keep = true;
    }
    ASSIGN_OR_RETURN(s.slot, Define(p.value(), where));
    return s;
  }

  absl::StatusOr<LaunchStep> Launch(const v1::PlanStep::Launch& p, const std::string& where) {
    if (p.module() < 0 || p.module() >= static_cast<int>(modules_.size())) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": module ", p.module(),
                                                     " out of range (the graph has ",
                                                     modules_.size(), " modules)"));
    }
    absl::StatusOr<void*> fn = modules_[p.module()]->Symbol(p.symbol());
    if (!fn.ok()) return Annotate(fn.status(), where);
    LaunchStep s;
    s.fn = reinterpret_cast<KernelFn>(*fn);
    for (const std::string& b : p.buffers()) {
      ASSIGN_OR_RETURN(int slot, Use(b, where));
      s.buffers.push_back(slot);
      s.buffer_names.push_back(b);
    }
    return s;
  }

  absl::StatusOr<ViewStep> View(const v1::PlanStep::View& p, const std::string& where) {
    ViewStep s;
    ASSIGN_OR_RETURN(s.base, Use(p.base(), where));
    ASSIGN_OR_RETURN(s.sizes, Dims(p.sizes(), where, "sizes"));
    ASSIGN_OR_RETURN(s.strides, Dims(p.strides(), where, "strides"));
    if (s.sizes.size() != s.strides.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", s.sizes.size(), " sizes but ", s.strides.size(), " strides"));
    }
    absl::StatusOr<Dim> offset = Dim::Parse(p.storage_offset(), symbols_);
    if (!offset.ok()) return Annotate(offset.status(), absl::StrCat(where, ": storage_offset"));
    s.offset = *std::move(offset);
    ASSIGN_OR_RETURN(s.slot, Define(p.value(), where));
    return s;
  }

  // The node is parsed by ir::Graph::FromProto as a one-node graph whose
  // inputs are its operands; its ValueIds are then renumbered to slots.
  absl::StatusOr<ExternStep> Extern(const v1::Node& node, const std::string& where) {
    v1::Graph g;
    g.set_name(node.name());
    std::vector<std::string> operands;
    auto operand = [&](const std::string& name) -> absl::Status {
      if (name.empty()) return absl::OkStatus();  // None in a tensor list
      RETURN_IF_ERROR(Use(name, where).status());
      for (const std::string& o : operands) {
        if (o == name) return absl::OkStatus();
      }
      operands.push_back(name);
      v1::Value* v = g.add_inputs()->mutable_value();
      v->set_name(name);
      v->mutable_meta();
      return absl::OkStatus();
    };
    for (const auto* list : {&node.args(), &node.kwargs()}) {
      for (const v1::Argument& a : *list) {
        if (a.has_tensor()) RETURN_IF_ERROR(operand(a.tensor()));
        if (a.has_tensors()) {
          for (const std::string& n : a.tensors().names()) RETURN_IF_ERROR(operand(n));
        }
      }
    }
    v1::Node* copy = g.add_nodes();
    *copy = node;
    for (v1::Value& out : *copy->mutable_outputs()) out.mutable_meta();
    absl::StatusOr<ir::Graph> parsed = ir::Graph::FromProto(g);
    if (!parsed.ok()) return Annotate(parsed.status(), where);

    std::vector<int> slot_of(parsed->values().size(), -1);  // ValueId -> slot
    for (const ir::Input& in : parsed->inputs()) {
      slot_of[in.value] = slots_.at(parsed->value(in.value).name);
    }
    ir::Node n = parsed->nodes()[0];
    for (ir::ValueId& v : n.outputs) {
      ASSIGN_OR_RETURN(slot_of[v], Define(parsed->value(v).name, where));
      v = slot_of[v];
    }
    for (auto* list : {&n.args, &n.kwargs}) {
      for (ir::Argument& a : *list) {
        if (auto* v = std::get_if<ir::ValueId>(&a.kind)) *v = slot_of[*v];
        if (auto* vs = std::get_if<std::vector<ir::ValueId>>(&a.kind)) {
          for (ir::ValueId& v : *vs) {
            if (v != ir::kNoValue) v = slot_of[v];
          }
        }
      }
    }
    absl::StatusOr<BoundOp> op = BoundOp::Create(n);
    if (!op.ok()) return Annotate(op.status(), where);
    ExternStep s{*std::move(op), {}, {}};
    for (int k = 0; k < node.outputs_size() && k < static_cast<int>(n.outputs.size()); ++k) {
      const v1::Value& out = node.outputs(k);
      if (out.name().empty() || !out.has_meta() || out.meta().dtype() == v1::DTYPE_UNSPECIFIED) {
        continue;
      }
      absl::StatusOr<at::ScalarType> dtype = ScalarTypeFromProto(out.meta().dtype());
      if (dtype.ok()) s.dtypes.emplace_back(n.outputs[k], *dtype);
    }
    for (const std::string& text : s.op.SymbolicExprs()) {
      absl::StatusOr<Dim> d = Dim::Parse(text, symbols_);
      if (!d.ok()) return Annotate(d.status(), where);
      s.exprs.emplace(text, *std::move(d));
    }
    return s;
  }

  const v1::ExecutionPlan& plan_;
  const SymbolTable& symbols_;
  const std::vector<std::shared_ptr<const LoadedModule>>& modules_;
  absl::flat_hash_map<std::string, int> slots_;  // value name -> slot
  std::vector<State> state_;                     // per slot
  std::vector<bool> is_input_;                   // per slot
  std::vector<int> freed_by_;                    // per slot: index of its Free step
};

}  // namespace

struct PlanExecutor::Impl {
  std::vector<std::shared_ptr<const LoadedModule>> modules;  // keeps the code loaded
  SymbolTable symbols;                                       // distinct symbols, in kernel order
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

absl::StatusOr<std::unique_ptr<PlanExecutor>> PlanExecutor::Create(const v1::CompiledGraph& graph) {
  return Create(graph, ModuleLoader::Shared());
}

absl::StatusOr<std::unique_ptr<PlanExecutor>> PlanExecutor::Create(const v1::CompiledGraph& graph,
                                                                   ModuleLoader& loader) {
  auto impl = std::make_unique<Impl>();
  const v1::ExecutionPlan& plan = graph.plan();

  for (int m = 0; m < graph.modules_size(); ++m) {
    const v1::CompiledModule& module = graph.modules(m);
    if (module.language() != "c++") {
      return absl::FailedPreconditionError(absl::StrCat(
          "modules[", m, "]: language '", module.language(), "': this runtime loads only c++"));
    }
    absl::StatusOr<std::shared_ptr<const LoadedModule>> loaded = loader.Load(module.binary());
    if (!loaded.ok()) return Annotate(loaded.status(), absl::StrCat("modules[", m, "]"));
    impl->modules.push_back(*std::move(loaded));
  }

  for (int i = 0; i < plan.symbols_size(); ++i) {
    const v1::SymbolBinding& b = plan.symbols(i);
    const std::string where = absl::StrCat("plan.symbols[", i, "] ('", b.symbol(), "')");
    if (!cache::IsSymbolName(b.symbol())) {
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

  PlanBuilder builder(plan, impl->symbols, impl->modules);
  RETURN_IF_ERROR(builder.DefineInputs());
  ASSIGN_OR_RETURN(impl->steps, builder.BuildSteps());
  ASSIGN_OR_RETURN(impl->outputs, builder.Outputs());
  impl->num_slots = builder.num_slots();
  for (const Step& step : impl->steps) {
    if (const auto* a = std::get_if<AllocStep>(&step.kind); a != nullptr && a->reuse >= 0) {
      impl->reuses = true;
    }
  }
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
    const std::string label = absl::StrCat("input ", i, " ('", want.name, "')");
    if (!t.defined()) {
      return absl::InvalidArgumentError(absl::StrCat(label, " is an undefined tensor"));
    }
    if (t.scalar_type() != want.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(label, " is ", c10::toString(t.scalar_type()),
                                                     "; the plan expects ",
                                                     c10::toString(want.dtype)));
    }
    if (t.dim() != static_cast<int64_t>(want.sizes.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, " has rank ", t.dim(), "; the plan expects ", want.sizes.size()));
    }
    if (!want.device_type.empty() &&
        c10::DeviceTypeName(t.device().type(), /*lower_case=*/true) != want.device_type) {
      return absl::InvalidArgumentError(absl::StrCat(label, " is on ", t.device().str(),
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
    const std::string label = absl::StrCat("input ", i, " ('", want.name, "')");
    absl::StatusOr<Ints> sizes = Evaluate(want.sizes, values, /*sizes=*/true);
    if (!sizes.ok()) return Annotate(sizes.status(), label);
    for (size_t d = 0; d < sizes->size(); ++d) {
      if (t.size(d) != (*sizes)[d]) {
        return absl::InvalidArgumentError(absl::StrCat(label, " dim ", d, " is ", t.size(d),
                                                       "; the plan expects ", (*sizes)[d],
                                                       " (sizes ", IntsString(t.sizes()), ")"));
      }
    }
    if (want.strides.empty()) continue;
    absl::StatusOr<Ints> strides = Evaluate(want.strides, values, /*sizes=*/false);
    if (!strides.ok()) return Annotate(strides.status(), label);
    for (size_t d = 0; d < strides->size(); ++d) {
      // The stride of a dim of size 0 or 1 never moves an address.
      if (t.size(d) > 1 && t.stride(d) != (*strides)[d]) {
        return absl::InvalidArgumentError(
            absl::StrCat(label, " dim ", d, " has stride ", t.stride(d), "; the plan expects ",
                         (*strides)[d], " (strides ", IntsString(t.strides()), ")"));
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
          env[s->slot] = std::move(t);
          return absl::OkStatus();
        }
      }
    }
    env[s->slot] = at::empty_strided(sizes, strides, s->options);
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
    s->fn(buffers.data(), values.data());
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
  std::vector<at::Tensor> env(impl.num_slots);
  std::vector<at::Tensor> dead(impl.reuses ? impl.num_slots : 0);
  for (size_t i = 0; i < inputs.size(); ++i) env[i] = inputs[i];
  for (const Step& step : impl.steps) {
    absl::Status status;
    try {
      status = impl.RunStep(step, values, env, dead);
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
