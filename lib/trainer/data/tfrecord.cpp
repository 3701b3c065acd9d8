#include "trainer/data/tfrecord.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <vector>

#include "trainer/util/bytes.h"
#include "trainer/util/crc32c.h"

namespace trainer::data {

namespace {

constexpr size_t kHeaderBytes = 12;  // uint64 length + uint32 masked CRC of it
constexpr size_t kFooterBytes = 4;   // uint32 masked CRC of the data

void put_le32(char* p, uint32_t v) { util::store_le(p, v, 4); }
void put_le64(char* p, uint64_t v) { util::store_le(p, v, 8); }
uint32_t get_le32(const char* p) { return static_cast<uint32_t>(util::load_le(p, 4)); }
uint64_t get_le64(const char* p) { return util::load_le(p, 8); }

uint32_t masked_crc(const void* data, size_t n) { return util::mask_crc(util::crc32c(data, n)); }

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08" PRIx32, v);
  return buf;
}

std::string errno_text() { return std::strerror(errno); }

// "path: record N at byte offset O: what"
[[noreturn]] void throw_record_error(const std::string& path, int64_t index, int64_t offset,
                                     const std::string& what, bool recoverable = false) {
  throw RecordError(path + ": record " + std::to_string(index) + " at byte offset " +
                        std::to_string(offset) + ": " + what,
                    recoverable);
}

// The length in a complete 12-byte header; sets *problem when the header's CRC is wrong.
uint64_t parse_header(const char* header, std::string* problem) {
  const uint64_t length = get_le64(header);
  const uint32_t stored = get_le32(header + 8);
  const uint32_t computed = masked_crc(header, 8);
  if (stored != computed) {
    *problem = "length CRC mismatch (stored " + hex32(stored) + ", computed " + hex32(computed) +
               "); the file is corrupt or not a TFRecord file";
  }
  return length;
}

std::string too_long(uint64_t length) {
  return "record length " + std::to_string(length) +
         " is over the 2 GiB limit; the file is corrupt or not a TFRecord file";
}

std::string truncated_header(size_t have) {
  return "truncated record header: the file ends " + std::to_string(have) +
         " bytes into the 12-byte header; the file is truncated";
}

std::string truncated_data(uint64_t length, uint64_t left) {
  return "truncated record: its header says " + std::to_string(length) +
         " data bytes plus a 4-byte CRC, but only " + std::to_string(left) +
         " bytes are left; the file is truncated";
}

int open_read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError("cannot open '" + path + "': " + errno_text());
  return fd;
}

}  // namespace

const char* compression_name(Compression c) { return c == Compression::kGzip ? "gzip" : "none"; }

Compression compression_for(const std::string& setting, const std::string& path) {
  if (setting == "none") return Compression::kNone;
  if (setting == "gzip") return Compression::kGzip;
  if (setting != "auto") {
    throw ConfigError("TFRecord compression: expected one of auto|none|gzip, got '" + setting +
                      "'");
  }
  const int fd = open_read(path);
  unsigned char magic[2] = {0, 0};
  ssize_t got = 0;
  while (got < 2) {
    const ssize_t n = ::read(fd, magic + got, 2 - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string err = errno_text();
      ::close(fd);
      throw DataError("cannot read '" + path + "': " + err);
    }
    if (n == 0) break;
    got += n;
  }
  ::close(fd);
  return (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) ? Compression::kGzip
                                                            : Compression::kNone;
}

// ---------------------------------------------------------------------------------------------
// RecordWriter

struct RecordWriter::Impl {
  std::string path;
  Compression compression;
  FILE* file = nullptr;
  gzFile gz = nullptr;
  std::vector<char> buffer;  // stdio's for `file` (glibc ignores the size without a buffer)
  int64_t written = 0;

  [[noreturn]] void fail(const std::string& what, const std::string& detail) {
    throw DataError(what + " '" + path + "': " + detail);
  }
  std::string gz_detail() {
    int errnum = 0;
    const char* msg = gz != nullptr ? gzerror(gz, &errnum) : nullptr;
    return errnum == Z_ERRNO || msg == nullptr || *msg == '\0' ? errno_text() : msg;
  }
  void put(const char* p, size_t n) {
    if (file != nullptr) {
      if (std::fwrite(p, 1, n, file) != n) fail("cannot write", errno_text());
      return;
    }
    while (n > 0) {  // gzwrite takes an unsigned length
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n, 1u << 30));
      if (gzwrite(gz, p, chunk) != static_cast<int>(chunk)) fail("cannot write", gz_detail());
      p += chunk;
      n -= chunk;
    }
  }
};

