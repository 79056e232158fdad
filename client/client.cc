#include "client/client.h"

#include <algorithm>
#include <climits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/status_macros.h"
#include "compiler/ir/canonical.h"
#include "compiler/ir/graph.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/slice.h"
#include "grpcpp/support/stub_options.h"

namespace kiln {
namespace {

constexpr char kHealthCheckMethod[] = "/grpc.health.v1.Health/Check";

// The one place a grpc::Status becomes an absl::Status. The numeric codes of
// the two enums are the same (both are google.rpc.Code).
absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// grpc.health.v1.HealthCheckResponse.ServingStatus, by number.
std::string ServingStatusName(uint64_t status) {
  switch (status) {
    case 0:
      return "UNKNOWN";
    case 1:
      return "SERVING";
    case 2:
      return "NOT_SERVING";
    case 3:
      return "SERVICE_UNKNOWN";
    default:
      return absl::StrCat("status ", status);
  }
}

// Reads field 1 (ServingStatus, a varint) of a serialized
// HealthCheckResponse; absent means 0 (UNKNOWN), as proto3 encodes it.
absl::StatusOr<uint64_t> ParseServingStatus(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (buffer.Valid()) {
    if (!buffer.Dump(&slices).ok()) {
      return absl::InternalError("health check: cannot read the response");
    }
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  google::protobuf::UnknownFieldSet fields;
  if (!fields.ParseFromString(bytes)) {
    return absl::InternalError("health check: malformed HealthCheckResponse");
  }
  uint64_t status = 0;
  for (int i = 0; i < fields.field_count(); ++i) {
    const google::protobuf::UnknownField& f = fields.field(i);
    if (f.number() == 1 && f.type() == google::protobuf::UnknownField::TYPE_VARINT) {
      status = f.varint();
    }
  }
  return status;
}

// The largest sleep the retry schedule can reach, so that gRPC's own
// reconnect backoff never outlasts ours (its default starts at 1 s).
int64_t LargestBackoffMillis(const ClientOptions& o) {
  absl::Duration b = o.initial_backoff;
  for (int i = 2; i < o.max_attempts && b < absl::Seconds(30); ++i) b *= 2;
  return std::clamp<int64_t>(absl::ToInt64Milliseconds(b), 1, 30'000);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("ClientOptions.address is empty");
  }
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.max_attempts must be >= 1, got ", options.max_attempts));
  }
  if (options.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("ClientOptions.deadline must be positive, got ",
                                                   absl::FormatDuration(options.deadline)));
  }
  if (options.initial_backoff < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.initial_backoff must not be negative, got ",
                     absl::FormatDuration(options.initial_backoff)));
  }
  if (options.max_message_bytes == 0 || options.max_message_bytes > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.max_message_bytes must be in [1, ", INT_MAX, "], got ",
                     options.max_message_bytes));
  }

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  // Our retry loop is the only retry policy.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  // Let a retry find a restarted server: reconnect on our schedule, not on
  // gRPC's (1 s, growing to 2 min).
  args.SetInt(
      GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
      static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(options.initial_backoff))));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(LargestBackoffMillis(options)));

  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options.tls_root_certs.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_certs;
    ssl.pem_cert_chain = options.tls_cert;
    ssl.pem_private_key = options.tls_key;
    credentials = grpc::SslCredentials(ssl);
  }
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.address, credentials, args);
  if (channel == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create a channel to '", options.address, "'"));
  }
  return std::unique_ptr<Client>(new Client(std::move(options), std::move(channel)));
}

Client::Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      compiler_(v1::Compiler::NewStub(channel_)),
      admin_(v1::Admin::NewStub(channel_)),
      generic_(std::make_unique<grpc::GenericStub>(channel_)) {}

Client::~Client() = default;

absl::StatusOr<std::string> Client::Key(const v1::Graph& graph, const v1::CompileOptions& options) {
  ASSIGN_OR_RETURN(ir::Graph g, ir::Graph::FromProto(graph));
  return ir::CacheKey(g, options);
}

