// Pass "cat-in-place": a concatenation whose parts the graph's kernels
// write is written by them in place. Each part's kernel stores into its
// slice of the concatenation's storage, and ATen's cat, which would read
// every part back and write them again, goes.
//
// GPT-2's backward concatenates the query, key and value gradients for the
// fused projection's weight gradient. Each is a copy out of the heads'
// layout that a kernel makes: that kernel now writes the [B, L, 3C] result,
// at the column offset of its part.
//
// A cat (aten.cat.default) is written in place when every part is
//   - a value one kernel stores whole (an allocation of its own,
//     contiguous), or a view that only reshapes such a value (contiguous,
//     offset 0);
//   - read by nothing but the cat: no kernel loads it, no other step views
//     or reads it, and it is not a graph output; and a part of it only once;
//   - of the cat's dtype, with constant sizes, and stored through indices
//     that map onto the slice: a store's linear index into the part, split
//     at the cat's dimension, must keep the terms below it within one row
//     of the part's trailing sizes (so that it can be moved to the cat's row
//     length). The cat's result is then allocated before the first of the
//     kernels, contiguous.
// Anything else keeps ATen's cat. Runs after the passes that add kernels
// (split-reductions) and before share-kernels and the memory plan. Each cat
// written in place is in `decisions` ("cat in place: n76_v by kernel_7").
//
// Pure function; thread-safe.
#ifndef KILN_COMPILER_LOOP_CAT_IN_PLACE_H_
#define KILN_COMPILER_LOOP_CAT_IN_PLACE_H_

#include "compiler/loop/plan_build.h"

namespace kiln::loop {

// Writes every such cat of `lowered` in place; returns how many.
int WriteCatsInPlace(LoweredGraph* lowered);

}  // namespace kiln::loop

#endif  // KILN_COMPILER_LOOP_CAT_IN_PLACE_H_
