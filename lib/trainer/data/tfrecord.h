// The TFRecord container: records framed as [uint64 LE length][uint32 LE masked CRC-32C of the
// length][data][uint32 LE masked CRC-32C of the data], optionally inside a gzip stream. Readers
// and writers own their file and buffers; one object per thread (distinct objects are independent).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "trainer/util/error.h"

namespace trainer::data {

enum class Compression { kNone, kGzip };

// "none" or "gzip" as written in a job spec.
const char* compression_name(Compression c);

// setting is "auto" | "none" | "gzip"; "auto" is gzip when `path` starts with the gzip magic
// bytes 1f 8b, else none. An unknown setting is a ConfigError; for "auto", a file that cannot
// be opened is a DataError naming it.
Compression compression_for(const std::string& setting, const std::string& path);

// The largest record the readers accept; a bigger length in a header is taken as corruption.
constexpr uint64_t kMaxRecordBytes = uint64_t{2} << 30;  // 2 GiB

// A bad record. The message names the file, the record number and the byte offset of its header
// (in the uncompressed stream), e.g. "x.tfrecord: record 3 at byte offset 1234: data CRC mismatch
// (stored 0x..., computed 0x...); the file is corrupt". `recoverable` is true only for a data CRC
// mismatch: the length was good, so the reader already stands at the next record and may go on.
// After any other RecordError the reader is at its end (read() and skip() return false).
struct RecordError : DataError {
  RecordError(const std::string& msg, bool recoverable)
      : DataError(msg), recoverable(recoverable) {}
  bool recoverable;
};

// One record as it is written: header, data, footer (for writing a whole file at once).
std::string frame_record(const std::string& data);

// Appends records to a new file (truncating an existing one). Errors are DataError naming the
// path. The destructor closes quietly; call close() to see errors. Movable; a moved-from writer
// may only be destroyed or assigned to.
class RecordWriter {
 public:
  explicit RecordWriter(const std::string& path, Compression c = Compression::kNone);
  ~RecordWriter();
  RecordWriter(RecordWriter&&) noexcept;
  RecordWriter& operator=(RecordWriter&&) noexcept;

  void write(const std::string& data);
  void flush();  // hands the buffered records to the OS (a reader sees them whole)
  void close();  // flushes and closes; further write() is an error; a second close() is a no-op
  int64_t records_written() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Reads one file's records in order, in blocks of `block_bytes` (plain files with read(), gzip
// through zlib inflate); never holds more than a block plus the current record in memory.
// Movable; a moved-from reader may only be destroyed or assigned to.
class RecordReader {
 public:
  RecordReader(const std::string& path, Compression c, size_t block_bytes = 4 << 20);
  ~RecordReader();
  RecordReader(RecordReader&&) noexcept;
  RecordReader& operator=(RecordReader&&) noexcept;

  // The next record's data into *data; false at a clean end of file. Throws RecordError.
  bool read(std::string* data);
  // Passes over the next record (its length CRC is checked, its data CRC is not); false at a
  // clean end of file. Plain files seek over data that is not buffered. Throws RecordError.
  bool skip();

  int64_t offset() const;  // byte offset (uncompressed stream) of the next record's header
  int64_t index() const;   // number of the next record, from 0
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The number of records in a file, from the length headers alone: plain files read each 12-byte
// header, check its CRC and seek past the data (checked against the file size); gzip files are
// read through RecordReader::skip. Throws the same RecordError as the reader, DataError when the
// file cannot be opened.
int64_t count_records(const std::string& path, Compression c);

}  // namespace trainer::data
