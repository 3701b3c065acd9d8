// CRC-32C: known vectors (RFC 3720 appendix B.4 and "123456789"), software and hardware paths
// agreeing on random buffers of many lengths and alignments, incremental extension, TFRecord mask.
#include "common/catch.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "trainer/util/crc32c.h"

using namespace trainer::util;

namespace {
uint32_t crc_of(const std::string& s) { return crc32c(s.data(), s.size()); }
}  // namespace

TEST_CASE("crc32c matches the known vectors", "[util][crc32c]") {
  CHECK(crc_of("123456789") == 0xE3069283u);
  CHECK(crc_of("") == 0u);
  CHECK(crc32c(nullptr, 0) == 0u);
  CHECK(crc_of(std::string(32, '\x00')) == 0x8A9136AAu);
  CHECK(crc_of(std::string(32, '\xFF')) == 0x62A8AB43u);
  std::string ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i);
  CHECK(crc_of(ascending) == 0x46DD794Eu);
  std::string descending(32, '\0');
  for (int i = 0; i < 32; ++i) descending[i] = static_cast<char>(31 - i);
  CHECK(crc_of(descending) == 0x113FDB5Cu);

  // Both paths give the same answers on the vectors.
  CHECK(crc32c_software("123456789", 9) == 0xE3069283u);
  CHECK(crc32c_software(ascending.data(), 32) == 0x46DD794Eu);
  CHECK(crc32c_hardware("123456789", 9) == 0xE3069283u);
  CHECK(crc32c_hardware(ascending.data(), 32) == 0x46DD794Eu);
}

TEST_CASE("crc32c software and hardware paths agree", "[util][crc32c]") {
  if (!crc32c_hardware_available()) {
    WARN("no SSE4.2 on this CPU: the hardware path is the software one; comparing only that");
  }
  std::mt19937 rng(12345);
  std::vector<unsigned char> buf(4096 + 16);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  int mismatches = 0;
  for (size_t offset = 0; offset < 16; ++offset) {
    for (size_t n = 0; n <= 300; ++n) {
      const uint32_t seed = static_cast<uint32_t>(rng());
      const uint32_t sw = crc32c_software(buf.data() + offset, n, seed);
      if (sw != crc32c_hardware(buf.data() + offset, n, seed)) ++mismatches;
      if (sw != crc32c(buf.data() + offset, n, seed)) ++mismatches;
    }
    const size_t n = 4096;
    if (crc32c_software(buf.data() + offset, n) != crc32c_hardware(buf.data() + offset, n)) {
      ++mismatches;
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("crc32c extends incrementally", "[util][crc32c]") {
  std::mt19937 rng(7);
  std::string data(1000, '\0');
  for (auto& c : data) c = static_cast<char>(rng());
  const uint32_t whole = crc_of(data);
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{500},
                     size_t{999}, size_t{1000}}) {
    const uint32_t a = crc32c(data.data(), cut);
    CHECK(crc32c(data.data() + cut, data.size() - cut, a) == whole);
    CHECK(crc32c_software(data.data() + cut, data.size() - cut, a) == whole);
    CHECK(crc32c_hardware(data.data() + cut, data.size() - cut, a) == whole);
  }
  CHECK(crc32c("6789", 4, crc32c("12345", 5)) == 0xE3069283u);
}

TEST_CASE("TFRecord CRC mask round trips", "[util][crc32c]") {
  // mask(0xE3069283) = rotr(0xE3069283, 15) + 0xa282ead8, computed by hand.
  CHECK(mask_crc(0xE3069283u) == 0xC78AB0E5u);
  CHECK(unmask_crc(0xC78AB0E5u) == 0xE3069283u);
  CHECK(mask_crc(0u) == 0xa282ead8u);
  std::mt19937 rng(3);
  for (int i = 0; i < 1000; ++i) {
    const uint32_t c = static_cast<uint32_t>(rng());
    CHECK(unmask_crc(mask_crc(c)) == c);
  }
}
