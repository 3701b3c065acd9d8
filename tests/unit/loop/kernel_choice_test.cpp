// train.precision / train.channels_last auto on the CPU (loop/kernel_choice.h): the probe shapes
// read off the model, the candidates per request, the measured choice and its cache, and how a
// worker takes the chief's choice.
#include "common/catch.h"

#include <fstream>

#include "common/temp_dir.h"
#include "trainer/config/job_spec.h"
#include "trainer/loop/kernel_choice.h"
#include "trainer/loop/runtime.h"
#include "trainer/model/net.h"
#include "trainer/util/cpu.h"
#include "trainer/util/error.h"

using namespace trainer::train;
using trainer::test_support::TempDir;

namespace {

std::vector<std::string> labels(const std::vector<Format>& formats) {
  std::vector<std::string> out;
  for (const auto& f : formats) out.push_back(f.label());
  return out;
}

}  // namespace

TEST_CASE("probe_convolutions: the 3x3 and 1x1 convolutions with the most work, at their size",
          "[kernel_choice]") {
  const auto r50 = trainer::model::make_net({"resnet50", 5, 0});
  auto p = probe_convolutions(*r50, 224);
  REQUIRE(p.size() == 2);
  // Every stage's 3x3 does the same work (channels double as the map halves): the first wins.
  CHECK(p[0].describe() == "layer1.0.conv2 (3x3, 64->64 at 56x56)");
  // ResNet v1.5 strides in conv2, so layer2's first 1x1 still sees layer1's map.
  CHECK(p[1].describe() == "layer2.0.conv1 (1x1, 256->128 at 56x56)");
  // The stem's stride 2 and the max pool: 256 -> 128 -> 64.
  CHECK(probe_convolutions(*r50, 256)[0].describe() == "layer1.0.conv2 (3x3, 64->64 at 64x64)");
  // resnet18 has no stride-1 1x1 convolution (its 1x1s are the downsample branches).
  CHECK(probe_convolutions(*trainer::model::make_net({"resnet18", 5, 0}), 224).size() == 1);
  const auto b0 = trainer::model::make_net({"efficientnet_b0", 5, 0});
  p = probe_convolutions(*b0, 224);
  REQUIRE(p.size() == 2);
  CHECK(p[0].kernel == 3);
  CHECK(p[0].groups == p[0].in_channels);  // EfficientNet's 3x3 convolutions are depthwise
  CHECK(p[1].kernel == 1);
  CHECK(p[1].name.find("fc") == std::string::npos);  // not squeeze-and-excitation's 1x1 map
  CHECK(p[1].size >= 7);
}

TEST_CASE("format_candidates: auto axes offer both, explicit ones only themselves",
          "[kernel_choice]") {
  using V = std::vector<std::string>;
  std::string why;
  CHECK(labels(format_candidates("auto", "auto", true, &why)) ==
        V{"fp32 NCHW", "fp32 channels_last", "bf16 channels_last"});
  CHECK(why.empty());
  CHECK(labels(format_candidates("auto", "auto", false, &why)) ==
        V{"fp32 NCHW", "fp32 channels_last"});
  CHECK_THAT(why, trainer::test::Contains("bf16 not timed"));
  CHECK(labels(format_candidates("auto", "true", true)) ==
        V{"fp32 channels_last", "bf16 channels_last"});
  CHECK(labels(format_candidates("auto", "false", true)) == V{"fp32 NCHW", "bf16 NCHW"});
  CHECK(labels(format_candidates("bf16", "auto", false)) == V{"bf16 NCHW", "bf16 channels_last"});
  CHECK(labels(format_candidates("fp32", "false", true)) == V{"fp32 NCHW"});
  CHECK(labels(format_candidates("auto", "true", false)) == V{"fp32 channels_last"});
}

