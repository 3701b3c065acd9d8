#include "trainer/dist/replicas.h"

#include <iomanip>
#include <sstream>

#include "trainer/util/error.h"
#include "trainer/util/hash.h"

namespace trainer::dist {

namespace {

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
  // FNV-1a over 64-bit words (util/hash.h): a change in any single word changes the result.
  util::Fnv1a64 h;
  h.add_word(tensors.size());
  for (const auto& t : tensors) {
    if (!t.defined()) {
      h.add_word(~uint64_t{0});
      continue;
    }
    const auto c = t.detach().to(torch::kCPU).contiguous();
    h.add_word(static_cast<uint64_t>(c.scalar_type()));
    h.add_word(static_cast<uint64_t>(c.dim()));
    for (int64_t s : c.sizes()) h.add_word(static_cast<uint64_t>(s));
    h.add_words(c.data_ptr(), c.nbytes());
  }
  return finalize(h.value());
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
