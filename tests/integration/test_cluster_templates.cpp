// configs/cluster/: each template parses, names the same image, trainer arguments and port as
// the README and the Dockerfiles, and gives a cluster the trainer accepts. A replica that asks for
// GPUs runs the CUDA image (Dockerfile.cuda) with one trainer process per GPU, any other the CPU
// image; the rule is checked on every template and shown to catch a GPU job on the CPU image.
// The SLURM script runs for real under a stand-in `srun` that starts its tasks with the
// variables srun sets.
#include "common/catch.h"

#include <regex>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "fixtures.h"
#include "harness.h"
#include "trainer/cluster/cluster_spec.h"
#include "trainer/config/job_spec.h"

using namespace trainer::testing;
using trainer::test::Contains;

namespace {

const fs::path kSource = fs::path(TRAINER_SOURCE_DIR);
const fs::path kDir = kSource / "configs" / "cluster";
const char* const kImage = "gcr.io/PROJECT/trainer";  // `docker build -t trainer .`, pushed
const char* const kCudaImage = "gcr.io/PROJECT/trainer:cuda";  // from Dockerfile.cuda, pushed
const char* const kCudaBuild = "docker build -f Dockerfile.cuda -t trainer:cuda .";

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
  const fs::path config = kSource / "configs" / fs::path(args[1]).filename();
  CHECK_NOTHROW(trainer::config::load_job_spec(config.string(), {}));
}

// The node at `path` under `root`, or an undefined node where a key is missing (yaml-cpp throws
// on a lookup under a missing key, and assigning nodes would change the document).
YAML::Node at(const YAML::Node& root, std::initializer_list<const char*> path) {
  YAML::Node node(root);
  for (const char* key : path) {
    if (!node.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node next = static_cast<const YAML::Node&>(node)[key];
    if (!next.IsDefined()) return YAML::Node(YAML::NodeType::Undefined);
    node.reset(next);
  }
  return node;
}

int as_int(const YAML::Node& n, int fallback) { return n.IsDefined() ? n.as<int>() : fallback; }

// The trainer processes a command starts: `launch --workers N [--chief]` starts N (+1), else 1.
int processes(const std::vector<std::string>& args) {
  if (args.empty() || args[0] != "launch") return 1;
  int n = 1;
  bool chief = false;
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i) {
    if (args[i] == "--workers" && i + 1 < args.size()) n = std::stoi(args[i + 1]);
    if (args[i] == "--chief") chief = true;
  }
  return n + (chief ? 1 : 0);
}

// One kind of replica a template starts: its image, the GPUs it asks for and what it runs.
struct Replica {
  std::string where;              // the place in the template, for messages
  std::string image;              // "" = no image (SLURM runs the built binary)
  int gpus = 0;                   // GPUs asked for per replica; -1 = "all" (a count unknown here)
  std::vector<std::string> args;  // after the image's ENTRYPOINT ["trainer"]
  int processes = 1;              // trainer processes it starts
};

Replica replica(std::string where, std::string image, int gpus, std::vector<std::string> args) {
  const int n = processes(args);
  return {std::move(where), std::move(image), gpus, std::move(args), n};
}

// What is wrong with a replica: a GPU replica must run the CUDA image (the CPU image's LibTorch
// sees no GPU, so the job would train on the CPU), any other the CPU image, and it must start
// one trainer process per GPU. `local` = images named as built (compose), not as pushed.
std::vector<std::string> problems(const Replica& r, bool local = false) {
  const std::string cpu_image = local ? "trainer" : kImage;
  const std::string cuda_image = local ? "trainer:cuda" : kCudaImage;
  std::vector<std::string> out;
  if (r.gpus != 0 && !r.image.empty() && r.image != cuda_image) {
    out.push_back(r.where + " asks for GPUs but runs '" + r.image + "', not the CUDA image '" +
                  cuda_image + "' (" + kCudaBuild + ")");
  }
  if (r.gpus == 0 && !r.image.empty() && r.image != cpu_image) {
    out.push_back(r.where + " asks for no GPU but runs '" + r.image + "', not '" + cpu_image + "'");
  }
  if (r.gpus > 0 && r.processes != r.gpus) {
    out.push_back(r.where + " asks for " + std::to_string(r.gpus) + " GPUs but starts " +
                  std::to_string(r.processes) +
                  " trainer processes: one process per GPU (trainer launch --workers N)");
  }
  return out;
}

