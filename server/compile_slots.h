// How many compiles run at once: `workers` slots, and at most `queue_depth`
// compiles waiting for one. A compile beyond is refused RESOURCE_EXHAUSTED,
// so a burst of misses is refused rather than piling up without bound.
//
// A compile runs on its request's own thread (the service's, see
// server/services.h) while it holds a slot: the slots bound the work, and no
// second pool takes the compile over. Thread-safe.
#ifndef KILN_SERVER_COMPILE_SLOTS_H_
#define KILN_SERVER_COMPILE_SLOTS_H_

#include <atomic>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace kiln::server {

class CompileSlots {
 public:
  // A slot held; given back when destroyed. Empty when the wait for one
  // was given up (see Acquire).
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept : slots_(other.slots_) { other.slots_ = nullptr; }
    Slot& operator=(Slot&&) = delete;
    ~Slot();
    bool held() const { return slots_ != nullptr; }

   private:
    friend class CompileSlots;
    explicit Slot(CompileSlots* slots) : slots_(slots) {}
    CompileSlots* slots_ = nullptr;
  };

  CompileSlots(int workers, int queue_depth);

  // Waits for a free slot. RESOURCE_EXHAUSTED, naming compile_queue_depth,
  // when queue_depth compiles wait already. When `*give_up` (may be null)
  // turns true while waiting, returns an empty Slot at once.
  absl::StatusOr<Slot> Acquire(const std::atomic<bool>* give_up);

  int waiting() const;

 private:
  void Release();

  const int workers_;
  const int queue_depth_;
  mutable absl::Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kiln::server

#endif  // KILN_SERVER_COMPILE_SLOTS_H_
