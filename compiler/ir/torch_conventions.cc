#include "compiler/ir/torch_conventions.h"

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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

}  // namespace

absl::StatusOr<std::optional<v1::Graph>> RewriteTorchConventions(const Graph& graph) {
  std::optional<v1::Graph> out;
  std::optional<FreshNames> fresh;
  std::vector<int> dropped;
  std::vector<v1::Node> added;
  auto proto = [&]() -> v1::Graph& {
    if (!out) out = graph.ToProto();  // nodes in graph.nodes() order
    return *out;
  };
  for (size_t k = 0; k < graph.nodes().size(); ++k) {
    const Node& node = graph.nodes()[k];
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
    if (std::string target = FittingOverload(node, *schema, graph); !target.empty()) {
      pn.set_target(target);
      continue;
    }
    // No overload takes the numbers: each becomes a 0-dim tensor.
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
  // Graph::FromProto sorts nodes topologically: the new ones may go last.
  for (auto it = dropped.rbegin(); it != dropped.rend(); ++it) {
    out->mutable_nodes()->DeleteSubrange(*it, 1);
  }
  for (v1::Node& n : added) *out->add_nodes() = std::move(n);
  return out;
}

}  // namespace kiln::ir
