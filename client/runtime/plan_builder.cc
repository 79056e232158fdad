// The plan builder (plan_steps.h).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/runtime/plan_steps.h"
#include "common/status_macros.h"
#include "compiler/ir/graph.h"

namespace kiln::runtime::plan_internal {
namespace {

// The largest alignment a launch may ask of a buffer: the caching
// allocator's blocks start at multiples of 512 bytes.
constexpr int kMaxAlignment = 256;

// Builds the Steps; the state of every slot along the plan is known here.
class PlanBuilder {
 public:
  PlanBuilder(const v1::ExecutionPlan& plan, const SymbolTable& symbols,
              const std::vector<Module>& modules)
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
          RETURN_IF_ERROR(Launch(p.launch(), step.label, step));
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
          ASSIGN_OR_RETURN(int slot, Use(p.free().value(), step.label, /*read=*/false));
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

  // Whether a step or the plan's outputs read the value in `slot` (a Free
  // does not read).
  bool IsRead(int slot) const { return read_[slot]; }

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
    read_.push_back(false);
    is_input_.push_back(false);
    freed_by_.push_back(-1);
    return slot;
  }

  // The slot of a live value, marked read unless `read` is false.
  absl::StatusOr<int> Use(const std::string& name, absl::string_view where, bool read = true) {
    auto it = slots_.find(name);
    if (it == slots_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the value '", name, "' is not defined before it"));
    }
    if (state_[it->second] != State::kLive) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the value '", name, "' was freed before it"));
    }
    if (read) read_[it->second] = true;
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
    s.zero = p.zero();
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

  absl::Status Launch(const v1::PlanStep::Launch& p, const std::string& where, Step& step) {
    if (p.module() < 0 || p.module() >= static_cast<int>(modules_.size())) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": module ", p.module(),
                                                     " out of range (the graph has ",
                                                     modules_.size(), " modules)"));
    }
    std::vector<int> buffers;
    std::vector<std::string> names;
    for (const std::string& b : p.buffers()) {
      ASSIGN_OR_RETURN(int slot, Use(b, where));
      buffers.push_back(slot);
      names.push_back(b);
    }
    const Module& module = modules_[p.module()];
    if (module.cuda != nullptr) {
      CudaLaunchStep s;
      if (p.grid_size() != 1 || p.block_size() != 1 ||
          p.block(0).value_case() == v1::SymInt::kExpr) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": a cuda launch needs one grid size and one constant block size"));
      }
      if (p.block(0).int_value() < 1 || p.block(0).int_value() > 1024) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": block size ", p.block(0).int_value(), " is outside [1, 1024]"));
      }
      s.block = static_cast<int>(p.block(0).int_value());
      absl::StatusOr<Dim> grid = Dim::Parse(p.grid(0), symbols_);
      if (!grid.ok()) return Annotate(grid.status(), absl::StrCat(where, ": grid[0]"));
      s.grid = *std::move(grid);
      if ((p.alignment_size() != 0 && p.alignment_size() != p.buffers_size()) ||
          p.written_size() != p.alignment_size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", p.alignment_size(), " alignments and ", p.written_size(),
                         " written flags for ", p.buffers_size(), " buffers"));
      }
      for (int b = 0; b < p.alignment_size(); ++b) {
        const int a = p.alignment(b);
        if (a < 0 || a > kMaxAlignment || (a & (a - 1)) != 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": alignment ", a, " of buffer '", p.buffers(b),
                           "' is not 0 or a power of two up to ", kMaxAlignment));
        }
        s.alignment.push_back(a);
        s.written.push_back(p.written(b));
      }
      s.kernel = std::make_unique<CudaKernel>(module.cuda, p.symbol());
      s.buffers = std::move(buffers);
      s.buffer_names = std::move(names);
      step.kind = std::move(s);
      return absl::OkStatus();
    }
    absl::StatusOr<void*> fn = module.cpu->Symbol(p.symbol());
    if (!fn.ok()) return Annotate(fn.status(), where);
    LaunchStep s;
    s.fn = reinterpret_cast<KernelFn>(*fn);
    s.buffers = std::move(buffers);
    s.buffer_names = std::move(names);
    step.kind = std::move(s);
    return absl::OkStatus();
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
    ExternStep s{*std::move(op), {}, {}, {}};
    for (int k = 0; k < node.outputs_size() && k < static_cast<int>(n.outputs.size()); ++k) {
      const v1::Value& out = node.outputs(k);
      if (out.name().empty() || !out.has_meta() || out.meta().dtype() == v1::DTYPE_UNSPECIFIED) {
        continue;
      }
      absl::StatusOr<at::ScalarType> dtype = ScalarTypeFromProto(out.meta().dtype());
      if (dtype.ok()) s.dtypes.emplace_back(n.outputs[k], *dtype);
      if (out.meta().strides_size() > 0 && out.meta().strides_size() == out.meta().sizes_size()) {
        std::vector<Dim> strides;
        for (const v1::SymInt& st : out.meta().strides()) {
          absl::StatusOr<Dim> d = Dim::Parse(st, symbols_);
          if (!d.ok()) break;  // strides of symbols the plan does not bind: not checked
          strides.push_back(*std::move(d));
        }
        if (strides.size() == static_cast<size_t>(out.meta().strides_size())) {
          s.layouts.emplace_back(n.outputs[k], std::move(strides));
        }
      }
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
  const std::vector<Module>& modules_;
  absl::flat_hash_map<std::string, int> slots_;  // value name -> slot
  std::vector<State> state_;                     // per slot
  std::vector<bool> read_;                       // per slot
  std::vector<bool> is_input_;                   // per slot
  std::vector<int> freed_by_;                    // per slot: index of its Free step
};

}  // namespace

absl::StatusOr<BuiltPlan> BuildPlan(const v1::ExecutionPlan& plan, const SymbolTable& symbols,
                                    const std::vector<Module>& modules) {
  BuiltPlan built;
  PlanBuilder builder(plan, symbols, modules);
  RETURN_IF_ERROR(builder.DefineInputs());
  ASSIGN_OR_RETURN(built.steps, builder.BuildSteps());
  ASSIGN_OR_RETURN(built.outputs, builder.Outputs());
  built.num_slots = builder.num_slots();
  for (Step& step : built.steps) {
    if (const auto* a = std::get_if<AllocStep>(&step.kind); a != nullptr && a->reuse >= 0) {
      built.reuses = true;
    }
    // An extern's results that nothing reads (fused attention's random
    // state) are neither converted nor copied.
    if (auto* e = std::get_if<ExternStep>(&step.kind)) {
      auto unread = [&](const auto& entry) { return !builder.IsRead(entry.first); };
      e->dtypes.erase(std::remove_if(e->dtypes.begin(), e->dtypes.end(), unread), e->dtypes.end());
      e->layouts.erase(std::remove_if(e->layouts.begin(), e->layouts.end(), unread),
                       e->layouts.end());
    }
  }
  return built;
}

}  // namespace kiln::runtime::plan_internal
