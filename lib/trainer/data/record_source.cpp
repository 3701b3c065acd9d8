#include "trainer/data/record_source.h"

#include <glob.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "trainer/data/tfrecord.h"
#include "trainer/util/error.h"
#include "trainer/util/fs.h"

namespace trainer::data {

namespace fs = std::filesystem;

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// "1.2.10" < "1.10.0": compares dot-separated numbers; non-numeric names sort first.
std::vector<long> version_key(const std::string& name) {
  std::vector<long> key;
  std::stringstream ss(name);
  std::string part;
  while (std::getline(ss, part, '.')) {
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos) return {};
    key.push_back(std::stol(part));
  }
  return key;
}

std::vector<std::string> expand_glob(const std::string& pattern, const std::string& origin) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) {
      if (fs::is_regular_file(g.gl_pathv[i])) out.emplace_back(g.gl_pathv[i]);
    }
  }
  globfree(&g);
  if (rc != 0 && rc != GLOB_NOMATCH) {
    throw DataError(origin + ": cannot expand the glob '" + pattern +
                    "' (out of memory or an unreadable directory)");
  }
  if (out.empty()) {
    // Say which directory is missing when the pattern's fixed part does not exist.
    fs::path fixed;
    for (const auto& part : fs::path(pattern).parent_path()) {
      if (util::has_glob_chars(part.string())) break;
      fixed /= part;
    }
    std::error_code ec;
    const std::string why = !fixed.empty() && !fs::is_directory(fixed, ec)
                                ? " (the directory '" + fixed.string() + "' does not exist)"
                                : "";
    throw DataError(origin + ": no record files match '" + pattern + "'" + why);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string five_digits(int64_t i) {
  std::string digits = std::to_string(i);
  digits.insert(0, digits.size() < 5 ? 5 - digits.size() : 0, '0');
  return digits;
}

// A split's shardLengths (strings or integers); nullopt when absent or not all non-negative
// integers.
std::optional<std::vector<int64_t>> shard_lengths(const nlohmann::json& split) {
  if (!split.contains("shardLengths") || !split["shardLengths"].is_array()) return std::nullopt;
  std::vector<int64_t> out;
  for (const auto& v : split["shardLengths"]) {
    int64_t n = -1;
    if (v.is_number_integer()) {
      n = v.get<int64_t>();
    } else if (v.is_string()) {
      const std::string text = v.get<std::string>();
      if (text.empty() || text.size() > 18 ||
          text.find_first_not_of("0123456789") != std::string::npos) {
        return std::nullopt;
      }
      n = std::stoll(text);
    }
    if (n < 0) return std::nullopt;
    out.push_back(n);
  }
  return out;
}

// supervisedKeys' label feature: {"input", "output"} (older TFDS) or {"tuple": {"items":
// [{"featureKey"}, {"featureKey"}]}} (newer); "" when neither names one.
std::string supervised_label(const nlohmann::json& info) {
  const auto keys = info.find("supervisedKeys");
  if (keys == info.end() || !keys->is_object()) return "";
  if (keys->contains("output") && (*keys)["output"].is_string()) return (*keys)["output"];
  const nlohmann::json items =
      keys->value("tuple", nlohmann::json::object()).value("items", nlohmann::json::array());
  if (items.is_array() && items.size() == 2 && items[1].is_object() &&
      items[1].contains("featureKey") && items[1]["featureKey"].is_string()) {
    return items[1]["featureKey"];
  }
  return "";
}

// The {name: feature} map of a FeaturesDict in any of features.json's three forms.
nlohmann::json features_of(const nlohmann::json& dict) {
  if (!dict.is_object()) return nlohmann::json::object();
  if (dict.contains("featuresDict")) {  // proto JSON
    return dict["featuresDict"].value("features", nlohmann::json::object());
  }
  if (dict.contains("content")) {
    nlohmann::json content = dict["content"];
    if (content.is_string()) content = nlohmann::json::parse(content.get<std::string>());
    // {"features": {...}} (the proto's fields) or the {name: feature} map itself
    if (content.is_object() && content.size() == 1 && content.contains("features") &&
        content["features"].is_object() && !content["features"].contains("type")) {
      return content["features"];
    }
    return content.is_object() ? content : nlohmann::json::object();
  }
  if (dict.contains("features") && dict["features"].is_object()) return dict["features"];
  return nlohmann::json::object();
}

// The feature named `key` ("a/b": feature b of the FeaturesDict a); nullopt when none.
std::optional<nlohmann::json> find_feature(const nlohmann::json& root, const std::string& key) {
  nlohmann::json level = features_of(root);
  std::stringstream ss(key);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (!level.contains(part)) return std::nullopt;
    nlohmann::json next = level[part];
    if (ss.eof()) return next;
    level = features_of(next);
  }
  return std::nullopt;
}

