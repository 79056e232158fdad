// RETURN_IF_ERROR / ASSIGN_OR_RETURN for absl::Status and absl::StatusOr.
// Abseil 20220623 ships neither; this is the project's one family of them.
#ifndef KILN_COMMON_STATUS_MACROS_H_
#define KILN_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KILN_CONCAT_INNER_(a, b) a##b
#define KILN_CONCAT_(a, b) KILN_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                    \
  do {                                           \
    ::absl::Status kiln_status_ = (expr);        \
    if (!kiln_status_.ok()) return kiln_status_; \
  } while (false)

#define ASSIGN_OR_RETURN(lhs, rexpr) \
  KILN_ASSIGN_OR_RETURN_IMPL_(KILN_CONCAT_(kiln_statusor_, __LINE__), lhs, rexpr)

#define KILN_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                \
  if (!statusor.ok()) return statusor.status();           \
  lhs = std::move(statusor).value()

#endif  // KILN_COMMON_STATUS_MACROS_H_
