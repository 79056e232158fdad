#include "server/tenant_limits.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kiln::server {

TenantLimits::Admission& TenantLimits::Admission::operator=(Admission&& other) noexcept {
  if (this != &other) {
    Release();
    owner_ = std::exchange(other.owner_, nullptr);
    tenant_ = std::move(other.tenant_);
    bytes_ = other.bytes_;
  }
  return *this;
}

void TenantLimits::Admission::Release() {
  if (owner_ != nullptr) std::exchange(owner_, nullptr)->Release(tenant_, bytes_);
}

absl::StatusOr<TenantLimits::Admission> TenantLimits::Admit(const std::string& tenant,
                                                            int64_t bytes) {
  auto refuse = [&](absl::string_view what, bool retry = true) {
    return absl::ResourceExhaustedError(
        absl::StrCat("namespace '", tenant.substr(0, 64), "': ", what,
                     retry ? "; retry when some have finished" : ""));
  };
  {
    absl::MutexLock l(&mu_);
    Use& use = use_[tenant];
    if (use.requests >= max_requests_) {
      return refuse(absl::StrCat(use.requests,
                                 " compile requests in flight, the limit "
                                 "(limits.max_compiles_per_tenant) is ",
                                 max_requests_));
    }
    if (use.bytes + bytes > max_bytes_) {
      const int64_t held = use.bytes;
      const bool alone = use.requests == 0;
      if (alone) use_.erase(tenant);
      if (alone) {
        return refuse(absl::StrCat("this request's ", bytes,
                                   " bytes are over the limit "
                                   "(limits.max_queued_bytes_per_tenant) of ",
                                   max_bytes_),
                      /*retry=*/false);
      }
      return refuse(absl::StrCat("this request's ", bytes, " bytes on top of the ", held,
                                 " in flight pass the limit (limits.max_queued_bytes_per_tenant) "
                                 "of ",
                                 max_bytes_));
    }
    ++use.requests;
    use.bytes += bytes;
  }
  Admission a;
  a.owner_ = this;
  a.tenant_ = tenant;
  a.bytes_ = bytes;
  return a;
}

void TenantLimits::Release(const std::string& tenant, int64_t bytes) {
  absl::MutexLock l(&mu_);
  auto it = use_.find(tenant);
  if (it == use_.end()) return;
  it->second.bytes -= bytes;
  if (--it->second.requests == 0) use_.erase(it);
}

int64_t TenantLimits::in_flight(const std::string& tenant) const {
  absl::MutexLock l(&mu_);
  auto it = use_.find(tenant);
  return it == use_.end() ? 0 : it->second.requests;
}

}  // namespace kiln::server
