#include "trainer/data/source.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>

#include "trainer/data/record_source.h"
#include "trainer/util/error.h"
#include "trainer/util/fs.h"
#include "trainer/util/storage.h"

namespace trainer::data {

namespace {

namespace fs = std::filesystem;

// Classes above this many are refused (a corrupt label column, not a real data set).
constexpr int64_t kMaxClasses = 100000;

std::string lower_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

bool is_hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

std::string join(const std::vector<std::string>& items, size_t max_items = 20) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < max_items; ++i) {
    if (i > 0) out += ", ";
    out += items[i];
  }
  if (items.size() > max_items) out += ", ... (" + std::to_string(items.size()) + " in all)";
  return out;
}

std::string trim(const std::string& s) {
  size_t b = 0;
  size_t e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
  return s.substr(b, e - b);
}

// ---- imagefolder ------------------------------------------------------------------------------

Listing list_imagefolder(const std::string& path, const std::string& origin,
                         const std::vector<std::string>& class_names) {
  const fs::path root(path);
  std::error_code ec;
  if (!fs::exists(root, ec)) throw DataError(origin + ": directory '" + path + "' does not exist");
  if (!fs::is_directory(root, ec)) {
    throw DataError(origin + ": '" + path +
                    "' is not a directory (imagefolder expects one sub-directory per class)");
  }
  std::vector<std::string> dirs;
  try {
    for (const auto& entry : fs::directory_iterator(root)) {
      if (entry.is_directory() && !is_hidden(entry.path())) {
        dirs.push_back(entry.path().filename().string());
      }
    }
  } catch (const fs::filesystem_error& e) {
    throw DataError(origin + ": cannot list '" + path + "': " + e.what());
  }
  std::sort(dirs.begin(), dirs.end());
  if (dirs.empty()) {
    throw DataError(origin + ": no class sub-directories in '" + path +
                    "' (imagefolder expects DIR/<class>/<image>)");
  }

  Listing listing;
  listing.origin = origin;
  listing.class_names = class_names.empty() ? dirs : class_names;
  std::map<std::string, int64_t> index;
  for (size_t i = 0; i < listing.class_names.size(); ++i) {
    index.emplace(listing.class_names[i], static_cast<int64_t>(i));
  }
  for (const std::string& name : dirs) {
    if (!index.count(name)) {
      throw DataError(origin + ": sub-directory '" + (root / name).string() +
                      "' is not one of the class names [" + join(listing.class_names) + "]");
    }
  }
  if (!class_names.empty()) {
    for (const std::string& name : class_names) {
      if (!std::binary_search(dirs.begin(), dirs.end(), name)) {
        spdlog::warn("{}: no sub-directory for class '{}' in '{}'", origin, name, path);
      }
    }
  }

  std::vector<std::string> gifs;
  for (const std::string& name : dirs) {
    const fs::path class_dir = root / name;
    std::vector<std::string> files = list_image_files(class_dir.string(), origin, &gifs);
    if (files.empty()) {
      spdlog::warn("{}: class folder '{}' has no images (.jpg .jpeg .png .bmp)", origin,
                   class_dir.string());
      continue;
    }
    const int64_t label = index.at(name);
    for (std::string& f : files) listing.examples.push_back(Example{std::move(f), label});
  }
  warn_unlisted_gifs(origin, gifs);
  if (listing.examples.empty()) {
    throw DataError(origin + ": no images (.jpg .jpeg .png .bmp) under '" + path + "'");
  }
  return listing;
}

// ---- csv --------------------------------------------------------------------------------------

struct CsvRecord {
  std::vector<std::string> fields;
  int64_t line = 0;  // 1-based line the record starts on
};

