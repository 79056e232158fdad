// Compiled kernels kept in memory by their code, so that a kernel met again
// in another graph is not compiled again: the forward of a training graph
// and the inference graph of the same model, a graph recompiled for a new
// size whose other kernels stay the same, two models built of the same
// layers. The graph-level cache (cache/cache.h) keys whole graphs; this one
// sits under it, in one kilnd process, and holds modules of one kernel.
//
// A kernel's key is the digest of what decides its binary: the backend's
// CompileIdentity() and the translation unit of that kernel alone,
// generated under a fixed name, with the comments left out (they name the
// graph's nodes, which differ between graphs whose code is the same). A hit
// hands back the module as it was compiled, under the name of the kernel
// it was compiled for; the plan launches that name (CompileModules reports
// the renames).
//
// Bounded by the bytes of the modules it holds (source and binary): the
// least recently used go first. Thread-safe.
#ifndef KILN_COMPILER_CODEGEN_KERNEL_CACHE_H_
#define KILN_COMPILER_CODEGEN_KERNEL_CACHE_H_

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "compiler/codegen/codegen.h"
#include "compiler/loop/kernel.h"
#include "kiln/v1/artifact.pb.h"

namespace kiln::codegen {

// `source` without its comments (// to the end of the line, /* to */),
// string and character literals kept whole. A comment becomes one space,
// so that tokens on either side stay apart.
std::string StripComments(absl::string_view source);

// The key of `kernel` compiled alone by `backend` with the plan's
// `symbols`.
absl::StatusOr<std::string> KernelKey(const CodegenBackend& backend, const loop::Kernel& kernel,
                                      const std::vector<std::string>& symbols);

class KernelCache {
 public:
  // A module of one kernel, and the name that kernel has in it.
  struct Entry {
    v1::CompiledModule module;
    std::string symbol;
  };
  struct Stats {
    int64_t hits = 0;
    int64_t misses = 0;
    int64_t entries = 0;
    int64_t bytes = 0;
    int64_t evictions = 0;
  };

  explicit KernelCache(int64_t capacity_bytes) : capacity_(capacity_bytes) {}
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // The entry under `key`, now the most recently used; counts a hit or a
  // miss.
  std::optional<Entry> Find(const std::string& key);
  // Keeps `entry` under `key` (replacing what was there), then drops the
  // least recently used entries while the total is over the capacity. An
  // entry larger than the whole capacity is not kept.
  void Insert(const std::string& key, Entry entry);
  Stats stats() const;
  int64_t capacity() const { return capacity_; }

 private:
  using Item = std::pair<std::string, Entry>;
  static int64_t Bytes(const Item& item);

  const int64_t capacity_;
  mutable absl::Mutex mu_;
  std::list<Item> items_ ABSL_GUARDED_BY(mu_);  // the most recently used first
  absl::flat_hash_map<std::string, std::list<Item>::iterator> index_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kiln::codegen

#endif  // KILN_COMPILER_CODEGEN_KERNEL_CACHE_H_
