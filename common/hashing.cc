#include "common/hashing.h"

#include <openssl/evp.h>

#include <cstdint>

#include "absl/strings/escaping.h"

namespace kiln {
namespace {

// Fetched once: an implicit fetch on every digest costs more than hashing a
// small message. Immutable after initialization.
const EVP_MD* Sha256Md() {
  static const EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  return md;
}

}  // namespace

struct Sha256::State {
  EVP_MD_CTX* ctx;
};

Sha256::Sha256() : state_(new State{EVP_MD_CTX_new()}) {
  EVP_DigestInit_ex(state_->ctx, Sha256Md(), nullptr);
}

Sha256::~Sha256() {
  EVP_MD_CTX_free(state_->ctx);
  delete state_;
}

Sha256& Sha256::Update(absl::string_view field) {
  uint64_t n = field.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  EVP_DigestUpdate(state_->ctx, len, sizeof(len));
  EVP_DigestUpdate(state_->ctx, field.data(), field.size());
  return *this;
}

std::string Sha256::HexDigest() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(state_->ctx, md, &n);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(md), n));
}

std::string Sha256Hex(absl::string_view bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &n, Sha256Md(), nullptr);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(md), n));
}

bool IsHexDigest(absl::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace kiln