// AI Platform's trainingInput: the master and (with workerCount > 0) the workers.
std::vector<Replica> ai_platform_replicas(const YAML::Node& doc) {
  const YAML::Node in = doc["trainingInput"];
  std::vector<Replica> out;
  for (const char* role : {"masterConfig", "workerConfig"}) {
    if (std::string(role) == "workerConfig" && as_int(in["workerCount"], 0) == 0) continue;
    const YAML::Node c = in[role];
    out.push_back(replica(std::string("trainingInput.") + role, c["imageUri"].as<std::string>(),
                          as_int(at(c, {"acceleratorConfig", "count"}), 0), strings(in["args"])));
  }
  return out;
}

// Vertex AI's worker pools.
std::vector<Replica> vertex_replicas(const YAML::Node& doc) {
  std::vector<Replica> out;
  const YAML::Node pools = doc["workerPoolSpecs"];
  for (size_t i = 0; i < pools.size(); ++i) {
    const YAML::Node m = pools[i]["machineSpec"];
    out.push_back(replica("workerPoolSpecs[" + std::to_string(i) + "]",
                          pools[i]["containerSpec"]["imageUri"].as<std::string>(),
                          m["acceleratorType"] ? as_int(m["acceleratorCount"], 1) : 0,
                          strings(pools[i]["containerSpec"]["args"])));
  }
  return out;
}

// A Kubernetes container: GPUs from resources.limits["nvidia.com/gpu"].
Replica container_replica(const std::string& where, const YAML::Node& c) {
  return replica(where, c["image"].as<std::string>(),
                 as_int(at(c, {"resources", "limits", "nvidia.com/gpu"}), 0), strings(c["args"]));
}

// TFJob's replica specs (Chief, Worker, ...), every container.
std::vector<Replica> tfjob_replicas(const YAML::Node& doc) {
  std::vector<Replica> out;
  for (const auto& spec : doc["spec"]["tfReplicaSpecs"]) {
    const YAML::Node containers = spec.second["template"]["spec"]["containers"];
    for (size_t i = 0; i < containers.size(); ++i) {
      out.push_back(container_replica(
          spec.first.as<std::string>() + ".containers[" + std::to_string(i) + "]", containers[i]));
    }
  }
  return out;
}

// docker compose services: GPUs from `gpus:` or deploy.resources.reservations.devices with the
// gpu capability (count: N, or all).
std::vector<Replica> compose_replicas(const YAML::Node& doc) {
  std::vector<Replica> out;
  for (const auto& service : doc["services"]) {
    const YAML::Node s = service.second;
    int gpus = 0;
    auto count = [](const YAML::Node& n) {  // no count = all of them
      return !n.IsDefined() || n.as<std::string>() == "all" ? -1 : n.as<int>();
    };
    if (s["gpus"]) gpus = count(s["gpus"]);
    for (const auto& d : at(s, {"deploy", "resources", "reservations", "devices"})) {
      for (const auto& cap : at(d, {"capabilities"})) {
        if (cap.as<std::string>() == "gpu") gpus = count(at(d, {"count"}));
      }
    }
    out.push_back(replica("services." + service.first.as<std::string>(),
                          s["image"].as<std::string>(), gpus, strings(s["command"])));
  }
  return out;
}

// The SLURM script: GPUs per node (--gres=gpu[:type]:N, --gpus-per-node=N) against tasks per
// node, one trainer each; there is no image (it runs the binary it is given).
std::vector<Replica> slurm_replicas(const std::string& script) {
  auto option = [&](const std::string& pattern) {
    std::smatch m;
    return std::regex_search(script, m, std::regex("#SBATCH " + pattern)) ? std::stoi(m[1]) : 0;
  };
  const int gpus = std::max(option("--gres=gpu(?::[A-Za-z0-9_]+)?:([0-9]+)"),
                            option("--gpus-per-node=(?:[A-Za-z0-9_]+:)?([0-9]+)"));
  const int tasks = std::max(option("--ntasks-per-node=([0-9]+)"), 1);
  return {Replica{"slurm.sbatch (per node)", "", gpus, {}, tasks}};
}

