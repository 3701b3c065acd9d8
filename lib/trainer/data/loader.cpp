#include "trainer/data/loader.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>

#include "trainer/data/random.h"
#include "trainer/data/record_feed.h"
#include "trainer/data/tf_example.h"
#include "trainer/util/error.h"
#include "trainer/util/fs.h"
#include "trainer/util/memory.h"
#include "trainer/util/rng.h"

namespace trainer::data {

namespace {
constexpr size_t kMaxSkippedPaths = 100;   // remembered by skipped_paths()
constexpr int64_t kMaxSkippedLogged = 10;  // logged one by one; the rest only counted
}  // namespace

void use_record_order(LoaderOptions& o, std::vector<FileGroup> files, const ShardPlan& plan,
                      const RecordOrderOptions& ro) {
  // The loader asks for order(e) then read_order(e) (and order(0) once at construction), both
  // on its consumer thread; the last epoch's result serves both.
  struct Memo {
    std::vector<FileGroup> files;
    ShardPlan plan;
    RecordOrderOptions ro;
    std::mutex mu;
    int64_t epoch = -1;
    EpochOrder order;
    EpochOrder of(int64_t e) {
      std::lock_guard<std::mutex> lock(mu);
      if (e != epoch) order = record_epoch_order(files, plan, ro, e), epoch = e;
      return order;
    }
  };
  auto memo = std::make_shared<Memo>();
  memo->files = std::move(files);
  memo->plan = plan;
  memo->ro = ro;
  o.order = [memo](int64_t e) { return memo->of(e).emit; };
  o.read_order = [memo](int64_t e) { return memo->of(e).read; };
}

// The pool: workers claim example positions of the current epoch in order, never beyond
// `consumer_batch + prefetch_batches` batches, decode them and file the result in their batch's
// slot. The consumer waits for its batch's slot to fill and assembles it in position order.
// A generation number tags every claim, so a restart (start_epoch) or shutdown discards
// in-flight work without waiting for it.
struct Loader::Impl {
  struct Slot {
    std::vector<torch::Tensor> images;       // per position in the batch; undefined = bad
    std::vector<std::string> bad_paths;      // per position; non-empty = skipped (corrupt)
    std::vector<std::string> bad_reasons;    // per position; the DataError's message
    std::vector<std::exception_ptr> errors;  // per position; non-null = the epoch fails
    std::vector<int64_t> labels;             // per position
    int64_t done = 0;
  };

  std::vector<Example> examples;
  LoaderOptions options;
  ImagePipeline pipeline;
  int64_t positions = 0;  // indices in one epoch's order
  int64_t batches = 0;

  std::mutex mu;
  std::condition_variable work_cv;  // workers wait for claimable work
  std::condition_variable done_cv;  // the consumer waits for its batch
  bool stop = false;
  bool started = false;
  bool failed = false;  // the current epoch threw; next() returns nullopt until start_epoch
  uint64_t generation = 0;
  int64_t epoch = 0;
  std::vector<int64_t> order;
  int64_t next_pos = 0;        // next position to claim
  int64_t end_pos = 0;         // one past the last position of the epoch
  int64_t consumer_batch = 0;  // the batch next() returns next
  std::map<int64_t, Slot> slots;

  int64_t skipped_total = 0;
  std::vector<std::string> skipped_paths;
  std::vector<std::thread> threads;

  bool records = false;              // examples are records of record files
  std::unique_ptr<RecordFeed> feed;  // records only
  uint64_t feed_generation = 0;
  std::vector<torch::Tensor> cache;   // options.cache: per example, undefined = not yet
  std::vector<int64_t> cache_labels;  // per example
  int64_t cached_count = 0;
  int64_t cached_bytes = 0;

  Impl(std::vector<Example> ex, LoaderOptions opt)
      : examples(std::move(ex)), options(std::move(opt)), pipeline(options.preprocess) {
    records = !examples.empty() && examples.front().record >= 0;
    if (records) {
      const auto ahead = static_cast<size_t>(std::max<int64_t>(options.read_ahead, 1) +
                                             (options.prefetch_batches + 2) * options.batch_size +
                                             options.num_workers);
      feed = std::make_unique<RecordFeed>(&examples, options.record_format.compression, ahead,
                                          static_cast<size_t>(std::max(options.open_files, 1)));
    }
    if (options.cache) {
      cache.resize(examples.size());
      cache_labels.assign(examples.size(), -1);
    }
    positions = options.order ? static_cast<int64_t>(make_order(0, false).size())
                              : static_cast<int64_t>(examples.size());
    batches = options.drop_last ? positions / options.batch_size
                                : (positions + options.batch_size - 1) / options.batch_size;
    if (options.max_batches >= 0) batches = std::min(batches, options.max_batches);
    if (options.cache) check_cache_fits();
  }

