// ProcessGroup over real Gloo on loopback, ranks as threads: the collectives for world sizes
// 1, 2, 3; option validation; and the ways a run fails instead of hanging: no chief, missing
// workers, mismatched world sizes, a peer that never joins a collective, a peer that is gone.
#include "common/catch.h"

#include <sys/wait.h>

#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "dist_test_util.h"
#include "trainer/dist/process_group.h"
#include "trainer/util/error.h"
#include "trainer/util/signals.h"

using trainer::ConfigError;
using trainer::DistributedError;
using trainer::Interrupted;
using trainer::dist::DistOptions;
using trainer::dist::ProcessGroup;
using trainer::dist::Reduce;
using trainer::dist::testing::free_port;
using trainer::dist::testing::loopback_options;
using trainer::dist::testing::run_ranks;
using trainer::dist::testing::seconds_since;
using trainer::dist::testing::what_of;
using trainer::test::Contains;

namespace {

// A one-shot latch for ranks that must wait for each other outside the process group.
struct Latch {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  void release() {
    std::lock_guard<std::mutex> lock(m);
    open = true;
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return open; });
  }
};

// Runs this test binary on the hidden test case `tag` in a fresh process (for process-wide state
// such as the stop flag); returns its exit status and output.
std::pair<int, std::string> run_hidden_case(const std::string& tag) {
  const auto exe = std::filesystem::read_symlink("/proc/self/exe");
  const auto log = std::filesystem::temp_directory_path() /
                   ("unit_dist_" + std::to_string(::getpid()) + "_child.log");
  const std::string command = "'" + exe.string() + "' '" + tag + "' > '" + log.string() + "' 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove(log);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text.str()};
}

}  // namespace

TEST_CASE("world size 1: every collective is a local no-op", "[dist]") {
  DistOptions o;  // no chief address needed: no store, no sockets
  auto group = ProcessGroup::connect(o);
  CHECK(group->rank() == 0);
  CHECK(group->world_size() == 1);
  CHECK(group->backend() == "local");
  auto t = torch::arange(6, torch::kFloat);
  group->all_reduce_sum({t});
  group->broadcast({t});
  auto work = group->all_reduce_sum_async(t);
  work.wait();
  CHECK(torch::equal(t, torch::arange(6, torch::kFloat)));
  CHECK(group->all_reduce_min(5) == 5);
  CHECK(group->all_reduce(std::vector<int64_t>{1, 2}, Reduce::kSum) == std::vector<int64_t>{1, 2});
  CHECK(group->all_gather_strings("solo") == std::vector<std::string>{"solo"});
  group->barrier();
}

