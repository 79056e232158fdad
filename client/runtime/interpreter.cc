// The reference interpreter (interpreter.h).
//
// BoundOp::Create resolves a node's operator and binds its arguments to the
// schema's parameters once: every parameter becomes a Slot, either a
// constant IValue (ints, floats, lists, dtypes, defaults, None), a
// reference to values of the environment (tensors, tensor lists), or
// symbolic SymInts evaluated at each call. Call only fills in the tensors
// and symbols, calls the op boxed and stores what it returns. The
// Interpreter is a list of BoundOps plus the values each one releases.
//
// Errors: a target ATen does not know is NOT_FOUND at Create; an argument
// that does not fit its parameter (wrong kind, missing, unknown keyword) is
// INVALID_ARGUMENT at Create. The Interpreter has no symbol values: a
// symbolic SymInt argument is accepted at Create and refused at Run with
// INVALID_ARGUMENT (the plan executor evaluates them).
#include "client/runtime/interpreter.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace kiln::runtime {
namespace {

using ir::Argument;
using ir::IsEmptyList;
using ir::KindName;
using ir::ValueId;

// How one schema parameter gets its IValue at Run.
struct Slot {
  enum class Kind {
    kConstant,            // `constant`, copied onto the stack
    kTensor,              // env[tensor]
    kTensorList,          // c10::List<at::Tensor> of env[tensors[i]]
    kOptionalTensorList,  // c10::List<c10::optional<at::Tensor>>; kNoValue is None
    kSymbolic,            // `syms` evaluated, made a `form`
  };
  // What symbolic SymInts become: an int, a Scalar, or an int list.
  enum class Form { kInt, kScalar, kIntList };
  Kind kind = Kind::kConstant;
  c10::IValue constant;
  ValueId tensor = ir::kNoValue;
  std::vector<ValueId> tensors;
  Form form = Form::kInt;
  std::vector<ir::SymInt> syms;  // at least one of them symbolic
};

Slot Constant(c10::IValue v) {
  Slot s;
  s.constant = std::move(v);
  return s;
}

}  // namespace

absl::StatusOr<at::ScalarType> ScalarTypeFromProto(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT32:
      return at::kFloat;
    case v1::FLOAT64:
      return at::kDouble;
    case v1::FLOAT16:
      return at::kHalf;
    case v1::BFLOAT16:
      return at::kBFloat16;
    case v1::INT64:
      return at::kLong;
    case v1::INT32:
      return at::kInt;
    case v1::INT16:
      return at::kShort;
    case v1::INT8:
      return at::kChar;
    case v1::UINT8:
      return at::kByte;
    case v1::BOOL:
      return at::kBool;
    case v1::COMPLEX64:
      return at::kComplexFloat;
    case v1::COMPLEX128:
      return at::kComplexDouble;
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported dtype ", v1::DType_Name(dtype)));
}