absl::Status Client::Call(const std::function<grpc::Status(grpc::ClientContext*)>& attempt) const {
  const absl::Time deadline = absl::Now() + options_.deadline;
  absl::Duration backoff = options_.initial_backoff;
  grpc::Status status;
  for (int n = 1;; ++n) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    if (!options_.token.empty()) context.AddMetadata("authorization", "Bearer " + options_.token);
    status = attempt(&context);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    if (n >= options_.max_attempts) break;
    if (absl::Now() + backoff >= deadline) break;  // the next attempt could not start
    absl::SleepFor(backoff);
    backoff *= 2;
  }
  return FromGrpcStatus(status);
}

absl::StatusOr<v1::CompileResponse> Client::Compile(const v1::CompileRequest& request) const {
  v1::CompileResponse response;
  RETURN_IF_ERROR(
      Call([&](grpc::ClientContext* c) { return compiler_->Compile(c, request, &response); }));
  return response;
}

absl::StatusOr<v1::LookupResponse> Client::Lookup(const v1::LookupRequest& request) const {
  v1::LookupResponse response;
  RETURN_IF_ERROR(
      Call([&](grpc::ClientContext* c) { return compiler_->Lookup(c, request, &response); }));
  return response;
}

absl::StatusOr<v1::LookupResponse> Client::LookupGraph(const v1::Graph& graph,
                                                       const v1::CompileOptions& options,
                                                       const v1::InputSignature& signature,
                                                       const std::string& ns,
                                                       bool include_artifact) const {
  ASSIGN_OR_RETURN(std::string key, Key(graph, options));
  v1::LookupRequest request;
  request.set_key(std::move(key));
  *request.mutable_signature() = signature;
  request.set_namespace_(ns);
  request.set_include_artifact(include_artifact);
  return Lookup(request);
}

absl::StatusOr<v1::GetArtifactResponse> Client::GetArtifact(const std::string& digest,
                                                            const std::string& ns) const {
  v1::GetArtifactRequest request;
  request.set_digest(digest);
  request.set_namespace_(ns);
  v1::GetArtifactResponse response;
  RETURN_IF_ERROR(
      Call([&](grpc::ClientContext* c) { return compiler_->GetArtifact(c, request, &response); }));
  return response;
}

absl::StatusOr<v1::StatsResponse> Client::Stats() const {
  v1::StatsResponse response;
  RETURN_IF_ERROR(Call(
      [&](grpc::ClientContext* c) { return admin_->Stats(c, v1::StatsRequest(), &response); }));
  return response;
}

absl::StatusOr<v1::FreezeResponse> Client::Freeze() const {
  v1::FreezeResponse response;
  RETURN_IF_ERROR(Call(
      [&](grpc::ClientContext* c) { return admin_->Freeze(c, v1::FreezeRequest(), &response); }));
  return response;
}

absl::StatusOr<v1::ThawResponse> Client::Thaw() const {
  v1::ThawResponse response;
  RETURN_IF_ERROR(
      Call([&](grpc::ClientContext* c) { return admin_->Thaw(c, v1::ThawRequest(), &response); }));
  return response;
}

absl::StatusOr<v1::ListEntriesResponse> Client::ListEntries(const std::string& ns) const {
  v1::ListEntriesRequest request;
  request.set_namespace_(ns);
  v1::ListEntriesResponse response;
  RETURN_IF_ERROR(
      Call([&](grpc::ClientContext* c) { return admin_->ListEntries(c, request, &response); }));
  return response;
}

absl::StatusOr<v1::ListFailuresResponse> Client::ListFailures(const std::string& ns) const {
  v1::ListFailuresRequest request;
  request.set_namespace_(ns);
  v1::ListFailuresResponse response;
  RETURN_IF_ERROR(
      Call([&](grpc::ClientContext* c) { return admin_->ListFailures(c, request, &response); }));
  return response;
}

absl::StatusOr<v1::GetFailureResponse> Client::GetFailure(const std::string& id,
                                                          const std::string& ns) const {
  v1::GetFailureRequest request;
  request.set_id(id);
  request.set_namespace_(ns);
  v1::GetFailureResponse response;
  RETURN_IF_ERROR(
      Call([&](grpc::ClientContext* c) { return admin_->GetFailure(c, request, &response); }));
  return response;
}