RecordWriter::RecordWriter(const std::string& path, Compression c) : impl_(new Impl) {
  impl_->path = path;
  impl_->compression = c;
  if (c == Compression::kGzip) {
    impl_->gz = gzopen(path.c_str(), "wb6");
    if (impl_->gz == nullptr) impl_->fail("cannot create", errno_text());
    gzbuffer(impl_->gz, 1u << 20);
  } else {
    impl_->file = std::fopen(path.c_str(), "wbe");
    if (impl_->file == nullptr) impl_->fail("cannot create", errno_text());
    impl_->buffer.resize(1u << 20);
    std::setvbuf(impl_->file, impl_->buffer.data(), _IOFBF, impl_->buffer.size());
  }
}

RecordWriter::~RecordWriter() {
  if (!impl_) return;
  try {
    close();
  } catch (...) {  // quietly: close() is where errors are reported
  }
}

RecordWriter::RecordWriter(RecordWriter&&) noexcept = default;
RecordWriter& RecordWriter::operator=(RecordWriter&& other) noexcept {
  if (this != &other) {
    if (impl_) {
      try {
        close();
      } catch (...) {
      }
    }
    impl_ = std::move(other.impl_);
  }
  return *this;
}

namespace {

void frame(const std::string& data, char (&header)[kHeaderBytes], char (&footer)[kFooterBytes]) {
  put_le64(header, data.size());
  put_le32(header + 8, masked_crc(header, 8));
  put_le32(footer, masked_crc(data.data(), data.size()));
}

}  // namespace

std::string frame_record(const std::string& data) {
  char header[kHeaderBytes];
  char footer[kFooterBytes];
  frame(data, header, footer);
  std::string out(header, sizeof header);
  out += data;
  out.append(footer, sizeof footer);
  return out;
}

void RecordWriter::write(const std::string& data) {
  Impl& w = *impl_;
  if (w.file == nullptr && w.gz == nullptr) w.fail("cannot write", "the writer is closed");
  char header[kHeaderBytes];
  char footer[kFooterBytes];
  frame(data, header, footer);
  w.put(header, sizeof header);
  w.put(data.data(), data.size());
  w.put(footer, sizeof footer);
  ++w.written;
}

void RecordWriter::flush() {
  Impl& w = *impl_;
  if (w.file != nullptr && std::fflush(w.file) != 0) w.fail("cannot write", errno_text());
  if (w.gz != nullptr && gzflush(w.gz, Z_SYNC_FLUSH) != Z_OK) w.fail("cannot write", w.gz_detail());
}

void RecordWriter::close() {
  Impl& w = *impl_;
  if (w.file != nullptr) {
    FILE* f = w.file;
    w.file = nullptr;
    const bool flushed = std::fflush(f) == 0;
    const std::string err = errno_text();
    if (std::fclose(f) != 0 || !flushed) w.fail("cannot write", flushed ? errno_text() : err);
  }
  if (w.gz != nullptr) {
    gzFile g = w.gz;
    w.gz = nullptr;
    const int rc = gzclose(g);
    if (rc != Z_OK) {
      w.fail("cannot write", rc == Z_ERRNO ? errno_text() : "zlib error " + std::to_string(rc));
    }
  }
}

int64_t RecordWriter::records_written() const { return impl_->written; }

// ---------------------------------------------------------------------------------------------
// RecordReader

struct RecordReader::Impl {
  std::string path;
  Compression compression = Compression::kNone;
  int fd = -1;
  int64_t file_size = 0;  // plain files: for the truncation check before allocating

  // gzip: compressed input and the inflate stream
  bool gzip = false;
  z_stream zs{};
  bool zs_ready = false;
  bool in_member = false;   // inside a gzip member (its end not yet seen)
  bool source_end = false;  // the source has no more bytes
  std::vector<char> in;

  // uncompressed bytes buffered: buf[pos, end) starts at stream offset `offset`
  std::vector<char> buf;
  size_t pos = 0;
  size_t end = 0;

  int64_t offset = 0;  // of the next record's header
  int64_t index = 0;
  bool at_end = false;  // clean end reached, or a non-recoverable error

  ~Impl() {
    if (fd >= 0) ::close(fd);
    if (zs_ready) inflateEnd(&zs);
  }

