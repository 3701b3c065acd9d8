// tf.train.Example parsing with image/label extraction, under the default keys (image, label)
// and Kaggle's (image, target), as the record loader calls it.
#include "fuzz_common.h"
#include "trainer/data/tf_example.h"

using namespace trainer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  fuzz::expect_clean_errors(
      "example", [&] { data::parse_image_example(bytes, "image", "label", "input record 0"); });
  fuzz::expect_clean_errors(
      "example", [&] { data::parse_image_example(bytes, "image", "target", "input record 0"); });
  return 0;
}
