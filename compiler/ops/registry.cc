#include "compiler/ops/registry.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "compiler/ir/printer.h"

namespace kiln::ops {

// Defined in shape_rules.cc and derivatives.cc.
void RegisterShapeRules(Registry* registry);
void RegisterDerivatives(Registry* registry);

namespace {

// A schema default ("1", "None", "[]", "[0, 1]", "True", "1e-05", "'none'")
// as an argument.
ir::Argument DefaultArgument(const ir::SchemaParam& p) {
  ir::Argument a;
  a.name = p.name;
  const std::string& d = *p.default_value;
  int64_t i;
  double f;
  if (d == "None") {
    a.kind = ir::None{};
  } else if (d == "True" || d == "False") {
    a.kind = d == "True";
  } else if (absl::SimpleAtoi(d, &i)) {
    if (p.type.is_list) {
      a.kind = std::vector<int64_t>(std::max(1, p.type.list_size), i);
    } else if (p.type.base == ir::SchemaType::Base::kFloat) {
      a.kind = static_cast<double>(i);
    } else {
      a.kind = i;
    }
  } else if (absl::SimpleAtod(d, &f)) {
    a.kind = f;
  } else if (absl::StartsWith(d, "[")) {
    std::vector<int64_t> v;
    for (absl::string_view part : absl::StrSplit(absl::StripPrefix(absl::StripSuffix(d, "]"), "["),
                                                 ',', absl::SkipWhitespace())) {
      int64_t x = 0;
      (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &x);
      v.push_back(x);
    }
    a.kind = std::move(v);
  } else {
    std::string s(d);
    if (s.size() >= 2 && (s.front() == '\'' || s.front() == '"')) s = s.substr(1, s.size() - 2);
    a.kind = std::move(s);
  }
  return a;
}

}  // namespace

absl::StatusOr<OpCall> OpCall::Bind(const std::string& target,
                                    const std::vector<ir::Argument>& args,
                                    const std::vector<ir::Argument>& kwargs,
                                    std::function<const ir::TensorMeta&(ir::ValueId)> meta_of) {
  OpCall call;
  call.target_ = target;
  call.meta_of_ = std::move(meta_of);
  call.schema_ = ir::FindSchema(target);
  if (call.schema_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(target, " has no known schema"));
  }
  const auto& params = call.schema_->params;
  if (static_cast<int>(args.size()) > call.schema_->num_positional()) {
    return absl::InvalidArgumentError(absl::StrCat(target, " takes ",
                                                   call.schema_->num_positional(),
                                                   " positional arguments, got ", args.size()));
  }
  for (size_t i = 0; i < args.size(); ++i) {
    ir::Argument a = args[i];
    a.name = params[i].name;
    call.bound_[params[i].name] = std::move(a);
  }
  for (const ir::Argument& kw : kwargs) {
    if (call.schema_->FindParam(kw.name) < 0) {
      return absl::InvalidArgumentError(absl::StrCat(target, " has no argument '", kw.name, "'"));
    }
    call.bound_[kw.name] = kw;
  }
  for (const auto& p : params) {
    if (call.bound_.count(p.name)) continue;
    if (p.default_value.has_value()) {
      call.bound_[p.name] = DefaultArgument(p);
    } else if (p.type.optional) {
      call.bound_[p.name] = ir::Argument{p.name, ir::None{}};
    }
  }
  return call;
}

std::string OpCall::Where() const {
  return node_name_.empty() ? target_ : absl::StrCat("node '", node_name_, "' (", target_, ")");
}

const ir::Argument* OpCall::Find(const std::string& name) const {
  auto it = bound_.find(name);
  return it == bound_.end() ? nullptr : &it->second;
}

bool OpCall::IsNone(const std::string& name) const {
  const ir::Argument* a = Find(name);
  return a == nullptr || std::holds_alternative<ir::None>(a->kind);
}

namespace {

absl::Status Mismatch(const OpCall& c, const std::string& name, const char* want) {
  const ir::Argument* a = c.Find(name);
  return absl::InvalidArgumentError(absl::StrCat(c.Where(), ": argument '", name, "' should be ",
                                                 want, ", got ",
                                                 a == nullptr ? "nothing" : ir::KindName(a->kind)));
}

}  // namespace

