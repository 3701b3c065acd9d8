#include "trainer/data/shard.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <queue>
#include <sstream>
#include <utility>

#include "trainer/data/random.h"
#include "trainer/util/error.h"
#include "trainer/util/hash.h"
#include "trainer/util/rng.h"

namespace trainer::data {

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  std::vector<int64_t> order(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (shuffle) {
    Rng rng(util::mix_seed(seed, {static_cast<uint64_t>(epoch)}));
    shuffle_in_place(order, rng);
  }
  return order;
}

namespace {

constexpr size_t kMaxWorkersListed = 8;  // dropped_summary lists these, then summarises

std::string plural(int64_t n, const std::string& word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

void check_rank(const char* where, int worker, int num_workers) {
  if (num_workers < 1 || worker < 0 || worker >= num_workers) {
    throw Error(ErrorKind::kInternal, std::string(where) + ": worker " + std::to_string(worker) +
                                          " outside [0, " + std::to_string(num_workers) + ")");
  }
}

void check_batch(int64_t per_replica_batch) {
  if (per_replica_batch < 1) {
    throw ConfigError("train.per_replica_batch_size: expected >= 1, got " +
                      std::to_string(per_replica_batch));
  }
}

// Examples held by rank r when every rank keeps positions r, r+N, ... of n.
int64_t strided_count(int64_t n, int r, int num_workers) {
  return n > r ? (n - r + num_workers - 1) / num_workers : 0;
}

// The greedy balanced assignment: owner[f] = the rank that reads file f.
std::vector<int> assign_files(const std::vector<FileGroup>& files, int num_workers) {
  std::vector<int64_t> by_size(files.size());
  std::iota(by_size.begin(), by_size.end(), int64_t{0});
  const auto size_of = [&](int64_t f) {
    return static_cast<int64_t>(files[static_cast<size_t>(f)].examples.size());
  };
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](int64_t a, int64_t b) { return size_of(a) > size_of(b); });
  // Min-heap of (load, rank): the lightest worker first, ties to the lower rank.
  using Load = std::pair<int64_t, int>;
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> heap;
  for (int r = 0; r < num_workers; ++r) heap.emplace(0, r);
  std::vector<int> owner(files.size(), 0);
  for (int64_t f : by_size) {
    Load lightest = heap.top();
    heap.pop();
    owner[static_cast<size_t>(f)] = lightest.second;
    lightest.first += size_of(f);
    heap.push(lightest);
  }
  return owner;
}

// Fills the file-policy fields of `plan` from an assignment.
void fill_file_plan(const std::vector<FileGroup>& files, const std::vector<int>& owner,
                    ShardPlan& plan) {
  plan.files_this_worker.clear();
  plan.file_examples.clear();
  plan.examples_per_worker.assign(static_cast<size_t>(plan.num_workers), 0);
  for (size_t f = 0; f < files.size(); ++f) {
    const auto& examples = files[f].examples;
    plan.examples_per_worker[static_cast<size_t>(owner[f])] +=
        static_cast<int64_t>(examples.size());
    if (owner[f] == plan.worker) {
      plan.files_this_worker.push_back(static_cast<int64_t>(f));
      plan.file_examples.insert(plan.file_examples.end(), examples.begin(), examples.end());
    }
  }
  plan.examples_this_worker = plan.examples_per_worker[static_cast<size_t>(plan.worker)];
}

// data and off: every worker reads every file.
void fill_shared_plan(const std::vector<FileGroup>& files, bool strided, ShardPlan& plan) {
  plan.files_this_worker.resize(files.size());
  std::iota(plan.files_this_worker.begin(), plan.files_this_worker.end(), int64_t{0});
  plan.file_examples.clear();
  plan.examples_per_worker.assign(static_cast<size_t>(plan.num_workers), plan.total_examples);
  if (strided) {
    for (int r = 0; r < plan.num_workers; ++r) {
      plan.examples_per_worker[static_cast<size_t>(r)] =
          strided_count(plan.total_examples, r, plan.num_workers);
    }
  }
  plan.examples_this_worker = plan.examples_per_worker[static_cast<size_t>(plan.worker)];
}

int64_t min_of(const std::vector<int64_t>& v) {
  return v.empty() ? 0 : *std::min_element(v.begin(), v.end());
}

}  // namespace

