// Keeping replicas identical: broadcast the chief's parameters and buffers (at start, and BN
// running statistics every step), and prove at checkpoints that no replica has diverged, by
// comparing a bitwise checksum of the parameters across ranks. Works on lists of tensors, not
// on a module. Same thread rules as ProcessGroup: every rank calls these in the same order.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/dist/process_group.h"

namespace trainer::dist {

// In place: every tensor (parameters and buffers alike) takes root's value, bit for bit.
void broadcast_parameters(ProcessGroup& group, const std::vector<torch::Tensor>& tensors,
                          int root = 0);

// A 64-bit hash of the tensors' dtypes, shapes and bytes (in logical order, so the memory
// layout does not matter; -0.0 and 0.0 differ). Equal tensors give equal checksums on any rank.
uint64_t checksum(const std::vector<torch::Tensor>& tensors);

// All-gathers checksum(tensors) and, when any rank's differs from the chief's, throws
// DistributedError on every rank naming the ranks that differ; `when` says where in the run
// ("at checkpoint step 400", "at the end").
void check_replicas_agree(ProcessGroup& group, const std::vector<torch::Tensor>& tensors,
                          const std::string& when);

}  // namespace trainer::dist
