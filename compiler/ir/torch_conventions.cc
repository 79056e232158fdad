#include "compiler/ir/torch_conventions.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/ir/schema.h"

namespace kiln::ir {
namespace {

constexpr char kAssertMetadata[] = "aten._assert_tensor_metadata.default";

// Every overload the schema table knows for an op name: "add" -> targets.
const std::map<std::string, std::vector<std::string>>& OverloadsByName() {
  static const auto* table = [] {
    auto* t = new std::map<std::string, std::vector<std::string>>;
    for (const std::string& target : KnownTargets()) {
      (*t)[FindSchema(target)->name].push_back(target);
    }
    return t;
  }();
  return *table;
}

bool IsNumber(const Argument::Kind& k) {
  return std::holds_alternative<int64_t>(k) || std::holds_alternative<double>(k) ||
         std::holds_alternative<bool>(k) || std::holds_alternative<SymInt>(k);
}

// A plain "Tensor" parameter. An optional one ("Tensor? weight") is a role a
// number never plays in a torch 2 graph, and stays refused.
bool TakesTensor(const SchemaParam& p) {
  return p.type.base == SchemaType::Base::kTensor && !p.type.is_list && !p.type.optional;
}

// A number argument in a Tensor parameter: where it is in the node.
struct NumberInTensor {
  bool keyword;
  int index;  // into args or kwargs
};

std::vector<NumberInTensor> FindNumbersInTensors(const Node& node, const OpSchema& schema) {
  std::vector<NumberInTensor> out;
  for (size_t i = 0; i < node.args.size() && i < schema.params.size(); ++i) {
    if (TakesTensor(schema.params[i]) && IsNumber(node.args[i].kind)) {
      out.push_back({false, static_cast<int>(i)});
    }
  }
  for (size_t i = 0; i < node.kwargs.size(); ++i) {
    const int p = schema.FindParam(node.kwargs[i].name);
    if (p >= 0 && TakesTensor(schema.params[p]) && IsNumber(node.kwargs[i].kind)) {
      out.push_back({true, static_cast<int>(i)});
    }
  }
  return out;
}

// The overload of `node`'s op, other than its own, that takes its arguments
// as they are, or "".
std::string FittingOverload(const Node& node, const OpSchema& schema, const Graph& graph) {
  auto it = OverloadsByName().find(schema.name);
  if (it == OverloadsByName().end()) return "";
  for (const std::string& target : it->second) {
    if (target == node.target) continue;
    Node candidate = node;
    candidate.target = target;
    if (CheckArguments(candidate, graph).ok()) return target;
  }
  return "";
}

std::string DTypeName(v1::DType d) { return v1::DType_Name(d); }

// Checks an _assert_tensor_metadata node against its tensor's metadata.
absl::Status CheckAssertedMetadata(const Node& node, const Graph& graph) {
  const std::string where = absl::StrCat("node '", node.name, "' (", kAssertMetadata, ")");
  if (node.args.empty() || !std::holds_alternative<ValueId>(node.args[0].kind)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": argument 0 must be a tensor"));
  }
  const Value& v = graph.value(std::get<ValueId>(node.args[0].kind));
  static const char* const kNames[] = {"a", "size", "stride", "dtype"};
  auto named = [&](absl::string_view name) -> const Argument* {
    for (size_t i = 1; i < node.args.size() && i < 4; ++i) {
      if (name == kNames[i]) return &node.args[i];
    }
    for (const Argument& a : node.kwargs) {
      if (a.name == name) return &a;
    }
    return nullptr;
  };
  auto mismatch = [&](absl::string_view field, const std::string& says, const std::string& is) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", field, " is asserted to be ", says,
                                                   ", but '", v.name, "' has ", is));
  };
  if (const Argument* a = named("dtype"); a && std::holds_alternative<v1::DType>(a->kind)) {
    const v1::DType d = std::get<v1::DType>(a->kind);
    if (d != v.meta.dtype) return mismatch("dtype", DTypeName(d), DTypeName(v.meta.dtype));
  }
  if (const Argument* a = named("device"); a && std::holds_alternative<Device>(a->kind)) {
    const Device& d = std::get<Device>(a->kind);
    const bool same_index =
        d.index < 0 || v.meta.device_index < 0 || d.index == v.meta.device_index;
    if (d.type != v.meta.device_type || !same_index) {
      return mismatch("device", absl::StrCat(d.type, ":", d.index),
                      absl::StrCat(v.meta.device_type, ":", v.meta.device_index));
    }
  }
  auto check_ints = [&](absl::string_view field,
                        const std::vector<SymInt>& actual) -> absl::Status {
    const Argument* a = named(field);
    if (a == nullptr) return absl::OkStatus();
    std::vector<SymInt> said;
    if (const auto* ints = std::get_if<std::vector<int64_t>>(&a->kind)) {
      for (int64_t i : *ints) said.push_back(SymInt{i});
    } else if (const auto* syms = std::get_if<std::vector<SymInt>>(&a->kind)) {
      said = *syms;
    } else {
      return absl::OkStatus();  // None: nothing asserted
    }
    if (said.size() != actual.size()) {
      return mismatch(field, absl::StrCat(said.size(), " dims"),
                      absl::StrCat(actual.size(), " dims"));
    }
    for (size_t d = 0; d < said.size(); ++d) {
      if (said[d].is_constant() && actual[d].is_constant() && !(said[d] == actual[d])) {
        return mismatch(absl::StrCat(field, "[", d, "]"), said[d].ToString(), actual[d].ToString());
      }
    }
    return absl::OkStatus();
  };
  if (absl::Status s = check_ints("size", v.meta.sizes); !s.ok()) return s;
  if (absl::Status s = check_ints("stride", v.meta.strides); !s.ok()) return s;
  return absl::OkStatus();
}

