// The op registry: one entry per core-ATen op the compiler understands.
//
// An entry holds
//   - traits the partitioner and fusion read (pointwise, view, reduction,
//     random, expensive),
//   - a shape rule: the metadata (dtype, sizes, strides, device) of each
//     output from the node's arguments, with PyTorch's broadcasting and type
//     promotion; kiln checks client metadata against it and builders use it
//     to give new nodes their metadata,
//   - a derivative rule: the vector-Jacobian product, emitted as a small graph
//     of registry ops into the joint graph.
// Argument access goes through OpCall, which binds the node's positional and
// keyword arguments to the op's ATen schema (compiler/ir/schema.h) by name,
// with the schema's defaults.
//
// The registry is built once and immutable afterwards: thread-safe.
#ifndef KILN_COMPILER_OPS_REGISTRY_H_
#define KILN_COMPILER_OPS_REGISTRY_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/graph.h"
#include "compiler/ir/schema.h"

namespace kiln::ops {

struct OpTraits {
  bool pointwise = false;  // elementwise over broadcast operands
  bool view = false;       // the output aliases an input's storage
  bool reduction = false;  // reduces one or more dimensions
  bool random = false;     // draws random numbers: never recomputed
  bool expensive = false;  // matmul/convolution class: never recomputed, extern
  bool creation = false;   // makes a tensor from sizes/scalars only
};

// A node's arguments bound to its schema. Tensor arguments resolve to the
// metadata of the values they name, through `meta_of`.
class OpCall {
 public:
  // INVALID_ARGUMENT when `target` has no schema or the arguments do not
  // bind (see ir::CheckArguments).
  static absl::StatusOr<OpCall> Bind(const std::string& target,
                                     const std::vector<ir::Argument>& args,
                                     const std::vector<ir::Argument>& kwargs,
                                     std::function<const ir::TensorMeta&(ir::ValueId)> meta_of);

  const std::string& target() const { return target_; }
  const ir::OpSchema& schema() const { return *schema_; }

  // The argument bound to parameter `name`; nullptr when absent and the
  // parameter has no default (defaults are materialized, "None" as None).
  const ir::Argument* Find(const std::string& name) const;
  bool IsNone(const std::string& name) const;  // absent or None

  // Typed access; INVALID_ARGUMENT naming the parameter on a kind mismatch.
  absl::StatusOr<ir::ValueId> Tensor(const std::string& name) const;
  // The metadata of Tensor(name). In a derivative rule it points into the
  // graph being built: valid only until the next emitted op.
  absl::StatusOr<const ir::TensorMeta*> Meta(const std::string& name) const;
  absl::StatusOr<std::vector<ir::ValueId>> Tensors(const std::string& name) const;
  absl::StatusOr<int64_t> Int(const std::string& name) const;
  absl::StatusOr<double> Double(const std::string& name) const;  // float, int or bool Scalar
  absl::StatusOr<bool> Bool(const std::string& name) const;
  absl::StatusOr<std::vector<int64_t>> Ints(const std::string& name) const;  // int[] / int[N] / int
  absl::StatusOr<std::vector<ir::SymInt>> SymInts(const std::string& name) const;
  absl::StatusOr<std::optional<v1::DType>> DType(const std::string& name) const;
  const ir::TensorMeta& MetaOf(ir::ValueId v) const { return meta_of_(v); }

  // "node 'x' (aten.add.Tensor)": prefix for error messages.
  std::string Where() const;
  void set_node_name(std::string name) { node_name_ = std::move(name); }

 private:
  std::string target_;
  std::string node_name_;
  const ir::OpSchema* schema_ = nullptr;
  std::map<std::string, ir::Argument> bound_;
  std::function<const ir::TensorMeta&(ir::ValueId)> meta_of_;
};

using ShapeRule = std::function<absl::StatusOr<std::vector<ir::TensorMeta>>(const OpCall&)>;

class DerivativeContext;
// Sets the gradient of each differentiable tensor input via ctx.SetGrad.
using DerivativeRule = std::function<absl::Status(DerivativeContext& ctx)>;

struct OpDef {
  std::string target;  // "aten.add.Tensor"
  OpTraits traits;
  ShapeRule shape;
  DerivativeRule derivative;  // empty: the op has no derivative
  // Schema parameters that are not differentiable even when they are
  // tensors (indices, masks); gradients never flow into them.
  std::vector<std::string> nondifferentiable;
};

class Registry {
 public:
  const OpDef* Find(const std::string& target) const;
  // Every entry, by target.
  std::vector<const OpDef*> All() const;

  // Used while the registry is built (RegisterShapeRules, then
  // RegisterDerivatives attaching rules to existing entries).
  void Add(OpDef def);
  OpDef* Mutable(const std::string& target);

 private:
  std::map<std::string, OpDef> ops_;
};

// The registry with every op of this build. Built on first use; immutable.
const Registry& DefaultRegistry();

// Output metadata of `target` applied to these arguments, by its shape rule.
absl::StatusOr<std::vector<ir::TensorMeta>> InferMetas(
    const Registry& registry, const std::string& target, const std::vector<ir::Argument>& args,
    const std::vector<ir::Argument>& kwargs,
    std::function<const ir::TensorMeta&(ir::ValueId)> meta_of);

// Adds a node to `b` with the metadata its shape rule gives, named as
// GraphBuilder::AddNode names it.
absl::StatusOr<std::vector<ir::ValueId>> Emit(ir::GraphBuilder& b, const Registry& registry,
                                              const std::string& target,
                                              std::vector<ir::Argument> args,
                                              std::vector<ir::Argument> kwargs = {},
                                              std::string name = "",
                                              std::vector<std::string> output_names = {});

// Checks every node of `graph` against its registry entry: the client's
// output metadata (dtype, rank, constant sizes, device) must equal what the
// shape rule gives. INVALID_ARGUMENT naming the node, the output and the
// field. Nodes whose target has no entry are not checked.
absl::Status CheckMetadata(const Registry& registry, const ir::Graph& graph);

}  // namespace kiln::ops

#endif  // KILN_COMPILER_OPS_REGISTRY_H_
