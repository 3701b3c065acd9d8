// safetensors encode/decode (round trip, every corrupt-file case) and load_state_dict.
#include "common/catch.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "model_test_util.h"
#include "trainer/model/net.h"
#include "trainer/model/safetensors.h"
#include "trainer/util/error.h"

using namespace trainer::model;
using trainer::model::testing::calibrate_batchnorm;
using trainer::model::testing::data_error_of;
using trainer::model::testing::seeded_input;
using trainer::model::testing::TempDir;
using trainer::test::Contains;

namespace {

bool same_bytes(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  if (a.numel() == 0) return true;  // no bytes (data_ptr() may be null: memcmp must not see it)
  const torch::Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.numel() * ca.element_size()) == 0;
}

// A file from a hand-written header and `data_size` zero bytes of data.
std::string raw_file(const std::string& header, size_t data_size) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + std::string(data_size, '\0');
}

const torch::Tensor& find(const StateDict& sd, const std::string& name) {
  for (const auto& [key, tensor] : sd) {
    if (key == name) return tensor;
  }
  FAIL("no key " << name);
  static torch::Tensor none;
  return none;
}

StateDict without(StateDict sd, const std::string& name) {
  sd.erase(std::remove_if(sd.begin(), sd.end(), [&](const auto& kv) { return kv.first == name; }),
           sd.end());
  return sd;
}

}  // namespace

TEST_CASE("safetensors round trip is bit-exact", "[safetensors]") {
  torch::manual_seed(1);
  Net net = make_net({"resnet18", 10, 0});
  calibrate_batchnorm(
      *net, [&](torch::Tensor x) { return net->forward(x); }, 2);
  StateDict sd = state_dict(*net);
  REQUIRE(find(sd, "bn1.num_batches_tracked").item<int64_t>() == 1);

  torch::Tensor with_nan = seeded_input({3, 5}, 3);
  with_nan[1][2] = std::numeric_limits<float>::quiet_NaN();
  with_nan[0][0] = -0.0f;
  sd.emplace_back("extra.f32_nan", with_nan);
  sd.emplace_back("extra.bf16", seeded_input({4, 7}, 4).to(torch::kBFloat16));
  sd.emplace_back("extra.f16", seeded_input({3}, 5).to(torch::kHalf));
  sd.emplace_back("extra.f64", seeded_input({2, 2}, 6).to(torch::kDouble));
  sd.emplace_back("extra.i32", torch::arange(-5, 5, torch::kInt));
  sd.emplace_back("extra.i16", torch::arange(-3, 3, torch::kShort));
  sd.emplace_back("extra.i8", torch::arange(-128, 127, torch::kChar));
  sd.emplace_back("extra.u8", torch::arange(0, 256, torch::kInt).to(torch::kByte));
  sd.emplace_back("extra.bool", torch::tensor({true, false, true}));
  sd.emplace_back("extra.scalar", torch::tensor(3.5));
  sd.emplace_back("extra.empty", torch::zeros({0, 3}));
  const Metadata meta = {{"format", "pt"}, {"arch", "resnet18"}, {"note", "quote \" and \xc3\xa9"}};

  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  save_safetensors(path, sd, meta);

  Metadata meta_back;
  const StateDict back = load_safetensors(path, &meta_back);
  CHECK(meta_back == meta);
  REQUIRE(back.size() == sd.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    INFO(sd[i].first);
    CHECK(back[i].first == sd[i].first);  // written in StateDict order, read by data offset
    CHECK(same_bytes(back[i].second, sd[i].second));
  }

  // The header is padded so the data section starts 8-byte aligned.
  const std::string bytes = encode_safetensors(sd, meta);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  CHECK(n % 8 == 0);
  CHECK(bytes[8] == '{');

  // No metadata: none comes back.
  Metadata none = {{"stale", "x"}};
  decode_safetensors(encode_safetensors({{"a", torch::ones({2})}}), "mem", &none);
  CHECK(none.empty());
}