namespace {

absl::StatusOr<c10::MemoryFormat> ToMemoryFormat(v1::MemoryFormat format) {
  switch (format) {
    case v1::CONTIGUOUS_FORMAT:
      return c10::MemoryFormat::Contiguous;
    case v1::CHANNELS_LAST:
      return c10::MemoryFormat::ChannelsLast;
    case v1::CHANNELS_LAST_3D:
      return c10::MemoryFormat::ChannelsLast3d;
    case v1::PRESERVE_FORMAT:
      return c10::MemoryFormat::Preserve;
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported memory format ", v1::MemoryFormat_Name(format)));
}

absl::StatusOr<c10::Layout> ToLayout(v1::Layout layout) {
  switch (layout) {
    case v1::STRIDED:
      return c10::kStrided;
    case v1::SPARSE_COO:
      return c10::kSparse;
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported layout ", v1::Layout_Name(layout)));
}

absl::StatusOr<c10::Device> ToDevice(const std::string& spelled) {
  try {
    return c10::Device(spelled);
  } catch (const std::exception&) {
    return absl::InvalidArgumentError(absl::StrCat("unknown device '", spelled, "'"));
  }
}

absl::StatusOr<c10::Device> ToDevice(const ir::Device& device) {
  return ToDevice(device.index >= 0 ? absl::StrCat(device.type, ":", device.index) : device.type);
}

Slot Symbolic(Slot::Form form, std::vector<ir::SymInt> syms) {
  Slot slot;
  slot.kind = Slot::Kind::kSymbolic;
  slot.form = form;
  slot.syms = std::move(syms);
  return slot;
}

// An int[] / SymInt[] parameter. A single int is broadcast to the list's
// fixed size (int[2] stride=1), as ATen's own argument parsing does.
absl::StatusOr<Slot> ConvertIntList(const Argument::Kind& kind, c10::optional<int32_t> n) {
  if (const auto* ints = std::get_if<std::vector<int64_t>>(&kind)) {
    return Constant(c10::IValue(*ints));
  }
  if (const auto* syms = std::get_if<std::vector<ir::SymInt>>(&kind)) {
    std::vector<int64_t> ints;
    ints.reserve(syms->size());
    for (const ir::SymInt& s : *syms) {
      if (!s.is_constant()) return Symbolic(Slot::Form::kIntList, *syms);
      ints.push_back(s.constant());
    }
    return Constant(c10::IValue(std::move(ints)));
  }
  if (IsEmptyList(kind)) return Constant(c10::IValue(std::vector<int64_t>{}));
  if (n.has_value()) {
    if (const auto* i = std::get_if<int64_t>(&kind)) {
      return Constant(c10::IValue(std::vector<int64_t>(*n, *i)));
    }
    if (const auto* s = std::get_if<ir::SymInt>(&kind)) {
      if (!s->is_constant()) {
        return Symbolic(Slot::Form::kIntList, std::vector<ir::SymInt>(*n, *s));
      }
      return Constant(c10::IValue(std::vector<int64_t>(*n, s->constant())));
    }
  }
  return absl::InvalidArgumentError("");
}

// Converts one argument for a parameter of (real) type `type`. An empty
// message in the error means "the kinds do not match"; the caller words it.
absl::StatusOr<Slot> Convert(const c10::TypePtr& type, c10::optional<int32_t> n,
                             const Argument::Kind& kind) {
  const absl::Status mismatch = absl::InvalidArgumentError("");
  c10::TypePtr t = type;
  if (t->kind() == c10::TypeKind::OptionalType) {
    if (std::holds_alternative<ir::None>(kind)) return Constant(c10::IValue());
    t = t->expectRef<c10::OptionalType>().getElementType();
  }
  switch (t->kind()) {
    case c10::TypeKind::TensorType:
      if (const auto* v = std::get_if<ValueId>(&kind); v != nullptr && *v != ir::kNoValue) {
        Slot slot;
        slot.kind = Slot::Kind::kTensor;
        slot.tensor = *v;
        return slot;
      }
      // None for a (non-optional) Tensor is an undefined tensor, as torch's
      // Python binding passes it (attention backwards take "Tensor
      // attn_bias" that may be undefined).
      if (std::holds_alternative<ir::None>(kind)) return Constant(c10::IValue(at::Tensor()));
      return mismatch;
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      if (const auto* i = std::get_if<int64_t>(&kind)) return Constant(c10::IValue(*i));
      if (const auto* s = std::get_if<ir::SymInt>(&kind)) {
        if (!s->is_constant()) return Symbolic(Slot::Form::kInt, {*s});
        return Constant(c10::IValue(s->constant()));
      }
      return mismatch;
    case c10::TypeKind::FloatType:
      if (const auto* d = std::get_if<double>(&kind)) return Constant(c10::IValue(*d));
      if (const auto* i = std::get_if<int64_t>(&kind)) {
        return Constant(c10::IValue(static_cast<double>(*i)));
      }
      return mismatch;
    case c10::TypeKind::NumberType:  // Scalar
      if (const auto* i = std::get_if<int64_t>(&kind)) return Constant(c10::Scalar(*i));
      if (const auto* d = std::get_if<double>(&kind)) return Constant(c10::Scalar(*d));
      if (const auto* b = std::get_if<bool>(&kind)) return Constant(c10::Scalar(*b));
      if (const auto* s = std::get_if<ir::SymInt>(&kind)) {
        if (!s->is_constant()) return Symbolic(Slot::Form::kScalar, {*s});
        return Constant(c10::Scalar(s->constant()));
      }
      return mismatch;
    case c10::TypeKind::BoolType:
      if (const auto* b = std::get_if<bool>(&kind)) return Constant(c10::IValue(*b));
      return mismatch;
    case c10::TypeKind::StringType:
      if (const auto* s = std::get_if<std::string>(&kind)) return Constant(c10::IValue(*s));
      return mismatch;
    case c10::TypeKind::ScalarTypeType:
      if (const auto* d = std::get_if<v1::DType>(&kind)) {
        ASSIGN_OR_RETURN(at::ScalarType st, ScalarTypeFromProto(*d));
        return Constant(c10::IValue(st));
      }
      return mismatch;
    case c10::TypeKind::LayoutType:
      if (const auto* l = std::get_if<v1::Layout>(&kind)) {
        ASSIGN_OR_RETURN(c10::Layout layout, ToLayout(*l));
        return Constant(c10::IValue(layout));
      }
      return mismatch;
    case c10::TypeKind::MemoryFormatType:
      if (const auto* m = std::get_if<v1::MemoryFormat>(&kind)) {
        ASSIGN_OR_RETURN(c10::MemoryFormat format, ToMemoryFormat(*m));
        return Constant(c10::IValue(format));
      }
      return mismatch;
    case c10::TypeKind::DeviceObjType:
      if (const auto* d = std::get_if<ir::Device>(&kind)) {
        ASSIGN_OR_RETURN(c10::Device device, ToDevice(*d));
        return Constant(c10::IValue(device));
      }
      if (const auto* s = std::get_if<std::string>(&kind)) {
        ASSIGN_OR_RETURN(c10::Device device, ToDevice(*s));
        return Constant(c10::IValue(device));
      }
      return mismatch;
    case c10::TypeKind::ListType:
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("parameters of type ", t->str(), " are not supported"));
  }

  const c10::TypePtr& elem = t->expectRef<c10::ListType>().getElementType();
  switch (elem->kind()) {
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      return ConvertIntList(kind, n);
    case c10::TypeKind::FloatType:
      if (const auto* d = std::get_if<std::vector<double>>(&kind)) {
        return Constant(c10::IValue(*d));
      }
      if (const auto* i = std::get_if<std::vector<int64_t>>(&kind)) {
        return Constant(c10::IValue(std::vector<double>(i->begin(), i->end())));
      }
      if (IsEmptyList(kind)) return Constant(c10::IValue(std::vector<double>{}));
      return mismatch;
    case c10::TypeKind::BoolType:
      if (const auto* b = std::get_if<std::vector<bool>>(&kind)) {
        c10::List<bool> list;
        list.reserve(b->size());
        for (bool x : *b) list.push_back(x);
        return Constant(c10::IValue(std::move(list)));
      }
      if (IsEmptyList(kind)) return Constant(c10::IValue(c10::List<bool>()));
      return mismatch;
    case c10::TypeKind::TensorType:
    case c10::TypeKind::OptionalType: {
      const bool optional = elem->kind() == c10::TypeKind::OptionalType;
      if (optional && elem->expectRef<c10::OptionalType>().getElementType()->kind() !=
                          c10::TypeKind::TensorType) {
        break;
      }
      Slot slot;
      slot.kind = optional ? Slot::Kind::kOptionalTensorList : Slot::Kind::kTensorList;
      if (const auto* vs = std::get_if<std::vector<ValueId>>(&kind)) {
        for (ValueId v : *vs) {
          if (v == ir::kNoValue && !optional) {
            return absl::InvalidArgumentError(absl::StrCat("a None in a list of type ", t->str()));
          }
        }
        slot.tensors = *vs;
        return slot;
      }
      if (IsEmptyList(kind)) return slot;
      return mismatch;
    }
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("parameters of type ", t->str(), " are not supported"));
}

// "aten.add.Tensor" -> {"aten::add", "Tensor"}; "default" is the empty
// overload. False when the target is not spelled namespace.name[.overload].
bool ParseTarget(absl::string_view target, c10::OperatorName* name) {
  const size_t first = target.find('.');
  if (first == absl::string_view::npos || first == 0) return false;
  const size_t last = target.rfind('.');
  absl::string_view ns = target.substr(0, first);
  absl::string_view op;
  absl::string_view overload;
  if (last == first) {
    op = target.substr(first + 1);
  } else {
    op = target.substr(first + 1, last - first - 1);
    overload = target.substr(last + 1);
  }
  if (op.empty()) return false;
  if (overload == "default") overload = "";
  name->name = absl::StrCat(ns, "::", op);
  name->overload_name = std::string(overload);
  return true;
}

std::string NodeLabel(const ir::Node& node) {
  return absl::StrCat("node '", node.name, "' (", node.target, ")");
}

// The first line of an exception's message, without c10's backtrace.
std::string FirstLine(const char* what) {
  absl::string_view s(what);
  return std::string(s.substr(0, s.find('\n')));
}

// Binds a node's arguments to the parameters of `schema`.
absl::StatusOr<std::vector<Slot>> Bind(const ir::Node& node, const c10::FunctionSchema& schema) {
  const std::vector<c10::Argument>& params = schema.arguments();
  size_t num_positional = 0;
  while (num_positional < params.size() && !params[num_positional].kwarg_only()) ++num_positional;
  if (node.args.size() > num_positional) {
    return absl::InvalidArgumentError(absl::StrCat(NodeLabel(node), ": takes at most ",
                                                   num_positional, " positional arguments, got ",
                                                   node.args.size()));
  }
  std::vector<const Argument*> given(params.size(), nullptr);
  for (size_t i = 0; i < node.args.size(); ++i) given[i] = &node.args[i];
  for (const Argument& kwarg : node.kwargs) {
    size_t i = 0;
    while (i < params.size() && params[i].name() != kwarg.name) ++i;
    if (i == params.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(NodeLabel(node), ": no parameter named '", kwarg.name, "'"));
    }
    if (given[i] != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(NodeLabel(node), ": argument '", kwarg.name, "' given twice"));
    }
    given[i] = &kwarg;
  }

