// Ed25519 signatures (OpenSSL) of artifact digests. kilnd signs the digest
// of every artifact it sends when it has a key (--signing_key_file); a
// runtime configured with the public key refuses an artifact whose digest
// is not the SHA-256 of its bytes or whose signature does not verify, before
// it loads any native code.
//
// Thread-safe after construction.
#ifndef KILN_COMMON_SIGNING_H_
#define KILN_COMMON_SIGNING_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

class Signer {
 public:
  // A PEM Ed25519 private key ("openssl genpkey -algorithm ed25519").
  static absl::StatusOr<std::unique_ptr<Signer>> FromPem(const std::string& pem);
  ~Signer();

  // The 64-byte signature of `message`.
  std::string Sign(absl::string_view message) const;

 private:
  explicit Signer(void* key) : key_(key) {}
  void* key_;  // EVP_PKEY*
};

// OK when `signature` is `public_key_pem`'s Ed25519 signature of `message`;
// PERMISSION_DENIED otherwise (a malformed key is INVALID_ARGUMENT).
absl::Status VerifySignature(const std::string& public_key_pem, absl::string_view message,
                             absl::string_view signature);

}  // namespace kiln

#endif  // KILN_COMMON_SIGNING_H_
