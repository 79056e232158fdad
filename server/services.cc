#include "server/services.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"

namespace kiln::server {
namespace {

// An error quotes at most this much: messages name what is wrong, and a
// hostile request must not get megabytes of itself echoed back.
constexpr size_t kMaxErrorMessageBytes = 4096;

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  std::string message(s.message());
  if (message.size() > kMaxErrorMessageBytes) {
    const size_t dropped = message.size() - kMaxErrorMessageBytes;
    message.resize(kMaxErrorMessageBytes);
    absl::StrAppend(&message, "... (", dropped, " more bytes)");
  }
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::move(message));
}

template <typename Resp>
grpc::Status Reply(absl::StatusOr<Resp> result, Resp* out) {
  if (!result.ok()) return ToGrpc(result.status());
  *out = *std::move(result);
  return grpc::Status::OK;
}

// Parses `bytes` as a `Req`, refusing what is over `limit` or does not parse.
template <typename Req>
absl::Status Parse(const grpc::ByteBuffer& bytes, uint64_t limit, Req* req) {
  if (bytes.Length() > limit) {
    return absl::InvalidArgumentError(absl::StrCat("request is ", bytes.Length(),
                                                   " bytes, over max_message_bytes (", limit, ")"));
  }
  grpc::ByteBuffer copy(bytes);
  grpc::ProtoBufferReader reader(&copy);
  if (!req->ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError(absl::StrCat("request does not parse as ",
                                                   Req::descriptor()->full_name(), " (",
                                                   bytes.Length(), " bytes)"));
  }
  return absl::OkStatus();
}

// A reply on the wire.
template <typename Resp>
grpc::Status Write(const Resp& resp, grpc::ByteBuffer* out) {
  bool own = false;
  return grpc::SerializationTraits<Resp>::Serialize(resp, out, &own);
}

// A Lookup's reply on the wire: the response, then the artifact field made
// of the artifact's stored bytes (an embedded message is its serialized
// bytes, and a field may follow the others): what the client parses as
// LookupResponse.artifact, without kilnd parsing and serializing it again.
grpc::Status Write(const Engine::LookupReply& reply, grpc::ByteBuffer* out) {
  using google::protobuf::internal::WireFormatLite;
  std::string wire;
  if (!reply.response.SerializeToString(&wire)) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "the lookup's reply does not serialize");
  }
  if (!reply.artifact.empty()) {
    google::protobuf::io::StringOutputStream stream(&wire);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.WriteTag(WireFormatLite::MakeTag(v1::LookupResponse::kArtifactFieldNumber,
                                           WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    coded.WriteVarint64(reply.artifact.size());
    coded.WriteRaw(reply.artifact.data(), static_cast<int>(reply.artifact.size()));
  }
  grpc::Slice slice(wire);
  *out = grpc::ByteBuffer(&slice, 1);
  return grpc::Status::OK;
}

// Runs `handle` on the parsed request and serializes its reply into `out`.
template <typename Req, typename Resp, typename Handle>
grpc::Status Serve(const grpc::ByteBuffer& in, uint64_t limit, grpc::ByteBuffer* out,
                   Handle&& handle) {
  Req req;
  if (absl::Status s = Parse(in, limit, &req); !s.ok()) return ToGrpc(s);
  absl::StatusOr<Resp> resp = handle(req);
  if (!resp.ok()) return ToGrpc(resp.status());
  return Write(*resp, out);
}

// A Compile call's reactor: it tells the engine when the client goes away
// (gRPC's OnCancel), so that a compile nobody waits for stops.
class CompileReactor final : public grpc::ServerUnaryReactor {
 public:
  // `active` counts the call until gRPC is done with it: its response sent
  // (a large artifact takes a while) or the call cancelled. A draining
  // server waits for that, not only for the compile.
  explicit CompileReactor(std::atomic<int>* active) : active_(active) { ++*active_; }
  Caller* caller() { return &caller_; }
  void OnCancel() override { caller_.MarkGone(); }
  void OnDone() override {
    --*active_;
    delete this;
  }

 private:
  std::atomic<int>* const active_;
  Caller caller_;
};

// Writes one record of a finished call to `log` (when there is one) and
// returns `status`.
grpc::Status Log(RequestLog* log, const Authorizer& auth, const grpc::ServerContextBase& ctx,
                 const char* rpc, const std::string& ns, grpc::Status status, absl::Time start,
                 const std::string& detail = "") {
  if (log == nullptr) return status;
  RequestRecord r;
  r.rid = RequestId(ctx);
  r.rpc = rpc;
  r.ns = ns.substr(0, 64);
  absl::StatusOr<Principal> who = auth.Authenticate(ctx);
  r.caller = who.ok() ? who->name : "unauthenticated";
  r.code = static_cast<absl::StatusCode>(status.error_code());
  r.elapsed = absl::Now() - start;
  r.detail = detail;
  log->Write(r);
  return status;
}

}  // namespace

