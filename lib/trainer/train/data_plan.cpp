#include "trainer/train/data_plan.h"

#include <algorithm>

#include "trainer/data/source.h"
#include "trainer/util/error.h"

namespace trainer::train {

// A field added to one struct and not the other (and so not copied here) changes its size.
static_assert(sizeof(data::SourceOptions) == sizeof(config::SourceSpec),
              "data::SourceOptions and config::SourceSpec must hold the same fields");

data::SourceOptions source_options(const config::SourceSpec& source) {
  data::SourceOptions o;
  o.format = source.format;
  o.path = source.path;
  o.image_column = source.image_column;
  o.label_column = source.label_column;
  o.image_root = source.image_root;
  o.split = source.split;
  o.image_key = source.image_key;
  o.label_key = source.label_key;
  o.compression = source.compression;
  return o;
}

data::Listing list_split(const config::DataSpec& spec, const std::string& split,
                         const std::vector<std::string>& class_names,
                         const data::ListOptions& list) {
  if (split != "train" && split != "validation") {
    throw UsageError("--split: expected train|validation, got '" + split + "'");
  }
  const config::SourceSpec& source = split == "train" ? spec.train : spec.validation;
  if (!source.enabled()) {
    throw ConfigError("data." + split + ".path: not set in the job spec, so there is no '" + split +
                      "' data to read");
  }
  return data::list_source(source_options(source), "data." + split, class_names, list);
}

data::ListOptions list_options_for(const std::string& job_dir, bool chief) {
  data::ListOptions o;
  if (!job_dir.empty()) o.count_cache = job_dir + "/record_counts.json";
  o.write_count_cache = chief && !job_dir.empty();
  return o;
}

DataPlan plan_data(const config::JobSpec& spec, const cluster::ClusterSpec& cluster,
                   const data::ListOptions& list) {
  DataPlan plan;
  plan.train = list_split(spec.data, "train", spec.data.class_names, list);
  plan.class_names = plan.train.class_names;
  plan.num_classes = static_cast<int64_t>(plan.class_names.size());
  if (spec.model.num_classes != 0 && spec.model.num_classes != plan.num_classes) {
    throw ConfigError("model.num_classes: " + std::to_string(spec.model.num_classes) + ", but " +
                      plan.train.origin + " has " + std::to_string(plan.num_classes) +
                      " classes (use `auto`)");
  }
  if (spec.data.validation.enabled()) {
    plan.validation = list_split(spec.data, "validation", plan.class_names, list);
  }
  const int64_t batch = spec.train.per_replica_batch_size;
  plan.worker = std::max(cluster.rank, 0);
  plan.num_workers = std::max(cluster.world_size, 1);
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
  return plan;
}

namespace {
data::LoaderOptions base_options(const config::DataSpec& data, const config::TrainSpec& train) {
  data::LoaderOptions o;
  o.preprocess.image_size = data.image_size;
  o.preprocess.train = true;
  o.preprocess.horizontal_flip = data.augment.horizontal_flip;
  o.preprocess.random_resized_crop = data.augment.random_resized_crop;
  o.preprocess.crop_scale_min = data.augment.crop_scale_min;
  o.preprocess.reduced_decode = data.reduced_decode;
  o.cache = data.cache == "memory";
  o.read_ahead = data.shuffle_buffer;
  o.batch_size = train.per_replica_batch_size;
  o.shuffle = data.shuffle;
  o.drop_last = true;
  o.seed = static_cast<uint64_t>(data.seed);
  o.num_workers = data.num_workers;
  o.prefetch_batches = data.prefetch_batches;
  o.skip_corrupt = data.on_corrupt == "skip";
  return o;
}
}  // namespace

data::LoaderOptions train_loader_options(const config::DataSpec& data,
                                         const config::TrainSpec& train, const DataPlan& plan) {
  data::LoaderOptions o = base_options(data, train);
  o.num_classes = plan.num_classes;
  if (plan.train.is_records()) {
    o.record_format = plan.train.record_format;
    o.open_files = std::max(16, data.interleave + 1);
    data::use_record_order(o, data::files_of(plan.train), plan.shard,
                           data::RecordOrderOptions{o.seed, data.shuffle, data.interleave,
                                                    static_cast<int64_t>(data.shuffle_buffer)});
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

data::LoaderOptions eval_loader_options(const config::DataSpec& data, int64_t batch_size,
                                        const data::Listing& listing, int64_t num_classes,
                                        int worker, int num_workers) {
  const auto num_examples = static_cast<int64_t>(listing.examples.size());
  data::LoaderOptions o = base_options(data, config::TrainSpec{});
  o.record_format = listing.record_format;
  o.num_classes = num_classes;
  o.preprocess.train = false;
  o.batch_size = batch_size;
  o.shuffle = false;
  o.drop_last = false;
  if (num_workers > 1) {
    o.order = [positions = data::eval_shard(num_examples, worker, num_workers)](int64_t) {
      return positions;
    };
  }
  return o;
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
