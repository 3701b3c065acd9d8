#include "trainer/data/record_order.h"

#include <unordered_set>

#include "trainer/data/random.h"
#include "trainer/util/error.h"
#include "trainer/util/rng.h"

namespace trainer::data {

std::vector<int64_t> interleave(const std::vector<std::vector<int64_t>>& files, int cycle_length) {
  if (cycle_length < 1) throw Error(ErrorKind::kInternal, "interleave: cycle_length < 1");
  std::vector<int64_t> out;
  size_t total = 0;
  for (const auto& f : files) total += f.size();
  out.reserve(total);
  struct Cursor {
    size_t file;
    size_t pos;
  };
  std::vector<Cursor> cycle;
  size_t next_file = 0;
  while (cycle.size() < static_cast<size_t>(cycle_length) && next_file < files.size()) {
    cycle.push_back({next_file++, 0});
  }
  size_t slot = 0;
  while (!cycle.empty()) {
    if (slot >= cycle.size()) slot = 0;
    Cursor& c = cycle[slot];
    if (c.pos < files[c.file].size()) {
      out.push_back(files[c.file][c.pos++]);
      ++slot;
      continue;
    }
    // This file is done: the next file takes its slot (and is read from at once), or the slot
    // closes.
    if (next_file < files.size()) {
      c = {next_file++, 0};
    } else {
      cycle.erase(cycle.begin() + static_cast<std::ptrdiff_t>(slot));
    }
  }
  return out;
}

std::vector<int64_t> shuffle_buffer(const std::vector<int64_t>& input, int64_t buffer_size,
                                    Rng& rng) {
  if (buffer_size < 1) throw Error(ErrorKind::kInternal, "shuffle_buffer: buffer_size < 1");
  std::vector<int64_t> out;
  out.reserve(input.size());
  std::vector<int64_t> buffer;
  buffer.reserve(static_cast<size_t>(std::min<int64_t>(buffer_size, input.size())));
  size_t next = 0;
  while (next < input.size() && static_cast<int64_t>(buffer.size()) < buffer_size) {
    buffer.push_back(input[next++]);
  }
  while (!buffer.empty()) {
    const auto k = static_cast<size_t>(uniform_index(rng, buffer.size()));
    out.push_back(buffer[k]);
    if (next < input.size()) {
      buffer[k] = input[next++];
    } else {
      buffer[k] = buffer.back();
      buffer.pop_back();
    }
  }
  return out;
}

namespace {

EpochOrder order_of_files(const std::vector<FileGroup>& groups, std::vector<int64_t> files,
                          const RecordOrderOptions& o, int64_t epoch, uint64_t stream) {
  const auto e = static_cast<uint64_t>(epoch);
  std::vector<std::vector<int64_t>> lists;
  if (o.shuffle) {
    Rng file_rng(util::mix_seed(o.seed, {e, stream, kRecordFileStream}));
    shuffle_in_place(files, file_rng);
  }
  lists.reserve(files.size());
  for (int64_t f : files) lists.push_back(groups[static_cast<size_t>(f)].examples);
  EpochOrder out;
  if (!o.shuffle) {
    out.read = interleave(lists, 1);
    out.emit = out.read;
    return out;
  }
  out.read = interleave(lists, o.interleave);
  Rng buffer_rng(util::mix_seed(o.seed, {e, stream, kRecordBufferStream}));
  out.emit = shuffle_buffer(out.read, o.shuffle_buffer, buffer_rng);
  return out;
}

std::vector<int64_t> all_files(const std::vector<FileGroup>& groups) {
  std::vector<int64_t> files(groups.size());
  for (size_t i = 0; i < files.size(); ++i) files[i] = static_cast<int64_t>(i);
  return files;
}

}  // namespace

EpochOrder record_epoch_order(const std::vector<FileGroup>& files, const ShardPlan& plan,
                              const RecordOrderOptions& options, int64_t epoch) {
  if (options.interleave < 1 || options.shuffle_buffer < 1) {
    throw Error(ErrorKind::kInternal,
                "record_epoch_order: interleave and shuffle_buffer must be >= 1");
  }
  if (plan.policy_effective == "file") {
    return order_of_files(files, plan.files_this_worker, options, epoch,
                          static_cast<uint64_t>(plan.worker));
  }
  EpochOrder global = order_of_files(files, all_files(files), options, epoch, 0);
  if (plan.policy_effective == "off") return global;
  if (plan.policy_effective != "data") {
    throw Error(ErrorKind::kInternal,
                "record_epoch_order: unknown effective policy '" + plan.policy_effective + "'");
  }
  EpochOrder mine;
  std::unordered_set<int64_t> kept;
  for (size_t p = static_cast<size_t>(plan.worker); p < global.emit.size();
       p += static_cast<size_t>(plan.num_workers)) {
    mine.emit.push_back(global.emit[p]);
    kept.insert(global.emit[p]);
  }
  mine.read.reserve(mine.emit.size());
  for (int64_t i : global.read)
    if (kept.count(i)) mine.read.push_back(i);
  return mine;
}

}  // namespace trainer::data