// A name not yet taken by a value or a node of the graph.
class FreshNames {
 public:
  explicit FreshNames(const Graph& g) {
    for (const Value& v : g.values()) taken_.insert(v.name);
    for (const Node& n : g.nodes()) taken_.insert(n.name);
  }
  std::string Make(const std::string& base) {
    std::string name = base;
    for (int i = 1; !taken_.insert(name).second; ++i) name = absl::StrCat(base, "_", i);
    return name;
  }

 private:
  std::set<std::string> taken_;
};

// A new aten.scalar_tensor node holding the number in `number`, on `device`.
v1::Node ScalarTensorNode(const v1::Argument& number, const std::string& node_name,
                          const std::string& value_name, const v1::Device& device) {
  v1::Node n;
  n.set_name(node_name);
  n.set_target("aten.scalar_tensor.default");
  v1::Argument* s = n.add_args();
  *s = number;
  s->clear_name();
  v1::DType dtype = v1::FLOAT32;
  if (number.kind_case() == v1::Argument::kIntValue ||
      number.kind_case() == v1::Argument::kSymInt) {
    dtype = v1::INT64;
  } else if (number.kind_case() == v1::Argument::kBoolValue) {
    dtype = v1::BOOL;
  }
  v1::Argument* d = n.add_kwargs();
  d->set_name("dtype");
  d->set_dtype(dtype);
  v1::Argument* dev = n.add_kwargs();
  dev->set_name("device");
  *dev->mutable_device() = device;
  v1::Value* out = n.add_outputs();
  out->set_name(value_name);
  v1::TensorMeta* meta = out->mutable_meta();
  meta->set_dtype(dtype);
  *meta->mutable_device() = device;
  meta->mutable_storage_offset()->set_int_value(0);
  return n;
}

// The text of `s` as an operand of a binary operator.
std::string OperandText(const SymInt& s) {
  if (s.is_constant())
    return s.constant() < 0 ? absl::StrCat("(", s.constant(), ")") : absl::StrCat(s.constant());
  return absl::StrContains(s.expr(), ' ') ? absl::StrCat("(", s.expr(), ")") : s.expr();
}

// a `op` b for op one of + - * //, in the expression grammar of
// compiler/ir/sym_expr.h, with constants folded.
absl::StatusOr<SymInt> SymArithmetic(absl::string_view op, const SymInt& a, const SymInt& b) {
  if (a.is_constant() && b.is_constant()) {
    const int64_t x = a.constant(), y = b.constant();
    int64_t r = 0;
    bool overflow = false;
    if (op == "+") overflow = __builtin_add_overflow(x, y, &r);
    if (op == "-") overflow = __builtin_sub_overflow(x, y, &r);
    if (op == "*") overflow = __builtin_mul_overflow(x, y, &r);
    if (op == "//") {
      if (y == 0) return absl::InvalidArgumentError("division by zero");
      if (x == INT64_MIN && y == -1) overflow = true;
      r = overflow ? 0 : x / y - ((x % y != 0) && ((x < 0) != (y < 0)) ? 1 : 0);
    }
    if (overflow) return absl::InvalidArgumentError(absl::StrCat(x, " ", op, " ", y, " overflows"));
    return SymInt{r};
  }
  const std::string sep = op == "*" || op == "//" ? std::string(op) : absl::StrCat(" ", op, " ");
  return SymInt{absl::StrCat(OperandText(a), sep, OperandText(b))};
}