  [[noreturn]] void fail(const std::string& what) {
    at_end = true;
    throw_record_error(path, index, offset, what);
  }

  // Up to n bytes from the file (fewer only at its end).
  size_t read_file(char* dst, size_t n) {
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::read(fd, dst + got, n - got);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail("read error: " + errno_text());
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    return got;
  }

  // Up to n bytes of the uncompressed stream (fewer only at its end).
  size_t read_stream(char* dst, size_t n) {
    if (!gzip) return read_file(dst, n);
    zs.next_out = reinterpret_cast<Bytef*>(dst);
    size_t produced = 0;
    while (produced < n && !source_end) {
      if (zs.avail_in == 0) {
        const size_t got = read_file(in.data(), in.size());
        if (got == 0) {
          source_end = true;
          if (in_member) fail("corrupt gzip stream: it ends inside a gzip member (truncated)");
          break;
        }
        zs.next_in = reinterpret_cast<Bytef*>(in.data());
        zs.avail_in = static_cast<uInt>(got);
      }
      const size_t want = std::min<size_t>(n - produced, 1u << 30);
      zs.avail_out = static_cast<uInt>(want);
      in_member = true;
      const int rc = inflate(&zs, Z_NO_FLUSH);
      produced += want - zs.avail_out;
      if (rc == Z_STREAM_END) {  // a member ended; another may follow (concatenated gzip)
        in_member = false;
        inflateReset(&zs);
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        fail(std::string("corrupt gzip stream (zlib: ") + (zs.msg ? zs.msg : "error") + ")");
      }
    }
    return produced;
  }

  // Makes at least n (<= buf.size()) bytes buffered when the stream has them; returns how many.
  size_t fill(size_t n) {
    if (end - pos >= n) return end - pos;
    if (buf.size() - pos < n) {  // move the rest to the front
      std::memmove(buf.data(), buf.data() + pos, end - pos);
      end -= pos;
      pos = 0;
    }
    while (end - pos < n) {
      const size_t got = read_stream(buf.data() + end, buf.size() - end);
      if (got == 0) break;
      end += got;
    }
    return end - pos;
  }

  // Reads and checks the next header; false at a clean end.
  bool header(uint64_t* length) {
    if (at_end) return false;
    const size_t have = fill(kHeaderBytes);
    if (have == 0) {
      at_end = true;
      return false;
    }
    if (have < kHeaderBytes) fail(truncated_header(have));
    std::string problem;
    *length = parse_header(buf.data() + pos, &problem);
    if (!problem.empty()) fail(problem);
    pos += kHeaderBytes;
    if (!gzip) {
      const uint64_t left = static_cast<uint64_t>(
          std::max<int64_t>(0, file_size - offset - static_cast<int64_t>(kHeaderBytes)));
      if (*length + kFooterBytes > left) fail(truncated_data(*length, left));
    }
    if (*length > kMaxRecordBytes) fail(too_long(*length));
    return true;
  }

  // Copies n record bytes to dst (or discards them when dst is null) from the buffer, then the
  // stream; returns how many there were.
  uint64_t take(char* dst, uint64_t n) {
    const uint64_t buffered = std::min<uint64_t>(n, end - pos);
    if (dst != nullptr) std::memcpy(dst, buf.data() + pos, buffered);
    pos += buffered;
    uint64_t done = buffered;
    if (done == n) return done;
    pos = end = 0;
    if (dst != nullptr) {  // straight into the record: no copy through the buffer
      while (done < n) {
        const size_t got = read_stream(dst + done, n - done);
        if (got == 0) break;
        done += got;
      }
      return done;
    }
    if (!gzip) {  // the header check guarantees the bytes are in the file
      if (::lseek(fd, static_cast<off_t>(n - done), SEEK_CUR) < 0) fail("seek: " + errno_text());
      return n;
    }
    while (done < n) {
      const size_t got = read_stream(buf.data(), std::min<uint64_t>(n - done, buf.size()));
      if (got == 0) break;
      done += got;
    }
    return done;
  }

  void finish_record(uint64_t length) {
    offset += static_cast<int64_t>(kHeaderBytes + length + kFooterBytes);
    ++index;
  }
};

