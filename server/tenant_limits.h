// Per-tenant admission of Compile requests: at most N requests of one
// namespace in flight at once, holding at most B bytes of requests between
// them, so that one tenant's burst cannot take every compile slot and the
// memory behind them from the others. Thread-safe.
#ifndef KILN_SERVER_TENANT_LIMITS_H_
#define KILN_SERVER_TENANT_LIMITS_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace kiln::server {

class TenantLimits {
 public:
  TenantLimits(int64_t max_requests, int64_t max_bytes)
      : max_requests_(max_requests), max_bytes_(max_bytes) {}

  // A request's hold on its tenant's share; released when destroyed.
  class Admission {
   public:
    Admission() = default;
    Admission(Admission&& other) noexcept { *this = std::move(other); }
    Admission& operator=(Admission&& other) noexcept;
    ~Admission() { Release(); }

   private:
    friend class TenantLimits;
    void Release();
    TenantLimits* owner_ = nullptr;
    std::string tenant_;
    int64_t bytes_ = 0;
  };

  // Admits a request of `bytes` for `tenant`, or RESOURCE_EXHAUSTED naming
  // the tenant (its first 64 characters), the limit's configuration field and
  // the tenant's use of it.
  absl::StatusOr<Admission> Admit(const std::string& tenant, int64_t bytes);

  // Requests of `tenant` admitted and not yet released.
  int64_t in_flight(const std::string& tenant) const;

 private:
  struct Use {
    int64_t requests = 0;
    int64_t bytes = 0;
  };
  void Release(const std::string& tenant, int64_t bytes);

  const int64_t max_requests_;
  const int64_t max_bytes_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Use> use_ ABSL_GUARDED_BY(mu_);  // tenants in flight only
};

}  // namespace kiln::server

#endif  // KILN_SERVER_TENANT_LIMITS_H_
