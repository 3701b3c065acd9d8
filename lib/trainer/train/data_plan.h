// The data plan of a job: what the sources list, the class names and count, the batch numbers
// (global batch, steps per epoch), and the loader options for training and evaluation derived
// from the spec. Computed once after validation and logged once. Pure given the file system.
#pragma once

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

// The data module's options for one source of the spec (a field-by-field copy).
data::SourceOptions source_options(const config::SourceSpec& source);

// Lists the sources and derives the numbers. Throws DataError (unreadable sources) or
// ConfigError (model.num_classes disagrees with the data; fewer examples than one batch).
// `list` says where tfrecord record counts are cached (the job dir; only the chief writes it).
DataPlan plan_data(const config::JobSpec& spec, const cluster::ClusterSpec& cluster,
                   const data::ListOptions& list = {});

// Lists one source of the spec ("train" or "validation") with the given class names.
data::Listing list_split(const config::DataSpec& spec, const std::string& split,
                         const std::vector<std::string>& class_names,
                         const data::ListOptions& list = {});

// The count cache of a job dir: <job dir>/record_counts.json, written by the chief.
data::ListOptions list_options_for(const std::string& job_dir, bool chief);

// Training batches of this worker's shard, `plan.steps_per_epoch` of them each epoch.
data::LoaderOptions train_loader_options(const config::DataSpec& data,
                                         const config::TrainSpec& train, const DataPlan& plan);
// Evaluation batches of `listing` in listing order: all of it, or with num_workers > 1 this
// worker's positions worker, worker+N, ... (each example evaluated once across the cluster).
data::LoaderOptions eval_loader_options(const config::DataSpec& data, int64_t batch_size,
                                        const data::Listing& listing, int64_t num_classes,
                                        int worker = 0, int num_workers = 1);

// inspect's `data` object.
nlohmann::json to_json(const DataPlan& plan);

}  // namespace trainer::train
