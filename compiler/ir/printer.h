// A readable listing of a graph, in the manner of FX's print_readable:
//
//   def forward(self, x: "f32[s0, 16]", w: "f32[16, 16]"):
//       mm: "f32[s0, 16]" = aten.mm.default(x, w)
//       return (mm,)
#ifndef KILN_COMPILER_IR_PRINTER_H_
#define KILN_COMPILER_IR_PRINTER_H_

#include <string>

#include "compiler/ir/graph.h"

namespace kiln::ir {

std::string PrintReadable(const Graph& graph);

// "f32[s0, 16]": dtype abbreviation and sizes.
std::string MetaShortString(const TensorMeta& meta);

// "f32", "i64", "b8"...
std::string DTypeShortName(v1::DType dtype);

}  // namespace kiln::ir

#endif  // KILN_COMPILER_IR_PRINTER_H_
