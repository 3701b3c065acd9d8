// tf.train.Example payloads of image TFRecords: parse one into (encoded image bytes, label) and
// build one (for the dataset writer and tests). Protobuf stays inside tf_example.cpp (generated
// from proto/example.proto, TensorFlow's field numbers). Stateless and thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace trainer::data {

struct ImageRecord {
  std::string image;  // the encoded image (JPEG/PNG bytes) as stored
  int64_t label = 0;
};

// Parses a serialized tf.train.Example: `image_key` must be a bytes_list with exactly one value,
// `label_key` an int64_list with exactly one value (packed or unpacked encoding). Other features
// are ignored. Throws DataError starting with `origin` (e.g. "data/x.tfrecord record 12") and
// naming the key, what was expected and the keys present, e.g. "data/x.tfrecord record 12: no
// feature 'target' (features: image, image_name, label)".
ImageRecord parse_image_example(const std::string& serialized, const std::string& image_key,
                                const std::string& label_key, const std::string& origin);

// A serialized tf.train.Example with `image_key` -> bytes_list{image}, `label_key` ->
// int64_list{label}, and each of `extra_bytes` (key, value) as one more one-value bytes_list
// (e.g. {"image/filename", "cat.jpg"}).
std::string make_image_example(
    const std::string& image, int64_t label, const std::string& image_key = "image",
    const std::string& label_key = "label",
    const std::vector<std::pair<std::string, std::string>>& extra_bytes = {});

}  // namespace trainer::data
