// Dead code elimination (pass name "dead-code"): drops every node none of
// whose outputs reaches a graph output. Inputs are kept (they are the calling
// convention). Returns whether anything was dropped.
//
// Pure function; thread-safe.
#ifndef KILN_COMPILER_IR_DEAD_CODE_H_
#define KILN_COMPILER_IR_DEAD_CODE_H_

#include "compiler/ir/graph.h"

namespace kiln::ir {

bool EliminateDeadCode(Graph* graph);

}  // namespace kiln::ir

#endif  // KILN_COMPILER_IR_DEAD_CODE_H_