  // data.cache: memory keeps every example this process reads, resized to S x S x 3 bytes (and a
  // tensor's bookkeeping): refuse at the start, saying how much, rather than swap or be killed
  // by the OOM killer epochs later.
  void check_cache_fits() const {
    const int64_t side = options.preprocess.output_size();
    const int64_t per_example = side * side * 3 + 512;
    const int64_t needed =
        std::min<int64_t>(positions, static_cast<int64_t>(examples.size())) * per_example;
    const int64_t available = util::available_memory_bytes();
    if (available < 0 || needed <= available * 8 / 10) return;
    const auto gib = [](int64_t bytes) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
      return std::string(buf);
    };
    throw ConfigError("data.cache: memory needs about " + gib(needed) + " for the " +
                      std::to_string(std::min<int64_t>(positions, examples.size())) +
                      " examples this process reads at " + std::to_string(side) + " x " +
                      std::to_string(side) + ", more than 80% of the " + gib(available) +
                      " of memory available; use data.cache: none or a smaller data.image_size");
  }

  // The order of epoch `ep`, checked when it comes from options.order (its length against
  // `positions` when check_size).
  std::vector<int64_t> make_order(int64_t ep, bool check_size = true) const {
    if (!options.order) {
      return epoch_order(static_cast<int64_t>(examples.size()), options.seed, ep, options.shuffle);
    }
    std::vector<int64_t> o = options.order(ep);
    if (check_size && static_cast<int64_t>(o.size()) != positions) {
      throw Error(ErrorKind::kInternal, "Loader: the order of epoch " + std::to_string(ep) +
                                            " has " + std::to_string(o.size()) +
                                            " indices, epoch 0's had " + std::to_string(positions));
    }
    const auto n = static_cast<int64_t>(examples.size());
    for (int64_t i : o) {
      if (i < 0 || i >= n) {
        throw Error(ErrorKind::kInternal, "Loader: the order of epoch " + std::to_string(ep) +
                                              " has index " + std::to_string(i) + " outside [0, " +
                                              std::to_string(n) + ")");
      }
    }
    return o;
  }

  int64_t batch_begin(int64_t b) const { return b * options.batch_size; }
  int64_t batch_end(int64_t b) const {
    return std::min<int64_t>(batch_begin(b) + options.batch_size, positions);
  }

  bool claimable() const {
    return next_pos < end_pos &&
           next_pos / options.batch_size < consumer_batch + options.prefetch_batches;
  }

  void worker() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      work_cv.wait(lock, [&] { return stop || claimable(); });
      if (stop) return;
      const int64_t pos = next_pos++;
      const int64_t b = pos / options.batch_size;
      const uint64_t gen = generation;
      const int64_t ep = epoch;
      const int64_t index = order[static_cast<size_t>(pos)];
      const uint64_t feed_gen = feed_generation;
      Slot& fresh = slots[b];
      if (fresh.images.empty()) {
        const auto len = static_cast<size_t>(batch_end(b) - batch_begin(b));
        fresh.images.resize(len);
        fresh.bad_paths.resize(len);
        fresh.bad_reasons.resize(len);
        fresh.errors.resize(len);
        fresh.labels.resize(len);
      }
      torch::Tensor cached;
      int64_t cached_label = -1;
      if (options.cache) {
        cached = cache[static_cast<size_t>(index)];
        cached_label = cache_labels[static_cast<size_t>(index)];
      }
      lock.unlock();

      const Example& example = examples[static_cast<size_t>(index)];
      const uint64_t seed =
          util::mix_seed(options.seed, {static_cast<uint64_t>(ep), static_cast<uint64_t>(index)});
      torch::Tensor image;
      int64_t label = example.label;
      torch::Tensor to_cache;
      std::string bad_path;
      std::string bad_reason;
      std::exception_ptr error;
      const std::string origin =
          records ? example.path + " record " + std::to_string(example.record) : example.path;
      try {
        if (cached.defined()) {
          image = pipeline.augment(cached, seed);
          label = cached_label;
        } else {
          std::string bytes;
          if (records) {
            std::optional<RecordFeed::Item> item = feed->take(index, feed_gen);
            if (!item) {  // the epoch was restarted or the loader is stopping
              lock.lock();
              continue;
            }
            if (!item->error.empty()) throw DataError(item->error);
            ImageRecord rec = parse_image_example(item->record, options.record_format.image_key,
                                                  options.record_format.label_key, origin);
            bytes = std::move(rec.image);
            label = rec.label;
            if (options.num_classes > 0 && (label < 0 || label >= options.num_classes)) {
              throw DataError(origin + ": label " + std::to_string(label) + " (feature '" +
                              options.record_format.label_key + "') is outside [0, " +
                              std::to_string(options.num_classes) + ") for the " +
                              std::to_string(options.num_classes) + " classes");
            }
          } else {
            bytes = util::read_file(example.path);
          }
          if (options.cache) {
            to_cache = pipeline.decode_resized(bytes, origin);
            image = pipeline.augment(to_cache, seed);
          } else {
            image = pipeline.decode(bytes, origin, seed);
          }
        }
      } catch (const DataError& e) {
        if (options.skip_corrupt) {
          bad_path = origin;
          bad_reason = e.what();
        } else {
          error = std::make_exception_ptr(
              DataError(std::string(e.what()) +
                        " (hint: data.on_corrupt: skip drops and counts such images)"));
        }
      } catch (...) {
        error = std::current_exception();
      }

