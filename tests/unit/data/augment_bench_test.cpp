// Benchmark (hidden "[.augbench]" case, run by scripts/bench/augment_pipeline.sh; not a test):
// what training augmentation costs in the decode threads. Images/s per decode thread at 224 px
// from generated 800x600 JPEG files: ours plain (RandomResizedCrop + flip), ours with
// TrivialAugmentWide + RandomErasing, and torchvision's reference on the PIL path in a
// DataLoader with 1 and 2 workers (scripts/bench/torchvision_augment.py with TRAINER_PYTHON),
// the sides alternating within each round; the table gives medians over the rounds.
// TRAINER_BENCH_IMAGES (default 320), TRAINER_BENCH_ROUNDS (2), TRAINER_BENCH_ERASING (0.25).
#include "common/catch.h"

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fixtures.h"
#include "trainer/data/loader.h"
#include "trainer/data/source.h"
#include "trainer/synth/synthetic.h"

using namespace trainer;
using namespace trainer::data;
using namespace trainer::synth;
using testing::env_int;
using testing::TempDir;

namespace {

double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}

std::string cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, name = "unknown", flags;
  while (std::getline(f, line)) {
    if (name == "unknown" && line.rfind("model name", 0) == 0)
      name = line.substr(line.find(':') + 2);
    if (flags.empty() && line.rfind("flags", 0) == 0) flags = line;
  }
  for (const char* flag : {"avx512_bf16", "amx_bf16"}) {
    if (flags.find(std::string(" ") + flag) != std::string::npos) name += std::string(", ") + flag;
  }
  return name;
}

// Images per second over one epoch after a warm-up epoch.
double ours(const Listing& listing, int threads, bool augment, double erasing) {
  LoaderOptions o;
  o.preprocess.image_size = 224;
  o.preprocess.train = true;
  o.preprocess.horizontal_flip = true;
  o.preprocess.random_resized_crop = true;
  if (augment) {
    o.preprocess.policy = "trivial_augment_wide";
    o.preprocess.random_erasing = erasing;
  }
  o.batch_size = 32;
  o.shuffle = true;
  o.num_workers = threads;
  o.prefetch_batches = 2;
  o.num_classes = static_cast<int64_t>(listing.class_names.size());
  Loader loader(listing.examples, o);
  loader.start_epoch(0);
  while (loader.next()) {
  }
  const auto t0 = std::chrono::steady_clock::now();
  loader.start_epoch(1);
  int64_t n = 0;
  while (auto b = loader.next()) n += b->images.size(0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(n) / s;
}

double torchvision(const std::string& dir, int workers, double erasing) {
  const std::string command = std::string(TRAINER_PYTHON) + " '" + TRAINER_SOURCE_DIR +
                              "/scripts/bench/torchvision_augment.py' --dir '" + dir +
                              "' --workers " + std::to_string(workers) + " --erasing " +
                              std::to_string(erasing) + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t k;
  while (pipe && (k = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, k);
  const int status = pipe ? ::pclose(pipe) : -1;
  const auto at = out.find("images_per_second=");
  if (status != 0 || at == std::string::npos) {
    std::printf("torchvision side failed (%s):\n%s\n", command.c_str(), out.c_str());
    return 0;
  }
  return std::atof(out.c_str() + at + 18);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

TEST_CASE("benchmark: augmentation images/s per decode thread, ours vs torchvision",
          "[.augbench]") {
  TempDir tmp("augment_bench");
  const int images = env_int("TRAINER_BENCH_IMAGES", 320);
  const int rounds = env_int("TRAINER_BENCH_ROUNDS", 2);
  const double erasing = env_double("TRAINER_BENCH_ERASING", 0.25);
  SyntheticOptions s;
  s.out_dir = (tmp / "jpeg").string();
  s.classes = 5;
  s.per_class = std::max(1, images / 5);
  s.image_size = 800;
  s.image_height = 600;
  s.splits = {"train"};
  s.format = "jpeg";
  make_synthetic_dataset(s);
  SourceOptions spec;
  spec.path = {s.out_dir + "/train"};
  const Listing listing = list_source(spec, "data.train");
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::printf(
      "augment bench: %zu JPEG files 800x600 (quality 90) -> 224 px, batch 32, %d rounds "
      "(medians), random erasing p=%.2f, %s\n",
      listing.examples.size(), rounds, erasing, date);
  std::printf("cpu: %s; torchvision side: %s\n", cpu_name().c_str(), TRAINER_PYTHON);

  struct Side {
    std::string name;
    int threads;
    std::function<double()> run;
  };
  const std::string dir = s.out_dir + "/train";
  const std::vector<Side> sides = {
      {"ours plain (RRC + flip)", 1, [&] { return ours(listing, 1, false, erasing); }},
      {"ours TrivialAugmentWide + erasing", 1, [&] { return ours(listing, 1, true, erasing); }},
      {"torchvision DataLoader (PIL, TA + erasing)", 1,
       [&] { return torchvision(dir, 1, erasing); }},
      {"ours plain (RRC + flip)", 2, [&] { return ours(listing, 2, false, erasing); }},
      {"ours TrivialAugmentWide + erasing", 2, [&] { return ours(listing, 2, true, erasing); }},
      {"torchvision DataLoader (PIL, TA + erasing)", 2,
       [&] { return torchvision(dir, 2, erasing); }},
  };
  std::vector<std::vector<double>> rates(sides.size());
  for (int r = 0; r < rounds; ++r) {
    std::printf("round %d:", r + 1);
    for (size_t i = 0; i < sides.size(); ++i) {
      rates[i].push_back(sides[i].run());
      std::printf(" %.1f", rates[i].back());
      std::fflush(stdout);
    }
    std::printf("\n");
  }
  std::printf("%-44s %8s %10s %22s\n", "side", "threads", "images/s", "images/s per thread");
  std::map<std::pair<int, int>, double> per_thread;  // (side kind, threads)
  for (size_t i = 0; i < sides.size(); ++i) {
    const double m = median(rates[i]);
    per_thread[{static_cast<int>(i % 3), sides[i].threads}] = m / sides[i].threads;
    std::printf("%-44s %8d %10.1f %22.1f\n", sides[i].name.c_str(), sides[i].threads, m,
                m / sides[i].threads);
  }
  for (const int t : {1, 2}) {
    const double plain = per_thread[{0, t}];
    const double aug = per_thread[{1, t}];
    const double tv = per_thread[{2, t}];
    std::printf(
        "ratios, %d thread(s)/worker(s): augmented / plain %.2f (goal >= 0.70), augmented / "
        "torchvision per thread %.2fx (goal >= 2x)\n",
        t, aug / plain, tv > 0 ? aug / tv : 0.0);
  }
  SUCCEED();
}
