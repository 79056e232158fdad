// A parser for the graph IR as ir::PrintReadable (compiler/ir/printer.h)
// prints it, so that pass tests read as text in, text out:
//
//   # graph 'rmsnorm'
//   def forward(self, x: "f32[s0, 16]", w: "f32[16]"):
//       pow_1: "f32[s0, 16]" = aten.pow.Tensor_Scalar(x, 2)
//       mean: "f32[s0, 1]" = aten.mean.dim(pow_1, [-1], True)
//       add: "f32[s0, 1]" = aten.add.Scalar(mean, 1e-06)
//       var_mean_1, var_mean_2 = aten.var_mean.correction(x, [1])  # f32[s0], f32[s0]
//       return (add,)
//
// Round trip: for every graph the compiler makes of the graphs under
// tests/data (and their joint, forward and backward graphs),
// PrintReadable(*ParseReadable(PrintReadable(g))) == PrintReadable(g).
//
// Arguments are read by the ATen schema of each node's target
// (compiler/ir/schema.h): a bare name is a value for a Tensor parameter and a
// size symbol for a SymInt one; "1" is an int for an int, a float for a
// float. A target the schema table does not know is refused. What the
// printer leaves out is rebuilt as a test would want it:
//   - inputs have contiguous strides and storage offset 0; node outputs get
//     the strides and offset of the op's shape rule (a permute's output is
//     not contiguous), contiguous ones where the registry has no rule;
//   - inputs live on options.device, node outputs where the shape rule puts
//     them (options.device where there is none);
//   - inputs require grad when options.requires_grad names them, node
//     outputs when any tensor they read does;
//   - inputs are USER_INPUT unless options.input_kinds says otherwise;
//   - a node is named after its first output ("mm" -> "mm_node"; node and
//     value names share the builder's namespace).
// What cannot be recovered: a float argument that prints as an integer
// ("2" for 2.0) reads as an int where the parameter is a Scalar; strings
// holding a quote.
//
// The parsed graph is checked by ir::Verify and, when options.registry is
// set, by the registry's shape rules (ops::CheckMetadata), so text whose
// printed metadata an op would not produce is refused.
//
// Malformed text is INVALID_ARGUMENT naming the line and what was expected
// there ("line 3: expected ' = ' after the outputs"), quoting at most a short
// prefix of the text. Parsing takes time linear in the text.
//
// Pure functions; thread-safe.
#ifndef KILN_COMPILER_OPS_GRAPH_PARSER_H_
#define KILN_COMPILER_OPS_GRAPH_PARSER_H_

#include <map>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "compiler/ir/graph.h"
#include "compiler/ir/limits.h"
#include "compiler/ops/registry.h"

namespace kiln::ops {

struct ParseOptions {
  // The device of every value: "cpu", "cuda", "cuda:0".
  std::string device = "cpu";
  // Inputs whose metadata says requires_grad.
  std::set<std::string> requires_grad;
  // Placeholder kinds of inputs other than USER_INPUT.
  std::map<std::string, v1::Placeholder::Kind> input_kinds;
  // Shape rules that give outputs their strides and check the printed
  // metadata; nullptr: contiguous strides, metadata unchecked.
  const Registry* registry = &DefaultRegistry();
  ir::GraphLimits limits;
};

// The graph `text` holds. Blank lines and lines starting with '#' are
// ignored, except a first "# graph '<name>'" line, which names the graph.
absl::StatusOr<ir::Graph> ParseReadable(absl::string_view text,
                                        const ParseOptions& options = ParseOptions());

}  // namespace kiln::ops

#endif  // KILN_COMPILER_OPS_GRAPH_PARSER_H_