absl::StatusOr<ir::ValueId> OpCall::Tensor(const std::string& name) const {
  const ir::Argument* a = Find(name);
  if (a != nullptr) {
    if (const auto* v = std::get_if<ir::ValueId>(&a->kind)) return *v;
  }
  return Mismatch(*this, name, "a tensor");
}

absl::StatusOr<const ir::TensorMeta*> OpCall::Meta(const std::string& name) const {
  ASSIGN_OR_RETURN(ir::ValueId v, Tensor(name));
  return &meta_of_(v);
}

absl::StatusOr<std::vector<ir::ValueId>> OpCall::Tensors(const std::string& name) const {
  const ir::Argument* a = Find(name);
  if (a != nullptr) {
    if (const auto* v = std::get_if<std::vector<ir::ValueId>>(&a->kind)) return *v;
  }
  return Mismatch(*this, name, "a tensor list");
}

absl::StatusOr<int64_t> OpCall::Int(const std::string& name) const {
  const ir::Argument* a = Find(name);
  if (a != nullptr) {
    if (const auto* v = std::get_if<int64_t>(&a->kind)) return *v;
    if (const auto* v = std::get_if<bool>(&a->kind)) return *v ? 1 : 0;
    if (const auto* v = std::get_if<ir::SymInt>(&a->kind); v != nullptr && v->is_constant()) {
      return v->constant();
    }
  }
  return Mismatch(*this, name, "an int");
}

absl::StatusOr<double> OpCall::Double(const std::string& name) const {
  const ir::Argument* a = Find(name);
  if (a != nullptr) {
    if (const auto* v = std::get_if<double>(&a->kind)) return *v;
    if (const auto* v = std::get_if<int64_t>(&a->kind)) return static_cast<double>(*v);
    if (const auto* v = std::get_if<bool>(&a->kind)) return *v ? 1.0 : 0.0;
  }
  return Mismatch(*this, name, "a number");
}

absl::StatusOr<bool> OpCall::Bool(const std::string& name) const {
  const ir::Argument* a = Find(name);
  if (a != nullptr) {
    if (const auto* v = std::get_if<bool>(&a->kind)) return *v;
    if (const auto* v = std::get_if<int64_t>(&a->kind)) return *v != 0;
  }
  return Mismatch(*this, name, "a bool");
}

absl::StatusOr<std::vector<int64_t>> OpCall::Ints(const std::string& name) const {
  const ir::Argument* a = Find(name);
  if (a != nullptr) {
    if (const auto* v = std::get_if<std::vector<int64_t>>(&a->kind)) return *v;
    if (const auto* v = std::get_if<int64_t>(&a->kind)) return std::vector<int64_t>{*v};
    if (const auto* v = std::get_if<std::vector<ir::SymInt>>(&a->kind)) {
      std::vector<int64_t> out;
      for (const auto& s : *v) {
        if (!s.is_constant()) return Mismatch(*this, name, "a list of constant ints");
        out.push_back(s.constant());
      }
      return out;
    }
  }
  return Mismatch(*this, name, "an int list");
}

absl::StatusOr<std::vector<ir::SymInt>> OpCall::SymInts(const std::string& name) const {
  const ir::Argument* a = Find(name);
  if (a != nullptr) {
    if (const auto* v = std::get_if<std::vector<ir::SymInt>>(&a->kind)) return *v;
    if (const auto* v = std::get_if<std::vector<int64_t>>(&a->kind)) {
      std::vector<ir::SymInt> out;
      for (int64_t x : *v) out.push_back(ir::SymInt{x});
      return out;
    }
    if (const auto* v = std::get_if<int64_t>(&a->kind)) return std::vector<ir::SymInt>{{*v}};
  }
  return Mismatch(*this, name, "a SymInt list");
}

absl::StatusOr<std::optional<v1::DType>> OpCall::DType(const std::string& name) const {
  const ir::Argument* a = Find(name);
  if (a == nullptr || std::holds_alternative<ir::None>(a->kind)) return std::nullopt;
  if (const auto* v = std::get_if<v1::DType>(&a->kind)) return *v;
  return Mismatch(*this, name, "a dtype");
}

const OpDef* Registry::Find(const std::string& target) const {
  auto it = ops_.find(target);
  return it == ops_.end() ? nullptr : &it->second;
}

