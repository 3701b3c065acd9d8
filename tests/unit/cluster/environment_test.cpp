// The source distributed.cluster picks: the `auto` order (TF_CONFIG first, then torchrun's
// variables, else one process; SLURM's only when asked for), each source on its own, and an
// unknown source refused.
#include "common/catch.h"

#include <string>

#include "trainer/cluster/environment.h"

using namespace trainer::cluster;
using trainer::test::Contains;

TEST_CASE("auto: TF_CONFIG first, then torchrun's variables, else one process", "[cluster]") {
  const std::string tf =
      R"({"cluster": {"worker": ["h1:2222", "h2:2222"]}, "task": {"type": "worker", "index": 1}})";
  Environment env = {{"RANK", "0"},
                     {"WORLD_SIZE", "4"},
                     {"MASTER_ADDR", "m"},
                     {"MASTER_PORT", "1234"},
                     {"TF_CONFIG", tf}};
  CHECK(cluster_from("auto", env).chief_address == "h1:2222");
  CHECK(cluster_from("torchrun", env).world_size == 4);
  CHECK(cluster_from("tf_config", env).world_size == 2);
  env.erase("TF_CONFIG");
  CHECK(cluster_from("auto", env).world_size == 4);
  CHECK(cluster_from("tf_config", env).world_size == 1);
  CHECK(cluster_from("auto", {{"SLURM_PROCID", "0"}}).world_size == 1);  // slurm only when asked
  CHECK_THROWS_WITH(cluster_from("mpi", {}), Contains("distributed.cluster: expected one of"));
}
