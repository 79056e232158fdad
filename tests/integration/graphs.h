// Graphs for integration tests and benchmarks.
#ifndef KILN_TESTS_INTEGRATION_GRAPHS_H_
#define KILN_TESTS_INTEGRATION_GRAPHS_H_

#include <string>
#include <vector>

#include "kiln/v1/service.pb.h"

namespace kiln::testing {

// A chain of `nodes` pointwise ops (relu, neg, add of the previous two, ...)
// over one float32 input of shape [batch, 16]. `salt` changes the first op's
// alpha, giving a distinct key without changing the shape.
// With `symbolic`, the batch dimension is the symbol "s0" instead.
v1::Graph ChainGraph(int nodes, int64_t batch = 8, int salt = 0, bool symbolic = false);

// Guards that specialize ChainGraph's input to this batch size.
v1::GuardSet ChainGuards(int64_t batch);

// The signature of ChainGraph's input with this batch size.
v1::InputSignature ChainSignature(int64_t batch);

// One float32 cpu input x with `sizes`/`strides` and one node
// `target(x, args...)` (args in protobuf text) with `outputs` outputs of
// sizes `out_sizes`. A size or stride that is not a number is an expression.
v1::Graph OneNodeGraph(const std::vector<std::string>& sizes,
                       const std::vector<std::string>& strides, const std::string& target,
                       const std::string& args, int outputs = 1,
                       const std::vector<std::string>& out_sizes = {"1"});

// Reads a GraphFile (protobuf JSON) from tests/data/graphs/NAME.
v1::GraphFile LoadGraphFile(const std::string& name);
// Reads a GraphFile (protobuf JSON) from PATH. Aborts on failure.
v1::GraphFile LoadGraphFileAt(const std::string& path);

}  // namespace kiln::testing

#endif  // KILN_TESTS_INTEGRATION_GRAPHS_H_
