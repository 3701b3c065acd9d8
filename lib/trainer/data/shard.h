// Sharding: which examples each worker of a synchronous data-parallel job trains on, and how
// many lock-step steps they all run per epoch. Pure functions of the listing, the policy, the
// rank and the world size, so every worker (and `inspect`) computes every worker's share without
// talking to a peer. No OpenCV, no c10d; thread-safe (plain values).
//
// Policies (data.shard_policy):
//  - file: each worker reads a disjoint set of files, balanced by example count (greedy: files by
//    example count descending, ties by lower file index, each to the currently lightest worker,
//    ties to the lower rank), fixed for the whole job; each worker shuffles its own examples every
//    epoch. Needs at least as many non-empty files as workers, else ConfigError.
//  - data: every epoch all workers compute the same global order (epoch_order(n, seed, epoch,
//    shuffle)) and worker r keeps positions r, r+N, r+2N, ...: each example once per epoch.
//  - off: every worker reads everything, in the single-worker order.
//  - auto: `file` when ALL of (else `data`; ShardPlan::reason says which rule decided):
//      (1) non-empty files >= workers;
//      (2) similar file sizes: the largest non-empty file holds at most 1.5x the examples of the
//          smallest non-empty one (kAutoMaxFileRatio);
//      (3) balanced workers: the file plan keeps at least 90% (kAutoMinStepShare) of the
//          lock-step steps per epoch that `data` would give (10 * file_steps >= 9 * data_steps).
//    ImageFolder and csv sources have one file per image, so auto is `file` whenever there are at
//    least as many images as workers.
//  - With one worker every policy is effectively `off` (reason says so): a 1-worker job trains in
//    exactly the order of a non-distributed run, whatever the policy.
// Lock-step: every worker runs agreed_steps_per_epoch() = min over workers of
// floor(examples_w / per_replica_batch) steps per epoch; the rest is dropped (dropped_summary()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/data/example.h"

namespace trainer::data {

inline constexpr double kAutoMaxFileRatio = 1.5;  // auto rule (2): largest / smallest file
inline constexpr int64_t kAutoMinStepShare = 90;  // auto rule (3): percent of data's steps

// The order of epoch `epoch`: 0..n-1, shuffled with mix_seed(seed, {epoch}) when shuffle (the
// loader's default order, and the single-worker order the shard policies start from).
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle);

// A unit a source reads: one image file (imagefolder, csv) or one record file holding many
// examples (TFRecord). `examples` are indices into Listing::examples, in the file's read order;
// across all groups every index 0..n-1 appears exactly once (empty groups are allowed).
struct FileGroup {
  std::string path;
  std::vector<int64_t> examples;
};

// Image sources: one group per example (its path), in listing order: group i holds example i.
// Record sources: one group per record file, holding its examples in record order.
std::vector<FileGroup> files_of(const Listing& listing);

struct ShardPlan {
  std::string policy_requested;  // as configured: auto|file|data|off
  std::string policy_effective;  // what runs: file|data|off (auto resolved; 1 worker -> off)
  std::string reason;            // one human line: why this policy (for the log and `inspect`)
  int worker = 0;                // the rank the plan was made for
  int num_workers = 1;           // world size
  int64_t total_examples = 0;    // examples over all files
  // file: this worker's file indices (into the FileGroup list), ascending; data/off: all files.
  std::vector<int64_t> files_this_worker;
  // file: this worker's example indices, file by file in files_this_worker order; else empty.
  std::vector<int64_t> file_examples;
  int64_t examples_this_worker = 0;          // examples this worker has per epoch
  std::vector<int64_t> examples_per_worker;  // the same for every rank (size num_workers)
};

// A digest (16 hex digits) of what `plan` assigns its worker: policy, rank, world size, example
// counts and, for `file`, the files and examples. Equal digests = the same shard, so a
// checkpoint's batch number names the same examples.
std::string shard_digest(const ShardPlan& plan);

// The plan for rank `worker` of `num_workers`. Throws ConfigError for an unknown policy, for
// `file` with fewer non-empty files than workers (naming data.shard_policy and `origin`), and
// for per_replica_batch < 1; Error(kInternal) for a rank out of range or groups whose examples
// are not exactly 0..n-1.
ShardPlan plan_shards(const std::vector<FileGroup>& files, const std::string& policy, int worker,
                      int num_workers, int64_t per_replica_batch,
                      const std::string& origin = "data.train");

// Steps every worker runs per epoch: min over workers of floor(examples_w / per_replica_batch).
int64_t agreed_steps_per_epoch(const ShardPlan& plan, int64_t per_replica_batch);

// One line: the agreed steps and, per worker, how many of its examples an epoch drops and why
// (the partial last batch, the lock-step cap). Workers beyond the first 8 are summarised.
std::string dropped_summary(const ShardPlan& plan, int64_t per_replica_batch);

// The example indices rank `worker` trains on in epoch `epoch`, in order (all of them; the
// caller caps at the agreed steps). data: positions worker, worker+N, ... of epoch_order(n, seed,
// epoch, shuffle); file: file_examples, shuffled (Fisher-Yates, random.h) with
// mix_seed(seed, {epoch, worker, kFileShuffleStream}) when shuffle; off: epoch_order(n, ...).
// worker, num_workers and num_examples must match the plan (Error kInternal otherwise).
std::vector<int64_t> worker_epoch_order(const ShardPlan& plan, int64_t num_examples, uint64_t seed,
                                        int64_t epoch, bool shuffle, int worker, int num_workers);
inline constexpr uint64_t kFileShuffleStream = 0x66696c6573686172ULL;  // "fileshar"

// data.sampler: balanced: epoch `epoch`'s global order of draws_per_worker x num_workers draws
// with replacement, example i drawn with probability proportional to 1 / (the number of examples
// of its label) (torch's WeightedRandomSampler with those weights: each class equally likely),
// from mix_seed(seed, {epoch, kBalancedStream}); worker w of N takes positions w, w+N, ...: exactly
// draws_per_worker each (the lock-step steps x the batch), so every rank runs the same steps. The
// same on every rank for a seed, whatever the thread count. Labels must be >= 0 (listed).
std::vector<int64_t> balanced_epoch_order(const std::vector<int64_t>& labels, uint64_t seed,
                                          int64_t epoch, int worker, int num_workers,
                                          int64_t draws_per_worker);
inline constexpr uint64_t kBalancedStream = 0x62616c616e636564ULL;  // "balanced"

// data.validation_split: the positions (ascending) of the round(n x fraction) examples held out
// of n as the validation set: the first of a Fisher-Yates permutation seeded with
// mix_seed(seed, {kHoldOutStream}). The same for a seed on every rank and in every run.
std::vector<int64_t> held_out_positions(int64_t n, double fraction, uint64_t seed);
inline constexpr uint64_t kHoldOutStream = 0x686f6c646f757476ULL;  // "holdoutv"

// Distributed exact evaluation: positions worker, worker+N, ... of 0..num_examples-1. Across the
// cluster every example is evaluated exactly once (no padding, no duplicates); sum the counts.
std::vector<int64_t> eval_shard(int64_t num_examples, int worker, int num_workers);

}  // namespace trainer::data
