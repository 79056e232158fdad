// ThreadSanitizer annotations for Debian's uninstrumented Abseil synchronization.
//
// Linked into every executable of a ThreadSanitizer build (KILN_SANITIZE
// contains "thread"; see tests/tsan/CMakeLists.txt), never into other builds.
//
// Debian's libabsl_synchronization.so is not built with -fsanitize=thread, so
// TSan cannot see that absl::Mutex orders the accesses it guards: without this
// file every guarded access that two threads make is reported as a race. This
// file defines the out-of-line entry points of absl::Mutex, absl::CondVar and
// absl::Notification that the project and Debian's gRPC call (`nm -DC
// --undefined-only` on the executables, libgrpc, libgrpc++ and libgpr). The
// definitions in the executable come first in the dynamic linker's search, so
// they also take the calls that those shared libraries make (the executables
// export them: tests/tsan/CMakeLists.txt). Each forwards to Abseil's own
// function, found with dlsym(RTLD_NEXT), and tells TSan about the
// happens-before edge it implies:
//   - unlocking a mutex (or waiting on it, which unlocks it) releases the
//     mutex's address, __tsan_release(mu), before Abseil's unlock runs;
//   - locking it (or returning from a wait, which locks it) acquires the
//     address, __tsan_acquire(mu), after Abseil's lock returned;
//   - a Condition that Abseil evaluates inside a lock, unlock or wait runs
//     between an acquire and a release of the mutex: it reads the state the
//     mutex guards, and Abseil may evaluate it on the thread that unlocks the
//     mutex, in the middle of that thread's Unlock();
//   - Notify() releases the notification, and a wait that returned true
//     acquires it; HasBeenNotified() is inline (an acquire load of the
//     notification's flag, instrumented), so Notify() releases the flag's
//     address too.
// absl::Status's reference count is the one entry point not forwarded but
// compiled here (Status::UnrefNonInlined, at the end of this file).
// Reader locks are annotated like writer locks, so two readers are ordered
// too: a race between two threads that both hold the mutex in shared mode can
// go unreported (the project takes no reader locks today). Abseil's internal
// SpinLock (libgpr calls SpinLockWait) is used only inside the uninstrumented
// libraries and is not annotated.
//
// Pinned to Abseil 20220623 (Debian 12): the mangled names below carry its
// inline namespace, debian3. A name that Abseil does not define aborts the
// process at the first call, naming the symbol.
// tests/tsan/absl_tsan_shim_test.cc checks that a false race disappears and
// that a real one is still reported.
//
// Thread-safe: every function may be called from any thread, like Abseil's.

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

