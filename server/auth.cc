#include "server/auth.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cache/cache.h"
#include "common/hashing.h"
#include "openssl/crypto.h"

namespace kiln::server {

const char* RoleName(Role role) {
  switch (role) {
    case Role::kReader:
      return "reader";
    case Role::kCompiler:
      return "compiler";
    case Role::kAdmin:
      return "admin";
  }
  return "?";
}

absl::StatusOr<Authorizer> Authorizer::FromFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::InvalidArgumentError(absl::StrCat("tokens_file: cannot read ", path));
  std::stringstream text;
  text << f.rdbuf();
  auto a = FromText(text.str());
  if (!a.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens_file ", path, ": ", a.status().message()));
  }
  return a;
}

absl::StatusOr<Authorizer> Authorizer::FromText(const std::string& text) {
  Authorizer a;
  a.enabled_ = true;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    const std::string at = absl::StrCat("line ", number);
    if (fields.size() < 3 || fields.size() > 4) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ": expected 'TOKEN ROLE NAMESPACES [NAME]'"));
    }
    if (fields[0].size() < 16) {
      return absl::InvalidArgumentError(absl::StrCat(at, ": a token has at least 16 characters"));
    }
    Principal p;
    p.name = fields.size() == 4 ? std::string(fields[3]) : absl::StrCat("line-", number);
    if (fields[1] == "reader") {
      p.role = Role::kReader;
    } else if (fields[1] == "compiler") {
      p.role = Role::kCompiler;
    } else if (fields[1] == "admin") {
      p.role = Role::kAdmin;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(at, ": role '", fields[1].substr(0, 32),
                                                     "' is not reader, compiler or admin"));
    }
    for (absl::string_view ns : absl::StrSplit(fields[2], ',')) {
      if (ns == "*") {
        p.all_namespaces = true;
        continue;
      }
      const std::string name = ns == "-" ? "" : std::string(ns);  // "-": the default namespace
      if (absl::Status s = cache::ValidateNamespace(name); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(at, ": ", s.message()));
      }
      p.namespaces.insert(name);
    }
    if (p.role == Role::kAdmin) p.all_namespaces = true;
    if (!a.tokens_.emplace(Sha256Hex(fields[0]), std::move(p)).second) {
      return absl::InvalidArgumentError(absl::StrCat(at, ": the token appears twice"));
    }
  }
  if (a.tokens_.empty()) return absl::InvalidArgumentError("no tokens");
  return a;
}

absl::StatusOr<Principal> Authorizer::Authenticate(const grpc::ServerContextBase& ctx) const {
  if (!enabled_) {
    Principal admin;
    admin.name = "anyone";
    admin.role = Role::kAdmin;
    admin.all_namespaces = true;
    return admin;
  }
  const auto& metadata = ctx.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError("no bearer token: send 'authorization: Bearer <token>'");
  }
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::ConsumePrefix(&value, "Bearer ")) {
    return absl::UnauthenticatedError("the authorization metadata is not 'Bearer <token>'");
  }
  const std::string digest = Sha256Hex(value);
  for (const auto& [known, principal] : tokens_) {
    if (CRYPTO_memcmp(known.data(), digest.data(), digest.size()) == 0) return principal;
  }
  return absl::UnauthenticatedError("unknown token");
}

absl::Status Authorizer::Check(const grpc::ServerContextBase& ctx, Role need,
                               const std::string& ns) const {
  absl::StatusOr<Principal> p = Authenticate(ctx);
  if (!p.ok()) return p.status();
  if (static_cast<int>(p->role) < static_cast<int>(need)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "token '", p->name, "' is a ", RoleName(p->role), "; this call needs ", RoleName(need)));
  }
  if (p->all_namespaces) return absl::OkStatus();
  if (ns == "*" || p->namespaces.count(ns) == 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("token '", p->name, "' may not use namespace '", ns.substr(0, 64), "'"));
  }
  return absl::OkStatus();
}

}  // namespace kiln::server
