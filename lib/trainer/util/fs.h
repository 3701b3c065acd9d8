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

// fsync a directory (so a rename inside it is durable).
void fsync_dir(const fs::path& dir);

// Whole file as bytes; throws DataError naming the path when it cannot be read.
std::string read_file(const fs::path& path);

// CRC-32 (zlib polynomial) of a byte range; used for checkpoint integrity.
uint32_t crc32(const void* data, size_t size, uint32_t seed = 0);

}  // namespace trainer::util
