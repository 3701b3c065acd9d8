#include "trainer/cluster/cluster_spec.h"

#include <array>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>

#include <spdlog/spdlog.h>

#include "trainer/util/error.h"

namespace trainer::cluster {

namespace {

using nlohmann::json;

constexpr size_t kQuoteMax = 200;  // longest piece of TF_CONFIG quoted in a message
constexpr std::array<const char*, 4> kTaskTypes = {"chief", "master", "worker", "evaluator"};
const char* const kAllowedTypes = "chief, master, worker, evaluator";
const char* const kNoPs =
    "parameter-server training is not supported; this trainer uses all-reduce across a chief "
    "and workers (as MultiWorkerMirroredStrategy): list them under 'chief' and 'worker'";

std::string clip(std::string s) {
  if (s.size() > kQuoteMax) s = s.substr(0, kQuoteMax) + "...";
  return s;
}
std::string quoted(const json& j) { return clip(j.dump()); }

[[noreturn]] void fail(const std::string& what) { throw ConfigError("TF_CONFIG: " + what); }

struct Address {
  std::string host;  // without the brackets of an IPv6 address
  int port = 0;
};

bool host_chars_ok(const std::string& host) {
  for (char c : host) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isspace(u) || std::iscntrl(u) || c == '/' || c == '[' || c == ']' || c == '@') {
      return false;
    }
  }
  return true;
}

// What is wrong with a "host:port" address, or nullopt (and *out filled) when it is well formed.
std::optional<std::string> address_problem(const std::string& a, Address* out) {
  const char* const kForm = " (expected \"host:port\", an IPv6 host in brackets: \"[::1]:2222\")";
  if (a.empty()) return std::string("empty address") + kForm;
  if (a.find("://") != std::string::npos) {
    return "a URL, not an address: give host:port without a scheme (rpc_layer names the protocol)";
  }
  std::string host;
  std::string port;
  if (a[0] == '[') {
    const size_t close = a.find(']');
    if (close == std::string::npos) return std::string("unclosed '[' in the host") + kForm;
    host = a.substr(1, close - 1);
    if (close + 1 >= a.size() || a[close + 1] != ':')
      return std::string("missing the port") + kForm;
    port = a.substr(close + 2);
  } else {
    const size_t colon = a.rfind(':');
    if (colon == std::string::npos) return std::string("missing the port") + kForm;
    host = a.substr(0, colon);
    port = a.substr(colon + 1);
    if (host.find(':') != std::string::npos) {
      return std::string("an IPv6 host must be in brackets") + kForm;
    }
  }
  if (host.empty()) return std::string("empty host") + kForm;
  if (!host_chars_ok(host)) return "host '" + host + "' has characters a host name cannot have";
  if (port.empty()) return std::string("missing the port") + kForm;
  for (char c : port) {
    if (!std::isdigit(static_cast<unsigned char>(c))) {
      return "port '" + port + "' is not a number" + kForm;
    }
  }
  const long value = port.size() > 5 ? 0 : std::strtol(port.c_str(), nullptr, 10);
  if (value < 1 || value > 65535) return "port " + port + " is not in 1..65535";
  if (out != nullptr) *out = Address{host, static_cast<int>(value)};
  return std::nullopt;
}

Address split_address(const std::string& a) {
  Address parsed;
  if (auto problem = address_problem(a, &parsed)) {
    throw ConfigError("address '" + a + "': " + *problem);
  }
  return parsed;
}

// task.index: a JSON integer, an integral float, or a string of digits. Negative and non-integer
// values fail; the range is checked by the caller.
int64_t parse_index(const json& index) {
  constexpr int64_t kHuge = int64_t{1} << 40;  // beyond any cluster; fails the range check
  if (index.is_number_unsigned()) return std::min<uint64_t>(index.get<uint64_t>(), kHuge);
  if (index.is_number_integer()) {
    const int64_t v = index.get<int64_t>();
    if (v < 0) fail("task.index " + index.dump() + " is negative; expected 0, 1, 2, ...");
    return v;
  }
  if (index.is_number_float()) {
    const double v = index.get<double>();
    if (std::isfinite(v) && v == std::floor(v)) {
      if (v < 0) fail("task.index " + index.dump() + " is negative; expected 0, 1, 2, ...");
      return v > static_cast<double>(kHuge) ? kHuge : static_cast<int64_t>(v);
    }
    fail("task.index " + index.dump() + " is not an integer; expected 0, 1, 2, ...");
  }
  if (index.is_string()) {
    const std::string s = index.get<std::string>();
    const bool negative = !s.empty() && s[0] == '-';
    const std::string digits = negative ? s.substr(1) : s;
    bool all_digits = !digits.empty();
    for (char c : digits) all_digits = all_digits && std::isdigit(static_cast<unsigned char>(c));
    if (!all_digits)
      fail("task.index " + quoted(index) + " is not an integer; expected 0, 1, 2, ...");
    if (negative) fail("task.index " + quoted(index) + " is negative; expected 0, 1, 2, ...");
    return digits.size() > 12 ? kHuge : std::stoll(digits);
  }
  fail("task.index " + quoted(index) + " is not an integer; expected 0, 1, 2, ...");
}

