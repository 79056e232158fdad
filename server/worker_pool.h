// A fixed set of threads behind a bounded queue: the services' executors
// (server/services.h), one for Compile requests and one for Lookups. Submit
// never blocks: a full queue is RESOURCE_EXHAUSTED, so a burst of requests is
// refused rather than piling up without bound. Thread-safe.
#ifndef KILN_SERVER_WORKER_POOL_H_
#define KILN_SERVER_WORKER_POOL_H_

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace kiln::server {

class WorkerPool {
 public:
  // `queue` names the queue and its setting in a refusal, e.g.
  // "lookup queue (limits.max_queued_lookups)".
  WorkerPool(int workers, int queue_depth, std::string queue);
  // Runs what is queued, then joins the workers.
  ~WorkerPool();

  absl::Status Submit(std::function<void()> job);
  int queued() const;

 private:
  void Loop();

  const int queue_depth_;
  const std::string queue_name_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace kiln::server

#endif  // KILN_SERVER_WORKER_POOL_H_
