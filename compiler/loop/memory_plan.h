// Pass "memory-plan" (docs/architecture.md §5): when each value of an
// execution plan dies and whose storage a new one takes. Every value a step
// defines (an allocation, a view, an extern call's result) that is not an
// output is freed right after the last step that reads it (a view keeps
// its base alive); an allocation reuses the storage of a freed allocation
// of its dtype whose constant size is at least its own.
//
// Runs last, after every pass that adds steps (split-reductions), and
// replans a plan it has planned before (earlier frees and reuses dropped).
//
// Pure function; thread-safe.
#ifndef KILN_COMPILER_LOOP_MEMORY_PLAN_H_
#define KILN_COMPILER_LOOP_MEMORY_PLAN_H_

#include <string>

#include "kiln/v1/artifact.pb.h"

namespace kiln::loop {

void PlanMemory(v1::ExecutionPlan* plan);

// The plan's steps, one line each ("alloc t3 [64, 128] float32 (reuses
// t1)", "launch kernel_2 (x, t3)", "free t1", ...).
std::string PrintSteps(const v1::ExecutionPlan& plan);

}  // namespace kiln::loop

#endif  // KILN_COMPILER_LOOP_MEMORY_PLAN_H_