// RFC 4180 with the usual leniencies: optional UTF-8 BOM, LF or CRLF, quoted fields with ""
// escapes and embedded commas/newlines, spaces around unquoted fields trimmed, blank lines skipped.
std::vector<CsvRecord> parse_csv(const std::string& text, const std::string& where) {
  std::vector<CsvRecord> records;
  size_t i = 0;
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) i = 3;
  int64_t line = 1;
  CsvRecord record;
  record.line = 1;
  std::string field;
  bool quoted = false;     // the current field was quoted
  bool in_quotes = false;  // inside the quotes now
  int64_t quote_line = 0;
  auto end_field = [&] {
    record.fields.push_back(quoted ? field : trim(field));
    field.clear();
    quoted = false;
  };
  auto end_record = [&] {
    end_field();
    const bool blank = record.fields.size() == 1 && record.fields[0].empty();
    if (!blank) records.push_back(std::move(record));
    record = CsvRecord();
    record.line = line;
  };
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (in_quotes) {
      if (c == '"') {
        if (i + 1 < text.size() && text[i + 1] == '"') {
          field += '"';
          ++i;
        } else {
          in_quotes = false;
        }
      } else {
        if (c == '\n') ++line;
        field += c;
      }
      continue;
    }
    switch (c) {
      case ',':
        end_field();
        break;
      case '\r':
        if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
        ++line;
        end_record();
        break;
      case '\n':
        ++line;
        end_record();
        break;
      case '"':
        if (!quoted && trim(field).empty()) {
          field.clear();
          quoted = true;
          in_quotes = true;
          quote_line = line;
        } else if (quoted) {
          // Text after a closing quote: only blanks are allowed before the separator.
          throw DataError(where + " line " + std::to_string(line) +
                          ": unexpected '\"' after a quoted field");
        } else {
          field += c;  // a quote inside an unquoted field is kept literally
        }
        break;
      default:
        if (quoted && c != ' ' && c != '\t') {
          throw DataError(where + " line " + std::to_string(line) +
                          ": unexpected text after a quoted field (quote the whole field)");
        }
        if (!quoted) field += c;
        break;
    }
  }
  if (in_quotes) {
    throw DataError(where + ": unterminated quoted field starting on line " +
                    std::to_string(quote_line));
  }
  if (!field.empty() || quoted || !record.fields.empty()) end_record();
  return records;
}

