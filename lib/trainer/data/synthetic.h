// make-dataset: a synthetic, learnable Cassava-like image set written as JPEG files in the
// ImageFolder layout DIR/<split>/<class>/<class>_<nnnn>.jpg. Classes (cbb, cbsd, cgm, cmd,
// healthy, then class5, ...) differ in leaf colour and lesion texture so that a small CNN tells
// them apart within a few epochs. Deterministic for a seed. Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer::data {

struct SyntheticOptions {
  std::string out_dir;
  int classes = 5;
  int per_class = 100;  // images per class in the first split (train);
                        // later splits get max(4, per_class / 4)
  int image_size = 96;
  uint64_t seed = 0;
  std::vector<std::string> splits = {"train", "validation"};
};

struct SyntheticSummary {
  std::vector<std::string> class_names;
  std::vector<std::pair<std::string, int64_t>> images_per_split;
};

// Images are rendered by a few threads, each from mix_seed(seed, {split index, class, index}),
// and written as JPEG (quality 90). A re-run into the same directory overwrites; files named
// <class>_<digits>.jpg beyond this run's counts (and synthetic class folders beyond `classes`)
// left by an earlier, larger run are removed, so a listing sees exactly this run's images.
// Throws UsageError for bad options, DataError when a file cannot be written.
SyntheticSummary make_synthetic_dataset(const SyntheticOptions& options);

// The class names make_synthetic_dataset uses for `classes` classes.
std::vector<std::string> synthetic_class_names(int classes);

}  // namespace trainer::data
