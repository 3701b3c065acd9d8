// Small filesystem helpers: durable atomic writes (temp name, fsync, rename, as leveldb's
// SetCurrentFile does) and whole-file reads. Stateless and thread-safe; errors throw the
// ErrorKind given by the caller's context (default kInternal) naming the path.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace trainer::util {

namespace fs = std::filesystem;

// Writes `bytes` to `path` via `path.tmp-<pid>`, fsyncs the file and its directory, renames.
void write_file_atomic(const fs::path& path, const std::string& bytes);

// For a command's output file: throws UsageError "<command>: <option> 'PATH' exists; give
// --overwrite to replace it, or another <option>" when `path` exists and !overwrite. Call it
// before anything is written.
void refuse_existing_output(const fs::path& path, bool overwrite, const std::string& command,
                            const std::string& option);

// True when `pattern` has a glob(3) wildcard (* ? [).
inline bool has_glob_chars(const std::string& pattern) {
  return pattern.find_first_of("*?[") != std::string::npos;
}

// fsync a directory (so a rename inside it is durable).
void fsync_dir(const fs::path& dir);

// Puts the directory `built` (complete, its files durable) at `target`, replacing what is there:
// one atomic exchange where the file system has it (renameat2 RENAME_EXCHANGE), else the old
// directory renamed aside first, so a reader sees the old directory, the new one, or for a
// moment none, never a mix. Then removes the old one and fsyncs the parent. Both paths must be
// in one directory. Throws DataError naming the path.
void replace_dir(const fs::path& built, const fs::path& target);

// Throws DataError "WHAT 'PATH': strerror(err)", adding "(the disk is full)" or "(the file system
// is read-only)" for those causes.
[[noreturn]] void throw_io_error(const std::string& what, const fs::path& path, int err);

// Checks that `dir` is a directory this process can write to (access(2) W_OK, which also fails on a
// read-only mount for root); throws DataError naming it and the cause.
void require_writable_dir(const fs::path& dir);

// A file that only grows by whole records (metrics.jsonl, the evaluator's log): each append() is
// one write of the whole record or nothing. When a write fails part-way (a full disk), the file is
// cut back to its size before the record and DataError names the path and cause, so a reader
// never sees a torn record. A file deleted while open (its job dir removed) is an error too,
// instead of records going to an unlinked inode. Move-only; not thread-safe.
class AppendFile {
 public:
  AppendFile() = default;                     // closed: append() is a no-op
  explicit AppendFile(const fs::path& path);  // opens or creates for appending
  AppendFile(AppendFile&& other) noexcept;
  AppendFile& operator=(AppendFile&& other) noexcept;
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  ~AppendFile();

  bool is_open() const { return fd_ >= 0; }
  void append(const std::string& record);

 private:
  fs::path path_;
  int fd_ = -1;
};

// Whole file as bytes; throws DataError naming the path when it cannot be read.
std::string read_file(const fs::path& path);

// CRC-32 (zlib polynomial) of a byte range; used for checkpoint integrity.
uint32_t crc32(const void* data, size_t size, uint32_t seed = 0);

}  // namespace trainer::util
