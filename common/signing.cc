#include "common/signing.h"

#include "openssl/bio.h"
#include "openssl/evp.h"
#include "openssl/pem.h"

namespace kiln {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct MdFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Signer>> Signer::FromPem(const std::string& pem) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  EVP_PKEY* key = bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr;
  if (key == nullptr) return absl::InvalidArgumentError("signing key: not a PEM private key");
  if (EVP_PKEY_id(key) != EVP_PKEY_ED25519) {
    EVP_PKEY_free(key);
    return absl::InvalidArgumentError("signing key: not an Ed25519 key");
  }
  return std::unique_ptr<Signer>(new Signer(key));
}

Signer::~Signer() { EVP_PKEY_free(static_cast<EVP_PKEY*>(key_)); }

std::string Signer::Sign(absl::string_view message) const {
  std::unique_ptr<EVP_MD_CTX, MdFree> ctx(EVP_MD_CTX_new());
  std::string signature(64, '\0');
  size_t length = signature.size();
  if (!ctx ||
      EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, static_cast<EVP_PKEY*>(key_)) != 1 ||
      EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(signature.data()), &length,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1) {
    return "";
  }
  signature.resize(length);
  return signature;
}

absl::Status VerifySignature(const std::string& public_key_pem, absl::string_view message,
                             absl::string_view signature) {
  std::unique_ptr<BIO, BioFree> bio(
      BIO_new_mem_buf(public_key_pem.data(), static_cast<int>(public_key_pem.size())));
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      bio ? PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!key || EVP_PKEY_id(key.get()) != EVP_PKEY_ED25519) {
    return absl::InvalidArgumentError("public key: not a PEM Ed25519 public key");
  }
  if (signature.empty()) return absl::PermissionDeniedError("the artifact is not signed");
  std::unique_ptr<EVP_MD_CTX, MdFree> ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key.get()) != 1 ||
      EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                       signature.size(), reinterpret_cast<const unsigned char*>(message.data()),
                       message.size()) != 1) {
    return absl::PermissionDeniedError("the artifact's signature does not verify");
  }
  return absl::OkStatus();
}

}  // namespace kiln
