#include "trainer/model/hub.h"

#if TRAINER_DOWNLOADS
#include <curl/curl.h>
#endif
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <regex>
#include <vector>

#include <fmt/format.h>

#include "trainer/util/error.h"
#include "trainer/util/fs.h"
#include "trainer/util/log.h"
#if TRAINER_DOWNLOADS
#include "trainer/util/sha256.h"
#endif
#include "trainer/util/signals.h"
#include "trainer/util/storage.h"

namespace trainer::model {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTorchvisionHost = "https://download.pytorch.org";

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// The last path segment of a URL, without a query or fragment.
std::string file_name_of(const std::string& url) {
  std::string path = url.substr(0, url.find_first_of("?#"));
  while (!path.empty() && path.back() == '/') path.pop_back();
  const size_t slash = path.find_last_of('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const size_t scheme = url.find("://");
  if (name.empty() || name == "." || name == ".." ||
      (scheme != std::string::npos && slash <= scheme + 2)) {
    throw ConfigError("model.pretrained: '" + url +
                      "' names no file (expected a URL ending in the file's name, e.g. "
                      "https://host/models/resnet50-11ad3fa6.pth)");
  }
  return name;
}

#if TRAINER_DOWNLOADS
struct Transfer {
  FILE* out = nullptr;
  util::Sha256 sha;
  int64_t bytes = 0;
  bool failed_write = false;
  bool tty = false;
  std::string label;
  std::chrono::steady_clock::time_point drawn;
};

// libcurl's write callback (C code above it: nothing may throw through it).
size_t write_chunk(char* data, size_t size, size_t count, void* user) noexcept {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  try {
    if (std::fwrite(data, 1, n, t->out) != n) {
      t->failed_write = true;
      return 0;  // libcurl stops with CURLE_WRITE_ERROR
    }
    t->sha.add(data, n);
  } catch (...) {
    t->failed_write = true;
    return 0;
  }
  t->bytes += static_cast<int64_t>(n);
  return n;
}

int progress(void* user, curl_off_t total, curl_off_t now, curl_off_t, curl_off_t) noexcept {
  auto* t = static_cast<Transfer*>(user);
  if (util::stop_requested()) return 1;  // SIGTERM / Ctrl-C: abort the transfer
  if (!t->tty) return 0;
  const auto at = std::chrono::steady_clock::now();
  if (at - t->drawn < std::chrono::milliseconds(200) && !(total > 0 && now == total)) return 0;
  t->drawn = at;
  if (total > 0) {
    std::fprintf(stderr, "\r%s: %.1f / %.1f MB (%3.0f %%)", t->label.c_str(),
                 static_cast<double>(now) / 1e6, static_cast<double>(total) / 1e6,
                 100.0 * static_cast<double>(now) / static_cast<double>(total));
  } else {
    std::fprintf(stderr, "\r%s: %.1f MB", t->label.c_str(), static_cast<double>(now) / 1e6);
  }
  std::fflush(stderr);
  return 0;
}

// The partial download: a file of its own in the cache directory (mkstemp: unique across the
// processes and hosts that share the cache), closed and removed unless kept.
class PartialFile {
 public:
  PartialFile(const fs::path& dir, const std::string& name) {
    std::string pattern = (dir / ("." + name + ".partial-XXXXXX")).string();
    const int fd = ::mkstemp(pattern.data());
    if (fd < 0) util::throw_io_error("model.pretrained: cannot write in", dir, errno);
    path_ = pattern;
    file_ = ::fdopen(fd, "wb");
    if (file_ == nullptr) {
      const int err = errno;
      ::close(fd);
      discard();
      util::throw_io_error("model.pretrained: cannot write", path_, err);
    }
  }
  ~PartialFile() {
    if (file_ != nullptr) std::fclose(file_);
    if (!kept_) discard();
  }
  PartialFile(const PartialFile&) = delete;
  PartialFile& operator=(const PartialFile&) = delete;
  FILE* file() const { return file_; }
  const fs::path& path() const { return path_; }
  // Flushes, fsyncs and closes; false when any of them failed.
  bool close() {
    const bool ok = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
    const bool closed = std::fclose(file_) == 0;
    file_ = nullptr;
    return ok && closed;
  }
  // Renames the file to `to` (atomically replacing what a task sharing the cache put there).
  void keep_as(const fs::path& to) {
    if (std::rename(path_.c_str(), to.c_str()) != 0) {
      util::throw_io_error("model.pretrained: cannot rename the download to", to, errno);
    }
    kept_ = true;
  }

 private:
  void discard() {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  fs::path path_;
  FILE* file_ = nullptr;
  bool kept_ = false;
};

// Downloads `url` to `cached` in the cache directory `dir`, checked against `expected_prefix`.
void download(const std::string& url, const std::string& expected_prefix, const fs::path& dir,
              const std::string& name, const fs::path& cached) {
  static const CURLcode init = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (init != CURLE_OK) {
    throw Error(ErrorKind::kInternal,
                std::string("model.pretrained: libcurl: ") + curl_easy_strerror(init));
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    throw DataError("model.pretrained: cannot create the weights cache '" + dir.string() +
                    "': " + ec.message() + " (set TORCH_HOME to a writable directory)");
  }
  PartialFile partial(dir, name);
  Transfer t;
  t.out = partial.file();
  t.tty = util::stderr_is_tty();
  t.label = "downloading " + name;
  std::unique_ptr<CURL, void (*)(CURL*)> curl(curl_easy_init(), &curl_easy_cleanup);
  if (!curl) throw Error(ErrorKind::kInternal, "model.pretrained: curl_easy_init failed");
  char error[CURL_ERROR_SIZE] = {0};
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
#if LIBCURL_VERSION_NUM >= 0x075500  // 7.85: the string forms
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#endif
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);     // the process has threads; no SIGALRM
  curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);  // HTTP 4xx/5xx is an error
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &write_chunk);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, &progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, &t);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "trainer (libcurl)");
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
  // A stalled transfer is an error, not a hang: under 1 KB/s for a minute.
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
  const CURLcode rc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  const bool closed = partial.close();
  if (t.tty) std::fprintf(stderr, "\n");
  if (rc != CURLE_OK || !closed) {
    if (util::stop_requested()) {
      throw Interrupted("model.pretrained: the download of " + url + " was stopped");
    }
    std::string why = t.failed_write || !closed
                          ? "writing " + partial.path().string() + " failed (a full disk?)"
                      : error[0] != '\0' ? std::string(error)
                                         : std::string(curl_easy_strerror(rc));
    if (status >= 400) why += fmt::format(" (HTTP {})", status);
    throw DataError(fmt::format(
        "model.pretrained: cannot download '{}': {}. The weights cache is '{}': on a machine "
        "without access, put the file there by hand as '{}' (torchvision's cache: a machine that "
        "ran torchvision has it) and run again, or give model.pretrained a local path",
        url, why, dir.string(), cached.string()));
  }
  const std::string digest = t.sha.hex();
  if (!expected_prefix.empty() && digest.compare(0, expected_prefix.size(), expected_prefix) != 0) {
    throw DataError(fmt::format(
        "model.pretrained: '{}' is not the file its name promises: the hash prefix in '{}' is {}, "
        "and the downloaded file's SHA-256 begins {}; nothing was kept in '{}'",
        url, name, expected_prefix, digest.substr(0, expected_prefix.size()), dir.string()));
  }
  partial.keep_as(cached);
  util::fsync_dir(dir);
  spdlog::info("model.pretrained: downloaded {} ({:.1f} MB, SHA-256 {}...) into {}", url,
               static_cast<double>(t.bytes) / 1e6, digest.substr(0, 16), cached.string());
}
// A cached file whose name carries a hash prefix is checked as a download is (a file another
// tool or a copy by hand put there); a mismatch names the file to remove.
void check_cached(const fs::path& cached, const std::string& expected_prefix) {
  if (expected_prefix.empty()) return;
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(cached.c_str(), "rb"), &std::fclose);
  if (!f) util::throw_io_error("model.pretrained: cannot read", cached, errno);
  util::Sha256 sha;
  std::vector<char> chunk(1 << 20);
  for (size_t n; (n = std::fread(chunk.data(), 1, chunk.size(), f.get())) > 0;) {
    sha.add(chunk.data(), n);
  }
  if (std::ferror(f.get())) util::throw_io_error("model.pretrained: cannot read", cached, errno);
  const std::string digest = sha.hex();
  if (digest.compare(0, expected_prefix.size(), expected_prefix) != 0) {
    throw DataError(fmt::format(
        "model.pretrained: the cached '{}' is not the file its name promises: its SHA-256 begins "
        "{}, the name's hash prefix is {}; remove it (a damaged or foreign copy) and run again",
        cached.string(), digest.substr(0, expected_prefix.size()), expected_prefix));
  }
}
#else
void check_cached(const fs::path&, const std::string&) {}  // no SHA-256 in this build