bool is_integer(const std::string& s) {
  size_t i = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
  if (i >= s.size()) return false;
  for (; i < s.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

// True when `p` (lexically normal, absolute) lies strictly inside `root` (same).
bool is_inside(const fs::path& root, const fs::path& p) {
  auto r = root.begin();
  auto q = p.begin();
  for (; r != root.end(); ++r) {
    if (r->empty()) continue;  // trailing separator
    if (q == p.end() || *q != *r) return false;
    ++q;
  }
  for (; q != p.end(); ++q) {
    if (!q->empty()) return true;
  }
  return false;
}

// A manifest read and checked up to its rows: the records (header first), and the directory
// its image paths are relative to.
struct Manifest {
  std::vector<CsvRecord> records;
  std::string where;  // "manifest 'PATH'"
  std::string origin;
  fs::path root, root_abs;

  size_t column(const std::string& name, const std::string& option) const {
    const std::vector<std::string>& header = records[0].fields;
    auto it = std::find(header.begin(), header.end(), name);
    if (it == header.end()) {
      throw DataError(origin + ": " + where + " has no column '" + name + "' (" + option +
                      "); columns found: " + join(header, 50));
    }
    return static_cast<size_t>(it - header.begin());
  }
  std::string row_at(size_t r) const {
    return origin + ": " + where + " row " + std::to_string(r) + " (line " +
           std::to_string(records[r].line) + ")";
  }
  // Row r's image path (column `col`, named `column_name`), under the root; checks the row's
  // field count and that the path stays inside the root.
  std::string image(size_t r, size_t col, const std::string& column_name) const {
    const CsvRecord& rec = records[r];
    const std::string at = row_at(r);
    const size_t fields = records[0].fields.size();
    if (rec.fields.size() != fields) {
      throw DataError(at + ": " + std::to_string(rec.fields.size()) + " fields, the header has " +
                      std::to_string(fields) + " (hint: quote fields that contain commas)");
    }
    const std::string& image = rec.fields[col];
    if (image.empty()) throw DataError(at + ": empty image path in column '" + column_name + "'");
    const fs::path image_path(image);
    const fs::path resolved = image_path.is_absolute() ? image_path.lexically_normal()
                                                       : (root_abs / image_path).lexically_normal();
    if (!is_inside(root_abs, resolved)) {
      throw DataError(at + ": image path '" + image + "' is outside the image root '" +
                      root_abs.string() + "'");
    }
    return (image_path.is_absolute() ? resolved : (root / image_path).lexically_normal()).string();
  }
};

Manifest open_manifest(const std::string& path, const std::string& image_root,
                       const std::string& origin) {
  Manifest m;
  m.origin = origin;
  const fs::path manifest(path);
  std::error_code ec;
  if (!fs::exists(manifest, ec))
    throw DataError(origin + ": manifest '" + path + "' does not exist");
  if (fs::is_directory(manifest, ec)) {
    throw DataError(origin + ": manifest '" + path + "' is a directory, expected a .csv file");
  }
  m.where = "manifest '" + path + "'";
  std::string text;
  try {
    text = util::read_file(manifest);
  } catch (const DataError& e) {
    throw DataError(origin + ": " + e.what());
  }
  m.records = parse_csv(text, origin + ": " + m.where);
  if (m.records.empty()) {
    throw DataError(origin + ": " + m.where + " is empty (expected a header row)");
  }
  m.root = image_root.empty() ? manifest.parent_path() : fs::path(image_root);
  if (m.root.empty()) m.root = ".";
  if (!fs::is_directory(m.root, ec)) {
    throw DataError(origin + ": image root '" + m.root.string() + "' is not a directory" +
                    (image_root.empty() ? " (the manifest's directory)" : ""));
  }
  m.root_abs = fs::absolute(m.root).lexically_normal();
  return m;
}

Listing list_csv(const std::string& path, const SourceOptions& source, const std::string& origin,
                 const std::vector<std::string>& class_names) {
  const Manifest m = open_manifest(path, source.image_root, origin);
  const std::vector<CsvRecord>& records = m.records;
  const std::string& where = m.where;
  const size_t image_col = m.column(source.image_column, "data.*.image_column");
  const size_t label_col = m.column(source.label_column, "data.*.label_column");
  if (records.size() == 1) {
    throw DataError(origin + ": " + where + " has a header but no rows");
  }

  Listing listing;
  listing.origin = origin;
  std::vector<std::string> labels;
  listing.examples.reserve(records.size() - 1);
  labels.reserve(records.size() - 1);
  for (size_t r = 1; r < records.size(); ++r) {
    const CsvRecord& rec = records[r];
    const std::string at = m.row_at(r);
    listing.examples.push_back(Example{m.image(r, image_col, source.image_column), 0});
    labels.push_back(rec.fields[label_col]);
    if (labels.back().empty()) {
      throw DataError(at + ": empty label in column '" + source.label_column + "'");
    }
  }

  const bool indices = std::all_of(labels.begin(), labels.end(), is_integer);
  auto row_at = [&m](size_t k) { return m.row_at(k + 1); };
  if (indices) {
    const int64_t limit =
        class_names.empty() ? kMaxClasses : static_cast<int64_t>(class_names.size());
    int64_t max_label = -1;
    for (size_t k = 0; k < labels.size(); ++k) {
      int64_t v = -1;
      try {
        v = std::stoll(labels[k]);
      } catch (const std::out_of_range&) {
        v = -1;
      }
      if (v < 0 || v >= limit) {
        throw DataError(row_at(k) + ": label " + labels[k] + " is out of range [0, " +
                        std::to_string(limit) + ")" +
                        (class_names.empty() ? "" : " of class_names [" + join(class_names) + "]"));
      }
      listing.examples[k].label = v;
      max_label = std::max(max_label, v);
    }
    if (class_names.empty()) {
      for (int64_t c = 0; c <= max_label; ++c) listing.class_names.push_back(std::to_string(c));
    } else {
      listing.class_names = class_names;
    }
  } else {
    if (class_names.empty()) {
      const std::set<std::string> unique(labels.begin(), labels.end());
      listing.class_names.assign(unique.begin(), unique.end());
    } else {
      listing.class_names = class_names;
    }
    std::map<std::string, int64_t> index;
    for (size_t c = 0; c < listing.class_names.size(); ++c) {
      index.emplace(listing.class_names[c], static_cast<int64_t>(c));
    }
    for (size_t k = 0; k < labels.size(); ++k) {
      auto it = index.find(labels[k]);
      if (it == index.end()) {
        throw DataError(row_at(k) + ": label '" + labels[k] + "' is not one of the class names [" +
                        join(listing.class_names) + "]");
      }
      listing.examples[k].label = it->second;
    }
  }
  return listing;
}

}  // namespace

bool is_image_file(const std::string& path) {
  const std::string ext = lower_extension(path);
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png" || ext == ".bmp";
}

bool is_gif_file(const std::string& path) { return lower_extension(path) == ".gif"; }

const char* const kGifNote =
    "GIF is not read: the trainer lists .jpg .jpeg .png .bmp, as torchvision's ImageFolder "
    "does (whatever the OpenCV: 4.10 decodes GIF, 4.6 does not); convert it to PNG to use it";

std::vector<std::string> list_image_files(const std::string& dir, const std::string& origin,
                                          std::vector<std::string>* gifs) {
  std::vector<std::string> files;
  try {
    for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator();
         ++it) {
      if (is_hidden(it->path())) {
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (!it->is_regular_file()) continue;
      const std::string path = it->path().string();
      if (is_image_file(path)) {
        files.push_back(path);
      } else if (gifs && is_gif_file(path)) {
        gifs->push_back(path);
      }
    }
  } catch (const fs::filesystem_error& e) {
    throw DataError(origin + ": cannot list '" + dir + "': " + e.what());
  }
  std::sort(files.begin(), files.end());
  return files;
}

void warn_unlisted_gifs(const std::string& origin, std::vector<std::string> gifs) {
  if (gifs.empty()) return;
  std::sort(gifs.begin(), gifs.end());
  spdlog::warn("{}: {} GIF file{} not listed ({}): {}", origin, gifs.size(),
               gifs.size() == 1 ? "" : "s", join(gifs, 5), kGifNote);
}

std::vector<std::string> list_manifest_images(const std::string& path, const std::string& column,
                                              const std::string& image_root,
                                              const std::string& origin) {
  const Manifest m = open_manifest(path, image_root, origin);
  const std::vector<std::string>& header = m.records[0].fields;
  std::string name = column;
  if (name.empty()) {  // Kaggle's image_id, else the usual names, else the first column
    name = header.empty() ? "" : header[0];
    for (const char* c : {"image_id", "image", "path", "filename", "file"}) {
      if (std::find(header.begin(), header.end(), c) != header.end()) {
        name = c;
        break;
      }
    }
  }
  const size_t col = m.column(name, "--image-column");
  std::vector<std::string> images;
  for (size_t r = 1; r < m.records.size(); ++r) images.push_back(m.image(r, col, name));
  if (images.empty()) throw DataError(origin + ": " + m.where + " has a header but no rows");
  return images;
}

Listing list_source(const SourceOptions& given, const std::string& field,
                    const std::vector<std::string>& class_names, const ListOptions& options) {
  if (given.path.empty()) throw DataError(field + ".path: no source path given");
  // gs://BUCKET/... reads the bucket's mount; another scheme:// is refused (util/storage.h).
  SourceOptions source = given;
  for (std::string& p : source.path) p = util::local_path(p, field + ".path");
  if (!source.image_root.empty()) {
    source.image_root = util::local_path(source.image_root, field + ".image_root");
  }
  const std::string more =
      source.path.size() > 1 ? " and " + std::to_string(source.path.size() - 1) + " more" : "";
  const std::string origin =
      field + " (" + source.format + " '" + source.path[0] + "'" + more + ")";
  {
    std::set<std::string> seen;
    for (const std::string& name : class_names) {
      if (!seen.insert(name).second) {
        throw DataError(origin + ": class name '" + name + "' appears twice in class_names");
      }
    }
  }
  if (source.format == "tfrecord")
    return list_tfrecord(source, field, origin, class_names, options);
  if (source.path.size() != 1) {
    throw ConfigError(field + ".path: a list of paths needs format tfrecord, got format '" +
                      source.format + "'");
  }
  if (source.format == "imagefolder") return list_imagefolder(source.path[0], origin, class_names);
  if (source.format == "csv") return list_csv(source.path[0], source, origin, class_names);
  throw DataError(field + ".format: expected one of imagefolder|csv|tfrecord, got '" +
                  source.format + "'");
}

}  // namespace trainer::data