// The addresses of one task type, validated; absent = empty.
std::vector<std::string> task_list(const json& cluster, const std::string& type) {
  const auto it = cluster.find(type);
  if (it == cluster.end()) return {};
  const std::string where = "cluster." + type;
  if (!it->is_array()) {
    fail(where + " must be a list of \"host:port\" strings, got " + quoted(*it));
  }
  std::vector<std::string> list;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& entry = (*it)[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!entry.is_string()) fail(at + " must be a \"host:port\" string, got " + quoted(entry));
    const std::string address = entry.get<std::string>();
    if (auto problem = address_problem(address, nullptr)) {
      fail(at + " '" + clip(address) + "': " + *problem);
    }
    list.push_back(address);
  }
  return list;
}

// Two tasks of the cluster at the same address (host compared without case, port as a number).
void check_duplicates(const std::map<std::string, std::vector<std::string>>& lists) {
  std::map<std::string, std::string> seen;  // normalised address -> where
  for (const char* type : kTaskTypes) {
    const auto it = lists.find(type);
    if (it == lists.end()) continue;
    for (size_t i = 0; i < it->second.size(); ++i) {
      const std::string& address = it->second[i];
      Address parsed = split_address(address);
      std::string key;
      for (char c : parsed.host)
        key += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      key += "|" + std::to_string(parsed.port);
      const std::string where = "cluster." + std::string(type) + "[" + std::to_string(i) + "]";
      const auto [prev, inserted] = seen.emplace(key, where);
      if (!inserted) {
        fail("duplicate address '" + clip(address) + "' at " + prev->second + " and " + where +
             "; every task needs its own host:port");
      }
    }
  }
}

}  // namespace

std::string host_of(const std::string& address) { return split_address(address).host; }

int port_of(const std::string& address) { return split_address(address).port; }

