#include "cache/shape_family.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/hashing.h"
#include "common/status_macros.h"
#include "compiler/ir/canonical.h"
#include "compiler/ir/sym_expr.h"

namespace kiln::cache {

using ir::Bindings;
using ir::SymExpr;

namespace {

// Calls f(v1::SymInt*) on every integer of the graph, in a fixed order: the
// inputs' metadata, then per node its arguments, keyword arguments and
// outputs' metadata. The graph's integer arguments must be SymInts
// (positional form).
template <typename F>
void ForEachInt(v1::Graph* g, F&& f) {
  auto meta = [&f](v1::TensorMeta* m) {
    for (v1::SymInt& s : *m->mutable_sizes()) f(&s);
    for (v1::SymInt& s : *m->mutable_strides()) f(&s);
    f(m->mutable_storage_offset());
  };
  auto argument = [&f](v1::Argument* a) {
    if (a->has_sym_int()) f(a->mutable_sym_int());
    if (a->has_sym_ints()) {
      for (v1::SymInt& s : *a->mutable_sym_ints()->mutable_values()) f(&s);
    }
  };
  for (v1::Placeholder& ph : *g->mutable_inputs()) meta(ph.mutable_value()->mutable_meta());
  for (v1::Node& n : *g->mutable_nodes()) {
    for (v1::Argument& a : *n.mutable_args()) argument(&a);
    for (v1::Argument& a : *n.mutable_kwargs()) argument(&a);
    for (v1::Value& v : *n.mutable_outputs()) meta(v.mutable_meta());
  }
}

std::vector<v1::SymInt> Ints(v1::Graph g) {
  std::vector<v1::SymInt> out;
  ForEachInt(&g, [&out](v1::SymInt* s) { out.push_back(*s); });
  return out;
}

std::string Erased(v1::Graph g) {
  ForEachInt(&g, [](v1::SymInt* s) { s->Clear(); });
  return ir::DeterministicBytes(g);
}

std::string Describe(const v1::Graph& g, int input, int dim) {
  return absl::StrCat("input ", input, " '", g.inputs(input).value().name(), "' size[", dim, "]");
}

// The text of coeff*product(factors) + constant in the compiler's canonical
// form (compiler/ops/shape_util.h): the coefficient first and omitted when 1,
// factors sorted, the constant last.
std::string Affine(int64_t coeff, std::vector<std::string> factors, int64_t constant) {
  std::sort(factors.begin(), factors.end());
  std::string text = coeff == 1 ? "" : absl::StrCat(coeff, "*");
  for (size_t i = 0; i < factors.size(); ++i) absl::StrAppend(&text, i ? "*" : "", factors[i]);
  if (constant > 0) absl::StrAppend(&text, " + ", constant);
  if (constant < 0) absl::StrAppend(&text, " - ", -constant);
  return text;
}

struct Symbol {
  std::string name;
  int64_t a, b;  // its value in each graph
};

// k * (the product of `factors`' values in each graph) when that is `a` and
// `b` for some integer k >= 1.
std::optional<std::string> Product(int64_t a, int64_t b,
                                   const std::vector<const Symbol*>& factors) {
  int64_t pa = 1, pb = 1;
  std::vector<std::string> names;
  for (const Symbol* f : factors) {
    if (__builtin_mul_overflow(pa, f->a, &pa) || __builtin_mul_overflow(pb, f->b, &pb)) {
      return std::nullopt;
    }
    names.push_back(f->name);
  }
  int64_t kb;
  if (pa == 0 || a % pa != 0 || a / pa < 1 || __builtin_mul_overflow(a / pa, pb, &kb) || kb != b) {
    return std::nullopt;
  }
  return Affine(a / pa, std::move(names), 0);
}

// An expression of the symbols that is `a` in the first graph and `b` in the
// second, or nullopt. The structural forms come first, as sizes and strides
// are built from sizes: s, k*s, k*s*t, k*s*t*u (a stride of a 4-d tensor, a
// flattened batch; factors may repeat), then s + t + c, then k*s + c. Two
// sample points fit many expressions: an affine one fits almost any pair, so
// it is the last resort (CheckInstance still decides what a later graph is).
std::optional<std::string> Fit(int64_t a, int64_t b, const std::vector<Symbol>& symbols) {
  for (const Symbol& s : symbols) {
    if (a == s.a && b == s.b) return s.name;
  }
  const size_t n = symbols.size();
  for (size_t i = 0; i < n; ++i) {  // k*s
    if (auto e = Product(a, b, {&symbols[i]})) return e;
  }
  for (size_t i = 0; i < n; ++i) {  // k*s*t
    for (size_t j = i; j < n; ++j) {
      if (auto e = Product(a, b, {&symbols[i], &symbols[j]})) return e;
    }
  }
  for (size_t i = 0; i < n; ++i) {  // k*s*t*u
    for (size_t j = i; j < n; ++j) {
      for (size_t l = j; l < n; ++l) {
        if (auto e = Product(a, b, {&symbols[i], &symbols[j], &symbols[l]})) return e;
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {  // s + t + c
    for (size_t j = i + 1; j < n; ++j) {
      const Symbol &s = symbols[i], &t = symbols[j];
      const int64_t c = a - s.a - t.a;
      if (b - s.b - t.b != c) continue;
      return absl::StrCat(Affine(1, {s.name}, 0), " + ", Affine(1, {t.name}, c));
    }
  }
  for (const Symbol& s : symbols) {  // k*s + c, k >= 1
    const int64_t da = s.b - s.a, dv = b - a;
    if (dv % da != 0 || dv / da < 1) continue;
    const int64_t k = dv / da;
    int64_t ka;
    if (__builtin_mul_overflow(k, s.a, &ka)) continue;
    return Affine(k, {s.name}, a - ka);
  }
  return std::nullopt;
}

}  // namespace

v1::Graph PositionalForm(const v1::Graph& graph) {
  v1::Graph g = graph;
  g.clear_name();
  std::map<std::string, std::string> rename;
  for (int i = 0; i < g.inputs_size(); ++i) {
    v1::Value* v = g.mutable_inputs(i)->mutable_value();
    rename[v->name()] = absl::StrCat("arg", i);
    v->set_name(rename[v->name()]);
  }
  int next = 0;
  for (int j = 0; j < g.nodes_size(); ++j) {
    v1::Node* n = g.mutable_nodes(j);
    n->set_name(absl::StrCat("n", j));
    for (v1::Value& v : *n->mutable_outputs()) {
      rename[v.name()] = absl::StrCat("v", next++);
      v.set_name(rename[v.name()]);
    }
  }
  auto renamed = [&rename](const std::string& name) {
    auto it = rename.find(name);
    return it == rename.end() ? name : it->second;
  };
  auto argument = [&](v1::Argument* a) {
    switch (a->kind_case()) {
      case v1::Argument::kTensor:
        a->set_tensor(renamed(a->tensor()));
        break;
      case v1::Argument::kTensors:
        for (std::string& name : *a->mutable_tensors()->mutable_names()) {
          if (!name.empty()) name = renamed(name);
        }
        break;
      case v1::Argument::kIntValue: {
        const int64_t v = a->int_value();
        a->mutable_sym_int()->set_int_value(v);
        break;
      }
      case v1::Argument::kInts: {
        const v1::IntList ints = a->ints();
        v1::SymIntList* out = a->mutable_sym_ints();
        for (int64_t v : ints.values()) out->add_values()->set_int_value(v);
        break;
      }
      default:
        break;
    }
  };
  for (v1::Node& n : *g.mutable_nodes()) {
    for (v1::Argument& a : *n.mutable_args()) argument(&a);
    for (v1::Argument& a : *n.mutable_kwargs()) argument(&a);
  }
  for (std::string& out : *g.mutable_outputs()) out = renamed(out);
  return g;
}

std::string ShapeFamily(const v1::Graph& positional, absl::string_view salt) {
  Sha256 h;
  h.Update(Erased(positional));
  h.Update(salt);
  return h.HexDigest();
}

bool IsStatic(const v1::Graph& graph) {
  for (const v1::SymInt& s : Ints(PositionalForm(graph))) {
    if (s.value_case() == v1::SymInt::kExpr) return false;
  }
  return true;
}

absl::StatusOr<Generalized> Generalize(const v1::Graph& a, const v1::Graph& b) {
  auto refuse = [](auto&&... why) {
    return absl::FailedPreconditionError(absl::StrCat("no generalization: ", why...));
  };
  if (Erased(a) != Erased(b)) return refuse("the graphs differ in more than their integers");
  Generalized out;
  std::vector<Symbol> symbols;
  for (int i = 0; i < a.inputs_size(); ++i) {
    const v1::TensorMeta &ma = a.inputs(i).value().meta(), &mb = b.inputs(i).value().meta();
    for (int d = 0; d < ma.sizes_size(); ++d) {
      const v1::SymInt &sa = ma.sizes(d), &sb = mb.sizes(d);
      if (sa.has_expr() || sb.has_expr()) return refuse(Describe(a, i, d), " is symbolic");
      if (sa.int_value() == sb.int_value()) continue;
      if (sa.int_value() < 2 || sb.int_value() < 2) {
        return refuse(Describe(a, i, d), " is ", sa.int_value(), " and ", sb.int_value(),
                      ": sizes 0 and 1 are specialized");
      }
      auto same = std::find_if(symbols.begin(), symbols.end(), [&](const Symbol& s) {
        return s.a == sa.int_value() && s.b == sb.int_value();
      });
      if (same != symbols.end()) {
        out.dims[same - symbols.begin()].emplace_back(i, d);
        continue;
      }
      symbols.push_back({absl::StrCat("s", symbols.size()), sa.int_value(), sb.int_value()});
      out.symbols.push_back(symbols.back().name);
      out.dims.push_back({{i, d}});
    }
  }
  if (symbols.empty()) return refuse("no input size differs");

  const std::vector<v1::SymInt> ia = Ints(a), ib = Ints(b);
  out.graph = b;
  size_t k = 0;
  absl::Status status;
  ForEachInt(&out.graph, [&](v1::SymInt* slot) {
    const v1::SymInt &x = ia[k], &y = ib[k];
    ++k;
    if (!status.ok() || (x.has_int_value() && y.has_int_value() && x.int_value() == y.int_value()))
      return;
    if (x.has_expr() || y.has_expr()) {
      status = refuse("integer ", k - 1, " is symbolic");
      return;
    }
    std::optional<std::string> e = Fit(x.int_value(), y.int_value(), symbols);
    if (!e.has_value()) {
      status = refuse("integer ", k - 1, " is ", x.int_value(), " and ", y.int_value(),
                      ", which no expression of the input sizes fits");
      return;
    }
    slot->set_expr(*e);
  });
  RETURN_IF_ERROR(status);
  return out;
}

absl::Status CheckInstance(const v1::Graph& general, const v1::Graph& concrete) {
  auto refuse = [](auto&&... why) {
    return absl::FailedPreconditionError(absl::StrCat("not an instance: ", why...));
  };
  if (Erased(general) != Erased(concrete)) return refuse("the graphs differ in more than integers");
  const std::vector<v1::SymInt> ig = Ints(general), ic = Ints(concrete);
  Bindings bindings;
  // Bind the symbols that are whole input sizes.
  for (int i = 0; i < general.inputs_size(); ++i) {
    const v1::TensorMeta &mg = general.inputs(i).value().meta(),
                         &mc = concrete.inputs(i).value().meta();
    for (int d = 0; d < mg.sizes_size(); ++d) {
      const v1::SymInt &g = mg.sizes(d), &c = mc.sizes(d);
      if (!g.has_expr() || c.has_expr()) continue;
      auto parsed = SymExpr::Parse(g.expr());
      if (!parsed.ok() || parsed->symbols().size() != 1 || parsed->symbols()[0] != g.expr()) {
        continue;
      }
      auto [it, fresh] = bindings.emplace(g.expr(), c.int_value());
      if (!fresh && it->second != c.int_value()) {
        return refuse(Describe(concrete, i, d), " is ", c.int_value(), " where ", g.expr(), " is ",
                      it->second);
      }
    }
  }
  for (size_t k = 0; k < ig.size(); ++k) {
    const v1::SymInt &g = ig[k], &c = ic[k];
    if (c.has_expr()) return refuse("integer ", k, " of the graph is symbolic");
    int64_t want;
    if (g.has_expr()) {
      auto parsed = SymExpr::Parse(g.expr());
      if (!parsed.ok()) return refuse("integer ", k, ": ", parsed.status().message());
      auto value = parsed->Evaluate(bindings);
      if (!value.ok()) return refuse("integer ", k, ": ", value.status().message());
      want = *value;
    } else {
      want = g.int_value();
    }
    if (want != c.int_value()) {
      return refuse("integer ", k, " is ", c.int_value(), " where the general graph gives ", want);
    }
  }
  return absl::OkStatus();
}

v1::GuardSet GeneralizeGuards(const v1::GuardSet& guards, const Generalized& g) {
  v1::GuardSet out = guards;
  for (int i = 0; i < out.tensors_size() && i < g.graph.inputs_size(); ++i) {
    v1::TensorGuard* t = out.mutable_tensors(i);
    const v1::TensorMeta& m = g.graph.inputs(i).value().meta();
    if (t->sizes_size() == m.sizes_size()) *t->mutable_sizes() = m.sizes();
    if (t->stride_check() == v1::TensorGuard::EXACT && t->strides_size() == m.strides_size()) {
      *t->mutable_strides() = m.strides();
    }
  }
  for (const std::string& s : g.symbols) out.add_shape_guards(absl::StrCat(s, " >= 2"));
  return out;
}

v1::Graph ConstantsAsInts(v1::Graph graph) {
  auto argument = [](v1::Argument* a) {
    if (a->has_sym_int() && a->sym_int().has_int_value()) {
      a->set_int_value(a->sym_int().int_value());
    } else if (a->has_sym_ints()) {
      v1::IntList ints;
      for (const v1::SymInt& s : a->sym_ints().values()) {
        if (!s.has_int_value()) return;
        ints.add_values(s.int_value());
      }
      *a->mutable_ints() = std::move(ints);
    }
  };
  for (v1::Node& n : *graph.mutable_nodes()) {
    for (v1::Argument& a : *n.mutable_args()) argument(&a);
    for (v1::Argument& a : *n.mutable_kwargs()) argument(&a);
  }
  return graph;
}

}  // namespace kiln::cache
