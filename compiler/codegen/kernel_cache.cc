#include "compiler/codegen/kernel_cache.h"

#include <algorithm>

#include "common/hashing.h"
#include "common/status_macros.h"

namespace kiln::codegen {

std::string StripComments(absl::string_view source) {
  std::string out;
  out.reserve(source.size());
  const size_t n = source.size();
  for (size_t i = 0; i < n;) {
    const char c = source[i];
    if (c == '"' || c == '\'') {
      // A literal, escapes included, to its closing quote (or the end).
      size_t j = i + 1;
      while (j < n && source[j] != c && source[j] != '\n') j += source[j] == '\\' ? 2 : 1;
      j = std::min(n, j + 1);
      out.append(source.data() + i, j - i);
      i = j;
    } else if (c == '/' && i + 1 < n && source[i + 1] == '/') {
      const size_t eol = source.find('\n', i);
      out += ' ';
      i = eol == absl::string_view::npos ? n : eol;
    } else if (c == '/' && i + 1 < n && source[i + 1] == '*') {
      const size_t end = source.find("*/", i + 2);
      out += ' ';
      i = end == absl::string_view::npos ? n : end + 2;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

absl::StatusOr<std::string> KernelKey(const CodegenBackend& backend, const loop::Kernel& kernel,
                                      const std::vector<std::string>& symbols) {
  loop::Kernel renamed = kernel;
  renamed.name = "kernel";  // any valid name, the same for every kernel
  ASSIGN_OR_RETURN(const std::string source, backend.Generate({renamed}, symbols));
  Sha256 digest;
  digest.Update(backend.language()).Update(backend.CompileIdentity()).Update(StripComments(source));
  return digest.HexDigest();
}

int64_t KernelCache::Bytes(const Item& item) {
  return static_cast<int64_t>(item.first.size() + item.second.symbol.size() +
                              item.second.module.ByteSizeLong());
}

std::optional<KernelCache::Entry> KernelCache::Find(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++stats_.misses;
    return std::nullopt;
  }
  ++stats_.hits;
  items_.splice(items_.begin(), items_, it->second);
  return it->second->second;
}

void KernelCache::Insert(const std::string& key, Entry entry) {
  Item item(key, std::move(entry));
  const int64_t bytes = Bytes(item);
  if (bytes > capacity_) return;
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(key); it != index_.end()) {
    stats_.bytes -= Bytes(*it->second);
    --stats_.entries;
    items_.erase(it->second);
    index_.erase(it);
  }
  items_.push_front(std::move(item));
  index_[key] = items_.begin();
  stats_.bytes += bytes;
  ++stats_.entries;
  while (stats_.bytes > capacity_) {
    const Item& last = items_.back();
    stats_.bytes -= Bytes(last);
    --stats_.entries;
    ++stats_.evictions;
    index_.erase(last.first);
    items_.pop_back();
  }
}

KernelCache::Stats KernelCache::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace kiln::codegen
