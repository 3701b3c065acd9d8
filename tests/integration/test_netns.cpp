// A real network between hosts: one Linux network namespace per task, joined by veth pairs to a
// bridge in a namespace of its own, with addresses of a private test subnet that exist only
// inside those namespaces. A chief and two workers train over it as over separate machines;
// a worker's link is taken down mid-step; a worker starts 20 s late; a worker names a chief
// address where nothing answers. Root only (it skips with a message elsewhere); every namespace
// (and with it every link) is removed afterwards, even when a check fails.
#include "common/catch.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <thread>

#include "fixtures.h"
#include "harness.h"

using namespace trainer::testing;
using trainer::test::Contains;

namespace {

// Namespaces named trn<pid>x<n>s (the switch) and trn<pid>x<n>h<i> (host i), subnet
// 10.<200 + n % 50>.<pid % 250>.0/24, host i at .(i + 1).
class Network {
 public:
  explicit Network(int hosts) {
    static int made = 0;
    const int n = made++;
    prefix_ = "trn" + std::to_string(::getpid()) + "x" + std::to_string(n);
    subnet_ = "10." + std::to_string(200 + n % 50) + "." + std::to_string(::getpid() % 250) + ".";
    run("ip netns add " + sw());
    run("ip -n " + sw() + " link add br0 type bridge");
    run("ip -n " + sw() + " link set br0 up");
    for (int i = 0; i < hosts; ++i) {
      const std::string h = host(i);
      const std::string port = "p" + std::to_string(i);
      run("ip netns add " + h);
      run("ip link add " + port + "tmp netns " + sw() + " type veth peer name eth0 netns " + h);
      run("ip -n " + sw() + " link set " + port + "tmp name " + port);
      run("ip -n " + sw() + " link set " + port + " master br0");
      run("ip -n " + sw() + " link set " + port + " up");
      run("ip -n " + h + " addr add " + ip(i) + "/24 dev eth0");
      run("ip -n " + h + " link set eth0 up");
      run("ip -n " + h + " link set lo up");
    }
    hosts_ = hosts;
  }
  ~Network() { remove(); }

  std::string sw() const { return prefix_ + "s"; }
  std::string host(int i) const { return prefix_ + "h" + std::to_string(i); }
  std::string ip(int i) const { return subnet_ + std::to_string(i + 1); }
  std::string exec(int i) const { return "ip netns exec " + host(i); }
  // Takes host i's link down at the switch (a pulled cable: no reset, nothing arrives).
  void cut(int i) const { run("ip -n " + sw() + " link set p" + std::to_string(i) + " down"); }

  // Whether this machine lets the test make namespaces (root with CAP_SYS_ADMIN, iproute2).
  static std::string unavailable() {
    if (::geteuid() != 0) return "not root";
    const std::string probe = "trnprobe" + std::to_string(::getpid());
    if (sh("ip netns add " + probe) != 0) return "'ip netns add' fails here (no CAP_SYS_ADMIN?)";
    sh("ip netns delete " + probe);
    return "";
  }

 private:
  void run(const std::string& cmd) const {
    if (sh(cmd) != 0) throw std::runtime_error("netns set-up failed: " + cmd);
  }
  void remove() {
    // Deleting a namespace deletes its interfaces, and a veth end takes its peer with it.
    for (int i = 0; i < 16; ++i) sh("ip netns delete " + host(i));
    sh("ip netns delete " + sw());
  }

