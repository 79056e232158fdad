// Who may call what: bearer tokens, each with a role and the namespaces it
// may use, read from a file (`--tokens_file`), one token per line:
//
//   # token                          role      namespaces   name (optional)
//   3f9c2e...                        reader    team-a       serving
//   7a1d44...                        compiler  team-a,team-b trainer
//   c0ffee...                        admin     *            ops
//
// NAMESPACES is a comma-separated list; "-" stands for the default (empty)
// namespace and "*" for every namespace.
//
// Roles are cumulative: reader (Lookup, GetArtifact, Stats, ListEntries,
// GetEntry), compiler (also Compile), admin (also Freeze, Thaw, Evict, and
// every namespace, "*" listings included). Clients send the token as gRPC
// metadata "authorization: Bearer <token>". Without a tokens file every
// caller is an admin (kilnd then listens on loopback only, unless told
// otherwise; see main.cc).
//
// Tokens are kept as SHA-256 digests and compared in constant time.
// Thread-safe after construction.
#ifndef KILN_SERVER_AUTH_H_
#define KILN_SERVER_AUTH_H_

#include <map>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/server_context.h"

namespace kiln::server {

enum class Role { kReader = 0, kCompiler = 1, kAdmin = 2 };

struct Principal {
  std::string name;
  Role role = Role::kReader;
  bool all_namespaces = false;
  std::set<std::string> namespaces;
};

class Authorizer {
 public:
  // Every caller is an admin of every namespace.
  Authorizer() = default;
  // INVALID_ARGUMENT naming the line for a malformed file.
  static absl::StatusOr<Authorizer> FromFile(const std::string& path);
  static absl::StatusOr<Authorizer> FromText(const std::string& text);

  bool enabled() const { return enabled_; }
  size_t size() const { return tokens_.size(); }

  // OK when the caller's token grants `need` in namespace `ns` ("*": every
  // namespace, which only an admin has). UNAUTHENTICATED without a known
  // token, PERMISSION_DENIED naming the token and what it lacks.
  absl::Status Check(const grpc::ServerContextBase& ctx, Role need, const std::string& ns) const;
  // The caller, or UNAUTHENTICATED; an admin principal when not enabled.
  absl::StatusOr<Principal> Authenticate(const grpc::ServerContextBase& ctx) const;

 private:
  bool enabled_ = false;
  std::map<std::string, Principal> tokens_;  // hex SHA-256 of the token -> who
};

const char* RoleName(Role role);

}  // namespace kiln::server

#endif  // KILN_SERVER_AUTH_H_
