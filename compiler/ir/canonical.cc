#include "compiler/ir/canonical.h"

#include <algorithm>
#include <queue>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/hashing.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace kiln::ir {
namespace {

// Structural hashes, one per value.
std::vector<std::string> ValueHashes(const Graph& g) {
  std::vector<std::string> h(g.values().size());
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    Sha256 s;
    s.Update("input").Update(std::to_string(i)).Update(std::to_string(g.inputs()[i].kind));
    h[g.inputs()[i].value] = s.HexDigest();
  }
  for (const Node& node : g.nodes()) {
    Sha256 s;
    s.Update("node").Update(node.target);
    // The node's own serialized arguments, with operand names replaced by
    // operand hashes.
    auto hash_args = [&](const std::vector<Argument>& args, bool sort) {
      std::vector<std::pair<std::string, std::string>> enc;
      for (const Argument& a : args) {
        std::string e;
        if (const auto* id = std::get_if<ValueId>(&a.kind)) {
          e = absl::StrCat("T:", h[*id]);
        } else if (const auto* ids = std::get_if<std::vector<ValueId>>(&a.kind)) {
          e = "L:";
          for (ValueId id : *ids) absl::StrAppend(&e, id == kNoValue ? "-" : h[id], ",");
        } else {
          e = absl::StrCat("C:", a.kind.index(), ":");
          std::visit(
              [&](const auto& k) {
                using T = std::decay_t<decltype(k)>;
                if constexpr (std::is_same_v<T, None>) {
                } else if constexpr (std::is_same_v<T, std::string>) {
                  absl::StrAppend(&e, k.size(), ":", k);
                } else if constexpr (std::is_same_v<T, double>) {
                  absl::StrAppend(&e, absl::StrFormat("%a", k));
                } else if constexpr (std::is_same_v<T, std::vector<double>>) {
                  for (double x : k) absl::StrAppend(&e, absl::StrFormat("%a", x), ",");
                } else if constexpr (std::is_same_v<T, std::vector<int64_t>> ||
                                     std::is_same_v<T, std::vector<bool>>) {
                  for (auto x : k) absl::StrAppend(&e, static_cast<int64_t>(x), ",");
                } else if constexpr (std::is_same_v<T, SymInt>) {
                  absl::StrAppend(&e, k.is_constant() ? "i" : "e", k.ToString());
                } else if constexpr (std::is_same_v<T, std::vector<SymInt>>) {
                  for (const auto& x : k)
                    absl::StrAppend(&e, x.is_constant() ? "i" : "e", x.ToString(), ",");
                } else if constexpr (std::is_same_v<T, Device>) {
                  absl::StrAppend(&e, k.type, ":", k.index);
                } else if constexpr (std::is_same_v<T, ValueId> ||
                                     std::is_same_v<T, std::vector<ValueId>>) {
                } else {
                  absl::StrAppend(&e, static_cast<int64_t>(k));
                }
              },
              a.kind);
        }
        enc.emplace_back(a.name, std::move(e));
      }
      if (sort) std::sort(enc.begin(), enc.end());
      for (const auto& [name, e] : enc) s.Update(name).Update(e);
    };
    hash_args(node.args, false);
    s.Update("kw");
    hash_args(node.kwargs, true);
    // Output metadata is part of the node's identity.
    for (ValueId id : node.outputs) {
      const TensorMeta& m = g.value(id).meta;
      std::string e = absl::StrCat(m.dtype, "|", m.device_type, ":", m.device_index, "|",
                                   m.requires_grad, "|", m.storage_offset.ToString(), "|");
      for (const auto& x : m.sizes) absl::StrAppend(&e, x.ToString(), ",");
      absl::StrAppend(&e, "|");
      for (const auto& x : m.strides) absl::StrAppend(&e, x.ToString(), ",");
      s.Update(e);
    }
    const std::string node_hash = s.HexDigest();
    for (size_t j = 0; j < node.outputs.size(); ++j) {
      h[node.outputs[j]] = absl::StrCat(node_hash, "/", j);
    }
  }
  return h;
}

}  // namespace

