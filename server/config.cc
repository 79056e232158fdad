#include "server/config.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace kiln::server {
namespace {

class ConfigErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty()) {
      first_ =
          absl::StrCat("line ", line + 1, " column ", column + 1, ": ", message.substr(0, 200));
    }
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

// Each limit's default (for 0) and ceiling, by field name.
struct LimitRule {
  const char* field;
  uint64_t fallback;
  uint64_t ceiling;
};
constexpr LimitRule kLimitRules[] = {
    {"max_nodes", ir::kDefaultMaxNodes, UINT32_MAX},
    {"max_rank", ir::kMaxRank, ir::kMaxRank},
    {"max_elements", ir::kMaxElements, ir::kMaxElements},
    {"max_outputs_per_node", ir::kMaxOutputsPerNode, ir::kMaxOutputsPerNode},
    {"max_expr_length", ir::kMaxExprLength, ir::kMaxExprLength},
    {"max_expr_depth", ir::kMaxExprDepth, ir::kMaxExprDepth},
    {"max_waiting_compiles", 256, 4096},
    {"max_compiles_per_tenant", 32, 4096},
    {"max_queued_bytes_per_tenant", uint64_t{256} << 20, uint64_t{1} << 40},
    {"max_queued_lookups", 4096, 1 << 20},
};

absl::Status FinishLimits(v1::Limits* limits) {
  const google::protobuf::Descriptor* d = v1::Limits::descriptor();
  const google::protobuf::Reflection* r = v1::Limits::GetReflection();
  for (const LimitRule& rule : kLimitRules) {
    const google::protobuf::FieldDescriptor* f = d->FindFieldByName(rule.field);
    const bool wide = f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_UINT64;
    uint64_t v = wide ? r->GetUInt64(*limits, f) : r->GetUInt32(*limits, f);
    if (v == 0) v = rule.fallback;
    if (v > rule.ceiling) {
      return absl::InvalidArgumentError(
          absl::StrCat("limits.", rule.field, ": ", v, " is over its ceiling of ", rule.ceiling));
    }
    if (wide) {
      r->SetUInt64(limits, f, v);
    } else {
      r->SetUInt32(limits, f, static_cast<uint32_t>(v));
    }
  }
  if (limits->max_compiles_per_tenant() > limits->max_waiting_compiles()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "limits.max_compiles_per_tenant: ", limits->max_compiles_per_tenant(),
        " is over limits.max_waiting_compiles (", limits->max_waiting_compiles(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::ServerConfig> ParseConfig(absl::string_view text) {
  v1::ServerConfig config;
  google::protobuf::TextFormat::Parser parser;
  ConfigErrors errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &config)) {
    return absl::InvalidArgumentError(errors.first().empty() ? "not a text-format ServerConfig"
                                                             : errors.first());
  }
  return config;
}

absl::Status FinishConfig(v1::ServerConfig* config) {
  if (config->listen().empty()) config->set_listen("127.0.0.1:50051");
  if (config->data_dir().empty()) {
    const char* home = std::getenv("HOME");
    config->set_data_dir(absl::StrCat(home ? home : ".", "/.local/share/kiln"));
  }
  if (config->max_message_bytes() == 0) config->set_max_message_bytes(64ull << 20);
  if (config->compile_workers() == 0) {
    config->set_compile_workers(std::max(1u, std::thread::hardware_concurrency()));
  }
  if (config->compile_queue_depth() == 0) config->set_compile_queue_depth(64);
  if (config->cache_byte_budget() == 0) config->set_cache_byte_budget(8ull << 30);
  if (config->artifact_memory_bytes() == 0) config->set_artifact_memory_bytes(256ull << 20);
  if (config->cache_size_limit() == 0) config->set_cache_size_limit(8);
  if (config->stats_flush_millis() == 0) config->set_stats_flush_millis(1000);

  const std::string& listen = config->listen();
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen: '", listen.substr(0, 200), "' is not HOST:PORT"));
  }
  if (config->artifact_memory_bytes() > (64ull << 30)) {
    return absl::InvalidArgumentError("artifact_memory_bytes: at most 64 GiB");
  }
  if (config->max_message_bytes() > (1ull << 30)) {
    return absl::InvalidArgumentError("max_message_bytes: at most 1 GiB");
  }
  if (config->compile_workers() > 1024) {
    return absl::InvalidArgumentError("compile_workers: at most 1024");
  }
  if (config->tls_key_file().empty() != config->tls_cert_file().empty()) {
    return absl::InvalidArgumentError(
        "tls_cert_file and tls_key_file: give both (TLS) or neither (plaintext)");
  }
  if (!config->tls_client_ca_file().empty() && config->tls_cert_file().empty()) {
    return absl::InvalidArgumentError(
        "tls_client_ca_file: mutual TLS needs tls_cert_file and tls_key_file too");
  }
  return FinishLimits(config->mutable_limits());
}

ir::GraphLimits GraphLimitsOf(const v1::Limits& limits) {
  ir::GraphLimits g;
  g.max_nodes = limits.max_nodes();
  g.max_rank = limits.max_rank();
  g.max_elements = static_cast<int64_t>(limits.max_elements());
  g.max_outputs_per_node = limits.max_outputs_per_node();
  g.max_expr_length = limits.max_expr_length();
  return g;
}

cache::ExprLimits ExprLimitsOf(const v1::Limits& limits) {
  cache::ExprLimits e;
  e.max_length = limits.max_expr_length();
  e.max_depth = limits.max_expr_depth();
  return e;
}

}  // namespace kiln::server
