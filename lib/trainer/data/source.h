// Sources list the examples of a data.train / data.validation spec without decoding any image.
//  - imagefolder: class = sub-directory name, classes sorted; files with an image extension
//    (.jpg .jpeg .png .bmp), sorted by path within each class.
//  - csv: the manifest's rows in order; header row names the columns; the label column holds a
//    class index (0..K-1) or a class name. Image paths are relative to image_root and must stay
//    inside it (a `../` escape or an absolute path outside is a DataError).
// Stateless and thread-safe. Throws DataError naming the source, file and row.
#pragma once

#include <string>
#include <vector>

#include "trainer/config/job_spec.h"
#include "trainer/data/example.h"

namespace trainer::data {

// field: the dotted name of the source in the spec ("data.train") for messages.
// class_names: if non-empty, the labels are mapped to these names (imagefolder: a sub-directory
// not among them is an error; csv: names or indices must be in range); empty = derive.
Listing list_source(const config::SourceSpec& source, const std::string& field,
                    const std::vector<std::string>& class_names = {});

}  // namespace trainer::data
