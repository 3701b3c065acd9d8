// model/hub.h without a network: torch.hub's hash-prefix rule, its cache directory, the
// torchvision weight table, SHA-256 (the known answers of FIPS 180-4), and the errors that come
// before any download. The downloads themselves: tests/integration/test_hub.cpp (loopback HTTP).
#include "common/catch.h"

#include <cstdlib>
#include <map>
#include <set>
#include <string>

#include "trainer/model/hub.h"
#include "trainer/model/net.h"
#include "trainer/util/error.h"
#if TRAINER_DOWNLOADS
#include "trainer/util/sha256.h"
#endif

using namespace trainer::model;

namespace {

// Sets an environment variable for the object's lifetime (restores or unsets it after).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      old_ = old;
      had_ = true;
    }
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

}  // namespace

TEST_CASE("hash_prefix_of follows torch.hub's HASH_REGEX and its eight-digit convention", "[hub]") {
  CHECK(hash_prefix_of("resnet50-11ad3fa6.pth") == "11ad3fa6");
  CHECK(hash_prefix_of("efficientnet_b0_rwightman-7f5810bc.pth") == "7f5810bc");
  CHECK(hash_prefix_of("wide_resnet50_2-9ba9bcbe.pth") == "9ba9bcbe");
  CHECK(hash_prefix_of("model.pth").empty());
  CHECK(hash_prefix_of("my-Model.pth").empty());  // not hex: no prefix, as torch.hub
  // Fewer than torch.hub's "eight or more digits": part of the name, not a hash.
  CHECK(hash_prefix_of("resnet-50.pth").empty());
  CHECK(hash_prefix_of("efficientnet-b4.pth").empty());
  CHECK(hash_prefix_of("model-0123456789abcdef.safetensors") == "0123456789abcdef");
}

TEST_CASE("the weights cache is torch.hub's: $TORCH_HOME, $XDG_CACHE_HOME/torch, ~/.cache/torch",
          "[hub]") {
  {
    ScopedEnv home("TORCH_HOME", "/data/torch");
    CHECK(torch_hub_checkpoints_dir() == "/data/torch/hub/checkpoints");
  }
  ScopedEnv no_torch_home("TORCH_HOME", nullptr);
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
    CHECK(torch_hub_checkpoints_dir() == "/xdg/torch/hub/checkpoints");
  }
  ScopedEnv no_xdg("XDG_CACHE_HOME", nullptr);
  ScopedEnv user("HOME", "/home/u");
  CHECK(torch_hub_checkpoints_dir() == "/home/u/.cache/torch/hub/checkpoints");
}

TEST_CASE("torchvision's weight table: every built arch with published weights, one DEFAULT each",
          "[hub]") {
  std::set<std::string> archs;
  std::map<std::string, int> defaults;
  for (const TorchvisionWeights& w : torchvision_weights()) {
    INFO(w.arch << " " << w.name);
    archs.insert(w.arch);
    defaults[w.arch] += w.is_default ? 1 : 0;
    CHECK(hash_prefix_of(w.file).size() == 8);
    CHECK((std::string(w.name) == "IMAGENET1K_V1" || std::string(w.name) == "IMAGENET1K_V2"));
    // The table's parameter count is the model this trainer builds (the small ones: the big
    // ones' counts are test_resnet.cpp's).
    if (w.num_params < 30000000) {
      CHECK(count_parameters(*make_net({w.arch, 1000, 0})) == w.num_params);
    }
  }
  CHECK(archs == std::set<std::string>(supported_archs().begin(), supported_archs().end()));
  for (const auto& [arch, n] : defaults) {
    INFO(arch);
    CHECK(n == 1);
  }
}

TEST_CASE("model.pretrained: names and URLs refused before any download", "[hub]") {
  ScopedEnv home("TORCH_HOME", "/nonexistent-torch-home");
  CHECK(resolve_pretrained("", "resnet50").empty());
  try {
    resolve_pretrained("torchvision:IMAGENET1K_V9", "resnet50");
    FAIL("expected a ConfigError");
  } catch (const trainer::ConfigError& e) {
    CHECK_THAT(e.what(), trainer::test::Contains("IMAGENET1K_V1, IMAGENET1K_V2 (DEFAULT)"));
  }
  CHECK_THROWS_AS(resolve_pretrained("https://example.org/", "resnet50"), trainer::ConfigError);
}

#if TRAINER_DOWNLOADS
TEST_CASE("SHA-256 gives FIPS 180-4's answers", "[hub]") {
  CHECK(trainer::util::Sha256().hex() ==
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(trainer::util::Sha256().add("abc").hex() ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  trainer::util::Sha256 pieces;
  pieces.add("abcdbcdecdefdefgefghfghighij").add("hijkijkljklmklmnlmnomnopnopq");
  CHECK(pieces.hex() == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}
#endif  // TRAINER_DOWNLOADS
