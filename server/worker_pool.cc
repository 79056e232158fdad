#include "server/worker_pool.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kiln::server {

WorkerPool::WorkerPool(int workers, int queue_depth, std::string queue)
    : queue_depth_(queue_depth), queue_name_(std::move(queue)) {
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  for (auto& t : threads_) t.join();
}

absl::Status WorkerPool::Submit(std::function<void()> job) {
  absl::MutexLock l(&mu_);
  if (stopping_) return absl::UnavailableError("the server is shutting down");
  if (static_cast<int>(queue_.size()) >= queue_depth_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the ", queue_name_, " is full (", queue_depth_, " waiting); retry later"));
  }
  queue_.push_back(std::move(job));
  return absl::OkStatus();
}

int WorkerPool::queued() const {
  absl::MutexLock l(&mu_);
  return static_cast<int>(queue_.size());
}

void WorkerPool::Loop() {
  while (true) {
    std::function<void()> job;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]()
                       ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, and nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
  }
}

}  // namespace kiln::server