void download(const std::string& url, const std::string&, const fs::path& dir, const std::string&,
              const fs::path& cached) {
  throw DataError("model.pretrained: cannot download '" + url +
                  "': this trainer was built without downloads (-DTRAINER_DOWNLOADS=OFF, no "
                  "libcurl). The weights cache is '" +
                  dir.string() + "': put the file there as '" + cached.string() +
                  "' and run again, or give model.pretrained a local path");
}
#endif  // TRAINER_DOWNLOADS

// The cached copy of `url` (torch.hub's cache), downloaded first when it is not there.
std::string fetch(const std::string& url, const std::string& expected_prefix) {
  const fs::path dir = torch_hub_checkpoints_dir();
  const std::string name = file_name_of(url);
  const fs::path cached = dir / name;
  std::error_code ec;
  if (fs::is_regular_file(cached, ec)) {
    check_cached(cached, expected_prefix);
    spdlog::info("model.pretrained: {} from the cache, {}", name, cached.string());
    return cached.string();
  }
  download(url, expected_prefix, dir, name, cached);
  return cached.string();
}

}  // namespace

const std::vector<TorchvisionWeights>& torchvision_weights() {
  // torchvision 0.26's published ImageNet-1K weights (torchvision.models.*_Weights).
  static const std::vector<TorchvisionWeights> table = {
      {"resnet18", "IMAGENET1K_V1", "resnet18-f37072fd.pth", true, 11689512, 69.758},
      {"resnet34", "IMAGENET1K_V1", "resnet34-b627a593.pth", true, 21797672, 73.314},
      {"resnet50", "IMAGENET1K_V1", "resnet50-0676ba61.pth", false, 25557032, 76.13},
      {"resnet50", "IMAGENET1K_V2", "resnet50-11ad3fa6.pth", true, 25557032, 80.858},
      {"resnet101", "IMAGENET1K_V1", "resnet101-63fe2227.pth", false, 44549160, 77.374},
      {"resnet101", "IMAGENET1K_V2", "resnet101-cd907fc2.pth", true, 44549160, 81.886},
      {"resnet152", "IMAGENET1K_V1", "resnet152-394f9c45.pth", false, 60192808, 78.312},
      {"resnet152", "IMAGENET1K_V2", "resnet152-f82ba261.pth", true, 60192808, 82.284},
      {"resnext50_32x4d", "IMAGENET1K_V1", "resnext50_32x4d-7cdf4587.pth", false, 25028904, 77.618},
      {"resnext50_32x4d", "IMAGENET1K_V2", "resnext50_32x4d-1a0047aa.pth", true, 25028904, 81.198},
      {"resnext101_32x8d", "IMAGENET1K_V1", "resnext101_32x8d-8ba56ff5.pth", false, 88791336,
       79.312},
      {"resnext101_32x8d", "IMAGENET1K_V2", "resnext101_32x8d-110c445d.pth", true, 88791336,
       82.834},
      {"resnext101_64x4d", "IMAGENET1K_V1", "resnext101_64x4d-173b62eb.pth", true, 83455272,
       83.246},
      {"wide_resnet50_2", "IMAGENET1K_V1", "wide_resnet50_2-95faca4d.pth", false, 68883240, 78.468},
      {"wide_resnet50_2", "IMAGENET1K_V2", "wide_resnet50_2-9ba9bcbe.pth", true, 68883240, 81.602},
      {"wide_resnet101_2", "IMAGENET1K_V1", "wide_resnet101_2-32ee1156.pth", false, 126886696,
       78.848},
      {"wide_resnet101_2", "IMAGENET1K_V2", "wide_resnet101_2-d733dc28.pth", true, 126886696,
       82.51},
      {"efficientnet_b0", "IMAGENET1K_V1", "efficientnet_b0_rwightman-7f5810bc.pth", true, 5288548,
       77.692},
      {"efficientnet_b1", "IMAGENET1K_V1", "efficientnet_b1_rwightman-bac287d4.pth", false, 7794184,
       78.642},
      {"efficientnet_b1", "IMAGENET1K_V2", "efficientnet_b1-c27df63c.pth", true, 7794184, 79.838},
      {"efficientnet_b2", "IMAGENET1K_V1", "efficientnet_b2_rwightman-c35c1473.pth", true, 9109994,
       80.608},
      {"efficientnet_b3", "IMAGENET1K_V1", "efficientnet_b3_rwightman-b3899882.pth", true, 12233232,
       82.008},
      {"efficientnet_b4", "IMAGENET1K_V1", "efficientnet_b4_rwightman-23ab8bcd.pth", true, 19341616,
       83.384},
  };
  return table;
}