TEST_CASE("collectives over 2 and 3 ranks give the exact results", "[dist]") {
  const int world = GENERATE(2, 3);
  CAPTURE(world);
  struct Out {
    std::vector<torch::Tensor> summed, broadcast;
    torch::Tensor async_sum;
    std::vector<std::string> gathered;
    int64_t min = 0, max = 0;
    std::vector<int64_t> sums;
    std::string backend;
    bool big_ok = false;
  };
  auto outs = run_ranks(world, [world](int r, ProcessGroup& g) {
    Out out;
    out.backend = g.backend();
    const double k = r + 1;
    // Several dtypes and layouts in one call: each dtype travels as its own flat buffer.
    std::vector<torch::Tensor> ts = {
        torch::arange(12, torch::kFloat).view({3, 4}) * k,
        torch::full({5}, static_cast<int64_t>(10 * k), torch::kLong),
        torch::full({2}, k, torch::kBFloat16),
        (torch::arange(120, torch::kFloat).view({2, 3, 4, 5}) * k)
            .contiguous(torch::MemoryFormat::ChannelsLast),
        torch::tensor(0.5 * k, torch::kDouble),
        torch::ones({2, 2}).t() * k,  // non-contiguous
    };
    g.all_reduce_sum(ts);
    out.summed = ts;
    // More than one 64 MB flat buffer: a packed 4 MB one (a non-contiguous tensor), then a
    // 64 MB tensor reduced in place. Two ranks only, to keep the memory small.
    out.big_ok = true;
    if (world == 2) {
      std::vector<torch::Tensor> big = {torch::full({1024, 1024}, k).t(),
                                        torch::full({16 << 20}, k)};
      g.all_reduce_sum(big);
      out.big_ok = torch::equal(big[0], torch::full({1024, 1024}, 3.0)) &&
                   torch::equal(big[1], torch::full({16 << 20}, 3.0));
    }

    std::vector<torch::Tensor> bs = {torch::full({3}, k), torch::full({4}, static_cast<int64_t>(r)),
                                     torch::full({2, 2}, k, torch::kBFloat16)};
    g.broadcast(bs, world - 1);
    out.broadcast = bs;

    auto flat = torch::full({1000}, k);
    auto work = g.all_reduce_sum_async(flat);
    work.wait();
    work.wait();  // a second wait is a no-op
    out.async_sum = flat;

    std::string mine = r == 1 ? std::string("") : std::string("rank\0", 5) + std::to_string(r);
    out.gathered = g.all_gather_strings(mine);
    out.min = g.all_reduce_min(100 - r);
    out.max = g.all_reduce_max(100 - r);
    out.sums = g.all_reduce(std::vector<int64_t>{r, 1, -2 * r}, Reduce::kSum);
    g.barrier();
    return out;
  });

  const double total = world * (world + 1) / 2.0;  // sum of k = r + 1
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    const Out& o = outs[r];
    CHECK(o.backend == "gloo");
    CHECK(o.big_ok);
    CHECK(torch::equal(o.summed[0], torch::arange(12, torch::kFloat).view({3, 4}) * total));
    CHECK(torch::equal(o.summed[1], torch::full({5}, static_cast<int64_t>(10 * total))));
    CHECK(o.summed[2].scalar_type() == torch::kBFloat16);
    CHECK(torch::equal(o.summed[2], torch::full({2}, total, torch::kBFloat16)));
    CHECK(o.summed[3].is_contiguous(torch::MemoryFormat::ChannelsLast));
    CHECK(torch::equal(o.summed[3], torch::arange(120, torch::kFloat).view({2, 3, 4, 5}) * total));
    CHECK(o.summed[4].item<double>() == 0.5 * total);
    CHECK(torch::equal(o.summed[5], torch::ones({2, 2}) * total));

    CHECK(torch::equal(o.broadcast[0], torch::full({3}, static_cast<double>(world))));
    CHECK(torch::equal(o.broadcast[1], torch::full({4}, static_cast<int64_t>(world - 1))));
    CHECK(torch::equal(o.broadcast[2], torch::full({2, 2}, world, torch::kBFloat16)));
    CHECK(torch::equal(o.async_sum, torch::full({1000}, total)));

    REQUIRE(o.gathered.size() == static_cast<size_t>(world));
    for (int q = 0; q < world; ++q) {
      const std::string expected =
          q == 1 ? std::string("") : std::string("rank\0", 5) + std::to_string(q);
      CHECK(o.gathered[q] == expected);
    }
    CHECK(o.min == 100 - (world - 1));
    CHECK(o.max == 100);
    const int64_t rank_sum = world * (world - 1) / 2;
    CHECK(o.sums == std::vector<int64_t>{rank_sum, world, -2 * rank_sum});
  }
}

TEST_CASE("options are validated before any connection", "[dist]") {
  DistOptions o = loopback_options(0, 2, 12345);
  SECTION("nccl needs a CUDA build and CUDA training") {
    o.backend = "nccl";
    o.use_cuda = true;
#ifndef TRAINER_WITH_CUDA
    CHECK_THAT(what_of<ConfigError>([&] { ProcessGroup::connect(o); }), Contains("no CUDA"));
#endif
    o.use_cuda = false;
    CHECK_THAT(what_of<ConfigError>([&] { ProcessGroup::connect(o); }),
               Contains("distributed.backend"));
  }
  SECTION("an unknown backend") {
    o.backend = "mpi";
    CHECK_THAT(what_of<ConfigError>([&] { ProcessGroup::connect(o); }),
               Contains("expected one of auto|gloo|nccl, got 'mpi'"));
  }
  SECTION("a rank outside the world") {
    o.rank = 2;
    CHECK_THAT(what_of<ConfigError>([&] { ProcessGroup::connect(o); }), Contains("rank 2"));
  }
  SECTION("a bad chief port") {
    o.chief_port = 0;
    CHECK_THAT(what_of<ConfigError>([&] { ProcessGroup::connect(o); }), Contains("port"));
  }
  SECTION("a non-positive timeout") {
    o.timeout_s = 0;
    CHECK_THAT(what_of<ConfigError>([&] { ProcessGroup::connect(o); }),
               Contains("distributed.timeout_s"));
  }
  SECTION("auto on the CPU is gloo") {
    o.backend = "auto";
    o.world_size = 1;
    CHECK(ProcessGroup::connect(o)->backend() == "local");
  }
}

TEST_CASE("a worker whose chief never comes fails after the rendezvous timeout", "[dist]") {
  const int port = free_port();
  DistOptions o = loopback_options(1, 2, port);
  o.rendezvous_timeout_s = 2;
  const auto start = std::chrono::steady_clock::now();
  CHECK_THAT(what_of<DistributedError>([&] { ProcessGroup::connect(o); }),
             Contains("could not reach the chief at 127.0.0.1:" + std::to_string(port)) &&
                 Contains("distributed.rendezvous_timeout_s = 2 s"));
  const double waited = seconds_since(start);
  CHECK(waited > 1.5);
  CHECK(waited < 8);
}