TEST_CASE("choose_cpu_format times the candidates, takes the fastest and caches it",
          "[kernel_choice]") {
  TempDir tmp("kernel-choice");
  const std::string cache = (tmp.path() / "cache" / "kernel_choice.json").string();
  FormatRequest r;
  r.precision = "fp32";
  r.channels_last = "auto";
  r.arch = "resnet18";
  r.image_size = 64;
  r.batch = 2;
  const FormatChoice first = choose_cpu_format(r, cache);
  CHECK(first.source == "measured");
  REQUIRE(first.timings.size() == 2);
  for (const auto& t : first.timings) {
    CHECK(t.rounds >= 1);
    CHECK(t.seconds > 0);
    CHECK(first.timings[0].seconds > 0);
  }
  const auto fastest = first.timings[0].seconds <= first.timings[1].seconds ? 0 : 1;
  CHECK(first.format == first.timings[fastest].format);
  CHECK(first.probes.size() == 1);  // resnet18: its widest 3x3
  CHECK(first.batch == 2);
  CHECK_THAT(first.summary(), trainer::test::Contains("the fastest of fp32 NCHW"));

  // The second start reads the cache: the same choice, no timing.
  const FormatChoice second = choose_cpu_format(r, cache);
  CHECK(second.source == "cached");
  CHECK(second.format == first.format);
  CHECK(second.key == first.key);
  CHECK(second.timings.size() == 2);
  // The key names the vector units beside the brand string (which a hypervisor may show alike
  // for an AVX2 and an AVX-512 machine).
  std::string isa;
  for (const auto& f : trainer::util::cpu_features().flags()) isa += (isa.empty() ? "" : "+") + f;
  CHECK_THAT(first.key, trainer::test::Contains(";isa=" + (isa.empty() ? "none" : isa) + ";"));
  CHECK(first.cpu_model == cpu_description());
  if (!trainer::util::cpu_features().model.empty()) {
    CHECK_THAT(cpu_description(), trainer::test::Contains(trainer::util::cpu_features().model));
  }
  // Another batch is another key.
  FormatRequest r4 = r;
  r4.batch = 4;
  CHECK(choose_cpu_format(r4, cache).source == "measured");
  CHECK(choose_cpu_format(r, cache).source == "cached");  // both entries kept

  // A damaged cache is measured over and replaced, not fatal.
  { std::ofstream(cache) << "{not json"; }
  CHECK(choose_cpu_format(r, cache).source == "measured");
  CHECK(choose_cpu_format(r, cache).source == "cached");
  // An unwritable cache location: measured every time, still no error.
  CHECK(choose_cpu_format(r, "/proc/no-such-dir/kernel_choice.json").source == "measured");
  // One candidate: nothing to time.
  r.channels_last = "true";
  CHECK(choose_cpu_format(r, cache).source == "only");
}

TEST_CASE("a worker takes the chief's choice, the JSON round-trips, garbage is a DataError",
          "[kernel_choice]") {
  FormatChoice chief;
  chief.format = Format{"bf16", true};
  chief.source = "measured";
  chief.timings = {{Format{"fp32", false}, 0.3, 2}, {Format{"bf16", true}, 0.1, 2}};
  chief.probes = {{"layer1.0.conv2", 64, 64, 3, 1, 56}};
  chief.batch = 16;
  chief.threads = 2;
  chief.cpu_model = "Some Other CPU";
  chief.key = "k";
  const FormatChoice back = FormatChoice::from_json(chief.to_json());
  CHECK(back.format == chief.format);
  CHECK(back.timings.size() == 2);
  CHECK(back.timings[1].seconds == Approx(0.1));
  CHECK(back.probes[0].describe() == chief.probes[0].describe());

  trainer::config::JobSpec spec;
  spec.train.precision = "auto";
  spec.train.channels_last = "auto";
  ModelSettings worker = model_settings(spec, torch::kCPU, false, /*measure=*/false);
  REQUIRE(worker.format_choice);
  CHECK(worker.format_choice->source == "pending");
  adopt_format_choice(worker, chief.to_json());
  CHECK(worker.precision == "bf16");
  CHECK(worker.channels_last);
  CHECK(worker.format_choice->source == "chief");

  CHECK_THROWS_AS(FormatChoice::from_json(nlohmann::json::parse(R"({"precision": 3})")),
                  trainer::DataError);
  nlohmann::json bad = chief.to_json();
  bad["precision"] = "fp64";
  CHECK_THROWS_AS(FormatChoice::from_json(bad), trainer::DataError);
}