  std::string prefix_;
  std::string subnet_;
  int hosts_ = 0;
};

#define REQUIRE_NETNS()                                               \
  do {                                                                \
    const std::string why = Network::unavailable();                   \
    if (!why.empty()) {                                               \
      WARN("skipped: network namespaces are not available: " << why); \
      return;                                                         \
    }                                                                 \
  } while (0)

constexpr int kPort = 2222;  // every task's port: each host is a namespace of its own

// TF_CONFIG for a chief (host 0) and `workers` workers (hosts 1..) at their namespace addresses;
// `chief_host` replaces the chief's address when given.
std::string cluster_config(const Network& net, int workers, const std::string& type, int index,
                           const std::string& chief_host = "") {
  const auto at = [](const std::string& host) {
    return "\"" + host + ":" + std::to_string(kPort) + "\"";
  };
  std::string cluster =
      "{\"chief\": [" + at(chief_host.empty() ? net.ip(0) : chief_host) + "], \"worker\": [";
  for (int i = 0; i < workers; ++i) cluster += (i ? ", " : "") + at(net.ip(i + 1));
  cluster += "]}";
  return "TF_CONFIG={\"cluster\": " + cluster + ", \"task\": {\"type\": \"" + type +
         "\", \"index\": " + std::to_string(index) + "}}";
}

const char* const kEquivalence =
    "--config job.yaml --set data.shard_policy=data --set data.shuffle=false "
    "--set data.validation.path= --set train.max_steps=4 --set train.per_replica_batch_size=4 "
    "--set distributed.rendezvous_timeout_s=60 --set distributed.timeout_s=60";

}  // namespace