absl::StatusOr<v1::GraphBreaksResponse> Client::GraphBreaks(const std::string& ns,
                                                            const std::string& job) const {
  v1::GraphBreaksRequest request;
  request.set_namespace_(ns);
  request.set_job(job);
  v1::GraphBreaksResponse response;
  RETURN_IF_ERROR(
      Call([&](grpc::ClientContext* c) { return admin_->GraphBreaks(c, request, &response); }));
  return response;
}

absl::StatusOr<v1::GetEntryResponse> Client::GetEntry(const std::string& key,
                                                      const std::string& ns) const {
  v1::GetEntryRequest request;
  request.set_key(key);
  request.set_namespace_(ns);
  v1::GetEntryResponse response;
  RETURN_IF_ERROR(
      Call([&](grpc::ClientContext* c) { return admin_->GetEntry(c, request, &response); }));
  return response;
}

absl::StatusOr<v1::EvictResponse> Client::Evict(const std::string& key,
                                                const std::string& ns) const {
  v1::EvictRequest request;
  request.set_key(key);
  request.set_namespace_(ns);
  v1::EvictResponse response;
  RETURN_IF_ERROR(
      Call([&](grpc::ClientContext* c) { return admin_->Evict(c, request, &response); }));
  return response;
}

absl::Status Client::Health() const {
  // The health proto's C++ stubs are not installed with Debian's gRPC, so the
  // call goes through the generic stub: HealthCheckRequest{service: ""}
  // serializes to zero bytes.
  grpc::Slice empty;
  const grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  RETURN_IF_ERROR(Call([&](grpc::ClientContext* c) {
    response.Clear();
    absl::Notification done;
    grpc::Status result;
    generic_->UnaryCall(c, kHealthCheckMethod, grpc::StubOptions(), &request, &response,
                        [&](grpc::Status s) {
                          result = std::move(s);
                          done.Notify();
                        });
    done.WaitForNotification();
    return result;
  }));
  ASSIGN_OR_RETURN(uint64_t status, ParseServingStatus(response));
  if (status != 1) {
    return absl::UnavailableError(
        absl::StrCat("health check: server is ", ServingStatusName(status)));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::InputSignature> SignatureFromMetadata(const v1::Graph& graph) {
  v1::InputSignature signature;
  for (int i = 0; i < graph.inputs_size(); ++i) {
    const v1::Value& value = graph.inputs(i).value();
    const v1::TensorMeta& meta = value.meta();
    const std::string who = absl::StrCat("input ", i, " ('", value.name(), "')");
    auto symbolic = [&](const std::string& what, const ir::SymInt& s) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, " has symbolic ", what, " ", s.ToString(),
          ": its metadata is not a concrete signature; pass the signature of the actual inputs"));
    };
    v1::TensorSignature* t = signature.add_inputs();
    t->set_dtype(meta.dtype());
    *t->mutable_device() = meta.device();
    t->set_requires_grad(meta.requires_grad());
    for (int d = 0; d < meta.sizes_size(); ++d) {
      const ir::SymInt s = ir::SymIntFromProto(meta.sizes(d));
      if (!s.is_constant()) return symbolic(absl::StrCat("size at dim ", d), s);
      t->add_sizes(s.constant());
    }
    if (meta.strides_size() == 0) {
      // No strides recorded: the tensor is taken to be contiguous.
      std::vector<int64_t> strides(t->sizes_size());
      int64_t stride = 1;
      for (int d = t->sizes_size() - 1; d >= 0; --d) {
        strides[d] = stride;
        stride *= std::max<int64_t>(t->sizes(d), 1);
      }
      for (int64_t s : strides) t->add_strides(s);
    } else if (meta.strides_size() != meta.sizes_size()) {
      return absl::InvalidArgumentError(absl::StrCat(who, " has ", meta.sizes_size(), " sizes but ",
                                                     meta.strides_size(), " strides"));
    } else {
      for (int d = 0; d < meta.strides_size(); ++d) {
        const ir::SymInt s = ir::SymIntFromProto(meta.strides(d));
        if (!s.is_constant()) return symbolic(absl::StrCat("stride at dim ", d), s);
        t->add_strides(s.constant());
      }
    }
    if (meta.has_storage_offset()) {
      const ir::SymInt s = ir::SymIntFromProto(meta.storage_offset());
      if (!s.is_constant()) return symbolic("storage offset", s);
      t->set_storage_offset(s.constant());
    }
  }
  return signature;
}

}  // namespace kiln