std::vector<Replica> replicas_of(const std::string& file) {
  if (file == "slurm.sbatch") return slurm_replicas(slurp(kDir / file));
  const YAML::Node doc = YAML::LoadFile((kDir / file).string());
  if (file == "ai-platform.yaml") return ai_platform_replicas(doc);
  if (file == "vertex-ai.yaml") return vertex_replicas(doc);
  if (file == "tfjob.yaml") return tfjob_replicas(doc);
  if (file == "docker-compose.yaml") return compose_replicas(doc);
  FAIL("no rule for configs/cluster/" << file << ": add one to test_cluster_templates.cpp");
  return {};
}

std::string all(const std::vector<std::string>& problems) {
  std::string s;
  for (const auto& p : problems) s += p + "\n";
  return s;
}

// The `docker run` command of a text: from "docker run --rm --gpus" through its continuation
// lines, comment markers, backslashes and repeated spaces removed.
std::string gpu_run_command(const std::string& text, const std::string& comment) {
  const size_t start = text.find("docker run --rm --gpus");
  if (start == std::string::npos) return "";
  std::string out;
  std::istringstream lines(text.substr(start));
  for (std::string line; std::getline(lines, line);) {
    if (!comment.empty() && line.rfind(comment, 0) == 0) line = line.substr(comment.size());
    const bool more = !line.empty() && line.back() == '\\';
    if (more) line.pop_back();
    out += line + " ";
    if (!more) break;
  }
  return std::regex_replace(out, std::regex(" +"), " ");
}

}  // namespace

TEST_CASE("the image, its working dir and its configs are what the templates assume",
          "[templates]") {
  for (const char* file : {"Dockerfile", "Dockerfile.cuda"}) {
    INFO(file);
    CHECK_THAT(slurp(kSource / file), Contains("COPY configs /opt/trainer/configs") &&
                                          Contains("WORKDIR /work") &&
                                          Contains("ENTRYPOINT [\"trainer\"]"));
  }
  const std::string readme = slurp(kSource / "README.md");
  CHECK_THAT(readme, Contains("docker build -t trainer .") && Contains(kImage) &&
                         Contains("configs/cluster/") && Contains(kCudaBuild) &&
                         Contains(kCudaImage));
}

TEST_CASE("Dockerfile.cuda: the README's GPU commands, built by the README's pip-flavour scripts",
          "[templates]") {
  const std::string dockerfile = slurp(kSource / "Dockerfile.cuda");
  const std::string readme = slurp(kSource / "README.md");
  CHECK_THAT(dockerfile, Contains(kCudaBuild));
  // Several ranks in one container: every GPU, NCCL's shared memory, one process per GPU.
  const std::string run = gpu_run_command(dockerfile, "#");
  INFO("Dockerfile.cuda: " << run);
  CHECK_THAT(run, Contains("--gpus all --ipc=host") &&
                      Contains(" trainer:cuda launch --workers ") &&
                      Contains(" -- --config /opt/trainer/configs/cassava_resnet50.yaml "));
  CHECK(gpu_run_command(readme, "") == run);
  // The train arguments after `--` load.
  CHECK_NOTHROW(trainer::config::load_job_spec(
      (kSource / "configs" / "cassava_resnet50.yaml").string(), {"train.device=cuda"}));

  // Both stages on the CPU image's slim Debian; the build stage runs the README's own pip
  // commands (the flavour CI tests), so nothing comes from nvidia/cuda images or pytorch.org.
  std::vector<std::string> froms;
  std::istringstream lines(dockerfile);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("FROM ", 0) == 0) froms.push_back(line);
  }
  REQUIRE(froms.size() == 2);
  CHECK(froms[0] == "FROM debian:${DEBIAN_RELEASE}-slim AS build");
  CHECK(froms[1] == "FROM debian:${DEBIAN_RELEASE}-slim");
  CHECK_THAT(dockerfile, Contains("ARG DEBIAN_RELEASE=bookworm") &&
                             Contains("RUN bash scripts/install-deps.sh --torch pip\n") &&
                             Contains("RUN bash scripts/build.sh --torch pip ") &&
                             Contains("scripts/image-libs.sh") && !Contains("nvidia/cuda:") &&
                             !Contains("download.pytorch.org"));
  CHECK_THAT(readme, Contains("--torch pip") && !Contains("download.pytorch.org") &&
                         !Contains("libtorch-cxx11-abi-shared-with-deps"));
}

