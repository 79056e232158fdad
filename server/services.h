// The gRPC edge: Compiler and Admin services over an Engine. Each handler
// checks the request size, calls the Engine and maps absl::Status to
// grpc::Status (the one place that translation happens). Thread-safe.
//
// Lookup and GetArtifact never wait on anything, so they use the callback API
// and answer on gRPC's own thread; Compile may wait for a compile worker and
// stays on the synchronous API's thread pool.
#ifndef KILN_SERVER_SERVICES_H_
#define KILN_SERVER_SERVICES_H_

#include "kiln/v1/service.grpc.pb.h"
#include "server/engine.h"

namespace kiln::server {

class CompilerService final
    : public v1::Compiler::WithCallbackMethod_Lookup<
          v1::Compiler::WithCallbackMethod_GetArtifact<v1::Compiler::Service>> {
 public:
  // `engine` must outlive the service.
  CompilerService(Engine* engine, uint64_t max_message_bytes)
      : engine_(engine), max_message_bytes_(max_message_bytes) {}

  grpc::Status Compile(grpc::ServerContext*, const v1::CompileRequest*,
                       v1::CompileResponse*) override;
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext*, const v1::LookupRequest*,
                                   v1::LookupResponse*) override;
  grpc::ServerUnaryReactor* GetArtifact(grpc::CallbackServerContext*,
                                        const v1::GetArtifactRequest*,
                                        v1::GetArtifactResponse*) override;

 private:
  Engine* const engine_;
  const uint64_t max_message_bytes_;
};

class AdminService final : public v1::Admin::Service {
 public:
  explicit AdminService(Engine* engine) : engine_(engine) {}

  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest*, v1::StatsResponse*) override;
  grpc::Status Freeze(grpc::ServerContext*, const v1::FreezeRequest*,
                      v1::FreezeResponse*) override;
  grpc::Status Thaw(grpc::ServerContext*, const v1::ThawRequest*, v1::ThawResponse*) override;
  grpc::Status ListEntries(grpc::ServerContext*, const v1::ListEntriesRequest*,
                           v1::ListEntriesResponse*) override;
  grpc::Status GetEntry(grpc::ServerContext*, const v1::GetEntryRequest*,
                        v1::GetEntryResponse*) override;
  grpc::Status Evict(grpc::ServerContext*, const v1::EvictRequest*, v1::EvictResponse*) override;

 private:
  Engine* const engine_;
};

}  // namespace kiln::server

#endif  // KILN_SERVER_SERVICES_H_
