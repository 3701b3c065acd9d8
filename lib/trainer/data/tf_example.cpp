#include "trainer/data/tf_example.h"

#include <algorithm>

#include "trainer/data/proto/example.pb.h"
#include "trainer/util/error.h"

namespace trainer::data {

namespace {

const char* kind_name(const tfproto::Feature& f) {
  switch (f.kind_case()) {
    case tfproto::Feature::kBytesList:
      return "a bytes_list";
    case tfproto::Feature::kFloatList:
      return "a float_list";
    case tfproto::Feature::kInt64List:
      return "an int64_list";
    case tfproto::Feature::KIND_NOT_SET:
      break;
  }
  return "an empty feature (no kind set)";
}

// Printable ASCII as is, other bytes as \xNN (keys come from files of other tools).
std::string printable(const std::string& key) {
  std::string out;
  for (const unsigned char c : key.substr(0, 64)) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += std::string("\\x") + hex[c >> 4] + hex[c & 15];
    }
  }
  return key.size() > 64 ? out + "..." : out;
}

// "image, image_name, label" (sorted and unique, so messages are stable; at most 20 keys)
std::string key_list(const tfproto::Features& features) {
  std::vector<std::string> keys;
  for (const auto& entry : features.feature()) keys.push_back(entry.key());
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::string out;
  for (size_t i = 0; i < keys.size() && i < 20; ++i) {
    out += (out.empty() ? "" : ", ") + printable(keys[i]);
  }
  if (keys.size() > 20) out += ", ... (" + std::to_string(keys.size()) + " in all)";
  return out.empty() ? "none" : out;
}

const tfproto::Feature& find_feature(const tfproto::Features& features, const std::string& key,
                                     const std::string& origin) {
  const auto& entries = features.feature();
  for (int i = entries.size() - 1; i >= 0; --i) {  // the last entry of a key wins, as in a map
    if (entries.Get(i).key() == key) return entries.Get(i).value();
  }
  throw DataError(origin + ": no feature '" + key + "' (features: " + key_list(features) + ")");
}

[[noreturn]] void wrong_kind(const tfproto::Feature& f, const std::string& key,
                             const char* expected, const std::string& origin) {
  throw DataError(origin + ": feature '" + key + "' is " + kind_name(f) + ", expected " + expected);
}

[[noreturn]] void wrong_count(int n, const std::string& key, const char* what,
                              const std::string& origin) {
  throw DataError(origin + ": feature '" + key + "' has " + std::to_string(n) +
                  " values, expected exactly one " + what);
}

}  // namespace

ImageRecord parse_image_example(const std::string& serialized, const std::string& image_key,
                                const std::string& label_key, const std::string& origin) {
  tfproto::Example example;
  if (!example.ParseFromString(serialized)) {
    throw DataError(origin + ": not a parseable tf.train.Example (" +
                    std::to_string(serialized.size()) + " bytes)");
  }
  const tfproto::Features& features = example.features();
  ImageRecord out;

  const tfproto::Feature& image = find_feature(features, image_key, origin);
  if (!image.has_bytes_list())
    wrong_kind(image, image_key, "a bytes_list (the encoded image)", origin);
  if (image.bytes_list().value_size() != 1) {
    wrong_count(image.bytes_list().value_size(), image_key, "(the encoded image)", origin);
  }
  out.image = image.bytes_list().value(0);

  const tfproto::Feature& label = find_feature(features, label_key, origin);
  if (!label.has_int64_list())
    wrong_kind(label, label_key, "an int64_list (the class index)", origin);
  if (label.int64_list().value_size() != 1) {
    wrong_count(label.int64_list().value_size(), label_key, "(the class index)", origin);
  }
  out.label = label.int64_list().value(0);
  return out;
}

std::string make_image_example(
    const std::string& image, int64_t label, const std::string& image_key,
    const std::string& label_key,
    const std::vector<std::pair<std::string, std::string>>& extra_bytes) {
  tfproto::Example example;
  tfproto::Features& features = *example.mutable_features();
  const auto add = [&features](const std::string& key) {
    tfproto::FeatureEntry* entry = features.add_feature();
    entry->set_key(key);
    return entry->mutable_value();
  };
  add(image_key)->mutable_bytes_list()->add_value(image);
  add(label_key)->mutable_int64_list()->add_value(label);
  for (const auto& [key, value] : extra_bytes) add(key)->mutable_bytes_list()->add_value(value);
  std::string out;
  if (!example.SerializeToString(&out)) {
    throw Error(ErrorKind::kInternal, "cannot serialize a tf.train.Example");
  }
  return out;
}

}  // namespace trainer::data