std::vector<std::string> feature_keys(const nlohmann::json& root) {
  std::vector<std::string> keys;
  const nlohmann::json features = features_of(root);  // alive for the loop: items() is a view
  for (const auto& [k, v] : features.items()) keys.push_back(k);
  return keys;
}

struct ClassLabel {
  bool found = false;
  int64_t num_classes = 0;
  std::vector<std::string> names;  // [] = none given (TFDS keeps them in <key>.labels.txt)
};

int64_t positive_count(const nlohmann::json& v) {
  int64_t n = 0;
  if (v.is_number_integer()) {
    n = v.get<int64_t>();
  } else if (v.is_string() && !v.get<std::string>().empty() && v.get<std::string>().size() < 16 &&
             v.get<std::string>().find_first_not_of("0123456789") == std::string::npos) {
    n = std::stoll(v.get<std::string>());
  } else {
    throw std::invalid_argument("num_classes " + v.dump() + " is not an integer");
  }
  if (n <= 0 || n > 1000000) {
    throw std::invalid_argument("num_classes " + v.dump() + " is not in 1..1000000");
  }
  return n;
}

// A ClassLabel feature: proto JSON {"classLabel": {"numClasses": "10"}} or the older
// {"type": "...ClassLabel", "content": {"num_classes": 10}}; `names` where either gives them.
ClassLabel class_label_of(const nlohmann::json& feature) {
  ClassLabel out;
  if (!feature.is_object()) return out;
  nlohmann::json body;
  if (feature.contains("classLabel")) {
    body = feature["classLabel"];
  } else if (feature.value("type", "").find("ClassLabel") != std::string::npos &&
             feature.contains("content")) {
    body = feature["content"];
    if (body.is_string()) body = nlohmann::json::parse(body.get<std::string>());
  } else {
    return out;
  }
  if (!body.is_object()) throw std::invalid_argument("a ClassLabel that is not an object");
  out.found = true;
  if (body.contains("names") && body["names"].is_array()) {
    for (const auto& n : body["names"]) out.names.push_back(n.get<std::string>());
  }
  for (const char* k : {"numClasses", "num_classes"}) {
    if (body.contains(k)) out.num_classes = positive_count(body[k]);
  }
  if (out.num_classes == 0 && out.names.empty()) {
    throw std::invalid_argument("a ClassLabel with neither num_classes nor names");
  }
  if (out.num_classes == 0) out.num_classes = static_cast<int64_t>(out.names.size());
  if (!out.names.empty() && static_cast<int64_t>(out.names.size()) != out.num_classes) {
    throw std::invalid_argument("a ClassLabel with " + std::to_string(out.names.size()) +
                                " names but num_classes " + std::to_string(out.num_classes));
  }
  return out;
}

struct Resolved {
  std::vector<std::string> files;
  std::vector<int64_t> counts;  // from metadata, per file; empty = unknown
  std::vector<std::string> class_names;
  std::string counts_from;
  bool tfds = false;             // a TFDS directory; the three below say more about its names
  std::string class_names_from;  // TfdsInfo's
  std::string features_error;    // TfdsInfo's
  std::string supervised_label;  // TfdsInfo's
};

