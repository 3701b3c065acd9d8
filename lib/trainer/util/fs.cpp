#include "trainer/util/fs.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "trainer/util/error.h"

namespace trainer::util {

// An I/O failure on a path is a data error (exit 3) that names the path and, for the usual
// causes, says so in words.
void throw_io_error(const std::string& what, const fs::path& path, int err) {
  std::string message = what + " '" + path.string() + "': " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) message += " (the disk is full)";
  if (err == EFBIG) message += " (over the file size limit, ulimit -f)";
  if (err == EROFS) message += " (the file system is read-only)";
  throw DataError(message);
}

namespace {
[[noreturn]] void fail(const std::string& what, const fs::path& path) {
  throw_io_error(what, path, errno);
}
}  // namespace

void require_writable_dir(const fs::path& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) fail("cannot use directory", dir);
  if (!S_ISDIR(st.st_mode)) throw DataError("'" + dir.string() + "' is not a directory");
  if (::access(dir.c_str(), W_OK) != 0) fail("cannot write to directory", dir);
}

AppendFile::AppendFile(const fs::path& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot open for appending", path);
}

AppendFile::AppendFile(AppendFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

AppendFile& AppendFile::operator=(AppendFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AppendFile::append(const std::string& record) {
  if (fd_ < 0) return;
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail("cannot stat", path_);
  if (st.st_nlink == 0) {
    throw DataError("'" + path_.string() +
                    "' was deleted while the job ran (was its directory removed?)");
  }
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = ::write(fd_, record.data() + done, record.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      // Cut the partial record off again (O_APPEND wrote it at the old end of file).
      if (done > 0 && ::ftruncate(fd_, st.st_size) != 0) {
        spdlog::warn("'{}': could not remove a partly written record", path_.string());
      }
      throw_io_error("cannot append to", path_, err);
    }
    done += static_cast<size_t>(n);
  }
}

void replace_dir(const fs::path& built, const fs::path& target) {
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  std::error_code ec;
  if (!fs::exists(target, ec)) {
    if (::rename(built.c_str(), target.c_str()) != 0)
      throw_io_error("cannot rename to", target, errno);
  } else if (::renameat2(AT_FDCWD, built.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(built, ec);  // now the old directory
  } else {
    const fs::path old =
        parent / ("." + target.filename().string() + ".old-" + std::to_string(::getpid()));
    fs::remove_all(old, ec);
    if (::rename(target.c_str(), old.c_str()) != 0)
      throw_io_error("cannot move aside", target, errno);
    if (::rename(built.c_str(), target.c_str()) != 0)
      throw_io_error("cannot rename to", target, errno);
    fs::remove_all(old, ec);
  }
  fsync_dir(parent);
}

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

void refuse_existing_output(const fs::path& path, bool overwrite, const std::string& command,
                            const std::string& option) {
  std::error_code ec;
  if (fs::exists(path, ec) && !overwrite) {
    throw UsageError(command + ": " + option + " '" + path.string() +
                     "' exists; give --overwrite to replace it, or another " + option);
  }
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
  // Read in chunks into one growing string (no second copy as through a stringstream); the
  // size is not trusted up front, as /proc files and pipes report none.
  std::string out;
  std::error_code ec;
  const auto size = fs::is_regular_file(path, ec) ? fs::file_size(path, ec) : 0;
  if (!ec && size > 0) out.reserve(size);
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    out.append(buf, static_cast<size_t>(in.gcount()));
    if (in.eof()) break;
  }
  if (in.bad()) throw DataError("cannot read '" + path.string() + "'");
  return out;
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