std::string torch_hub_checkpoints_dir() {
  std::string home = env("TORCH_HOME");
  if (home.empty() && !env("XDG_CACHE_HOME").empty()) home = env("XDG_CACHE_HOME") + "/torch";
  if (home.empty() && !env("HOME").empty()) home = env("HOME") + "/.cache/torch";
  if (home.empty()) {
    throw ConfigError(
        "model.pretrained: no directory for the weights cache: set TORCH_HOME (or HOME)");
  }
  return (fs::path(home) / "hub" / "checkpoints").string();
}

std::string hash_prefix_of(const std::string& file_name) {
  // torch.hub's HASH_REGEX, and its documented convention of "the first eight or more digits":
  // shorter runs of hex digits are parts of names ("resnet-50.pth", "effnet-b4.pth").
  static const std::regex kHash("-([a-f0-9]*)\\.");
  std::smatch m;
  if (!std::regex_search(file_name, m, kHash) || m[1].length() < 8) return "";
  return m[1].str();
}

std::string resolve_pretrained(const std::string& pretrained, const std::string& arch) {
  if (pretrained.empty()) return "";
  if (pretrained.rfind("http://", 0) == 0 || pretrained.rfind("https://", 0) == 0) {
    return fetch(pretrained, hash_prefix_of(file_name_of(pretrained)));
  }
  const std::string scheme = "torchvision:";
  if (pretrained.rfind(scheme, 0) != 0) return util::local_path(pretrained, "model.pretrained");
  const std::string wanted = pretrained.substr(scheme.size());
  std::string names;
  for (const TorchvisionWeights& w : torchvision_weights()) {
    if (arch != w.arch) continue;
    names +=
        fmt::format("{}{}{}", names.empty() ? "" : ", ", w.name, w.is_default ? " (DEFAULT)" : "");
    if (wanted != w.name && !(wanted == "DEFAULT" && w.is_default)) continue;
    std::string host = env("TRAINER_WEIGHTS_MIRROR");
    while (!host.empty() && host.back() == '/') host.pop_back();
    if (host.empty()) host = kTorchvisionHost;
    spdlog::info("model.pretrained: torchvision's {} {} (ImageNet-1K top-1 {:.2f} %)", arch, w.name,
                 w.top1);
    // torchvision's files always carry their hash prefix: the download is always checked.
    return fetch(host + "/models/" + w.file, hash_prefix_of(w.file));
  }
  if (names.empty()) {
    throw ConfigError("model.pretrained: " + pretrained +
                      ": torchvision publishes no weights for model.arch " + arch);
  }
  throw ConfigError("model.pretrained: " + pretrained + ": torchvision's weights for " + arch +
                    " are " + names + " (torchvision:NAME)");
}

}  // namespace trainer::model