// The SymInt a size node or SymInt operator computes; `sym` holds the values
// of earlier such nodes, by output name.
absl::StatusOr<SymInt> EvaluateSymIntNode(const Node& node, const Graph& graph,
                                          const std::map<std::string, SymInt>& sym) {
  auto err = [&node](auto&&... why) {
    return absl::InvalidArgumentError(
        absl::StrCat("node '", node.name, "' (", node.target, "): ", why...));
  };
  if (node.outputs.size() != 1)
    return err("returns one SymInt, node has ", node.outputs.size(), " outputs");
  auto integer = [&](size_t i) -> absl::StatusOr<SymInt> {
    if (i >= node.args.size()) return err("argument ", i, " is missing");
    const Argument::Kind& k = node.args[i].kind;
    if (const auto* v = std::get_if<int64_t>(&k)) return SymInt{*v};
    if (const auto* v = std::get_if<SymInt>(&k)) {
      if (!v->is_constant()) {
        auto it = sym.find(v->expr());
        if (it != sym.end()) return it->second;
      }
      return *v;
    }
    if (const auto* v = std::get_if<ValueId>(&k)) {
      auto it = sym.find(graph.value(*v).name);
      if (it != sym.end()) return it->second;
    }
    return err("argument ", i, " is ", KindName(k), ", not an integer");
  };
  if (absl::StartsWith(node.target, "aten.")) {
    if (node.args.empty() || !std::holds_alternative<ValueId>(node.args[0].kind)) {
      return err("argument 0 must be a tensor");
    }
    const TensorMeta& m = graph.value(std::get<ValueId>(node.args[0].kind)).meta;
    if (node.target == "aten.sym_storage_offset.default") return m.storage_offset;
    if (node.target == "aten.sym_numel.default") {
      SymInt n{int64_t{1}};
      for (const SymInt& s : m.sizes) {
        auto p = SymArithmetic("*", n, s);
        if (!p.ok()) return err(p.status().message());
        n = *std::move(p);
      }
      return n;
    }
    auto dim = integer(1);
    if (!dim.ok()) return dim.status();
    const std::vector<SymInt>& dims = node.target == "aten.sym_size.int" ? m.sizes : m.strides;
    const int64_t rank = static_cast<int64_t>(dims.size());
    int64_t d = dim->is_constant() ? dim->constant() : rank;
    if (d < 0) d += rank;
    if (d < 0 || d >= rank) return err("dim ", dim->ToString(), " is out of range for rank ", rank);
    return dims[d];
  }
  auto a = integer(0);
  if (!a.ok()) return a.status();
  auto b = integer(1);
  if (!b.ok()) return b.status();
  const absl::string_view name = node.target.substr(node.target.rfind('.') + 1);
  const absl::string_view op = name == "add"   ? "+"
                               : name == "sub" ? "-"
                               : name == "mul" ? "*"
                                               : "//";
  auto r = SymArithmetic(op, *a, *b);
  if (!r.ok()) return err(r.status().message());
  return r;
}

// Replaces, in `pn`'s arguments, each reference to a SymInt node's output by
// its value.
void SubstituteSymInts(v1::Node* pn, const std::map<std::string, SymInt>& sym) {
  auto one = [&sym](v1::SymInt* s) {
    if (!s->has_expr()) return;
    auto it = sym.find(s->expr());
    if (it != sym.end()) *s = SymIntToProto(it->second);
  };
  auto arg = [&](v1::Argument* a) {
    if (a->has_tensor()) {
      auto it = sym.find(a->tensor());
      if (it != sym.end()) *a->mutable_sym_int() = SymIntToProto(it->second);
    } else if (a->has_sym_int()) {
      one(a->mutable_sym_int());
    } else if (a->has_sym_ints()) {
      for (v1::SymInt& s : *a->mutable_sym_ints()->mutable_values()) one(&s);
    } else if (a->has_tensors()) {
      // An FX list of SymInt nodes and ints arrives as names; only a list
      // whose every name is a SymInt node becomes a SymInt list.
      std::vector<v1::SymInt> values;
      for (const std::string& name : a->tensors().names()) {
        auto it = sym.find(name);
        if (it == sym.end()) return;
        values.push_back(SymIntToProto(it->second));
      }
      v1::SymIntList* list = a->mutable_sym_ints();
      for (v1::SymInt& v : values) *list->add_values() = std::move(v);
    }
  };
  for (v1::Argument& a : *pn->mutable_args()) arg(&a);
  for (v1::Argument& a : *pn->mutable_kwargs()) arg(&a);
}

}  // namespace

