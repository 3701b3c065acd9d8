// torch.save files read in C++: torchvision's own .pth (made at test time by
// tests/parity/make_pth.py with TRAINER_PYTHON) gives torchvision's logits, every torch.save
// flavour of one state dict reads the same, and hostile streams built byte by byte here fail with
// a DataError naming the file and the problem.
#include "common/catch.h"

#include <fstream>
#include <iostream>

#include "model_test_util.h"
#include "trainer/model/net.h"
#include "trainer/model/pth.h"
#include "trainer/model/safetensors.h"

using namespace trainer::model;
using trainer::model::testing::data_error_of;
using trainer::model::testing::find;
using trainer::model::testing::quoted;
using trainer::model::testing::require_torchvision;
using trainer::model::testing::Run;
using trainer::model::testing::run_command;
using trainer::model::testing::TempDir;
using trainer::test::Contains;

namespace {

// Runs make_pth.py into `dir`; `marker` is the file evil.pth would create if it were run.
void make_fixtures(const TempDir& dir) {
  require_torchvision();
  const std::string command =
      std::string(TRAINER_PYTHON) + " " +
      quoted(std::string(TRAINER_SOURCE_DIR) + "/tests/parity/make_pth.py") + " --out " +
      quoted(dir.path().string()) + " --marker " + quoted(dir.file("MARKER"));
  const Run run = run_command(command);
  INFO("command: " << command << "\noutput:\n" << run.output);
  REQUIRE(run.rc == 0);
}

void require_same(const StateDict& got, const StateDict& expected) {
  REQUIRE(got.size() == expected.size());
  for (size_t k = 0; k < got.size(); ++k) {
    INFO("tensor " << k << " '" << expected[k].first << "'");
    REQUIRE(got[k].first == expected[k].first);
    CHECK(got[k].second.scalar_type() == expected[k].second.scalar_type());
    CHECK(got[k].second.sizes() == expected[k].second.sizes());
    CHECK(got[k].second.is_contiguous());
    CHECK(torch::equal(got[k].second, expected[k].second));
  }
}

}  // namespace

TEST_CASE("a torchvision .pth gives torchvision's logits, and its head is replaced for new classes",
          "[pth][parity]") {
  TempDir dir("pth");
  make_fixtures(dir);
  const StateDict sd = load_pth(dir.file("resnet50.pth"));
  CHECK(sd.size() == 320);  // parameters and buffers, num_batches_tracked included

  torch::manual_seed(3);
  Net net = make_net({"resnet50", 1000, 0});
  CHECK(load_state_dict(*net, sd, "resnet50.pth").reinitialised.empty());  // strict
  const StateDict io = load_safetensors(dir.file("resnet50_io.safetensors"));
  net->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor expected = find(io, "logits");
  const torch::Tensor got = net->forward(find(io, "input"));
  const double diff = (got - expected).abs().max().item<double>();
  std::cout << "[pth] resnet50.pth in ours: max |logits - torchvision's| = " << diff
            << " (logits max |x| = " << expected.abs().max().item<double>() << ")\n";
  CHECK(diff <= 1e-4);

  // model.num_classes / head_hidden replace fc as the tutorial replaces the top; the rest loads.
  SECTION("5 classes") {
    Net five = make_net({"resnet50", 5, 0});
    const LoadReport report = load_state_dict(*five, sd, "resnet50.pth", true);
    CHECK(report.reinitialised == std::vector<std::string>{"fc.weight", "fc.bias"});
    CHECK(torch::equal(five->named_parameters()["layer4.2.conv3.weight"],
                       find(sd, "layer4.2.conv3.weight")));
    CHECK(torch::equal(five->named_buffers()["bn1.running_var"], find(sd, "bn1.running_var")));
  }
  SECTION("a hidden head") {
    Net hidden = make_net({"resnet50", 5, 16});
    const LoadReport report = load_state_dict(*hidden, sd, "resnet50.pth", true);
    CHECK(report.reinitialised ==
          std::vector<std::string>{"fc.0.weight", "fc.0.bias", "fc.2.weight", "fc.2.bias"});
  }
  SECTION("load_weights tells the formats apart by content, not by name") {
    std::filesystem::copy_file(dir.file("resnet50.pth"), dir.file("weights.bin"));
    CHECK(torch::equal(find(load_weights(dir.file("weights.bin")), "fc.weight"),
                       find(sd, "fc.weight")));
    save_safetensors(dir.file("weights.pth"), {{"fc.bias", find(sd, "fc.bias")}});
    CHECK(
        torch::equal(find(load_weights(dir.file("weights.pth")), "fc.bias"), find(sd, "fc.bias")));
  }
}

