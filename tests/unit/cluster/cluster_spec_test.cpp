// TF_CONFIG -> ClusterSpec: a table of valid documents with every field of the result, and a
// table of invalid ones, each checked for "TF_CONFIG: " and the quoted offending part. Also the
// host:port helpers, to_json, the 'master' log line and cluster_from_env over the real environment.
#include "common/catch.h"
#include "common/log_capture.h"

#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "trainer/cluster/cluster_spec.h"
#include "trainer/cluster/environment.h"
#include "trainer/util/error.h"

using trainer::ConfigError;
using trainer::cluster::cluster_from_env;
using trainer::cluster::ClusterSpec;
using trainer::cluster::host_of;
using trainer::cluster::parse_tf_config;
using trainer::cluster::port_of;
using trainer::cluster::to_json;
using trainer::test::Contains;
using trainer::test::StartsWith;

namespace {

// Chief + 2 workers (+ an evaluator), the shape of the Cassava tutorial's cluster.
const std::string kCluster =
    R"("cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"]})";
const std::string kClusterEval =
    R"("cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "evaluator": ["e:2222"]})";
const std::string kWorkers = R"("cluster": {"worker": ["w0:2222", "w1:2222"]})";

std::string doc(const std::string& cluster, const std::string& task) {
  return "{" + cluster + R"(, "task": )" + task + "}";
}

// A ClusterSpec to compare with, and whether its task is the chief (ClusterSpec::is_chief()).
struct Expected : ClusterSpec {
  bool chief = true;
};

struct Valid {
  std::string name;
  std::string text;
  Expected want;
};

Expected spec(std::string type, int index, int rank, int world, bool chief,
              std::string chief_address, std::string own, std::vector<std::string> addresses,
              bool has_chief, int workers) {
  Expected s;
  s.task_type = std::move(type);
  s.task_index = index;
  s.rank = rank;
  s.world_size = world;
  s.chief = chief;
  s.chief_address = std::move(chief_address);
  s.own_address = std::move(own);
  s.worker_addresses = std::move(addresses);
  s.has_chief_task = has_chief;
  s.num_workers = workers;
  return s;
}

const Expected kLocal = Expected{};  // one local worker, its own chief
const std::vector<std::string> kCW = {"c:2222", "w0:2222", "w1:2222"};
const std::vector<std::string> kW = {"w0:2222", "w1:2222"};

// The message of the ConfigError parse_tf_config throws, or "(no error)".
std::string error_of(const std::string& text) {
  try {
    parse_tf_config(text);
  } catch (const ConfigError& e) {
    CHECK(trainer::exit_code(e.kind()) == 2);
    return e.what();
  }
  return "(no error)";
}

// Sets (or with nullopt unsets) an environment variable for one scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

using trainer::test_support::LogCapture;  // tests/common/log_capture.h

}  // namespace

