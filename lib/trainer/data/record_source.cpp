#include "trainer/data/record_source.h"

#include <glob.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "trainer/data/tfrecord.h"
#include "trainer/util/error.h"
#include "trainer/util/fs.h"

namespace trainer::data {

namespace fs = std::filesystem;

namespace {

bool has_glob_chars(const std::string& p) { return p.find_first_of("*?[") != std::string::npos; }

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
      if (has_glob_chars(part.string())) break;
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

struct Resolved {
  std::vector<std::string> files;
  std::vector<int64_t> counts;  // from metadata, per file; empty = unknown
  std::vector<std::string> class_names;
  std::string counts_from;
};

// The split's shards in a TFDS directory, with their counts from dataset_info.json.
Resolved resolve_tfds(const std::string& dir, const std::string& split, const std::string& field,
                      const std::string& origin) {
  const TfdsInfo info = read_tfds_info(dir);
  if (!info.splits.empty() &&
      std::find(info.splits.begin(), info.splits.end(), split) == info.splits.end()) {
    throw ConfigError(field + ".split: '" + split + "' is not a split of the TFDS dataset in '" +
                      dir + "' (its splits: " + join(info.splits) + ")");
  }
  const std::regex shard_name("(.+)-" + std::regex_replace(split, std::regex("\\W"), "\\$&") +
                              "\\.tfrecord-([0-9]{5})-of-([0-9]{5})");
  std::map<int64_t, std::string> shards;
  int64_t of = -1;
  std::error_code ec;
  fs::directory_iterator entries(dir, ec);
  if (ec) throw DataError(origin + ": cannot list '" + dir + "': " + ec.message());
  for (const auto& entry : entries) {
    const std::string name = entry.path().filename().string();
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
  if (shards.empty()) {
    throw DataError(origin + ": no shards of the '" + split + "' split (" + pattern + ") in '" +
                    dir + "'" +
                    (info.splits.empty() ? "" : " (splits: " + join(info.splits) + ")"));
  }
  for (int64_t i = 0; i < of; ++i) {
    if (!shards.count(i)) {
      std::string digits = std::to_string(i);
      digits.insert(0, digits.size() < 5 ? 5 - digits.size() : 0, '0');
      throw DataError(origin + ": shard " + digits + " of " + std::to_string(of) + " of the '" +
                      split + "' split is missing in '" + dir + "' (" + pattern + ")");
    }
  }
  Resolved r;
  for (const auto& [index, path] : shards) r.files.push_back(path);
  r.class_names = info.class_names;
  // Counts from dataset_info.json: splits[].shardLengths (TFDS 4), as strings or numbers.
  try {
    const nlohmann::json j =
        nlohmann::json::parse(util::read_file(fs::path(dir) / "dataset_info.json"));
    for (const auto& s : j.value("splits", nlohmann::json::array())) {
      if (s.value("name", "") != split || !s.contains("shardLengths")) continue;
      std::vector<int64_t> counts;
      for (const auto& v : s["shardLengths"]) {
        if (!v.is_string() && !v.is_number_integer()) {  // a float would be cast: undefined
          throw std::invalid_argument("a shard length that is not an integer");
        }
        const int64_t n = v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>();
        if (n < 0) throw std::invalid_argument("a negative shard length");
        counts.push_back(n);
      }
      if (counts.size() == r.files.size()) {
        r.counts = counts;
        r.counts_from = "dataset_info.json";
      } else {
        spdlog::warn(
            "{}: dataset_info.json lists {} shard lengths for '{}', the directory has {} "
            "shards; counting the records instead",
            origin, counts.size(), split, r.files.size());
      }
    }
  } catch (const std::exception& e) {
    spdlog::warn(
        "{}: cannot read the shard lengths in '{}/dataset_info.json' ({}); counting the "
        "records instead",
        origin, dir, e.what());
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
      return resolve_tfds(dir, split, field, origin);
    }
    if (fs::is_regular_file(p, ec)) {
      r.files.push_back(p);
    } else if (has_glob_chars(p)) {
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

TfdsInfo read_tfds_info(const std::string& dir) {
  TfdsInfo info;
  info.dir = dir;
  const fs::path info_path = fs::path(dir) / "dataset_info.json";
  try {
    const nlohmann::json j = nlohmann::json::parse(util::read_file(info_path));
    info.name = j.value("name", "");
    for (const auto& s : j.value("splits", nlohmann::json::array()))
      if (s.contains("name")) info.splits.push_back(s["name"].get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    throw DataError("'" + info_path.string() + "': not valid TFDS dataset info (" + e.what() + ")");
  }
  const fs::path labels = fs::path(dir) / "label.labels.txt";
  std::error_code ec;
  if (fs::exists(labels, ec)) {
    std::stringstream ss(util::read_file(labels));
    std::string line;
    while (std::getline(ss, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) info.class_names.push_back(line);
    }
  }
  return info;
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
                        origin + " has " + std::to_string(r.class_names.size()) +
                        " labels in label.labels.txt (" + join(r.class_names) + ")");
    }
    listing.class_names = class_names;
  } else if (!r.class_names.empty()) {
    listing.class_names = r.class_names;
  } else {
    throw ConfigError(
        "data.class_names: required for " + origin +
        ": its record files carry class indices but no class names (a TFDS "
        "directory has them in label.labels.txt), e.g. [cbb, cbsd, cgm, cmd, healthy]");
  }

  std::vector<int64_t> counts = r.counts;
  listing.counts_from = r.counts_from;
  if (counts.empty()) {
    nlohmann::json cache = read_cache(options.count_cache);
    int64_t scanned = 0;
    int64_t cached = 0;
    for (const std::string& f : r.files) {
      const std::string key = fs::absolute(f).lexically_normal().string();
      const FileStamp st = stamp_of(f);
      const auto it = cache.find(key);
      if (it != cache.end() && (*it)["size"].get<int64_t>() == st.size &&
          (*it)["mtime_ns"].get<int64_t>() == st.mtime_ns) {
        counts.push_back((*it)["records"].get<int64_t>());
        ++cached;
        continue;
      }
      counts.push_back(count_records(f, compression_for(source.compression, f)));
      cache[key] = {{"size", st.size}, {"mtime_ns", st.mtime_ns}, {"records", counts.back()}};
      ++scanned;
    }
    listing.counts_from =
        scanned == 0  ? "the count cache"
        : cached == 0 ? "a scan of the record headers"
                      : "a scan of " + std::to_string(scanned) + " files and the count cache";
    if (scanned > 0 && options.write_count_cache && !options.count_cache.empty()) {
      try {
        util::write_file_atomic(options.count_cache,
                                nlohmann::json{{"version", 1}, {"files", cache}}.dump(1) + "\n");
      } catch (const std::exception& e) {
        spdlog::warn("cannot write the record count cache '{}': {}", options.count_cache, e.what());
      }
    }
  }

  int64_t total = 0;
  for (size_t f = 0; f < r.files.size(); ++f) {
    listing.record_files.push_back(RecordFile{r.files[f], counts[f], total});
    for (int64_t k = 0; k < counts[f]; ++k) listing.examples.push_back(Example{r.files[f], -1, k});
    total += counts[f];
  }
  if (total == 0) throw DataError(origin + ": the record files hold no records");
  return listing;
}

}  // namespace trainer::data
