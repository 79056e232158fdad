#include "server/services.h"

#include "absl/strings/str_cat.h"

namespace kiln::server {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

template <typename Resp>
grpc::Status Reply(absl::StatusOr<Resp> result, Resp* out) {
  if (!result.ok()) return ToGrpc(result.status());
  *out = *std::move(result);
  return grpc::Status::OK;
}

// gRPC itself refuses messages over twice the limit; between the limit and
// that, the refusal names the limit.
grpc::Status CheckSize(const google::protobuf::Message& m, uint64_t limit) {
  const uint64_t size = m.ByteSizeLong();
  if (size <= limit) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("request is ", size, " bytes, over max_message_bytes (", limit,
                                   ")"));
}

}  // namespace

grpc::Status CompilerService::Compile(grpc::ServerContext*, const v1::CompileRequest* req,
                                      v1::CompileResponse* resp) {
  if (auto s = CheckSize(*req, max_message_bytes_); !s.ok()) return s;
  return Reply(engine_->Compile(*req), resp);
}

grpc::ServerUnaryReactor* CompilerService::Lookup(grpc::CallbackServerContext* ctx,
                                                  const v1::LookupRequest* req,
                                                  v1::LookupResponse* resp) {
  grpc::Status s = CheckSize(*req, max_message_bytes_);
  if (s.ok()) s = Reply(engine_->Lookup(*req), resp);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(s);
  return reactor;
}

grpc::ServerUnaryReactor* CompilerService::GetArtifact(grpc::CallbackServerContext* ctx,
                                                       const v1::GetArtifactRequest* req,
                                                       v1::GetArtifactResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(Reply(engine_->GetArtifact(*req), resp));
  return reactor;
}

grpc::Status AdminService::Stats(grpc::ServerContext*, const v1::StatsRequest*,
                                 v1::StatsResponse* resp) {
  *resp = engine_->Stats();
  return grpc::Status::OK;
}

grpc::Status AdminService::Freeze(grpc::ServerContext*, const v1::FreezeRequest*,
                                  v1::FreezeResponse* resp) {
  engine_->SetFrozen(true);
  resp->set_frozen(true);
  return grpc::Status::OK;
}

grpc::Status AdminService::Thaw(grpc::ServerContext*, const v1::ThawRequest*,
                                v1::ThawResponse* resp) {
  engine_->SetFrozen(false);
  resp->set_frozen(false);
  return grpc::Status::OK;
}

grpc::Status AdminService::ListEntries(grpc::ServerContext*, const v1::ListEntriesRequest* req,
                                       v1::ListEntriesResponse* resp) {
  return Reply(engine_->ListEntries(*req), resp);
}

grpc::Status AdminService::GetEntry(grpc::ServerContext*, const v1::GetEntryRequest* req,
                                    v1::GetEntryResponse* resp) {
  return Reply(engine_->GetEntry(*req), resp);
}

grpc::Status AdminService::Evict(grpc::ServerContext*, const v1::EvictRequest* req,
                                 v1::EvictResponse* resp) {
  return Reply(engine_->Evict(*req), resp);
}

}  // namespace kiln::server
