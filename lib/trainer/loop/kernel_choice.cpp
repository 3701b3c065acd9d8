#include "trainer/loop/kernel_choice.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "trainer/loop/global_rng.h"
#include "trainer/model/net.h"
#include "trainer/util/cpu.h"
#include "trainer/util/error.h"
#include "trainer/util/fs.h"
#include "trainer/util/json.h"

namespace trainer::train {

namespace fs = std::filesystem;

namespace {

// Measuring stops after the first round that ends past this many seconds.
constexpr double kBudgetS = 2.0;
constexpr int kMaxRounds = 3;
// A candidate this much slower than the best after a round is not timed again.
constexpr double kDropRatio = 1.5;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Side branches whose convolutions do not set the main path's size.
bool side_branch(const std::string& name) {
  return name.find("downsample") != std::string::npos || ends_with(name, "fc1") ||
         ends_with(name, "fc2");
}

int64_t out_size(int64_t in, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation) {
  return (in + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1;
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// The CPU is named by its brand string and its vector units: a hypervisor may show the same
// brand ("AMD EPYC") for an AVX2-only and an AVX-512 machine, whose fastest formats differ.
std::string cache_key(const FormatRequest& r, const std::vector<Format>& candidates, int threads,
                      const util::CpuFeatures& cpu) {
  std::string labels;
  for (const auto& c : candidates) labels += (labels.empty() ? "" : ",") + c.label();
  std::string isa;
  for (const auto& f : cpu.flags()) isa += (isa.empty() ? "" : "+") + f;
  return fmt::format(
      "cpu={};isa={};torch={};threads={};arch={};head={};image={};batch={};candidates={}",
      cpu.model.empty() ? "unknown" : cpu.model, isa.empty() ? "none" : isa, TORCH_VERSION, threads,
      r.arch, r.head_hidden, r.image_size, std::min(r.batch, kMaxProbeBatch), labels);
}

std::optional<FormatChoice> read_cache(const std::string& file, const std::string& key) {
  if (file.empty() || !fs::exists(file)) return std::nullopt;
  try {
    const nlohmann::json doc = nlohmann::json::parse(util::read_file(file));
    const auto it = doc.find(key);
    if (it == doc.end()) return std::nullopt;
    FormatChoice c = FormatChoice::from_json(*it);
    c.source = "cached";
    c.spent_s = 0;
    return c;
  } catch (const std::exception& e) {
    spdlog::warn("kernel choice cache {} is unreadable, measuring again: {}", file, e.what());
    return std::nullopt;
  }
}

void write_cache(const std::string& file, const FormatChoice& choice) {
  if (file.empty()) return;
  try {
    nlohmann::json doc = nlohmann::json::object();
    if (fs::exists(file)) {
      try {
        doc = nlohmann::json::parse(util::read_file(file));
        if (!doc.is_object()) doc = nlohmann::json::object();
      } catch (const std::exception&) {
        doc = nlohmann::json::object();  // unreadable: replaced (read_cache warned)
      }
    }
    doc[choice.key] = choice.to_json();
    fs::create_directories(fs::path(file).parent_path());
    util::write_file_atomic(file, doc.dump(2) + "\n");
  } catch (const std::exception& e) {
    spdlog::warn("kernel choice not cached (the next start measures again): {}", e.what());
  }
}

// The tensors of one probe in one format: input (with grad) and weight.
struct ProbeTensors {
  torch::Tensor x, w;
  int64_t padding = 0, groups = 1;
};

ProbeTensors make_probe(const ConvProbe& p, const Format& f, int64_t batch) {
  const auto dtype = f.precision == "bf16" ? torch::kBFloat16 : torch::kFloat;
  const auto mf = f.channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  ProbeTensors t;
  t.x = torch::randn({batch, p.in_channels, p.size, p.size})
            .to(dtype)
            .contiguous(mf)
            .set_requires_grad(true);
  t.w = (torch::randn({p.out_channels, p.in_channels / p.groups, p.kernel, p.kernel}) * 0.05)
            .to(dtype)
            .contiguous(mf)
            .set_requires_grad(true);
  t.padding = p.kernel / 2;
  t.groups = p.groups;
  return t;
}

double time_pass(ProbeTensors& t) {
  t.x.mutable_grad() = torch::Tensor();
  t.w.mutable_grad() = torch::Tensor();
  const auto start = std::chrono::steady_clock::now();
  const torch::Tensor y = torch::conv2d(t.x, t.w, {}, 1, t.padding, 1, t.groups);
  y.backward(torch::ones_like(y));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string ms(double s) { return fmt::format("{:.0f} ms", 1e3 * s); }

}  // namespace

std::string ConvProbe::describe() const {
  return fmt::format("{} ({}x{}{}, {}->{} at {}x{})", name, kernel, kernel,
                     groups > 1 ? fmt::format(" {} groups", groups) : std::string(), in_channels,
                     out_channels, size, size);
}

std::vector<ConvProbe> probe_convolutions(const torch::nn::Module& model, int64_t image_size) {
  int64_t size = image_size;
  std::optional<ConvProbe> best3, best1;
  auto work = [](const ConvProbe& p) {
    return p.in_channels / p.groups * p.out_channels * p.kernel * p.kernel * p.size * p.size;
  };
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& name = item.key();
    if (const auto* pool = item.value()->as<torch::nn::MaxPool2d>()) {
      const auto& o = pool->options;
      size = out_size(size, (*o.kernel_size())[0], (*o.stride())[0], (*o.padding())[0],
                      (*o.dilation())[0]);
      continue;
    }
    const auto* conv = item.value()->as<torch::nn::Conv2d>();
    if (conv == nullptr || side_branch(name)) continue;
    const auto& o = conv->options;
    const int64_t k = (*o.kernel_size())[0];
    const int64_t stride = (*o.stride())[0];
    const int64_t padding = (k - 1) / 2;  // every convolution of these families pads so
    if (stride == 1 && (k == 3 || k == 1)) {
      ConvProbe p{name, o.in_channels(), o.out_channels(), k, o.groups(), size};
      auto& best = k == 3 ? best3 : best1;
      if (!best || work(p) > work(*best)) best = p;
    }
    size = out_size(size, k, stride, padding, (*o.dilation())[0]);
  }
  std::vector<ConvProbe> out;
  if (best3) out.push_back(*best3);
  if (best1) out.push_back(*best1);
  return out;
}

std::string Format::label() const {
  return precision + (channels_last ? " channels_last" : " NCHW");
}

bool cpu_can_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  return util::cpu_features().native_bf16();
#else
  return true;
#endif
}

std::vector<Format> format_candidates(const std::string& precision,
                                      const std::string& channels_last, bool can_bf16,
                                      std::string* excluded) {
  if (excluded != nullptr) excluded->clear();
  std::vector<std::string> precisions{precision};
  if (precision == "auto") {
    precisions = {"fp32"};
    if (can_bf16) {
      precisions.push_back("bf16");
    } else if (excluded != nullptr) {
      *excluded =
          "bf16 not timed: this CPU has no AVX512_BF16 or AMX-BF16, so LibTorch emulates it (about "
          "20x slower than fp32)";
    }
  }
  std::vector<bool> layouts{channels_last == "true"};
  if (channels_last == "auto") layouts = {false, true};
  std::vector<Format> out;
  for (const auto& p : precisions) {
    for (const bool cl : layouts) {
      if (p == "bf16" && !cl && layouts.size() == 2 && precisions.size() == 2) continue;
      out.push_back(Format{p, cl});
    }
  }
  return out;
}

std::string kernel_choice_cache_file() {
  std::string dir = env_or_empty("TRAINER_CACHE_DIR");
  if (dir.empty() && !env_or_empty("XDG_CACHE_HOME").empty()) {
    dir = env_or_empty("XDG_CACHE_HOME") + "/trainer";
  }
  if (dir.empty() && !env_or_empty("HOME").empty()) dir = env_or_empty("HOME") + "/.cache/trainer";
  return dir.empty() ? "" : dir + "/kernel_choice.json";
}

std::string FormatChoice::summary() const {
  if (source == "only") return format.label() + " (the only candidate)";
  std::string times;
  for (const auto& t : timings) {
    times += fmt::format("{}{} {}", times.empty() ? "" : ", ", t.format.label(),
                         t.rounds > 0 ? ms(t.seconds) : std::string("not timed"));
  }
  std::string shapes;
  for (const auto& p : probes) shapes += (shapes.empty() ? "" : " and ") + p.describe();
  std::string out = fmt::format(
      "{}, the fastest of {} (forward + backward of {}, batch {}, {} thread(s), on {})",
      format.label(), times, shapes, batch, threads, cpu_model.empty() ? "this CPU" : cpu_model);
  if (!excluded.empty()) out += "; " + excluded;
  if (source == "measured") out += fmt::format("; measured in {:.1f} s", spent_s);
  if (source == "cached") out += "; from the cache";
  if (source == "chief") out += "; the chief's choice";
  return out;
}

nlohmann::json FormatChoice::to_json() const {
  nlohmann::json t = nlohmann::json::array();
  for (const auto& x : timings) {
    t.push_back({{"precision", x.format.precision},
                 {"memory_format", x.format.channels_last ? "channels_last" : "nchw"},
                 {"ms", x.rounds > 0 ? nlohmann::json(1e3 * x.seconds) : nlohmann::json()},
                 {"rounds", x.rounds}});
  }
  nlohmann::json p = nlohmann::json::array();
  for (const auto& x : probes) {
    p.push_back({{"name", x.name},
                 {"in_channels", x.in_channels},
                 {"out_channels", x.out_channels},
                 {"kernel", x.kernel},
                 {"groups", x.groups},
                 {"size", x.size}});
  }
  return {{"precision", format.precision},
          {"memory_format", format.channels_last ? "channels_last" : "nchw"},
          {"source", source},
          {"candidates", t},
          {"probes", p},
          {"batch", batch},
          {"threads", threads},
          {"seconds", spent_s},
          {"excluded", excluded},
          {"cpu", cpu_model},
          {"key", key}};
}

FormatChoice FormatChoice::from_json(const nlohmann::json& j) {
  const std::string where = "kernel choice";
  if (!j.is_object()) throw DataError(where + ": expected an object, got " + j.dump());
  auto text = [&](const nlohmann::json& o, const std::string& k) {
    if (!o.contains(k) || !o[k].is_string()) {
      throw DataError(where + ": " + k + ": expected a string");
    }
    return o[k].get<std::string>();
  };
  auto format_of = [&](const nlohmann::json& o) {
    Format f{text(o, "precision"), text(o, "memory_format") == "channels_last"};
    if (f.precision != "fp32" && f.precision != "bf16") {
      throw DataError(where + ": precision: expected fp32 or bf16, got '" + f.precision + "'");
    }
    return f;
  };
  FormatChoice c;
  c.format = format_of(j);
  c.source = text(j, "source");
  c.excluded = text(j, "excluded");
  c.cpu_model = text(j, "cpu");
  c.key = text(j, "key");
  c.batch = util::json_int(j, "batch", 0, 1 << 20, where);
  c.threads = static_cast<int>(util::json_int(j, "threads", 0, 1 << 16, where));
  c.spent_s = j.value("seconds", 0.0);
  for (const auto& t : j.value("candidates", nlohmann::json::array())) {
    FormatTiming ft{format_of(t), 0, static_cast<int>(util::json_int(t, "rounds", 0, 100, where))};
    if (t.contains("ms") && t["ms"].is_number()) ft.seconds = t["ms"].get<double>() / 1e3;
    c.timings.push_back(ft);
  }
  for (const auto& p : j.value("probes", nlohmann::json::array())) {
    c.probes.push_back(ConvProbe{
        text(p, "name"), util::json_int(p, "in_channels", 1, 1 << 20, where),
        util::json_int(p, "out_channels", 1, 1 << 20, where),
        util::json_int(p, "kernel", 1, 64, where), util::json_int(p, "groups", 1, 1 << 20, where),
        util::json_int(p, "size", 1, 1 << 16, where)});
  }
  return c;
}

std::string cpu_description() {
  const util::CpuFeatures cpu = util::cpu_features();
  std::string flags;
  for (const auto& f : cpu.flags()) flags += (flags.empty() ? "" : ", ") + f;
  const std::string model = cpu.model.empty() ? "unknown CPU" : cpu.model;
  return flags.empty() ? model : model + " (" + flags + ")";
}

FormatChoice choose_cpu_format(const FormatRequest& request, const std::string& cache_file) {
  FormatChoice c;
  const std::vector<Format> candidates =
      format_candidates(request.precision, request.channels_last, cpu_can_bf16(), &c.excluded);
  if (candidates.size() == 1) {
    c.format = candidates[0];
    c.source = "only";
    return c;
  }
  c.threads = torch::get_num_threads();
  c.batch = std::min(request.batch, kMaxProbeBatch);
  const util::CpuFeatures cpu = util::cpu_features();
  c.cpu_model = cpu_description();
  c.key = cache_key(request, candidates, c.threads, cpu);
  if (auto cached = read_cache(cache_file, c.key)) return *cached;

  const auto start = std::chrono::steady_clock::now();
  const KeepGlobalRng keep;
  {
    torch::manual_seed(0);
    const model::Net net = model::make_net({request.arch, 1000, request.head_hidden});
    c.probes = probe_convolutions(*net, request.image_size);
  }
  if (c.probes.empty()) {
    throw Error(ErrorKind::kInternal,
                "kernel choice: no 3x3 or 1x1 convolution in " + request.arch);
  }
  std::vector<std::vector<ProbeTensors>> tensors;
  for (const auto& f : candidates) {
    c.timings.push_back(FormatTiming{f, 0, 0});
    tensors.emplace_back();
    for (const auto& p : c.probes) tensors.back().push_back(make_probe(p, f, c.batch));
  }
  // Alternating, so a slow spell of a shared machine falls on every candidate alike.
  for (auto& per_format : tensors) {
    for (auto& t : per_format) time_pass(t);  // warm-up: oneDNN builds its primitives
  }
  std::vector<bool> active(candidates.size(), true);
  for (int round = 0; round < kMaxRounds; ++round) {
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (!active[i]) continue;
      double s = 0;
      for (auto& t : tensors[i]) s += time_pass(t);
      auto& timing = c.timings[i];
      timing.seconds = timing.rounds == 0 ? s : std::min(timing.seconds, s);
      ++timing.rounds;
    }
    double best = 0;
    for (const auto& t : c.timings) {
      if (t.rounds > 0 && (best == 0 || t.seconds < best)) best = t.seconds;
    }
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (c.timings[i].seconds > kDropRatio * best) active[i] = false;
    }
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed > kBudgetS) break;
  }
  const auto fastest = std::min_element(
      c.timings.begin(), c.timings.end(),
      [](const FormatTiming& a, const FormatTiming& b) { return a.seconds < b.seconds; });
  c.format = fastest->format;
  c.source = "measured";
  c.spent_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  write_cache(cache_file, c);
  return c;
}

}  // namespace trainer::train
