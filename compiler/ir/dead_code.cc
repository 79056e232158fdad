#include "compiler/ir/dead_code.h"

#include "compiler/ir/builder.h"

namespace kiln::ir {

bool EliminateDeadCode(Graph* graph) {
  const Graph& g = *graph;
  std::vector<bool> live_value(g.values().size(), false);
  for (ValueId id : g.outputs()) live_value[id] = true;
  std::vector<bool> live_node(g.nodes().size(), false);
  bool dropped = false;
  for (int i = static_cast<int>(g.nodes().size()) - 1; i >= 0; --i) {
    const Node& node = g.nodes()[i];
    for (ValueId id : node.outputs) live_node[i] = live_node[i] || live_value[id];
    if (!live_node[i]) {
      dropped = true;
      continue;
    }
    for (ValueId id : Graph::Operands(node)) live_value[id] = true;
  }
  if (!dropped) return false;

  GraphBuilder b(g.name());
  std::vector<ValueId> map(g.values().size(), kNoValue);
  for (const Input& in : g.inputs()) {
    const Value& v = g.value(in.value);
    map[in.value] = b.AddInput(v.meta, in.kind, v.name);
  }
  auto remap = [&](Argument a) {
    if (auto* id = std::get_if<ValueId>(&a.kind)) *id = map[*id];
    if (auto* ids = std::get_if<std::vector<ValueId>>(&a.kind)) {
      for (ValueId& id : *ids) {
        if (id != kNoValue) id = map[id];
      }
    }
    return a;
  };
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (!live_node[i]) continue;
    const Node& node = g.nodes()[i];
    std::vector<Argument> args, kwargs;
    for (const auto& a : node.args) args.push_back(remap(a));
    for (const auto& a : node.kwargs) kwargs.push_back(remap(a));
    std::vector<TensorMeta> metas;
    std::vector<std::string> names;
    for (ValueId id : node.outputs) {
      metas.push_back(g.value(id).meta);
      names.push_back(g.value(id).name);
    }
    std::vector<ValueId> outs = b.AddNode(node.target, std::move(args), std::move(kwargs),
                                          std::move(metas), node.name, std::move(names));
    for (size_t j = 0; j < outs.size(); ++j) map[node.outputs[j]] = outs[j];
  }
  for (ValueId id : g.outputs()) b.AddOutput(map[id]);
  *graph = std::move(b).Build();
  return true;
}

}  // namespace kiln::ir
