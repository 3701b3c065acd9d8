// Loader test helpers: run one whole epoch, and give a loader over a record listing the
// single-worker tf.data-style order (record_order.h), as data_plan does for a 1-worker job.
#pragma once

#include <vector>

#include "trainer/data/loader.h"
#include "trainer/data/record_order.h"
#include "trainer/data/shard.h"

namespace trainer::data::testing {

inline std::vector<Batch> whole_epoch(Loader& loader, int64_t epoch) {
  loader.start_epoch(epoch);
  std::vector<Batch> out;
  while (auto b = loader.next()) out.push_back(std::move(*b));
  return out;
}

inline void use_record_order(LoaderOptions& o, const Listing& listing,
                             const RecordOrderOptions& ro) {
  const auto groups = files_of(listing);
  data::use_record_order(o, groups, plan_shards(groups, "off", 0, 1, o.batch_size), ro);
  o.record_format = listing.record_format;
  o.read_ahead = ro.shuffle_buffer;
}

}  // namespace trainer::data::testing
