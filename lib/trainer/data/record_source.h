// Listing a tfrecord source without decoding any image: which record files (a file, a glob, a
// list of them, or a TFDS dataset directory and its split), the class names, and how many
// records each file holds. Counts come, in this order, from the TFDS metadata
// (dataset_info.json shardLengths), from the count cache (ListOptions::count_cache, entries
// keyed by path, size and mtime), or from a scan of the record length headers (count_records).
// A name such as Kaggle's `ld_train00-1338.tfrec` is never trusted for a count.
// Stateless; thread-safe (the cache file is written atomically).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/data/example.h"
#include "trainer/data/source_options.h"

namespace trainer::data {

// What a TFDS dataset directory says about itself (dataset_info.json, features.json and
// <feature>.labels.txt). Three generations of features.json are read (each seen in a real
// prepared directory): {"type", "content": {...}} (TFDS 2021), {"type", "content": "<proto JSON
// as a string>", "proto_cls"} (2023) and proto JSON {"featuresDict": {"features": {...}}} (2024).
struct TfdsInfo {
  struct Split {
    std::string name;
    bool lengths_declared = false;       // dataset_info.json has shardLengths for it
    std::vector<int64_t> shard_lengths;  // its shardLengths; [] = not declared or unreadable
    int64_t declared_shards = -1;        // len(shardLengths); -1 = not declared or unreadable
    int64_t declared_examples = -1;      // sum(shardLengths); -1 = likewise
    std::string filepath_template;       // "" = TFDS's default
  };
  std::string dir;                       // the version directory holding dataset_info.json
  std::string name;                      // dataset name ("cassava"), "" when not given
  std::string file_format;               // dataset_info.json fileFormat ("" = not given: tfrecord)
  std::vector<std::string> splits;       // split names in dataset_info.json
  std::vector<Split> split_info;         // the same, with what each declares
  std::string supervised_label;          // supervisedKeys' label feature ("" = none given)
  std::vector<std::string> class_names;  // [] = none known
  // Where class_names came from: "label.labels.txt", "features.json (ClassLabel num_classes
  // 10)"; when none are known, why not (for the message that asks for data.class_names).
  std::string class_names_from;
  std::string features_error;  // features.json exists but cannot be read: what is wrong ("" = ok)
};

// True when `dir` holds dataset_info.json.
bool is_tfds_dir(const std::string& dir);

// `path` itself when it holds dataset_info.json, else its sub-directory with the highest
// version (TFDS's <name>/<version>/ layout) that does, else "".
std::string find_tfds_dir(const std::string& path);

// The class names, in this order: <label_key>.labels.txt (TFDS's name for it, '/' -> '-'),
// label.labels.txt, then features.json's ClassLabel for label_key: its names, else num_classes N
// gives "0".."N-1" (what TFDS's ClassLabel(num_classes=N).names is). Throws DataError for a
// dataset_info.json that is not JSON; a bad features.json is only noted (features_error).
TfdsInfo read_tfds_info(const std::string& dir, const std::string& label_key = "label");

// The shard file names dataset_info.json declares for `split` (its shardLengths count, named by
// the split's filepathTemplate, "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}" by default);
// [] when it declares none or the template has a placeholder TFDS does not define.
std::vector<std::string> declared_shard_files(const TfdsInfo& info, const std::string& split);

// The listing of `source` (format tfrecord). field: "data.train"; origin: for messages.
// Throws DataError (no such file, no match for a glob, a missing shard, a corrupt file) or
// ConfigError (no class names known, a split that the directory does not have).
Listing list_tfrecord(const SourceOptions& source, const std::string& field,
                      const std::string& origin, const std::vector<std::string>& class_names,
                      const ListOptions& options);

// Writes the record counts of `listing` (when some were scanned, not all read from the cache)
// into the count cache at `path`, keeping its other entries; "" = no cache. A cache that cannot
// be written is a warning, not an error: it only saves the next listing a scan.
void update_count_cache(const std::string& path, const Listing& listing);

}  // namespace trainer::data
