#include "trainer/job/agreement.h"

#include <fmt/format.h>

#include <sstream>
#include <vector>

#include "trainer/util/error.h"
#include "trainer/util/hash.h"

namespace trainer::train {

namespace {

// The digest has always started from 1469598103934665603 (FNV's 64-bit offset basis,
// 14695981039346656037, less its last digit); kept so that digests stay what they were.
constexpr uint64_t kListingDigestBasis = 1469598103934665603ULL;

std::string listing_digest(const data::Listing& listing) {
  util::Fnv1a64 h(kListingDigestBasis);
  auto mix = [&h](const std::string& s) { h.add(s).add_byte(0xff); };
  for (const auto& e : listing.examples) {
    mix(e.path);
    mix(std::to_string(e.label));
  }
  for (const auto& c : listing.class_names) mix(c);
  return fmt::format("{} examples, digest {:016x}", listing.examples.size(), h.value());
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

void agree(dist::ProcessGroup& group, const cluster::ClusterSpec& cluster, const std::string& what,
           const std::function<void()>& step) {
  if (group.world_size() == 1) {
    step();
    return;
  }
  std::string mine;
  try {
    step();
  } catch (const Error& e) {
    mine = std::to_string(static_cast<int>(e.kind())) + "\n" + e.what();
  }
  const std::vector<std::string> all = group.all_gather_strings(mine);
  for (size_t rank = 0; rank < all.size(); ++rank) {
    if (all[rank].empty()) continue;
    const size_t nl = all[rank].find('\n');
    const auto kind = static_cast<ErrorKind>(std::stoi(all[rank].substr(0, nl)));
    const std::string message = all[rank].substr(nl + 1);
    if (static_cast<int>(rank) == group.rank()) throw Error(kind, message);
    throw Error(kind,
                fmt::format("{} failed while {}: {}",
                            cluster::task_name(cluster, static_cast<int>(rank)), what, message));
  }
}

void chief_writes(dist::ProcessGroup& group, const cluster::ClusterSpec& cluster,
                  const cluster::JobDir& job_dir, const std::string& what,
                  const std::function<void()>& write) {
  agree(group, cluster, what, [&] {
    if (cluster.is_chief()) job_dir.write_while_present(write);
  });
}

std::string job_description(const config::JobSpec& spec, const data::Listing& train,
                            const data::Listing* validation) {
  std::string out;
  for (const auto& [field, value] : config::flatten(spec)) {
    if (field.rfind("logging.", 0) == 0) continue;
    out += field + "=" + value + "\n";
  }
  out += "data.train listing=" + listing_digest(train) + "\n";
  if (validation) out += "data.validation listing=" + listing_digest(*validation) + "\n";
  out += std::string("program version=") + TRAINER_VERSION + "\n";
  return out;
}

void verify_same_job(dist::ProcessGroup& group, const cluster::ClusterSpec& cluster,
                     const std::string& description) {
  if (group.world_size() == 1) return;
  // Through the store, O(1) per rank: an all-gather would move every description to every rank.
  const auto differs = group.first_differing("job", description);
  if (!differs) return;
  const std::vector<std::string> chief = lines_of(differs->chief);
  const std::vector<std::string> theirs = lines_of(differs->theirs);
  size_t i = 0;
  while (i < chief.size() && i < theirs.size() && chief[i] == theirs[i]) ++i;
  const std::string here = i < chief.size() ? chief[i] : "(nothing)";
  const std::string there = i < theirs.size() ? theirs[i] : "(nothing)";
  const std::string field = here.substr(0, here.find('='));
  throw ConfigError(fmt::format(
      "{} runs a different job than the chief: {} is '{}' there but '{}' on the chief; every "
      "task must run the same job spec, data and trainer version",
      cluster::task_name(cluster, differs->rank), field, there.substr(there.find('=') + 1),
      here.substr(here.find('=') + 1)));
}

}  // namespace trainer::train
