#include "trainer/data/record_feed.h"

#include <condition_variable>
#include <exception>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "trainer/data/tfrecord.h"

namespace trainer::data {

struct RecordFeed::Impl {
  const std::vector<Example>* examples;
  std::string compression;
  size_t capacity;
  size_t open_files;

  std::mutex mu;
  std::condition_variable reader_cv;  // the reader waits for work or room
  std::condition_variable taker_cv;   // takers wait for their record
  bool stop = false;
  uint64_t generation = 0;
  std::vector<int64_t> order;  // the current generation's read order
  std::unordered_map<int64_t, Item> ready;
  int waiting_for_unread = 0;  // takers waiting for a record not yet read
  std::exception_ptr failure;  // what ended the reader thread (not a record's DataError), if any
  std::thread thread;

  // Reader-thread state (touched by the reader only).
  struct Open {
    std::string path;
    std::unique_ptr<RecordReader> reader;
  };
  std::list<Open> open;                       // most recently used first
  std::map<std::string, std::string> broken;  // file -> why its remaining records are unusable

  Impl(const std::vector<Example>* ex, std::string comp, size_t cap, size_t files)
      : examples(ex),
        compression(std::move(comp)),
        capacity(std::max<size_t>(cap, 1)),
        open_files(std::max<size_t>(files, 1)) {}

  RecordReader& reader_for(const std::string& path, int64_t record) {
    for (auto it = open.begin(); it != open.end(); ++it) {
      if (it->path != path) continue;
      if (it->reader->index() > record) {  // behind us (a new epoch): reopen
        open.erase(it);
        break;
      }
      open.splice(open.begin(), open, it);
      return *open.front().reader;
    }
    open.push_front(
        Open{path, std::make_unique<RecordReader>(path, compression_for(compression, path))});
    while (open.size() > open_files) open.pop_back();
    return *open.front().reader;
  }

  void close(const std::string& path) {
    open.remove_if([&](const Open& o) { return o.path == path; });
  }

  // Reads example `index`'s record (reader thread, no lock held).
  Item read_one(int64_t index) {
    const Example& ex = (*examples)[static_cast<size_t>(index)];
    Item item;
    const auto b = broken.find(ex.path);
    if (b != broken.end()) {
      item.error =
          ex.path + ": record " + std::to_string(ex.record) + " is unreadable: " + b->second;
      return item;
    }
    try {
      RecordReader& r = reader_for(ex.path, ex.record);
      while (r.index() < ex.record) {
        if (!r.skip()) {
          throw DataError(ex.path + ": the file ends at byte offset " + std::to_string(r.offset()) +
                          " after " + std::to_string(r.index()) + " records, but record " +
                          std::to_string(ex.record) +
                          " was listed (the file changed after its records were counted)");
        }
      }
      if (!r.read(&item.record)) {
        throw DataError(ex.path + ": the file ends at byte offset " + std::to_string(r.offset()) +
                        " after " + std::to_string(r.index()) + " records, but record " +
                        std::to_string(ex.record) +
                        " was listed (the file changed after its records were counted)");
      }
    } catch (const RecordError& e) {
      item.error = e.what();
      if (!e.recoverable) {
        broken[ex.path] = std::string("an earlier error in the file: ") + e.what();
        close(ex.path);
      }
    } catch (const DataError& e) {
      item.error = e.what();
      broken[ex.path] = e.what();
      close(ex.path);
    }
    return item;
  }

  // The reader thread: every exception (std::bad_alloc, a filesystem error, a bug) is kept for
  // the takers to rethrow, never let out of the thread (that would be std::terminate).
  void run() {
    try {
      read_loop();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      failure = std::current_exception();
    }
    taker_cv.notify_all();
  }

  void read_loop() {
    std::unique_lock<std::mutex> lock(mu);
    uint64_t gen = 0;
    size_t pos = 0;
    for (;;) {
      reader_cv.wait(lock, [&] {
        if (stop || generation != gen) return true;
        if (pos >= order.size()) return false;
        return ready.size() < capacity || waiting_for_unread > 0;
      });
      if (stop) return;
      if (generation != gen) {  // a new epoch: its files are read from the start again
        gen = generation;
        pos = 0;
        broken.clear();
        continue;
      }
      const int64_t index = order[pos++];
      lock.unlock();
      Item item = read_one(index);
      lock.lock();
      if (generation != gen) continue;
      ready.emplace(index, std::move(item));
      taker_cv.notify_all();
    }
  }
};

RecordFeed::RecordFeed(const std::vector<Example>* examples, std::string compression,
                       size_t capacity, size_t open_files)
    : impl_(std::make_unique<Impl>(examples, std::move(compression), capacity, open_files)) {
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

RecordFeed::~RecordFeed() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->reader_cv.notify_all();
  impl_->taker_cv.notify_all();
  impl_->thread.join();
}

uint64_t RecordFeed::start(std::vector<int64_t> read_order) {
  uint64_t gen = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    gen = ++impl_->generation;
    impl_->order = std::move(read_order);
    impl_->ready.clear();
  }
  impl_->reader_cv.notify_all();
  impl_->taker_cv.notify_all();  // takers of the old generation give up
  return gen;
}

std::optional<RecordFeed::Item> RecordFeed::take(int64_t index, uint64_t generation) {
  Impl& s = *impl_;
  std::unique_lock<std::mutex> lock(s.mu);
  bool counted = false;
  for (;;) {
    if (s.stop || s.generation != generation) break;
    if (s.failure) {
      if (counted) --s.waiting_for_unread;
      std::rethrow_exception(s.failure);
    }
    auto it = s.ready.find(index);
    if (it != s.ready.end()) {
      Item item = std::move(it->second);
      s.ready.erase(it);
      if (counted) --s.waiting_for_unread;
      s.reader_cv.notify_all();  // room for the reader
      return item;
    }
    if (!counted) {
      counted = true;
      ++s.waiting_for_unread;
      s.reader_cv.notify_all();
    }
    s.taker_cv.wait(lock);
  }
  if (counted) --s.waiting_for_unread;
  return std::nullopt;
}

}  // namespace trainer::data
