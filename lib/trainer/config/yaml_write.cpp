// JobSpec -> YAML rows through the field table (see yaml_io.h).
#include <yaml-cpp/yaml.h>

#include "trainer/config/fields.h"
#include "trainer/config/yaml_io.h"

namespace trainer::config::detail {
namespace {

// True when `text` reads back (as the reader does) to the scalar `s`.
bool reads_back(const std::string& text, const std::string& s) {
  try {
    const YAML::Node n = YAML::Load(text);
    if (s.empty()) return n.IsScalar() && n.Scalar().empty();
    return n.IsScalar() && n.Scalar() == s;
  } catch (const YAML::Exception&) {
    return false;
  }
}

bool reads_back(const std::string& text, const std::vector<std::string>& v) {
  try {
    const YAML::Node n = YAML::Load(text);
    if (!n.IsSequence() || n.size() != v.size()) return false;
    for (size_t i = 0; i < v.size(); ++i)
      if (!n[i].IsScalar() || n[i].Scalar() != v[i]) return false;
    return true;
  } catch (const YAML::Exception&) {
    return false;
  }
}

// yaml-cpp's choice of plain or quoted, checked; double quotes when in doubt.
std::string yaml_value(const std::string& s, const Field&) {
  YAML::Emitter e;
  e << s;
  std::string text = e.c_str();
  if (text.find('\n') != std::string::npos || !reads_back(text, s)) {
    YAML::Emitter q;
    q << YAML::DoubleQuoted << s;
    text = q.c_str();
  }
  return text;
}

std::string yaml_value(const std::vector<std::string>& v, const Field& f) {
  if (f.one_scalar && v.size() <= 1) return yaml_value(v.empty() ? "" : v[0], f);
  for (const bool force_quotes : {false, true}) {
    YAML::Emitter e;
    e << YAML::Flow << YAML::BeginSeq;
    for (const auto& s : v) {
      if (force_quotes) e << YAML::DoubleQuoted;
      e << s;
    }
    e << YAML::EndSeq;
    const std::string text = e.c_str();
    if (force_quotes || (text.find('\n') == std::string::npos && reads_back(text, v))) return text;
  }
  return "[]";  // unreachable
}

// Numbers and bools: the canonical text is already a plain YAML scalar the reader accepts.
template <class T>
std::string yaml_value(const T& v, const Field& f) {
  return text(v, f);
}

class RowWriter : public NoChecks {
 public:
  RowWriter(std::vector<YamlRow>& rows, std::string prefix, int depth)
      : rows_(rows), prefix_(std::move(prefix)), depth_(depth) {}

  template <class T>
  void operator()(const char* name, T& value, const Field& f) {
    rows_.push_back({depth_, false, name, prefix_ + name, yaml_value(value, f), doc_line(f)});
  }

  template <class S>
  void section(const char* name, S& sub, const char* doc) {
    rows_.push_back({depth_, true, name, prefix_ + name, "", doc});
    RowWriter inner(rows_, prefix_ + name + ".", depth_ + 1);
    visit(sub, inner);
  }

 private:
  std::vector<YamlRow>& rows_;
  std::string prefix_;
  int depth_;
};

}  // namespace

std::vector<YamlRow> yaml_rows(const JobSpec& spec) {
  JobSpec copy = spec;  // the table visits mutable structs; nothing is changed
  std::vector<YamlRow> rows;
  RowWriter writer(rows, "", 0);
  visit(copy, writer);
  return rows;
}

}  // namespace trainer::config::detail
