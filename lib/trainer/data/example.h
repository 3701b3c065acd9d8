// What a source lists: one labelled image per Example, and the class names of the listing. An
// image source (imagefolder, csv) lists one file per example; a record source (tfrecord) lists
// record files, each holding many examples whose labels are only known once a record is read.
// Plain values; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer::data {

struct Example {
  std::string path;     // the encoded image, or (record >= 0) the record file holding it
  int64_t label = 0;    // index into Listing::class_names; -1 = in the record (tfrecord)
  int64_t record = -1;  // record number within `path` (tfrecord); -1 = `path` is the image
};

// One record file of a tfrecord listing: its examples are examples[first, first + records).
struct RecordFile {
  std::string path;
  int64_t records = 0;
  int64_t first = 0;
  int64_t size = -1;      // the file's size and mtime when it was counted (the count cache's
  int64_t mtime_ns = -1;  // key), -1 when the counts came from TFDS metadata
};

// How records are read back (the source's tfrecord settings).
struct RecordFormat {
  std::string image_key = "image";
  std::string label_key = "label";
  std::string compression = "auto";  // auto | none | gzip
};

struct Listing {
  std::vector<Example> examples;
  std::vector<std::string> class_names;
  std::string origin;  // what was listed (for messages), e.g. "data.train (imagefolder 'dir')"
  std::vector<RecordFile> record_files;  // tfrecord: the files in read order; else empty
  RecordFormat record_format;            // tfrecord only
  std::string counts_from;      // tfrecord: where the record counts came from (for the log)
  bool counts_scanned = false;  // tfrecord: some counts came from a scan (update_count_cache)
  bool is_records() const { return !record_files.empty(); }
};

}  // namespace trainer::data