TEST_CASE("state_dict gives contiguous detached CPU copies", "[safetensors]") {
  Net net = make_net({"resnet18", 3, 0});
  for (auto& p : net->parameters()) {
    if (p.dim() == 4) p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
  }
  const StateDict sd = state_dict(*net);
  const torch::Tensor& w = find(sd, "conv1.weight");
  CHECK(w.is_contiguous());
  CHECK_FALSE(w.requires_grad());
  CHECK(w.device().is_cpu());
  CHECK(torch::equal(w, net->named_parameters()["conv1.weight"]));
  w.add_(1);  // a copy: the model is unchanged
  CHECK_FALSE(torch::equal(w, net->named_parameters()["conv1.weight"]));

  // A non-contiguous tensor encodes in logical order.
  const torch::Tensor t = seeded_input({4, 6}, 9).t();
  const StateDict back = decode_safetensors(encode_safetensors({{"t", t}}), "mem");
  CHECK(torch::equal(back[0].second, t));
}

TEST_CASE("corrupt safetensors files give a DataError naming the origin", "[safetensors]") {
  const std::string origin = "/jobs/weights/bad.safetensors";
  auto error_of = [&](const std::string& bytes) {
    return data_error_of([&] { decode_safetensors(bytes, origin); });
  };
  const std::string good_tensor = R"("a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";

  SECTION("sanity: the hand-written file is valid") {
    const StateDict sd = decode_safetensors(raw_file("{" + good_tensor + "}", 8), origin);
    REQUIRE(sd.size() == 1);
    CHECK(sd[0].second.sizes() == torch::IntArrayRef({2}));
  }
  SECTION("shorter than 8 bytes") {
    CHECK_THAT(error_of(""), Contains(origin) && Contains("truncated"));
    CHECK_THAT(error_of("abc"), Contains(origin) && Contains("truncated"));
  }
  SECTION("header size beyond the file") {
    std::string bytes = raw_file("{" + good_tensor + "}", 8);
    bytes[0] = static_cast<char>(0xff);
    bytes[3] = static_cast<char>(0x7f);
    CHECK_THAT(error_of(bytes), Contains(origin) && Contains("header size"));
    std::string huge(16, '\xff');
    CHECK_THAT(error_of(huge), Contains(origin) && Contains("header size"));
  }
  SECTION("bad JSON") {
    CHECK_THAT(error_of(raw_file("{\"a\": {", 0)), Contains(origin) && Contains("bad header JSON"));
    CHECK_THAT(error_of(raw_file("[1, 2]  ", 0)),
               Contains(origin) && Contains("expected an object"));
    CHECK_THAT(error_of(raw_file("{\"a\": 3}", 0)), Contains(origin) && Contains("tensor 'a'"));
    CHECK_THAT(error_of(raw_file(R"({"a": {"dtype": "F32", "shape": [2]}})", 8)),
               Contains(origin) && Contains("data_offsets"));
  }
  SECTION("unknown dtype") {
    CHECK_THAT(
        error_of(raw_file(R"({"a": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 8]}})", 8)),
        Contains(origin) && Contains("unknown dtype 'Q7'"));
    CHECK_THAT(
        error_of(raw_file(R"({"a": {"dtype": 4, "shape": [2], "data_offsets": [0, 8]}})", 8)),
        Contains(origin) && Contains("dtype"));
  }
  SECTION("bad shape") {
    CHECK_THAT(
        error_of(raw_file(R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8)),
        Contains(origin) && Contains("shape"));
    CHECK_THAT(
        error_of(raw_file(R"({"a": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})", 8)),
        Contains(origin) && Contains("shape"));
    // A product that overflows 64 bits must not wrap around to a small size.
    CHECK_THAT(
        error_of(raw_file(
            R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296, 2], "data_offsets": [0, 8]}})",
            8)),
        Contains(origin) && Contains("needs more than 2^64"));
    // 2^32 * 2^32 wraps to exactly 0 in 64 bits: still not an empty tensor.
    CHECK_THAT(
        error_of(raw_file(
            R"({"a": {"dtype": "U8", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})",
            0)),
        Contains(origin) && Contains("needs more than 2^64"));
    // A zero dimension makes an empty tensor whatever the other dimensions are.
    const StateDict empty = decode_safetensors(
        raw_file(
            R"({"a": {"dtype": "F32", "shape": [4294967296, 0, 4294967296], "data_offsets": [0, 0]}})",
            0),
        origin);
    CHECK(empty.at(0).second.numel() == 0);
  }
  SECTION("offsets out of range") {
    CHECK_THAT(error_of(raw_file(
                   R"({"a": {"dtype": "F32", "shape": [100], "data_offsets": [0, 400]}})", 8)),
               Contains(origin) && Contains("out of range"));
    CHECK_THAT(
        error_of(raw_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8)),
        Contains(origin) && Contains("out of range"));
    CHECK_THAT(
        error_of(raw_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", 8)),
        Contains(origin) && Contains("data_offsets"));
  }
  SECTION("offsets not matching shape * itemsize") {
    CHECK_THAT(
        error_of(raw_file(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8)),
        Contains(origin) && Contains("tensor 'a'") && Contains("needs 12"));
    CHECK_THAT(
        error_of(raw_file(R"({"a": {"dtype": "I64", "shape": [2], "data_offsets": [0, 8]}})", 8)),
        Contains(origin) && Contains("needs 16"));
  }
  SECTION("overlapping tensors") {
    const std::string header =
        R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})";
    CHECK_THAT(error_of(raw_file(header, 12)), Contains(origin) && Contains("overlap"));
  }
  SECTION("gaps and trailing bytes") {
    const std::string gap =
        R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}})";
    CHECK_THAT(error_of(raw_file(gap, 16)), Contains(origin) && Contains("gap"));
    CHECK_THAT(error_of(raw_file("{" + good_tensor + "}", 12)),
               Contains(origin) && Contains("cover 8 of the 12"));
  }
  SECTION("bad metadata") {
    CHECK_THAT(error_of(raw_file(R"({"__metadata__": {"k": 1}})", 0)),
               Contains(origin) && Contains("__metadata__.k"));
    CHECK_THAT(error_of(raw_file(R"({"__metadata__": [1]})", 0)),
               Contains(origin) && Contains("__metadata__"));
  }
  SECTION("bool data must be 0 or 1") {
    std::string bytes =
        raw_file(R"({"a": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}})", 2);
    bytes.back() = 7;
    CHECK_THAT(error_of(bytes), Contains(origin) && Contains("BOOL"));
  }
  SECTION("truncated copy of a real file") {
    const std::string bytes =
        encode_safetensors({{"w", torch::ones({16})}, {"b", torch::ones({4})}});
    CHECK_THAT(error_of(bytes.substr(0, bytes.size() - 3)), Contains(origin));
    CHECK_THAT(error_of(bytes.substr(0, 20)), Contains(origin) && Contains("header size"));
  }
  SECTION("a missing file") {
    TempDir dir;
    const std::string path = dir.file("nope.safetensors");
    CHECK_THAT(data_error_of([&] { load_safetensors(path); }), Contains(path));
  }
}

