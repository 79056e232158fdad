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
  std::vector<ValueId> map = b.CopyInputs(g);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (live_node[i]) b.CopyNode(g, g.nodes()[i], &map);
  }
  for (ValueId id : g.outputs()) b.AddOutput(map[id]);
  *graph = std::move(b).Build();
  return true;
}

}  // namespace kiln::ir