bool IsRandomTarget(absl::string_view target) {
  for (absl::string_view op :
       {"dropout", "bernoulli", "aten.rand", "normal", "uniform", "multinomial", "exponential",
        "geometric", "cauchy", "log_normal", "random_"}) {
    if (absl::StrContains(target, op)) return true;
  }
  return false;
}

std::string DeterministicBytes(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::io::StringOutputStream sos(&out);
  google::protobuf::io::CodedOutputStream cos(&sos);
  cos.SetSerializationDeterministic(true);
  message.SerializeToCodedStream(&cos);
  cos.Trim();
  return out;
}

v1::Graph Canonicalize(const Graph& g) {
  v1::Graph c;
  Canonicalize(g, &c);
  return c;
}

void Canonicalize(const Graph& g, v1::Graph* out) {
  const std::vector<std::string> hashes = ValueHashes(g);
  const int n = static_cast<int>(g.nodes().size());

  // Kahn's algorithm over node indices, smallest structural hash first.
  std::vector<std::vector<int>> users(n);
  std::vector<int> pending(n, 0);
  for (int i = 0; i < n; ++i) {
    for (ValueId id : Graph::Operands(g.nodes()[i])) {
      int p = g.value(id).producer;
      if (p < 0) continue;
      users[p].push_back(i);
      ++pending[i];
    }
  }
  // Random ops draw from one generator in program order: each one follows
  // the previous, so reordering them changes the key (and never the masks).
  for (int i = 0, last = -1; i < n; ++i) {
    if (!IsRandomTarget(g.nodes()[i].target)) continue;
    if (last >= 0) {
      users[last].push_back(i);
      ++pending[i];
    }
    last = i;
  }
  // A node's up-hash describes what it computes; its down-hash adds how its
  // results are used (by whom, at which argument, which graph outputs), so
  // two identical nodes feeding different consumers are still told apart.
  std::vector<std::string> down(n);
  {
    std::vector<std::vector<std::string>> uses(g.values().size());
    for (size_t k = 0; k < g.outputs().size(); ++k) {
      uses[g.outputs()[k]].push_back(absl::StrCat("out", k));
    }
    for (int i = n - 1; i >= 0; --i) {
      const Node& node = g.nodes()[i];
      Sha256 s;
      s.Update(node.outputs.empty() ? "" : hashes[node.outputs[0]]);
      for (ValueId v : node.outputs) {
        std::sort(uses[v].begin(), uses[v].end());
        s.Update(std::to_string(uses[v].size()));
        for (const std::string& u : uses[v]) s.Update(u);
      }
      down[i] = s.HexDigest();
      const std::vector<ValueId> operands = Graph::Operands(node);
      for (size_t k = 0; k < operands.size(); ++k) {
        uses[operands[k]].push_back(absl::StrCat(down[i], "@", k));
      }
    }
  }
  auto later = [&](int a, int b) { return down[a] != down[b] ? down[a] > down[b] : a > b; };
  std::priority_queue<int, std::vector<int>, decltype(later)> ready(later);
  for (int i = 0; i < n; ++i) {
    if (pending[i] == 0) ready.push(i);
  }
  std::vector<int> order;
  while (!ready.empty()) {
    int i = ready.top();
    ready.pop();
    order.push_back(i);
    for (int u : users[i]) {
      if (--pending[u] == 0) ready.push(u);
    }
  }

  std::vector<std::string> names(g.values().size());
  for (size_t i = 0; i < g.inputs().size(); ++i)
    names[g.inputs()[i].value] = absl::StrCat("arg", i);
  int next = 0;
  for (int i : order) {
    for (ValueId id : g.nodes()[i].outputs) names[id] = absl::StrCat("v", next++);
  }

  // The wire form on the output's arena; its nodes are moved out in order.
  v1::Graph* p = google::protobuf::Arena::CreateMessage<v1::Graph>(out->GetArena());
  g.ToProto(p);
  v1::Graph& c = *out;
  c.Clear();
  c.mutable_inputs()->Swap(p->mutable_inputs());
  for (int i = 0; i < c.inputs_size(); ++i) {
    c.mutable_inputs(i)->mutable_value()->set_name(names[g.inputs()[i].value]);
  }
  int k = 0;
  for (int i : order) {
    const Node& node = g.nodes()[i];
    v1::Node& cn = *c.add_nodes();
    cn.Swap(p->mutable_nodes(i));
    cn.set_name(absl::StrCat("n", k++));
    // Rewrite operand names in argument order.
    auto fix = [&](v1::Argument* pa, const Argument& a) {
      if (const auto* id = std::get_if<ValueId>(&a.kind)) pa->set_tensor(names[*id]);
      if (const auto* ids = std::get_if<std::vector<ValueId>>(&a.kind)) {
        for (size_t j = 0; j < ids->size(); ++j) {
          pa->mutable_tensors()->set_names(j, (*ids)[j] == kNoValue ? "" : names[(*ids)[j]]);
        }
      }
    };
    for (size_t j = 0; j < node.args.size(); ++j) fix(cn.mutable_args(j), node.args[j]);
    for (size_t j = 0; j < node.kwargs.size(); ++j) fix(cn.mutable_kwargs(j), node.kwargs[j]);
    std::sort(cn.mutable_kwargs()->begin(), cn.mutable_kwargs()->end(),
              [](const v1::Argument& a, const v1::Argument& b) { return a.name() < b.name(); });
    for (size_t j = 0; j < node.outputs.size(); ++j) {
      cn.mutable_outputs(j)->set_name(names[node.outputs[j]]);
    }
  }
  for (ValueId id : g.outputs()) c.add_outputs(names[id]);
  if (p->GetArena() == nullptr) delete p;
}

