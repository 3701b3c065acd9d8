// The TFRecord container: round trips (plain, gzip, empty and block-sized records), the framing
// checked byte by byte, counting, compression detection, and every corruption case with the
// record number and byte offset in its message.
#include <zlib.h>
#include "common/catch.h"

#include <sys/resource.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fixtures.h"
#include "trainer/data/tfrecord.h"
#include "trainer/util/crc32c.h"
#include "trainer/util/error.h"

using namespace trainer;
using namespace trainer::data;
using testing::read_bytes;
using testing::TempDir;
using testing::write_text;
using trainer::test::Contains;

namespace {

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}
std::string le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}
uint32_t get_le32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}
uint32_t masked(const std::string& s) { return util::mask_crc(util::crc32c(s.data(), s.size())); }

// One record framed by hand, independently of RecordWriter.
std::string frame(const std::string& data) {
  const std::string len = le64(data.size());
  return len + le32(masked(len)) + data + le32(masked(data));
}

void write_records(const std::string& path, const std::vector<std::string>& records,
                   Compression c = Compression::kNone) {
  RecordWriter w(path, c);
  for (const auto& r : records) w.write(r);
  w.close();
}

std::vector<std::string> read_all(const std::string& path, Compression c, size_t block = 4 << 20) {
  RecordReader r(path, c, block);
  std::vector<std::string> out;
  std::string data;
  while (r.read(&data)) out.push_back(data);
  return out;
}

