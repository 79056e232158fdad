// kiln::Client: the C++ client of kilnd (docs/architecture.md §1).
//
// Typed calls to the Compiler and Admin services and the standard
// grpc.health.v1 health check, each with a deadline and with retries when the
// server is UNAVAILABLE. It also computes cache keys locally, with the same
// code the server uses (ir::Graph::FromProto + ir::CacheKey), so that a lookup
// sends only the key and the input signature: the graph travels only on a
// miss, with Compile.
//
//   ASSIGN_OR_RETURN(auto client, Client::Connect({.address = "127.0.0.1:50051"}));
//   ASSIGN_OR_RETURN(v1::LookupResponse hit,
//                    client->LookupGraph(graph, options, signature));
//   if (hit.outcome() != v1::HIT) { ... client->Compile(request) ... }
//
// Errors: every failed call returns the server's status translated to
// absl::Status (same code, same message). A call is retried only when it
// fails with UNAVAILABLE, up to `max_attempts` attempts in all, sleeping
// initial_backoff, 2*initial_backoff, 4*initial_backoff... between them; any
// other code is returned at once. `deadline` bounds a whole call, retries and
// backoffs included: no attempt starts, and no backoff sleeps, past it.
//
// Thread-safe: a Client may be shared by any number of threads (the gRPC
// channel and stubs are thread-safe and the Client holds no other state).
#ifndef KILN_CLIENT_CLIENT_H_
#define KILN_CLIENT_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/status.h"
#include "kiln/v1/service.grpc.pb.h"
#include "kiln/v1/service.pb.h"

namespace kiln {

struct ClientOptions {
  // "host:port", or any gRPC target ("unix:/path", "dns:///host:port").
  std::string address;
  // Bounds each call, retries included.
  absl::Duration deadline = absl::Seconds(60);
  // Attempts per call in all (1 = no retry). Only UNAVAILABLE is retried.
  int max_attempts = 5;
  // Sleep before the first retry; doubled before each later one.
  absl::Duration initial_backoff = absl::Milliseconds(50);
  // Largest message sent or received (artifacts can be large).
  uint64_t max_message_bytes = 256 << 20;
  // Bearer token sent with every call ("authorization: Bearer <token>");
  // empty: none.
  std::string token;
  // TLS: PEM root certificates the server's certificate must chain to.
  // Empty: plaintext. With tls_cert/tls_key: a client certificate (mutual
  // TLS).
  std::string tls_root_certs;
  std::string tls_cert;
  std::string tls_key;
};

class Client {
 public:
  // Validates the options (INVALID_ARGUMENT naming the field) and creates the
  // channel. Does not wait for the server: the first call connects.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(ClientOptions options);

  // The cache key the server computes for `graph` under `options`, computed
  // here with the same code. INVALID_ARGUMENT when the graph is malformed.
  static absl::StatusOr<std::string> Key(const v1::Graph& graph, const v1::CompileOptions& options);

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client();

  // --- Compiler service ---
  absl::StatusOr<v1::CompileResponse> Compile(const v1::CompileRequest& request) const;
  absl::StatusOr<v1::LookupResponse> Lookup(const v1::LookupRequest& request) const;
  // Computes the key locally and looks up by key + signature; the graph never
  // travels. Fails before any RPC when the graph is malformed.
  absl::StatusOr<v1::LookupResponse> LookupGraph(const v1::Graph& graph,
                                                 const v1::CompileOptions& options,
                                                 const v1::InputSignature& signature,
                                                 const std::string& ns = "",
                                                 bool include_artifact = false) const;
  // The artifact `digest`, which a variant of namespace `ns` names (checked
  // by kilnd when it has tokens).
  absl::StatusOr<v1::GetArtifactResponse> GetArtifact(const std::string& digest,
                                                      const std::string& ns = "") const;

  // --- Admin service ---
  absl::StatusOr<v1::StatsResponse> Stats() const;
  absl::StatusOr<v1::FreezeResponse> Freeze() const;
  absl::StatusOr<v1::ThawResponse> Thaw() const;
  // `ns` = "*" lists every namespace.
  absl::StatusOr<v1::ListEntriesResponse> ListEntries(const std::string& ns = "") const;
  absl::StatusOr<v1::GetEntryResponse> GetEntry(const std::string& key,
                                                const std::string& ns = "") const;
  absl::StatusOr<v1::EvictResponse> Evict(const std::string& key, const std::string& ns = "") const;
  // Record and replay: the failed compiles kilnd kept (`ns` = "*": every
  // namespace), and one of them whole.
  absl::StatusOr<v1::ListFailuresResponse> ListFailures(const std::string& ns = "") const;
  absl::StatusOr<v1::GetFailureResponse> GetFailure(const std::string& id,
                                                    const std::string& ns = "") const;
  // Graph-break reports of `job` (every job when empty) in `ns` ("*": all).
  absl::StatusOr<v1::GraphBreaksResponse> GraphBreaks(const std::string& ns = "",
                                                      const std::string& job = "") const;

  // grpc.health.v1.Health/Check for the whole server (service ""). OK when
  // the server answers SERVING; UNAVAILABLE naming the status it answered
  // otherwise; the call's own error when it could not be asked.
  absl::Status Health() const;

  const ClientOptions& options() const { return options_; }

 private:
  Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel);

  // Runs `attempt` (one RPC on a fresh context) with the deadline and the
  // retry policy above; returns the last attempt's status, translated.
  absl::Status Call(const std::function<grpc::Status(grpc::ClientContext*)>& attempt) const;

  const ClientOptions options_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::Compiler::Stub> compiler_;
  const std::unique_ptr<v1::Admin::Stub> admin_;
  const std::unique_ptr<grpc::GenericStub> generic_;
};

// The concrete input signature described by a graph's input metadata: dtype,
// device, sizes, strides (contiguous when the metadata has none), storage
// offset and requires_grad of each input, in order. INVALID_ARGUMENT naming
// the input and the dimension when any of them is symbolic: the caller must
// then pass the signature of its actual inputs.
absl::StatusOr<v1::InputSignature> SignatureFromMetadata(const v1::Graph& graph);

}  // namespace kiln

#endif  // KILN_CLIENT_CLIENT_H_
