// model.pretrained by URL and by torchvision's names, against a loopback HTTP server (Python's
// http.server over a directory of this test's): fetched into torchvision's cache
// ($TORCH_HOME/hub/checkpoints), hash-checked by the prefix in the file name, used, reused
// offline; a file that is not the one its name promises is exit 3 naming the hash, and nothing
// is cached; no server is exit 3 naming the URL and the cache.
#include "common/catch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "fixtures.h"
#include "harness.h"

using namespace trainer::testing;
using trainer::test::Contains;

namespace {

// Python's http.server over `root` on 127.0.0.1, for the object's lifetime.
class LoopbackHttp {
 public:
  explicit LoopbackHttp(const fs::path& root) : port_(free_port()) {
    const std::string port = std::to_string(port_);
    pid_ = ::fork();
    if (pid_ == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(null, 2);
      ::execl(TRAINER_PYTHON, TRAINER_PYTHON, "-m", "http.server", port.c_str(), "--bind",
              "127.0.0.1", "--directory", root.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 200 && !accepts(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~LoopbackHttp() { stop(); }
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  bool accepts() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    return ok;
  }
  std::string base() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  int port_;
  pid_t pid_ = -1;
};

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("model.pretrained by URL or torchvision name: fetched, hash-checked, cached, reused",
          "[pth][hub]") {
#if !TRAINER_DOWNLOADS
  WARN("skipped: this build has no downloads (-DTRAINER_DOWNLOADS=OFF)");
  return;
#endif
  TempDir dir("hub");
  const int made = sh("cd " + quote(dir.path().string()) + " && " + TRAINER_PYTHON +
                      " -c 'import torch, torchvision; torch.manual_seed(1); "
                      "torch.save(torchvision.models.resnet18().state_dict(), \"weights.pth\")'");
  if (made != 0) {
    FAIL("this test needs torch and torchvision for " TRAINER_PYTHON
         " (Debian: python3-torch python3-torchvision); run scripts/install-deps.sh as root");
  }
  make_dataset(dir.path(), "data", 4, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  REQUIRE(run_trainer(dir.path(), "convert weights.pth weights.safetensors").code == 0);
  const auto given = read_f32(dir / "weights.safetensors");

  // The served name carries the first 10 hex digits of its SHA-256, as torch.hub's files do.
  REQUIRE(sh("cd " + quote(dir.path().string()) +
             " && mkdir -p serve/models && h=$(sha256sum weights.pth | cut -c1-10)"
             " && cp weights.pth serve/resnet18-$h.pth && echo $h > hash.txt"
             " && cp weights.pth serve/models/resnet18-f37072fd.pth") == 0);
  std::string hash = slurp(dir / "hash.txt");
  hash.erase(hash.find_last_not_of("\n") + 1);
  const fs::path cache = dir / "torch-home" / "hub" / "checkpoints";
  const std::vector<std::string> env = {"TORCH_HOME=" + (dir / "torch-home").string()};
  const std::string zero_lr = " --set train.optimizer.learning_rate=0 --set train.max_steps=1";

  LoopbackHttp server(dir / "serve");
  REQUIRE(server.accepts());
  const std::string url = server.base() + "/resnet18-" + hash + ".pth";
  // One flow, not Catch sections (each would make the weights and start the server again).
  // A URL with a hash prefix: fetched into the cache, used, then reused offline.
  const Result first = run_trainer(
      dir.path(), "--config job.yaml --job-dir j1 --set model.pretrained=" + url + zero_lr, env);
  INFO(first.err);
  REQUIRE(first.code == 0);
  CHECK(files_in(cache) == std::vector<std::string>{"resnet18-" + hash + ".pth"});
  CHECK_THAT(first.err, Contains("downloaded " + url));
  const auto trained = read_f32(dir / "j1" / "model" / "model.safetensors");
  CHECK(trained.at("conv1.weight") == given.at("conv1.weight"));

  // torchvision:NAME through TRAINER_WEIGHTS_MIRROR, serving a file that is not torchvision's:
  // exit 3 naming the hashes, nothing more in the cache, no model written.
  std::vector<std::string> mirrored = env;
  mirrored.push_back("TRAINER_WEIGHTS_MIRROR=" + server.base());
  const Result foreign = run_trainer(
      dir.path(),
      "--config job.yaml --job-dir j3 --set model.pretrained=torchvision:IMAGENET1K_V1" + zero_lr,
      mirrored);
  INFO(foreign.err);
  CHECK(foreign.code == 3);
  CHECK_THAT(foreign.err, Contains("f37072fd") && Contains("SHA-256") &&
                              Contains("/models/resnet18-f37072fd.pth"));
  CHECK(files_in(cache) == std::vector<std::string>{"resnet18-" + hash + ".pth"});
  CHECK_FALSE(fs::exists(dir / "j3" / "model"));

  // An unknown torchvision name lists the published ones (before any download).
  const Result unknown = run_trainer(
      dir.path(), "--config job.yaml --job-dir j4 --set model.pretrained=torchvision:V9", env);
  CHECK(unknown.code == 2);
  CHECK_THAT(unknown.err, Contains("IMAGENET1K_V1 (DEFAULT)"));

  // Offline: the cached file is used without the server; an uncached URL is exit 3 naming the
  // URL, the cache and how to put the file there by hand.
  server.stop();
  const Result offline = run_trainer(
      dir.path(), "--config job.yaml --job-dir j2 --set model.pretrained=" + url + zero_lr, env);
  INFO(offline.err);
  CHECK(offline.code == 0);
  CHECK_THAT(offline.err, Contains("from the cache"));
  const std::string missing = server.base() + "/models/resnet18-0123456789.pth";
  const Result down = run_trainer(
      dir.path(), "--config job.yaml --job-dir j5 --set model.pretrained=" + missing, env);
  CHECK(down.code == 3);
  CHECK_THAT(down.err, Contains(missing) && Contains(cache.string()) && Contains("by hand"));
  CHECK(files_in(cache) == std::vector<std::string>{"resnet18-" + hash + ".pth"});

  // A damaged copy in the cache (truncated by hand) is refused by its name's hash, by name.
  fs::resize_file(cache / ("resnet18-" + hash + ".pth"), 1000);
  const Result damaged = run_trainer(
      dir.path(), "--config job.yaml --job-dir j6 --set model.pretrained=" + url + zero_lr, env);
  CHECK(damaged.code == 3);
  CHECK_THAT(damaged.err, Contains("resnet18-" + hash + ".pth") && Contains("remove it"));
}