std::vector<FileGroup> files_of(const Listing& listing) {
  std::vector<FileGroup> files;
  if (listing.is_records()) {
    for (const RecordFile& f : listing.record_files) {
      FileGroup g{f.path, {}};
      g.examples.resize(static_cast<size_t>(f.records));
      for (int64_t k = 0; k < f.records; ++k) g.examples[static_cast<size_t>(k)] = f.first + k;
      files.push_back(std::move(g));
    }
    return files;
  }
  files.reserve(listing.examples.size());
  for (size_t i = 0; i < listing.examples.size(); ++i) {
    files.push_back(FileGroup{listing.examples[i].path, {static_cast<int64_t>(i)}});
  }
  return files;
}

ShardPlan plan_shards(const std::vector<FileGroup>& files, const std::string& policy, int worker,
                      int num_workers, int64_t per_replica_batch, const std::string& origin) {
  if (policy != "auto" && policy != "file" && policy != "data" && policy != "off") {
    throw ConfigError("data.shard_policy: expected one of auto|file|data|off, got '" + policy +
                      "'");
  }
  check_rank("plan_shards", worker, num_workers);
  check_batch(per_replica_batch);

  ShardPlan plan;
  plan.policy_requested = policy;
  plan.worker = worker;
  plan.num_workers = num_workers;

  // Totals, file sizes, and a check that no example is in two files.
  int64_t nonempty = 0;
  int64_t smallest = std::numeric_limits<int64_t>::max();
  int64_t largest = 0;
  std::vector<int64_t> all;
  for (const FileGroup& g : files) {
    const auto n = static_cast<int64_t>(g.examples.size());
    plan.total_examples += n;
    if (n > 0) {
      ++nonempty;
      smallest = std::min(smallest, n);
      largest = std::max(largest, n);
    }
    all.insert(all.end(), g.examples.begin(), g.examples.end());
  }
  std::sort(all.begin(), all.end());
  if (!all.empty() && all.front() < 0) {
    throw Error(ErrorKind::kInternal,
                "plan_shards: negative example index " + std::to_string(all.front()));
  }
  const auto dup = std::adjacent_find(all.begin(), all.end());
  if (dup != all.end()) {
    throw Error(ErrorKind::kInternal,
                "plan_shards: example " + std::to_string(*dup) + " is in two files");
  }
  if (!all.empty() && all.back() != plan.total_examples - 1) {
    throw Error(ErrorKind::kInternal, "plan_shards: the files hold " +
                                          std::to_string(plan.total_examples) +
                                          " examples but index " + std::to_string(all.back()) +
                                          " (the examples must be 0..n-1)");
  }
  const auto num_files = static_cast<int64_t>(files.size());
  const std::string files_text =
      plural(num_files, "file") +
      (nonempty == num_files ? "" : " (" + std::to_string(nonempty) + " with examples)");

  if (policy == "file" && nonempty < num_workers) {
    throw ConfigError("data.shard_policy: file needs at least " + std::to_string(num_workers) +
                      " files for " + plural(num_workers, "worker") + " but " + origin + " has " +
                      files_text + "; use `data` or `auto`");
  }

  if (num_workers == 1) {
    plan.policy_effective = "off";
    plan.reason = (policy == "auto" ? "auto" : policy) +
                  ": 1 worker reads everything -> off (the single-worker order)";
    fill_shared_plan(files, false, plan);
    return plan;
  }

  if (policy == "file") {
    plan.policy_effective = "file";
    plan.reason = "file: " + files_text + " over " + plural(num_workers, "worker") +
                  ", balanced by example count";
    fill_file_plan(files, assign_files(files, num_workers), plan);
    return plan;
  }
  if (policy == "data" || policy == "off") {
    plan.policy_effective = policy;
    plan.reason = policy == "data" ? "data: every worker reads all " + files_text +
                                         " and keeps 1 example in " + std::to_string(num_workers)
                                   : "off: every worker reads all " + files_text;
    fill_shared_plan(files, policy == "data", plan);
    return plan;
  }

  // auto
  const std::string workers_text = plural(num_workers, "worker");
  const auto use_data = [&](const std::string& why) {
    plan.policy_effective = "data";
    plan.reason = "auto: " + why + " -> data";
    fill_shared_plan(files, true, plan);
    return plan;
  };
  if (nonempty < num_workers) {
    return use_data(files_text + " < " + workers_text);
  }
  const std::string sizes_text =
      smallest == largest
          ? plural(smallest, "example") + " per file"
          : std::to_string(smallest) + ".." + std::to_string(largest) + " examples per file";
  if (static_cast<double>(largest) > kAutoMaxFileRatio * static_cast<double>(smallest)) {
    return use_data(files_text + " >= " + workers_text + " but uneven sizes (" + sizes_text +
                    ", more than 1.5x apart)");
  }
  ShardPlan file_plan = plan;
  fill_file_plan(files, assign_files(files, num_workers), file_plan);
  const int64_t file_steps = min_of(file_plan.examples_per_worker) / per_replica_batch;
  const int64_t data_steps = (plan.total_examples / num_workers) / per_replica_batch;
  if (100 * file_steps < kAutoMinStepShare * data_steps) {
    return use_data(files_text + " >= " + workers_text + " but they balance poorly (" +
                    std::to_string(min_of(file_plan.examples_per_worker)) + ".." +
                    std::to_string(*std::max_element(file_plan.examples_per_worker.begin(),
                                                     file_plan.examples_per_worker.end())) +
                    " examples per worker: " + std::to_string(file_steps) + " steps vs " +
                    std::to_string(data_steps) + " with data)");
  }
  file_plan.policy_effective = "file";
  file_plan.reason = "auto: " + files_text + " >= " + workers_text + " with even sizes (" +
                     sizes_text + ") -> file";
  return file_plan;
}