std::vector<const OpDef*> Registry::All() const {
  std::vector<const OpDef*> out;
  for (const auto& [t, def] : ops_) out.push_back(&def);
  return out;
}

void Registry::Add(OpDef def) {
  std::string t = def.target;
  ops_[t] = std::move(def);
}

OpDef* Registry::Mutable(const std::string& target) {
  auto it = ops_.find(target);
  return it == ops_.end() ? nullptr : &it->second;
}

const Registry& DefaultRegistry() {
  static const Registry* registry = [] {
    auto* r = new Registry();
    RegisterShapeRules(r);
    RegisterDerivatives(r);
    return r;
  }();
  return *registry;
}

absl::StatusOr<std::vector<ir::TensorMeta>> InferMetas(
    const Registry& registry, const std::string& target, const std::vector<ir::Argument>& args,
    const std::vector<ir::Argument>& kwargs,
    std::function<const ir::TensorMeta&(ir::ValueId)> meta_of) {
  const OpDef* def = registry.Find(target);
  if (def == nullptr || !def->shape) {
    return absl::UnimplementedError(absl::StrCat(target, " has no shape rule in the op registry"));
  }
  ASSIGN_OR_RETURN(OpCall call, OpCall::Bind(target, args, kwargs, std::move(meta_of)));
  return def->shape(call);
}

absl::StatusOr<std::vector<ir::ValueId>> Emit(ir::GraphBuilder& b, const Registry& registry,
                                              const std::string& target,
                                              std::vector<ir::Argument> args,
                                              std::vector<ir::Argument> kwargs, std::string name,
                                              std::vector<std::string> output_names) {
  ASSIGN_OR_RETURN(
      std::vector<ir::TensorMeta> metas,
      InferMetas(registry, target, args, kwargs,
                 [&b](ir::ValueId v) -> const ir::TensorMeta& { return b.value(v).meta; }));
  return b.AddNode(target, std::move(args), std::move(kwargs), std::move(metas), std::move(name),
                   std::move(output_names));
}

absl::Status CheckMetadata(const Registry& registry, const ir::Graph& graph) {
  auto meta_of = [&graph](ir::ValueId v) -> const ir::TensorMeta& { return graph.value(v).meta; };
  for (const ir::Node& node : graph.nodes()) {
    const OpDef* def = registry.Find(node.target);
    if (def == nullptr || !def->shape) continue;
    auto call = OpCall::Bind(node.target, node.args, node.kwargs, meta_of);
    if (!call.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("node '", node.name, "': ", call.status().message()));
    }
    call->set_node_name(node.name);
    auto metas = def->shape(*call);
    if (!metas.ok()) {
      return absl::InvalidArgumentError(metas.status().message());
    }
    if (metas->size() != node.outputs.size()) {
      return absl::InvalidArgumentError(absl::StrCat("node '", node.name, "' (", node.target,
                                                     ") has ", node.outputs.size(),
                                                     " outputs; the op returns ", metas->size()));
    }
    for (size_t j = 0; j < metas->size(); ++j) {
      const ir::Value& v = graph.value(node.outputs[j]);
      const ir::TensorMeta& want = (*metas)[j];
      auto bad = [&](absl::string_view field, const std::string& have, const std::string& expect) {
        return absl::InvalidArgumentError(
            absl::StrCat("node '", node.name, "' (", node.target, ") output ", j, " '", v.name,
                         "': ", field, " is ", have, " in the graph, but the op gives ", expect));
      };
      if (v.meta.dtype != want.dtype) {
        return bad("dtype", v1::DType_Name(v.meta.dtype), v1::DType_Name(want.dtype));
      }
      if (v.meta.sizes.size() != want.sizes.size()) {
        return bad("rank", std::to_string(v.meta.sizes.size()), std::to_string(want.sizes.size()));
      }
      for (size_t d = 0; d < want.sizes.size(); ++d) {
        const ir::SymInt& have = v.meta.sizes[d];
        const ir::SymInt& expect = want.sizes[d];
        if (have.is_constant() && expect.is_constant() && have.constant() != expect.constant()) {
          return bad(absl::StrCat("size[", d, "]"), have.ToString(), expect.ToString());
        }
      }
      if (!want.device_type.empty() && v.meta.device_type != want.device_type) {
        return bad("device", v.meta.device_type, want.device_type);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln::ops
