// The graph IR every compiler stage works on.
//
// A Graph owns its values: placeholders (the inputs, in calling order) and the
// outputs of nodes. Nodes refer to values by ValueId, an index into
// Graph::values(); names are kept only to print and to round-trip the proto.
// Nodes are kept in topological order (FromProto sorts them).
//
// Not thread-safe for mutation; concurrent reads of a const Graph are fine.
#ifndef KILN_COMPILER_IR_GRAPH_H_
#define KILN_COMPILER_IR_GRAPH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::ir {

using ValueId = int32_t;
inline constexpr ValueId kNoValue = -1;

// An integer that is a constant or a symbolic expression ("s0", "2*s0").
struct SymInt {
  std::variant<int64_t, std::string> v;

  bool is_constant() const { return std::holds_alternative<int64_t>(v); }
  int64_t constant() const { return std::get<int64_t>(v); }
  const std::string& expr() const { return std::get<std::string>(v); }
  std::string ToString() const;
  bool operator==(const SymInt& o) const { return v == o.v; }
};

struct TensorMeta {
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<SymInt> sizes;
  std::vector<SymInt> strides;
  std::string device_type;  // empty when missing
  int32_t device_index = -1;
  bool requires_grad = false;
  SymInt storage_offset{int64_t{0}};
};

struct Value {
  std::string name;
  TensorMeta meta;
  int32_t producer = -1;  // node index; -1 for a placeholder
  int32_t index = 0;      // output index of the producer, or input position
};

struct None {};
struct Device {
  std::string type;
  int32_t index = -1;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
};

// One argument of a node. The alternatives follow v1::Argument's kinds.
struct Argument {
  using Kind =
      std::variant<None, ValueId, int64_t, double, bool, std::string, std::vector<int64_t>,
                   std::vector<double>, std::vector<bool>,
                   std::vector<ValueId>,  // kNoValue stands for None
                   SymInt, std::vector<SymInt>, v1::DType, Device, v1::MemoryFormat, v1::Layout>;
  std::string name;  // empty for positional arguments
  Kind kind;
};

struct Node {
  std::string name;
  std::string target;  // "aten.add.Tensor"
  std::vector<Argument> args;
  std::vector<Argument> kwargs;
  std::vector<ValueId> outputs;
};

struct Input {
  ValueId value;
  v1::Placeholder::Kind kind = v1::Placeholder::USER_INPUT;
};

class Graph {
 public:
  // Builds the IR from its wire form, resolving names and sorting nodes into
  // a topological order, then rewrites what torch 2 spells differently from
  // the schemas (compiler/ir/torch_conventions.h). Fails with
  // INVALID_ARGUMENT, naming the node and the argument, on duplicate or
  // dangling names, cycles, outputs that name nothing, or arguments with no
  // kind.
  static absl::StatusOr<Graph> FromProto(const v1::Graph& proto);
  // The wire form. FromProto(g.ToProto()) == g, and for a graph whose nodes
  // were already in topological order and follow the schemas,
  // ToProto(FromProto(p)) == p.
  v1::Graph ToProto() const;
  // The same, written into `out` (which may live on an arena).
  void ToProto(v1::Graph* out) const;

  const std::string& name() const { return name_; }
  const std::vector<Input>& inputs() const { return inputs_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }
  const std::vector<Value>& values() const { return values_; }
  const Value& value(ValueId id) const { return values_[id]; }

  // Every value a node reads, in argument order (tensor lists flattened).
  static std::vector<ValueId> Operands(const Node& node);

 private:
  friend class GraphBuilder;

  // FromProto without the torch 2 rewrite.
  static absl::StatusOr<Graph> FromProtoExact(const v1::Graph& proto);

  std::string name_;
  std::vector<Input> inputs_;
  std::vector<Node> nodes_;
  std::vector<ValueId> outputs_;
  std::vector<Value> values_;
};

// "a float", "None", "a tensor list with None": what an argument is, for
// error messages.
std::string KindName(const Argument::Kind& kind);

// Whether the argument is a list with no elements (of any element type).
bool IsEmptyList(const Argument::Kind& kind);

SymInt SymIntFromProto(const v1::SymInt& p);
v1::SymInt SymIntToProto(const SymInt& s);

// The names of the values `node` reads (its tensor and tensor-list
// arguments, positional and keyword), from its wire form, in order.
std::vector<std::string> OperandNames(const v1::Node& node);

// Puts every tensor of `graph` that names a device (inputs, node outputs,
// device arguments) on device `type`:`index`: a captured graph as if it had
// been captured there (kiln_dump_code --target=cuda, the parser tests).
void MoveTensors(v1::Graph* graph, const std::string& type, int index);

}  // namespace kiln::ir

#endif  // KILN_COMPILER_IR_GRAPH_H_
