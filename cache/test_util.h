// What the cache's tests share: a temporary directory for a real RocksDB,
// and guards, signatures and publish requests over one input of size n.
#ifndef KILN_CACHE_TEST_UTIL_H_
#define KILN_CACHE_TEST_UTIL_H_

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "cache/cache.h"

namespace kiln::cache {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kiln_cache_test.XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline v1::GuardSet GuardsForSize(int64_t n) {
  v1::GuardSet g;
  auto* t = g.add_tensors();
  t->set_name("x");
  t->set_dtype(v1::FLOAT32);
  t->mutable_device()->set_type("cpu");
  t->mutable_device()->set_index(-1);
  t->add_sizes()->set_int_value(n);
  return g;
}

inline v1::InputSignature SignatureForSize(int64_t n) {
  v1::InputSignature s;
  auto* t = s.add_inputs();
  t->set_dtype(v1::FLOAT32);
  t->mutable_device()->set_type("cpu");
  t->mutable_device()->set_index(-1);
  t->add_sizes(n);
  t->add_strides(1);
  return s;
}

inline PublishRequest Pub(const std::string& key, int64_t n, const std::string& artifact,
                          const std::string& ns = "") {
  PublishRequest p;
  p.ns = ns;
  p.key = key;
  p.graph_name = "g";
  p.backend = "eager";
  p.guards = GuardsForSize(n);
  p.artifact = artifact;
  return p;
}

}  // namespace kiln::cache

#endif  // KILN_CACHE_TEST_UTIL_H_