TEST_CASE("a chief whose workers never come names the missing ranks", "[dist]") {
  DistOptions o = loopback_options(0, 3, free_port());
  o.rendezvous_timeout_s = 2;
  const auto start = std::chrono::steady_clock::now();
  CHECK_THAT(what_of<DistributedError>([&] { ProcessGroup::connect(o); }),
             Contains("only 1 of 3 tasks joined; missing ranks: 1, 2"));
  CHECK(seconds_since(start) < 8);
}

TEST_CASE("world-size mismatch: the worker gets a ConfigError, the chief a timeout", "[dist]") {
  const int port = free_port();
  std::string chief_error, worker_error;
  bool worker_config = false;
  std::thread chief([&] {
    DistOptions o = loopback_options(0, 2, port);
    o.rendezvous_timeout_s = 2;
    try {
      ProcessGroup::connect(o);
    } catch (const DistributedError& e) {
      chief_error = e.what();
    }
  });
  std::thread worker([&] {
    DistOptions o = loopback_options(1, 3, port);
    o.rendezvous_timeout_s = 2;
    try {
      ProcessGroup::connect(o);
    } catch (const ConfigError& e) {
      worker_config = true;
      worker_error = e.what();
    } catch (const std::exception& e) {
      worker_error = e.what();
    }
  });
  chief.join();
  worker.join();
  CHECK(worker_config);
  CHECK_THAT(worker_error, Contains("world of 3") && Contains("counts 2"));
  CHECK_THAT(chief_error, Contains("missing ranks: 1"));
}

TEST_CASE("a collective that a peer never joins times out instead of hanging", "[dist]") {
  Latch rank0_done;
  struct Out {
    std::string error, second_error;
    double waited = 0;
  };
  auto outs = run_ranks(
      2,
      [&](int r, ProcessGroup& g) {
        Out out;
        if (r == 1) {  // alive, connected, but never calls the collective
          rank0_done.wait();
          return out;
        }
        const auto start = std::chrono::steady_clock::now();
        try {
          g.all_reduce_sum({torch::ones({1000})});
        } catch (const DistributedError& e) {
          out.error = e.what();
        }
        out.waited = seconds_since(start);
        try {
          g.barrier();
        } catch (const DistributedError& e) {
          out.second_error = e.what();
        }
        rank0_done.release();
        return out;
      },
      [](DistOptions& o) { o.timeout_s = 3; });
  INFO(outs[0].error);
  CHECK_THAT(outs[0].error, Contains("all_reduce_sum on rank 0 of 2 (gloo)") &&
                                Contains("distributed.timeout_s = 3 s"));
  CHECK(outs[0].waited > 2.5);
  CHECK(outs[0].waited < 10);
  CHECK_THAT(outs[0].second_error, Contains("barrier") && Contains("already failed"));
}

TEST_CASE("a collective with a peer that is gone fails with DistributedError", "[dist]") {
  Latch rank1_gone;
  struct Out {
    std::string error;
    double waited = 0;
  };
  const int port = free_port();
  Out out0;
  std::thread rank0([&] {
    auto g = ProcessGroup::connect([&] {
      auto o = loopback_options(0, 2, port);
      o.timeout_s = 5;
      return o;
    }());
    rank1_gone.wait();
    const auto start = std::chrono::steady_clock::now();
    try {
      g->all_reduce_sum({torch::ones({1000})});
    } catch (const DistributedError& e) {
      out0.error = e.what();
    }
    out0.waited = seconds_since(start);
  });
  std::thread rank1([&] {
    {
      auto o = loopback_options(1, 2, port);
      o.timeout_s = 5;
      auto g = ProcessGroup::connect(o);
    }  // its sockets close here, as when the process dies
    rank1_gone.release();
  });
  rank0.join();
  rank1.join();
  INFO(out0.error);
  CHECK_THAT(out0.error, Contains("all_reduce_sum on rank 0 of 2 (gloo)") &&
                             Contains("lost the connection to a peer"));
  CHECK(out0.waited < 8);
}

