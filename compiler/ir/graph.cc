#include "compiler/ir/graph.h"

#include <optional>
#include <queue>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "compiler/ir/torch_conventions.h"

namespace kiln::ir {
namespace {

TensorMeta MetaFromProto(const v1::TensorMeta& p) {
  TensorMeta m;
  m.dtype = p.dtype();
  for (const auto& s : p.sizes()) m.sizes.push_back(SymIntFromProto(s));
  for (const auto& s : p.strides()) m.strides.push_back(SymIntFromProto(s));
  if (p.has_device()) {
    m.device_type = p.device().type();
    m.device_index = p.device().index();
  }
  m.requires_grad = p.requires_grad();
  if (p.has_storage_offset()) m.storage_offset = SymIntFromProto(p.storage_offset());
  return m;
}

v1::TensorMeta MetaToProto(const TensorMeta& m) {
  v1::TensorMeta p;
  p.set_dtype(m.dtype);
  for (const auto& s : m.sizes) *p.add_sizes() = SymIntToProto(s);
  for (const auto& s : m.strides) *p.add_strides() = SymIntToProto(s);
  if (!m.device_type.empty()) {
    p.mutable_device()->set_type(m.device_type);
    p.mutable_device()->set_index(m.device_index);
  }
  p.set_requires_grad(m.requires_grad);
  *p.mutable_storage_offset() = SymIntToProto(m.storage_offset);
  return p;
}

using NameTable = absl::flat_hash_map<std::string, ValueId>;

absl::StatusOr<ValueId> Resolve(const NameTable& names, const std::string& name,
                                const std::string& where) {
  auto it = names.find(name);
  if (it == names.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " refers to '", name, "', which no input or node defines"));
  }
  return it->second;
}

absl::StatusOr<Argument> ArgFromProto(const v1::Argument& p, const NameTable& names,
                                      const std::string& where) {
  Argument a;
  a.name = p.name();
  switch (p.kind_case()) {
    case v1::Argument::kTensor: {
      ASSIGN_OR_RETURN(ValueId id, Resolve(names, p.tensor(), where));
      a.kind = id;
      break;
    }
    case v1::Argument::kIntValue:
      a.kind = p.int_value();
      break;
    case v1::Argument::kFloatValue:
      a.kind = p.float_value();
      break;
    case v1::Argument::kBoolValue:
      a.kind = p.bool_value();
      break;
    case v1::Argument::kStringValue:
      a.kind = p.string_value();
      break;
    case v1::Argument::kInts:
      a.kind = std::vector<int64_t>(p.ints().values().begin(), p.ints().values().end());
      break;
    case v1::Argument::kFloats:
      a.kind = std::vector<double>(p.floats().values().begin(), p.floats().values().end());
      break;
    case v1::Argument::kBools:
      a.kind = std::vector<bool>(p.bools().values().begin(), p.bools().values().end());
      break;
    case v1::Argument::kTensors: {
      std::vector<ValueId> ids;
      for (const auto& n : p.tensors().names()) {
        if (n.empty()) {
          ids.push_back(kNoValue);
          continue;
        }
        ASSIGN_OR_RETURN(ValueId id, Resolve(names, n, where));
        ids.push_back(id);
      }
      a.kind = std::move(ids);
      break;
    }
    case v1::Argument::kSymInt:
      a.kind = SymIntFromProto(p.sym_int());
      break;
    case v1::Argument::kSymInts: {
      std::vector<SymInt> v;
      for (const auto& s : p.sym_ints().values()) v.push_back(SymIntFromProto(s));
      a.kind = std::move(v);
      break;
    }
    case v1::Argument::kDtype:
      a.kind = p.dtype();
      break;
    case v1::Argument::kDevice:
      a.kind = Device{p.device().type(), p.device().index()};
      break;
    case v1::Argument::kMemoryFormat:
      a.kind = p.memory_format();
      break;
    case v1::Argument::kLayout:
      a.kind = p.layout();
      break;
    case v1::Argument::kNone:
      a.kind = None{};
      break;
    case v1::Argument::KIND_NOT_SET:
      return absl::InvalidArgumentError(absl::StrCat(where, " has no value (kind not set)"));
  }
  return a;
}

