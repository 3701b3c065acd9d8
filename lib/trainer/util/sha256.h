// SHA-256 (OpenSSL's libcrypto), for checking downloaded weights against the hash prefix in
// their file names (torch.hub's rule). Streaming: add() any number of times, then hex(). Not
// copyable; thread-compatible, no shared state. Only in a build with TRAINER_DOWNLOADS.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace trainer::util {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  Sha256& add(const void* data, size_t n);
  Sha256& add(std::string_view s) { return add(s.data(), s.size()); }
  // The digest as 64 lowercase hex digits; the object is finished after it.
  std::string hex();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

}  // namespace trainer::util