int64_t agreed_steps_per_epoch(const ShardPlan& plan, int64_t per_replica_batch) {
  check_batch(per_replica_batch);
  return min_of(plan.examples_per_worker) / per_replica_batch;
}

std::string dropped_summary(const ShardPlan& plan, int64_t per_replica_batch) {
  const int64_t steps = agreed_steps_per_epoch(plan, per_replica_batch);
  const int64_t used = steps * per_replica_batch;
  std::ostringstream out;
  out << "lock-step: " << plural(steps, "step") << " per epoch x batch " << per_replica_batch
      << " = " << used << " examples on every worker; dropped per epoch:";
  int64_t total = 0;
  int64_t dropped_total = 0;
  int64_t worst = -1;
  size_t worst_rank = 0;
  for (size_t r = 0; r < plan.examples_per_worker.size(); ++r) {
    const int64_t have = plan.examples_per_worker[r];
    const int64_t dropped = have - used;
    const int64_t partial = have % per_replica_batch;
    const int64_t capped = dropped - partial;
    total += have;
    dropped_total += dropped;
    if (dropped > worst) {
      worst = dropped;
      worst_rank = r;
    }
    if (r < kMaxWorkersListed) {
      out << (r == 0 ? " " : ", ") << "worker " << r << " " << dropped << " of " << have;
      if (dropped > 0) {
        out << " (" << partial << " partial batch, " << capped << " lock-step)";
      }
    }
  }
  if (plan.examples_per_worker.size() > kMaxWorkersListed) {
    out << ", ... (most: worker " << worst_rank << " drops " << worst << ")";
  }
  out << "; " << dropped_total << " of " << total << " in all";
  return out.str();
}

