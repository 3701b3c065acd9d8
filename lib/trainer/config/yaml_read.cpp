// YAML text + --set overrides -> JobSpec, through the field table (see yaml_io.h).
#include <algorithm>
#include <cstdio>
#include <optional>
#include <set>
#include <sstream>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>
#include <yaml-cpp/yaml.h>

#include "trainer/config/fields.h"
#include "trainer/config/yaml_io.h"
#include "trainer/util/error.h"

namespace trainer::config::detail {
namespace {

// The largest job spec read (a real one is a few KB).
constexpr size_t kMaxYamlBytes = size_t{1} << 20;

// YAML text is Unicode made of printable characters (YAML 1.2, c-printable: tab, LF, CR, x20-x7E,
// x85, xA0-xD7FF, xE000-xFFFD, x10000-x10FFFF) in UTF-8. Checked before yaml-cpp sees the text:
// yaml-cpp 0.7 loops allocating until the process is killed on some invalid bytes (found by
// fuzzing: ten 0xF2 bytes, then "arch:\x1frv, 2t36"). "" when fine, else what and where.
std::string yaml_text_problem(const std::string& text) {
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  int line = 1;
  for (size_t i = 0; i < n;) {
    const unsigned char c = b[i];
    const auto where = [&] {
      return "line " + std::to_string(line) + " (byte " + std::to_string(i) + ")";
    };
    uint32_t cp = 0;
    size_t len = 1;
    if (c < 0x80) {
      cp = c;
    } else if (c >= 0xC2 && c <= 0xDF) {
      cp = c & 0x1F;
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      cp = c & 0x0F;
      len = 3;
    } else if (c >= 0xF0 && c <= 0xF4) {
      cp = c & 0x07;
      len = 4;
    } else {
      return where() + ": not valid UTF-8";
    }
    if (i + len > n) return where() + ": not valid UTF-8 (a truncated sequence)";
    for (size_t k = 1; k < len; ++k) {
      if ((b[i + k] & 0xC0) != 0x80) return where() + ": not valid UTF-8";
      cp = (cp << 6) | (b[i + k] & 0x3F);
    }
    const bool overlong = (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
    if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return where() + ": not valid UTF-8";
    }
    const bool printable = cp == 0x09 || cp == 0x0A || cp == 0x0D || (cp >= 0x20 && cp <= 0x7E) ||
                           cp == 0x85 || (cp >= 0xA0 && cp <= 0xD7FF) ||
                           (cp >= 0xE000 && cp <= 0xFFFD) || cp >= 0x10000;
    if (!printable && !(i == 0 && cp == 0xFEFF)) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "U+%04X", static_cast<unsigned>(cp));
      return where() + ": control character " + hex +
             " (YAML allows only tab, line feed and carriage return)";
    }
    if (cp == 0x0A) ++line;
    i += len;
  }
  return "";
}

