// State dicts saved by PyTorch's torch.save (torchvision's resnet50-*.pth and the like), read
// without Python: the zip container (PyTorch >= 1.6; its stored records read directly, each
// bounded and CRC-32 checked), the legacy stream (before 1.6: a row of pickles, then the raw
// storages), and the pickle in either through a restricted unpickler of our own (unpickler.h).
// LibTorch's torch::pickle_load cannot read these files (it turns collections.OrderedDict into
// None and rejects SETITEM), and Python's pickle would run any callable the file names; ours runs
// nothing: it knows tensors, storages, the containers and scalars a state dict is made of, and
// every other global is an inert value that makes the load fail only if the state dict holds it.
//
// Accepted shapes: a dict of name -> tensor (model.state_dict()), or a checkpoint dict whose
// "model", "state_dict", "model_state_dict" or "model_ema" entry is one (torchvision's reference
// scripts save {"model": ..., "optimizer": ..., "args": ...}). Tensors come back contiguous, in
// the file's key order. Free functions; thread-safe on distinct inputs.
#pragma once

#include <string>

#include "trainer/model/safetensors.h"

namespace trainer::model {

// True when `bytes` start like a torch.save file (a zip archive or a legacy pickle stream).
bool looks_like_pth(const std::string& bytes);

// Parses torch.save bytes / a file. Throws DataError naming `origin` and what is wrong: not a
// torch.save file, a TorchScript archive, a truncated or malformed pickle, an unknown opcode, a
// storage record missing or shorter than its declared size, a tensor whose offset, sizes and
// strides reach outside its storage, an unsupported storage type, or no state dict inside.
StateDict decode_pth(const std::string& bytes, const std::string& origin);
StateDict load_pth(const std::string& path);

// A weights file in either format, told apart by content rather than by extension:
// torch.save files (load_pth), otherwise safetensors (load_safetensors).
StateDict load_weights(const std::string& path);

}  // namespace trainer::model
