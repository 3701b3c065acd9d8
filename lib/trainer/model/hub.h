// Where model.pretrained's weights come from, resolved to a local file:
//   a path (.pth from torch.save, or .safetensors; gs:// as util::local_path maps it): as it is;
//   an http(s):// URL: fetched into torchvision's own cache, $TORCH_HOME/hub/checkpoints
//     (TORCH_HOME defaults to $XDG_CACHE_HOME/torch, else ~/.cache/torch), named as the URL's
//     last path segment; when that name carries a hash prefix (name-<8 or more hex digits>.ext,
//     torch.hub's convention) the download's SHA-256 must begin with it;
//   torchvision:<WEIGHTS> (IMAGENET1K_V1, IMAGENET1K_V2, DEFAULT): torchvision's published file
//     for model.arch, fetched the same way, always hash-checked; TRAINER_WEIGHTS_MIRROR=URL
//     replaces torchvision's host (https://download.pytorch.org) for sites with their own copy.
// A file already in the cache is used without the network (a machine that ran torchvision has
// it), checked against its name's hash prefix. A download goes to a file of its own in the
// cache directory (mkstemp), is fsynced, checked and then renamed, so several tasks sharing one
// cache each download and the last rename wins with the same bytes; nothing half-written is
// ever under the final name, and nothing is left behind on an error. Proxies come from the
// usual variables (libcurl: http_proxy, https_proxy, no_proxy). A progress bar is drawn on
// stderr when it is a terminal. Errors are DataError (exit 3) naming the URL, the cache path and
// what to do, Interrupted (exit 143) on SIGTERM/SIGINT, or ConfigError (exit 2) for an unknown
// name. In a build without downloads (TRAINER_DOWNLOADS off) only cached files are used.
// Thread-compatible; a download is synchronous.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer::model {

// One of torchvision's published ImageNet weights.
struct TorchvisionWeights {
  const char* arch;    // model.arch
  const char* name;    // IMAGENET1K_V1 | IMAGENET1K_V2
  const char* file;    // the file name under https://download.pytorch.org/models/
  bool is_default;     // torchvision's DEFAULT for the arch
  int64_t num_params;  // torchvision's meta["num_params"]
  double top1;         // ImageNet-1K acc@1 (%)
};

// torchvision's table for every arch this trainer builds that has published weights.
const std::vector<TorchvisionWeights>& torchvision_weights();

// The cache directory torch.hub uses: $TORCH_HOME/hub/checkpoints.
std::string torch_hub_checkpoints_dir();

// torch.hub's hash prefix of a file name: the hex digits between a '-' and the '.' after them
// ("resnet50-11ad3fa6.pth" -> "11ad3fa6"); "" when there is none or fewer than 8 digits.
std::string hash_prefix_of(const std::string& file_name);

// model.pretrained resolved to a local weights file (downloading when needed); "" stays "".
// `arch` is model.arch (for torchvision: names).
std::string resolve_pretrained(const std::string& pretrained, const std::string& arch);

}  // namespace trainer::model
