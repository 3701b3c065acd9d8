// util/bytes.h (the one little-endian reader and writer) and util/address.h (the one host:port).
#include "common/catch.h"

#include <limits>

#include "trainer/util/address.h"
#include "trainer/util/bytes.h"

using namespace trainer::util;

TEST_CASE("little-endian integers and reals round-trip at every width", "[util][bytes]") {
  char buf[8];
  for (int n = 1; n <= 8; ++n) {
    const uint64_t v = 0x8877665544332211ull & (n == 8 ? ~0ull : ((1ull << (8 * n)) - 1));
    store_le(buf, v, n);
    CHECK(static_cast<unsigned char>(buf[0]) == 0x11);  // least significant byte first
    CHECK(load_le(buf, n) == v);
  }
  const char one_f[4] = {0, 0, static_cast<char>(0x80), 0x3f};  // 1.0f
  CHECK(load_le_real<float>(one_f) == 1.0f);
  const double d = -2.5e-300;
  uint64_t bits;
  std::memcpy(&bits, &d, 8);
  store_le(buf, bits, 8);
  CHECK(load_le_real<double>(buf) == d);
}

TEST_CASE("host_port brackets an IPv6 host once", "[util][address]") {
  CHECK(host_port("10.0.0.1", 2222) == "10.0.0.1:2222");
  CHECK(host_port("worker-0.svc", 1) == "worker-0.svc:1");
  CHECK(host_port("::1", 2222) == "[::1]:2222");
  CHECK(host_port("[fe80::1]", 80) == "[fe80::1]:80");
}