TEST_CASE("wait_device: device work that never completes fails at distributed.timeout_s",
          "[dist]") {
  Latch rank0_done;
  struct Out {
    std::string error;
    double waited = 0;
    bool ready_seen = false;
  };
  auto outs = run_ranks(
      2,
      [&](int r, ProcessGroup& g) {
        Out out;
        if (r == 1) {
          rank0_done.wait();
          return out;
        }
        // Work that is done returns at once.
        g.wait_device("a finished step", [] { return true; });
        int asked = 0;
        g.wait_device("a step done soon", [&] { return ++asked > 3; });
        out.ready_seen = asked > 3;
        const auto start = std::chrono::steady_clock::now();
        out.error = what_of<DistributedError>(
            [&] { g.wait_device("reading the step metrics", [] { return false; }); });
        out.waited = seconds_since(start);
        rank0_done.release();
        return out;
      },
      [](DistOptions& o) { o.timeout_s = 2; });
  INFO(outs[0].error);
  CHECK(outs[0].ready_seen);
  CHECK_THAT(outs[0].error, Contains("reading the step metrics on rank 0 of 2 (gloo)") &&
                                Contains("distributed.timeout_s = 2 s"));
  CHECK(outs[0].waited >= 2);
  CHECK(outs[0].waited < 4);
}

TEST_CASE("wait_device: a peer's published failure ends the wait within about a second", "[dist]") {
  Latch waiting;
  struct Out {
    std::string error;
    double waited = 0;
  };
  auto outs = run_ranks(
      2,
      [&](int r, ProcessGroup& g) {
        Out out;
        if (r == 1) {
          waiting.wait();
          g.leave_after_failure(
              trainer::dist::FailureReport{"worker 1", trainer::ErrorKind::kData, "bad image"}, 0);
          return out;
        }
        const auto start = std::chrono::steady_clock::now();
        waiting.release();
        out.error = what_of<trainer::PeerFailed>(
            [&] { g.wait_device("reading the step metrics", [] { return false; }); });
        out.waited = seconds_since(start);
        return out;
      },
      [](DistOptions& o) { o.timeout_s = 30; });
  INFO(outs[0].error);
  CHECK_THAT(outs[0].error, Contains("worker 1 failed") && Contains("bad image"));
  CHECK(outs[0].waited < 4);
}

TEST_CASE("one process: no group unless NCCL is named, which needs an address", "[dist]") {
  DistOptions o;
  auto local = ProcessGroup::connect(o);
  CHECK_FALSE(local->communicates());
  local->wait_device("alone", [] { return true; });
  o.backend = "nccl";
  // A CPU-only build refuses NCCL outright; a CUDA build on a CPU job too; both before any socket.
  CHECK_THROWS_AS(ProcessGroup::connect(o), ConfigError);
}

TEST_CASE("a stop signal ends a collective the peers left, and a rendezvous", "[dist]") {
  const auto start = std::chrono::steady_clock::now();
  const auto [code, output] = run_hidden_case("[.sigterm]");
  INFO(output);
  CHECK(code == 0);
  CHECK_THAT(output, Contains("All tests passed") && Contains("in 1 test case"));
  CHECK(seconds_since(start) < 30);
}

// Run by the test above in its own process: the stop flag, once set, stays set.
TEST_CASE("stop signals (in a process of their own)", "[.sigterm]") {
  trainer::util::install_stop_handlers();
  Latch rank0_done;
  struct Out {
    std::string error, device_error;
    double waited = 0, device_waited = 0;
  };
  auto outs = run_ranks(2, [&](int r, ProcessGroup& g) {
    Out out;
    if (r == 1) {  // connected, but never joins the barrier (as if it had already stopped)
      rank0_done.wait();
      return out;
    }
    std::thread signaller([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      std::raise(SIGTERM);
    });
    auto start = std::chrono::steady_clock::now();
    out.error = what_of<Interrupted>([&] { g.barrier(); });
    out.waited = seconds_since(start);
    // The one polling wait serves device work as it serves Gloo's: abandoned 5 s after the
    // signal (seen anew by this wait).
    start = std::chrono::steady_clock::now();
    out.device_error = what_of<Interrupted>([&] { g.wait_device("a step", [] { return false; }); });
    out.device_waited = seconds_since(start);
    signaller.join();
    rank0_done.release();
    return out;
  });
  CHECK_THAT(outs[0].device_error,
             Contains("stopped by signal 15") && Contains("a step on rank 0"));
  CHECK(outs[0].device_waited > 4);
  CHECK(outs[0].device_waited < 9);
  CHECK_THAT(outs[0].error, Contains("stopped by signal 15") && Contains("barrier on rank 0"));
  CHECK(outs[0].waited > 4);
  CHECK(outs[0].waited < 9);

  // With the flag set, a worker waiting for its chief stops at once instead of after 60 s.
  DistOptions o = loopback_options(1, 2, free_port());
  o.rendezvous_timeout_s = 60;
  const auto start = std::chrono::steady_clock::now();
  CHECK_THAT(what_of<Interrupted>([&] { ProcessGroup::connect(o); }),
             Contains("while waiting for the chief"));
  CHECK(seconds_since(start) < 2);
}