std::vector<int64_t> worker_epoch_order(const ShardPlan& plan, int64_t num_examples, uint64_t seed,
                                        int64_t epoch, bool shuffle, int worker, int num_workers) {
  check_rank("worker_epoch_order", worker, num_workers);
  if (worker != plan.worker || num_workers != plan.num_workers ||
      num_examples != plan.total_examples) {
    throw Error(ErrorKind::kInternal,
                "worker_epoch_order: asked for worker " + std::to_string(worker) + " of " +
                    std::to_string(num_workers) + " with " + std::to_string(num_examples) +
                    " examples, but the plan is for worker " + std::to_string(plan.worker) +
                    " of " + std::to_string(plan.num_workers) + " with " +
                    std::to_string(plan.total_examples));
  }
  if (plan.policy_effective == "off") return epoch_order(num_examples, seed, epoch, shuffle);
  if (plan.policy_effective == "data") {
    const std::vector<int64_t> global = epoch_order(num_examples, seed, epoch, shuffle);
    std::vector<int64_t> mine;
    mine.reserve(static_cast<size_t>(strided_count(num_examples, worker, num_workers)));
    for (size_t p = static_cast<size_t>(worker); p < global.size();
         p += static_cast<size_t>(num_workers)) {
      mine.push_back(global[p]);
    }
    return mine;
  }
  if (plan.policy_effective == "file") {
    std::vector<int64_t> mine = plan.file_examples;
    if (shuffle) {
      Rng rng(util::mix_seed(
          seed, {static_cast<uint64_t>(epoch), static_cast<uint64_t>(worker), kFileShuffleStream}));
      shuffle_in_place(mine, rng);
    }
    return mine;
  }
  throw Error(ErrorKind::kInternal,
              "worker_epoch_order: unknown effective policy '" + plan.policy_effective + "'");
}

std::vector<int64_t> balanced_epoch_order(const std::vector<int64_t>& labels, uint64_t seed,
                                          int64_t epoch, int worker, int num_workers,
                                          int64_t draws_per_worker) {
  check_rank("balanced_epoch_order", worker, num_workers);
  std::map<int64_t, int64_t> counts;
  for (const int64_t l : labels) {
    if (l < 0) {
      throw Error(ErrorKind::kInternal, "balanced_epoch_order: a label that was not listed");
    }
    ++counts[l];
  }
  // Cumulative weights in example order; a draw is the first example whose cumulative weight
  // exceeds u * total.
  std::vector<double> cumulative;
  cumulative.reserve(labels.size());
  double total = 0;
  for (const int64_t l : labels) {
    total += 1.0 / static_cast<double>(counts[l]);
    cumulative.push_back(total);
  }
  Rng rng(util::mix_seed(seed, {static_cast<uint64_t>(epoch), kBalancedStream}));
  std::vector<int64_t> mine;
  if (labels.empty() || draws_per_worker < 0) {
    throw Error(ErrorKind::kInternal, "balanced_epoch_order: no labels or a negative count");
  }
  const auto draws = static_cast<size_t>(draws_per_worker) * static_cast<size_t>(num_workers);
  for (size_t draw = 0; draw < draws; ++draw) {
    const double u = uniform01(rng) * total;
    auto it = std::upper_bound(cumulative.begin(), cumulative.end(), u);
    if (it == cumulative.end()) --it;
    if (draw % static_cast<size_t>(num_workers) == static_cast<size_t>(worker)) {
      mine.push_back(static_cast<int64_t>(it - cumulative.begin()));
    }
  }
  return mine;
}

std::vector<int64_t> held_out_positions(int64_t n, double fraction, uint64_t seed) {
  if (n < 0 || !(fraction >= 0 && fraction < 1)) {
    throw Error(ErrorKind::kInternal, "held_out_positions: bad count or fraction");
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  Rng rng(util::mix_seed(seed, {kHoldOutStream}));
  shuffle_in_place(order, rng);
  const auto held = static_cast<size_t>(std::llround(static_cast<double>(n) * fraction));
  std::vector<int64_t> out(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(held));
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int64_t> eval_shard(int64_t num_examples, int worker, int num_workers) {
  check_rank("eval_shard", worker, num_workers);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(strided_count(num_examples, worker, num_workers)));
  for (int64_t i = worker; i < num_examples; i += num_workers) mine.push_back(i);
  return mine;
}

std::string shard_digest(const ShardPlan& plan) {
  util::Fnv1a64 h;
  h.add(plan.policy_effective).add_byte(0);
  h.add_word(static_cast<uint64_t>(plan.worker)).add_word(static_cast<uint64_t>(plan.num_workers));
  h.add_word(static_cast<uint64_t>(plan.total_examples));
  h.add_word(static_cast<uint64_t>(plan.examples_this_worker));
  for (const auto* v : {&plan.files_this_worker, &plan.file_examples, &plan.examples_per_worker}) {
    h.add_word(v->size());
    for (const int64_t x : *v) h.add_word(static_cast<uint64_t>(x));
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h.value()));
  return out;
}

}  // namespace trainer::data