TEST_CASE("load_state_dict copies values, converting dtype, keeping memory format",
          "[safetensors]") {
  torch::manual_seed(31);
  Net source = make_net({"resnet18", 4, 0});
  calibrate_batchnorm(
      *source, [&](torch::Tensor x) { return source->forward(x); }, 32);
  StateDict sd = state_dict(*source);
  for (auto& [name, tensor] : sd) {
    if (tensor.is_floating_point()) tensor = tensor.to(torch::kDouble);
  }

  torch::manual_seed(33);
  Net target = make_net({"resnet18", 4, 0});
  for (auto& p : target->parameters()) {
    if (p.dim() == 4) p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
  }
  const LoadReport report = load_state_dict(*target, sd, "double.safetensors");
  CHECK(report.reinitialised.empty());
  const torch::Tensor w = target->named_parameters()["layer1.0.conv1.weight"];
  CHECK(w.scalar_type() == torch::kFloat);
  CHECK(w.is_contiguous(torch::MemoryFormat::ChannelsLast));
  CHECK(w.requires_grad());
  CHECK(torch::equal(w, source->named_parameters()["layer1.0.conv1.weight"]));
  CHECK(target->named_buffers()["bn1.num_batches_tracked"].item<int64_t>() == 1);
  CHECK(torch::equal(target->named_buffers()["layer3.1.bn2.running_var"],
                     source->named_buffers()["layer3.1.bn2.running_var"]));

  torch::NoGradGuard no_grad;
  source->eval();
  target->eval();
  const torch::Tensor x = seeded_input({2, 3, 32, 32}, 34);
  // Same weights; channels_last convolutions may round differently.
  CHECK(torch::allclose(source->forward(x), target->forward(x), 1e-5, 1e-5));
}

