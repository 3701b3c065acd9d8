// torchrun-style environments (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) -> the ClusterSpec
// TF_CONFIG would give: the rank, the chief's address (one port up under torchrun's static
// rendezvous), and an error naming the variable for each bad input.
#include "common/catch.h"

#include <string>

#include "trainer/cluster/environment.h"
#include "trainer/cluster/torchrun.h"

using namespace trainer::cluster;
using trainer::test::Contains;

TEST_CASE("torchrun's variables give the rank and the chief's address", "[cluster][torchrun]") {
  Environment env = {{"RANK", "1"},
                     {"WORLD_SIZE", "3"},
                     {"MASTER_ADDR", "10.0.0.1"},
                     {"MASTER_PORT", "29500"},
                     {"LOCAL_RANK", "1"}};
  ClusterSpec spec = cluster_from("auto", env);
  CHECK(spec.rank == 1);
  CHECK(spec.world_size == 3);
  CHECK_FALSE(spec.is_chief());
  CHECK(spec.chief_address == "10.0.0.1:29500");
  CHECK(spec.own_address.empty());
  REQUIRE(spec.worker_addresses.size() == 3);
  CHECK(spec.worker_addresses[2] == "torchrun RANK 2");
  env["RANK"] = "0";
  CHECK(cluster_from("torchrun", env).own_address == "10.0.0.1:29500");
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";  // static rendezvous: the agent holds the port
  CHECK(cluster_from("torchrun", env).chief_address == "10.0.0.1:29501");
  env["MASTER_ADDR"] = "fd00::1";
  CHECK(cluster_from("torchrun", env).chief_address == "[fd00::1]:29501");

  CHECK_THROWS_WITH(cluster_from("torchrun", {{"RANK", "0"}, {"WORLD_SIZE", "2"}}),
                    Contains("torchrun: MASTER_ADDR is not set"));
  CHECK_THROWS_WITH(cluster_from("torchrun", {{"RANK", "2"}, {"WORLD_SIZE", "2"}}),
                    Contains("torchrun: RANK must be an integer in [0, 1], got '2'"));
  CHECK_THROWS_WITH(cluster_from("torchrun", {{"RANK", "0"}}),
                    Contains("torchrun: WORLD_SIZE is not set"));
  CHECK(cluster_from("torchrun", {{"RANK", "0"}, {"WORLD_SIZE", "1"}}).world_size == 1);
}
