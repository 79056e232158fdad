#include "server/compile_slots.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace kiln::server {

CompileSlots::Slot::~Slot() {
  if (slots_ != nullptr) slots_->Release();
}

CompileSlots::CompileSlots(int workers, int queue_depth)
    : workers_(workers), queue_depth_(queue_depth) {}

absl::StatusOr<CompileSlots::Slot> CompileSlots::Acquire(const std::atomic<bool>* give_up) {
  absl::MutexLock l(&mu_);
  if (running_ < workers_ && waiting_ == 0) {
    ++running_;
    return Slot(this);
  }
  if (waiting_ >= queue_depth_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the compile queue (compile_queue_depth) is full (", queue_depth_,
                     " waiting); retry later"));
  }
  ++waiting_;
  auto free = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return running_ < workers_; };
  // `give_up` changes without the lock: look at it at least every 100 ms.
  bool gave_up = false;
  while (!mu_.AwaitWithTimeout(absl::Condition(&free), absl::Milliseconds(100))) {
    if (give_up != nullptr && give_up->load()) {
      gave_up = true;
      break;
    }
  }
  --waiting_;
  if (gave_up) return Slot();
  ++running_;
  return Slot(this);
}

int CompileSlots::waiting() const {
  absl::MutexLock l(&mu_);
  return waiting_;
}

void CompileSlots::Release() {
  absl::MutexLock l(&mu_);
  --running_;
}

}  // namespace kiln::server
