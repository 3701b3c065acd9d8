#include "trainer/config/values.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <set>
#include <system_error>

namespace trainer::config::detail {
namespace {

std::string join_choices(const Field& f) {
  std::string out;
  for (const char* c : f.choices) {
    if (!out.empty()) out += '|';
    out += c;
  }
  return out;
}

// "[16, 4096]", "(0, 1]", ">= 0" style interval text for messages.
std::string interval(const Field& f) {
  std::string out = f.min_open ? "(" : "[";
  out += format_double(f.min) + ", " + format_double(f.max);
  out += f.max_open ? ")" : "]";
  return out;
}

bool in_range(double v, const Field& f) {
  // Written so that NaN fails every bound.
  if (f.has_min && !(f.min_open ? v > f.min : v >= f.min)) return false;
  if (f.has_max && !(f.max_open ? v < f.max : v <= f.max)) return false;
  return !std::isnan(v);
}

std::string expected_integer(const Field& f) {
  if (f.zero_name) {
    return std::string(f.zero_name) + (f.has_max
                                           ? " or an integer in [1, " + format_double(f.max) + "]"
                                           : std::string(" or a positive integer"));
  }
  if (f.has_min && f.has_max) return "an integer in " + interval(f);
  if (f.has_min && !f.min_open && f.min == 1) return "a positive integer";
  if (f.has_min && !f.min_open && f.min == 0) return "a non-negative integer";
  if (f.has_min)
    return std::string("an integer ") + (f.min_open ? "> " : ">= ") + format_double(f.min);
  if (f.has_max)
    return std::string("an integer ") + (f.max_open ? "< " : "<= ") + format_double(f.max);
  return "an integer";
}

template <class Int>
bool parse_integer(const std::string& s, Int& out) {
  const char* first = s.data();
  const char* last = s.data() + s.size();
  if (first != last && *first == '+') {
    ++first;
    if (first != last && *first == '-') return false;  // "+-1"
  }
  if (first == last) return false;
  Int v{};
  auto [ptr, ec] = std::from_chars(first, last, v);
  if (ec != std::errc() || ptr != last) return false;
  out = v;
  return true;
}

template <class Int>
std::string integer_violation(Int v, const Field& f) {
  if (in_range(static_cast<double>(v), f)) return "";
  return "expected " + expected_integer(f) + ", got " + in_quotes(text(v, f));
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// An element of a vector needs quotes in `[a, b]` when it would read ambiguously.
bool needs_quotes(const std::string& s) {
  if (s.empty()) return true;
  if (std::isspace(static_cast<unsigned char>(s.front())) ||
      std::isspace(static_cast<unsigned char>(s.back())))
    return true;
  return s.find_first_of(",[]\"\\\n") != std::string::npos;
}

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::string doc_line(const Field& f) {
  std::string out = f.doc;
  if (!f.choices.empty()) out += (out.empty() ? "" : " ") + ("(" + join_choices(f) + ")");
  return out;
}

std::string format_double(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  char buf[64];
  if (v == std::floor(v) && std::abs(v) < 1e15) {  // whole numbers as such: 900, not 9e+02
    auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed, 0);
    return std::string(buf, res.ptr);
  }
  for (int precision = 1; precision <= 17; ++precision) {
    auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general, precision);
    double back = 0;
    std::from_chars(buf, res.ptr, back);
    if (back == v || precision == 17) return std::string(buf, res.ptr);
  }
  return "";  // unreachable
}

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

std::string text(const std::string& v, const Field&) { return v; }
std::string text(int v, const Field& f) {
  if (v == 0 && f.zero_name) return f.zero_name;
  return std::to_string(v);
}
std::string text(int64_t v, const Field&) { return std::to_string(v); }
std::string text(double v, const Field&) { return format_double(v); }
std::string text(bool v, const Field&) { return v ? "true" : "false"; }
std::string text(const std::vector<std::string>& v, const Field& f) {
  if (f.one_scalar && v.size() <= 1) return v.empty() ? "" : v[0];
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ", ";
    out += needs_quotes(v[i]) ? json_quote(v[i]) : v[i];
  }
  return out + "]";
}

std::string expected(const std::string&, const Field& f) {
  return f.choices.empty() ? "a string" : "one of " + join_choices(f);
}
std::string expected(int, const Field& f) { return expected_integer(f); }
std::string expected(int64_t, const Field& f) { return expected_integer(f); }
std::string expected(double, const Field& f) {
  if (f.has_min && f.has_max) return "a number in " + interval(f);
  if (f.has_min && f.min == 0) return f.min_open ? "a positive number" : "a non-negative number";
  if (f.has_min)
    return std::string("a number ") + (f.min_open ? "> " : ">= ") + format_double(f.min);
  if (f.has_max)
    return std::string("a number ") + (f.max_open ? "< " : "<= ") + format_double(f.max);
  return "a number";
}
std::string expected(bool, const Field&) { return "true or false"; }
std::string expected(const std::vector<std::string>&, const Field& f) {
  return f.one_scalar ? "a string or a list of strings" : "a list of strings";
}