TEST_CASE(
    "netns: a chief and 2 workers on separate hosts train to the same weights as over "
    "loopback",
    "[netns][multiworker]") {
  REQUIRE_NETNS();
  TempDir dir("netns_equiv");
  make_dataset(dir.path(), "data", 8, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const std::string args = std::string(kEquivalence);

  const int port = free_port();
  {
    Background c(dir.path(), args + " --job-dir loop", {tf_config(2, true, port, "chief", 0)},
                 "l0");
    Background w0(dir.path(), args + " --job-dir loop", {tf_config(2, true, port, "worker", 0)},
                  "l1");
    Background w1(dir.path(), args + " --job-dir loop", {tf_config(2, true, port, "worker", 1)},
                  "l2");
    for (Background* p : {&c, &w0, &w1}) {
      const Result r = p->wait();
      INFO(r.err);
      REQUIRE(r.code == 0);
    }
  }
  Network net(3);
  {
    Background c(dir.path(), args + " --job-dir net", {cluster_config(net, 2, "chief", 0)}, "n0",
                 net.exec(0));
    Background w0(dir.path(), args + " --job-dir net", {cluster_config(net, 2, "worker", 0)}, "n1",
                  net.exec(1));
    Background w1(dir.path(), args + " --job-dir net", {cluster_config(net, 2, "worker", 1)}, "n2",
                  net.exec(2));
    for (Background* p : {&c, &w0, &w1}) {
      const Result r = p->wait();
      INFO(r.err);
      REQUIRE(r.code == 0);
    }
  }
  const auto a = read_f32(dir / "loop" / "model" / "model.safetensors");
  const auto b = read_f32(dir / "net" / "model" / "model.safetensors");
  REQUIRE(!a.empty());
  CHECK(largest_relative_difference(a, b) == 0.0);
}

TEST_CASE(
    "netns: a worker's link taken down mid-step makes every other process exit 4 "
    "naming it",
    "[netns][multiworker][failures]") {
  REQUIRE_NETNS();
  TempDir dir("netns_cut");
  make_dataset(dir.path(), "data", 20, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(50));
  constexpr double kTimeout = 10;
  const std::string args =
      "--config job.yaml --job-dir job --set data.validation.path= "
      "--set distributed.rendezvous_timeout_s=60 --set distributed.timeout_s=10";
  Network net(3);
  Background c(dir.path(), args, {cluster_config(net, 2, "chief", 0)}, "c", net.exec(0));
  Background w0(dir.path(), args, {cluster_config(net, 2, "worker", 0)}, "w0", net.exec(1));
  Background w1(dir.path(), args, {cluster_config(net, 2, "worker", 1)}, "w1", net.exec(2));
  for (int i = 0; i < 1200 && !fs::exists(dir / "job" / "metrics.jsonl"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE(fs::exists(dir / "job" / "metrics.jsonl"));
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  net.cut(2);  // worker 1
  const auto cut = Clock::now();
  // Each exit time on its own: poll both until they are gone.
  double chief_s = -1;
  double worker0_s = -1;
  while ((chief_s < 0 || worker0_s < 0) && seconds_since(cut) < 120) {
    siginfo_t info{};
    if (chief_s < 0 && ::waitid(P_PID, c.pid(), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == c.pid()) {
      chief_s = seconds_since(cut);
    }
    info = siginfo_t{};
    if (worker0_s < 0 && ::waitid(P_PID, w0.pid(), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == w0.pid()) {
      worker0_s = seconds_since(cut);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const Result chief = c.wait();
  const Result worker0 = w0.wait();
  std::printf(
      "netns link cut: chief exited %d after %.1f s, worker 0 exited %d after %.1f s "
      "(distributed.timeout_s = %.0f)\n",
      chief.code, chief_s, worker0.code, worker0_s, kTimeout);
  INFO("chief: " << chief.err);
  INFO("worker 0: " << worker0.err);
  CHECK(chief.code == 4);
  CHECK(worker0.code == 4);
  CHECK(chief_s < kTimeout + 10);
  CHECK(worker0_s < kTimeout + 10);
  CHECK_THAT(chief.err, Contains("worker 1 (" + net.ip(2)));
  CHECK_THAT(worker0.err, Contains("worker 1 (" + net.ip(2)));
  // The cut-off worker cannot reach anyone: it stops too (its own timeout), or is killed here.
  for (int i = 0; i < 600 && ::kill(w1.pid(), 0) == 0; ++i) {
    int status = 0;
    if (::waitpid(w1.pid(), &status, WNOHANG) == w1.pid()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

TEST_CASE("netns: a worker started 20 s late still joins within rendezvous_timeout_s",
          "[netns][multiworker]") {
  REQUIRE_NETNS();
  TempDir dir("netns_late");
  make_dataset(dir.path(), "data", 12, 32);  // 60 images: 20 per worker, 2 steps of 10
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const std::string args =
      "--config job.yaml --job-dir job --set data.validation.path= --set train.max_steps=2 "
      "--set distributed.rendezvous_timeout_s=60 --set distributed.timeout_s=60";
  Network net(3);
  Background c(dir.path(), args, {cluster_config(net, 2, "chief", 0)}, "c", net.exec(0));
  Background w0(dir.path(), args, {cluster_config(net, 2, "worker", 0)}, "w0", net.exec(1));
  std::this_thread::sleep_for(std::chrono::seconds(20));
  Background w1(dir.path(), args, {cluster_config(net, 2, "worker", 1)}, "w1", net.exec(2));
  for (Background* p : {&c, &w0, &w1}) {
    const Result r = p->wait();
    INFO(r.err);
    CHECK(r.code == 0);
  }
  CHECK(fs::exists(dir / "job" / "model" / "model.safetensors"));
}

TEST_CASE("netns: a worker whose TF_CONFIG names a wrong chief address exits 4 naming it",
          "[netns][multiworker]") {
  REQUIRE_NETNS();
  TempDir dir("netns_wrong_chief");
  make_dataset(dir.path(), "data", 4, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  Network net(3);
  // .99 is on the subnet, but no host has it: connections get no answer at all.
  const std::string wrong = net.ip(98);
  const auto start = Clock::now();
  Background w(dir.path(),
               "--config job.yaml --job-dir job --set distributed.rendezvous_timeout_s=8",
               {cluster_config(net, 2, "worker", 0, wrong)}, "w", net.exec(1));
  const Result r = w.wait();
  const double waited = seconds_since(start);
  std::printf("netns wrong chief address: exit %d after %.1f s (rendezvous_timeout_s = 8)\n",
              r.code, waited);
  INFO(r.err);
  CHECK(r.code == 4);
  CHECK_THAT(r.err, Contains(wrong + ":" + std::to_string(kPort)));
  CHECK(waited < 8 + 15);
}
