#include "trainer/util/storage.h"

#include <sys/stat.h>

#include <cctype>
#include <cstdlib>

#include "trainer/util/error.h"

namespace trainer::util {

namespace fs = std::filesystem;

namespace {

// The scheme of `s` ("gs" for "gs://b/p"), or "" when it does not start with `scheme://`
// (RFC 3986: a letter, then letters, digits, '+', '-', '.').
std::string scheme_of(const std::string& s) {
  const size_t colon = s.find("://");
  if (colon == std::string::npos || colon == 0) return "";
  if (!std::isalpha(static_cast<unsigned char>(s[0]))) return "";
  for (size_t i = 1; i < colon; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (!std::isalnum(c) && c != '+' && c != '-' && c != '.') return "";
  }
  return s.substr(0, colon);
}

// Whether `dir` is a directory on another file system than the directory above `root` (the
// bucket mounted at root/B, or the whole root mounted as on Vertex AI).
bool is_mounted(const fs::path& dir, const fs::path& root) {
  struct stat d {
  }, above{};
  const fs::path parent = root.has_parent_path() ? root.parent_path() : fs::path("/");
  if (::stat(dir.c_str(), &d) != 0 || !S_ISDIR(d.st_mode)) return false;
  if (::stat(parent.c_str(), &above) != 0) return false;
  return d.st_dev != above.st_dev;
}

}  // namespace

fs::path gcs_mount_root() {
  const char* env = std::getenv("TRAINER_GCS_ROOT");
  return env != nullptr && *env != '\0' ? fs::path(env) : fs::path("/gcs");
}

std::string local_path(const std::string& given, const std::string& what) {
  const std::string scheme = scheme_of(given);
  if (scheme.empty()) return given;
  const std::string rest = given.substr(scheme.size() + 3);
  const std::string quoted = what + " '" + given + "'";
  if (scheme == "file") {
    if (rest.empty() || rest[0] != '/') {
      throw ConfigError(quoted + ": expected file:///ABSOLUTE/PATH");
    }
    return rest;
  }
  if (scheme == "gs") {
    const size_t slash = rest.find('/');
    const std::string bucket = rest.substr(0, slash);
    const std::string path = slash == std::string::npos ? "" : rest.substr(slash + 1);
    if (bucket.empty() || bucket == "." || bucket == "..") {
      throw ConfigError(quoted + ": expected gs://BUCKET/PATH");
    }
    const fs::path root = gcs_mount_root();
    const fs::path mount = root / bucket;
    if (!is_mounted(mount, root)) {
      throw ConfigError(
          quoted + ": the bucket is not mounted at " + mount.string() +
          ". The trainer reads and writes Cloud Storage through a FUSE mount: Vertex AI mounts "
          "every bucket at /gcs; elsewhere run `mkdir -p " +
          mount.string() + " && gcsfuse " + bucket + " " + mount.string() +
          "` (Cloud Storage FUSE), or give a local path");
    }
    return path.empty() ? mount.string() : (mount / path).string();
  }
  throw ConfigError(quoted + ": the trainer reads and writes only the file system, not '" + scheme +
                    "://' URLs; mount the storage (for example s3fs or mountpoint-s3 for s3://, "
                    "fuse-dfs for hdfs://) and give the path of the mount");
}

}  // namespace trainer::util
