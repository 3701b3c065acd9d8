// What a source lists: one labelled image per Example, and the class names of the listing.
// Plain values; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer::data {

struct Example {
  std::string path;   // absolute or relative-to-cwd path of the encoded image
  int64_t label = 0;  // index into Listing::class_names
};

struct Listing {
  std::vector<Example> examples;
  std::vector<std::string> class_names;
  std::string origin;  // what was listed (for messages), e.g. "data.train (imagefolder 'dir')"
};

}  // namespace trainer::data
