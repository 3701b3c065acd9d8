// Image decode and the transforms (JPEG, PNG, BMP and whatever else OpenCV recognises), through
// the loader's ImagePipeline: input byte 0 picks the pipeline (train with RandomResizedCrop and
// flip, eval with reduced JPEG decode, the cache's two stages) and the image size; the rest is
// the file.
#include "fuzz_common.h"
#include "trainer/data/image.h"

using namespace trainer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const int kSizes[] = {1, 7, 32, 224};
  data::PreprocessOptions o;
  o.image_size = kSizes[data[0] & 3];
  o.train = (data[0] & 4) != 0;
  o.random_resized_crop = o.train;
  o.horizontal_flip = o.train;
  o.reduced_decode = (data[0] & 8) != 0;
  const bool cache = (data[0] & 16) != 0;
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  fuzz::expect_clean_errors("image", [&] {
    const data::ImagePipeline pipeline(o);
    const torch::Tensor image = cache ? pipeline.augment(pipeline.decode_resized(bytes, "input"), 7)
                                      : pipeline.decode(bytes, "input", 7);
    if (image.sizes() != torch::IntArrayRef({o.image_size, o.image_size, 3})) {
      std::fprintf(stderr, "image: wrong output shape\n");
      std::abort();
    }
  });
  return 0;
}