// The split's shards in a TFDS directory, with their counts from dataset_info.json.
Resolved resolve_tfds(const std::string& dir, const std::string& split,
                      const std::string& label_key, const std::string& field,
                      const std::string& origin) {
  const TfdsInfo info = read_tfds_info(dir, label_key);
  if (!info.splits.empty() &&
      std::find(info.splits.begin(), info.splits.end(), split) == info.splits.end()) {
    throw ConfigError(field + ".split: '" + split + "' is not a split of the TFDS dataset in '" +
                      dir + "' (its splits: " + join(info.splits) + ")");
  }
  if (!info.file_format.empty() && info.file_format != "tfrecord") {
    throw DataError(origin + ": the TFDS dataset in '" + dir + "' is stored as '" +
                    info.file_format +
                    "' (dataset_info.json fileFormat); only tfrecord shards can be read");
  }
  const std::regex shard_name("(.+)-" + std::regex_replace(split, std::regex("\\W"), "\\$&") +
                              "\\.tfrecord-([0-9]{5})-of-([0-9]{5})");
  std::map<int64_t, std::string> shards;
  std::set<std::string> names;  // every file in the directory
  int64_t of = -1;
  std::error_code ec;
  fs::directory_iterator entries(dir, ec);
  if (ec) throw DataError(origin + ": cannot list '" + dir + "': " + ec.message());
  for (const auto& entry : entries) {
    const std::string name = entry.path().filename().string();
    names.insert(name);
    std::smatch m;
    if (!std::regex_match(name, m, shard_name)) continue;
    if (!info.name.empty() && m[1].str() != info.name) continue;
    const int64_t index = std::stoll(m[2].str());
    const int64_t total = std::stoll(m[3].str());
    if (of >= 0 && total != of) {
      throw DataError(origin + ": shards of the '" + split + "' split disagree on their count (" +
                      std::to_string(of) + " and " + std::to_string(total) + ") in '" + dir + "'");
    }
    of = total;
    shards[index] = entry.path().string();
  }
  const std::string pattern = (info.name.empty() ? std::string("<name>") : info.name) + "-" +
                              split + ".tfrecord-NNNNN-of-MMMMM";
  const std::vector<std::string> declared = declared_shard_files(info, split);
  if (shards.empty() && !declared.empty()) {
    std::vector<std::string> missing;
    for (const std::string& f : declared)
      if (!names.count(f)) missing.push_back(f);
    if (missing.empty()) {  // a filepathTemplate other than the default: its files are there
      for (size_t i = 0; i < declared.size(); ++i)
        shards[static_cast<int64_t>(i)] = (fs::path(dir) / declared[i]).string();
      of = static_cast<int64_t>(declared.size());
    } else {
      const auto& s = *std::find_if(info.split_info.begin(), info.split_info.end(),
                                    [&split](const TfdsInfo::Split& x) { return x.name == split; });
      // Which splits do have shards here, so that the message says what would work.
      std::vector<std::string> present;
      for (const std::string& other : info.splits) {
        const std::vector<std::string> theirs = declared_shard_files(info, other);
        if (!theirs.empty() && std::all_of(theirs.begin(), theirs.end(), [&names](const auto& f) {
              return names.count(f) > 0;
            })) {
          present.push_back(other);
        }
      }
      throw DataError(
          origin + ": the '" + split + "' split's shard file '" + missing.front() +
          "' is missing in '" + dir + "' (dataset_info.json declares " +
          std::to_string(s.declared_shards) + (s.declared_shards == 1 ? " shard" : " shards") +
          " of " + std::to_string(s.declared_examples) + " examples for it" +
          (missing.size() > 1 ? ", " + std::to_string(missing.size()) + " of them are missing"
                              : "") +
          "; " +
          (present.empty() ? std::string("no split has all its shards here")
                           : "the split" + std::string(present.size() > 1 ? "s" : "") +
                                 " with all shards here: " + join(present)) +
          ")");
    }
  }
  if (shards.empty()) {
    throw DataError(origin + ": no shards of the '" + split + "' split (" + pattern + ") in '" +
                    dir + "'" +
                    (info.splits.empty() ? "" : " (splits: " + join(info.splits) + ")"));
  }
  for (int64_t i = 0; i < of; ++i) {
    if (!shards.count(i)) {
      const std::string file = (info.name.empty() ? std::string("<name>") : info.name) + "-" +
                               split + ".tfrecord-" + five_digits(i) + "-of-" + five_digits(of);
      throw DataError(origin + ": shard " + five_digits(i) + " of " + std::to_string(of) +
                      " of the '" + split + "' split is missing in '" + dir + "': no file '" +
                      file + "' (the shards are named " + pattern + ")");
    }
  }
  Resolved r;
  for (const auto& [index, path] : shards) r.files.push_back(path);
  r.class_names = info.class_names;
  r.class_names_from = info.class_names_from;
  r.features_error = info.features_error;
  r.supervised_label = info.supervised_label;
  r.tfds = true;
  // Counts from dataset_info.json: splits[].shardLengths (TFDS 4), as read_tfds_info read them.
  for (const TfdsInfo::Split& s : info.split_info) {
    if (s.name != split || !s.lengths_declared) continue;
    if (s.declared_shards < 0) {
      spdlog::warn(
          "{}: cannot read the shard lengths in '{}/dataset_info.json' (not all non-negative "
          "integers); counting the records instead",
          origin, dir);
    } else if (s.shard_lengths.size() == r.files.size()) {
      r.counts = s.shard_lengths;
      r.counts_from = "dataset_info.json";
    } else {
      spdlog::warn(
          "{}: dataset_info.json lists {} shard lengths for '{}', the directory has {} "
          "shards; counting the records instead",
          origin, s.shard_lengths.size(), split, r.files.size());
    }
  }
  return r;
}

