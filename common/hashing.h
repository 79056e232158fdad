// SHA-256 digests (OpenSSL) in the hex form used for cache keys and artifact
// digests. Thread-safe: no shared state.
#ifndef KILN_COMMON_HASHING_H_
#define KILN_COMMON_HASHING_H_

#include <string>

#include "absl/strings/string_view.h"

namespace kiln {

// Incremental SHA-256. Each Update is framed by its length, so that
// ("ab", "c") and ("a", "bc") hash differently.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  Sha256& Update(absl::string_view field);
  // Lowercase hex of the digest. Call once.
  std::string HexDigest();

 private:
  struct State;
  State* state_;
};

// Hex SHA-256 of `bytes`, unframed: the digest of the content itself.
std::string Sha256Hex(absl::string_view bytes);

// True when `s` looks like a hex SHA-256 (64 lowercase hex digits).
bool IsHexDigest(absl::string_view s);

}  // namespace kiln

#endif  // KILN_COMMON_HASHING_H_
