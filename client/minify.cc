#include "client/minify.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"
#include "compiler/ir/graph.h"
#include "google/protobuf/util/json_util.h"

namespace kiln {
namespace {

// Calls f(name) on each value name the node reads.
template <typename F>
void ForEachRead(const v1::Node& n, F&& f) {
  for (const auto* args : {&n.args(), &n.kwargs()}) {
    for (const v1::Argument& a : *args) {
      if (a.has_tensor()) f(a.tensor());
      if (a.has_tensors()) {
        for (const std::string& t : a.tensors().names()) {
          if (!t.empty()) f(t);
        }
      }
    }
  }
}

v1::Graph WithoutRequiresGrad(v1::Graph g) {
  for (v1::Placeholder& ph : *g.mutable_inputs()) {
    ph.mutable_value()->mutable_meta()->set_requires_grad(false);
  }
  for (v1::Node& n : *g.mutable_nodes()) {
    for (v1::Value& v : *n.mutable_outputs()) v.mutable_meta()->set_requires_grad(false);
  }
  return g;
}

constexpr char kReproScript[] = R"PY("""Repro of a failing kiln compile, written by kilnctl minify.

Compiles minified.json (beside this file) on kilnd ($KILN_SERVER, default
below) with the options it was minified under, then runs the artifact on
random inputs of the graph's metadata. Running it shows the failure:

    python repro.py
"""
import os

import torch
from google.protobuf import json_format

import kiln
from kiln.compiled import ArtifactFunction
from kiln.runtime import torch_device, torch_dtype
from kiln.v1 import service_pb2

SERVER = os.environ.get("KILN_SERVER", "@SERVER@")
HERE = os.path.dirname(os.path.abspath(__file__))
# What kilnd answered when the graph was minified.
EXPECTED = @EXPECTED@


def random_input(meta):
    sizes = [s.int_value for s in meta.sizes]
    strides = [s.int_value for s in meta.strides] or None
    dtype, device = torch_dtype(meta.dtype), torch_device(meta.device)
    if strides is None:
        t = torch.empty(sizes, dtype=dtype, device=device)
    else:
        t = torch.empty_strided(sizes, strides, dtype=dtype, device=device)
    if dtype.is_floating_point or dtype.is_complex:
        return t.normal_()
    if dtype == torch.bool:
        return t.random_(0, 2)
    return t.random_(0, 8)


def main():
    with open(os.path.join(HERE, "minified.json")) as f:
        graph_file = json_format.Parse(f.read(), service_pb2.GraphFile())
    inputs = [random_input(ph.value.meta) for ph in graph_file.graph.inputs]
    print(f"expected: {EXPECTED}")
    with kiln.Client(SERVER) as client:
        response = client.compile(graph_file.graph, options=graph_file.options,
                                  bypass_cache=True)
    outputs = ArtifactFunction(response.artifact, graph_file.graph)(inputs)
    for name, out in zip(graph_file.graph.outputs, outputs):
        print(name, tuple(out.shape), out.dtype)
    print("compiled and ran: the failure did not reproduce")


if __name__ == "__main__":
    main()
)PY";

std::string PythonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      absl::StrAppend(&out, "\\", std::string(1, c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += " ";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

v1::Graph Subgraph(const v1::Graph& graph, const std::vector<int>& keep) {
  const std::set<int> kept(keep.begin(), keep.end());
  std::map<std::string, const v1::TensorMeta*> meta;
  std::map<std::string, int> input_position;
  for (int i = 0; i < graph.inputs_size(); ++i) {
    meta[graph.inputs(i).value().name()] = &graph.inputs(i).value().meta();
    input_position[graph.inputs(i).value().name()] = i;
  }
  std::set<std::string> made_inside;
  for (int k : keep) {
    for (const v1::Value& v : graph.nodes(k).outputs()) made_inside.insert(v.name());
  }
  for (const v1::Node& n : graph.nodes()) {
    for (const v1::Value& v : n.outputs()) meta[v.name()] = &v.meta();
  }
  // What the kept nodes read, in order of first read.
  std::vector<std::string> reads;
  std::set<std::string> read;
  for (int k : keep) {
    ForEachRead(graph.nodes(k), [&](const std::string& name) {
      if (read.insert(name).second) reads.push_back(name);
    });
  }
  v1::Graph out;
  out.set_name(graph.name());
  for (int i = 0; i < graph.inputs_size(); ++i) {
    if (read.count(graph.inputs(i).value().name())) *out.add_inputs() = graph.inputs(i);
  }
  for (const std::string& name : reads) {
    if (input_position.count(name) || made_inside.count(name) || !meta.count(name)) continue;
    v1::Placeholder* ph = out.add_inputs();
    ph->set_kind(v1::Placeholder::USER_INPUT);
    ph->mutable_value()->set_name(name);
    *ph->mutable_value()->mutable_meta() = *meta[name];
  }
  for (int k : keep) *out.add_nodes() = graph.nodes(k);
  for (int k : keep) {
    for (const v1::Value& v : graph.nodes(k).outputs()) {
      if (!read.count(v.name())) out.add_outputs(v.name());
    }
  }
  return out;
}

std::vector<int> DeltaDebug(std::vector<int> items,
                            const std::function<bool(const std::vector<int>&)>& fails) {
  std::map<std::vector<int>, bool> tried;
  auto test = [&](const std::vector<int>& subset) {
    auto it = tried.find(subset);
    if (it != tried.end()) return it->second;
    return tried[subset] = fails(subset);
  };
  size_t n = 2;
  while (items.size() >= 2) {
    std::vector<std::vector<int>> chunks;
    const size_t size = items.size();
    for (size_t c = 0; c < n; ++c) {
      std::vector<int> chunk(items.begin() + size * c / n, items.begin() + size * (c + 1) / n);
      if (!chunk.empty()) chunks.push_back(std::move(chunk));
    }
    bool reduced = false;
    for (const auto& chunk : chunks) {
      if (test(chunk)) {
        items = chunk;
        n = 2;
        reduced = true;
        break;
      }
    }
    for (size_t c = 0; !reduced && chunks.size() > 2 && c < chunks.size(); ++c) {
      std::vector<int> rest;
      for (size_t d = 0; d < chunks.size(); ++d) {
        if (d != c) rest.insert(rest.end(), chunks[d].begin(), chunks[d].end());
      }
      if (test(rest)) {
        items = std::move(rest);
        n = std::max<size_t>(n - 1, 2);
        reduced = true;
      }
    }
    if (reduced) continue;
    if (n >= items.size()) break;
    n = std::min(items.size(), 2 * n);
  }
  return items;
}

std::string FailureSignature(absl::StatusCode code, absl::string_view message) {
  message = message.substr(0, message.find('\n'));
  std::string out = absl::StrCat(absl::StatusCodeToString(code), ": ");
  bool quoted = false;
  for (size_t i = 0; i < message.size(); ++i) {
    const char c = message[i];
    if (c == '\'') {
      quoted = !quoted;
      out += c;
      if (quoted) out += '?';
      continue;
    }
    if (quoted) continue;
    if (absl::ascii_isdigit(c)) {
      if (out.empty() || out.back() != '#') out += '#';
      continue;
    }
    out += c;
  }
  return out;
}

absl::StatusOr<Minified> MinifyCompileError(const CompileFn& compile, v1::CompileRequest request,
                                            const std::string& after) {
  if (after != "graph" && after != "aot") {
    return absl::InvalidArgumentError(
        absl::StrCat("--after: '", after, "' is neither graph nor aot"));
  }
  request.set_bypass_cache(true);
  request.clear_guards();
  request.clear_signature();
  Minified m;
  m.stage = "graph";
  auto original = compile(request);
  ++m.compiles;
  if (original.ok()) {
    return absl::FailedPreconditionError(
        "the graph compiles with these options: there is no compile error to minify");
  }
  const std::string target =
      FailureSignature(original.status().code(), original.status().message());

  if (after == "aot") {
    v1::CompileRequest split = request;
    split.mutable_options()->set_backend("aot_eager");
    auto halves = compile(split);
    ++m.compiles;
    if (!halves.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the graph fails before its forward/backward split: ", halves.status().message()));
    }
    bool found = false;
    for (const auto& [stage, graph] :
         {std::pair{"forward", &halves->artifact().autograd().forward()},
          std::pair{"backward", &halves->artifact().autograd().backward()}}) {
      v1::CompileRequest half = request;
      *half.mutable_graph() = WithoutRequiresGrad(*graph);
      auto st = compile(half);
      ++m.compiles;
      if (!st.ok() && FailureSignature(st.status().code(), st.status().message()) == target) {
        request = std::move(half);
        m.stage = stage;
        found = true;
        break;
      }
    }
    if (!found) {
      return absl::FailedPreconditionError(
          absl::StrCat("neither the forward nor the backward graph fails as the graph does: ",
                       original.status().message()));
    }
  }

  // Nodes in topological order, as kilnd reads them.
  ASSIGN_OR_RETURN(ir::Graph parsed, ir::Graph::FromProto(request.graph()));
  const v1::Graph graph = parsed.ToProto();
  m.nodes_before = graph.nodes_size();
  std::vector<int> all(graph.nodes_size());
  for (int i = 0; i < graph.nodes_size(); ++i) all[i] = i;
  absl::Status last = original.status();
  auto fails = [&](const std::vector<int>& keep) {
    v1::CompileRequest candidate = request;
    *candidate.mutable_graph() = Subgraph(graph, keep);
    auto st = compile(candidate);
    ++m.compiles;
    return !st.ok() && FailureSignature(st.status().code(), st.status().message()) == target;
  };
  const std::vector<int> smallest = DeltaDebug(all, fails);
  m.request = request;
  *m.request.mutable_graph() = Subgraph(graph, smallest);
  auto final_try = compile(m.request);
  ++m.compiles;
  m.error = final_try.ok() ? last : final_try.status();
  return m;
}

absl::StatusOr<std::vector<std::string>> WriteRepro(const std::string& dir, const Minified& m,
                                                    const std::string& server) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  }
  v1::GraphFile file;
  *file.mutable_graph() = m.request.graph();
  *file.mutable_options() = m.request.options();
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  if (!google::protobuf::util::MessageToJsonString(file, &json, options).ok()) {
    return absl::InternalError("the minified graph does not print as JSON");
  }
  const std::string expected = absl::StrCat(absl::StatusCodeToString(m.error.code()), ": ",
                                            m.error.message().substr(0, 2000));
  const std::string script = absl::StrReplaceAll(
      kReproScript, {{"@SERVER@", server}, {"@EXPECTED@", PythonString(expected)}});
  std::vector<std::string> written;
  const std::pair<const char*, const std::string*> files[] = {{"minified.json", &json},
                                                              {"repro.py", &script}};
  for (const auto& [name, text] : files) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    std::ofstream out(path);
    out << *text;
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
    written.push_back(path);
  }
  return written;
}

}  // namespace kiln