bool IsSymIntNode(absl::string_view target) {
  static const auto* targets = new std::set<std::string, std::less<>>{
      "aten.sym_size.int",   "aten.sym_numel.default",
      "aten.sym_stride.int", "aten.sym_storage_offset.default",
      "_operator.add",       "_operator.sub",
      "_operator.mul",       "_operator.floordiv",
      "operator.add",        "operator.sub",
      "operator.mul",        "operator.floordiv"};
  return targets->count(target) > 0;
}

absl::StatusOr<std::optional<v1::Graph>> RewriteTorchConventions(const Graph& graph) {
  std::optional<v1::Graph> out;
  std::optional<FreshNames> fresh;
  std::vector<int> dropped;
  std::vector<v1::Node> added;
  auto proto = [&]() -> v1::Graph& {
    if (!out) out = graph.ToProto();  // nodes in graph.nodes() order
    return *out;
  };
  std::map<std::string, SymInt> sym;  // SymInt node outputs by name
  for (size_t k = 0; k < graph.nodes().size(); ++k) {
    const Node& node = graph.nodes()[k];
    if (IsSymIntNode(node.target)) {
      ASSIGN_OR_RETURN(SymInt value, EvaluateSymIntNode(node, graph, sym));
      sym[graph.value(node.outputs[0]).name] = std::move(value);
      proto();
      dropped.push_back(static_cast<int>(k));
      continue;
    }
    if (!sym.empty()) SubstituteSymInts(proto().mutable_nodes(static_cast<int>(k)), sym);
    if (node.target == kAssertMetadata) {
      if (!node.outputs.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("node '", node.name, "' (", kAssertMetadata,
                                                       ") returns nothing, node has outputs"));
      }
      if (absl::Status s = CheckAssertedMetadata(node, graph); !s.ok()) return s;
      proto();
      dropped.push_back(static_cast<int>(k));
      continue;
    }
    const OpSchema* schema = FindSchema(node.target);
    if (schema == nullptr) continue;
    const std::vector<NumberInTensor> numbers = FindNumbersInTensors(node, *schema);
    if (numbers.empty()) continue;
    v1::Node& pn = *proto().mutable_nodes(static_cast<int>(k));
    // A symbolic number (x * x.shape[-1] over a dynamic size) stays a
    // tensor: a Scalar argument is a number the kernels hold as a constant.
    const bool symbolic = std::any_of(numbers.begin(), numbers.end(), [&](NumberInTensor w) {
      const Argument& a = w.keyword ? node.kwargs[w.index] : node.args[w.index];
      const auto* v = std::get_if<SymInt>(&a.kind);
      return v != nullptr && !v->is_constant();
    });
    if (std::string target = symbolic ? "" : FittingOverload(node, *schema, graph);
        !target.empty()) {
      pn.set_target(target);
      continue;
    }
    // No overload takes the numbers (or one is symbolic): each becomes a
    // 0-dim tensor.
    if (!fresh) fresh.emplace(graph);
    v1::Device device;
    device.set_type("cpu");
    device.set_index(-1);
    for (ValueId id : Graph::Operands(node)) {
      if (id == kNoValue) continue;
      const TensorMeta& m = graph.value(id).meta;
      device.set_type(m.device_type);
      device.set_index(m.device_index);
      break;
    }
    for (const NumberInTensor& where : numbers) {
      v1::Argument* arg =
          where.keyword ? pn.mutable_kwargs(where.index) : pn.mutable_args(where.index);
      const std::string value = fresh->Make(absl::StrCat(node.name, "_scalar"));
      added.push_back(
          ScalarTensorNode(*arg, fresh->Make(absl::StrCat(value, "_node")), value, device));
      arg->set_tensor(value);
    }
  }
  if (!out) return std::nullopt;
  for (const std::string& name : out->outputs()) {
    if (sym.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("graph output '", name, "' is a SymInt; Kiln's graphs return tensors"));
    }
  }
  // Graph::FromProto sorts nodes topologically: the new ones may go last.
  for (auto it = dropped.rbegin(); it != dropped.rend(); ++it) {
    out->mutable_nodes()->DeleteSubrange(*it, 1);
  }
  for (v1::Node& n : added) *out->add_nodes() = std::move(n);
  return out;
}

}  // namespace kiln::ir
