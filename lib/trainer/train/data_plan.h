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

namespace trainer::train {

struct DataPlan {
  data::Listing train;
  std::optional<data::Listing> validation;
  std::vector<std::string> class_names;
  int64_t num_classes = 0;
  int64_t global_batch_size = 0;
  int64_t steps_per_epoch = 0;
};

// Lists the sources and derives the numbers. Throws DataError (unreadable sources) or
// ConfigError (model.num_classes disagrees with the data; fewer examples than one batch).
DataPlan plan_data(const config::JobSpec& spec, const cluster::ClusterSpec& cluster);

// Lists one source of the spec ("train" or "validation") with the given class names.
data::Listing list_split(const config::DataSpec& spec, const std::string& split,
                         const std::vector<std::string>& class_names);

data::LoaderOptions train_loader_options(const config::DataSpec& data,
                                         const config::TrainSpec& train);
data::LoaderOptions eval_loader_options(const config::DataSpec& data, int64_t batch_size);

// inspect's `data` object.
nlohmann::json to_json(const DataPlan& plan);

}  // namespace trainer::train