  std::vector<Slot> slots;
  slots.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const c10::Argument& param = params[i];
    if (given[i] == nullptr) {
      if (param.default_value().has_value()) {
        slots.push_back(Constant(*param.default_value()));
      } else if (param.real_type()->kind() == c10::TypeKind::OptionalType) {
        slots.push_back(Constant(c10::IValue()));
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(NodeLabel(node), ": missing required argument '", param.name(), "'"));
      }
      continue;
    }
    absl::StatusOr<Slot> slot = Convert(param.real_type(), param.N(), given[i]->kind);
    if (!slot.ok()) {
      const absl::string_view why = slot.status().message();
      return absl::InvalidArgumentError(
          absl::StrCat(NodeLabel(node), ": argument '", param.name(), "' ",
                       why.empty() ? absl::StrCat("expects ", param.real_type()->str(), ", got ",
                                                  KindName(given[i]->kind))
                                   : absl::StrCat("(", param.real_type()->str(), "): ", why)));
    }
    slots.push_back(*std::move(slot));
  }
  return slots;
}

// The number of tensors a schema returns, or -1 when a list return makes it
// known only at run time.
int FixedReturnCount(const c10::FunctionSchema& schema) {
  for (const c10::Argument& ret : schema.returns()) {
    if (ret.type()->kind() != c10::TypeKind::TensorType) return -1;
  }
  return static_cast<int>(schema.returns().size());
}

}  // namespace

