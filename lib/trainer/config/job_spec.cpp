// The job spec's public functions; every one is a visitor over the field table in fields.h.
#include "trainer/config/job_spec.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "trainer/config/fields.h"
#include "trainer/config/yaml_io.h"
#include "trainer/util/error.h"
#include "trainer/util/hash.h"

namespace trainer::config {
namespace {

using detail::Field;
using detail::NoChecks;

// Checks every field's rule and the cross-field checks, throwing on the first problem.
class Validator {
 public:
  Validator(const detail::Places& places, std::string prefix)
      : places_(places), prefix_(std::move(prefix)) {}

  template <class T>
  void operator()(const char* name, T& value, const Field& f) {
    const std::string problem = detail::violation(value, f);
    if (!problem.empty()) fail(prefix_ + name, problem);
  }

  template <class S>
  void section(const char* name, S& sub, const char*) {
    Validator inner(places_, prefix_ + name + ".");
    detail::visit(sub, inner);
  }

  template <class F>
  void check(const char* name, F&& problem_of) {
    const std::string problem = problem_of();
    if (!problem.empty()) fail(prefix_ + name, problem);
  }

 private:
  [[noreturn]] void fail(const std::string& path, const std::string& problem) const {
    throw ConfigError(places_.of(path) + ": " + path + ": " + problem);
  }

  const detail::Places& places_;
  std::string prefix_;
};

void validate(const JobSpec& spec, const detail::Places& places) {
  JobSpec copy = spec;  // the table visits mutable structs; nothing is changed
  Validator v(places, "");
  detail::visit(copy, v);
}

nlohmann::json json_value(const std::string& v, const Field&) { return v; }
nlohmann::json json_value(int v, const Field& f) {
  if (v == 0 && f.zero_name) return f.zero_name;
  return v;
}
nlohmann::json json_value(int64_t v, const Field&) { return v; }
nlohmann::json json_value(double v, const Field&) { return v; }
nlohmann::json json_value(bool v, const Field&) { return v; }
nlohmann::json json_value(const std::vector<std::string>& v, const Field& f) {
  if (f.one_scalar && v.size() <= 1) return v.empty() ? "" : v[0];
  return v;
}

class JsonWriter : public NoChecks {
 public:
  explicit JsonWriter(nlohmann::json& out) : out_(out) {}

  template <class T>
  void operator()(const char* name, T& value, const Field& f) {
    out_[name] = json_value(value, f);
  }

  template <class S>
  void section(const char* name, S& sub, const char*) {
    nlohmann::json& child = out_[name] = nlohmann::json::object();
    JsonWriter inner(child);
    detail::visit(sub, inner);
  }

 private:
  nlohmann::json& out_;
};

class Flattener : public NoChecks {
 public:
  Flattener(std::vector<std::pair<std::string, std::string>>& out, std::string prefix)
      : out_(out), prefix_(std::move(prefix)) {}

  template <class T>
  void operator()(const char* name, T& value, const Field& f) {
    out_.emplace_back(prefix_ + name, detail::text(value, f));
  }

  template <class S>
  void section(const char* name, S& sub, const char*) {
    Flattener inner(out_, prefix_ + name + ".");
    detail::visit(sub, inner);
  }