RecordReader::RecordReader(const std::string& path, Compression c, size_t block_bytes)
    : impl_(new Impl) {
  Impl& r = *impl_;
  r.path = path;
  r.compression = c;
  r.gzip = c == Compression::kGzip;
  r.buf.resize(std::max<size_t>(block_bytes, 64));
  r.fd = open_read(path);
  struct stat st {};
  if (::fstat(r.fd, &st) != 0) throw DataError("cannot stat '" + path + "': " + errno_text());
  r.file_size = st.st_size;
  if (r.gzip) {
    r.in.resize(std::min<size_t>(r.buf.size(), 1u << 20));
    if (inflateInit2(&r.zs, 15 + 32) != Z_OK) {  // 15 + 32: gzip or zlib header, auto-detected
      throw DataError("cannot start zlib for '" + path + "'");
    }
    r.zs_ready = true;
  }
}

RecordReader::~RecordReader() = default;
RecordReader::RecordReader(RecordReader&&) noexcept = default;
RecordReader& RecordReader::operator=(RecordReader&&) noexcept = default;

bool RecordReader::read(std::string* data) {
  Impl& r = *impl_;
  uint64_t length = 0;
  if (!r.header(&length)) return false;
  uint64_t got = 0;
  if (!r.gzip) {  // the header check saw the bytes in the file: allocate once
    data->resize(length);
    got = r.take(data->data(), length);
  } else {
    // A gzip stream's length is unknown until inflated, so a corrupt or hostile header could
    // claim up to kMaxRecordBytes: grow the record with the bytes that actually arrive.
    data->clear();
    while (got < length) {
      const uint64_t want = std::min<uint64_t>(length - got, std::max<uint64_t>(got, 1u << 20));
      data->resize(got + want);
      const uint64_t n = r.take(data->data() + got, want);
      got += n;
      if (n < want) break;
    }
    data->resize(got);
  }
  char footer[kFooterBytes];
  const uint64_t got_footer = got == length ? r.take(footer, kFooterBytes) : 0;
  if (got_footer < kFooterBytes) {
    data->clear();
    r.fail(truncated_data(length, got + got_footer));
  }
  const uint32_t stored = get_le32(footer);
  const uint32_t computed = util::mask_crc(util::crc32c(data->data(), data->size()));
  if (stored != computed) {
    const int64_t index = r.index;
    const int64_t offset = r.offset;
    r.finish_record(length);
    data->clear();
    throw_record_error(r.path, index, offset,
                       "data CRC mismatch (stored " + hex32(stored) + ", computed " +
                           hex32(computed) + "); the file is corrupt",
                       /*recoverable=*/true);
  }
  r.finish_record(length);
  return true;
}

bool RecordReader::skip() {
  Impl& r = *impl_;
  uint64_t length = 0;
  if (!r.header(&length)) return false;
  const uint64_t got = r.take(nullptr, length + kFooterBytes);
  if (got < length + kFooterBytes) r.fail(truncated_data(length, got));
  r.finish_record(length);
  return true;
}

int64_t RecordReader::offset() const { return impl_->offset; }
int64_t RecordReader::index() const { return impl_->index; }
const std::string& RecordReader::path() const { return impl_->path; }

// ---------------------------------------------------------------------------------------------

int64_t count_records(const std::string& path, Compression c) {
  if (c == Compression::kGzip) {
    RecordReader reader(path, c, 1u << 20);
    while (reader.skip()) {
    }
    return reader.index();
  }
  const int fd = open_read(path);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw DataError("cannot stat '" + path + "': " + errno_text());
  const int64_t size = st.st_size;
  int64_t offset = 0;
  int64_t index = 0;
  while (offset < size) {
    char header[kHeaderBytes];
    size_t have = 0;
    while (have < kHeaderBytes) {
      const ssize_t n = ::pread(fd, header + have, kHeaderBytes - have,
                                static_cast<off_t>(offset + static_cast<int64_t>(have)));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_record_error(path, index, offset, "read error: " + errno_text());
      if (n == 0) break;
      have += static_cast<size_t>(n);
    }
    if (have < kHeaderBytes) throw_record_error(path, index, offset, truncated_header(have));
    std::string problem;
    const uint64_t length = parse_header(header, &problem);
    if (!problem.empty()) throw_record_error(path, index, offset, problem);
    const uint64_t left = static_cast<uint64_t>(size - offset - static_cast<int64_t>(kHeaderBytes));
    if (length + kFooterBytes > left) {
      throw_record_error(path, index, offset, truncated_data(length, left));
    }
    if (length > kMaxRecordBytes) throw_record_error(path, index, offset, too_long(length));
    offset += static_cast<int64_t>(kHeaderBytes + length + kFooterBytes);
    ++index;
  }
  return index;
}

}  // namespace trainer::data