      lock.lock();
      if (stop) return;
      if (to_cache.defined() && !cache[static_cast<size_t>(index)].defined()) {
        cache[static_cast<size_t>(index)] = to_cache;
        cache_labels[static_cast<size_t>(index)] = label;
        ++cached_count;
        cached_bytes += to_cache.numel();
      }
      if (gen != generation) continue;  // the epoch was restarted: discard
      auto it = slots.find(b);
      if (it == slots.end()) continue;
      Slot& slot = it->second;
      const auto k = static_cast<size_t>(pos - batch_begin(b));
      slot.images[k] = std::move(image);
      slot.bad_paths[k] = std::move(bad_path);
      slot.bad_reasons[k] = std::move(bad_reason);
      slot.errors[k] = std::move(error);
      slot.labels[k] = label;
      if (++slot.done == static_cast<int64_t>(slot.images.size())) done_cv.notify_all();
    }
  }

  // Stops claiming work for the current epoch; in-flight results are discarded.
  void abandon_locked() {
    ++generation;
    slots.clear();
    next_pos = end_pos = 0;
  }
};

Loader::Loader(std::vector<Example> examples, LoaderOptions options) {
  if (options.batch_size < 1) {
    throw ConfigError("loader: batch_size must be >= 1, got " + std::to_string(options.batch_size));
  }
  if (options.num_workers < 1) {
    throw ConfigError("data.num_workers: expected >= 1, got " +
                      std::to_string(options.num_workers));
  }
  if (options.prefetch_batches < 1) {
    throw ConfigError("data.prefetch_batches: expected >= 1, got " +
                      std::to_string(options.prefetch_batches));
  }
  if (options.max_batches < -1) {
    throw ConfigError("loader: max_batches must be >= 0 (or -1: no cap), got " +
                      std::to_string(options.max_batches));
  }
  impl_ = std::make_unique<Impl>(std::move(examples), std::move(options));
  Impl* impl = impl_.get();
  try {
    for (int t = 0; t < impl->options.num_workers; ++t) {
      impl->threads.emplace_back([impl] { impl->worker(); });
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(impl->mu);
      impl->stop = true;
    }
    impl->work_cv.notify_all();
    for (auto& t : impl->threads) t.join();
    throw;
  }
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
    impl_->abandon_locked();
  }
  if (impl_->feed) impl_->feed->start({});  // wakes decode threads waiting for a record
  impl_->work_cv.notify_all();
  impl_->done_cv.notify_all();
  for (auto& t : impl_->threads) t.join();
}

int64_t Loader::num_examples() const { return static_cast<int64_t>(impl_->examples.size()); }

int64_t Loader::epoch_size() const { return impl_->positions; }

int64_t Loader::batches_per_epoch() const { return impl_->batches; }