 private:
  std::vector<std::pair<std::string, std::string>>& out_;
  std::string prefix_;
};

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// `text` padded with spaces to `column` (at least two spaces), then `# comment`.
std::string with_comment(const std::string& text, size_t column, const std::string& comment) {
  if (comment.empty()) return text;
  const size_t pad = text.size() + 2 > column ? 2 : column - text.size();
  return text + std::string(pad, ' ') + "# " + comment;
}

constexpr size_t kMaxCommentColumn = 48;

}  // namespace

void validate_job_spec(const JobSpec& spec, const std::string& origin) {
  validate(spec, detail::Places(origin));
}

JobSpec parse_job_spec(const std::string& yaml_text, const std::vector<std::string>& overrides,
                       const std::string& origin) {
  detail::Places places(origin);
  JobSpec spec = detail::read_yaml(yaml_text, overrides, places);
  validate(spec, places);
  return spec;
}

JobSpec load_job_spec(const std::string& path, const std::vector<std::string>& overrides) {
  if (path.empty()) return parse_job_spec("", overrides, "(defaults)");
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError("cannot read job spec '" + path + "': it is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("cannot read job spec '" + path + "': " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ConfigError("cannot read job spec '" + path + "': read failed");
  return parse_job_spec(text.str(), overrides, path);
}

std::string to_yaml(const JobSpec& spec) {
  const std::vector<detail::YamlRow> rows = detail::yaml_rows(spec);
  std::vector<std::string> lines;
  size_t column = 0;
  for (const auto& r : rows) {
    std::string line = std::string(2 * r.depth, ' ') + r.key + ":";
    if (!r.section) line += " " + r.value;
    if (!r.section && line.size() + 2 <= kMaxCommentColumn)
      column = std::max(column, line.size() + 2);
    lines.push_back(std::move(line));
  }
  std::string out = "# resolved by trainer " TRAINER_VERSION "\n";
  for (size_t i = 0; i < rows.size(); ++i)
    out += with_comment(lines[i], column, rows[i].doc) + "\n";
  return out;
}

nlohmann::json to_json(const JobSpec& spec) {
  JobSpec copy = spec;
  nlohmann::json out = nlohmann::json::object();
  JsonWriter writer(out);
  detail::visit(copy, writer);
  return out;
}

std::vector<std::pair<std::string, std::string>> flatten(const JobSpec& spec) {
  JobSpec copy = spec;
  std::vector<std::pair<std::string, std::string>> out;
  Flattener flattener(out, "");
  detail::visit(copy, flattener);
  return out;
}

namespace {

bool is_ignored(const std::string& field, const std::vector<std::string>& ignored_prefixes) {
  for (const auto& p : ignored_prefixes) {
    if (starts_with(field, p)) return true;
  }
  return false;
}

}  // namespace

std::optional<FieldDifference> first_difference(const JobSpec& a, const JobSpec& b,
                                                const std::vector<std::string>& ignored_prefixes) {
  const auto left = flatten(a);
  const auto right = flatten(b);  // same table, so the same fields in the same order
  for (size_t i = 0; i < left.size(); ++i) {
    const std::string& field = left[i].first;
    if (!is_ignored(field, ignored_prefixes) && left[i].second != right[i].second)
      return FieldDifference{field, left[i].second, right[i].second};
  }
  return std::nullopt;
}

std::vector<std::string> resumable_changes(const JobSpec& spec) {
  std::vector<std::string> fields = {
      "train.epochs",          "train.max_steps",       "logging.",
      "checkpoint.",           "train.threads",         "data.num_workers",
      "data.prefetch_batches", "distributed.timeout_s", "distributed.rendezvous_timeout_s",
      "distributed.interface", "distributed.cluster",   "export.",
      "train.early_stopping."};
  if (!spec.data.augment.random_resized_crop) fields.push_back("data.cache");
  return fields;
}

std::string fingerprint(const JobSpec& spec, const std::vector<std::string>& ignored_prefixes) {
  // FNV-1a, 128 bits, over "path\0value\0" of every field not ignored.
  // Fields added after job dirs were first written, left out at their default value: the
  // checkpoints of a job dir written before them carry a fingerprint without them, and must
  // still resume.
  static const std::vector<std::string> kLaterFields = {
      "train.deterministic", "export.onnx", "export.onnx_preprocessing", "export.onnx_opset",
      "export.weights",
      // The training recipes (issue 32).
      "data.augment.vertical_flip", "data.augment.rotate90", "data.augment.rotate_degrees",
      "data.augment.color_jitter.", "data.augment.policy", "data.augment.magnitude",
      "data.augment.num_ops", "data.augment.random_erasing", "data.interpolation",
      "data.eval_resize", "data.eval_crop_size", "data.sampler", "data.validation_split",
      "train.optimizer.norm_weight_decay", "train.optimizer.bias_weight_decay",
      "train.lr_schedule.factor", "train.lr_schedule.patience", "train.lr_schedule.metric",
      "train.mixup_alpha", "train.cutmix_alpha", "train.ema.", "train.clip_grad_norm",
      "train.class_weights", "train.loss", "train.focal_gamma", "train.bi_tempered_",
      "train.early_stopping.", "checkpoint.keep_best"};
  static const JobSpec kDefaultSpec;
  static const std::vector<std::pair<std::string, std::string>> kDefaults = flatten(kDefaultSpec);
  const auto fields = flatten(spec);
  util::Fnv1a128 hash;
  for (size_t i = 0; i < fields.size(); ++i) {
    const auto& [path, value] = fields[i];
    if (is_ignored(path, ignored_prefixes)) continue;
    if (is_ignored(path, kLaterFields) && value == kDefaults[i].second) continue;
    hash.add(path).add_byte(0);
    hash.add(value).add_byte(0);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string out(32, '0');
  auto h = hash.value();
  for (int i = 31; i >= 0; --i, h >>= 4) out[i] = kHex[static_cast<unsigned>(h & 0xF)];
  return out;
}

int cuda_device_index(const std::string& device) {
  if (device.rfind("cuda:", 0) != 0) return -1;
  const std::string n = device.substr(5);
  if (n.empty() || n.size() > 4 || (n.size() > 1 && n[0] == '0') ||
      n.find_first_not_of("0123456789") != std::string::npos) {
    return -1;
  }
  return std::stoi(n);
}

std::string field_reference() {
  const JobSpec defaults;
  const std::vector<detail::YamlRow> rows = detail::yaml_rows(defaults);
  size_t column = 0;
  for (const auto& r : rows) {
    const size_t width = 2 + r.path.size() + 3 + r.value.size() + 2;
    if (!r.section && width <= kMaxCommentColumn + 8) column = std::max(column, width);
  }
  std::string out;
  for (const auto& r : rows) {
    if (r.section && r.depth == 0) {
      out += (out.empty() ? "" : "\n") + r.key + ": " + r.doc + "\n";
    } else if (r.section) {
      out += "  # " + r.path + ": " + r.doc + "\n";
    } else {
      out += with_comment("  " + r.path + " = " + r.value, column, r.doc) + "\n";
    }
  }
  return out;
}

}  // namespace trainer::config
