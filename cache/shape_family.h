// Automatic dynamic shapes for clients that send static graphs
// (docs/architecture.md §4).
//
// Graphs of one program traced at different sizes differ only in their
// integers: the sizes, strides and storage offsets of their values and the
// integer arguments of their nodes. Such graphs form a shape family, whose id
// hashes the graph with every integer erased.
//
// Generalize anti-unifies two static graphs of a family: each input dimension
// whose size differs becomes a symbol (equal pairs of sizes share one, as
// Dynamo's duck sizing does), and every other integer that differs must be an
// expression of those symbols that fits both graphs: s, k*s, k*s*t, k*s*t*u,
// s + t + c or k*s + c, tried in that order (products first: sizes and
// strides are products of sizes). Two sample points cannot decide what a program computes at a
// third size, so a generalized graph serves a later graph only when CheckInstance finds that graph
// to be exactly the generalized one at some values of its symbols.
//
// Graphs are compared in positional form: values renamed by position (inputs
// "arg0".., node outputs "v0"..), nodes in the order given, integer arguments
// spelled as SymInts. One program traced at two sizes gives the same order.
//
// Pure functions; thread-safe.
#ifndef KILN_CACHE_SHAPE_FAMILY_H_
#define KILN_CACHE_SHAPE_FAMILY_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kiln/v1/guards.pb.h"

namespace kiln::cache {

// `graph` in positional form.
v1::Graph PositionalForm(const v1::Graph& graph);

// Hex SHA-256 over `positional` with every integer erased, and over `salt`
// (what else must match: the normalized compile options, the compiler).
std::string ShapeFamily(const v1::Graph& positional, absl::string_view salt);

// Whether every integer of the graph is a constant.
bool IsStatic(const v1::Graph& graph);

struct Generalized {
  v1::Graph graph;                   // positional form, integer arguments as SymInts
  std::vector<std::string> symbols;  // "s0", "s1", ...
  // Per symbol, the input dimensions it stands for: (input, dimension).
  std::vector<std::vector<std::pair<int, int>>> dims;
};

// The generalization of static graphs `a` and `b` (positional forms of one
// family). FAILED_PRECONDITION saying why there is none: the graphs differ
// in more than integers, a differing size is 0 or 1 (specialized, as
// Dynamo does), or an integer fits no expression of the symbols.
absl::StatusOr<Generalized> Generalize(const v1::Graph& a, const v1::Graph& b);

// OK when the static graph `concrete` is `general` at some values of its
// symbols, else FAILED_PRECONDITION naming the first integer that differs.
// Both in positional form.
absl::Status CheckInstance(const v1::Graph& general, const v1::Graph& concrete);

// `guards` (a static graph's) with each input's sizes and exact strides taken
// from the generalized graph's inputs, and a shape guard "s >= 2" per symbol.
v1::GuardSet GeneralizeGuards(const v1::GuardSet& guards, const Generalized& g);

// The graph with every SymInt argument that is a constant spelled as an int,
// and every SymInt list of constants as an int list (the schemas' own kinds).
v1::Graph ConstantsAsInts(v1::Graph graph);

}  // namespace kiln::cache

#endif  // KILN_CACHE_SHAPE_FAMILY_H_