// A leading "~/" is the home directory, as in TFDS's default ~/tensorflow_datasets.
std::string expand_home(const std::string& p) {
  if (p != "~" && p.rfind("~/", 0) != 0) return p;
  const char* home = std::getenv("HOME");
  return home && *home ? std::string(home) + p.substr(1) : p;
}

Resolved resolve(const SourceOptions& source, const std::string& field, const std::string& origin) {
  Resolved r;
  for (const std::string& written : source.path) {
    const std::string p = expand_home(written);
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      const std::string dir = find_tfds_dir(p);
      if (dir.empty()) {
        throw DataError(origin + ": '" + p +
                        "' is a directory without dataset_info.json; expected a TFDS dataset "
                        "directory, or name the record files (a glob such as '" +
                        (fs::path(p) / "*.tfrec").string() + "')");
      }
      if (source.path.size() > 1) {
        throw ConfigError(field + ".path: a TFDS directory ('" + p +
                          "') must be the only path of its source");
      }
      std::string split = source.split;
      if (split.empty()) split = field.substr(field.rfind('.') + 1);
      return resolve_tfds(dir, split, source.label_key, field, origin);
    }
    if (fs::is_regular_file(p, ec)) {
      r.files.push_back(p);
    } else if (util::has_glob_chars(p)) {
      for (auto& f : expand_glob(p, origin)) r.files.push_back(std::move(f));
    } else {
      throw DataError(origin + ": record file '" + p +
                      "' does not exist (a tfrecord path is a record file, a glob or a TFDS "
                      "dataset directory)");
    }
  }
  std::set<std::string> seen;
  for (const auto& f : r.files) {
    std::error_code canonical_ec;
    const fs::path canonical = fs::weakly_canonical(f, canonical_ec);
    if (!seen.insert(canonical_ec ? f : canonical.string()).second) {
      throw ConfigError(field + ".path: the record file '" + f + "' is listed twice");
    }
  }
  return r;
}

// Count cache entries: "<path>" -> {size, mtime_ns, records}.
struct FileStamp {
  int64_t size = -1;
  int64_t mtime_ns = -1;
};

FileStamp stamp_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return {static_cast<int64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

nlohmann::json read_cache(const std::string& path) {
  std::error_code ec;
  if (path.empty() || !fs::exists(path, ec)) return nlohmann::json::object();
  try {
    nlohmann::json j = nlohmann::json::parse(util::read_file(path));
    if (j.is_object() && j.contains("version") && j["version"] == 1 && j.contains("files") &&
        j["files"].is_object()) {
      nlohmann::json files = nlohmann::json::object();
      for (const auto& [key, e] : j["files"].items()) {  // keep only well-formed entries
        const auto is_int = [&entry = e](const char* k) {
          return entry.contains(k) && entry[k].is_number_integer();
        };
        if (e.is_object() && is_int("size") && is_int("mtime_ns") && is_int("records") &&
            e["records"].get<int64_t>() >= 0) {
          files[key] = e;
        }
      }
      return files;
    }
    spdlog::warn("record count cache '{}' is not one this trainer wrote; counting again", path);
  } catch (const std::exception& e) {
    spdlog::warn("record count cache '{}' is unreadable ({}); counting again", path, e.what());
  }
  return nlohmann::json::object();
}

}  // namespace

bool is_tfds_dir(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / "dataset_info.json", ec);
}

std::string find_tfds_dir(const std::string& path) {
  if (is_tfds_dir(path)) return path;
  std::string best;
  std::vector<long> best_key;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    if (!entry.is_directory() || !is_tfds_dir(entry.path().string())) continue;
    const std::vector<long> key = version_key(entry.path().filename().string());
    if (best.empty() || key > best_key) best = entry.path().string(), best_key = key;
  }
  return best;
}