std::string describe(const YAML::Node& n) {
  if (n.IsNull()) return "null";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  return in_quotes(n.Scalar());
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::string dotted(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// The closest name within edit distance 2, or "".
std::string closest(const std::string& key, const std::vector<std::string>& names) {
  std::string best;
  int best_distance = 3;
  for (const auto& n : names) {
    const int d = edit_distance(key, n);
    if (d < best_distance) best_distance = d, best = n;
  }
  return best;
}

// Converts YAML nodes into the typed spec, noting every value's place.
class Reader {
 public:
  explicit Reader(Places& places) : places_(places) {}

  [[noreturn]] void fail(const std::string& place, const std::string& path,
                         const std::string& what) const {
    throw ConfigError(place + ": " + path + ": " + what);
  }

  template <class S>
  void read_struct(const YAML::Node& n, S& s, const std::string& path, const std::string& place);

  void read_leaf(const YAML::Node& n, std::string& v, const Field& f, const std::string& path,
                 const std::string& place) const {
    if (n.IsNull()) {  // `key:` or `key: ~` = empty string
      v.clear();
      return;
    }
    read_scalar(n, v, f, path, place);
  }

  template <class T>
  void read_leaf(const YAML::Node& n, T& v, const Field& f, const std::string& path,
                 const std::string& place) const {
    read_scalar(n, v, f, path, place);
  }

  void read_leaf(const YAML::Node& n, std::vector<std::string>& v, const Field& f,
                 const std::string& path, const std::string& place) const {
    std::vector<std::string> out;
    if (f.one_scalar && n.IsScalar()) {
      if (!n.Scalar().empty()) out.push_back(n.Scalar());
    } else if (!n.IsNull()) {
      if (!n.IsSequence()) fail(place, path, "expected " + expected(v, f) + ", got " + describe(n));
      for (size_t i = 0; i < n.size(); ++i) {
        const YAML::Node e = n[i];
        if (!e.IsScalar())
          fail(places_.at(path, e.Mark().line), path + "[" + std::to_string(i) + "]",
               "expected a string, got " + describe(e));
        out.push_back(e.Scalar());
      }
    }
    v = std::move(out);
  }

  Places& places() { return places_; }

 private:
  template <class T>
  void read_scalar(const YAML::Node& n, T& v, const Field& f, const std::string& path,
                   const std::string& place) const {
    T parsed = v;
    if (n.IsScalar() && parse_scalar(n.Scalar(), parsed, f)) {
      v = parsed;
      return;
    }
    fail(place, path, "expected " + expected(v, f) + ", got " + describe(n));
  }

  Places& places_;
};

// Visits one struct's table, reading each field present in the YAML mapping `map`.
class FieldReader : public NoChecks {
 public:
  FieldReader(Reader& r, const YAML::Node& map, std::string prefix)
      : r_(r), map_(map), prefix_(std::move(prefix)) {}

  template <class T>
  void operator()(const char* name, T& value, const Field& f) {
    std::string path, place;
    if (const auto n = find(name, path, place)) r_.read_leaf(*n, value, f, path, place);
  }

  template <class S>
  void section(const char* name, S& sub, const char*) {
    std::string path, place;
    if (const auto n = find(name, path, place)) r_.read_struct(*n, sub, path, place);
  }

 private:
  // The value under `name` (nullopt when absent); its dotted path and place (the key's line).
  std::optional<YAML::Node> find(const char* name, std::string& path, std::string& place) {
    for (auto it = map_.begin(); it != map_.end(); ++it) {
      if (!it->first.IsScalar() || it->first.Scalar() != name) continue;
      path = dotted(prefix_, name);
      place = r_.places().at(path, it->first.Mark().line);
      r_.places().note(path, place);
      return it->second;
    }
    return std::nullopt;
  }

  Reader& r_;
  const YAML::Node map_;
  std::string prefix_;
};

template <class S>
void Reader::read_struct(const YAML::Node& n, S& s, const std::string& path,
                         const std::string& place) {
  if (n.IsNull()) return;  // `section:` alone = all defaults
  const std::vector<std::string> names = field_names<S>();
  if (!n.IsMap()) {
    if (path.empty())
      throw ConfigError(place + ": expected a mapping of sections (" + join(names, ", ") +
                        ") at the top level, got " + describe(n));
    fail(place, path,
         "expected a mapping of fields (" + join(names, ", ") + "), got " + describe(n));
  }
  std::set<std::string> seen;
  for (auto it = n.begin(); it != n.end(); ++it) {
    const YAML::Node key = it->first;
    if (!key.IsScalar())
      throw ConfigError(places_.at(path, key.Mark().line) + ": " +
                        (path.empty() ? "top level" : path) + ": expected field names, got " +
                        describe(key) + " as a key");
    const std::string full = dotted(path, key.Scalar());
    const std::string key_place = places_.at(full, key.Mark().line);
    if (std::find(names.begin(), names.end(), key.Scalar()) == names.end()) {
      std::string message =
          key_place + ": unknown field '" + full + "' (expected one of: " + join(names, ", ") + ")";
      const std::string hint = closest(key.Scalar(), names);
      if (!hint.empty()) message += "; did you mean '" + hint + "'?";
      throw ConfigError(message);
    }
    if (!seen.insert(key.Scalar()).second)
      throw ConfigError(key_place + ": " + full + ": field given twice");
  }
  FieldReader fields(*this, n, path);
  visit(s, fields);
}

struct Override {
  std::string label;              // --set 'a.b=1'
  std::vector<std::string> keys;  // a, b
  YAML::Node value;
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

Override parse_override(const std::string& text) {
  Override o;
  o.label = "--set '" + text + "'";
  const size_t eq = text.find('=');
  if (eq == std::string::npos)
    throw ConfigError(o.label + ": expected field=value (e.g. train.epochs=3)");
  const std::string key = trim(text.substr(0, eq));
  if (key.empty()) throw ConfigError(o.label + ": expected field=value, got an empty field");
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    const std::string part = trim(key.substr(start, dot == std::string::npos ? dot : dot - start));
    if (part.empty())
      throw ConfigError(o.label + ": expected a dotted field name, got '" + key + "'");
    o.keys.push_back(part);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  const std::string value = text.substr(eq + 1);
  if (trim(value).empty()) {
    o.value = YAML::Node(std::string());  // `a.b=` = the empty string
  } else {
    if (const std::string problem = yaml_text_problem(value); !problem.empty()) {
      throw ConfigError(o.label + ": the value: " + problem);
    }
    try {
      o.value = YAML::Load(value);
    } catch (const YAML::Exception& e) {
      throw ConfigError(o.label + ": malformed value: " + e.msg);
    }
  }
  return o;
}

// Sets the override's value in the tree, creating the intermediate mappings it needs.
void apply(const Override& o, YAML::Node& root, Places& places) {
  YAML::Node cur = root;
  std::string path;
  for (size_t i = 0; i < o.keys.size(); ++i) {
    const std::string& k = o.keys[i];
    path = dotted(path, k);
    if (i + 1 == o.keys.size()) {
      cur[k] = o.value;
      places.set_override(path, o.label);
      return;
    }
    YAML::Node next = cur[k];
    if (!next.IsDefined() || next.IsNull()) {
      cur[k] = YAML::Node(YAML::NodeType::Map);
      places.set_override(path, o.label);
    } else if (!next.IsMap()) {
      throw ConfigError(o.label + ": cannot set a field inside '" + path + "', which is " +
                        describe(next) + " (" + places.at(path, next.Mark().line) + ")");
    }
    cur.reset(cur[k]);  // rebind, not assign (assignment would overwrite the node)
  }
}

}  // namespace

// The number of YAML documents in `text`, counting up to 2. Throws ConfigError naming the
// line when the parser stops making progress (the same document start twice).
size_t count_documents(const std::string& text, Places& places) {
  struct Counter : YAML::EventHandler {
    size_t documents = 0;
    int last_pos = -1;
    std::string stuck;  // "line N" when a document started where the last one did
    Places* places = nullptr;
    void OnDocumentStart(const YAML::Mark& mark) override {
      if (mark.pos == last_pos && stuck.empty()) stuck = places->line(mark.line);
      last_pos = mark.pos;
      ++documents;
    }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                         YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                    YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
  } counter;
  counter.places = &places;
  std::istringstream in(text);
  YAML::Parser parser(in);
  while (counter.documents < 2 && parser.HandleNextDocument(counter)) {
    if (!counter.stuck.empty()) {
      throw ConfigError(counter.stuck +
                        ": malformed YAML: unexpected ',' (or another flow "
                        "indicator) where a document starts");
    }
  }
  return counter.documents;
}

JobSpec read_yaml(const std::string& yaml_text, const std::vector<std::string>& overrides,
                  Places& places) {
  if (yaml_text.size() > kMaxYamlBytes) {
    throw ConfigError(places.origin() + ": " + std::to_string(yaml_text.size()) +
                      " bytes, more than a job spec may have (" + std::to_string(kMaxYamlBytes) +
                      ")");
  }
  if (const std::string problem = yaml_text_problem(yaml_text); !problem.empty()) {
    throw ConfigError(places.origin() + ": " + problem);
  }
  std::vector<YAML::Node> docs;
  try {
    // Count the documents first, with a parser that stops on one that makes no progress:
    // yaml-cpp 0.7's LoadAll() loops for ever, adding empty documents, on a stray ',' where a
    // document starts (found by fuzzing: a job spec of "," grew until the process was killed).
    const size_t count = count_documents(yaml_text, places);
    if (count > 1) {
      throw ConfigError(places.origin() +
                        ": expected one YAML document, got more ('---' "
                        "starts another)");
    }
    if (count == 1) docs.push_back(YAML::Load(yaml_text));
  } catch (const YAML::ParserException& e) {
    throw ConfigError(
        places.line(e.mark.line) + ": malformed YAML: " + e.msg +
        (e.mark.column >= 0 ? " (column " + std::to_string(e.mark.column + 1) + ")" : ""));
  }
  if (docs.size() > 1)
    throw ConfigError(places.origin() + ": expected one YAML document, got " +
                      std::to_string(docs.size()));
  YAML::Node root = docs.empty() ? YAML::Node() : docs.front();
  const std::string root_place = places.line(root.Mark().line);

  std::vector<Override> parsed;
  for (const auto& text : overrides) parsed.push_back(parse_override(text));

  JobSpec spec;
  Reader reader(places);
  try {
    if (!root.IsDefined() || root.IsNull()) root.reset(YAML::Node(YAML::NodeType::Map));
    if (!parsed.empty()) {
      if (!root.IsMap()) reader.read_struct(root, spec, "", root_place);  // throws
      for (const auto& o : parsed) apply(o, root, places);
    }
    reader.read_struct(root, spec, "", root_place);
  } catch (const YAML::Exception& e) {  // not expected; keep it a ConfigError naming the file
    throw ConfigError(places.origin() + ": " + e.what());
  }
  return spec;
}

}  // namespace trainer::config::detail