TEST_CASE("every torch.save flavour of a state dict reads the same, and other pickles are refused",
          "[pth][parity]") {
  TempDir dir("pth");
  make_fixtures(dir);
  const StateDict expected = load_safetensors(dir.file("resnet18.safetensors"));
  for (const char* name : {"resnet18.pth", "resnet18_legacy.pth", "resnet18_proto4.pth",
                           "resnet18_checkpoint.pth", "resnet18_ddp.pth"}) {
    INFO(name);
    require_same(load_pth(dir.file(name)), expected);
  }
  // Views (transposed, sliced, sharing one storage), every dtype, 0-dim and empty tensors.
  require_same(load_pth(dir.file("views.pth")), load_safetensors(dir.file("views.safetensors")));

  CHECK_THAT(data_error_of([&] { load_pth(dir.file("scripted.pt")); }),
             Contains("scripted.pt") && Contains("TorchScript") &&
                 Contains("torch.save(model.state_dict(), PATH)"));
  CHECK_THAT(data_error_of([&] { load_pth(dir.file("list.pth")); }),
             Contains("list.pth") && Contains("holds a list, not a state dict"));
  // Python's pickle would call os.system here; ours calls nothing and names what it found.
  CHECK_THAT(data_error_of([&] { load_pth(dir.file("evil.pth")); }),
             Contains("evil.pth") && Contains("entry 'payload'") && Contains("system"));
  CHECK_FALSE(std::filesystem::exists(dir.file("MARKER")));
  // A file cut short: the zip's central directory is gone.
  std::filesystem::copy_file(dir.file("resnet18.pth"), dir.file("cut.pth"));
  std::filesystem::resize_file(dir.file("cut.pth"),
                               std::filesystem::file_size(dir.file("cut.pth")) / 2);
  CHECK_THAT(data_error_of([&] { load_pth(dir.file("cut.pth")); }), Contains("cut.pth"));
  std::filesystem::copy_file(dir.file("resnet18_legacy.pth"), dir.file("cut_legacy.pth"));
  std::filesystem::resize_file(dir.file("cut_legacy.pth"),
                               std::filesystem::file_size(dir.file("cut_legacy.pth")) - 100);
  CHECK_THAT(data_error_of([&] { load_pth(dir.file("cut_legacy.pth")); }),
             Contains("cut_legacy.pth") && Contains("truncated"));
}

// ---- Hostile legacy streams, built here opcode by opcode ---------------------------------------

namespace {

// A pickle (protocol 2) written opcode by opcode.
// The n-byte little-endian form of v, and the n-byte little-endian integer at bytes[at].
std::string le_bytes(uint64_t v, int n) {
  std::string out;
  for (int k = 0; k < n; ++k) out += static_cast<char>((v >> (8 * k)) & 0xff);
  return out;
}
uint64_t le_value(const std::string& bytes, size_t at, int n) {
  uint64_t v = 0;
  for (int k = 0; k < n; ++k)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[at + k])) << (8 * k);
  return v;
}

struct Pickle {
  std::string b = "\x80\x02";
  Pickle& op(char c) {
    b += c;
    return *this;
  }
  Pickle& raw(const std::string& s) {
    b += s;
    return *this;
  }
  Pickle& le(uint64_t v, int n) { return raw(le_bytes(v, n)); }
  Pickle& str(const std::string& s) { return op('X').le(s.size(), 4).raw(s); }
  Pickle& i(int32_t v) { return op('J').le(static_cast<uint32_t>(v), 4); }
  Pickle& global(const std::string& module, const std::string& name) {
    return op('c').raw(module + "\n" + name + "\n");
  }
  Pickle& ints(const std::vector<int64_t>& v) {
    op('(');
    for (int64_t x : v) i(static_cast<int32_t>(x));
    return op('t');
  }
  // _rebuild_tensor_v2(<float storage `key` of `numel`>, offset, sizes, strides, False, {}).
  Pickle& tensor(const std::string& key, int64_t numel, int64_t offset,
                 const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
    global("torch._utils", "_rebuild_tensor_v2").op('(');
    op('(')
        .str("storage")
        .global("torch", "FloatStorage")
        .str(key)
        .str("cpu")
        .i(static_cast<int32_t>(numel))
        .op('t')
        .op('Q');
    i(static_cast<int32_t>(offset)).ints(sizes).ints(strides).op('\x89');
    global("collections", "OrderedDict").op(')').op('R');
    return op('t').op('R');
  }
  std::string done() const { return b + "."; }
};

