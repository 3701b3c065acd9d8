// The typed values of job-spec fields: the rule a field carries (doc line, allowed strings,
// numeric bounds, a name for 0), its canonical text, what it expects, strict text -> value
// parsing, and where each value came from (Places). No YAML here. Private to config/.
// Stateless functions; a Places is a plain value (not shared between threads).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace trainer::config::detail {

// One field's rule, written next to the field in fields.h: Field("doc").at_least(1).
struct Field {
  explicit Field(const char* doc_line) : doc(doc_line) {}
  Field& one_of(std::initializer_list<const char*> values) {
    choices.clear();
    for (const char* v : values) choices.push_back(v);  // (assign() trips GCC 12's -Wnonnull)
    return *this;
  }
  Field& at_least(double v) { return lower(v, false); }
  Field& above(double v) { return lower(v, true); }
  Field& at_most(double v) { return upper(v, false); }
  Field& below(double v) { return upper(v, true); }
  Field& zero_means(const char* name) {  // 0 is read and written as `name` (e.g. auto)
    zero_name = name;
    return *this;
  }
  Field& scalar_or_list() {  // a list field that may be written as one scalar (`path: x`)
    one_scalar = true;
    return *this;
  }

  const char* doc;
  std::vector<const char*> choices;  // strings: the allowed values (empty = any)
  bool has_min = false, min_open = false, has_max = false, max_open = false;
  double min = 0, max = 0;
  const char* zero_name = nullptr;
  bool one_scalar = false;  // lists: a scalar reads as a one-element list, which is written so

 private:
  Field& lower(double v, bool open) {
    has_min = true, min = v, min_open = open;
    return *this;
  }
  Field& upper(double v, bool open) {
    has_max = true, max = v, max_open = open;
    return *this;
  }
};

// The doc line with the choices appended: "network architecture (resnet18|resnet34|...)".
std::string doc_line(const Field& f);

// Shortest "%g"-style text that parses back to exactly `v`.
std::string format_double(double v);

// 'text' for messages.
std::string in_quotes(const std::string& s);

// Canonical value text (flatten): bools true/false, doubles exact, vectors `[a, b]` (elements
// quoted when they would be ambiguous), 0 as the zero name.
std::string text(const std::string& v, const Field& f);
std::string text(int v, const Field& f);
std::string text(int64_t v, const Field& f);
std::string text(double v, const Field& f);
std::string text(bool v, const Field& f);
std::string text(const std::vector<std::string>& v, const Field& f);

// What a field of this type and rule accepts, e.g. "a positive integer", "one of unit|imagenet".
// The value only selects the type.
std::string expected(const std::string& type, const Field& f);
std::string expected(int type, const Field& f);
std::string expected(int64_t type, const Field& f);
std::string expected(double type, const Field& f);
std::string expected(bool type, const Field& f);
std::string expected(const std::vector<std::string>& type, const Field& f);

// "expected <...>, got '<value>'" when the value breaks the field's rule; "" when it is fine.
std::string violation(const std::string& v, const Field& f);
std::string violation(int v, const Field& f);
std::string violation(int64_t v, const Field& f);
std::string violation(double v, const Field& f);
std::string violation(bool v, const Field& f);
std::string violation(const std::vector<std::string>& v, const Field& f);

// Strict scalar text -> value (whole text, decimal, in range of the type, finite); false when
// the text is not such a value. A zero-named int accepts the name and rejects a literal 0.
bool parse_scalar(const std::string& s, std::string& out, const Field& f);
bool parse_scalar(const std::string& s, int& out, const Field& f);
bool parse_scalar(const std::string& s, int64_t& out, const Field& f);
bool parse_scalar(const std::string& s, double& out, const Field& f);
bool parse_scalar(const std::string& s, bool& out, const Field& f);

// "" or why a class-name list is invalid (an empty name, a duplicate).
std::string class_names_problem(const std::vector<std::string>& names);

// "" or why train.class_weights is invalid: [none], [balanced] or a list of finite weights >= 0,
// not all zero.
std::string class_weights_problem(const std::vector<std::string>& weights);
// "" or why an optional weight decay ("" = the main one) is not a number >= 0.
std::string weight_decay_problem(const std::string& value);

// Optimal-string-alignment edit distance, case-insensitive (for "did you mean").
int edit_distance(const std::string& a, const std::string& b);

// Where each field's value came from, for messages: "job.yaml:12", "--set 'a.b=1'", or the
// origin alone when no line is known.
class Places {
 public:
  explicit Places(std::string origin) : origin_(std::move(origin)) {}
  const std::string& origin() const { return origin_; }
  // "origin:<line+1>", or the origin when line < 0 (yaml-cpp marks are 0-based, -1 = none).
  std::string line(int zero_based_line) const;
  // An override set this path (or created it as an intermediate mapping).
  void set_override(const std::string& path, const std::string& label);
  // The label of the override that set `path` or one of its ancestors, else nullptr.
  const std::string* override_covering(const std::string& path) const;
  // The place of `path`: the covering override, else line(zero_based_line).
  std::string at(const std::string& path, int zero_based_line) const;
  void note(const std::string& path, std::string place) { noted_[path] = std::move(place); }
  // The noted place of exactly `path`, else the origin.
  std::string of(const std::string& path) const;

 private:
  std::string origin_;
  std::map<std::string, std::string> overrides_;
  std::map<std::string, std::string> noted_;
};

}  // namespace trainer::config::detail