std::string CanonicalBytes(const Graph& graph) {
  google::protobuf::Arena arena;
  v1::Graph* c = google::protobuf::Arena::CreateMessage<v1::Graph>(&arena);
  Canonicalize(graph, c);
  return DeterministicBytes(*c);
}

v1::CompileOptions NormalizeOptions(const v1::CompileOptions& options, const Graph* graph) {
  v1::CompileOptions o = options;
  if (o.backend().empty()) o.set_backend("eager");
  if (o.backend() == "kiln" && o.target().device_type().empty() && graph != nullptr) {
    for (const Input& in : graph->inputs()) {
      if (graph->value(in.value).meta.device_type == "cuda") {
        o.mutable_target()->set_device_type("cuda");
        break;
      }
    }
  }
  // Generated CPU code is compiled for a named ISA, never for whatever the
  // compiling machine happens to be: the key must say what the code needs.
  if (o.backend() == "kiln") {
    if (o.target().device_type().empty()) o.mutable_target()->set_device_type("cpu");
    if (o.target().device_type() == "cpu" && o.target().cpu_isa().empty()) {
      o.mutable_target()->set_cpu_isa(kDefaultCpuIsa);
    }
    if (o.target().device_type() == "cuda") {
      if (o.target().sm_arch().empty()) o.mutable_target()->set_sm_arch(kDefaultSmArch);
      if (o.target().cuda_version().empty()) {
        o.mutable_target()->set_cuda_version(kDefaultCudaVersion);
      }
    }
  }
  std::sort(o.mutable_options()->begin(), o.mutable_options()->end(),
            [](const auto& a, const auto& b) {
              return a.name() != b.name() ? a.name() < b.name() : a.value() < b.value();
            });
  return o;
}

std::string CacheKey(const Graph& graph, const v1::CompileOptions& options,
                     const std::string& compiler_version) {
  const v1::CompileOptions o = NormalizeOptions(options, &graph);
  Sha256 s;
  s.Update("kiln-cache-key-v1");
  s.Update(CanonicalBytes(graph));
  s.Update(o.backend());
  s.Update(DeterministicBytes(o.target()));
  for (const auto& opt : o.options()) s.Update(opt.name()).Update(opt.value());
  s.Update(compiler_version);
  return s.HexDigest();
}

}  // namespace kiln::ir
