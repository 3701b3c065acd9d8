#include "trainer/util/sha256.h"

#if TRAINER_DOWNLOADS  // a build without downloads (-DTRAINER_DOWNLOADS=OFF) hashes nothing

#include <openssl/evp.h>

#include "trainer/util/error.h"

namespace trainer::util {

struct Sha256::Ctx {
  EVP_MD_CTX* md = nullptr;
  ~Ctx() { EVP_MD_CTX_free(md); }
};

Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) {
  ctx_->md = EVP_MD_CTX_new();
  if (ctx_->md == nullptr || EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) != 1) {
    throw Error(ErrorKind::kInternal, "SHA-256: OpenSSL's EVP_DigestInit_ex failed");
  }
}

Sha256::~Sha256() = default;

Sha256& Sha256::add(const void* data, size_t n) {
  if (EVP_DigestUpdate(ctx_->md, data, n) != 1) {
    throw Error(ErrorKind::kInternal, "SHA-256: OpenSSL's EVP_DigestUpdate failed");
  }
  return *this;
}

std::string Sha256::hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_DigestFinal_ex(ctx_->md, digest, &n) != 1) {
    throw Error(ErrorKind::kInternal, "SHA-256: OpenSSL's EVP_DigestFinal_ex failed");
  }
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) {
    out += kDigits[digest[i] >> 4];
    out += kDigits[digest[i] & 0xf];
  }
  return out;
}

}  // namespace trainer::util

#endif  // TRAINER_DOWNLOADS
