// The compile-error minifier behind `kilnctl minify` (docs/troubleshooting.md):
// delta debugging over a graph's nodes, each candidate compiled on kilnd
// with bypass_cache (by kilnctl, or by kilnd itself in the background), down to the smallest
// subgraph that still fails the same way; then a graph file and a torch 2 script that show the
// failure.
//
// Candidates are subgraphs: a set of the graph's nodes, in order, whose
// reads of values made outside the set become inputs and whose values no
// node of the set reads become outputs. A candidate "fails the same way"
// when kilnd refuses it with the same status code and the same message once
// quoted names and numbers are blanked out ("at node 'relu_3'" and "at node
// 'relu'" are the same failure).
//
// Thread-compatible: `compile` is called from the calling thread only.
#ifndef KILN_CLIENT_MINIFY_H_
#define KILN_CLIENT_MINIFY_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/v1/service.pb.h"

namespace kiln {

// The subgraph of `graph` (nodes in topological order) made of the nodes at
// the indices `keep`, ascending.
v1::Graph Subgraph(const v1::Graph& graph, const std::vector<int>& keep);

// Zeller's ddmin: a 1-minimal subset of `items` on which `fails` holds, given
// that it holds on `items`. Calls `fails` O(n^2) times at worst, O(n log n)
// when one item is to blame.
std::vector<int> DeltaDebug(std::vector<int> items,
                            const std::function<bool(const std::vector<int>&)>& fails);

// `message` with quoted names ('...') and digit runs blanked out.
std::string FailureSignature(absl::StatusCode code, absl::string_view message);

// Sends one compile request to kilnd: a Client's Compile, or kilnd's own.
using CompileFn =
    std::function<absl::StatusOr<v1::CompileResponse>(const v1::CompileRequest& request)>;

struct Minified {
  v1::CompileRequest request;  // the smallest failing graph, with the original options
  absl::Status error;          // how it fails
  int compiles = 0;            // candidates tried
  int nodes_before = 0;        // of the graph minified
  std::string stage;           // "graph", or "forward" / "backward" (after=aot)
};

// Minifies `request`'s graph. after = "graph": the graph itself (any
// backend). after = "aot": the forward or backward graph of its training
// split (kilnd's aot_eager), whichever fails the same way under the
// request's backend, compiled as an inference graph. FAILED_PRECONDITION
// when the request compiles, or when after=aot finds neither half failing.
absl::StatusOr<Minified> MinifyCompileError(const CompileFn& compile, v1::CompileRequest request,
                                            const std::string& after);

// Writes DIR/minified.json (a kiln.v1.GraphFile) and DIR/repro.py, a torch 2
// script that compiles it on $KILN_SERVER (default `server`) with the same
// options and runs it on random inputs of its metadata: running it raises
// the same error. Returns the paths written.
absl::StatusOr<std::vector<std::string>> WriteRepro(const std::string& dir, const Minified& m,
                                                    const std::string& server);

}  // namespace kiln

#endif  // KILN_CLIENT_MINIFY_H_
