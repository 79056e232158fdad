// ModuleLoader (module_loader.h).
//
// The dynamic linker recognizes an object it already has by the path it was
// opened with, so a path "/proc/self/fd/N" must name one object only while
// that object is loaded: the memfd stays open (its number taken) until the
// object is unloaded, and if dlclose leaves the object resident (as a
// STB_GNU_UNIQUE symbol makes it) the number is never given back. Load also
// checks that the path is free before opening it.
#include "client/runtime/module_loader.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/hashing.h"

namespace kiln::runtime {
namespace {

std::string DlError() {
  const char* e = dlerror();
  return e != nullptr ? e : "unknown dlopen error";
}

std::string FdPath(int fd) { return absl::StrCat("/proc/self/fd/", fd); }

// Whether the dynamic linker already has an object opened as `path`.
bool PathIsLoaded(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (handle == nullptr) return false;
  dlclose(handle);
  return true;
}

absl::Status WriteAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("writing a module to its memfd: ", strerror(errno)));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

LoadedModule::~LoadedModule() {
  dlclose(handle_);
  // Still resident: keep the descriptor, so that no other object is ever
  // opened under this object's path.
  if (PathIsLoaded(path_)) return;
  close(fd_);
}

absl::StatusOr<void*> LoadedModule::Symbol(absl::string_view name) const {
  const std::string n(name);
  dlerror();  // clear
  void* address = dlsym(handle_, n.c_str());
  if (address == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("module ", digest_.substr(0, 12), " defines no symbol '", n, "'"));
  }
  return address;
}

ModuleLoader::~ModuleLoader() = default;

ModuleLoader& ModuleLoader::Shared() {
  static ModuleLoader* const loader = new ModuleLoader();  // never destroyed
  return *loader;
}

int64_t ModuleLoader::loads() const {
  absl::MutexLock lock(&mu_);
  return loads_;
}

absl::StatusOr<std::shared_ptr<const LoadedModule>> ModuleLoader::Load(absl::string_view binary) {
  if (binary.empty()) return absl::InvalidArgumentError("the module's binary is empty");
  std::string digest = Sha256Hex(binary);

  absl::MutexLock lock(&mu_);
  auto it = modules_.find(digest);
  if (it != modules_.end()) return it->second;

  int fd = memfd_create("kiln-module", MFD_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("memfd_create: ", strerror(errno)));
  if (absl::Status s = WriteAll(fd, binary); !s.ok()) {
    close(fd);
    return s;
  }
  // Someone else's object may hold this descriptor's path: move to another
  // number (keeping the taken ones open, so the next try gets a new one).
  std::vector<int> taken;
  while (PathIsLoaded(FdPath(fd)) && taken.size() < 16) {
    taken.push_back(fd);
    fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) break;
  }
  for (int t : taken) close(t);
  if (fd < 0) return absl::InternalError(absl::StrCat("dup of a memfd: ", strerror(errno)));
  std::string path = FdPath(fd);
  if (PathIsLoaded(path)) {
    close(fd);
    return absl::InternalError(
        absl::StrCat("cannot find a free /proc/self/fd path to load module ", digest));
  }

  // Generated modules use OpenMP: keep libgomp resident for the life of the
  // process, so unloading the last module never unloads it under its idle
  // worker threads (a crash at the next fork/exit otherwise).
  static const bool gomp_pinned =
      dlopen("libgomp.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NODELETE) != nullptr;
  (void)gomp_pinned;
  dlerror();  // clear
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const std::string why = DlError();
    close(fd);
    return absl::InternalError(
        absl::StrCat("dlopen of module ", digest.substr(0, 12), " failed: ", why));
  }
  ++loads_;
  std::shared_ptr<const LoadedModule> module(new LoadedModule(handle, fd, std::move(path), digest));
  modules_.emplace(std::move(digest), module);
  return module;
}

}  // namespace kiln::runtime
