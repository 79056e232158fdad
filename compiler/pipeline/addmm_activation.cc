#include "compiler/pipeline/addmm_activation.h"

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/status_macros.h"
#include "compiler/ir/builder.h"
#include "compiler/ops/registry.h"
#include "compiler/pipeline/rewrite_util.h"

namespace kiln::pipeline {
namespace {

constexpr char kAddmm[] = "aten.addmm.default";
constexpr char kActivation[] = "aten._addmm_activation.default";

// Whether `n` is a tanh GELU.
bool IsTanhGelu(const ir::Graph& g, const ir::Node& n) {
  if (n.outputs.size() != 1 || n.target != "aten.gelu.default") return false;
  absl::StatusOr<ops::OpCall> call = BindNode(g, n);
  if (!call.ok()) return false;
  const ir::Argument* a = call->Find("approximate");
  const std::string* approx = a ? std::get_if<std::string>(&a->kind) : nullptr;
  return approx != nullptr && *approx == "tanh";
}

// An addmm whose epilogue cuBLASLt can run.
bool Epilogued(const ir::Graph& g, const ir::Node& n) {
  if (n.target != kAddmm || n.outputs.size() != 1) return false;
  const ir::TensorMeta& m = g.value(n.outputs[0]).meta;
  // 16-bit only: for float32, cuBLASLt runs the GELU epilogue as a kernel
  // of its own after the GEMM (cublasLt::epilogue::impl::globalKernel, 25 us
  // for GPT-2's [4096, 3072] on an H200), slower than the fused pointwise
  // kernel it replaces.
  if (m.device_type != "cuda" || (m.dtype != v1::FLOAT16 && m.dtype != v1::BFLOAT16)) {
    return false;
  }
  absl::StatusOr<ops::OpCall> call = BindNode(g, n);
  if (!call.ok() || !IsOneOrAbsent(*call, "beta") || !IsOneOrAbsent(*call, "alpha")) return false;
  absl::StatusOr<const ir::TensorMeta*> bias = call->Meta("self");
  return bias.ok() && (*bias)->dtype == m.dtype && (*bias)->sizes.size() == 1 &&
         (*bias)->sizes[0] == m.sizes.back();
}

struct Match {
  int addmm = -1;
  int view = -1;  // -1: the GELU reads the product itself
};

}  // namespace

absl::StatusOr<int> FuseAddmmActivations(const ir::Graph& g, ir::Graph* out) {
  const int nodes = static_cast<int>(g.nodes().size());
  std::vector<int> readers(g.values().size(), 0);
  for (const ir::Node& n : g.nodes()) {
    for (ir::ValueId v : ir::Graph::Operands(n)) {
      if (v != ir::kNoValue) ++readers[v];
    }
  }
  for (ir::ValueId v : g.outputs()) ++readers[v];  // an output is read by the caller
  // Whether a value has exactly one reader, a node, and is no output.
  auto only_read = [&](ir::ValueId v) { return readers[v] == 1; };

  std::vector<Match> matches;       // by activation node
  std::vector<int> role(nodes, 0);  // 1: a matched addmm, 2: its view, 3: the activation
  for (int i = 0; i < nodes; ++i) {
    const ir::Node& act = g.nodes()[i];
    if (!IsTanhGelu(g, act)) continue;
    const ir::ValueId in = ir::Graph::Operands(act)[0];
    Match m;
    int producer = g.value(in).producer;
    if (producer < 0 || !only_read(in)) continue;
    if (g.nodes()[producer].target == "aten.view.default") {
      const ir::ValueId viewed = ir::Graph::Operands(g.nodes()[producer])[0];
      m.view = producer;
      producer = g.value(viewed).producer;
      if (producer < 0 || !only_read(viewed)) continue;
    }
    if (!Epilogued(g, g.nodes()[producer])) continue;
    if (g.value(act.outputs[0]).meta.dtype != g.value(in).meta.dtype) continue;
    m.addmm = producer;
    role[m.addmm] = 1;
    if (m.view >= 0) role[m.view] = 2;
    role[i] = 3;
    matches.push_back(m);
  }
  if (matches.empty()) return 0;

  ir::GraphBuilder b(g.name());
  std::vector<ir::ValueId> map = b.CopyInputs(g);
  std::vector<int> match_of(nodes, -1);  // addmm and view node -> index into matches
  std::vector<int> activation_of(nodes, -1);
  for (int i = 0, k = 0; i < nodes; ++i) {
    if (role[i] != 3) continue;
    match_of[matches[k].addmm] = k;
    if (matches[k].view >= 0) match_of[matches[k].view] = k;
    activation_of[matches[k].addmm] = i;
    if (matches[k].view >= 0) activation_of[matches[k].view] = i;
    ++k;
  }
  for (int i = 0; i < nodes; ++i) {
    const ir::Node& n = g.nodes()[i];
    if (role[i] == 3) continue;  // the epilogue computed it
    if (role[i] == 0) {
      b.CopyNode(g, n, &map);
      continue;
    }
    const Match& m = matches[match_of[i]];
    // The value that ends the match takes the activation's name and
    // metadata, so that what reads it by name (the plan's outputs, the
    // trace) reads the same value.
    const ir::Value& activated = g.value(g.nodes()[activation_of[i]].outputs[0]);
    const bool last = role[i] == 2 || m.view < 0;
    const ir::Value& named = last ? activated : g.value(n.outputs[0]);
    ir::ValueId result;
    if (role[i] == 1) {
      std::vector<ir::Argument> kwargs = ir::MapArguments(n.kwargs, map);
      kwargs.push_back(ir::Kwarg("use_gelu", ir::Bool(true)));
      result =
          b.AddNode(kActivation, ir::MapArguments(n.args, map), std::move(kwargs), {named.meta},
                    last ? g.nodes()[activation_of[i]].name : n.name, {named.name})[0];
    } else {
      result = b.AddNode(n.target, ir::MapArguments(n.args, map), ir::MapArguments(n.kwargs, map),
                         {named.meta}, g.nodes()[activation_of[i]].name, {named.name})[0];
    }
    map[n.outputs[0]] = result;
    if (last) map[g.nodes()[activation_of[i]].outputs[0]] = result;
  }
  for (ir::ValueId id : g.outputs()) b.AddOutput(map[id]);
  *out = std::move(b).Build();  // the last use of `g`, which may be *out
  return static_cast<int>(matches.size());
}

}  // namespace kiln::pipeline