// ---------------------------------------------------------------- BoundOp

struct BoundOp::Impl {
  Impl(c10::OperatorHandle op, ir::Node node) : op(std::move(op)), node(std::move(node)) {}

  c10::OperatorHandle op;
  ir::Node node;
  std::vector<Slot> slots;  // one per schema parameter, in order
};

BoundOp::BoundOp(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BoundOp::BoundOp(BoundOp&&) noexcept = default;
BoundOp& BoundOp::operator=(BoundOp&&) noexcept = default;
BoundOp::~BoundOp() = default;

const ir::Node& BoundOp::node() const { return impl_->node; }

absl::StatusOr<BoundOp> BoundOp::Create(const ir::Node& node) {
  c10::OperatorName name("", "");
  if (!ParseTarget(node.target, &name)) {
    return absl::NotFoundError(
        absl::StrCat(NodeLabel(node), ": not an operator name (namespace.op.overload)"));
  }
  c10::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findSchema(name);
  if (!op.has_value()) {
    return absl::NotFoundError(absl::StrCat(NodeLabel(node), ": ATen has no operator ", name.name,
                                            name.overload_name.empty() ? "" : ".",
                                            name.overload_name));
  }
  const c10::FunctionSchema& schema = op->schema();
  const int returns = FixedReturnCount(schema);
  if (returns >= 0 && static_cast<size_t>(returns) != node.outputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(NodeLabel(node), ": the operator returns ",
                                                   returns, " tensors, the node names ",
                                                   node.outputs.size()));
  }
  auto impl = std::make_unique<Impl>(*std::move(op), node);
  ASSIGN_OR_RETURN(impl->slots, Bind(impl->node, schema));
  return BoundOp(std::move(impl));
}

