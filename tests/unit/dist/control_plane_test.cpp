// The control plane without a mesh (DistOptions::mesh = false): the comparison through the store
// that verify_same_job uses, liveness naming a rank that went silent, the open-files check. Ranks
// are threads with their own real ProcessGroup and store connections.
#include "common/catch.h"

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "dist_test_util.h"
#include "trainer/dist/process_group.h"
#include "trainer/util/error.h"

using namespace trainer;
using namespace trainer::dist;
using namespace trainer::dist::testing;
using trainer::test::Contains;

namespace {

void no_mesh(DistOptions& o) { o.mesh = false; }

}  // namespace

TEST_CASE("first_differing: the lowest differing rank and both texts, the same on every rank",
          "[dist][control]") {
  struct Out {
    std::optional<Difference> all_same, some_differ;
    int64_t ops = 0;
  };
  const std::string job(3000, 'j');
  auto outs = run_ranks(
      4,
      [&](int r, ProcessGroup& g) {
        Out out;
        out.all_same = g.first_differing("same", job);
        const int64_t before = g.control_stats().store_operations;
        out.some_differ = g.first_differing("differ", r >= 2 ? "rank " + std::to_string(r) : job);
        out.ops = g.control_stats().store_operations - before;
        return out;
      },
      no_mesh);
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(!outs[r].all_same);
    REQUIRE(outs[r].some_differ);
    CHECK(outs[r].some_differ->rank == 2);
    CHECK(outs[r].some_differ->chief == job);
    CHECK(outs[r].some_differ->theirs == "rank 2");
    // O(1) requests per rank (plus polling while the others catch up), never one per rank.
    CHECK(outs[r].ops < 60);
  }
}

TEST_CASE("a group without a mesh refuses collectives, naming why", "[dist][control]") {
  auto errors = run_ranks(
      2,
      [](int, ProcessGroup& g) {
        std::string error = "no error";
        try {
          g.barrier();
        } catch (const Error& e) {
          error = e.what();
        }
        g.first_differing("end", "");  // every rank is through before the chief's store goes
        return error;
      },
      no_mesh);
  for (const auto& e : errors) CHECK_THAT(e, Contains("barrier") && Contains("no mesh"));
}

TEST_CASE("liveness: a rank that left the group on purpose is not called silent",
          "[dist][control]") {
  // Rank 2 is done and its group goes away (as a worker's does while the chief still exports);
  // ranks 0 and 1 go on waiting well past the 3 s after which a rank that stopped beating
  // without leaving is named (scripts/bench/control_plane.cpp and test_scale.cpp test that, with
  // processes killed and frozen).
  auto errors = run_ranks(
      3,
      [](int r, ProcessGroup& g) {
        if (r == 2) return std::string();
        const auto start = std::chrono::steady_clock::now();
        std::string error;
        try {
          g.wait_device("a step", [&] { return seconds_since(start) > 5; });
        } catch (const std::exception& e) {
          error = e.what();
        }
        return error;
      },
      [](DistOptions& o) {
        o.mesh = false;
        o.timeout_s = 60;
      });
  for (const auto& e : errors) CHECK(e.empty());
}

TEST_CASE("open files: the need grows with the world and a low hard limit is exit 2",
          "[dist][control]") {
  DistOptions o = loopback_options(0, 1024, 12345);
  const int64_t chief = open_files_needed(o);
  o.rank = 5;
  const int64_t worker = open_files_needed(o);
  CHECK(worker > 1023);          // a socket to every peer
  CHECK(chief > worker + 4096);  // and the store's side of every task's two connections
  o.mesh = false;
  CHECK(open_files_needed(o) < worker - 1000);
  o.mesh = true;
  CHECK_NOTHROW(check_open_files(o, worker));
  const std::string message = what_of<ConfigError>([&] { check_open_files(o, 1024); });
  CHECK_THAT(message, Contains("a job of 1024 training tasks needs about " +
                               std::to_string(worker) + " open files") &&
                          Contains("at most 1024") &&
                          Contains("ulimit -n " + std::to_string(worker)) &&
                          Contains("--ulimit nofile="));
  o.world_size = 1;
  o.rank = 0;
  CHECK_NOTHROW(check_open_files(o, 16));
}
