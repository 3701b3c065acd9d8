// Paths that name cloud storage (`gs://BUCKET/PATH`, `s3://...`). The trainer reads and writes
// only through the file system, so such a path must resolve to a mounted bucket, never to a
// local folder named after the scheme. `gs://BUCKET/PATH` is `/gcs/BUCKET/PATH` when the bucket
// is mounted there (Vertex AI's Cloud Storage FUSE convention, or any gcsfuse mount); every other
// scheme is refused with a message that says how to mount it. Stateless and thread-safe.
#pragma once

#include <filesystem>
#include <string>

namespace trainer::util {

// Where buckets are mounted: $TRAINER_GCS_ROOT when set (tests, another mount point), else /gcs.
std::filesystem::path gcs_mount_root();

// `given` unchanged when it has no `scheme://` prefix; `file:///x` as `/x`; `gs://B/P` as
// `<gcs_mount_root()>/B/P` when `<root>/B` is a mounted file system (a different device from the
// directory that holds the root, so a plain local folder there does not count). Otherwise throws
// ConfigError (exit 2) "WHAT 'given': ..." saying how to mount the bucket.
std::string local_path(const std::string& given, const std::string& what);

}  // namespace trainer::util
