// A contact sheet of pipeline images (for `trainer preview`): a grid of [H, W, 3] uint8 RGB
// images, each with its caption lines under it, as PNG bytes. OpenCV stays inside the .cpp.
// Stateless; thread-safe.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

namespace trainer::data {

// `images`: [H, W, 3] uint8 RGB tensors (any sizes); `captions[i]`: the lines under image i
// (too long lines are cut with "..."). Images smaller than 128 pixels a side are scaled up
// (nearest) so the captions fit. Error(kInternal) for a bad image or mismatched lengths.
std::string encode_contact_sheet(const std::vector<torch::Tensor>& images,
                                 const std::vector<std::vector<std::string>>& captions,
                                 int columns);

}  // namespace trainer::data
