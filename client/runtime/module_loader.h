// ModuleLoader: loads the shared objects of CompiledModules (language "c++")
// into this process, straight from their bytes, and finds their symbols.
//
// A binary is written to an anonymous memory file (memfd_create) and opened
// with dlopen("/proc/self/fd/N", RTLD_NOW | RTLD_LOCAL): nothing touches the
// file system, and each module's symbols stay private to its handle, so two
// modules may define kernels of the same name. Loaded modules are cached by
// the SHA-256 of their bytes: a binary is loaded once per loader, however
// many plans use it. ModuleLoader::Shared() is the process-wide loader the
// plan executor uses by default, so a module is loaded once per process.
//
// Lifetimes: a LoadedModule is shared by the loader's cache and by everyone
// it was returned to; the object is unloaded (dlclose) when the last of them
// drops it. Function pointers from Symbol() are valid while the LoadedModule
// is alive. The shared loader keeps what it loaded for the process lifetime.
//
// Thread-safe: Load, loads() and LoadedModule::Symbol may be called
// concurrently.
#ifndef KILN_CLIENT_RUNTIME_MODULE_LOADER_H_
#define KILN_CLIENT_RUNTIME_MODULE_LOADER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace kiln::runtime {

// One shared object loaded with dlopen. Immutable.
class LoadedModule {
 public:
  LoadedModule(const LoadedModule&) = delete;
  LoadedModule& operator=(const LoadedModule&) = delete;
  ~LoadedModule();

  // The address of `name` in this module (dlsym). NOT_FOUND naming the
  // symbol when the module does not define it.
  absl::StatusOr<void*> Symbol(absl::string_view name) const;

  // Hex SHA-256 of the binary.
  const std::string& digest() const { return digest_; }

 private:
  friend class ModuleLoader;
  LoadedModule(void* handle, int fd, std::string path, std::string digest)
      : handle_(handle), fd_(fd), path_(std::move(path)), digest_(std::move(digest)) {}

  void* handle_;      // from dlopen
  int fd_;            // the memfd the object was opened from; open while loaded
  std::string path_;  // "/proc/self/fd/N"
  std::string digest_;
};

class ModuleLoader {
 public:
  ModuleLoader() = default;
  ModuleLoader(const ModuleLoader&) = delete;
  ModuleLoader& operator=(const ModuleLoader&) = delete;
  ~ModuleLoader();

  // The process-wide loader.
  static ModuleLoader& Shared();

  // The module whose shared object is `binary`: the cached one when a binary
  // with the same SHA-256 was loaded before, else a newly loaded one.
  // INVALID_ARGUMENT for an empty binary; INTERNAL with the system's or
  // dlopen's message when it cannot be loaded.
  absl::StatusOr<std::shared_ptr<const LoadedModule>> Load(absl::string_view binary)
      ABSL_LOCKS_EXCLUDED(mu_);

  // How many binaries this loader has opened with dlopen (for tests: a
  // cache hit does not count).
  int64_t loads() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<const LoadedModule>> modules_ ABSL_GUARDED_BY(mu_);
  int64_t loads_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kiln::runtime

#endif  // KILN_CLIENT_RUNTIME_MODULE_LOADER_H_