std::string violation(const std::string& v, const Field& f) {
  if (f.choices.empty()) return "";
  for (const char* c : f.choices)
    if (v == c) return "";
  return "expected " + expected(v, f) + ", got " + in_quotes(v);
}
std::string violation(int v, const Field& f) { return integer_violation(v, f); }
std::string violation(int64_t v, const Field& f) { return integer_violation(v, f); }
std::string violation(double v, const Field& f) {
  if (std::isfinite(v) && in_range(v, f)) return "";
  return "expected " + expected(v, f) + ", got " + in_quotes(format_double(v));
}
std::string violation(bool, const Field&) { return ""; }
std::string violation(const std::vector<std::string>&, const Field&) { return ""; }

bool parse_scalar(const std::string& s, std::string& out, const Field&) {
  out = s;
  return true;
}

bool parse_scalar(const std::string& s, int& out, const Field& f) {
  if (f.zero_name && s == f.zero_name) {
    out = 0;
    return true;
  }
  int v = 0;
  if (!parse_integer(s, v)) return false;
  if (f.zero_name && v == 0) return false;  // 0 is spelled with its name
  out = v;
  return true;
}

bool parse_scalar(const std::string& s, int64_t& out, const Field&) {
  return parse_integer(s, out);
}

bool parse_scalar(const std::string& s, double& out, const Field&) {
  const char* first = s.data();
  const char* last = s.data() + s.size();
  if (first != last && *first == '+') ++first;
  if (first == last || *first == '+') return false;
  // from_chars also reads "inf"/"nan"; a job spec wants finite numbers only.
  double v = 0;
  auto [ptr, ec] = std::from_chars(first, last, v);
  if (ec != std::errc() || ptr != last || !std::isfinite(v)) return false;
  out = v;
  return true;
}

bool parse_scalar(const std::string& s, bool& out, const Field&) {
  const std::string l = lower(s);
  if (l == "true" || l == "yes" || l == "on") {
    out = true;
    return true;
  }
  if (l == "false" || l == "no" || l == "off") {
    out = false;
    return true;
  }
  return false;
}

std::string class_names_problem(const std::vector<std::string>& names) {
  std::set<std::string> seen;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i].empty()) return "expected non-empty names, got '' at index " + std::to_string(i);
    if (!seen.insert(names[i]).second)
      return "expected distinct names, got " + in_quotes(names[i]) + " twice";
  }
  return "";
}

std::string class_weights_problem(const std::vector<std::string>& weights) {
  if (weights.size() == 1 && (weights[0] == "none" || weights[0] == "balanced")) return "";
  if (weights.empty()) return "expected none, balanced or a list of weights, got []";
  const Field number("");
  bool any = false;
  for (size_t i = 0; i < weights.size(); ++i) {
    double w = 0;
    if (!parse_scalar(weights[i], w, number) || w < 0 || w > 1e6) {
      return "expected none, balanced or a list of numbers in [0, 1e6], got " +
             in_quotes(weights[i]) +
             (weights.size() > 1 ? " at index " + std::to_string(i) : std::string());
    }
    any = any || w > 0;
  }
  if (!any) return "expected at least one weight above 0";
  return "";
}

std::string weight_decay_problem(const std::string& value) {
  if (value.empty()) return "";
  double w = 0;
  if (parse_scalar(value, w, Field("")) && w >= 0) return "";
  return "expected a number >= 0 or \"\" (= weight_decay), got " + in_quotes(value);
}

int edit_distance(const std::string& a_in, const std::string& b_in) {
  const std::string a = lower(a_in), b = lower(b_in);
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

std::string Places::line(int zero_based_line) const {
  if (zero_based_line < 0) return origin_;
  return origin_ + ":" + std::to_string(zero_based_line + 1);
}

void Places::set_override(const std::string& path, const std::string& label) {
  overrides_[path] = label;
}

const std::string* Places::override_covering(const std::string& path) const {
  std::string p = path;
  while (true) {
    auto it = overrides_.find(p);
    if (it != overrides_.end()) return &it->second;
    const size_t dot = p.rfind('.');
    if (dot == std::string::npos) return nullptr;
    p.resize(dot);
  }
}

std::string Places::at(const std::string& path, int zero_based_line) const {
  if (const std::string* label = override_covering(path)) return *label;
  return line(zero_based_line);
}

std::string Places::of(const std::string& path) const {
  auto it = noted_.find(path);
  return it == noted_.end() ? origin_ : it->second;
}

}  // namespace trainer::config::detail