v1::Argument ArgToProto(const Argument& a, const std::vector<Value>& values) {
  v1::Argument p;
  p.set_name(a.name);
  std::visit(
      [&](const auto& k) {
        using T = std::decay_t<decltype(k)>;
        if constexpr (std::is_same_v<T, None>) {
          p.mutable_none();
        } else if constexpr (std::is_same_v<T, ValueId>) {
          p.set_tensor(values[k].name);
        } else if constexpr (std::is_same_v<T, int64_t>) {
          p.set_int_value(k);
        } else if constexpr (std::is_same_v<T, double>) {
          p.set_float_value(k);
        } else if constexpr (std::is_same_v<T, bool>) {
          p.set_bool_value(k);
        } else if constexpr (std::is_same_v<T, std::string>) {
          p.set_string_value(k);
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          auto* l = p.mutable_ints();
          for (auto x : k) l->add_values(x);
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          auto* l = p.mutable_floats();
          for (auto x : k) l->add_values(x);
        } else if constexpr (std::is_same_v<T, std::vector<bool>>) {
          auto* l = p.mutable_bools();
          for (bool x : k) l->add_values(x);
        } else if constexpr (std::is_same_v<T, std::vector<ValueId>>) {
          auto* l = p.mutable_tensors();
          for (auto id : k) l->add_names(id == kNoValue ? "" : values[id].name);
        } else if constexpr (std::is_same_v<T, SymInt>) {
          *p.mutable_sym_int() = SymIntToProto(k);
        } else if constexpr (std::is_same_v<T, std::vector<SymInt>>) {
          auto* l = p.mutable_sym_ints();
          for (const auto& s : k) *l->add_values() = SymIntToProto(s);
        } else if constexpr (std::is_same_v<T, v1::DType>) {
          p.set_dtype(k);
        } else if constexpr (std::is_same_v<T, Device>) {
          p.mutable_device()->set_type(k.type);
          p.mutable_device()->set_index(k.index);
        } else if constexpr (std::is_same_v<T, v1::MemoryFormat>) {
          p.set_memory_format(k);
        } else if constexpr (std::is_same_v<T, v1::Layout>) {
          p.set_layout(k);
        }
      },
      a.kind);
  return p;
}

// The nodes of `proto` in a topological order (stable: nodes already in order
// keep it), or the cycle that prevents one.
absl::StatusOr<std::vector<int>> TopologicalOrder(const v1::Graph& proto) {
  const int n = proto.nodes_size();
  absl::flat_hash_map<std::string, int> producer;  // value name -> node index
  for (int i = 0; i < n; ++i) {
    for (const auto& o : proto.nodes(i).outputs()) producer[o.name()] = i;
  }
  std::vector<std::vector<int>> users(n);
  std::vector<int> pending(n, 0);
  for (int i = 0; i < n; ++i) {
    for (const auto& name : OperandNames(proto.nodes(i))) {
      auto it = producer.find(name);
      if (it == producer.end()) continue;
      users[it->second].push_back(i);
      ++pending[i];
    }
  }
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (int i = 0; i < n; ++i) {
    if (pending[i] == 0) ready.push(i);
  }
  std::vector<int> order;
  while (!ready.empty()) {
    int i = ready.top();
    ready.pop();
    order.push_back(i);
    for (int u : users[i]) {
      if (--pending[u] == 0) ready.push(u);
    }
  }
  if (static_cast<int>(order.size()) == n) return order;

  // Walk back from a node that never became ready until a node repeats.
  int start = 0;
  while (pending[start] == 0) ++start;
  std::vector<int> path;
  absl::flat_hash_map<int, int> seen;
  int cur = start;
  while (!seen.contains(cur)) {
    seen[cur] = static_cast<int>(path.size());
    path.push_back(cur);
    for (const auto& name : OperandNames(proto.nodes(cur))) {
      auto it = producer.find(name);
      if (it != producer.end() && pending[it->second] != 0) {
        cur = it->second;
        break;
      }
    }
  }
  std::vector<std::string> cycle;
  for (size_t k = seen[cur]; k < path.size(); ++k) {
    cycle.push_back(absl::StrCat("'", proto.nodes(path[k]).name(), "'"));
  }
  cycle.push_back(absl::StrCat("'", proto.nodes(cur).name(), "'"));
  std::reverse(cycle.begin(), cycle.end());
  return absl::InvalidArgumentError(
      absl::StrCat("graph has a cycle: ", absl::StrJoin(cycle, " -> ")));
}

}  // namespace

std::vector<std::string> OperandNames(const v1::Node& node) {
  std::vector<std::string> out;
  auto add = [&](const v1::Argument& a) {
    if (a.has_tensor()) out.push_back(a.tensor());
    if (a.has_tensors()) {
      for (const auto& n : a.tensors().names()) {
        if (!n.empty()) out.push_back(n);
      }
    }
  };
  for (const auto& a : node.args()) add(a);
  for (const auto& a : node.kwargs()) add(a);
  return out;
}

