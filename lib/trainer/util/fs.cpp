#include "trainer/util/fs.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "trainer/util/error.h"

namespace trainer::util {

namespace {
// An I/O failure on a path is a data error (exit 3) that names the path and, for the usual
// causes, says so in words.
[[noreturn]] void fail(const std::string& what, const fs::path& path) {
  const int err = errno;
  std::string message = what + " '" + path.string() + "': " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) message += " (the disk is full)";
  if (err == EROFS) message += " (the file system is read-only)";
  throw DataError(message);
}
}  // namespace

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) fail("cannot open directory", dir);
  // Some file systems cannot fsync a directory (EINVAL, ENOTSUP: e.g. FUSE mounts such as
  // gcsfuse); that is not a failure of this write. Anything else (EIO) is.
  if (::fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP) {
    const int err = errno;
    ::close(fd);
    errno = err;
    fail("cannot fsync directory", dir);
  }
  ::close(fd);
}

void write_file_atomic(const fs::path& path, const std::string& bytes) {
  fs::path tmp = path;
  tmp += ".tmp-" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create", tmp);
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int saved = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      errno = saved;
      fail("cannot write", tmp);
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  int err = errno;
  const bool closed = ::close(fd) == 0;
  if (synced && !closed) err = errno;
  if (!synced || !closed) {
    ::unlink(tmp.c_str());
    errno = err;
    fail("cannot flush", tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    errno = err;
    fail("cannot rename into place", path);
  }
  fsync_dir(path.parent_path());
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError("cannot open '" + path.string() + "': " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw DataError("cannot read '" + path.string() + "'");
  return ss.str();
}

uint32_t crc32(const void* data, size_t size, uint32_t seed) {
  uLong crc = seed;
  const auto* p = static_cast<const Bytef*>(data);
  while (size > 0) {
    uInt chunk = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
    crc = ::crc32(crc, p, chunk);
    p += chunk;
    size -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace trainer::util