TEST_CASE("valid TF_CONFIG documents give this task's role", "[cluster]") {
  const std::vector<Valid> table = {
      {"no TF_CONFIG (empty text)", "", kLocal},
      {"whitespace only", " \n\t", kLocal},
      {"empty object", "{}", kLocal},
      {"no cluster, a task", R"({"task": {"type": "worker", "index": 3}})", kLocal},
      {"empty cluster", R"({"cluster": {}, "task": {"type": "worker", "index": 0}})", kLocal},
      {"null cluster", R"({"cluster": null})", kLocal},
      {"only extras", R"({"environment": "cloud", "rpc_layer": "grpc"})", kLocal},

      {"chief+2 workers: chief", doc(kCluster, R"({"type": "chief", "index": 0})"),
       spec("chief", 0, 0, 3, true, "c:2222", "c:2222", kCW, true, 2)},
      {"chief+2 workers: worker 0", doc(kCluster, R"({"type": "worker", "index": 0})"),
       spec("worker", 0, 1, 3, false, "c:2222", "w0:2222", kCW, true, 2)},
      {"chief+2 workers: worker 1", doc(kCluster, R"({"type": "worker", "index": 1})"),
       spec("worker", 1, 2, 3, false, "c:2222", "w1:2222", kCW, true, 2)},

      {"workers only: worker 0 is chief", doc(kWorkers, R"({"type": "worker", "index": 0})"),
       spec("worker", 0, 0, 2, true, "w0:2222", "w0:2222", kW, false, 2)},
      {"workers only: worker 1", doc(kWorkers, R"({"type": "worker", "index": 1})"),
       spec("worker", 1, 1, 2, false, "w0:2222", "w1:2222", kW, false, 2)},

      {"master is the chief",
       R"({"cluster": {"master": ["m:1"], "worker": ["w:2"]}, "task": {"type": "master", "index": 0}})",
       spec("chief", 0, 0, 2, true, "m:1", "m:1", {"m:1", "w:2"}, true, 1)},
      {"worker beside a master",
       R"({"cluster": {"master": ["m:1"], "worker": ["w:2"]}, "task": {"type": "worker", "index": 0}})",
       spec("worker", 0, 1, 2, false, "m:1", "w:2", {"m:1", "w:2"}, true, 1)},

      {"evaluator is not in the world", doc(kClusterEval, R"({"type": "evaluator", "index": 0})"),
       spec("evaluator", 0, -1, 3, false, "c:2222", "e:2222", kCW, true, 2)},
      {"evaluator cluster, worker 1", doc(kClusterEval, R"({"type": "worker", "index": 1})"),
       spec("worker", 1, 2, 3, false, "c:2222", "w1:2222", kCW, true, 2)},
      {"evaluator the cluster does not list", doc(kWorkers, R"({"type": "evaluator"})"),
       spec("evaluator", 0, -1, 2, false, "w0:2222", "", kW, false, 2)},

      {"index as a string", doc(kCluster, R"({"type": "worker", "index": "1"})"),
       spec("worker", 1, 2, 3, false, "c:2222", "w1:2222", kCW, true, 2)},
      {"index as an integral float", doc(kCluster, R"({"type": "worker", "index": 1.0})"),
       spec("worker", 1, 2, 3, false, "c:2222", "w1:2222", kCW, true, 2)},
      {"index left out is 0", doc(kCluster, R"({"type": "worker"})"),
       spec("worker", 0, 1, 3, false, "c:2222", "w0:2222", kCW, true, 2)},
      {"index null is 0", doc(kCluster, R"({"type": "chief", "index": null})"),
       spec("chief", 0, 0, 3, true, "c:2222", "c:2222", kCW, true, 2)},

      {"TensorFlow and Kubeflow extras",
       "{" + kCluster +
           R"(, "task": {"type": "worker", "index": 1, "trial": "3"}, "environment": "cloud",
               "rpc_layer": "grpc", "job": {"args": []}})",
       spec("worker", 1, 2, 3, false, "c:2222", "w1:2222", kCW, true, 2)},

      {"IPv6 in brackets",
       R"({"cluster": {"chief": ["[::1]:2222"], "worker": ["[::1]:2223", "[fe80::1%eth0]:1"]},
           "task": {"type": "worker", "index": 0}})",
       spec("worker", 0, 1, 3, false, "[::1]:2222", "[::1]:2223",
            {"[::1]:2222", "[::1]:2223", "[fe80::1%eth0]:1"}, true, 2)},
      {"ports 1 and 65535",
       R"({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:65535"]}, "task": {"type": "worker", "index": 1}})",
       spec("worker", 1, 1, 2, false, "127.0.0.1:1", "127.0.0.1:65535",
            {"127.0.0.1:1", "127.0.0.1:65535"}, false, 2)},

      {"chief with an empty worker list",
       R"({"cluster": {"chief": ["c:1"], "worker": []}, "task": {"type": "chief", "index": 0}})",
       spec("chief", 0, 0, 1, true, "c:1", "c:1", {"c:1"}, true, 0)},
      {"chief alone, no worker key",
       R"({"cluster": {"chief": ["c:1"]}, "task": {"type": "chief", "index": 0}})",
       spec("chief", 0, 0, 1, true, "c:1", "c:1", {"c:1"}, true, 0)},
      {"a single task and no task key", R"({"cluster": {"worker": ["w:1"]}})",
       spec("worker", 0, 0, 1, true, "w:1", "w:1", {"w:1"}, false, 1)},
      {"a single task, task without type", R"({"cluster": {"chief": ["c:1"]}, "task": {}})",
       spec("chief", 0, 0, 1, true, "c:1", "c:1", {"c:1"}, true, 0)},
      {"an empty ps list is no parameter server",
       R"({"cluster": {"worker": ["w:1"], "ps": []}, "task": {"type": "worker", "index": 0}})",
       spec("worker", 0, 0, 1, true, "w:1", "w:1", {"w:1"}, false, 1)},
  };
  for (const Valid& c : table) {
    SECTION(c.name) {
      INFO("TF_CONFIG = " << c.text);
      const ClusterSpec got = parse_tf_config(c.text);
      CHECK(got.task_type == c.want.task_type);
      CHECK(got.task_index == c.want.task_index);
      CHECK(got.rank == c.want.rank);
      CHECK(got.world_size == c.want.world_size);
      CHECK(got.is_chief() == c.want.chief);
      CHECK(got.chief_address == c.want.chief_address);
      CHECK(got.own_address == c.want.own_address);
      CHECK(got.worker_addresses == c.want.worker_addresses);
      CHECK(got.has_chief_task == c.want.has_chief_task);
      CHECK(got.num_workers == c.want.num_workers);
      CHECK(got.world_size == (got.has_chief_task ? 1 : 0) + got.num_workers);
    }
  }
}

