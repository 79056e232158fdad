#include "compiler/pipeline/fault.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"

namespace kiln::pipeline {

absl::StatusOr<Fault> ParseFault(absl::string_view text) {
  Fault fault;
  if (text.empty()) return fault;
  const size_t colon = text.find(':');
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inject_fault '", text.substr(0, 200), "': ", why,
        " (KIND:TARGET, KIND one of compile_error, accuracy, runtime_error; TARGET an op "
        "such "
        "as aten.relu.default)"));
  };
  if (colon == absl::string_view::npos) return bad("no ':'");
  const absl::string_view kind = text.substr(0, colon), target = text.substr(colon + 1);
  if (kind == "compile_error") {
    fault.kind = Fault::kCompileError;
  } else if (kind == "accuracy") {
    fault.kind = Fault::kAccuracy;
  } else if (kind == "runtime_error") {
    fault.kind = Fault::kRuntimeError;
  } else {
    return bad(absl::StrCat("unknown kind '", kind.substr(0, 64), "'"));
  }
  if (target.empty() || target.size() > 256) return bad("the target must be 1 to 256 characters");
  fault.target = std::string(target);
  return fault;
}

absl::StatusOr<ir::Graph> ApplyFault(const ir::Graph& graph, const Fault& fault) {
  if (fault.kind == Fault::kNone) return graph;
  if (fault.kind == Fault::kCompileError) {
    for (const ir::Node& n : graph.nodes()) {
      if (n.target == fault.target) {
        return absl::InternalError(
            absl::StrCat("injected compile error (inject_fault=compile_error:", fault.target,
                         ") at node '", n.name, "'"));
      }
    }
    return graph;
  }
  // accuracy: each output x of the op becomes x + 1 for every reader;
  // runtime_error: kiln.injected_fault(x, message).
  v1::Graph proto = graph.ToProto();
  std::set<std::string> names;
  for (const ir::Value& v : graph.values()) names.insert(v.name);
  std::map<std::string, std::string> renamed;  // faulty value -> its + 1
  v1::Graph out = proto;
  out.clear_nodes();
  auto fresh = [&names](const std::string& base) {
    std::string name = base;
    for (int i = 1; names.count(name); ++i) name = absl::StrCat(base, "_", i);
    names.insert(name);
    return name;
  };
  auto rename = [&renamed](v1::Node* n) {
    for (auto* args : {n->mutable_args(), n->mutable_kwargs()}) {
      for (v1::Argument& a : *args) {
        if (a.has_tensor() && renamed.count(a.tensor())) a.set_tensor(renamed[a.tensor()]);
        if (a.has_tensors()) {
          for (std::string& t : *a.mutable_tensors()->mutable_names()) {
            if (renamed.count(t)) t = renamed[t];
          }
        }
      }
    }
  };
  for (v1::Node n : proto.nodes()) {
    rename(&n);
    *out.add_nodes() = n;
    if (n.target() != fault.target) continue;
    for (const v1::Value& v : n.outputs()) {
      const bool accuracy = fault.kind == Fault::kAccuracy;
      if (accuracy && v.meta().dtype() == v1::BOOL) continue;
      v1::Node* add = out.add_nodes();
      add->set_name(fresh(absl::StrCat(n.name(), "_injected_fault")));
      add->add_args()->set_tensor(v.name());
      if (accuracy) {
        add->set_target("aten.add.Scalar");
        add->add_args()->set_int_value(1);
      } else {
        add->set_target("kiln.injected_fault.default");
        add->add_args()->set_string_value(
            absl::StrCat("injected runtime error (inject_fault=runtime_error:", fault.target,
                         ") at node '", n.name(), "'"));
      }
      v1::Value* o = add->add_outputs();
      o->set_name(fresh(absl::StrCat(v.name(), accuracy ? "_plus_one" : "_checked")));
      *o->mutable_meta() = v.meta();
      renamed[v.name()] = o->name();
    }
  }
  for (std::string& o : *out.mutable_outputs()) {
    if (renamed.count(o)) o = renamed[o];
  }
  return ir::Graph::FromProto(out);
}

}  // namespace kiln::pipeline