// A legacy torch.save stream: magic, version, sys_info, `object`, the key list, the storages.
std::string legacy(const std::string& object,
                   const std::vector<std::pair<std::string, std::vector<float>>>& storages) {
  std::string out("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.", 15);
  out += Pickle().op('M').le(1001, 2).done();
  out += Pickle().op('}').done();
  out += object;
  Pickle keys;
  keys.op(']').op('(');
  for (const auto& s : storages) keys.str(s.first);
  out += keys.op('e').done();
  for (const auto& [key, values] : storages) {
    out += le_bytes(values.size(), 8);
    out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  }
  return out;
}

std::string one_tensor(int64_t numel, int64_t offset, const std::vector<int64_t>& sizes,
                       const std::vector<int64_t>& strides) {
  return Pickle()
      .op('}')
      .op('(')
      .str("w")
      .tensor("0", numel, offset, sizes, strides)
      .op('u')
      .done();
}

std::string error_of(const std::string& bytes) {
  return data_error_of([&] { decode_pth(bytes, "hostile.pth"); });
}

}  // namespace

TEST_CASE("a hand-built legacy stream reads, and hostile ones fail by name", "[pth]") {
  const std::vector<float> six = {0, 1, 2, 3, 4, 5};
  // The builder is right: a valid stream gives the transposed 3x2 view of 0..5.
  const StateDict ok = decode_pth(legacy(one_tensor(6, 0, {3, 2}, {1, 3}), {{"0", six}}), "ok.pth");
  REQUIRE(ok.size() == 1);
  CHECK(ok[0].first == "w");
  CHECK(torch::equal(ok[0].second, torch::tensor({0.f, 3.f, 1.f, 4.f, 2.f, 5.f}).reshape({3, 2})));
  CHECK(looks_like_pth(legacy(one_tensor(6, 0, {6}, {1}), {{"0", six}})));

  SECTION("a view past its storage") {
    CHECK_THAT(error_of(legacy(one_tensor(6, 1, {2, 3}, {3, 1}), {{"0", six}})),
               Contains("hostile.pth") && Contains("tensor 'w'") && Contains("do not fit"));
  }
  SECTION("a stride-0 view larger than its storage") {
    CHECK_THAT(error_of(legacy(one_tensor(6, 0, {100000, 100000}, {0, 0}), {{"0", six}})),
               Contains("do not fit"));
  }
  SECTION("a storage declaring more than the file holds") {
    CHECK_THAT(error_of(legacy(one_tensor(600, 0, {6}, {1}), {{"0", six}})),
               Contains("storage '0' declares 600 elements") && Contains("24 bytes"));
    std::string cut = legacy(one_tensor(6, 0, {6}, {1}), {{"0", six}});
    cut.resize(cut.size() - 4);
    CHECK_THAT(error_of(cut), Contains("truncated"));
  }
  SECTION("one storage repeated until it would take far more memory than the file") {
    Pickle p;
    p.op('}').op('(');
    for (int k = 0; k < 400; ++k) p.str("w" + std::to_string(k)).tensor("0", 1000, 0, {1000}, {1});
    CHECK_THAT(error_of(legacy(p.op('u').done(), {{"0", std::vector<float>(1000)}})),
               Contains("times the file's size"));
  }
  SECTION("values nested without end") {
    Pickle p;
    p.op(')');
    for (int k = 0; k < 100000; ++k) p.op('\x85');  // TUPLE1
    CHECK_THAT(error_of(legacy(p.done(), {})), Contains("nested deeper than 64"));
  }
  SECTION("a list inside itself, and a list changed after it went into another") {
    CHECK_THAT(
        error_of(legacy(Pickle().op(']').op('q').le(0, 1).op('h').le(0, 1).op('a').done(), {})),
        Contains("inside itself"));
    const std::string changed = Pickle()
                                    .op(']')
                                    .op('q')
                                    .le(0, 1)  // A
                                    .op(']')
                                    .op('h')
                                    .le(0, 1)
                                    .op('a')  // B = [A]
                                    .op('h')
                                    .le(0, 1)
                                    .op('N')
                                    .op('a')  // A.append(None)
                                    .done();
    CHECK_THAT(error_of(legacy(changed, {})), Contains("already inside another value"));
  }
  SECTION("malformed pickles") {
    CHECK_THAT(error_of(legacy(Pickle().op('\xff').done(), {})),
               Contains("hostile.pth") && Contains("unsupported pickle opcode 0xff"));
    CHECK_THAT(error_of(legacy(Pickle().op('h').le(7, 1).done(), {})),
               Contains("memo entry 7 never stored"));
    CHECK_THAT(error_of(legacy(Pickle().op('a').done(), {})), Contains("empty stack"));
    std::string cut = legacy(one_tensor(6, 0, {6}, {1}), {{"0", six}});
    cut.resize(40);  // inside the object's pickle
    CHECK_THAT(error_of(cut), Contains("pickle byte") && Contains("truncated"));
    CHECK_THAT(error_of(legacy(Pickle().global("torch", "UntypedStorage").op('N').done(), {})),
               Contains("STOP with a malformed stack"));
    const std::string bad_storage = Pickle()
                                        .op('}')
                                        .op('(')
                                        .str("w")
                                        .global("torch._utils", "_rebuild_tensor_v2")
                                        .op('(')
                                        .op('(')
                                        .str("storage")
                                        .global("torch", "QInt8Storage")
                                        .str("0")
                                        .str("cpu")
                                        .i(1)
                                        .op('t')
                                        .op('Q')
                                        .i(0)
                                        .ints({1})
                                        .ints({1})
                                        .op('t')
                                        .op('R')
                                        .op('u')
                                        .done();
    CHECK_THAT(error_of(legacy(bad_storage, {{"0", {0}}})),
               Contains("unsupported storage type torch.QInt8Storage"));
  }
  SECTION("neither a zip nor a legacy stream") {
    CHECK_THAT(error_of("{\"not\": \"pickle\"}"), Contains("not a torch.save file"));
    CHECK_THAT(error_of(std::string("PK\x03\x04 broken", 11)),
               Contains("hostile.pth") && Contains("malformed zip"));
  }
}