template <typename Resp>
absl::StatusOr<Resp> CompilerService::Signed(absl::StatusOr<Resp> resp) const {
  if (signer_ != nullptr && resp.ok() && resp->has_artifact() && !resp->digest().empty()) {
    resp->set_signature(signer_->Sign(resp->digest()));
  }
  return resp;
}

absl::StatusOr<Engine::LookupReply> CompilerService::Signed(
    absl::StatusOr<Engine::LookupReply> reply) const {
  if (signer_ != nullptr && reply.ok() && !reply->artifact.empty() &&
      !reply->response.digest().empty()) {
    reply->response.set_signature(signer_->Sign(reply->response.digest()));
  }
  return reply;
}

CompilerService::CompilerService(Engine* engine, const Limits& limits, const Authorizer* auth,
                                 RequestLog* requests, const Signer* signer)
    : engine_(engine),
      auth_(auth),
      signer_(signer),
      requests_(requests),
      max_message_bytes_(limits.max_message_bytes),
      tenants_(limits.max_compiles_per_tenant, limits.max_queued_bytes_per_tenant),
      compiles_(limits.max_waiting_compiles, limits.max_waiting_compiles,
                "set of waiting compile requests (limits.max_waiting_compiles)"),
      lookups_(limits.lookup_workers, limits.max_queued_lookups,
               "lookup queue (limits.max_queued_lookups)") {}

grpc::ServerUnaryReactor* CompilerService::Compile(grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* req,
                                                   grpc::ByteBuffer* resp) {
  auto* reactor = new CompileReactor(&active_);
  const absl::Time start = absl::Now();
  // The whole Compile, its compile included, runs on this one thread of
  // `compiles_`.
  absl::Status queued = compiles_.Submit([this, ctx, req, resp, reactor, start] {
    std::string ns;
    grpc::Status s = Serve<v1::CompileRequest, v1::CompileResponse>(
        *req, max_message_bytes_, resp,
        [&](const v1::CompileRequest& r) -> absl::StatusOr<v1::CompileResponse> {
          ns = r.namespace_();
          RETURN_IF_ERROR(auth_->Check(*ctx, Role::kCompiler, r.namespace_()));
          ASSIGN_OR_RETURN(TenantLimits::Admission admitted,
                           tenants_.Admit(r.namespace_(), static_cast<int64_t>(req->Length())));
          return Signed(engine_->Compile(r, reactor->caller()));
        });
    Log(requests_, *auth_, *ctx, "Compile", ns, s, start);
    reactor->Finish(s);
  });
  if (!queued.ok()) {
    reactor->Finish(ToGrpc(queued));
  }
  return reactor;
}

grpc::ServerUnaryReactor* CompilerService::Lookup(grpc::CallbackServerContext* ctx,
                                                  const grpc::ByteBuffer* req,
                                                  grpc::ByteBuffer* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time start = absl::Now();
  absl::Status queued = lookups_.Submit([this, ctx, req, resp, reactor, start] {
    std::string ns;
    grpc::Status s = Serve<v1::LookupRequest, Engine::LookupReply>(
        *req, max_message_bytes_, resp,
        [&](const v1::LookupRequest& r) -> absl::StatusOr<Engine::LookupReply> {
          ns = r.namespace_();
          RETURN_IF_ERROR(auth_->Check(*ctx, Role::kReader, r.namespace_()));
          return Signed(engine_->Lookup(r));
        });
    Log(requests_, *auth_, *ctx, "Lookup", ns, s, start);
    reactor->Finish(s);
  });
  if (!queued.ok()) {
    // Refused before parsing: the namespace is not known.
    reactor->Finish(Log(requests_, *auth_, *ctx, "Lookup", "", ToGrpc(queued), start));
  }
  return reactor;
}

grpc::ServerUnaryReactor* CompilerService::GetArtifact(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* req,
                                                       grpc::ByteBuffer* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(Serve<v1::GetArtifactRequest, v1::GetArtifactResponse>(
      *req, max_message_bytes_, resp,
      [&](const v1::GetArtifactRequest& r) -> absl::StatusOr<v1::GetArtifactResponse> {
        RETURN_IF_ERROR(auth_->Check(*ctx, Role::kReader, r.namespace_()));
        // Without tokens, or for a token of every namespace, any digest.
        absl::StatusOr<Principal> who = auth_->Authenticate(*ctx);
        return Signed(engine_->GetArtifact(r, /*scoped=*/who.ok() && !who->all_namespaces));
      }));
  return reactor;
}

