// make-dataset: a synthetic, learnable Cassava-like image set written as JPEG files in the
// ImageFolder layout DIR/<split>/<class>/<class>_<nnnn>.jpg, or (format tfrecord) as TFRecord
// shards of tf.train.Example records (image_key: the JPEG bytes, label_key: the int64 class,
// "image/filename"): DIR/<split>-NNNNN-of-MMMMM.tfrecord, or with `tfds` a TFDS dataset
// directory (dataset_info.json with shardLengths, label.labels.txt,
// <name>-<split>.tfrecord-NNNNN-of-MMMMM). Examples go to shards round robin. Classes (cbb, cbsd,
// cgm, cmd, healthy, then class5, ...) differ in leaf colour and lesion texture so that a small CNN
// tells them apart within a few epochs. Deterministic for a seed. Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer::synth {

struct SyntheticOptions {
  std::string out_dir;
  int classes = 5;
  int per_class = 100;  // images per class in the first split (train);
                        // later splits get max(4, per_class / 4)
  int image_size = 96;
  uint64_t seed = 0;
  int image_height = 0;  // 0 = image_size (square); else image_size wide, this tall
  std::vector<std::string> splits = {"train", "validation"};
  std::string format = "jpeg";   // jpeg (ImageFolder) | tfrecord
  int shards = 4;                // tfrecord: files per split
  bool tfds = false;             // tfrecord: write a TFDS dataset directory
  std::string name = "cassava";  // tfds: the dataset name in file names and dataset_info.json
  std::string image_key = "image";
  std::string label_key = "label";
  std::string compression = "none";  // tfrecord: none | gzip
};

struct SyntheticSummary {
  std::vector<std::string> class_names;
  std::vector<std::pair<std::string, int64_t>> images_per_split;
  std::vector<std::string> files;  // tfrecord: the shards written
};

// Images are rendered by a few threads, each from mix_seed(seed, {split index, class, index}),
// and written as JPEG (quality 90). A re-run into the same directory overwrites; files named
// <class>_<digits>.jpg beyond this run's counts (and synthetic class folders beyond `classes`)
// left by an earlier, larger run are removed, so a listing sees exactly this run's images.
// Throws UsageError for bad options, DataError when a file cannot be written.
SyntheticSummary make_synthetic_dataset(const SyntheticOptions& options);

// The class names make_synthetic_dataset uses for `classes` classes.
std::vector<std::string> synthetic_class_names(int classes);

}  // namespace trainer::synth