std::string KindName(const Argument::Kind& k) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, None>) return "None";
        if constexpr (std::is_same_v<T, ValueId>) return "a tensor";
        if constexpr (std::is_same_v<T, int64_t>) return "an int";
        if constexpr (std::is_same_v<T, double>) return "a float";
        if constexpr (std::is_same_v<T, bool>) return "a bool";
        if constexpr (std::is_same_v<T, std::string>) return "a string";
        if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "an int list";
        if constexpr (std::is_same_v<T, std::vector<double>>) return "a float list";
        if constexpr (std::is_same_v<T, std::vector<bool>>) return "a bool list";
        if constexpr (std::is_same_v<T, std::vector<ValueId>>) {
          bool has_none = std::find(v.begin(), v.end(), kNoValue) != v.end();
          return has_none ? "a tensor list with None" : "a tensor list";
        }
        if constexpr (std::is_same_v<T, SymInt>) return "a SymInt";
        if constexpr (std::is_same_v<T, std::vector<SymInt>>) return "a SymInt list";
        if constexpr (std::is_same_v<T, v1::DType>) return "a dtype";
        if constexpr (std::is_same_v<T, Device>) return "a device";
        if constexpr (std::is_same_v<T, v1::MemoryFormat>) return "a memory format";
        if constexpr (std::is_same_v<T, v1::Layout>) return "a layout";
      },
      k);
}

bool IsEmptyList(const Argument::Kind& k) {
  return std::visit(
      [](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::vector<int64_t>> ||
                      std::is_same_v<T, std::vector<double>> ||
                      std::is_same_v<T, std::vector<bool>> ||
                      std::is_same_v<T, std::vector<ValueId>> ||
                      std::is_same_v<T, std::vector<SymInt>>) {
          return v.empty();
        } else {
          return false;
        }
      },
      k);
}

std::string SymInt::ToString() const { return is_constant() ? std::to_string(constant()) : expr(); }

SymInt SymIntFromProto(const v1::SymInt& p) {
  if (p.value_case() == v1::SymInt::kExpr) return SymInt{p.expr()};
  return SymInt{p.int_value()};
}

v1::SymInt SymIntToProto(const SymInt& s) {
  v1::SymInt p;
  if (s.is_constant()) {
    p.set_int_value(s.constant());
  } else {
    p.set_expr(s.expr());
  }
  return p;
}

void MoveTensors(v1::Graph* graph, const std::string& type, int index) {
  auto move = [&](v1::Device* d) {
    d->set_type(type);
    d->set_index(index);
  };
  for (auto& in : *graph->mutable_inputs()) {
    if (in.value().meta().has_device()) move(in.mutable_value()->mutable_meta()->mutable_device());
  }
  for (auto& node : *graph->mutable_nodes()) {
    for (auto& out : *node.mutable_outputs()) {
      if (out.meta().has_device()) move(out.mutable_meta()->mutable_device());
    }
    for (auto* args : {node.mutable_args(), node.mutable_kwargs()}) {
      for (auto& arg : *args) {
        if (arg.has_device()) move(arg.mutable_device());
      }
    }
  }
}

absl::StatusOr<Graph> Graph::FromProto(const v1::Graph& proto) {
  ASSIGN_OR_RETURN(Graph g, FromProtoExact(proto));
  ASSIGN_OR_RETURN(std::optional<v1::Graph> rewritten, RewriteTorchConventions(g));
  if (!rewritten) return g;
  return FromProtoExact(*rewritten);
}

