// TF_CONFIG, as the trainer reads it from the environment, then every address in it taken apart
// into host and port and every rank named, as the rendezvous and the messages do.
#include "fuzz_common.h"
#include "trainer/cluster/cluster_spec.h"

using namespace trainer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_clean_errors("tf_config", [&] {
    const cluster::ClusterSpec spec = cluster::parse_tf_config(text);
    cluster::to_json(spec).dump();
    for (const std::string& address : spec.worker_addresses) {
      cluster::host_of(address);
      cluster::port_of(address);
    }
    for (int rank = 0; rank < spec.world_size; ++rank) cluster::task_name(spec, rank);
  });
  return 0;
}
