// Argument-kind checking against ATen operator schemas.
//
// A table of schema strings in ATen's own syntax
//   "add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"
// is parsed once into typed parameter lists. CheckArguments holds a node
// against the schema of its target: positional count, keyword names,
// required parameters, the kind of each argument, and the number of outputs.
// Targets outside the table are not checked here (the op registry, later,
// decides whether a backend can run them).
//
// Thread-safe: the parsed table is built on first use (a function-local
// static) and is immutable afterwards; the OpSchema pointers FindSchema hands
// out live for the rest of the process.
#ifndef KILN_COMPILER_IR_SCHEMA_H_
#define KILN_COMPILER_IR_SCHEMA_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "compiler/ir/graph.h"

namespace kiln::ir {

// The type of one parameter, as ATen spells it, with alias annotations
// ("Tensor(a!)", "Tensor(a -> *)") dropped.
//   "Tensor?"   -> base kTensor, optional
//   "int[2]"    -> base kInt, list of fixed size 2
//   "int[1]?"   -> base kInt, list of size 1, optional (the list may be None)
//   "Tensor?[]" -> base kTensor, list whose elements may be None
struct SchemaType {
  enum class Base {
    kTensor,
    kInt,
    kSymInt,
    kFloat,
    kBool,
    kScalar,
    kScalarType,
    kLayout,
    kDevice,
    kMemoryFormat,
    kStr,
    kGenerator,
  };
  Base base = Base::kTensor;
  bool is_list = false;
  int list_size = 0;              // N of "[N]"; 0 for "[]" or when not a list
  bool element_optional = false;  // "Tensor?[]"
  bool optional = false;          // a trailing "?": None is accepted too

  // Back to ATen's spelling, without alias annotations: "SymInt[]?".
  std::string ToString() const;
};

struct SchemaParam {
  std::string name;
  SchemaType type;
  // The default as spelled in the schema ("1", "None", "[]", "'none'"), or
  // nullopt when there is none.
  std::optional<std::string> default_value;
  bool kwarg_only = false;  // after the "*" marker

  // Must be given: neither a default nor an optional type.
  bool required() const { return !default_value.has_value() && !type.optional; }
};

struct OpSchema {
  // num_returns of a schema returning "Tensor[]": any number of outputs.
  static constexpr int kListReturn = -1;

  std::string name;      // "add"
  std::string overload;  // "Tensor"; empty for the default overload
  std::vector<SchemaParam> params;
  int num_returns = 1;  // 1 for "-> Tensor", 3 for "-> (Tensor, Tensor, Tensor)"

  // The node target spelling: "aten.add.Tensor", "aten.relu.default".
  std::string target() const;
  // Parameters before the "*" marker.
  int num_positional() const;
  // Index into params, or -1.
  int FindParam(absl::string_view name) const;
};

// Parses one schema string in ATen's syntax. The namespace is always aten; a
// leading "aten::" is accepted. Returns only Tensors are supported.
// INVALID_ARGUMENT, naming the position, on anything else.
absl::StatusOr<OpSchema> ParseSchema(absl::string_view schema);

// The schema of a target such as "aten.add.Tensor", or nullptr when the table
// has none.
const OpSchema* FindSchema(absl::string_view target);

// Every target the table knows, sorted.
std::vector<std::string> KnownTargets();

// INVALID_ARGUMENT naming the node and the argument when `node` does not fit
// the schema of its target; OK for targets the table does not know.
//
// A parameter takes these argument kinds (an optional "T?" takes None too):
//   Tensor <- tensor        Tensor[] <- tensors (None entries only for Tensor?[])
//   int, SymInt <- int, SymInt       int[], SymInt[] <- ints, SymInts
//   int[N], SymInt[N] <- also a single int or SymInt
//   float <- float, int     float[] <- floats, ints
//   Scalar <- int, float, bool, SymInt
//   bool <- bool   bool[N] <- bools   str <- string   ScalarType <- dtype
//   Device <- device   Layout <- layout   MemoryFormat <- memory_format
//   Generator? <- None only
// An empty list of any kind fits any list parameter: it has no elements whose
// kind could be wrong.
absl::Status CheckArguments(const Node& node, const Graph& graph);

}  // namespace kiln::ir

#endif  // KILN_COMPILER_IR_SCHEMA_H_
