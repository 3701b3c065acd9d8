// configs/cluster/: each template parses, names the same image, trainer arguments and port as
// the README and the Dockerfile, and gives a cluster the trainer accepts. The SLURM script runs
// for real under a stand-in `srun` that starts its tasks with the variables srun sets.
#include <catch2/catch.hpp>

#include <yaml-cpp/yaml.h>

#include "fixtures.h"
#include "harness.h"
#include "trainer/cluster/cluster_spec.h"
#include "trainer/config/job_spec.h"

using namespace trainer::testing;
using Catch::Matchers::Contains;

namespace {

const fs::path kDir = fs::path(TRAINER_SOURCE_DIR) / "configs" / "cluster";
const char* const kImage = "gcr.io/PROJECT/trainer";  // `docker build -t trainer .`, pushed

std::vector<std::string> strings(const YAML::Node& list) {
  std::vector<std::string> out;
  for (const auto& n : list) out.push_back(n.as<std::string>());
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + " ";
  return s;
}

// The trainer arguments every template runs: the tutorial's job for 5 epochs into `job_dir`,
// with a config the image has (the Dockerfile copies configs/ to /opt/trainer/configs).
void check_args(const std::vector<std::string>& args, const std::string& job_dir) {
  INFO(join(args));
  REQUIRE(args.size() == 6);
  CHECK(args[0] == "--config");
  CHECK(args[1] == "/opt/trainer/configs/cassava_resnet50.yaml");
  CHECK(args[2] == "--epochs");
  CHECK(args[3] == "5");
  CHECK(args[4] == "--job-dir");
  CHECK(args[5] == job_dir);
  const fs::path config = fs::path(TRAINER_SOURCE_DIR) / "configs" / fs::path(args[1]).filename();
  CHECK_NOTHROW(trainer::config::load_job_spec(config.string(), {}));
}

}  // namespace

TEST_CASE("the image, its working dir and its configs are what the templates assume",
          "[templates]") {
  const std::string dockerfile = slurp(fs::path(TRAINER_SOURCE_DIR) / "Dockerfile");
  CHECK_THAT(dockerfile, Contains("COPY configs /opt/trainer/configs") &&
                             Contains("WORKDIR /work") && Contains("ENTRYPOINT [\"trainer\"]"));
  const std::string readme = slurp(fs::path(TRAINER_SOURCE_DIR) / "README.md");
  CHECK_THAT(readme, Contains("docker build -t trainer .") && Contains(kImage) &&
                         Contains("configs/cluster/"));
}

TEST_CASE("ai-platform.yaml is the tutorial's config.yaml shape", "[templates]") {
  const YAML::Node in = YAML::LoadFile((kDir / "ai-platform.yaml").string())["trainingInput"];
  CHECK(in["scaleTier"].as<std::string>() == "CUSTOM");
  CHECK(in["workerCount"].as<int>() == 1);
  for (const char* role : {"masterConfig", "workerConfig"}) {
    INFO(role);
    CHECK(in[role]["imageUri"].as<std::string>() == kImage);
    CHECK(in[role]["acceleratorConfig"]["type"].as<std::string>() == "NVIDIA_TESLA_T4");
    CHECK(in[role]["acceleratorConfig"]["count"].as<int>() == 1);
  }
  check_args(strings(in["args"]), "gs://BUCKET/cassava/run-1");
}

TEST_CASE("vertex-ai.yaml has a chief pool and a worker pool of the same image", "[templates]") {
  const YAML::Node pools = YAML::LoadFile((kDir / "vertex-ai.yaml").string())["workerPoolSpecs"];
  REQUIRE(pools.size() == 2);
  for (const auto& pool : pools) {
    CHECK(pool["replicaCount"].as<int>() == 1);
    CHECK(pool["machineSpec"]["acceleratorType"].as<std::string>() == "NVIDIA_TESLA_T4");
    CHECK(pool["containerSpec"]["imageUri"].as<std::string>() == kImage);
    check_args(strings(pool["containerSpec"]["args"]), "gs://BUCKET/cassava/run-1");
  }
}

