// The reading stage of a record source: one thread reads the records an epoch needs, in the
// epoch's read order (record_order.h), each file sequentially in large blocks (RecordReader,
// at most `open_files` files open at once: more than the interleave cycle), and keeps each
// serialized record until a decode thread takes it. Memory is bounded: the reader stays at most
// `capacity` records ahead of the takers, except that it always reads on while a taker waits for a
// record not yet read (so a shuffle buffer larger than the capacity cannot deadlock it). A record
// that cannot be read (CRC mismatch, truncated file, the file changed since it was counted) comes
// back with `error` set; after an unrecoverable error in a file, every later record of that file
// does too. Anything else that goes wrong in the reader thread (std::bad_alloc, an I/O error
// opening a file) ends it, and every take() from then on rethrows that exception. Thread-safe:
// start() from the loader's consumer thread, take() from any decode thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/data/example.h"

namespace trainer::data {

class RecordFeed {
 public:
  struct Item {
    std::string record;  // the serialized tf.train.Example
    std::string error;   // non-empty: the record is unusable (the message names file and offset)
  };

  // `examples` (records: path + record number) must outlive the feed.
  RecordFeed(const std::vector<Example>* examples, std::string compression, size_t capacity,
             size_t open_files = 16);
  ~RecordFeed();
  RecordFeed(const RecordFeed&) = delete;
  RecordFeed& operator=(const RecordFeed&) = delete;

  // Abandons the current epoch and starts reading `read_order` (example indices, each once).
  // Returns the generation to pass to take().
  uint64_t start(std::vector<int64_t> read_order);

  // Blocks until example `index` of generation `generation` has been read and returns it (each
  // index once); nullopt when that generation was abandoned or the feed is shutting down.
  // Rethrows what ended the reader thread, if something did.
  std::optional<Item> take(int64_t index, uint64_t generation);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainer::data
