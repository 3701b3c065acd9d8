// Sources list the examples of a data.train / data.validation spec without decoding any image.
//  - imagefolder: class = sub-directory name, classes sorted; files with an image extension
//    (.jpg .jpeg .png .bmp, any case) anywhere under the class directory, sorted by path within
//    each class; hidden entries (".name") are skipped; GIFs are left out with one warning (as
//    torchvision's ImageFolder leaves them out, whether or not the OpenCV decodes GIF). A class
//    folder without images is a warning (the class keeps its index); no images at all is an error.
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

// field: the dotted name of the source in the spec ("data.train") for messages.
// class_names: if non-empty, the labels are mapped to these names (imagefolder: a sub-directory
// not among them is an error; csv: names or indices must be in range); empty = derive.
Listing list_source(const SourceOptions& source, const std::string& field,
                    const std::vector<std::string>& class_names = {},
                    const ListOptions& options = {});

// An image file the sources list: .jpg .jpeg .png .bmp, any case.
bool is_image_file(const std::string& path);
// A .gif (any case): never listed (kGifNote says why); warned about where found.
bool is_gif_file(const std::string& path);
extern const char* const kGifNote;

// The image files under `dir` (recursive; hidden entries skipped), sorted; GIFs found are added
// to *gifs when given. Throws DataError naming `origin` when the directory cannot be listed.
std::vector<std::string> list_image_files(const std::string& dir, const std::string& origin,
                                          std::vector<std::string>* gifs = nullptr);
// One warning for GIFs left out of a listing (none: nothing).
void warn_unlisted_gifs(const std::string& origin, std::vector<std::string> gifs);

// The image paths of a CSV manifest's `column` ("" = image_id, image, path, filename or file,
// whichever comes first, else the first column), relative to image_root ("" = the manifest's
// directory) and kept inside it, as the csv source reads them. Throws DataError.
std::vector<std::string> list_manifest_images(const std::string& path, const std::string& column,
                                              const std::string& image_root,
                                              const std::string& origin);

}  // namespace trainer::data
