// Shared fixture text for the integration tests: a tiny, fast job on a generated dataset.
#pragma once

#include <string>

namespace trainer::testing {

// resnet18 at 32x32 on data/train + data/validation (relative to the test's dir), one thread.
inline std::string tiny_job_yaml(int epochs = 2) {
  return R"(model:
  arch: resnet18
data:
  train:
    path: data/train
  validation:
    path: data/validation
  image_size: 32
  shuffle: true
  seed: 3
  num_workers: 2
train:
  epochs: )" +
         std::to_string(epochs) + R"(
  per_replica_batch_size: 10
  optimizer:
    name: adam
    learning_rate: 0.002
  threads: 1
  seed: 7
checkpoint:
  keep: 3
logging:
  every_steps: 1
)";
}

}  // namespace trainer::testing