grpc::Status AdminService::Stats(grpc::ServerContext* ctx, const v1::StatsRequest*,
                                 v1::StatsResponse* resp) {
  if (absl::StatusOr<Principal> who = auth_->Authenticate(*ctx); !who.ok()) {
    return ToGrpc(who.status());
  }
  *resp = engine_->Stats();
  return grpc::Status::OK;
}

grpc::Status AdminService::Freeze(grpc::ServerContext* ctx, const v1::FreezeRequest*,
                                  v1::FreezeResponse* resp) {
  const absl::Time start = absl::Now();
  if (absl::Status s = auth_->Check(*ctx, Role::kAdmin, "*"); !s.ok()) {
    return Log(audit_, *auth_, *ctx, "Freeze", "*", ToGrpc(s), start);
  }
  Log(audit_, *auth_, *ctx, "Freeze", "*", grpc::Status::OK, start);
  engine_->SetFrozen(true);
  resp->set_frozen(true);
  return grpc::Status::OK;
}

grpc::Status AdminService::Thaw(grpc::ServerContext* ctx, const v1::ThawRequest*,
                                v1::ThawResponse* resp) {
  const absl::Time start = absl::Now();
  if (absl::Status s = auth_->Check(*ctx, Role::kAdmin, "*"); !s.ok()) {
    return Log(audit_, *auth_, *ctx, "Thaw", "*", ToGrpc(s), start);
  }
  Log(audit_, *auth_, *ctx, "Thaw", "*", grpc::Status::OK, start);
  engine_->SetFrozen(false);
  resp->set_frozen(false);
  return grpc::Status::OK;
}

grpc::Status AdminService::ListEntries(grpc::ServerContext* ctx, const v1::ListEntriesRequest* req,
                                       v1::ListEntriesResponse* resp) {
  if (absl::Status s = auth_->Check(*ctx, Role::kReader, req->namespace_()); !s.ok()) {
    return ToGrpc(s);
  }
  return Reply(engine_->ListEntries(*req), resp);
}

grpc::Status AdminService::GetEntry(grpc::ServerContext* ctx, const v1::GetEntryRequest* req,
                                    v1::GetEntryResponse* resp) {
  if (absl::Status s = auth_->Check(*ctx, Role::kReader, req->namespace_()); !s.ok()) {
    return ToGrpc(s);
  }
  return Reply(engine_->GetEntry(*req), resp);
}

grpc::Status AdminService::Evict(grpc::ServerContext* ctx, const v1::EvictRequest* req,
                                 v1::EvictResponse* resp) {
  const absl::Time start = absl::Now();
  if (absl::Status s = auth_->Check(*ctx, Role::kAdmin, "*"); !s.ok()) {
    return Log(audit_, *auth_, *ctx, "Evict", req->namespace_(), ToGrpc(s), start,
               req->key().substr(0, 64));
  }
  return Log(audit_, *auth_, *ctx, "Evict", req->namespace_(), Reply(engine_->Evict(*req), resp),
             start, req->key().substr(0, 64));
}

grpc::Status AdminService::ListFailures(grpc::ServerContext* ctx,
                                        const v1::ListFailuresRequest* req,
                                        v1::ListFailuresResponse* resp) {
  if (absl::Status s = auth_->Check(*ctx, Role::kReader, req->namespace_()); !s.ok()) {
    return ToGrpc(s);
  }
  return Reply(engine_->ListFailures(*req), resp);
}

grpc::Status AdminService::GetFailure(grpc::ServerContext* ctx, const v1::GetFailureRequest* req,
                                      v1::GetFailureResponse* resp) {
  if (absl::Status s = auth_->Check(*ctx, Role::kReader, req->namespace_()); !s.ok()) {
    return ToGrpc(s);
  }
  return Reply(engine_->GetFailure(*req), resp);
}

grpc::Status AdminService::GraphBreaks(grpc::ServerContext* ctx, const v1::GraphBreaksRequest* req,
                                       v1::GraphBreaksResponse* resp) {
  if (absl::Status s = auth_->Check(*ctx, Role::kReader, req->namespace_()); !s.ok()) {
    return ToGrpc(s);
  }
  return Reply(engine_->GraphBreaks(*req), resp);
}

}  // namespace kiln::server