TEST_CASE("LibTorch's torch::pickle_save output reads, and a damaged archive fails by name",
          "[pth]") {
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("w", torch::arange(6, torch::kFloat).reshape({2, 3}).t());
  dict.insert("n", torch::tensor(5, torch::kLong));
  const std::vector<char> saved = torch::pickle_save(dict);
  const std::string bytes(saved.begin(), saved.end());
  REQUIRE(looks_like_pth(bytes));
  const StateDict sd = decode_pth(bytes, "saved.pth");
  REQUIRE(sd.size() == 2);
  CHECK(sd[0].first == "w");
  CHECK(torch::equal(sd[0].second, torch::tensor({0.f, 3.f, 1.f, 4.f, 2.f, 5.f}).reshape({3, 2})));
  CHECK(sd[1].first == "n");
  CHECK(sd[1].second.item<int64_t>() == 5);

  // A flipped byte in the first storage record (the floats 0..5): the zip's CRC-32 catches it.
  const std::vector<float> values = {0, 1, 2, 3, 4, 5};
  std::string damaged = bytes;
  const size_t at = damaged.find(std::string(reinterpret_cast<const char*>(values.data()), 24));
  REQUIRE(at != std::string::npos);
  damaged[at + 5] ^= 0x55;
  CHECK_THAT(data_error_of([&] { decode_pth(damaged, "damaged.pth"); }),
             Contains("damaged.pth") && Contains("record 'data/0' fails its CRC-32 check"));

  // No version record (LibTorch's own reader leaked miniz's state here: a fuzz finding).
  std::string unversioned = bytes;
  for (size_t p = 0; (p = unversioned.find("archive/version", p)) != std::string::npos; ++p) {
    unversioned[p + 14] = 'X';
  }
  CHECK_THAT(data_error_of([&] { decode_pth(unversioned, "unversioned.pth"); }),
             Contains("unversioned.pth") && Contains("without a version record"));

  // A zip64 end record that says the directory is empty, placed before the end record: the
  // directory is read through it (LibTorch's reader leaked miniz's state here: a fuzz finding).
  {
    REQUIRE(bytes.size() > 22);
    const size_t eocd = bytes.size() - 22;
    REQUIRE(bytes.compare(eocd, 4, "PK\x05\x06", 4) == 0);
    const std::string zip64 = "PK\x06\x06" + le_bytes(44, 8) + le_bytes(45, 2) + le_bytes(45, 2) +
                              le_bytes(0, 4) + le_bytes(0, 4) + le_bytes(0, 8) + le_bytes(0, 8) +
                              le_bytes(0, 8) + le_bytes(eocd, 8);
    const std::string locator = "PK\x06\x07" + le_bytes(0, 4) + le_bytes(eocd, 8) + le_bytes(1, 4);
    const std::string emptied = bytes.substr(0, eocd) + zip64 + locator + bytes.substr(eocd);
    CHECK_THAT(data_error_of([&] { decode_pth(emptied, "emptied.pth"); }),
               Contains("emptied.pth") && Contains("no members"));
  }

  // Two directory entries with one name.
  std::string twice = bytes;
  const size_t second = twice.rfind("archive/data/1");
  REQUIRE(second != std::string::npos);
  REQUIRE(second > twice.find("PK\x01\x02"));  // the directory's copy of the name
  twice[second + 13] = '0';
  CHECK_THAT(data_error_of([&] { decode_pth(twice, "twice.pth"); }),
             Contains("twice.pth") && Contains("'archive/data/0' appears twice"));

  // Central-directory entries of the storage records, to patch their CRC and sizes.
  const auto entry_of = [](const std::string& zip, const std::string& name) {
    for (size_t p = zip.find("PK\x01\x02"); p != std::string::npos;
         p = zip.find("PK\x01\x02", p + 1)) {
      if (zip.compare(p + 46, le_value(zip, p + 28, 2), name) == 0) return p;
    }
    FAIL("no directory entry " << name);
    return std::string::npos;
  };
  const auto put32 = [](std::string& zip, size_t at, uint64_t v) {
    zip.replace(at, 4, le_bytes(v, 4));
  };
  const auto data_start = [](const std::string& zip, size_t entry) {
    const size_t local = le_value(zip, entry + 42, 4);
    return local + 30 + le_value(zip, local + 26, 2) + le_value(zip, local + 28, 2);
  };

  // A stored CRC of 0 is "not computed" (PyTorch >= 2.5, set_crc32_options(False)), not damage.
  std::string uncrc = bytes;
  put32(uncrc, entry_of(uncrc, "archive/data/0") + 16, 0);
  const StateDict uncrc_sd = decode_pth(uncrc, "nocrc.pth");
  REQUIRE(uncrc_sd.size() == 2);
  CHECK(torch::equal(uncrc_sd[0].second, sd[0].second));

  // Records whose ranges overlap (each runs to the end of the file): the CRC work they could ask
  // for is bounded by the file's size.
  std::string overlapping = bytes;
  for (const char* name : {"archive/data/0", "archive/data/1"}) {
    const size_t e = entry_of(overlapping, name);
    const size_t size = overlapping.size() - data_start(overlapping, e);
    put32(overlapping, e + 16, 0);
    put32(overlapping, e + 20, size);
    put32(overlapping, e + 24, size);
  }
  CHECK_THAT(data_error_of([&] { decode_pth(overlapping, "overlap.pth"); }),
             Contains("overlap.pth") && Contains("overlaps others"));

  // A member marked deflated (a reader that inflated it would allocate whatever size it declares).
  std::string deflated = bytes;
  const size_t entry = deflated.find("PK\x01\x02");
  REQUIRE(entry != std::string::npos);
  deflated[entry + 10] = 8;
  CHECK_THAT(data_error_of([&] { decode_pth(deflated, "deflated.pth"); }),
             Contains("deflated.pth") && Contains("is compressed"));
}
