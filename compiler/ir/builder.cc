#include "compiler/ir/builder.h"

#include <algorithm>
#include <type_traits>
#include <variant>

#include "absl/strings/str_cat.h"

namespace kiln::ir {

GraphBuilder::GraphBuilder(std::string graph_name) : name_(std::move(graph_name)) {}

std::string GraphBuilder::UniqueName(std::string wanted, const char* prefix) {
  if (wanted.empty()) wanted = absl::StrCat(prefix, next_++);
  std::string name = wanted;
  for (int k = 1; used_names_.contains(name); ++k) name = absl::StrCat(wanted, "_", k);
  used_names_.insert(name);
  return name;
}

ValueId GraphBuilder::AddInput(const TensorMeta& meta, v1::Placeholder::Kind kind,
                               std::string name) {
  ValueId id = static_cast<ValueId>(values_.size());
  values_.push_back(
      Value{UniqueName(std::move(name), "in"), meta, -1, static_cast<int32_t>(inputs_.size())});
  inputs_.push_back(Input{id, kind});
  return id;
}

std::vector<ValueId> GraphBuilder::AddNode(std::string target, std::vector<Argument> args,
                                           std::vector<Argument> kwargs,
                                           std::vector<TensorMeta> output_metas, std::string name,
                                           std::vector<std::string> output_names) {
  Node node;
  node.target = std::move(target);
  node.args = std::move(args);
  node.kwargs = std::move(kwargs);
  node.name = UniqueName(std::move(name), "n");
  const int32_t index = static_cast<int32_t>(nodes_.size());
  for (size_t j = 0; j < output_metas.size(); ++j) {
    ValueId id = static_cast<ValueId>(values_.size());
    std::string out_name = j < output_names.size()    ? output_names[j]
                           : output_metas.size() == 1 ? absl::StrCat(node.name, "_v")
                                                      : absl::StrCat(node.name, "_v", j);
    values_.push_back(Value{UniqueName(out_name, "v"), std::move(output_metas[j]), index,
                            static_cast<int32_t>(j)});
    node.outputs.push_back(id);
  }
  by_key_[NodeKey(node.target, node.args)].push_back(index);
  nodes_.push_back(std::move(node));
  return nodes_.back().outputs;
}

std::string GraphBuilder::NodeKey(const std::string& target, const std::vector<Argument>& args) {
  for (const Argument& a : args) {
    if (const auto* id = std::get_if<ValueId>(&a.kind)) return absl::StrCat(target, "@", *id);
  }
  return target;
}

namespace {

bool SameKind(const Argument::Kind& a, const Argument::Kind& b) {
  return std::visit(
      [](const auto& x, const auto& y) {
        using X = std::decay_t<decltype(x)>;
        if constexpr (!std::is_same_v<X, std::decay_t<decltype(y)>>) {
          return false;
        } else if constexpr (std::is_same_v<X, None>) {
          return true;
        } else {
          return x == y;
        }
      },
      a, b);
}

bool SameArguments(const std::vector<Argument>& a, const std::vector<Argument>& b) {
  if (a.size() != b.size()) return false;
  for (size_t j = 0; j < a.size(); ++j) {
    if (a[j].name != b[j].name || !SameKind(a[j].kind, b[j].kind)) return false;
  }
  return true;
}

}  // namespace

const Node* GraphBuilder::FindNode(const std::string& target, const std::vector<Argument>& args,
                                   const std::vector<Argument>& kwargs) const {
  auto it = by_key_.find(NodeKey(target, args));
  if (it == by_key_.end()) return nullptr;
  for (int32_t index : it->second) {
    const Node& n = nodes_[index];
    if (n.target == target && SameArguments(n.args, args) && SameArguments(n.kwargs, kwargs)) {
      return &n;
    }
  }
  return nullptr;
}

std::vector<ValueId> GraphBuilder::CopyInputs(const Graph& from) {
  std::vector<ValueId> map(from.values().size(), kNoValue);
  for (const Input& in : from.inputs()) {
    const Value& v = from.value(in.value);
    map[in.value] = AddInput(v.meta, in.kind, v.name);
  }
  return map;
}

std::vector<ValueId> GraphBuilder::CopyNode(const Graph& from, const Node& node,
                                            std::vector<ValueId>* map) {
  std::vector<Argument> args = MapArguments(node.args, *map);
  std::vector<Argument> kwargs = MapArguments(node.kwargs, *map);
  std::vector<TensorMeta> metas;
  std::vector<std::string> names;
  for (ValueId id : node.outputs) {
    metas.push_back(from.value(id).meta);
    names.push_back(from.value(id).name);
  }
  std::vector<ValueId> outs = AddNode(node.target, std::move(args), std::move(kwargs),
                                      std::move(metas), node.name, std::move(names));
  for (size_t j = 0; j < outs.size(); ++j) {
    if ((*map)[node.outputs[j]] == kNoValue) (*map)[node.outputs[j]] = outs[j];
  }
  return outs;
}

Graph GraphBuilder::Build() && {
  Graph g;
  g.name_ = std::move(name_);
  g.inputs_ = std::move(inputs_);
  g.nodes_ = std::move(nodes_);
  g.outputs_ = std::move(outputs_);
  g.values_ = std::move(values_);
  return g;
}

TensorMeta ContiguousMeta(const std::vector<int64_t>& sizes, v1::DType dtype, bool requires_grad) {
  TensorMeta m;
  m.dtype = dtype;
  m.device_type = "cpu";
  m.requires_grad = requires_grad;
  m.strides.resize(sizes.size());
  int64_t stride = 1;
  for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
    m.strides[d] = SymInt{stride};
    stride *= sizes[d];
  }
  for (int64_t s : sizes) m.sizes.push_back(SymInt{s});
  return m;
}

Argument Ref(ValueId v) { return Argument{"", v}; }
Argument Int(int64_t i) { return Argument{"", i}; }
Argument Float(double f) { return Argument{"", f}; }
Argument Bool(bool b) { return Argument{"", b}; }
Argument Ints(std::vector<int64_t> ints) { return Argument{"", std::move(ints)}; }
Argument NoneArg() { return Argument{"", None{}}; }
Argument Positional(Argument::Kind kind) { return Argument{"", std::move(kind)}; }

std::vector<Argument> MapArguments(std::vector<Argument> args, const std::vector<ValueId>& map) {
  for (Argument& a : args) {
    if (auto* id = std::get_if<ValueId>(&a.kind)) *id = map[*id];
    if (auto* ids = std::get_if<std::vector<ValueId>>(&a.kind)) {
      for (ValueId& id : *ids) {
        if (id != kNoValue) id = map[id];
      }
    }
  }
  return args;
}
Argument Kwarg(std::string name, Argument value) {
  value.name = std::move(name);
  return value;
}

}  // namespace kiln::ir