absl::StatusOr<Graph> Graph::FromProtoExact(const v1::Graph& proto) {
  Graph g;
  g.name_ = proto.name();
  NameTable names;
  auto define = [&](const v1::Value& v, int producer, int index, const std::string& where,
                    bool meta_optional = false) -> absl::StatusOr<ValueId> {
    if (v.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has an empty name"));
    }
    ValueId id = static_cast<ValueId>(g.values_.size());
    if (!names.emplace(v.name(), id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the name '", v.name(), "' is defined twice"));
    }
    if (!v.has_meta() && !meta_optional) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " '", v.name(), "' has no metadata (field 'meta')"));
    }
    g.values_.push_back(Value{v.name(), MetaFromProto(v.meta()), producer, index});
    return id;
  };

  for (int i = 0; i < proto.inputs_size(); ++i) {
    const auto& ph = proto.inputs(i);
    ASSIGN_OR_RETURN(ValueId id, define(ph.value(), -1, i, absl::StrCat("input ", i)));
    g.inputs_.push_back(Input{id, ph.kind() == v1::Placeholder::KIND_UNSPECIFIED
                                      ? v1::Placeholder::USER_INPUT
                                      : ph.kind()});
  }
  ASSIGN_OR_RETURN(std::vector<int> order, TopologicalOrder(proto));
  // Every node's outputs are defined before any argument is resolved, so a
  // dangling reference is told apart from an ordering problem.
  std::vector<std::vector<ValueId>> outputs(proto.nodes_size());
  absl::flat_hash_map<std::string, bool> node_names;
  for (int k = 0; k < static_cast<int>(order.size()); ++k) {
    const v1::Node& pn = proto.nodes(order[k]);
    if (pn.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("node ", order[k], " has no name"));
    }
    if (!node_names.emplace(pn.name(), true).second) {
      return absl::InvalidArgumentError(absl::StrCat("node name '", pn.name(), "' is used twice"));
    }
    for (int j = 0; j < pn.outputs_size(); ++j) {
      ASSIGN_OR_RETURN(
          ValueId id, define(pn.outputs(j), k, j, absl::StrCat("node '", pn.name(), "' output ", j),
                             IsSymIntNode(pn.target())));
      outputs[order[k]].push_back(id);
    }
  }
  for (int k = 0; k < static_cast<int>(order.size()); ++k) {
    const v1::Node& pn = proto.nodes(order[k]);
    Node node;
    node.name = pn.name();
    node.target = pn.target();
    for (int j = 0; j < pn.args_size(); ++j) {
      ASSIGN_OR_RETURN(
          Argument a,
          ArgFromProto(pn.args(j), names, absl::StrCat("node '", pn.name(), "' argument ", j)));
      node.args.push_back(std::move(a));
    }
    for (int j = 0; j < pn.kwargs_size(); ++j) {
      const auto& kw = pn.kwargs(j);
      std::string where = absl::StrCat("node '", pn.name(), "' keyword argument '", kw.name(), "'");
      if (kw.name().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("node '", pn.name(), "' keyword argument ", j, " has no name"));
      }
      ASSIGN_OR_RETURN(Argument a, ArgFromProto(kw, names, where));
      node.kwargs.push_back(std::move(a));
    }
    node.outputs = outputs[order[k]];
    g.nodes_.push_back(std::move(node));
  }
  for (int i = 0; i < proto.outputs_size(); ++i) {
    ASSIGN_OR_RETURN(ValueId id,
                     Resolve(names, proto.outputs(i), absl::StrCat("graph output ", i)));
    g.outputs_.push_back(id);
  }
  return g;
}

v1::Graph Graph::ToProto() const {
  v1::Graph p;
  ToProto(&p);
  return p;
}

void Graph::ToProto(v1::Graph* out) const {
  v1::Graph& p = *out;
  p.Clear();
  p.set_name(name_);
  for (const auto& in : inputs_) {
    auto* ph = p.add_inputs();
    ph->set_kind(in.kind);
    ph->mutable_value()->set_name(values_[in.value].name);
    *ph->mutable_value()->mutable_meta() = MetaToProto(values_[in.value].meta);
  }
  for (const auto& node : nodes_) {
    auto* pn = p.add_nodes();
    pn->set_name(node.name);
    pn->set_target(node.target);
    for (const auto& a : node.args) *pn->add_args() = ArgToProto(a, values_);
    for (const auto& a : node.kwargs) *pn->add_kwargs() = ArgToProto(a, values_);
    for (ValueId id : node.outputs) {
      auto* o = pn->add_outputs();
      o->set_name(values_[id].name);
      *o->mutable_meta() = MetaToProto(values_[id].meta);
    }
  }
  for (ValueId id : outputs_) p.add_outputs(values_[id].name);
}

std::vector<ValueId> Graph::Operands(const Node& node) {
  std::vector<ValueId> out;
  auto add = [&](const Argument& a) {
    if (const auto* id = std::get_if<ValueId>(&a.kind)) out.push_back(*id);
    if (const auto* ids = std::get_if<std::vector<ValueId>>(&a.kind)) {
      for (ValueId id : *ids) {
        if (id != kNoValue) out.push_back(id);
      }
    }
  };
  for (const auto& a : node.args) add(a);
  for (const auto& a : node.kwargs) add(a);
  return out;
}

}  // namespace kiln::ir