TEST_CASE("every rank of a cluster is distinct and rank 0 alone is chief", "[cluster]") {
  for (int workers = 1; workers <= 4; ++workers) {
    for (bool with_chief : {false, true}) {
      std::string cluster = R"("cluster": {)";
      if (with_chief) cluster += R"("chief": ["c:9000"], )";
      cluster += R"("worker": [)";
      for (int i = 0; i < workers; ++i) {
        cluster += (i ? ", " : "") + std::string("\"w:") + std::to_string(9001 + i) + "\"";
      }
      cluster += "]}";
      std::vector<std::string> tasks;
      if (with_chief) tasks.push_back(R"({"type": "chief", "index": 0})");
      for (int i = 0; i < workers; ++i) {
        tasks.push_back(R"({"type": "worker", "index": )" + std::to_string(i) + "}");
      }
      std::vector<int> ranks;
      for (const std::string& task : tasks) {
        const ClusterSpec s = parse_tf_config(doc(cluster, task));
        CHECK(s.world_size == workers + (with_chief ? 1 : 0));
        CHECK(s.is_chief() == (s.rank == 0));
        CHECK(s.worker_addresses.at(static_cast<size_t>(s.rank)) == s.own_address);
        CHECK(s.chief_address == s.worker_addresses.front());
        ranks.push_back(s.rank);
      }
      for (size_t r = 0; r < ranks.size(); ++r) CHECK(ranks[r] == static_cast<int>(r));
    }
  }
}