void write_gzip(const std::string& path, const std::string& bytes) {
  gzFile g = gzopen(path.c_str(), "wb");
  REQUIRE(g != nullptr);
  REQUIRE(gzwrite(g, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  REQUIRE(gzclose(g) == Z_OK);
}

// Three 100-byte records: record 1 starts at byte 116, record 2 at 232; the file is 348 bytes.
std::vector<std::string> three_records() {
  return {std::string(100, 'a'), std::string(100, 'b'), std::string(100, 'c')};
}

// The RecordError of reading `path` to its end (after records that read fine), or none.
struct Failure {
  bool thrown = false;
  std::string message;
  bool recoverable = false;
  int64_t good_before = 0;
};
Failure read_failure(const std::string& path, Compression c, size_t block = 4 << 20) {
  Failure f;
  RecordReader r(path, c, block);
  std::string data;
  try {
    while (r.read(&data)) ++f.good_before;
  } catch (const RecordError& e) {
    f.thrown = true;
    f.message = e.what();
    f.recoverable = e.recoverable;
    if (!e.recoverable) CHECK_FALSE(r.read(&data));  // then the reader is at its end
  }
  return f;
}

}  // namespace

TEST_CASE("TFRecord round trips plain and gzip", "[data][tfrecord]") {
  TempDir tmp;
  const Compression c = GENERATE(Compression::kNone, Compression::kGzip);
  const size_t block = GENERATE(size_t{64}, size_t{100}, size_t{4} << 20);
  CAPTURE(compression_name(c), block);
  std::vector<std::string> records = {"", "a", "hello", "", random_bytes(5 << 20, 1)};
  for (int i = 0; i < 300; ++i) records.push_back(random_bytes(i % 97, 100 + i));
  records.push_back("");
  const std::string path = tmp.file("x.tfrecord");
  {
    RecordWriter w(path, c);
    for (const auto& r : records) w.write(r);
    CHECK(w.records_written() == static_cast<int64_t>(records.size()));
  }  // the destructor closes

  RecordReader r(path, c, block);
  CHECK(r.path() == path);
  int64_t offset = 0;
  std::string data;
  for (size_t i = 0; i < records.size(); ++i) {
    CHECK(r.index() == static_cast<int64_t>(i));
    CHECK(r.offset() == offset);
    REQUIRE(r.read(&data));
    REQUIRE(data == records[i]);
    offset += 16 + static_cast<int64_t>(records[i].size());
  }
  CHECK_FALSE(r.read(&data));
  CHECK_FALSE(r.read(&data));
  CHECK(r.index() == static_cast<int64_t>(records.size()));
  CHECK(r.offset() == offset);
  CHECK(count_records(path, c) == static_cast<int64_t>(records.size()));
}

TEST_CASE("TFRecord framing matches a record built byte by byte", "[data][tfrecord]") {
  TempDir tmp;
  const std::string hand = frame("hello") + frame("") + frame(std::string(1000, 'z'));
  write_text(tmp / "hand.tfrecord", hand);
  CHECK(read_all(tmp.file("hand.tfrecord"), Compression::kNone, 64) ==
        std::vector<std::string>{"hello", "", std::string(1000, 'z')});

  write_records(tmp.file("w.tfrecord"), {"hello", "", std::string(1000, 'z')});
  CHECK(read_bytes(tmp / "w.tfrecord") == hand);

  // The masked CRCs as stored, against values computed outside this code base (Python).
  const std::string file = read_bytes(tmp / "w.tfrecord");
  CHECK(file.substr(0, 8) == le64(5));
  CHECK(get_le32(file, 8) == 0x3e04b2eau);  // mask(crc32c(le64(5)))
  CHECK(file.substr(12, 5) == "hello");
  CHECK(get_le32(file, 17) == 0x191c1fbbu);  // mask(crc32c("hello"))
  CHECK(util::unmask_crc(get_le32(file, 17)) == util::crc32c("hello", 5));
  CHECK(file.substr(21, 8) == le64(0));
  CHECK(get_le32(file, 29) == 0x07980329u);  // mask(crc32c(8 zero bytes))
  CHECK(get_le32(file, 33) == 0xa282ead8u);  // mask(crc32c("")) = mask(0)

  SECTION("gzip holds the same bytes compressed") {
    write_records(tmp.file("w.tfrecord.gz"), {"hello", "", std::string(1000, 'z')},
                  Compression::kGzip);
    gzFile g = gzopen(tmp.file("w.tfrecord.gz").c_str(), "rb");
    REQUIRE(g != nullptr);
    std::string plain(hand.size() + 10, '\0');
    const int n = gzread(g, plain.data(), static_cast<unsigned>(plain.size()));
    gzclose(g);
    plain.resize(n > 0 ? n : 0);
    CHECK(plain == hand);
  }
}

TEST_CASE("count_records counts plain and gzip files", "[data][tfrecord]") {
  TempDir tmp;
  std::vector<std::string> records;
  for (int i = 0; i < 1000; ++i) records.push_back(random_bytes(i % 300, i));
  write_records(tmp.file("a.tfrecord"), records);
  write_records(tmp.file("a.tfrecord.gz"), records, Compression::kGzip);
  CHECK(count_records(tmp.file("a.tfrecord"), Compression::kNone) == 1000);
  CHECK(count_records(tmp.file("a.tfrecord.gz"), Compression::kGzip) == 1000);
  write_records(tmp.file("empty.tfrecord"), {});
  write_records(tmp.file("empty.tfrecord.gz"), {}, Compression::kGzip);
  CHECK(count_records(tmp.file("empty.tfrecord"), Compression::kNone) == 0);
  CHECK(count_records(tmp.file("empty.tfrecord.gz"), Compression::kGzip) == 0);
  CHECK_THROWS_AS(count_records(tmp.file("missing.tfrecord"), Compression::kNone), DataError);
}

TEST_CASE("compression_for detects gzip by its magic bytes", "[data][tfrecord]") {
  TempDir tmp;
  write_records(tmp.file("p.tfrecord"), {"x"});
  write_records(tmp.file("g.bin"), {"x"}, Compression::kGzip);
  write_text(tmp / "empty", "");
  write_text(tmp / "one", "\x1f");
  CHECK(compression_for("auto", tmp.file("p.tfrecord")) == Compression::kNone);
  CHECK(compression_for("auto", tmp.file("g.bin")) == Compression::kGzip);
  CHECK(compression_for("auto", tmp.file("empty")) == Compression::kNone);
  CHECK(compression_for("auto", tmp.file("one")) == Compression::kNone);
  CHECK(compression_for("none", tmp.file("g.bin")) == Compression::kNone);
  CHECK(compression_for("gzip", tmp.file("missing")) == Compression::kGzip);
  CHECK_THROWS_WITH(compression_for("auto", tmp.file("missing")), Contains(tmp.file("missing")));
  CHECK_THROWS_AS(compression_for("auto", tmp.file("missing")), DataError);
  CHECK_THROWS_AS(compression_for("zstd", tmp.file("p.tfrecord")), ConfigError);
  CHECK_THROWS_WITH(compression_for("zstd", tmp.file("p.tfrecord")),
                    Contains("auto|none|gzip") && Contains("'zstd'"));
}

TEST_CASE("a truncated TFRecord file names the record and its offset", "[data][tfrecord]") {
  TempDir tmp;
  write_records(tmp.file("full.tfrecord"), three_records());
  const std::string full = read_bytes(tmp / "full.tfrecord");
  REQUIRE(full.size() == 348);
  const std::string path = tmp.file("cut.tfrecord");
  const size_t cut = GENERATE(size_t{116 + 5}, size_t{116 + 12}, size_t{116 + 12 + 50},
                              size_t{116 + 12 + 100 + 2});
  const size_t block = GENERATE(size_t{64}, size_t{4} << 20);
  CAPTURE(cut, block);
  write_text(path, full.substr(0, cut));

  const Failure f = read_failure(path, Compression::kNone, block);
  CHECK(f.thrown);
  CHECK(f.good_before == 1);
  CHECK_FALSE(f.recoverable);
  CHECK_THAT(f.message, Contains(path) && Contains("record 1") && Contains("byte offset 116") &&
                            Contains("truncated"));

  try {
    count_records(path, Compression::kNone);
    FAIL("count_records did not throw");
  } catch (const RecordError& e) {
    CHECK_THAT(e.what(), Contains(path) && Contains("record 1") && Contains("byte offset 116") &&
                             Contains("truncated"));
  }

  SECTION("skip() reports it as well") {
    RecordReader r(path, Compression::kNone, block);
    REQUIRE(r.skip());
    CHECK_THROWS_WITH(r.skip(), Contains("record 1") && Contains("truncated"));
    CHECK_FALSE(r.skip());
  }
}

TEST_CASE("a huge length with a good CRC is reported without allocating it", "[data][tfrecord]") {
  TempDir tmp;
  const std::string len = le64(uint64_t{3} << 30);
  const std::string bogus = frame("ok") + len + le32(masked(len)) + "tiny";
  write_text(tmp / "big.tfrecord", bogus);
  Failure f = read_failure(tmp.file("big.tfrecord"), Compression::kNone);
  CHECK(f.good_before == 1);
  CHECK_THAT(f.message, Contains("record 1") && Contains("byte offset 18") &&
                            Contains("truncated") && Contains("3221225472"));

  write_gzip(tmp.file("big.tfrecord.gz"), bogus);
  f = read_failure(tmp.file("big.tfrecord.gz"), Compression::kGzip);
  CHECK(f.good_before == 1);
  CHECK_THAT(f.message, Contains("record 1") && Contains("2 GiB limit"));
}

TEST_CASE("gzip: a length under the limit with a good CRC is not allocated before it arrives",
          "[data][tfrecord]") {
  TempDir tmp;
  const std::string len = le64(uint64_t{3} << 29);  // 1.5 GiB, under kMaxRecordBytes
  write_gzip(tmp.file("claims.tfrecord.gz"), frame("ok") + len + le32(masked(len)) + "tiny");
  rusage before{};
  ::getrusage(RUSAGE_SELF, &before);
  const Failure f = read_failure(tmp.file("claims.tfrecord.gz"), Compression::kGzip);
  rusage after{};
  ::getrusage(RUSAGE_SELF, &after);
  CHECK(f.good_before == 1);
  CHECK_THAT(f.message, Contains("record 1") && Contains("truncated"));
  // ru_maxrss is in KiB: the peak grew by far less than the claimed 1.5 GiB.
  CHECK(after.ru_maxrss - before.ru_maxrss < 256 * 1024);
}

TEST_CASE("a flipped data byte is a recoverable data CRC mismatch", "[data][tfrecord]") {
  TempDir tmp;
  write_records(tmp.file("full.tfrecord"), three_records());
  std::string bytes = read_bytes(tmp / "full.tfrecord");
  bytes[116 + 12 + 40] ^= 0x01;
  const Compression c = GENERATE(Compression::kNone, Compression::kGzip);
  const std::string path = tmp.file("bad.tfrecord");
  if (c == Compression::kGzip) {
    write_gzip(path, bytes);
  } else {
    write_text(path, bytes);
  }
  RecordReader r(path, c, 64);
  std::string data;
  REQUIRE(r.read(&data));
  try {
    r.read(&data);
    FAIL("no RecordError");
  } catch (const RecordError& e) {
    CHECK(e.recoverable);
    CHECK_THAT(e.what(), Contains(path) && Contains("record 1 at byte offset 116") &&
                             Contains("data CRC mismatch") && Contains("stored 0x") &&
                             Contains("computed 0x"));
  }
  CHECK(r.index() == 2);
  CHECK(r.offset() == 232);
  REQUIRE(r.read(&data));
  CHECK(data == std::string(100, 'c'));
  CHECK_FALSE(r.read(&data));

  // skip() and count_records look at lengths only, so the file still counts 3.
  CHECK(count_records(path, c) == 3);
  RecordReader s(path, c);
  CHECK(s.skip());
  CHECK(s.skip());
  CHECK(s.read(&data));
  CHECK(data == std::string(100, 'c'));
}

TEST_CASE("a flipped length byte is a length CRC mismatch that ends the file", "[data][tfrecord]") {
  TempDir tmp;
  write_records(tmp.file("full.tfrecord"), three_records());
  std::string bytes = read_bytes(tmp / "full.tfrecord");
  bytes[116 + 1] ^= 0x40;
  const Compression c = GENERATE(Compression::kNone, Compression::kGzip);
  const std::string path = tmp.file("bad.tfrecord");
  if (c == Compression::kGzip) {
    write_gzip(path, bytes);
  } else {
    write_text(path, bytes);
  }
  const Failure f = read_failure(path, c);
  CHECK(f.thrown);
  CHECK(f.good_before == 1);
  CHECK_FALSE(f.recoverable);
  CHECK_THAT(f.message, Contains(path) && Contains("record 1 at byte offset 116") &&
                            Contains("length CRC mismatch"));
  CHECK_THROWS_WITH(count_records(path, c), Contains("length CRC mismatch"));
}

TEST_CASE("skip() passes over records, seeking in plain files", "[data][tfrecord]") {
  TempDir tmp;
  const Compression c = GENERATE(Compression::kNone, Compression::kGzip);
  std::vector<std::string> records;
  for (int i = 0; i < 50; ++i) records.push_back(random_bytes(i * 37 + (i % 3) * 5000, i));
  const std::string path = tmp.file("s.tfrecord");
  write_records(path, records, c);
  RecordReader r(path, c, 256);  // most skips are larger than the buffer
  std::string data;
  int64_t offset = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    CHECK(r.offset() == offset);
    if (i % 3 == 2) {
      REQUIRE(r.read(&data));
      CHECK(data == records[i]);
    } else {
      REQUIRE(r.skip());
    }
    offset += 16 + static_cast<int64_t>(records[i].size());
  }
  CHECK_FALSE(r.skip());
  CHECK_FALSE(r.read(&data));
  CHECK(r.index() == 50);
}