TfdsInfo read_tfds_info(const std::string& dir, const std::string& label_key) {
  TfdsInfo info;
  info.dir = dir;
  const fs::path info_path = fs::path(dir) / "dataset_info.json";
  try {
    const nlohmann::json j = nlohmann::json::parse(util::read_file(info_path));
    info.name = j.value("name", "");
    info.file_format = j.value("fileFormat", "");
    for (const auto& s : j.value("splits", nlohmann::json::array())) {
      if (!s.contains("name")) continue;
      TfdsInfo::Split split;
      split.name = s["name"].get<std::string>();
      split.filepath_template = s.value("filepathTemplate", "");
      split.lengths_declared = s.contains("shardLengths");
      if (const auto lengths = shard_lengths(s)) {
        split.shard_lengths = *lengths;
        split.declared_shards = static_cast<int64_t>(lengths->size());
        split.declared_examples = 0;
        for (const int64_t n : *lengths) split.declared_examples += n;
      }
      info.splits.push_back(split.name);
      info.split_info.push_back(std::move(split));
    }
    info.supervised_label = supervised_label(j);
  } catch (const nlohmann::json::exception& e) {
    throw DataError("'" + info_path.string() + "': not valid TFDS dataset info (" + e.what() + ")");
  }
  // TFDS writes a ClassLabel's names to <feature key>.labels.txt, nested keys joined by '-'.
  std::string stem = label_key;
  std::replace(stem.begin(), stem.end(), '/', '-');
  for (const std::string& file : {stem + ".labels.txt", std::string("label.labels.txt")}) {
    const fs::path labels = fs::path(dir) / file;
    std::error_code ec;
    if (!fs::exists(labels, ec)) continue;
    std::stringstream ss(util::read_file(labels));
    std::string line;
    while (std::getline(ss, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) info.class_names.push_back(line);
    }
    info.class_names_from = file;
    return info;
  }
  const fs::path features = fs::path(dir) / "features.json";
  std::error_code ec;
  if (!fs::exists(features, ec)) {
    info.class_names_from = "no " + stem + ".labels.txt and no features.json";
    return info;
  }
  try {
    const nlohmann::json root = nlohmann::json::parse(util::read_file(features));
    const std::optional<nlohmann::json> feature = find_feature(root, label_key);
    if (!feature) {
      const std::vector<std::string> keys = feature_keys(root);
      info.class_names_from = "features.json has no feature '" + label_key + "'" +
                              (keys.empty() ? "" : " (its features: " + join(keys) + ")");
      return info;
    }
    const ClassLabel label = class_label_of(*feature);
    if (!label.found) {
      info.class_names_from =
          "the feature '" + label_key + "' in features.json is not a ClassLabel";
      return info;
    }
    if (!label.names.empty()) {
      info.class_names = label.names;
      info.class_names_from = "features.json (ClassLabel names)";
    } else {
      for (int64_t i = 0; i < label.num_classes; ++i) info.class_names.push_back(std::to_string(i));
      info.class_names_from =
          "features.json (ClassLabel num_classes " + std::to_string(label.num_classes) + ")";
    }
  } catch (const std::exception& e) {  // JSON errors, a bad num_classes
    info.features_error = "'" + features.string() + "': " + e.what();
    info.class_names_from = "features.json cannot be read";
  }
  return info;
}

std::vector<std::string> declared_shard_files(const TfdsInfo& info, const std::string& split) {
  const auto it = std::find_if(info.split_info.begin(), info.split_info.end(),
                               [&split](const TfdsInfo::Split& s) { return s.name == split; });
  if (it == info.split_info.end() || it->declared_shards <= 0 || info.name.empty()) return {};
  const std::string tmpl = it->filepath_template.empty()
                               ? "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
                               : it->filepath_template;
  const std::string format = info.file_format.empty() ? "tfrecord" : info.file_format;
  std::vector<std::string> out;
  for (int64_t i = 0; i < it->declared_shards; ++i) {
    const std::map<std::string, std::string> vars = {
        {"DATASET", info.name},
        {"SPLIT", split},
        {"FILEFORMAT", format},
        {"SHARD_INDEX", five_digits(i)},
        {"NUM_SHARDS", five_digits(it->declared_shards)},
        {"SHARD_X_OF_Y", five_digits(i) + "-of-" + five_digits(it->declared_shards)}};
    std::string name;
    size_t at = 0;
    while (at < tmpl.size()) {
      const size_t open = tmpl.find('{', at);
      if (open == std::string::npos) {
        name += tmpl.substr(at);
        break;
      }
      const size_t close = tmpl.find('}', open);
      if (close == std::string::npos) return {};
      const auto var = vars.find(tmpl.substr(open + 1, close - open - 1));
      if (var == vars.end()) return {};  // {DATA_DIR} and the like: no plain file name
      name += tmpl.substr(at, open - at) + var->second;
      at = close + 1;
    }
    out.push_back(name);
  }
  return out;
}

