// Listing a tfrecord source without decoding any image: which record files (a file, a glob, a
// list of them, or a TFDS dataset directory and its split), the class names, and how many
// records each file holds. Counts come, in this order, from the TFDS metadata
// (dataset_info.json shardLengths), from the count cache (ListOptions::count_cache, entries
// keyed by path, size and mtime), or from a scan of the record length headers (count_records).
// A name such as Kaggle's `ld_train00-1338.tfrec` is never trusted for a count.
// Stateless; thread-safe (the cache file is written atomically).
#pragma once

#include <string>
#include <vector>

#include "trainer/data/example.h"
#include "trainer/data/source.h"
#include "trainer/data/source_options.h"

namespace trainer::data {

// What a TFDS dataset directory says about itself.
struct TfdsInfo {
  std::string dir;                       // the version directory holding dataset_info.json
  std::string name;                      // dataset name ("cassava"), "" when not given
  std::vector<std::string> class_names;  // label.labels.txt, one per line ([] = absent)
  std::vector<std::string> splits;       // split names in dataset_info.json
};

// True when `dir` holds dataset_info.json.
bool is_tfds_dir(const std::string& dir);

// `path` itself when it holds dataset_info.json, else its sub-directory with the highest
// version (TFDS's <name>/<version>/ layout) that does, else "".
std::string find_tfds_dir(const std::string& path);

TfdsInfo read_tfds_info(const std::string& dir);

// The listing of `source` (format tfrecord). field: "data.train"; origin: for messages.
// Throws DataError (no such file, no match for a glob, a missing shard, a corrupt file) or
// ConfigError (no class names known, a split that the directory does not have).
Listing list_tfrecord(const SourceOptions& source, const std::string& field,
                      const std::string& origin, const std::vector<std::string>& class_names,
                      const ListOptions& options);

}  // namespace trainer::data
