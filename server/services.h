// The gRPC edge: Compiler and Admin services over an Engine. Each handler
// parses and size-checks the request, calls the Engine and maps absl::Status
// to grpc::Status (the one place that translation happens). Thread-safe.
//
// The Compiler service takes raw bytes so that a request that is too large or
// is no protobuf at all gets INVALID_ARGUMENT saying so (gRPC's own parsing
// would answer a bare INTERNAL). Its methods use the callback API, and
// nothing that costs time in proportion to a request runs on gRPC's own
// threads: Lookup (parsing, verifying and keying a graph) runs on a bounded
// pool of checking threads, and Compile on the compile executor: one thread
// of it takes the request, after its namespace's admission
// (server/tenant_limits.h), through the engine to its reply, compile
// included (the engine bounds how many compile at once,
// server/compile_slots.h). A Compile whose client goes away is told to the
// engine by its reactor's OnCancel. GetArtifact, a read by digest, answers
// on gRPC's thread.
#ifndef KILN_SERVER_SERVICES_H_
#define KILN_SERVER_SERVICES_H_

#include <atomic>

#include "common/signing.h"
#include "kiln/v1/service.grpc.pb.h"
#include "server/auth.h"
#include "server/engine.h"
#include "server/request_log.h"
#include "server/tenant_limits.h"
#include "server/worker_pool.h"

namespace kiln::server {

class CompilerService final
    : public v1::Compiler::WithRawCallbackMethod_Compile<v1::Compiler::WithRawCallbackMethod_Lookup<
          v1::Compiler::WithRawCallbackMethod_GetArtifact<v1::Compiler::Service>>> {
 public:
  struct Limits {
    uint64_t max_message_bytes = 64 << 20;
    // Compile requests waiting for a result at once, over all namespaces and
    // per namespace, and the bytes of one namespace's; more are
    // RESOURCE_EXHAUSTED.
    int max_waiting_compiles = 256;
    int64_t max_compiles_per_tenant = 32;
    int64_t max_queued_bytes_per_tenant = int64_t{256} << 20;
    // Threads that parse and check Lookups, and Lookups that may wait for
    // them (more are RESOURCE_EXHAUSTED).
    int lookup_workers = 2;
    int max_queued_lookups = 4096;
  };
  // `engine` must outlive the service.
  // `requests` (may be null) gets one record per Compile and Lookup.
  // With `signer`, every reply that carries an artifact carries its signed
  // digest.
  CompilerService(Engine* engine, const Limits& limits, const Authorizer* auth,
                  RequestLog* requests = nullptr, const Signer* signer = nullptr);

  grpc::ServerUnaryReactor* Compile(grpc::CallbackServerContext*, const grpc::ByteBuffer*,
                                    grpc::ByteBuffer*) override;
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext*, const grpc::ByteBuffer*,
                                   grpc::ByteBuffer*) override;
  grpc::ServerUnaryReactor* GetArtifact(grpc::CallbackServerContext*, const grpc::ByteBuffer*,
                                        grpc::ByteBuffer*) override;

  // Compile calls accepted whose answer is not yet sent.
  int active() const { return active_; }

 private:
  // The reply with kilnd's signature of its digest, when it carries an
  // artifact and kilnd has a signing key.
  template <typename Resp>
  absl::StatusOr<Resp> Signed(absl::StatusOr<Resp> resp) const;
  absl::StatusOr<Engine::LookupReply> Signed(absl::StatusOr<Engine::LookupReply> reply) const;

  Engine* const engine_;
  const Authorizer* const auth_;
  const Signer* const signer_;
  RequestLog* const requests_;
  const uint64_t max_message_bytes_;
  std::atomic<int> active_{0};
  TenantLimits tenants_;
  WorkerPool compiles_;  // the compile executor
  WorkerPool lookups_;
};

class AdminService final : public v1::Admin::Service {
 public:
  // `engine` and `auth` must outlive the service.
  // `audit` (may be null) gets one record per Freeze, Thaw and Evict, with
  // the caller.
  AdminService(Engine* engine, const Authorizer* auth, RequestLog* audit = nullptr)
      : engine_(engine), auth_(auth), audit_(audit) {}

  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest*, v1::StatsResponse*) override;
  grpc::Status Freeze(grpc::ServerContext*, const v1::FreezeRequest*, v1::FreezeResponse*) override;
  grpc::Status Thaw(grpc::ServerContext*, const v1::ThawRequest*, v1::ThawResponse*) override;
  grpc::Status ListEntries(grpc::ServerContext*, const v1::ListEntriesRequest*,
                           v1::ListEntriesResponse*) override;
  grpc::Status GetEntry(grpc::ServerContext*, const v1::GetEntryRequest*,
                        v1::GetEntryResponse*) override;
  grpc::Status Evict(grpc::ServerContext*, const v1::EvictRequest*, v1::EvictResponse*) override;
  grpc::Status ListFailures(grpc::ServerContext*, const v1::ListFailuresRequest*,
                            v1::ListFailuresResponse*) override;
  grpc::Status GetFailure(grpc::ServerContext*, const v1::GetFailureRequest*,
                          v1::GetFailureResponse*) override;
  grpc::Status GraphBreaks(grpc::ServerContext*, const v1::GraphBreaksRequest*,
                           v1::GraphBreaksResponse*) override;

 private:
  Engine* const engine_;
  const Authorizer* const auth_;
  RequestLog* const audit_;
};

}  // namespace kiln::server

#endif  // KILN_SERVER_SERVICES_H_