ClusterSpec parse_tf_config(const std::string& text) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) return ClusterSpec{};
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    fail("not valid JSON (at byte " + std::to_string(e.byte) + "): " + e.what() + "; got '" +
         clip(text) + "'");
  } catch (const json::exception& e) {
    fail(std::string("not valid JSON: ") + e.what() + "; got '" + clip(text) + "'");
  }
  if (!doc.is_object()) fail("expected a JSON object, got " + quoted(doc));

  // Extra top-level keys (environment, rpc_layer, ...) are TensorFlow's or Kubeflow's; ignored.
  const auto cluster_it = doc.find("cluster");
  if (cluster_it == doc.end() || cluster_it->is_null()) return ClusterSpec{};
  const json& cluster = *cluster_it;
  if (!cluster.is_object()) {
    fail("'cluster' must be an object mapping task types to lists of \"host:port\", got " +
         quoted(cluster));
  }
  if (cluster.empty()) return ClusterSpec{};

  for (const auto& [type, list] : cluster.items()) {
    if (type == "ps") {
      if (list.is_array() && list.empty()) continue;  // no parameter servers after all
      fail("cluster has 'ps' tasks " + quoted(list) + ": " + kNoPs);
    }
    bool known = false;
    for (const char* allowed : kTaskTypes) known = known || type == allowed;
    if (!known) {
      fail("unknown task type '" + clip(type) + "' in cluster (allowed: " + kAllowedTypes + ")");
    }
  }
  std::map<std::string, std::vector<std::string>> lists;
  for (const char* type : kTaskTypes) lists[type] = task_list(cluster, type);
  check_duplicates(lists);

  const auto& chief = lists["chief"];
  const auto& master = lists["master"];
  const auto& workers = lists["worker"];
  const auto& evaluators = lists["evaluator"];
  if (!chief.empty() && !master.empty()) {
    fail("cluster has both 'chief' " + quoted(cluster["chief"]) + " and 'master' " +
         quoted(cluster["master"]) +
         "; 'master' is AI Platform's name for the chief: give only one of them");
  }
  const std::string chief_type = master.empty() ? "chief" : "master";
  const auto& chiefs = master.empty() ? chief : master;
  if (chiefs.size() > 1) {
    fail("cluster." + chief_type + " " + quoted(cluster[chief_type]) + " lists " +
         std::to_string(chiefs.size()) +
         " tasks, but there is at most one chief (two chiefs would both write the job's outputs)");
  }
  if (evaluators.size() > 1) {
    fail("cluster.evaluator " + quoted(cluster["evaluator"]) + " lists " +
         std::to_string(evaluators.size()) + " tasks, but there is at most one evaluator");
  }
  if (!master.empty()) {
    spdlog::info("TF_CONFIG: taking the 'master' task ({}) as the chief (AI Platform's name)",
                 master[0]);
  }
  if (chiefs.empty() && workers.empty()) {
    fail("cluster " + quoted(cluster) +
         " has no chief and an empty worker list; training needs a 'chief' or at least one "
         "'worker'");
  }

  // Which task this process is. With a single task in the cluster it may be left out.
  const size_t total = chiefs.size() + workers.size() + evaluators.size();
  std::string type;
  json index = 0;
  const auto task_it = doc.find("task");
  const bool has_task = task_it != doc.end() && !task_it->is_null();
  if (has_task && !task_it->is_object()) {
    fail("'task' must be an object with 'type' and 'index', got " + quoted(*task_it));
  }
  if (has_task && task_it->contains("index") && !(*task_it)["index"].is_null()) {
    index = (*task_it)["index"];  // absent = 0, as TensorFlow's RunConfig
  }
  if (has_task && task_it->contains("type")) {
    const json& t = (*task_it)["type"];
    if (!t.is_string()) fail("task.type must be a string, got " + quoted(t));
    type = t.get<std::string>();
  } else if (total == 1) {
    type = !chiefs.empty() ? chief_type : !workers.empty() ? "worker" : "evaluator";
  } else if (has_task) {
    fail("task.type is missing in 'task' " + quoted(*task_it) + ", and the cluster has " +
         std::to_string(total) + " tasks; set task.type to one of " + kAllowedTypes);
  } else {
    fail("'task' is missing, and the cluster " + quoted(cluster) + " has " + std::to_string(total) +
         " tasks; set \"task\": {\"type\": ..., \"index\": ...} for this process");
  }
  if (type == "ps") fail("task.type 'ps': " + std::string(kNoPs));
  bool known = false;
  for (const char* allowed : kTaskTypes) known = known || type == allowed;
  if (!known) fail("unknown task.type '" + clip(type) + "' (allowed: " + kAllowedTypes + ")");

  const std::vector<std::string>& own_list = lists[type];
  // An evaluator need not be listed in the cluster (as in TensorFlow); then it is evaluator 0.
  const bool unlisted_evaluator = type == "evaluator" && own_list.empty();
  if (own_list.empty() && !unlisted_evaluator) {
    std::string present;
    for (const auto& [t, list] : cluster.items()) present += (present.empty() ? "" : ", ") + t;
    fail("task.type '" + type + "' has no tasks in the cluster (it has: " + present + ")");
  }
  const int64_t idx = parse_index(index);
  const int64_t count = unlisted_evaluator ? 1 : static_cast<int64_t>(own_list.size());
  if (idx >= count) {
    const std::string valid = count == 1 ? "0" : "0.." + std::to_string(count - 1);
    fail("task.index " + index.dump() + " is out of range for '" + type + "', which has " +
         std::to_string(count) + (count == 1 ? " task" : " tasks") + " (valid: " + valid + ")");
  }

  ClusterSpec spec;
  spec.has_chief_task = !chiefs.empty();
  spec.num_workers = static_cast<int>(workers.size());
  spec.world_size = static_cast<int>(chiefs.size() + workers.size());
  spec.worker_addresses = chiefs;
  spec.worker_addresses.insert(spec.worker_addresses.end(), workers.begin(), workers.end());
  spec.chief_address = spec.worker_addresses.front();
  spec.task_index = static_cast<int>(idx);
  spec.own_address = unlisted_evaluator ? "" : own_list[static_cast<size_t>(idx)];
  if (type == "evaluator") {
    spec.task_type = "evaluator";
    spec.rank = -1;
  } else if (type == "worker") {
    spec.task_type = "worker";
    spec.rank = spec.task_index + (spec.has_chief_task ? 1 : 0);
  } else {  // chief or master
    spec.task_type = "chief";
    spec.rank = 0;
  }
  return spec;
}

nlohmann::json to_json(const ClusterSpec& spec) {
  return {{"task_type", spec.task_type},
          {"task_index", spec.task_index},
          {"rank", spec.rank},
          {"world_size", spec.world_size},
          {"is_chief", spec.is_chief()},
          {"chief_address", spec.chief_address},
          {"own_address", spec.own_address}};
}

}  // namespace trainer::cluster

namespace trainer::cluster {

std::string task_name(const ClusterSpec& spec, int rank) {
  if (spec.has_chief_task) return rank == 0 ? "chief" : "worker " + std::to_string(rank - 1);
  return "worker " + std::to_string(rank);
}

}  // namespace trainer::cluster
