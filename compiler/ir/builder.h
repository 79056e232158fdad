// Builds a Graph node by node: the way passes (the joint graph, the
// partitioner, test fixtures) make new graphs. Values are named as they are
// added ("a0", "a1", ... unless a name is given); every node comes with the
// metadata of its outputs (compiler/ops/emit.h infers it from the op
// registry).
//
// Not thread-safe.
#ifndef KILN_COMPILER_IR_BUILDER_H_
#define KILN_COMPILER_IR_BUILDER_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "compiler/ir/graph.h"

namespace kiln::ir {

class GraphBuilder {
 public:
  explicit GraphBuilder(std::string graph_name = "");

  ValueId AddInput(const TensorMeta& meta, v1::Placeholder::Kind kind = v1::Placeholder::USER_INPUT,
                   std::string name = "");
  // Adds a node reading `args`/`kwargs` (operands must already exist) with
  // one output per entry of `output_metas`; returns the output values.
  // `output_names`, when given, names the outputs (made unique).
  std::vector<ValueId> AddNode(std::string target, std::vector<Argument> args,
                               std::vector<Argument> kwargs, std::vector<TensorMeta> output_metas,
                               std::string name = "", std::vector<std::string> output_names = {});
  void AddOutput(ValueId value) { outputs_.push_back(value); }

  // The node added before with this target and these arguments (equal
  // kinds and values, names included), or nullptr: for a builder that
  // reuses a value it would compute again (the derivative of var.correction
  // takes the mean of its input, which the forward graph computes already).
  const Node* FindNode(const std::string& target, const std::vector<Argument>& args,
                       const std::vector<Argument>& kwargs) const;

  // Adds a copy of each input of graph `from` (same metadata, kind and
  // name), in order; returns the map CopyNode takes: a value id of `from` ->
  // one of this builder, kNoValue for values not copied yet.
  std::vector<ValueId> CopyInputs(const Graph& from);

  // Adds a copy of `node` of graph `from` (same target, arguments, names and
  // output metadata), its operands renamed through `map` (a value id of
  // `from` -> one of this builder). Records the copy's outputs in `map` and
  // returns them.
  std::vector<ValueId> CopyNode(const Graph& from, const Node& node, std::vector<ValueId>* map);

  const Value& value(ValueId id) const { return values_[id]; }
  const std::vector<Node>& nodes() const { return nodes_; }
  int num_values() const { return static_cast<int>(values_.size()); }

  // The graph; the builder is left empty.
  Graph Build() &&;

 private:
  std::string UniqueName(std::string wanted, const char* prefix);
  // FindNode's index: target and first tensor operand -> nodes.
  static std::string NodeKey(const std::string& target, const std::vector<Argument>& args);

  std::string name_;
  std::vector<Input> inputs_;
  std::vector<Node> nodes_;
  std::vector<ValueId> outputs_;
  std::vector<Value> values_;
  absl::flat_hash_set<std::string> used_names_;
  absl::flat_hash_map<std::string, std::vector<int32_t>> by_key_;
  int next_ = 0;
};

// Float32 (or `dtype`) CPU metadata of these constant sizes, contiguous.
TensorMeta ContiguousMeta(const std::vector<int64_t>& sizes, v1::DType dtype = v1::FLOAT32,
                          bool requires_grad = false);

// Argument shorthands for builders and tests (named by kind: a ValueId is
// an int too, so an overload set would be a trap).
Argument Ref(ValueId v);
Argument Int(int64_t i);
Argument Float(double f);
Argument Bool(bool b);
Argument Ints(std::vector<int64_t> ints);
Argument NoneArg();
Argument Kwarg(std::string name, Argument value);
// A positional argument of any kind (the graph rewrites' general form).
Argument Positional(Argument::Kind kind);

// `args` with every value (alone or in a list) mapped through `map`, a
// value id of one graph -> one of another (CopyNode's map).
std::vector<Argument> MapArguments(std::vector<Argument> args, const std::vector<ValueId>& map);

}  // namespace kiln::ir

#endif  // KILN_COMPILER_IR_BUILDER_H_
