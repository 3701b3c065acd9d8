// The loader turns a list of examples into batches: a per-epoch order (shuffled from seed and
// epoch, or given by LoaderOptions::order, e.g. a worker's shard), decoding and augmentation by
// a pool of decode threads that prefetch while the model trains, and batching in order. Example
// i of epoch e is augmented with the seed mix_seed(seed, {e, i}) (i: its index in the examples
// vector), so the batches are identical whatever the number of decode threads or the order.
// Record examples (Example::record >= 0, a tfrecord listing) are read by a RecordFeed in the
// epoch's read order and parsed (tf.train.Example) on the decode threads, which take the label
// from the record. With `cache`, each example's decoded, resized uint8 image (and label) is kept
// after its first use, so later epochs skip reading and decoding it.
// Not thread-safe: one consumer calls start_epoch()/next(); the pool is internal.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/data/example.h"
#include "trainer/data/image.h"
#include "trainer/data/record_order.h"
#include "trainer/data/shard.h"

namespace trainer::data {

struct LoaderOptions {
  PreprocessOptions preprocess;
  int64_t batch_size = 32;
  bool shuffle = false;
  bool drop_last = false;  // true for training: every batch is full
  uint64_t seed = 0;
  int num_workers = 2;        // decode threads (>= 1)
  int prefetch_batches = 2;   // batches kept ready ahead of the consumer (>= 1)
  bool skip_corrupt = false;  // false: a bad image throws DataError; true: dropped, counted
  // The example indices of epoch e, in order (e.g. worker_epoch_order of shard.h); empty =
  // epoch_order(n, seed, e, shuffle). When set, `shuffle` is not used. It must return the same
  // number of indices every epoch (called once at construction with epoch 0 to learn it), each in
  // [0, n); an index may repeat. Called on the consumer's thread by the constructor and
  // start_epoch().
  std::function<std::vector<int64_t>(int64_t epoch)> order;
  // Cap on batches per epoch (the agreed lock-step steps of a multi-worker job), applied after
  // drop_last; -1 = no cap.
  int64_t max_batches = -1;
  // Record sources: the order records are read in for epoch e (the indices of order(e), each
  // once, each file's records ascending; e.g. record_epoch_order's `read`); empty = order(e).
  // For record sources order(e) must not repeat an index (Error kInternal otherwise).
  std::function<std::vector<int64_t>(int64_t epoch)> read_order;
  RecordFormat record_format;  // keys and compression of the records
  int64_t read_ahead = 1000;   // records the reader may keep ahead (the shuffle buffer)
  int open_files = 16;         // record files kept open (more than data.interleave)
  int64_t num_classes = 0;     // > 0: a label outside [0, num_classes) is a data error
  bool cache = false;          // data.cache: memory
  // Batches in page-locked host memory, so that a copy to a CUDA device runs asynchronously
  // (DataLoader's pin_memory). Only for a CUDA run: a CPU-only LibTorch cannot pin.
  bool pin_memory = false;
};

struct Batch {
  torch::Tensor images;          // [B, S, S, 3] uint8 RGB (train::prepare_input normalises)
  torch::Tensor labels;          // [B] int64
  std::vector<int64_t> indices;  // positions in the examples vector, in batch order
  int64_t index = 0;             // batch number within the epoch
  int64_t skipped = 0;           // corrupt examples dropped from this batch
};

// Sets `order` and `read_order` of `o` to worker plan.worker's record_epoch_order over `files`
// (files_of a record listing), computed once per epoch for both.
void use_record_order(LoaderOptions& o, std::vector<FileGroup> files, const ShardPlan& plan,
                      const RecordOrderOptions& ro);

class Loader {
 public:
  Loader(std::vector<Example> examples, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  int64_t num_examples() const;  // the examples vector's size
  int64_t epoch_size() const;    // indices in one epoch's order (num_examples() by default)
  // floor (drop_last) or ceil of epoch_size() / batch_size, then at most max_batches.
  int64_t batches_per_epoch() const;

  // Starts (or restarts) epoch `epoch` at batch `first_batch` (resume mid-epoch).
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  // The next batch of the current epoch, nullopt after the last. A batch whose examples were
  // all corrupt (skip mode) comes back with 0 rows. Rethrows a decode thread's DataError (the
  // first by position in the failing batch, after the batches before it came back); the epoch
  // is then abandoned and next() returns nullopt until start_epoch(). Calling next() before
  // any start_epoch() is an Error (kInternal).
  std::optional<Batch> next();

  int64_t skipped_total() const;                   // corrupt examples skipped so far
  std::vector<std::string> skipped_paths() const;  // the first 100 of them
  int64_t cached_examples() const;                 // images in the cache (data.cache: memory)
  int64_t cached_bytes() const;                    // their size

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainer::data