TEST_CASE("a corrupt gzip stream is a RecordError", "[data][tfrecord]") {
  TempDir tmp;
  std::vector<std::string> records;
  for (int i = 0; i < 200; ++i) records.push_back(random_bytes(1000, i));
  const std::string good = tmp.file("good.tfrecord.gz");
  write_records(good, records, Compression::kGzip);
  const std::string bytes = read_bytes(good);
  const std::string path = tmp.file("bad.tfrecord.gz");

  SECTION("a bad gzip header") {
    std::string b = bytes;
    b[2] = 0x07;  // compression method: only 8 (deflate) exists
    write_text(path, b);
    const Failure f = read_failure(path, Compression::kGzip);
    CHECK(f.good_before == 0);
    CHECK_FALSE(f.recoverable);
    CHECK_THAT(f.message, Contains(path) && Contains("record 0 at byte offset 0") &&
                              Contains("corrupt gzip stream"));
  }
  SECTION("damaged compressed data") {
    std::string b = bytes;
    for (size_t i = b.size() / 2; i < b.size() / 2 + 64; ++i) b[i] = static_cast<char>(~b[i]);
    write_text(path, b);
    const Failure f = read_failure(path, Compression::kGzip, 4096);
    CHECK(f.thrown);
    CHECK(f.good_before < 200);
    CHECK_THAT(f.message, Contains(path) && Contains("byte offset"));
  }
  SECTION("a cut gzip stream") {
    write_text(path, bytes.substr(0, bytes.size() / 2));
    const Failure f = read_failure(path, Compression::kGzip);
    CHECK(f.thrown);
    CHECK_FALSE(f.recoverable);
    CHECK_THAT(f.message, Contains(path) && Contains("gzip"));
    CHECK_THROWS_AS(count_records(path, Compression::kGzip), RecordError);
  }
}

