// Full and failing disks. The chief's job dir on a small tmpfs that fills while a checkpoint is
// written: exit 3 saying the disk is full and where, the previous checkpoint and metrics.jsonl
// intact, and the same command resumes, bit-exact, once space is freed. A read-only job dir and a
// job dir removed mid-run stop every task with exit 3. The mounts need root (those tests skip with
// a message elsewhere) and are unmounted afterwards, even when a check fails.
#include "common/catch.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <set>
#include <stdexcept>
#include <thread>

#include "fixtures.h"
#include "harness.h"

using namespace trainer::testing;
using trainer::test::Contains;

namespace {

// Sum of the sizes of the files directly in `dir`.
uint64_t files_size(const fs::path& dir) {
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir)) total += fs::file_size(e.path());
  return total;
}

std::vector<fs::path> checkpoints(const fs::path& job) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(job / "checkpoints")) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// Takes `bytes` of the file system at `path` (tmpfs honours fallocate).
void ballast(const fs::path& path, uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) != 0) {
    throw std::runtime_error("cannot allocate the ballast file " + path.string());
  }
  ::close(fd);
}

// The steps of a metrics.jsonl's per-step records, checking that each line is whole JSON.
std::vector<int64_t> step_records(const fs::path& metrics) {
  const std::string text = slurp(metrics);
  CHECK((text.empty() || text.back() == '\n'));
  std::vector<int64_t> steps;
  for (const auto& rec : read_metrics(metrics)) {  // throws on a torn line
    if (rec.contains("loss")) steps.push_back(rec["step"].get<int64_t>());
  }
  return steps;
}

const char* const kShortTimeouts =
    " --set distributed.rendezvous_timeout_s=60 --set distributed.timeout_s=60";

}  // namespace

TEST_CASE(
    "a disk that fills while a checkpoint is written: exit 3 saying so, the earlier checkpoint "
    "and metrics.jsonl intact, and the job resumes bit-exact once space is freed",
    "[disk]") {
  TempDir dir("disk_full");
  REQUIRE_TMPFS(dir.path());
  make_dataset(dir.path(), "data", 6, 32);  // 30 images: 3 steps per epoch
  write_text(dir / "job.yaml", tiny_job_yaml(3));
  const std::string args = "--config job.yaml --set train.optimizer.name=sgd";

  // The same job on a roomy disk: the reference, and the size of one checkpoint.
  const Result ref = run_trainer(dir.path(), args + " --job-dir ref");
  INFO(ref.err);
  REQUIRE(ref.code == 0);
  const std::vector<fs::path> ref_ckpts = checkpoints(dir / "ref");
  REQUIRE(ref_ckpts.size() == 3);
  const uint64_t ckpt = files_size(ref_ckpts[0]);

  // Room for the first checkpoint and half of the second.
  const uint64_t size = 4 * ckpt;
  Tmpfs disk(dir / "mnt", size);
  ballast(dir / "mnt" / "ballast", size - ckpt * 3 / 2);
  const Result full = run_trainer(dir.path(), args + " --job-dir mnt/job");
  INFO(full.err);
  CHECK(full.code == 3);
  CHECK_THAT(full.err, Contains("cannot write checkpoint 'mnt/job/checkpoints/") &&
                           Contains("the disk is full") &&
                           Contains("the checkpoints written before it are kept"));
  // The first checkpoint is there, its weights and RNG state byte for byte the reference's
  // (LibTorch orders optimizer.pt's entries by tensor address, so that file differs between any two
  // runs; the resume below verifies its checksum); no temp dir is left.
  const std::vector<fs::path> kept = checkpoints(dir / "mnt" / "job");
  REQUIRE(kept.size() == 1);
  CHECK(kept[0].filename() == ref_ckpts[0].filename());
  for (const char* name : {"model.safetensors", "rng.safetensors"}) {
    CHECK(slurp(kept[0] / name) == slurp(ref_ckpts[0] / name));
  }
  CHECK(fs::exists(kept[0] / "state.json"));
  // metrics.jsonl: whole lines, each step once, up to where the job stopped.
  const std::vector<int64_t> before = step_records(dir / "mnt" / "job" / "metrics.jsonl");
  REQUIRE(before.size() >= 3);
  for (size_t i = 0; i < before.size(); ++i) CHECK(before[i] == static_cast<int64_t>(i + 1));

  // Space freed: the same command resumes from the kept checkpoint and ends as the reference.
  fs::remove(dir / "mnt" / "ballast");
  const Result resumed = run_trainer(dir.path(), args + " --job-dir mnt/job");
  INFO(resumed.err);
  REQUIRE(resumed.code == 0);
  CHECK_THAT(resumed.err, Contains("resumed from"));
  CHECK(slurp(dir / "mnt" / "job" / "model" / "model.safetensors") ==
        slurp(dir / "ref" / "model" / "model.safetensors"));
  CHECK(step_records(dir / "mnt" / "job" / "metrics.jsonl") ==
        std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9});
}

TEST_CASE("a read-only job dir stops every task with exit 3 naming it", "[disk][multiworker]") {
  TempDir dir("disk_readonly");
  REQUIRE_TMPFS(dir.path());
  make_dataset(dir.path(), "data", 4, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  Tmpfs disk(dir / "mnt", 16 << 20);
  fs::create_directories(dir / "mnt" / "job");
  disk.remount("ro");
  const auto start = Clock::now();
  const std::vector<Result> r = run_cluster(
      dir.path(), 2, "--config job.yaml --job-dir mnt/job" + std::string(kShortTimeouts));
  const double took = seconds_since(start);
  INFO("chief: " << r[0].err);
  INFO("worker 1: " << r[1].err);
  CHECK(r[0].code == 3);
  CHECK_THAT(r[0].err, Contains("'mnt/job") && Contains("the file system is read-only"));
  CHECK(r[1].code == 3);
  CHECK_THAT(r[1].err, Contains("worker 0 failed while preparing the job dir") &&
                           Contains("the file system is read-only"));
  CHECK(took < 30);  // not the rendezvous or collective timeout
}

TEST_CASE("a job dir removed mid-run stops every task with exit 3 naming it",
          "[disk][multiworker]") {
  TempDir dir("disk_removed");
  make_dataset(dir.path(), "data", 6, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(200));
  const int port = free_port();
  const std::string args = "--config job.yaml --job-dir job" + std::string(kShortTimeouts);
  Background chief(dir.path(), args, {tf_config(2, false, port, "worker", 0)}, "w0");
  Background worker(dir.path(), args, {tf_config(2, false, port, "worker", 1)}, "w1");
  const fs::path metrics = dir / "job" / "metrics.jsonl";
  for (int i = 0; i < 2400 && (!fs::exists(metrics) || fs::file_size(metrics) == 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(fs::exists(metrics));
  std::error_code ec;
  fs::remove_all(dir / "job", ec);
  fs::remove_all(dir / "job", ec);  // anything written in between
  const auto removed = Clock::now();
  const Result c = chief.wait();
  const Result w = worker.wait();
  const double took = seconds_since(removed);
  INFO("chief: " << c.err);
  INFO("worker 1: " << w.err);
  CHECK(c.code == 3);
  CHECK(w.code == 3);
  for (const Result* r : {&c, &w}) {
    const bool named = Contains("'job").match(r->err) &&
                       (Contains("deleted while the job ran").match(r->err) ||
                        Contains("has disappeared while the job ran").match(r->err));
    CHECK(named);
  }
  CHECK(took < 20);
  CHECK_FALSE(fs::exists(dir / "job" / "model"));  // nothing re-created in its place
}