std::vector<std::string> BoundOp::SymbolicExprs() const {
  std::vector<std::string> exprs;
  for (const Slot& slot : impl_->slots) {
    for (const ir::SymInt& s : slot.syms) {
      if (s.is_constant()) continue;
      if (std::find(exprs.begin(), exprs.end(), s.expr()) == exprs.end()) {
        exprs.push_back(s.expr());
      }
    }
  }
  return exprs;
}

absl::Status BoundOp::Call(std::vector<at::Tensor>& env, SymIntEvaluator evaluate) const {
  const ir::Node& node = impl_->node;
  torch::jit::Stack stack;
  stack.reserve(impl_->slots.size());
  for (size_t i = 0; i < impl_->slots.size(); ++i) {
    const Slot& slot = impl_->slots[i];
    switch (slot.kind) {
      case Slot::Kind::kConstant:
        stack.push_back(slot.constant);
        break;
      case Slot::Kind::kTensor:
        stack.emplace_back(env[slot.tensor]);
        break;
      case Slot::Kind::kTensorList: {
        c10::List<at::Tensor> list;
        list.reserve(slot.tensors.size());
        for (ValueId v : slot.tensors) list.push_back(env[v]);
        stack.emplace_back(std::move(list));
        break;
      }
      case Slot::Kind::kOptionalTensorList: {
        c10::List<c10::optional<at::Tensor>> list;
        list.reserve(slot.tensors.size());
        for (ValueId v : slot.tensors) {
          list.push_back(v == ir::kNoValue ? c10::optional<at::Tensor>()
                                           : c10::optional<at::Tensor>(env[v]));
        }
        stack.emplace_back(std::move(list));
        break;
      }
      case Slot::Kind::kSymbolic: {
        std::vector<int64_t> ints;
        ints.reserve(slot.syms.size());
        for (const ir::SymInt& s : slot.syms) {
          if (s.is_constant()) {
            ints.push_back(s.constant());
            continue;
          }
          absl::StatusOr<int64_t> v = evaluate(s.expr());
          if (!v.ok()) {
            const std::string& param = impl_->op.schema().arguments()[i].name();
            return absl::Status(v.status().code(),
                                absl::StrCat(NodeLabel(node), ": argument '", param, "' (",
                                             s.expr(), "): ", v.status().message()));
          }
          ints.push_back(*v);
        }
        switch (slot.form) {
          case Slot::Form::kInt:
            stack.emplace_back(ints[0]);
            break;
          case Slot::Form::kScalar:
            stack.emplace_back(c10::Scalar(ints[0]));
            break;
          case Slot::Form::kIntList:
            stack.emplace_back(std::move(ints));
            break;
        }
        break;
      }
    }
  }

  try {
    impl_->op.callBoxed(&stack);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat(NodeLabel(node), ": ", FirstLine(e.what_without_backtrace())));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(NodeLabel(node), ": ", FirstLine(e.what())));
  }

  size_t produced = 0;
  auto store = [&](at::Tensor t) {
    if (produced < node.outputs.size()) env[node.outputs[produced]] = std::move(t);
    ++produced;
  };
  for (c10::IValue& ret : stack) {
    if (ret.isTensor()) {
      store(std::move(ret).toTensor());
    } else if (ret.isTensorList()) {
      for (const at::Tensor& t : std::move(ret).toTensorList()) store(t);
    } else if (ret.isNone()) {
      store(at::Tensor());
    } else {
      return absl::InternalError(
          absl::StrCat(NodeLabel(node), ": returned a ", ret.tagKind(), ", not a tensor"));
    }
  }
  if (produced != node.outputs.size()) {
    return absl::InternalError(absl::StrCat(NodeLabel(node), ": returned ", produced,
                                            " tensors, the node names ", node.outputs.size()));
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------ Interpreter

namespace {

// One node, ready to call.
struct Step {
  BoundOp op;
  std::vector<ValueId> release;  // values dead after this step
};

}  // namespace

struct Interpreter::Impl {
  ir::Graph graph;
  std::vector<Step> steps;
  std::vector<bool> input_used;  // per graph input: is it read at all?
};

Interpreter::Interpreter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Interpreter::~Interpreter() = default;

const ir::Graph& Interpreter::graph() const { return impl_->graph; }

absl::StatusOr<std::unique_ptr<Interpreter>> Interpreter::Create(ir::Graph graph) {
  auto impl = std::make_unique<Impl>();
  impl->graph = std::move(graph);
  const ir::Graph& g = impl->graph;

  // Last use of each value: the index of the last node reading it; graph
  // outputs live to the end; -1 for a value nothing reads.
  constexpr int kLive = std::numeric_limits<int>::max();
  std::vector<int> last_use(g.values().size(), -1);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    for (ValueId v : ir::Graph::Operands(g.nodes()[i])) {
      if (v != ir::kNoValue) last_use[v] = static_cast<int>(i);
    }
  }
  for (ValueId v : g.outputs()) last_use[v] = kLive;

  impl->steps.reserve(g.nodes().size());
  for (const ir::Node& node : g.nodes()) {
    ASSIGN_OR_RETURN(BoundOp op, BoundOp::Create(node));
    impl->steps.push_back(Step{std::move(op), {}});
  }

  for (ValueId v = 0; v < static_cast<ValueId>(g.values().size()); ++v) {
    const ir::Value& value = g.value(v);
    if (last_use[v] == kLive) continue;
    if (value.producer < 0) continue;  // an input: never stored unless read
    // Unread outputs die with their node; read ones after their last reader.
    const int after = last_use[v] < 0 ? value.producer : last_use[v];
    impl->steps[after].release.push_back(v);
  }
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const ValueId v = g.inputs()[i].value;
    impl->input_used.push_back(last_use[v] != -1);
    if (last_use[v] >= 0 && last_use[v] != kLive) impl->steps[last_use[v]].release.push_back(v);
  }
  return std::unique_ptr<Interpreter>(new Interpreter(std::move(impl)));
}