TEST_CASE("RecordWriter and RecordReader name the path when they cannot open it",
          "[data][tfrecord]") {
  TempDir tmp;
  CHECK_THROWS_WITH(RecordReader(tmp.file("nope.tfrecord"), Compression::kNone),
                    Contains(tmp.file("nope.tfrecord")));
  CHECK_THROWS_AS(RecordWriter(tmp.file("no/such/dir/x.tfrecord")), DataError);
  CHECK_THROWS_WITH(RecordWriter(tmp.file("no/such/dir/x.tfrecord"), Compression::kGzip),
                    Contains("no/such/dir/x.tfrecord"));
}

TEST_CASE("concatenated gzip members read as one stream", "[data][tfrecord]") {
  TempDir tmp;
  write_records(tmp.file("a.gz"), {"one", "two"}, Compression::kGzip);
  write_records(tmp.file("b.gz"), {"three"}, Compression::kGzip);
  write_text(tmp / "ab.gz", read_bytes(tmp / "a.gz") + read_bytes(tmp / "b.gz"));
  CHECK(read_all(tmp.file("ab.gz"), Compression::kGzip, 64) ==
        std::vector<std::string>{"one", "two", "three"});
  CHECK(count_records(tmp.file("ab.gz"), Compression::kGzip) == 3);
}
