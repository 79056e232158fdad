#include "server/backend.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/ir/canonical.h"

namespace kiln::server {
namespace {

class EagerBackend final : public Backend {
 public:
  std::string name() const override { return "eager"; }

  absl::StatusOr<v1::Artifact> Compile(const CompileInput& input,
                                       PhaseTimes* times) const override {
    v1::Artifact artifact = NewArtifact(input, name());
    *artifact.mutable_graph() =
        times->Time("canonicalize", [&] { return ir::Canonicalize(input.graph); });
    artifact.mutable_graph()->set_name(input.graph.name());
    return artifact;
  }
};

}  // namespace

void PhaseTimes::Add(const std::string& name, int64_t micros) {
  v1::PhaseTime t;
  t.set_phase(name);
  t.set_micros(micros);
  phases_.push_back(std::move(t));
}

v1::Artifact NewArtifact(const CompileInput& input, const std::string& backend) {
  v1::Artifact a;
  a.set_format_version(kArtifactFormatVersion);
  a.set_backend(backend);
  a.set_compiler_version(KILN_COMPILER_VERSION);
  *a.mutable_target() = input.options.target();
  *a.mutable_guards() = input.guards;
  a.set_key(input.key);
  return a;
}

std::unique_ptr<Backend> MakeEagerBackend() { return std::make_unique<EagerBackend>(); }

BackendRegistry BackendRegistry::Default() {
  BackendRegistry r;
  r.Add(MakeEagerBackend());
  return r;
}

void BackendRegistry::Add(std::unique_ptr<Backend> backend) {
  std::string name = backend->name();
  backends_[name] = std::shared_ptr<const Backend>(std::move(backend));
}

absl::StatusOr<const Backend*> BackendRegistry::Find(const std::string& name) const {
  auto it = backends_.find(name);
  if (it != backends_.end()) return it->second.get();
  std::vector<std::string> known;
  for (const auto& [n, b] : backends_) known.push_back(n);
  return absl::InvalidArgumentError(absl::StrCat("options.backend: unknown backend '", name,
                                                 "' (known: ", absl::StrJoin(known, ", "), ")"));
}

}  // namespace kiln::server