TEST_CASE("GPU templates run the CUDA image, one process per GPU, CPU templates the CPU image",
          "[templates]") {
  std::set<std::string> files;
  for (const auto& entry : fs::directory_iterator(kDir)) {
    files.insert(entry.path().filename().string());
  }
  CHECK(files == std::set<std::string>{"ai-platform.yaml", "docker-compose.yaml", "slurm.sbatch",
                                       "tfjob.yaml", "vertex-ai.yaml"});
  std::set<std::string> gpu_files;
  for (const std::string& file : files) {
    INFO(file);
    const std::vector<Replica> replicas = replicas_of(file);
    CHECK(!replicas.empty());
    for (const Replica& r : replicas) {
      const auto found = problems(r, file == "docker-compose.yaml");
      INFO(all(found));
      CHECK(found.empty());
      if (r.gpus != 0) gpu_files.insert(file);
    }
    if (gpu_files.count(file) != 0) {
      INFO("a GPU template says how to build its image");
      CHECK_THAT(slurp(kDir / file), Contains(kCudaBuild));
    }
  }
  CHECK(gpu_files == std::set<std::string>{"ai-platform.yaml", "vertex-ai.yaml"});
}

TEST_CASE("the image rule catches a GPU job on the CPU image and two GPUs for one process",
          "[templates]") {
  // ai-platform.yaml's master on the CPU image.
  YAML::Node ai = YAML::LoadFile((kDir / "ai-platform.yaml").string());
  ai["trainingInput"]["masterConfig"]["imageUri"] = kImage;
  auto found = problems(ai_platform_replicas(ai)[0]);
  REQUIRE(found.size() == 1);
  CHECK_THAT(found[0], Contains("trainingInput.masterConfig asks for GPUs") &&
                           Contains("'gcr.io/PROJECT/trainer', not the CUDA image") &&
                           Contains(kCudaBuild));
  // Its worker with two T4s and one process; then with `launch --workers 2` it is right.
  ai = YAML::LoadFile((kDir / "ai-platform.yaml").string());
  ai["trainingInput"]["workerConfig"]["acceleratorConfig"]["count"] = 2;
  Replica worker = ai_platform_replicas(ai)[1];
  found = problems(worker);
  REQUIRE(found.size() == 1);
  CHECK_THAT(found[0], Contains("asks for 2 GPUs but starts 1 trainer processes"));
  worker.args.insert(worker.args.begin(), {"launch", "--workers", "2", "--"});
  worker = replica(worker.where, worker.image, worker.gpus, worker.args);
  CHECK(worker.processes == 2);
  CHECK(problems(worker).empty());
  // A Vertex AI pool on the CPU image.
  YAML::Node vertex = YAML::LoadFile((kDir / "vertex-ai.yaml").string());
  vertex["workerPoolSpecs"][1]["containerSpec"]["imageUri"] = kImage;
  CHECK(problems(vertex_replicas(vertex)[0]).empty());
  CHECK(problems(vertex_replicas(vertex)[1]).size() == 1);
  // The CPU templates given GPUs but not the CUDA image.
  YAML::Node tfjob = YAML::LoadFile((kDir / "tfjob.yaml").string());
  tfjob["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"]
       ["limits"]["nvidia.com/gpu"] = 1;
  CHECK(all(problems(tfjob_replicas(tfjob)[1])).find("Worker.containers[0] asks for GPUs") !=
        std::string::npos);
  YAML::Node compose = YAML::LoadFile((kDir / "docker-compose.yaml").string());
  compose["services"]["worker1"]["deploy"] = YAML::Load(
      "{resources: {reservations: {devices: [{driver: nvidia, count: 1, capabilities: [gpu]}]}}}");
  bool caught = false;
  for (const Replica& r : compose_replicas(compose)) {
    caught = caught ||
             all(problems(r, true)).find("services.worker1 asks for GPUs") != std::string::npos;
  }
  CHECK(caught);
  const auto slurm = slurm_replicas("#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:4\n");
  CHECK(all(problems(slurm[0])).find("asks for 4 GPUs but starts 1") != std::string::npos);
  CHECK(problems(slurm_replicas("#SBATCH --ntasks-per-node=4\n#SBATCH --gres=gpu:t4:4\n")[0])
            .empty());
  // And a CPU job on the CUDA image.
  tfjob = YAML::LoadFile((kDir / "tfjob.yaml").string());
  tfjob["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]["image"] =
      kCudaImage;
  CHECK(problems(tfjob_replicas(tfjob)[0]).size() == 1);
}

TEST_CASE("ai-platform.yaml is the tutorial's config.yaml shape", "[templates]") {
  const YAML::Node in = YAML::LoadFile((kDir / "ai-platform.yaml").string())["trainingInput"];
  CHECK(in["scaleTier"].as<std::string>() == "CUSTOM");
  CHECK(in["workerCount"].as<int>() == 1);
  for (const char* role : {"masterConfig", "workerConfig"}) {
    INFO(role);
    CHECK(in[role]["imageUri"].as<std::string>() == kCudaImage);
    CHECK(in[role]["acceleratorConfig"]["type"].as<std::string>() == "NVIDIA_TESLA_T4");
    CHECK(in[role]["acceleratorConfig"]["count"].as<int>() == 1);
  }
  // The tutorial's: the master appears in TF_CONFIG as "chief" (without it, as "master").
  REQUIRE(in["useChiefInTfConfig"]);
  CHECK(in["useChiefInTfConfig"].as<bool>());
  check_args(strings(in["args"]), "gs://BUCKET/cassava/run-1");
}

TEST_CASE("ai-platform.yaml's cluster: the master is the chief as 'chief' and as 'master'",
          "[templates]") {
  // The TF_CONFIG AI Platform gives each replica of this template, with useChiefInTfConfig
  // (the master is "chief") and without it ("master").
  const YAML::Node in = YAML::LoadFile((kDir / "ai-platform.yaml").string())["trainingInput"];
  const int workers = in["workerCount"].as<int>();
  std::string worker_list;
  for (int i = 0; i < workers; ++i) {
    worker_list += (i ? ", " : "") + std::string("\"worker-") + std::to_string(i) + ":2222\"";
  }
  for (const std::string master_type : {"chief", "master"}) {
    INFO(master_type);
    const std::string cluster = R"({"cluster": {")" + master_type +
                                R"(": ["master-0:2222"], "worker": [)" + worker_list + "]}";
    std::set<int> ranks;
    for (int task = -1; task < workers; ++task) {
      const std::string type = task < 0 ? master_type : "worker";
      const auto spec = trainer::cluster::parse_tf_config(cluster + R"(, "task": {"type": ")" +
                                                          type + R"(", "index": )" +
                                                          std::to_string(std::max(task, 0)) + "}}");
      CHECK(spec.world_size == 1 + workers);
      CHECK(spec.chief_address == "master-0:2222");
      CHECK(spec.is_chief() == (task < 0));
      ranks.insert(spec.rank);
    }
    CHECK(ranks.size() == static_cast<size_t>(1 + workers));
    CHECK(*ranks.begin() == 0);
  }
}

TEST_CASE("vertex-ai.yaml has a chief pool and a worker pool of the same image", "[templates]") {
  const YAML::Node pools = YAML::LoadFile((kDir / "vertex-ai.yaml").string())["workerPoolSpecs"];
  REQUIRE(pools.size() == 2);
  for (const auto& pool : pools) {
    CHECK(pool["replicaCount"].as<int>() == 1);
    CHECK(pool["machineSpec"]["acceleratorType"].as<std::string>() == "NVIDIA_TESLA_T4");
    CHECK(pool["containerSpec"]["imageUri"].as<std::string>() == kCudaImage);
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
