// Op profile (not a test; scripts/bench/op_profile.sh runs it): where the CPU time of the
// trainer's training step goes, operator by operator, where perf cannot sample (a sandbox
// without hardware counters). It builds the trainer's own model (model::make_net) and optimizer
// (train::make_optimizer) and times forward, loss, backward and optimizer step on a fixed
// random batch, with a RecordFunction observer on the calling thread: every ATen operator,
// autograd node and the trainer's own kernels (RECORD_FUNCTION "trainer::...") in the steps
// after the warm-up, as self time (the time inside an op, less the ops it called) and calls per
// step. Time no op accounts for (dispatch and glue between ops) is reported as "(outside ops)".
// The input pipeline is not in it (the trainer decodes on other threads): this is the compute.
//
//   op_profile_bench --arch resnet50 --image 224 --batch 16 --threads 2 --steps 4 --warmup 2
//                    [--optimizer adam] [--channels-last] [--bf16]
// prints one JSON object: {"step_s": [..], "phases": {name: [s per step]}, "ops": {name:
// {"self_s": total, "calls": n}}, "steps": n, ...}. --bf16: forward and loss under bf16 autocast,
// as the trainer's step runs `precision: bf16` (the weights and the optimizer stay float32).
// TRAINER_ATEN_KERNELS=1 profiles the same
// step with ATen's kernels in place of the trainer's own (the "before" of docs/performance.md).
#include <ATen/record_function.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "trainer/config/job_spec.h"
#include "trainer/loop/optimizer.h"
#include "trainer/loop/runtime.h"
#include "trainer/model/net.h"
#include "trainer/util/kernel_switch.h"
#include "trainer/util/memory.h"
#include "trainer/util/torch_compat.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Frame {
  Clock::time_point start;
  double children_s = 0;
};

struct Totals {
  double self_s = 0;
  int64_t calls = 0;
};

// Only the thread that runs the step records (the intra-op pool's threads run inside an op that
// is already timed); recording is on only for the measured steps.
thread_local bool tl_observed = false;
thread_local std::vector<Frame> tl_stack;
bool g_recording = false;
double g_top_level_s = 0;  // the sum of the outermost ops' times while recording
std::map<std::string, Totals> g_ops;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction&) {
  if (tl_observed) tl_stack.push_back({Clock::now(), 0});
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (!tl_observed || tl_stack.empty()) return;
  const Frame frame = tl_stack.back();
  tl_stack.pop_back();
  const double total = std::chrono::duration<double>(Clock::now() - frame.start).count();
  if (!tl_stack.empty()) {
    tl_stack.back().children_s += total;
  } else if (g_recording) {
    g_top_level_s += total;
  }
  if (!g_recording) return;
  Totals& t = g_ops[fn.name()];
  t.self_s += total - frame.children_s;
  ++t.calls;
}

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "op_profile_bench: " << why
            << "\nusage: op_profile_bench [--arch A] [--image N] [--batch N] [--threads N] "
               "[--steps N] [--warmup N] [--optimizer adam|adamw|sgd] [--channels-last] "
               "[--bf16]\n";
  std::exit(2);
}

int64_t positive(const std::string& flag, const char* value) {
  char* end = nullptr;
  const long long v = std::strtoll(value, &end, 10);
  if (end == value || *end != '\0' || v <= 0) usage(flag + " wants a positive integer");
  return v;
}

}  // namespace

int run(int argc, char** argv) {
  std::string arch = "resnet50", optimizer = "adam";
  int64_t image = 224, batch = 16, threads = 2, steps = 4, warmup = 2;
  bool channels_last = false, bf16 = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--channels-last" || a == "--bf16") {
      (a == "--bf16" ? bf16 : channels_last) = true;
      continue;
    }
    if (i + 1 >= argc) usage(a + " wants a value");
    const char* v = argv[++i];
    if (a == "--arch")
      arch = v;
    else if (a == "--optimizer")
      optimizer = v;
    else if (a == "--image")
      image = positive(a, v);
    else if (a == "--batch")
      batch = positive(a, v);
    else if (a == "--threads")
      threads = positive(a, v);
    else if (a == "--steps")
      steps = positive(a, v);
    else if (a == "--warmup")
      warmup = positive(a, v);
    else
      usage("unknown flag " + a);
  }
  const trainer::util::AllocatorInfo allocator = trainer::util::configure_allocator();
  torch::set_num_threads(static_cast<int>(threads));
  torch::manual_seed(0);
  trainer::model::NetOptions options;
  options.arch = arch;
  options.num_classes = 5;
  trainer::model::Net net = trainer::model::make_net(options);
  net->train();
  trainer::train::ModelSettings settings;  // the CPU, fp32
  settings.channels_last = channels_last;
  trainer::train::place_model(net, settings);  // the trainer's layout change
  const auto format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  trainer::config::OptimizerSpec spec;
  spec.name = optimizer;
  auto opt = trainer::train::make_optimizer(spec, net->parameters());
  const torch::Tensor x = torch::randn({batch, 3, image, image}).contiguous(format);
  const torch::Tensor y = torch::randint(0, options.num_classes, {batch});

  at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                                     at::RecordScope::USER_SCOPE}));
  tl_observed = true;
  std::vector<double> step_s;
  std::map<std::string, std::vector<double>> phases;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    g_recording = s >= warmup;
    const auto t0 = Clock::now();
    for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();  // as the trainer
    const auto t1 = Clock::now();
    torch::Tensor loss;
    {
      trainer::compat::AutocastGuard autocast(bf16);
      const torch::Tensor logits = net->forward(x);
      // In float32 whatever autocast chose for the logits (as the trainer's loss).
      loss = torch::nn::functional::cross_entropy(logits.to(torch::kFloat), y);
    }
    const auto t2 = Clock::now();
    loss.backward();
    const auto t3 = Clock::now();
    opt->step();
    const auto t4 = Clock::now();
    if (!g_recording) continue;
    auto d = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double>(b - a).count();
    };
    step_s.push_back(d(t0, t4));
    phases["reset gradients"].push_back(d(t0, t1));
    phases["forward + loss"].push_back(d(t1, t2));
    phases["backward"].push_back(d(t2, t3));
    phases["optimizer step"].push_back(d(t3, t4));
  }
  tl_observed = false;
  double total_s = 0;
  for (double v : step_s) total_s += v;
  nlohmann::json out;
  out["arch"] = arch;
  out["image"] = image;
  out["batch"] = batch;
  out["threads"] = threads;
  out["steps"] = steps;
  out["channels_last"] = channels_last;
  out["precision"] = bf16 ? "bf16" : "fp32";
  out["optimizer"] = optimizer;
  out["aten_kernels_only"] = trainer::util::aten_kernels_only();
  out["torch"] = TORCH_VERSION;
  out["allocator"] = allocator.name + " (" + allocator.settings + ")";
  out["step_s"] = step_s;
  out["phases"] = phases;
  for (const auto& [name, t] : g_ops) out["ops"][name] = {{"self_s", t.self_s}, {"calls", t.calls}};
  out["ops"]["(outside ops)"] = {{"self_s", total_s - g_top_level_s}, {"calls", 0}};
  std::cout << out.dump() << "\n";
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // an unknown arch or optimizer, a LibTorch error
    std::cerr << "op_profile_bench: " << e.what() << "\n";
    return 1;
  }
}
