#include "trainer/job/data_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "trainer/data/record_source.h"
#include "trainer/data/source.h"
#include "trainer/util/error.h"

namespace trainer::train {

data::Listing list_split(const config::DataSpec& spec, const std::string& split,
                         const std::vector<std::string>& class_names,
                         const data::ListOptions& list) {
  if (split != "train" && split != "validation") {
    throw UsageError("--split: expected train|validation, got '" + split + "'");
  }
  if (spec.validation_split > 0) {  // both splits are parts of data.train
    data::Listing all = data::list_source(spec.train, "data.train", class_names, list);
    if (all.is_records()) {
      throw ConfigError(
          "data.validation_split: holds out examples of an image listing (imagefolder or csv); "
          "for tfrecord files give the validation files in data.validation.path");
    }
    const auto n = static_cast<int64_t>(all.examples.size());
    const std::vector<int64_t> held =
        data::held_out_positions(n, spec.validation_split, static_cast<uint64_t>(spec.seed));
    std::vector<bool> is_held(static_cast<size_t>(n), false);
    for (const int64_t p : held) is_held[static_cast<size_t>(p)] = true;
    const bool want_held = split == "validation";
    std::vector<data::Example> part;
    for (int64_t i = 0; i < n; ++i) {
      if (is_held[static_cast<size_t>(i)] == want_held)
        part.push_back(all.examples[static_cast<size_t>(i)]);
    }
    if (part.empty()) {
      throw ConfigError("data.validation_split: " + fmt::format("{}", spec.validation_split) +
                        " of the " + std::to_string(n) + " examples of " + all.origin +
                        " leaves no " + split + " examples");
    }
    all.origin = (want_held ? "data.validation (" : "data.train (") + std::to_string(part.size()) +
                 " of the " + std::to_string(n) + " examples of " + all.origin +
                 ", data.validation_split " + fmt::format("{}", spec.validation_split) + ")";
    all.examples = std::move(part);
    return all;
  }
  const config::SourceSpec& source = split == "train" ? spec.train : spec.validation;
  if (!source.enabled()) {
    throw ConfigError("data." + split + ".path: not set in the job spec, so there is no '" + split +
                      "' data to read");
  }
  return data::list_source(source, "data." + split, class_names, list);
}

data::ListOptions list_options_for(const std::string& job_dir) {
  data::ListOptions o;
  if (!job_dir.empty()) o.count_cache = job_dir + "/record_counts.json";
  return o;
}

void cache_record_counts(const DataPlan& plan, const data::ListOptions& list) {
  data::update_count_cache(list.count_cache, plan.train);
  if (plan.validation) data::update_count_cache(list.count_cache, *plan.validation);
}

DataPlan plan_data(const config::JobSpec& spec, const cluster::ClusterSpec& cluster,
                   const data::ListOptions& list, PlanFor use) {
  DataPlan plan;
  plan.train = list_split(spec.data, "train", spec.data.class_names, list);
  plan.class_names = plan.train.class_names;
  plan.num_classes = static_cast<int64_t>(plan.class_names.size());
  if (spec.model.num_classes != 0 && spec.model.num_classes != plan.num_classes) {
    throw ConfigError("model.num_classes: " + std::to_string(spec.model.num_classes) + ", but " +
                      plan.train.origin + " has " + std::to_string(plan.num_classes) +
                      " classes (use `auto`)");
  }
  if (config::has_validation(spec.data)) {
    plan.validation = list_split(spec.data, "validation", plan.class_names, list);
  }
  // What needs every training label before the first record is read.
  if (plan.train.is_records()) {
    const char* why =
        " needs the training labels when listing (imagefolder or csv); the labels "
        "of tfrecord files are known only when the records are read";
    if (spec.data.sampler == "balanced")
      throw ConfigError(std::string("data.sampler: balanced") + why);
    if (spec.train.class_weights == std::vector<std::string>{"balanced"}) {
      throw ConfigError(std::string("train.class_weights: balanced") + why +
                        ": give the weights as a list [w0, w1, ...]");
    }
  }
  const bool weights_listed = spec.train.class_weights != std::vector<std::string>{"none"} &&
                              spec.train.class_weights != std::vector<std::string>{"balanced"};
  if (weights_listed && static_cast<int64_t>(spec.train.class_weights.size()) != plan.num_classes) {
    throw ConfigError("train.class_weights: " + std::to_string(spec.train.class_weights.size()) +
                      " weights, but " + plan.train.origin + " has " +
                      std::to_string(plan.num_classes) + " classes (one weight per class)");
  }
  plan.worker = std::max(cluster.rank, 0);
  plan.num_workers = std::max(cluster.world_size, 1);
  if (use == PlanFor::kListingOnly) return plan;
  const int64_t batch = spec.train.per_replica_batch_size;
  plan.global_batch_size = batch * plan.num_workers;
  plan.shard = data::plan_shards(data::files_of(plan.train), spec.data.shard_policy, plan.worker,
                                 plan.num_workers, batch, "data.train");
  plan.steps_per_epoch = data::agreed_steps_per_epoch(plan.shard, batch);
  if (plan.steps_per_epoch == 0) {
    throw ConfigError(
        "train.per_replica_batch_size: " + std::to_string(batch) + " is more than the " +
        std::to_string(*std::min_element(plan.shard.examples_per_worker.begin(),
                                         plan.shard.examples_per_worker.end())) +
        " examples of the smallest worker's share of " + plan.train.origin +
        " (every step needs a full batch on every worker; " + plan.shard.reason + ")");
  }
  // train.ema: an update period longer than an epoch would leave the average at the first batch
  // of each epoch (torchvision counts the period within an epoch).
  if (spec.train.ema.decay > 0 && spec.train.ema.every_steps > plan.steps_per_epoch) {
    throw ConfigError("train.ema.every_steps: " + std::to_string(spec.train.ema.every_steps) +
                      " is more than the " + std::to_string(plan.steps_per_epoch) +
                      " steps of an epoch (the average is updated every N batches of an epoch); "
                      "use at most " +
                      std::to_string(plan.steps_per_epoch));
  }
  return plan;
}

namespace {
data::LoaderOptions base_options(const config::DataSpec& data, const config::TrainSpec& train,
                                 int decode_threads) {
  data::LoaderOptions o;
  o.preprocess.image_size = data.image_size;
  o.preprocess.train = true;
  o.preprocess.horizontal_flip = data.augment.horizontal_flip;
  o.preprocess.random_resized_crop = data.augment.random_resized_crop;
  o.preprocess.crop_scale_min = data.augment.crop_scale_min;
  o.preprocess.reduced_decode = data.reduced_decode;
  const config::AugmentSpec& a = data.augment;
  o.preprocess.vertical_flip = a.vertical_flip;
  o.preprocess.rotate90 = a.rotate90;
  o.preprocess.rotate_degrees = a.rotate_degrees;
  o.preprocess.color_jitter = {a.color_jitter.brightness, a.color_jitter.contrast,
                               a.color_jitter.saturation, a.color_jitter.hue};
  o.preprocess.policy = a.policy;
  o.preprocess.magnitude = a.magnitude;
  o.preprocess.num_ops = a.num_ops;
  o.preprocess.random_erasing = a.random_erasing;
  o.preprocess.normalize = data.normalize;
  o.preprocess.interpolation = data.interpolation;
  o.preprocess.eval_resize = data.eval_resize;
  o.preprocess.eval_resize_size = data.eval_resize_size;
  o.preprocess.eval_crop_size = data.eval_crop_size;
  o.cache = data.cache == "memory";
  o.read_ahead = data.shuffle_buffer;
  o.batch_size = train.per_replica_batch_size;
  o.shuffle = data.shuffle;
  o.drop_last = true;
  o.seed = static_cast<uint64_t>(data.seed);
  o.num_workers = decode_threads;
  o.prefetch_batches = data.prefetch_batches;
  o.skip_corrupt = data.on_corrupt == "skip";
  return o;
}
}  // namespace

data::PreprocessOptions eval_preprocess(const config::DataSpec& data) {
  data::PreprocessOptions p = base_options(data, config::TrainSpec{}, 1).preprocess;
  p.train = false;
  return p;
}

data::LoaderOptions train_loader_options(const config::DataSpec& data,
                                         const config::TrainSpec& train, const DataPlan& plan,
                                         int decode_threads) {
  data::LoaderOptions o = base_options(data, train, decode_threads);
  o.num_classes = plan.num_classes;
  if (plan.train.is_records()) {
    o.record_format = plan.train.record_format;
    o.open_files = std::max(16, data.interleave + 1);
    data::use_record_order(o, data::files_of(plan.train), plan.shard,
                           data::RecordOrderOptions{o.seed, data.shuffle, data.interleave,
                                                    static_cast<int64_t>(data.shuffle_buffer)});
  } else if (data.sampler == "balanced") {
    std::vector<int64_t> labels;
    for (const auto& e : plan.train.examples) labels.push_back(e.label);
    o.order = [labels = std::move(labels), seed = o.seed, worker = plan.worker,
               workers = plan.num_workers,
               draws = plan.steps_per_epoch * train.per_replica_batch_size](int64_t epoch) {
      return data::balanced_epoch_order(labels, seed, epoch, worker, workers, draws);
    };
  } else if (plan.num_workers > 1) {
    const auto n = static_cast<int64_t>(plan.train.examples.size());
    o.order = [shard = plan.shard, n, seed = o.seed, shuffle = o.shuffle](int64_t epoch) {
      return data::worker_epoch_order(shard, n, seed, epoch, shuffle, shard.worker,
                                      shard.num_workers);
    };
  }
  o.max_batches = plan.steps_per_epoch;
  return o;
}

std::vector<int64_t> label_counts(const data::Listing& listing, int64_t num_classes) {
  if (listing.is_records()) return {};
  std::vector<int64_t> counts(static_cast<size_t>(num_classes), 0);
  for (const auto& e : listing.examples) {
    if (e.label >= 0 && e.label < num_classes) ++counts[static_cast<size_t>(e.label)];
  }
  return counts;
}

std::unique_ptr<data::Loader> make_eval_loader(const config::DataSpec& data,
                                               const data::Listing& listing,
                                               const EvalReading& reading) {
  const auto num_examples = static_cast<int64_t>(listing.examples.size());
  data::LoaderOptions o = base_options(data, config::TrainSpec{}, reading.decode_threads);
  o.record_format = listing.record_format;
  o.num_classes = reading.num_classes;
  o.preprocess = eval_preprocess(data);
  if (reading.model) {
    o.preprocess = inference_preprocess(*reading.model);
    o.cache = false;  // one pass
  }
  o.batch_size = reading.batch_size;
  o.shuffle = false;
  o.drop_last = false;
  if (reading.num_workers > 1) {
    o.order = [positions = data::eval_shard(num_examples, reading.worker, reading.num_workers)](
                  int64_t) { return positions; };
  }
  return std::make_unique<data::Loader>(listing.examples, std::move(o));
}

nlohmann::json to_json(const DataPlan& plan) {
  nlohmann::json j = {{"num_examples", plan.train.examples.size()},
                      {"num_classes", plan.num_classes},
                      {"class_names", plan.class_names},
                      {"global_batch_size", plan.global_batch_size},
                      {"steps_per_epoch", plan.steps_per_epoch}};
  j["validation_examples"] = plan.validation ? plan.validation->examples.size() : 0;
  j["shard_policy"] = plan.shard.policy_requested;
  j["shard_policy_effective"] = plan.shard.policy_effective;
  j["shard_reason"] = plan.shard.reason;
  j["files_this_worker"] = plan.shard.files_this_worker.size();
  // Every worker's share (the plan is a pure function of the listing): record sources list the
  // files each worker reads; image sources (one file per image) only count them.
  const std::vector<data::FileGroup> files = data::files_of(plan.train);
  const int64_t batch = plan.global_batch_size / std::max(plan.num_workers, 1);
  nlohmann::json workers = nlohmann::json::array();
  for (int r = 0; r < plan.num_workers; ++r) {
    const data::ShardPlan share =
        data::plan_shards(files, plan.shard.policy_requested, r, plan.num_workers, batch);
    nlohmann::json w = {{"worker", r},
                        {"examples", share.examples_this_worker},
                        {"files", share.files_this_worker.size()}};
    if (plan.train.is_records()) {
      nlohmann::json paths = nlohmann::json::array();
      for (int64_t f : share.files_this_worker) paths.push_back(files[static_cast<size_t>(f)].path);
      w["record_files"] = paths;
    }
    workers.push_back(w);
  }
  j["workers"] = workers;
  if (plan.train.is_records()) {
    j["record_files"] = plan.train.record_files.size();
    j["record_counts_from"] = plan.train.counts_from;
  }
  j["examples_this_worker"] = plan.shard.examples_this_worker;
  j["examples_per_worker"] = plan.shard.examples_per_worker;
  return j;
}

}  // namespace trainer::train
