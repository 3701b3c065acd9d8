#include "trainer/dist/replicas.h"

#include <cstring>
#include <iomanip>
#include <sstream>

#include "trainer/util/error.h"

namespace trainer::dist {

namespace {

constexpr uint64_t kPrime = 0x100000001b3ULL;  // FNV-1a's 64-bit prime

// FNV-1a over 64-bit words: every step is a bijection of the running hash, so a change in any
// single word always changes the result.
void mix(uint64_t& h, uint64_t word) {
  h ^= word;
  h *= kPrime;
}

void mix_bytes(uint64_t& h, const unsigned char* p, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    mix(h, w);
  }
  if (i < n) {
    uint64_t tail = 0;
    std::memcpy(&tail, p + i, n - i);
    mix(h, tail ^ (static_cast<uint64_t>(n - i) << 56));
  }
}

uint64_t finalize(uint64_t z) {  // splitmix64's finaliser, so nearby states look unrelated
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::string hex(uint64_t v) {
  std::ostringstream out;
  out << std::hex << std::setw(16) << std::setfill('0') << v;
  return out.str();
}

}  // namespace

void broadcast_parameters(ProcessGroup& group, const std::vector<torch::Tensor>& tensors,
                          int root) {
  group.broadcast(tensors, root);
}

uint64_t checksum(const std::vector<torch::Tensor>& tensors) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV offset basis
  mix(h, tensors.size());
  for (const auto& t : tensors) {
    if (!t.defined()) {
      mix(h, ~uint64_t{0});
      continue;
    }
    const auto c = t.detach().to(torch::kCPU).contiguous();
    mix(h, static_cast<uint64_t>(c.scalar_type()));
    mix(h, static_cast<uint64_t>(c.dim()));
    for (int64_t s : c.sizes()) mix(h, static_cast<uint64_t>(s));
    mix_bytes(h, static_cast<const unsigned char*>(c.data_ptr()), c.nbytes());
  }
  return finalize(h);
}

void check_replicas_agree(ProcessGroup& group, const std::vector<torch::Tensor>& tensors,
                          const std::string& when) {
  const auto all = group.all_gather_strings(hex(checksum(tensors)));
  std::string differ;
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] != all[0]) {
      differ += (differ.empty() ? "" : ", ") + std::to_string(r) + " (" + all[r] + ")";
    }
  }
  if (!differ.empty()) {
    throw DistributedError("replicas diverged " + when + ": the parameters of rank(s) " + differ +
                           " differ from the chief's (" + all[0] +
                           "); synchronous training must keep every replica identical");
  }
}

}  // namespace trainer::dist