TEST_CASE("load_state_dict is strict", "[safetensors]") {
  const std::string origin = "ckpt/model.safetensors";
  Net source = make_net({"resnet18", 4, 0});
  const StateDict sd = state_dict(*source);
  Net target = make_net({"resnet18", 4, 0});
  const torch::Tensor before = target->named_parameters()["conv1.weight"].clone();

  SECTION("missing key") {
    CHECK_THAT(
        data_error_of(
            [&] { load_state_dict(*target, without(sd, "layer1.0.bn1.running_var"), origin); }),
        Contains(origin) && Contains("missing key 'layer1.0.bn1.running_var'") && Contains("[64]"));
  }
  SECTION("unexpected key") {
    StateDict extra = sd;
    extra.emplace_back("layer9.weight", torch::zeros({2, 3}));
    CHECK_THAT(
        data_error_of([&] { load_state_dict(*target, extra, origin); }),
        Contains(origin) && Contains("unexpected key 'layer9.weight'") && Contains("[2, 3]"));
  }
  SECTION("wrong shape") {
    StateDict bad = sd;
    for (auto& [name, tensor] : bad) {
      if (name == "conv1.weight") tensor = torch::zeros({64, 3, 3, 3});
    }
    CHECK_THAT(data_error_of([&] { load_state_dict(*target, bad, origin); }),
               Contains(origin) && Contains("'conv1.weight'") && Contains("[64, 3, 3, 3]") &&
                   Contains("[64, 3, 7, 7]"));
  }
  SECTION("duplicate key") {
    StateDict dup = sd;
    dup.push_back(sd.front());
    CHECK_THAT(data_error_of([&] { load_state_dict(*target, dup, origin); }),
               Contains(origin) && Contains("duplicate key 'conv1.weight'"));
  }
  SECTION("classifier mismatch without permission") {
    Net other = make_net({"resnet18", 7, 0});
    CHECK_THAT(data_error_of([&] { load_state_dict(*other, sd, origin); }),
               Contains("'fc.weight'") && Contains("[4, 512]") && Contains("[7, 512]"));
  }
  SECTION("allow_classifier_mismatch still rejects a backbone mismatch") {
    CHECK_THAT(data_error_of([&] {
                 load_state_dict(*target, without(sd, "layer4.1.conv2.weight"), origin, true);
               }),
               Contains("missing key 'layer4.1.conv2.weight'"));
  }
  // A failed load leaves the model as it was (everything is checked before anything is copied).
  CHECK(torch::equal(before, target->named_parameters()["conv1.weight"]));
}

TEST_CASE("allow_classifier_mismatch reinitialises a different head", "[safetensors]") {
  torch::manual_seed(41);
  Net pretrained = make_net({"resnet18", 1000, 0});
  const StateDict sd = state_dict(*pretrained);

  SECTION("different number of classes") {
    Net net = make_net({"resnet18", 5, 0});
    const torch::Tensor fc_before = net->named_parameters()["fc.weight"].clone();
    const LoadReport report = load_state_dict(*net, sd, "imagenet.safetensors", true);
    CHECK(report.reinitialised == std::vector<std::string>{"fc.weight", "fc.bias"});
    CHECK(torch::equal(net->named_parameters()["fc.weight"], fc_before));
    CHECK(torch::equal(net->named_parameters()["layer4.1.conv2.weight"],
                       pretrained->named_parameters()["layer4.1.conv2.weight"]));
  }
  SECTION("same classes: nothing reinitialised") {
    Net net = make_net({"resnet18", 1000, 0});
    CHECK(load_state_dict(*net, sd, "imagenet.safetensors", true).reinitialised.empty());
    CHECK(torch::equal(net->named_parameters()["fc.weight"],
                       pretrained->named_parameters()["fc.weight"]));
  }
  SECTION("a hidden head: its keys are missing, the file's fc.* are skipped") {
    Net net = make_net({"resnet18", 5, 32});
    const LoadReport report = load_state_dict(*net, sd, "imagenet.safetensors", true);
    CHECK(report.reinitialised ==
          std::vector<std::string>{"fc.0.weight", "fc.0.bias", "fc.2.weight", "fc.2.bias"});
    CHECK(torch::equal(net->named_parameters()["conv1.weight"],
                       pretrained->named_parameters()["conv1.weight"]));
    // Without the permission the file's fc.weight is a missing/unexpected key problem.
    CHECK_THAT(data_error_of([&] { load_state_dict(*net, sd, "imagenet.safetensors"); }),
               Contains("fc.0.weight"));
  }
}