// Abseil's definition of `mangled`: the next one after this executable's.
template <typename Fn>
Fn Real(const char* mangled) {
  void* sym = dlsym(RTLD_NEXT, mangled);
  if (sym == nullptr) {
    std::fprintf(stderr, "absl_tsan_shim: no %s after the executable: %s\n", mangled, dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(sym);
}

void Acquire(const void* addr) { __tsan_acquire(const_cast<void*>(addr)); }
void Release(const void* addr) { __tsan_release(const_cast<void*>(addr)); }

// A Condition that Abseil evaluates with the guarded state visible to TSan.
// Abseil may evaluate it on another thread (the one that unlocks the mutex),
// which reads this object and the caller's Condition: condition() publishes
// them to that thread. It uses Condition's non-template constructor, whose
// caller (Condition::CallVoidPtrFunction) is inside Abseil and so reads the
// returned Condition unseen.
class AnnotatedCondition {
 public:
  AnnotatedCondition(const absl::Mutex* mu, const absl::Condition* cond) : mu_(mu), cond_(cond) {}

  absl::Condition condition() {
    Release(this);
    return absl::Condition(&AnnotatedCondition::Eval, this);
  }

 private:
  static bool Eval(void* arg) {
    Acquire(arg);
    const auto* self = static_cast<const AnnotatedCondition*>(arg);
    Acquire(self->mu_);
    const bool result = self->cond_->Eval();
    Release(self->mu_);
    return result;
  }

  const absl::Mutex* mu_;
  const absl::Condition* cond_;
};

// absl::Notification is `Mutex mutex_; std::atomic<bool> notified_yet_;`
// (absl/synchronization/notification.h, 20220623).
struct NotificationLayout {
  absl::Mutex mutex;
  std::atomic<bool> notified_yet;
};
static_assert(sizeof(NotificationLayout) == sizeof(absl::Notification),
              "absl::Notification's layout changed: update NotifiedYet()");
const void* NotifiedYet(const absl::Notification* n) {
  return reinterpret_cast<const char*>(n) + sizeof(absl::Mutex);
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

// Member functions are called as functions whose first argument is `this`
// (the Itanium C++ ABI).

void Mutex::Lock() {
  static const auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex4LockEv");
  real(this);
  Acquire(this);
}

void Mutex::ReaderLock() {
  static const auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex10ReaderLockEv");
  real(this);
  Acquire(this);
}

bool Mutex::TryLock() {
  static const auto real = Real<bool (*)(Mutex*)>("_ZN4absl7debian35Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

bool Mutex::ReaderTryLock() {
  static const auto real = Real<bool (*)(Mutex*)>("_ZN4absl7debian35Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

void Mutex::Unlock() {
  static const auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex6UnlockEv");
  Release(this);
  real(this);
}

void Mutex::ReaderUnlock() {
  static const auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex12ReaderUnlockEv");
  Release(this);
  real(this);
}

void Mutex::LockWhen(const Condition& cond) {
  static const auto real =
      Real<void (*)(Mutex*, const Condition&)>("_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  AnnotatedCondition annotated(this, &cond);
  real(this, annotated.condition());
  Acquire(this);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  static const auto real = Real<void (*)(Mutex*, const Condition&)>(
      "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  AnnotatedCondition annotated(this, &cond);
  real(this, annotated.condition());
  Acquire(this);
}

// The *WithTimeout and *WithDeadline forms hold the mutex on return whatever
// they return.
bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  AnnotatedCondition annotated(this, &cond);
  const bool result = real(this, annotated.condition(), timeout);
  Acquire(this);
  return result;
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  AnnotatedCondition annotated(this, &cond);
  const bool result = real(this, annotated.condition(), timeout);
  Acquire(this);
  return result;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  AnnotatedCondition annotated(this, &cond);
  const bool result = real(this, annotated.condition(), deadline);
  Acquire(this);
  return result;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  AnnotatedCondition annotated(this, &cond);
  const bool result = real(this, annotated.condition(), deadline);
  Acquire(this);
  return result;
}

// Await* may release the mutex and take it again.
void Mutex::Await(const Condition& cond) {
  static const auto real =
      Real<void (*)(Mutex*, const Condition&)>("_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  AnnotatedCondition annotated(this, &cond);
  Release(this);
  real(this, annotated.condition());
  Acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Duration)>(
      "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  AnnotatedCondition annotated(this, &cond);
  Release(this);
  const bool result = real(this, annotated.condition(), timeout);
  Acquire(this);
  return result;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  AnnotatedCondition annotated(this, &cond);
  Release(this);
  const bool result = real(this, annotated.condition(), deadline);
  Acquire(this);
  return result;
}

void CondVar::Wait(Mutex* mu) {
  static const auto real =
      Real<void (*)(CondVar*, Mutex*)>("_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  Release(mu);
  real(this, mu);
  Acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  static const auto real = Real<bool (*)(CondVar*, Mutex*, absl::Duration)>(
      "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Release(mu);
  const bool result = real(this, mu, timeout);
  Acquire(mu);
  return result;
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  static const auto real = Real<bool (*)(CondVar*, Mutex*, absl::Time)>(
      "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Release(mu);
  const bool result = real(this, mu, deadline);
  Acquire(mu);
  return result;
}

void Notification::Notify() {
  static const auto real = Real<void (*)(Notification*)>("_ZN4absl7debian312Notification6NotifyEv");
  Release(this);
  Release(NotifiedYet(this));
  real(this);
}

void Notification::WaitForNotification() const {
  static const auto real =
      Real<void (*)(const Notification*)>("_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  Acquire(this);
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  static const auto real = Real<bool (*)(const Notification*, absl::Duration)>(
      "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool notified = real(this, timeout);
  if (notified) Acquire(this);
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  static const auto real = Real<bool (*)(const Notification*, absl::Time)>(
      "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool notified = real(this, deadline);
  if (notified) Acquire(this);
  return notified;
}

// absl::Status shares its message between copies under a reference count:
// Ref() is inline (instrumented), but the decrement and the delete happen in
// the library's UnrefNonInlined(), which TSan does not see, so a copy's read
// of the message looked unordered with the delete by the thread that drops
// the last copy. Defined here instead, with the same contract (drop one
// reference; the last one deletes the representation), in instrumented code.
void Status::UnrefNonInlined(uintptr_t rep) {
  status_internal::StatusRep* shared = RepToPointer(rep);
  // The sole owner needs no atomic decrement; anyone else takes one, and the
  // thread that takes the count to zero deletes.
  const bool last = shared->ref.load(std::memory_order_acquire) == 1 ||
                    shared->ref.fetch_sub(1, std::memory_order_acq_rel) == 1;
  if (last) delete shared;
}

ABSL_NAMESPACE_END
}  // namespace absl
