// Canonical form of a graph and its cache key (docs/architecture.md §4).
//
// Two graphs that differ only in value names, node names, the graph's name or
// the order of independent nodes have the same canonical bytes. Everything
// else (an op, an argument, any metadata) changes them.
//
// The canonical order: every value gets a structural hash (an input hashes its
// position; a node output hashes its target, its arguments with operands
// replaced by their hashes, its output metadata and its output index). Nodes
// are then emitted by Kahn's algorithm, always taking the ready node with the
// smallest hash, and renamed in that order: inputs "arg0".., node outputs
// "v0".., nodes "n0"... Keyword arguments are sorted by name. Random ops
// (dropout, bernoulli, rand...) keep their program order among themselves:
// they draw from one generator, so their order is part of what the graph
// computes.
//
// Pure functions; thread-safe.
#ifndef KILN_COMPILER_IR_CANONICAL_H_
#define KILN_COMPILER_IR_CANONICAL_H_

#include <string>

#include "compiler/ir/graph.h"
#include "kiln/v1/service.pb.h"

namespace kiln::ir {

// The canonical graph in wire form.
v1::Graph Canonicalize(const Graph& graph);
// The same, written into `out` (which may live on an arena).
void Canonicalize(const Graph& graph, v1::Graph* out);

// Deterministic serialization of Canonicalize(graph).
std::string CanonicalBytes(const Graph& graph);

// The ISA generated CPU code targets when a client names none (g++'s
// -march level: AVX2 and FMA).
inline constexpr char kDefaultCpuIsa[] = "x86-64-v3";

// The SM arch and CUDA version generated CUDA code targets when a client
// names none (an H100's; NVRTC of CUDA 13).
inline constexpr char kDefaultSmArch[] = "sm_90";
inline constexpr char kDefaultCudaVersion[] = "13.0";

// The options as they enter the key: backend defaulted to "eager", options
// sorted by name, and for `kiln` the target device filled in (cuda when an
// input of `graph` is on a GPU, else cpu) with its defaults: the CPU ISA
// (kDefaultCpuIsa), or the SM arch and CUDA version.
v1::CompileOptions NormalizeOptions(const v1::CompileOptions& options,
                                    const Graph* graph = nullptr);

// Hex SHA-256 over the canonical graph, the normalized options (backend,
// target, backend options) and `compiler_version`.
std::string CacheKey(const Graph& graph, const v1::CompileOptions& options,
                     const std::string& compiler_version = KILN_COMPILER_VERSION);

// Whether `target` draws random numbers (by ATen's op names).
bool IsRandomTarget(absl::string_view target);

// Deterministic bytes of any message (for keys and digests).
std::string DeterministicBytes(const google::protobuf::Message& message);

}  // namespace kiln::ir

#endif  // KILN_COMPILER_IR_CANONICAL_H_