Listing list_tfrecord(const SourceOptions& source, const std::string& field,
                      const std::string& origin, const std::vector<std::string>& class_names,
                      const ListOptions& options) {
  Resolved r = resolve(source, field, origin);
  Listing listing;
  listing.origin = origin;
  listing.record_format = RecordFormat{source.image_key, source.label_key, source.compression};

  if (!class_names.empty()) {
    if (!r.class_names.empty() && r.class_names.size() != class_names.size()) {
      throw ConfigError("data.class_names: " + std::to_string(class_names.size()) + " names, but " +
                        origin + " has " + std::to_string(r.class_names.size()) + " labels in " +
                        r.class_names_from + " (" + join(r.class_names) + ")");
    }
    listing.class_names = class_names;
  } else if (!r.class_names.empty()) {
    listing.class_names = r.class_names;
  } else if (!r.features_error.empty()) {
    throw DataError(r.features_error +
                    " (the class names of a TFDS directory without label.labels.txt come from "
                    "there; or give data.class_names)");
  } else if (r.tfds) {
    const std::string hint = !r.supervised_label.empty() && r.supervised_label != source.label_key
                                 ? "; its supervisedKeys name '" + r.supervised_label +
                                       "' as the label: set " + field +
                                       ".label_key: " + r.supervised_label
                                 : "";
    throw ConfigError("data.class_names: required for " + origin + ": " + r.class_names_from +
                      hint + "; e.g. data.class_names: [cbb, cbsd, cgm, cmd, healthy]");
  } else {
    throw ConfigError(
        "data.class_names: required for " + origin +
        ": its record files carry class indices but no class names (a TFDS "
        "directory has them in label.labels.txt), e.g. [cbb, cbsd, cgm, cmd, healthy]");
  }

  std::vector<int64_t> counts = r.counts;
  std::vector<FileStamp> stamps;
  listing.counts_from = r.counts_from;
  if (counts.empty()) {
    const nlohmann::json cache = read_cache(options.count_cache);
    int64_t scanned = 0;
    int64_t cached = 0;
    for (const std::string& f : r.files) {
      const std::string key = fs::absolute(f).lexically_normal().string();
      const FileStamp st = stamp_of(f);  // before counting: a file changed since is counted again
      stamps.push_back(st);
      const auto it = cache.find(key);
      if (it != cache.end() && (*it)["size"].get<int64_t>() == st.size &&
          (*it)["mtime_ns"].get<int64_t>() == st.mtime_ns) {
        counts.push_back((*it)["records"].get<int64_t>());
        ++cached;
        continue;
      }
      counts.push_back(count_records(f, compression_for(source.compression, f)));
      ++scanned;
    }
    listing.counts_from =
        scanned == 0  ? "the count cache"
        : cached == 0 ? "a scan of the record headers"
                      : "a scan of " + std::to_string(scanned) + " files and the count cache";
    listing.counts_scanned = scanned > 0;
  }

  int64_t total = 0;
  for (size_t f = 0; f < r.files.size(); ++f) {
    RecordFile file{r.files[f], counts[f], total};
    if (f < stamps.size()) {
      file.size = stamps[f].size;
      file.mtime_ns = stamps[f].mtime_ns;
    }
    listing.record_files.push_back(file);
    for (int64_t k = 0; k < counts[f]; ++k) listing.examples.push_back(Example{r.files[f], -1, k});
    total += counts[f];
  }
  if (total == 0) throw DataError(origin + ": the record files hold no records");
  if (listing.counts_scanned && options.write_count_cache) {
    update_count_cache(options.count_cache, listing);
  }
  return listing;
}

void update_count_cache(const std::string& path, const Listing& listing) {
  if (path.empty() || !listing.counts_scanned) return;
  nlohmann::json cache = read_cache(path);
  for (const RecordFile& f : listing.record_files) {
    cache[fs::absolute(f.path).lexically_normal().string()] = {
        {"size", f.size}, {"mtime_ns", f.mtime_ns}, {"records", f.records}};
  }
  try {
    util::write_file_atomic(path, nlohmann::json{{"version", 1}, {"files", cache}}.dump(1) + "\n");
  } catch (const std::exception& e) {
    spdlog::warn("cannot write the record count cache '{}': {}", path, e.what());
  }
}

}  // namespace trainer::data
