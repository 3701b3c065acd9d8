// Sources list the examples of a data.train / data.validation spec without decoding any image.
//  - imagefolder: class = sub-directory name, classes sorted; files with an image extension
//    (.jpg .jpeg .png .bmp, any case) anywhere under the class directory, sorted by path within
//    each class; hidden entries (".name") are skipped. A class folder without images is a
//    warning (the class keeps its index); no images at all is an error.
//  - csv: the manifest's rows in order (RFC 4180: quoted fields, "" escapes, CRLF, BOM; blank
//    lines skipped); header row names the columns. If every label is an integer the labels are
//    class indices (names: class_names, else "0".."K-1" with K = max + 1), otherwise class names
//    (sorted unique unless class_names). Image paths are relative to image_root (default: the
//    manifest's directory; a relative image_root is relative to the working directory) and must
//    stay inside it, checked lexically (a `../` escape or an absolute path outside is an error).
//    Rows are numbered from 1 after the header; messages give the row and its line.
//  - tfrecord: record files (record_source.h): `path` is a file, a glob, a list of them, or a
//    TFDS dataset directory; records are counted (metadata, cache or a header scan), not read.
// Stateless and thread-safe (warnings go to spdlog). Throws DataError naming the source, file
// and row.
#pragma once

#include <string>
#include <vector>

#include "trainer/data/example.h"
#include "trainer/data/source_options.h"

namespace trainer::data {

struct ListOptions {
  // tfrecord: a JSON file of record counts per file (keyed by path, size and mtime) read before
  // scanning ("" = none), and whether to write what was scanned back to it (the chief only).
  std::string count_cache;
  bool write_count_cache = false;
};

// field: the dotted name of the source in the spec ("data.train") for messages.
// class_names: if non-empty, the labels are mapped to these names (imagefolder: a sub-directory
// not among them is an error; csv: names or indices must be in range); empty = derive.
Listing list_source(const SourceOptions& source, const std::string& field,
                    const std::vector<std::string>& class_names = {},
                    const ListOptions& options = {});

}  // namespace trainer::data
