// YAML <-> JobSpec through the field table: reading (with --set overrides applied to the tree
// first, unknown keys and wrong types rejected, every value's place noted) and writing (rows of
// key, YAML scalar text and doc). The only users of yaml-cpp; private to config/. Stateless.
#pragma once

#include <string>
#include <vector>

#include "trainer/config/job_spec.h"
#include "trainer/config/values.h"

namespace trainer::config::detail {

// YAML text + overrides -> JobSpec (not yet validated). Notes in `places` where each field came
// from. Throws ConfigError.
JobSpec read_yaml(const std::string& yaml_text, const std::vector<std::string>& overrides,
                  Places& places);

// One line of the spec as YAML: a section header (value empty) or a leaf.
struct YamlRow {
  int depth = 0;         // nesting level (0 = top-level section)
  bool section = false;  // a nested struct
  std::string key;       // YAML key
  std::string path;      // dotted path
  std::string value;     // YAML scalar / flow text that reads back to the same value
  std::string doc;       // doc line (with choices)
};

// Every section and field of `spec`, in declaration order.
std::vector<YamlRow> yaml_rows(const JobSpec& spec);

}  // namespace trainer::config::detail