void Loader::start_epoch(int64_t epoch, int64_t first_batch) {
  Impl& s = *impl_;
  if (epoch < 0) throw Error(ErrorKind::kInternal, "Loader::start_epoch: negative epoch");
  if (first_batch < 0 || first_batch > s.batches) {
    throw Error(ErrorKind::kInternal, "Loader::start_epoch: first_batch " +
                                          std::to_string(first_batch) + " outside [0, " +
                                          std::to_string(s.batches) + "]");
  }
  std::vector<int64_t> order = s.make_order(epoch);
  std::vector<int64_t> read;
  if (s.records) read = s.options.read_order ? s.options.read_order(epoch) : order;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.abandon_locked();
    if (s.records) {
      // Read only what this epoch still trains on: the positions from first_batch to the last
      // batch, less what the cache holds.
      const int64_t begin = s.batch_begin(first_batch);
      const int64_t end = s.batches == 0 ? 0 : s.batch_end(s.batches - 1);
      std::vector<char> needed(s.examples.size(), 0);
      std::vector<char> seen(s.examples.size(), 0);
      for (int64_t p = begin; p < end; ++p) {
        const auto i = static_cast<size_t>(order[static_cast<size_t>(p)]);
        if (seen[i]) {
          throw Error(ErrorKind::kInternal, "Loader: record example " + std::to_string(i) +
                                                " appears twice in the order of epoch " +
                                                std::to_string(epoch));
        }
        seen[i] = 1;
        if (!s.options.cache || !s.cache[i].defined()) needed[i] = 1;
      }
      std::vector<int64_t> wanted;
      wanted.reserve(read.size());
      for (int64_t i : read) {
        if (i >= 0 && i < static_cast<int64_t>(needed.size()) && needed[static_cast<size_t>(i)]) {
          wanted.push_back(i);
          needed[static_cast<size_t>(i)] = 0;
        }
      }
      for (size_t i = 0; i < needed.size(); ++i) {
        if (needed[i]) {
          throw Error(ErrorKind::kInternal, "Loader: example " + std::to_string(i) +
                                                " is in the epoch's order but not its read order");
        }
      }
      s.feed_generation = s.feed->start(std::move(wanted));
    }
    s.started = true;
    s.failed = false;
    s.epoch = epoch;
    s.order = std::move(order);
    s.consumer_batch = first_batch;
    s.next_pos = s.batch_begin(first_batch);
    s.end_pos = s.batches == 0 ? 0 : s.batch_end(s.batches - 1);
    s.next_pos = std::min(s.next_pos, s.end_pos);
  }
  s.work_cv.notify_all();
}

std::optional<Batch> Loader::next() {
  Impl& s = *impl_;
  Impl::Slot slot;
  int64_t b = 0;
  std::vector<int64_t> indices;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    if (!s.started) throw Error(ErrorKind::kInternal, "Loader::next() before start_epoch()");
    if (s.failed || s.consumer_batch >= s.batches) return std::nullopt;
    b = s.consumer_batch;
    s.done_cv.wait(lock, [&] {
      auto it = s.slots.find(b);
      return it != s.slots.end() &&
             it->second.done == static_cast<int64_t>(it->second.images.size());
    });
    auto it = s.slots.find(b);
    slot = std::move(it->second);
    s.slots.erase(it);
    ++s.consumer_batch;
    indices.assign(s.order.begin() + s.batch_begin(b), s.order.begin() + s.batch_end(b));
    for (const auto& error : slot.errors) {
      if (error) {
        s.failed = true;
        s.abandon_locked();
        lock.unlock();
        std::rethrow_exception(error);
      }
    }
  }
  s.work_cv.notify_all();  // the prefetch window moved on

  Batch batch;
  batch.index = b;
  std::vector<torch::Tensor> images;
  std::vector<int64_t> labels;
  images.reserve(slot.images.size());
  for (size_t k = 0; k < slot.images.size(); ++k) {
    if (!slot.bad_paths[k].empty()) {
      ++batch.skipped;
      ++s.skipped_total;
      if (s.skipped_paths.size() < kMaxSkippedPaths) s.skipped_paths.push_back(slot.bad_paths[k]);
      if (s.skipped_total <= kMaxSkippedLogged) {
        spdlog::warn(
            "skipping corrupt image '{}' (data.on_corrupt: skip): {}{}", slot.bad_paths[k],
            slot.bad_reasons[k],
            s.skipped_total == kMaxSkippedLogged ? " (further ones are only counted)" : "");
      }
      continue;
    }
    images.push_back(std::move(slot.images[k]));
    batch.indices.push_back(indices[k]);
    labels.push_back(slot.labels[k]);
  }
  const int64_t size = s.options.preprocess.output_size();
  const auto pinned = torch::TensorOptions().pinned_memory(s.options.pin_memory);
  batch.images = torch::empty({static_cast<int64_t>(images.size()), size, size, 3},
                              pinned.dtype(torch::kUInt8));
  if (!images.empty()) at::stack_out(batch.images, images);
  batch.labels = torch::empty({static_cast<int64_t>(labels.size())}, pinned.dtype(torch::kInt64));
  std::copy(labels.begin(), labels.end(), batch.labels.data_ptr<int64_t>());
  return batch;
}

int64_t Loader::skipped_total() const { return impl_->skipped_total; }

std::vector<std::string> Loader::skipped_paths() const { return impl_->skipped_paths; }

int64_t Loader::cached_examples() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->cached_count;
}

int64_t Loader::cached_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->cached_bytes;
}

}  // namespace trainer::data
