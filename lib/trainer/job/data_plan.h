// The data plan of a job: what the sources list, the class names and count, the batch numbers
// (global batch, steps per epoch), and the loader options for training and evaluation derived
// from the spec. Computed once after validation and logged once. Pure given the file system.
#pragma once

#include <memory>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/cluster/cluster_spec.h"
#include "trainer/config/job_spec.h"
#include "trainer/data/example.h"
#include "trainer/data/loader.h"
#include "trainer/data/shard.h"
#include "trainer/data/source.h"
#include "trainer/data/source_options.h"
#include "trainer/loop/model_dir.h"

namespace trainer::train {

struct DataPlan {
  data::Listing train;
  std::optional<data::Listing> validation;
  std::vector<std::string> class_names;
  int64_t num_classes = 0;
  int64_t global_batch_size = 0;
  int64_t steps_per_epoch = 0;  // lock-step: the same on every worker
  data::ShardPlan shard;        // this worker's part of data.train
  int worker = 0;               // the rank the plan is for (an evaluator plans as rank 0)
  int num_workers = 1;
};

// What the plan is for: training (the shard, the batch numbers and their checks), or reading
// the listings alone (preview of the validation split), where the training batch is no concern.
enum class PlanFor { kTraining, kListingOnly };

// Lists the sources and derives the numbers. Throws DataError (unreadable sources) or
// ConfigError (model.num_classes disagrees with the data; for training, fewer examples than one
// batch). `list` says where tfrecord record counts are cached (the job dir), read here, never
// written. With PlanFor::kListingOnly the batch numbers stay 0 and the shard empty.
DataPlan plan_data(const config::JobSpec& spec, const cluster::ClusterSpec& cluster,
                   const data::ListOptions& list = {}, PlanFor use = PlanFor::kTraining);

// Examples per class of an image listing (imagefolder, csv); {} for record sources, whose labels
// are known only when read (train.class_weights: balanced needs them).
std::vector<int64_t> label_counts(const data::Listing& listing, int64_t num_classes);

// Lists one source of the spec ("train" or "validation") with the given class names.
data::Listing list_split(const config::DataSpec& spec, const std::string& split,
                         const std::vector<std::string>& class_names,
                         const data::ListOptions& list = {});

// The count cache of a job dir: <job dir>/record_counts.json.
data::ListOptions list_options_for(const std::string& job_dir);
// Writes what plan_data scanned into list.count_cache: the chief's, through chief_writes().
void cache_record_counts(const DataPlan& plan, const data::ListOptions& list);

// Training batches of this worker's shard, `plan.steps_per_epoch` of them each epoch, decoded by
// `decode_threads` (the thread budget's: data.num_workers resolved; the spec is never rewritten).
data::LoaderOptions train_loader_options(const config::DataSpec& data,
                                         const config::TrainSpec& train, const DataPlan& plan,
                                         int decode_threads);

// The preprocessing of the spec as an evaluation applies it (train = false: the eval resize and
// crop, no augmentation), without a training plan: what make_eval_loader's batches get.
data::PreprocessOptions eval_preprocess(const config::DataSpec& data);

// How an evaluation pass reads its listing (validation in training, the sidecar evaluator,
// `trainer evaluate`).
struct EvalReading {
  int64_t batch_size = 32;
  int64_t num_classes = 0;
  int decode_threads = 1;  // the thread budget's decode threads
  // With num_workers > 1, this worker's positions worker, worker+N, ... (each example evaluated
  // once across the cluster); else all of it, in listing order.
  int worker = 0;
  int num_workers = 1;
  // Preprocess as this saved model was trained (its image size and JPEG decode), in one pass
  // without a cache; null: as `data` says.
  const ModelInfo* model = nullptr;
};

// The one loader of an evaluation pass over `listing`: data.* preprocessing without
// augmentation, no shuffling, the last batch kept.
std::unique_ptr<data::Loader> make_eval_loader(const config::DataSpec& data,
                                               const data::Listing& listing,
                                               const EvalReading& reading);

// inspect's `data` object.
nlohmann::json to_json(const DataPlan& plan);

}  // namespace trainer::train