absl::StatusOr<std::vector<at::Tensor>> Interpreter::Run(
    const std::vector<at::Tensor>& inputs) const {
  const ir::Graph& g = impl_->graph;
  if (inputs.size() != g.inputs().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "graph '", g.name(), "' takes ", g.inputs().size(), " inputs, got ", inputs.size()));
  }
  std::vector<at::Tensor> env(g.values().size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ValueId v = g.inputs()[i].value;
    if (!inputs[i].defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", i, " ('", g.value(v).name, "') is an undefined tensor"));
    }
    if (impl_->input_used[i]) env[v] = inputs[i];
  }

  // The interpreter has no symbol values (they come from a plan's bindings).
  auto no_symbols = [](const std::string&) -> absl::StatusOr<int64_t> {
    return absl::InvalidArgumentError(
        "symbolic arguments are not resolved by the interpreter (it has no symbol values)");
  };
  for (const Step& step : impl_->steps) {
    RETURN_IF_ERROR(step.op.Call(env, no_symbols));
    for (ValueId v : step.release) env[v].reset();
  }

  std::vector<at::Tensor> outputs;
  outputs.reserve(g.outputs().size());
  for (ValueId v : g.outputs()) outputs.push_back(env[v]);
  return outputs;
}

absl::StatusOr<std::vector<at::Tensor>> RunGraph(const ir::Graph& graph,
                                                 const std::vector<at::Tensor>& inputs) {
  ASSIGN_OR_RETURN(std::unique_ptr<Interpreter> interpreter, Interpreter::Create(graph));
  return interpreter->Run(inputs);
}

}  // namespace kiln::runtime
