// The tf.data-style epoch order of a record source: each worker shuffles the order of its record
// files every epoch, reads `interleave` files at once (round robin, one record each; a finished
// file's slot takes the next file, as tf.data's interleave with block_length 1) into a shuffle
// buffer of `shuffle_buffer` examples (tf.data's shuffle: fill, then emit a random slot and
// refill it). Both are computed on example indices from the record counts alone, so every
// worker knows the order without reading a record, and a seed reproduces it exactly.
// `read` is the order records are read in (per file ascending); `emit` the order they train in.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "trainer/data/random.h"
#include "trainer/data/shard.h"

namespace trainer::data {

struct RecordOrderOptions {
  uint64_t seed = 0;
  bool shuffle = true;  // false: files in listing order, read one after another, no buffer
  int interleave = 4;
  int64_t shuffle_buffer = 1000;
};

struct EpochOrder {
  std::vector<int64_t> read;  // example indices in read order
  std::vector<int64_t> emit;  // the same indices in training order
};

// Interleaves the example lists of `files` (each in file order), cycle_length >= 1.
std::vector<int64_t> interleave(const std::vector<std::vector<int64_t>>& files, int cycle_length);

// tf.data's shuffle buffer over `input`, buffer_size >= 1 (1 = no shuffling).
std::vector<int64_t> shuffle_buffer(const std::vector<int64_t>& input, int64_t buffer_size,
                                    Rng& rng);

// The epoch order of rank plan.worker over the record files `files` (files_of a record
// listing), for the plan's effective policy:
//  - file: the worker's files, shuffled with mix_seed(seed, {epoch, worker, kRecordFileStream}),
//    interleaved, then the buffer with mix_seed(seed, {epoch, worker, kRecordBufferStream});
//  - off: the same over all files with stream "worker" 0 (a 1-worker job);
//  - data: every worker computes the `off` order of all files and keeps positions worker,
//    worker+N, ... of `emit`; `read` is the global read order restricted to those examples
//    (every worker scans all files and keeps its positions, as tf.data's DATA sharding).
EpochOrder record_epoch_order(const std::vector<FileGroup>& files, const ShardPlan& plan,
                              const RecordOrderOptions& options, int64_t epoch);

inline constexpr uint64_t kRecordFileStream = 0x7265636f72646669ULL;    // "recordfi"
inline constexpr uint64_t kRecordBufferStream = 0x7265636f72646275ULL;  // "recordbu"

}  // namespace trainer::data