TEST_CASE("tfjob.yaml: a chief and two workers on port 2222 sharing the job-dir volume",
          "[templates]") {
  const YAML::Node job = YAML::LoadFile((kDir / "tfjob.yaml").string());
  CHECK(job["kind"].as<std::string>() == "TFJob");
  const YAML::Node specs = job["spec"]["tfReplicaSpecs"];
  CHECK(specs["Chief"]["replicas"].as<int>() == 1);
  CHECK(specs["Worker"]["replicas"].as<int>() == 2);
  for (const char* role : {"Chief", "Worker"}) {
    INFO(role);
    const YAML::Node pod = specs[role]["template"]["spec"];
    const YAML::Node c = pod["containers"][0];
    CHECK(c["name"].as<std::string>() == "tensorflow");
    CHECK(c["image"].as<std::string>() == kImage);
    CHECK(c["ports"][0]["containerPort"].as<int>() == 2222);
    check_args(strings(c["args"]), "/work/jobs/cassava-run-1");
    CHECK(c["volumeMounts"][0]["mountPath"].as<std::string>() == "/work/jobs");
    CHECK(pod["volumes"][0]["persistentVolumeClaim"]["claimName"].as<std::string>() ==
          "trainer-jobs");
  }
}

TEST_CASE("docker-compose.yaml: three tasks whose TF_CONFIGs make one cluster", "[templates]") {
  const YAML::Node services = YAML::LoadFile((kDir / "docker-compose.yaml").string())["services"];
  std::set<int> ranks;
  for (const char* name : {"chief", "worker0", "worker1"}) {
    INFO(name);
    const YAML::Node s = services[name];
    REQUIRE(s);
    CHECK(s["image"].as<std::string>() == "trainer");
    CHECK(s["hostname"].as<std::string>() == name);
    check_args(strings(s["command"]), "/work/jobs/cassava-run-1");
    CHECK(s["volumes"][0].as<std::string>() == "jobs:/work/jobs");
    const auto cluster =
        trainer::cluster::parse_tf_config(s["environment"]["TF_CONFIG"].as<std::string>());
    CHECK(cluster.world_size == 3);
    CHECK(cluster.chief_address == "chief:2222");
    CHECK(cluster.own_address == std::string(name) + ":2222");
    ranks.insert(cluster.rank);
  }
  CHECK(ranks == std::set<int>{0, 1, 2});
}

TEST_CASE("slurm.sbatch trains two tasks under a stand-in srun", "[templates][multiworker]") {
  TempDir dir("sbatch");
  make_dataset(dir.path(), "data", 4, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  // What srun does for the tasks of one node: starts SLURM_NTASKS copies of the command, each
  // with its SLURM_PROCID and SLURM_LOCALID, and fails when one fails.
  fs::create_directories(dir / "bin");
  write_text(dir / "bin" / "srun", R"(#!/bin/sh
while [ "${1#--}" != "$1" ]; do shift; done
pids=""
i=0
while [ $i -lt "$SLURM_NTASKS" ]; do
  SLURM_PROCID=$i SLURM_LOCALID=$i "$@" > "srun-$i.log" 2>&1 &
  pids="$pids $!"
  i=$((i + 1))
done
rc=0
for p in $pids; do wait $p || rc=$?; done
exit $rc
)");
  fs::permissions(dir / "bin" / "srun", fs::perms::owner_all);
  const std::string script = (kDir / "slurm.sbatch").string();
  std::string env = "PATH=" + quote((dir / "bin").string()) + ":/usr/bin:/bin";
  for (const std::string& kv :
       {std::string("SLURM_JOB_ID=42"), std::string("SLURM_NTASKS=2"),
        std::string("SLURM_JOB_NODELIST=localhost"), std::string("SLURM_TASKS_PER_NODE=2"),
        std::string("SLURMD_NODENAME=localhost"), "MASTER_PORT=" + std::to_string(free_port()),
        std::string("CONFIG=job.yaml"), std::string("EPOCHS=1"),
        std::string("TRAINER_BIN=") + TRAINER_BIN}) {
    env += " " + quote(kv);
  }
  Result r;
  r.code = sh("(cd " + quote(dir.path().string()) + " && env -u TF_CONFIG " + env + " bash " +
              quote(script) + " >.stdout 2>.stderr </dev/null)");
  r.err = slurp(dir / ".stderr");
  INFO(r.err);
  INFO("task 0: " << slurp(dir / "srun-0.log"));
  INFO("task 1: " << slurp(dir / "srun-1.log"));
  CHECK(r.code == 0);
  CHECK_THAT(slurp(dir / "srun-1.log"), Contains("as worker 1 (rank 1 of 2)"));
  CHECK(fs::exists(dir / "jobs" / "cassava-42" / "model" / "model.safetensors"));
}
