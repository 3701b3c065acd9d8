// Where a source's examples are listed from: the job spec's data.train / data.validation
// section, defined once here and read into by config (config::SourceSpec is this struct), so no
// field is copied by hand between two twins. The one header of data/ that config/ may include:
// it holds plain values and includes only the standard library (scripts/check-layering.sh).
// A plain value: thread-safe to share once built.
#pragma once

#include <string>
#include <vector>

namespace trainer::data {

struct SourceOptions {
  std::string format = "imagefolder";  // imagefolder | csv | tfrecord
  // imagefolder: dir with one sub-dir per class; csv: the manifest file; tfrecord: record files
  // (a file, a glob, a list of either) or a TFDS dataset directory. Empty (the default) = no
  // such source.
  std::vector<std::string> path;
  std::string image_column = "image_id";  // csv: column holding the image path (relative)
  std::string label_column = "label";     // csv: column holding the label (index or name)
  std::string image_root;                 // csv: dir the image paths are relative to
                                          // ("" = the manifest's directory)
  std::string split;                      // tfrecord, TFDS dir: train | validation | test
                                          // ("" = the source's own name: train or validation)
  std::string image_key = "image";        // tfrecord: feature holding the encoded image (bytes)
  std::string label_key = "label";        // tfrecord: feature holding the class index (int64);
                                          // Kaggle's .tfrec files: `target`
  std::string compression = "auto";  // tfrecord: auto (gzip when the file says so) | none | gzip
  bool enabled() const { return !path.empty(); }
};

// How a source is listed (list_source, list_tfrecord).
struct ListOptions {
  // tfrecord: a JSON file of record counts per file (keyed by path, size and mtime) read before
  // scanning ("" = none), and whether to write what was scanned back to it (a training job
  // leaves this off and writes the cache through chief_writes: update_count_cache).
  std::string count_cache;
  bool write_count_cache = false;
};

}  // namespace trainer::data
