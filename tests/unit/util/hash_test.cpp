// FNV-1a: the published test vectors (64 and 128 bits), and values computed with the three
// copies this header replaced (job-spec fingerprint, listing digest, replica checksum), which are
// stored in job dirs or compared across ranks and so must never change.
#include "common/catch.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "trainer/util/hash.h"

using namespace trainer::util;

namespace {

// "hhhh...llll" as 32 hex digits.
std::string hex128(const Fnv1a128& h) {
  char out[33];
  std::snprintf(out, sizeof(out), "%016llx%016llx", static_cast<unsigned long long>(h.high()),
                static_cast<unsigned long long>(h.low()));
  return out;
}

}  // namespace

TEST_CASE("fnv1a64 matches the known vectors", "[util][hash]") {
  CHECK(Fnv1a64().value() == 0xcbf29ce484222325ULL);
  CHECK(Fnv1a64().add("").value() == 0xcbf29ce484222325ULL);
  CHECK(Fnv1a64().add("a").value() == 0xaf63dc4c8601ec8cULL);
  CHECK(Fnv1a64().add("foobar").value() == 0x85944171f73967e8ULL);
  // Incremental: bytes added in pieces hash as the whole.
  CHECK(Fnv1a64().add("foo").add("bar").value() == Fnv1a64().add("foobar").value());
  CHECK(Fnv1a64().add("foo").add_byte('b').add("ar").value() == 0x85944171f73967e8ULL);
  CHECK(Fnv1a64().add("foobar", 3).value() == Fnv1a64().add("foo").value());
}

TEST_CASE("fnv1a128 matches the known vectors", "[util][hash]") {
  CHECK(hex128(Fnv1a128()) == "6c62272e07bb014262b821756295c58d");
  CHECK(hex128(Fnv1a128().add("a")) == "d228cb696f1a8caf78912b704e4a8964");
  CHECK(hex128(Fnv1a128().add("foobar")) == "343e1662793c64bf6f0d3597ba446f18");
  CHECK(Fnv1a128().add("foo").add("bar").value() == Fnv1a128().add("foobar").value());
}

TEST_CASE("fnv1a keeps the values of the code it replaced", "[util][hash]") {
  // config::fingerprint: 128 bits over "path\0value\0" per field (values from the old code).
  Fnv1a128 fp;
  fp.add("model.arch").add_byte(0).add("resnet50").add_byte(0);
  CHECK(hex128(fp) == "3ba1dbfad7f3392c9144e2219245c128");
  fp.add("train.epochs").add_byte(0).add("5").add_byte(0);
  CHECK(hex128(fp) == "d2520dcbff9d49d006586a85d9bcd97f");

  // train's listing digest: 64 bits over "string\xff" from its own basis 1469598103934665603.
  CHECK(Fnv1a64(1469598103934665603ULL).add("a").add_byte(0xff).value() == 0x9bace000c65ca21bULL);
  Fnv1a64 listing(1469598103934665603ULL);
  for (const char* s : {"img/0.jpg", "0", "cat"}) listing.add(s).add_byte(0xff);
  CHECK(listing.value() == 0x49c211468dab7285ULL);

  // dist::checksum: word-wise, a partial last word tagged with its length (host byte order;
  // the pinned values are little-endian's, as on every machine we build for).
  const char text[] = "0123456789abc";  // one whole word and a 5-byte tail
  CHECK(Fnv1a64().add_word(2).add_words(text, 13).value() == 0xc53103c9ed250ab5ULL);
  const unsigned char zeros[3] = {0, 0, 0};
  CHECK(Fnv1a64().add_words(zeros, 3).value() == 0x9663bd4c8601b7dfULL);
}

TEST_CASE("fnv1a64 word-wise steps", "[util][hash]") {
  CHECK(Fnv1a64().add_words("", 0).value() == Fnv1a64::kOffset);
  CHECK(Fnv1a64().add_word(0).value() == Fnv1a64::kOffset * Fnv1a64::kPrime);
  // Whole words are read as memcpy reads them, at any alignment.
  char buf[17] = {};
  for (int i = 0; i < 17; ++i) buf[i] = static_cast<char>(0x11 * i);
  uint64_t w0, w1;
  std::memcpy(&w0, buf + 1, 8);
  std::memcpy(&w1, buf + 9, 8);
  CHECK(Fnv1a64().add_words(buf + 1, 16).value() == Fnv1a64().add_word(w0).add_word(w1).value());
  // Trailing zero bytes count: no bytes, one zero byte and two zero bytes all differ.
  const unsigned char zeros[2] = {0, 0};
  const uint64_t none = Fnv1a64().add_words(zeros, 0).value();
  const uint64_t one = Fnv1a64().add_words(zeros, 1).value();
  const uint64_t two = Fnv1a64().add_words(zeros, 2).value();
  CHECK(none != one);
  CHECK(one != two);
  CHECK(none != two);
}
