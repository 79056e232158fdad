// kilnd's configuration: the text-format kiln.v1.ServerConfig (--config),
// its defaults and its checks. main.cc lays the command line's flags over
// the parsed file, then calls FinishConfig. Pure functions; thread-safe.
#ifndef KILN_SERVER_CONFIG_H_
#define KILN_SERVER_CONFIG_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cache/guards.h"
#include "compiler/ir/limits.h"
#include "kiln/v1/config.pb.h"

namespace kiln::server {

// Parses a configuration file's text. A syntax error or an unknown field is
// INVALID_ARGUMENT naming the line and column of the first one.
absl::StatusOr<v1::ServerConfig> ParseConfig(absl::string_view text);

// Fills in the default of every field left 0 or empty (the comments in
// config.proto give them), then checks every value: the listen address, the
// ranges of the numbers, and each limit against its ceiling
// (compiler/ir/limits.h). An error is INVALID_ARGUMENT naming the field,
// e.g. "limits.max_rank: 100 is over its ceiling of 64".
absl::Status FinishConfig(v1::ServerConfig* config);

// The limits of a finished configuration, as the engine enforces them.
ir::GraphLimits GraphLimitsOf(const v1::Limits& limits);
cache::ExprLimits ExprLimitsOf(const v1::Limits& limits);

}  // namespace kiln::server

#endif  // KILN_SERVER_CONFIG_H_
