// State dicts as .safetensors files (8-byte little-endian header length, a JSON header of
// {name: {dtype, shape, data_offsets}} plus "__metadata__", then the raw little-endian data).
// Keys are torchvision's state-dict keys, buffers included (running_mean, running_var,
// num_batches_tracked), so files load into torchvision with strict=True and back.
// Free functions; thread-safe on distinct files.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace trainer::model {

// Ordered (name, tensor) pairs: parameters and buffers as torchvision's state_dict() lists them.
using StateDict = std::vector<std::pair<std::string, torch::Tensor>>;
using Metadata = std::map<std::string, std::string>;

// The module's parameters and buffers under their dotted names (detached CPU, contiguous copies),
// per module its parameters then its buffers, depth-first in registration order.
StateDict state_dict(const torch::nn::Module& module);

// Serialises to safetensors bytes / writes atomically. Supported dtypes: F32, F16, BF16, F64,
// I64, I32, I16, I8, U8, BOOL. Data is laid out in StateDict order (any device or memory
// format; written as row-major CPU bytes); the header is space-padded to a multiple of 8.
// A duplicate or empty name, "__metadata__" or an unsupported dtype is a bug: Error(kInternal).
std::string encode_safetensors(const StateDict& tensors, const Metadata& metadata = {});
void save_safetensors(const std::string& path, const StateDict& tensors,
                      const Metadata& metadata = {});

// Parses safetensors bytes / a file; the tensors come back sorted by data offset (so a file we
// wrote comes back in its StateDict order). Throws DataError naming the file and what is wrong
// (truncated, bad header JSON, offsets out of range, unknown dtype, a span that is not
// shape x itemsize, tensors that overlap or leave gaps in the data section, non-string metadata).
StateDict decode_safetensors(const std::string& bytes, const std::string& origin,
                             Metadata* metadata = nullptr);
StateDict load_safetensors(const std::string& path, Metadata* metadata = nullptr);

struct LoadReport {
  std::vector<std::string> reinitialised;  // classifier keys skipped for a shape mismatch
};

// Copies `tensors` into the module's parameters and buffers (no autograd), converting dtype
// and device and keeping each module tensor's memory format. strict: every module key must be
// present and no extra key allowed, shapes equal; otherwise a DataError names the first problem
// key (and both shapes). Everything is checked before anything is copied, so a failed load
// leaves the module unchanged. allow_classifier_mismatch: classifier keys (is_classifier_key)
// whose shape differs (or which are missing) are left freshly initialised and listed in the
// report, and classifier keys of the file that the module lacks (fc.weight against an fc.0/fc.2
// head) are ignored.
LoadReport load_state_dict(torch::nn::Module& module, const StateDict& tensors,
                           const std::string& origin, bool allow_classifier_mismatch = false);

}  // namespace trainer::model
