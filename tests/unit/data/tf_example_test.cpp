// tf.train.Example payloads: make/parse round trips, Kaggle-style keys, hand-built protobuf wire
// bytes (packed and unpacked int64 lists), and errors naming the key, the origin and the keys.
#include "common/catch.h"

#include <string>

#include "trainer/data/tf_example.h"
#include "trainer/util/error.h"

using namespace trainer;
using namespace trainer::data;
using trainer::test::Contains;

namespace {

// A length-delimited protobuf field: tag byte, varint length, bytes.
std::string field(int number, const std::string& bytes) {
  std::string out(1, static_cast<char>((number << 3) | 2));
  size_t n = bytes.size();
  while (n >= 0x80) {
    out += static_cast<char>((n & 0x7F) | 0x80);
    n >>= 7;
  }
  out += static_cast<char>(n);
  return out + bytes;
}

// Example{features{feature{key: k, value: <feature bytes>}...}} from raw Feature messages.
std::string example_of(const std::vector<std::pair<std::string, std::string>>& features) {
  std::string entries;
  for (const auto& [key, feature] : features)
    entries += field(1, field(1, key) + field(2, feature));
  return field(1, entries);
}

std::string bytes_feature(const std::string& v) { return field(1, field(1, v)); }
// Int64List values as unpacked varint fields (tag 0x08 per value), or packed (tag 0x0A).
std::string int64_unpacked(const std::string& varints_with_tags) {
  return field(3, varints_with_tags);
}

std::string error_of(const std::string& serialized, const std::string& image_key,
                     const std::string& label_key) {
  try {
    parse_image_example(serialized, image_key, label_key, "data/x.tfrecord record 12");
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no DataError)";
}

}  // namespace

TEST_CASE("make_image_example round trips through parse_image_example", "[data][tf_example]") {
  const std::string image = std::string("\xff\xd8\xff\x00 jpeg bytes \x00\x01", 18);
  for (int64_t label : {int64_t{0}, int64_t{3}, int64_t{999}, int64_t{-1}, int64_t{1} << 40}) {
    const ImageRecord r =
        parse_image_example(make_image_example(image, label), "image", "label", "t");
    CHECK(r.image == image);
    CHECK(r.label == label);
  }
  const ImageRecord empty = parse_image_example(make_image_example("", 5), "image", "label", "t");
  CHECK(empty.image.empty());
  CHECK(empty.label == 5);
}

TEST_CASE("parse_image_example reads Kaggle-style keys", "[data][tf_example]") {
  const std::string s =
      make_image_example("IMG", 1, "image", "target", {{"image_name", "ISIC_0015719"}});
  const ImageRecord r = parse_image_example(s, "image", "target", "t");
  CHECK(r.image == "IMG");
  CHECK(r.label == 1);
  CHECK(error_of(s, "image", "label") ==
        "data/x.tfrecord record 12: no feature 'label' (features: image, image_name, target)");

  const std::string tf = make_image_example("PNG", 42, "image/encoded", "image/class/label",
                                            {{"image/filename", "a.png"}});
  CHECK(parse_image_example(tf, "image/encoded", "image/class/label", "t").label == 42);
}

TEST_CASE("parse_image_example accepts unpacked and packed int64 lists", "[data][tf_example]") {
  const std::string image = bytes_feature("IMG");
  // value: 3 as one unpacked field: 08 03
  const std::string unpacked =
      example_of({{"image", image}, {"label", int64_unpacked("\x08\x03")}});
  CHECK(unpacked.substr(unpacked.size() - 4) == std::string("\x1a\x02\x08\x03", 4));
  ImageRecord r = parse_image_example(unpacked, "image", "label", "t");
  CHECK(r.image == "IMG");
  CHECK(r.label == 3);
  // value: 3 packed: 0A 01 03
  const std::string packed = example_of({{"image", image}, {"label", field(3, field(1, "\x03"))}});
  CHECK(packed.substr(packed.size() - 5) == std::string("\x1a\x03\x0a\x01\x03", 5));
  CHECK(parse_image_example(packed, "image", "label", "t").label == 3);
  // a multi-byte varint: 300 = ac 02
  const std::string big = example_of({{"image", image}, {"label", int64_unpacked("\x08\xac\x02")}});
  CHECK(parse_image_example(big, "image", "label", "t").label == 300);
}

TEST_CASE("parse_image_example errors name the key, the origin and what was expected",
          "[data][tf_example]") {
  const std::string s = make_image_example("IMG", 2, "image", "label", {{"name", "x.jpg"}});
  SECTION("missing key") {
    const std::string e = error_of(s, "image", "target");
    CHECK_THAT(e, Contains("data/x.tfrecord record 12") && Contains("'target'") &&
                      Contains("image, label, name"));
    CHECK_THAT(error_of(s, "img", "label"), Contains("no feature 'img'"));
  }
  SECTION("wrong type") {
    CHECK_THAT(error_of(s, "image", "name"),
               Contains("data/x.tfrecord record 12") &&
                   Contains("feature 'name' is a bytes_list, expected an int64_list"));
    CHECK_THAT(error_of(s, "label", "label"),
               Contains("feature 'label' is an int64_list, expected a bytes_list"));
    const std::string floats = example_of(
        {{"image", bytes_feature("IMG")}, {"label", field(2, field(1, std::string(4, '\0')))}});
    CHECK_THAT(error_of(floats, "image", "label"), Contains("is a float_list"));
  }
  SECTION("two values") {
    const std::string two = example_of(
        {{"image", bytes_feature("IMG")}, {"label", int64_unpacked("\x08\x03\x08\x04")}});
    CHECK_THAT(error_of(two, "image", "label"),
               Contains("feature 'label' has 2 values, expected exactly one"));
    const std::string two_images =
        example_of({{"image", field(1, field(1, "A") + field(1, "B"))},
                    {"label", int64_unpacked(std::string("\x08\x00", 2))}});
    CHECK_THAT(error_of(two_images, "image", "label"),
               Contains("feature 'image' has 2 values, expected exactly one"));
    const std::string none = example_of({{"image", bytes_feature("IMG")}, {"label", field(3, "")}});
    CHECK_THAT(error_of(none, "image", "label"), Contains("has 0 values"));
  }
  SECTION("not an Example") {
    CHECK_THAT(
        error_of("\xff\xff\xff\xff", "image", "label"),
        Contains("data/x.tfrecord record 12") && Contains("not a parseable tf.train.Example"));
    CHECK_THAT(error_of("", "image", "label"), Contains("no feature 'image' (features: none)"));
  }
}