TEST_CASE("invalid TF_CONFIG documents name and quote the offending part", "[cluster]") {
  struct Invalid {
    std::string name;
    std::string text;
    std::vector<std::string> contains;
  };
  const std::string kNoPs = "parameter-server training is not supported";
  const auto workers = [](const std::string& list) {
    return R"({"cluster": {"worker": )" + list + R"(}, "task": {"type": "worker", "index": 0}})";
  };
  const auto index = [](const std::string& value) {
    return doc(kCluster, R"({"type": "worker", "index": )" + value + "}");
  };
  const std::vector<Invalid> table = {
      // The document itself.
      {"bad JSON", "{oops", {"not valid JSON", "at byte", "'{oops'"}},
      {"truncated JSON", R"({"cluster": {"worker": ["a:1")", {"not valid JSON", "\"a:1\""}},
      {"not an object", "[1,2]", {"expected a JSON object", "[1,2]"}},
      {"a bare string", R"("worker")", {"expected a JSON object", "\"worker\""}},

      // The cluster.
      {"cluster not an object", R"({"cluster": ["a:1"]})", {"'cluster'", R"(["a:1"])"}},
      {"cluster a string", R"({"cluster": "a:1,b:2"})", {"'cluster'", R"("a:1,b:2")"}},
      {"task list not an array",
       R"({"cluster": {"worker": "a:1"}})",
       {"cluster.worker", "list of", R"("a:1")"}},
      {"task list of numbers", workers(R"(["a:1", 2222])"), {"cluster.worker[1]", "2222"}},
      {"task list of objects",
       workers(R"([{"host": "a"}])"),
       {"cluster.worker[0]", R"({"host":"a"})"}},
      {"unknown task type",
       R"({"cluster": {"trainer": ["a:1"]}})",
       {"unknown task type 'trainer'", "chief, master, worker, evaluator"}},
      {"ps in the cluster",
       R"({"cluster": {"ps": ["p:1"], "worker": ["a:1", "b:2"]}})",
       {"'ps'", R"(["p:1"])", kNoPs, "'chief' and 'worker'"}},
      {"ps with a chief",
       R"({"cluster": {"chief": ["c:1"], "ps": ["p:1", "p:2"]}})",
       {R"(["p:1","p:2"])", kNoPs}},
      {"chief and master together",
       R"({"cluster": {"chief": ["c:1"], "master": ["m:1"]}})",
       {"'chief'", R"(["c:1"])", "'master'", R"(["m:1"])", "only one"}},
      {"two chiefs",
       R"({"cluster": {"chief": ["c:1", "c:2"], "worker": ["w:1"]}, "task": {"type": "worker", "index": 0}})",
       {"two chiefs", "cluster.chief", R"(["c:1","c:2"])"}},
      {"two masters",
       R"({"cluster": {"master": ["m:1", "m:2"]}})",
       {"two chiefs", "cluster.master", R"(["m:1","m:2"])"}},
      {"two evaluators",
       R"({"cluster": {"worker": ["w:1"], "evaluator": ["e:1", "e:2"]}})",
       {"at most one evaluator", R"(["e:1","e:2"])"}},
      {"empty worker list, no chief",
       R"({"cluster": {"worker": []}})",
       {"empty worker list", R"({"worker":[]})"}},
      {"only an evaluator",
       R"({"cluster": {"evaluator": ["e:1"]}})",
       {"empty worker list", R"({"evaluator":["e:1"]})"}},
      {"only an empty chief list",
       R"({"cluster": {"chief": [], "worker": []}})",
       {"empty worker list"}},

      // The task.
      {"task missing, 3 tasks",
       "{" + kCluster + "}",
       {"'task' is missing", "3 tasks", R"("worker":["w0:2222","w1:2222"])"}},
      {"task null, 2 tasks", "{" + kWorkers + R"(, "task": null})", {"'task' is missing"}},
      {"task not an object", doc(kCluster, R"("worker:0")"), {"'task'", R"("worker:0")"}},
      {"task.type missing",
       doc(kCluster, R"({"index": 1})"),
       {"task.type is missing", R"({"index":1})"}},
      {"task.type not a string",
       doc(kCluster, R"({"type": 1, "index": 0})"),
       {"task.type must be a string", "got 1"}},
      {"task.type unknown",
       doc(kCluster, R"({"type": "trainer", "index": 0})"),
       {"unknown task.type 'trainer'", "chief, master, worker, evaluator"}},
      {"task.type ps", doc(kCluster, R"({"type": "ps", "index": 0})"), {"task.type 'ps'", kNoPs}},
      {"task.type not in the cluster",
       doc(kWorkers, R"({"type": "chief", "index": 0})"),
       {"task.type 'chief'", "no tasks in the cluster", "it has: worker"}},
      {"task.type master, cluster has chief",
       doc(kCluster, R"({"type": "master", "index": 0})"),
       {"task.type 'master'", "it has: chief, worker"}},
      {"index out of range", index("2"), {"task.index 2", "'worker'", "2 tasks", "valid: 0..1"}},
      {"string index out of range", index(R"("5")"), {R"(task.index "5")", "valid: 0..1"}},
      {"huge index", index("99999999999999999999"), {"task.index", "valid: 0..1"}},
      {"chief index 1",
       doc(kCluster, R"({"type": "chief", "index": 1})"),
       {"task.index 1", "'chief'", "1 task", "valid: 0)"}},
      {"unlisted evaluator index 1",
       doc(kWorkers, R"({"type": "evaluator", "index": 1})"),
       {"task.index 1", "'evaluator'", "valid: 0)"}},
      {"negative index", index("-1"), {"task.index -1", "negative"}},
      {"negative string index", index(R"("-1")"), {R"(task.index "-1")", "negative"}},
      {"non-integer index", index("1.5"), {"task.index 1.5", "not an integer"}},
      {"non-integer string index", index(R"("one")"), {R"(task.index "one")", "not an integer"}},
      {"string index with a space", index(R"(" 1")"), {R"(task.index " 1")", "not an integer"}},
      {"empty string index", index(R"("")"), {R"(task.index "")", "not an integer"}},
      {"boolean index", index("true"), {"task.index true", "not an integer"}},
      {"list index", index("[1]"), {"task.index [1]", "not an integer"}},

      // Addresses.
      {"missing port",
       workers(R"(["hostonly"])"),
       {"cluster.worker[0]", "'hostonly'", "missing the port"}},
      {"empty port",
       workers(R"(["w:1", "host:"])"),
       {"cluster.worker[1]", "'host:'", "missing the port"}},
      {"port 0", workers(R"(["host:0"])"), {"'host:0'", "port 0", "1..65535"}},
      {"port 65536", workers(R"(["host:65536"])"), {"'host:65536'", "port 65536", "1..65535"}},
      {"port too long", workers(R"(["host:0000002222"])"), {"'host:0000002222'", "1..65535"}},
      {"port not a number", workers(R"(["host:http"])"), {"'host:http'", "port 'http'"}},
      {"negative port", workers(R"(["host:-1"])"), {"'host:-1'", "port '-1'"}},
      {"empty host", workers(R"([":2222"])"), {"':2222'", "empty host"}},
      {"empty address", workers(R"([""])"), {"cluster.worker[0] ''", "empty address"}},
      {"space in host", workers(R"(["my host:1"])"), {"'my host:1'", "host 'my host'"}},
      {"a URL, not host:port", workers(R"(["grpc://h:1"])"), {"'grpc://h:1'", "without a scheme"}},
      {"IPv6 without brackets", workers(R"(["::1:2222"])"), {"'::1:2222'", "brackets"}},
      {"IPv6 unclosed bracket", workers(R"(["[::1:2222"])"), {"'[::1:2222'", "unclosed"}},
      {"IPv6 without port", workers(R"(["[::1]"])"), {"'[::1]'", "missing the port"}},
      {"IPv6 empty brackets", workers(R"(["[]:1"])"), {"'[]:1'", "empty host"}},
      {"bad chief address",
       R"({"cluster": {"chief": ["c"], "worker": ["w:1"]}})",
       {"cluster.chief[0]", "'c'"}},
      {"bad evaluator address",
       R"({"cluster": {"worker": ["w:1"], "evaluator": ["e:x"]}})",
       {"cluster.evaluator[0]", "'e:x'"}},

      // Duplicates.
      {"duplicate workers",
       workers(R"(["a:1", "b:1", "a:1"])"),
       {"duplicate address 'a:1'", "cluster.worker[0]", "cluster.worker[2]"}},
      {"chief and worker share an address",
       R"({"cluster": {"chief": ["a:1"], "worker": ["a:1"]}, "task": {"type": "chief"}})",
       {"duplicate address 'a:1'", "cluster.chief[0]", "cluster.worker[0]"}},
      {"duplicate evaluator",
       R"({"cluster": {"worker": ["a:1"], "evaluator": ["a:1"]}})",
       {"duplicate address 'a:1'", "cluster.evaluator[0]"}},
      {"host names are case-insensitive",
       workers(R"(["Host:1", "host:1"])"),
       {"duplicate address 'host:1'", "cluster.worker[0]"}},
      {"ports compare as numbers",
       workers(R"(["h:2222", "h:02222"])"),
       {"duplicate address 'h:02222'"}},
      {"IPv6 duplicates", workers(R"(["[::1]:1", "[::1]:1"])"), {"duplicate address '[::1]:1'"}},
  };
  for (const Invalid& c : table) {
    SECTION(c.name) {
      INFO("TF_CONFIG = " << c.text);
      const std::string message = error_of(c.text);
      CHECK_THAT(message, StartsWith("TF_CONFIG: "));
      for (const std::string& part : c.contains) CHECK_THAT(message, Contains(part));
    }
  }
}

TEST_CASE("a long TF_CONFIG is quoted clipped", "[cluster]") {
  std::string list = "[";
  for (int i = 0; i < 200; ++i) list += "\"h" + std::to_string(i) + ":1\", ";
  list += "\"bad\"]";
  const std::string message = error_of(R"({"cluster": {"ps": )" + list + "}}");
  CHECK_THAT(message, Contains("..."));
  CHECK(message.size() < 600);
}

TEST_CASE("master is taken as the chief with a log line", "[cluster]") {
  LogCapture log;
  const ClusterSpec s = parse_tf_config(
      R"({"cluster": {"master": ["m:1"], "worker": ["w:2"]}, "task": {"type": "worker", "index": 0}})");
  CHECK(s.chief_address == "m:1");
  CHECK_THAT(log.text(), Contains("'master'"));
  CHECK_THAT(log.text(), Contains("m:1"));
  CHECK_THAT(log.text(), Contains("chief"));
}

TEST_CASE("chief and workers log nothing", "[cluster]") {
  LogCapture log;
  parse_tf_config(doc(kCluster, R"({"type": "worker", "index": 1})"));
  CHECK(log.text().empty());
}

TEST_CASE("host_of and port_of split host:port", "[cluster]") {
  CHECK(host_of("w0:2222") == "w0");
  CHECK(port_of("w0:2222") == 2222);
  CHECK(host_of("10.0.0.7:1") == "10.0.0.7");
  CHECK(port_of("10.0.0.7:65535") == 65535);
  CHECK(host_of("[::1]:2222") == "::1");
  CHECK(port_of("[::1]:2222") == 2222);
  CHECK(host_of("[fe80::1%eth0]:23") == "fe80::1%eth0");
  CHECK(host_of("worker-1.trainer.svc.cluster.local:2222") == "worker-1.trainer.svc.cluster.local");
  for (const char* bad : {"", "host", "host:", ":1", "h:0", "h:65536", "h:x", "::1:2", "[::1]"}) {
    INFO("address = '" << bad << "'");
    CHECK_THROWS_AS(host_of(bad), ConfigError);
    CHECK_THROWS_WITH(port_of(bad), Contains("'" + std::string(bad) + "'"));
  }
}

TEST_CASE("to_json reports the role and both addresses", "[cluster]") {
  const nlohmann::json j =
      to_json(parse_tf_config(doc(kCluster, R"({"type": "worker", "index": 1})")));
  CHECK(j["task_type"] == "worker");
  CHECK(j["task_index"] == 1);
  CHECK(j["rank"] == 2);
  CHECK(j["world_size"] == 3);
  CHECK(j["is_chief"] == false);
  CHECK(j["chief_address"] == "c:2222");
  CHECK(j["own_address"] == "w1:2222");

  const nlohmann::json local = to_json(ClusterSpec{});
  CHECK(local["is_chief"] == true);
  CHECK(local["world_size"] == 1);
  CHECK(local["chief_address"] == "");
  CHECK(local["own_address"] == "");
}

TEST_CASE("cluster_from_env reads TF_CONFIG", "[cluster]") {
  SECTION("unset: one local worker, its own chief") {
    ScopedEnv env("TF_CONFIG", std::nullopt);
    const ClusterSpec s = cluster_from_env();
    CHECK(s.task_type == "worker");
    CHECK(s.rank == 0);
    CHECK(s.world_size == 1);
    CHECK(s.is_chief());
    CHECK(s.own_address.empty());
    CHECK(s.worker_addresses.empty());
  }
  SECTION("empty: one local worker") {
    ScopedEnv env("TF_CONFIG", std::string());
    const ClusterSpec s = cluster_from_env();
    CHECK(s.world_size == 1);
    CHECK(s.is_chief());
  }
  SECTION("a cluster of three") {
    ScopedEnv env("TF_CONFIG", doc(kCluster, R"({"type": "worker", "index": "1"})"));
    const ClusterSpec s = cluster_from_env();
    CHECK(s.rank == 2);
    CHECK(s.world_size == 3);
    CHECK_FALSE(s.is_chief());
    CHECK(s.chief_address == "c:2222");
    CHECK(s.own_address == "w1:2222");
  }
  SECTION("malformed: ConfigError") {
    ScopedEnv env("TF_CONFIG", "{oops");
    CHECK_THROWS_AS(cluster_from_env(), ConfigError);
    CHECK_THROWS_WITH(cluster_from_env(), StartsWith("TF_CONFIG: ") && Contains("{oops"));
  }
}
