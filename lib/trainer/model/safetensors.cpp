#include "trainer/model/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>
#include <unordered_map>

#include "trainer/model/net.h"
#include "trainer/util/bytes.h"
#include "trainer/util/error.h"
#include "trainer/util/fs.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.cpp copies raw tensor bytes and assumes a little-endian host"
#endif

namespace trainer::model {

namespace {

using Json = nlohmann::ordered_json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // as the reference implementation

struct DtypeName {
  torch::ScalarType type;
  const char* name;
};

constexpr DtypeName kDtypes[] = {
    {torch::kFloat32, "F32"}, {torch::kFloat16, "F16"}, {torch::kBFloat16, "BF16"},
    {torch::kFloat64, "F64"}, {torch::kInt64, "I64"},   {torch::kInt32, "I32"},
    {torch::kInt16, "I16"},   {torch::kInt8, "I8"},     {torch::kUInt8, "U8"},
    {torch::kBool, "BOOL"},
};

const char* dtype_name(torch::ScalarType type, const std::string& key) {
  for (const DtypeName& d : kDtypes) {
    if (d.type == type) return d.name;
  }
  throw Error(ErrorKind::kInternal, "safetensors: tensor '" + key + "' has unsupported dtype " +
                                        std::string(c10::toString(type)));
}

std::string shape_string(torch::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

[[noreturn]] void corrupt(const std::string& origin, const std::string& what) {
  throw DataError("safetensors '" + origin + "': " + what);
}

// The tensor as a CPU, contiguous (row-major) copy of itself, detached from autograd.
torch::Tensor cpu_copy(const torch::Tensor& t) {
  return t.detach().to(torch::kCPU, t.scalar_type(), /*non_blocking=*/false, /*copy=*/true,
                       torch::MemoryFormat::Contiguous);
}

uint64_t json_u64(const Json& value, const std::string& origin, const std::string& what) {
  if (!value.is_number_unsigned()) corrupt(origin, what + ": expected a non-negative integer");
  return value.get<uint64_t>();
}

}  // namespace

StateDict state_dict(const torch::nn::Module& module) {
  // torchvision's state_dict(): per module its parameters then its buffers, modules depth-first
  // in registration order.
  StateDict out;
  module.apply(
      [&out](const std::string& prefix, const torch::nn::Module& m) {
        const std::string dotted = prefix.empty() ? "" : prefix + ".";
        for (const auto& item : m.named_parameters(/*recurse=*/false)) {
          if (item.value().defined()) out.emplace_back(dotted + item.key(), cpu_copy(item.value()));
        }
        for (const auto& item : m.named_buffers(/*recurse=*/false)) {
          if (item.value().defined()) out.emplace_back(dotted + item.key(), cpu_copy(item.value()));
        }
      },
      std::string());
  return out;
}

std::string encode_safetensors(const StateDict& tensors, const Metadata& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = std::move(meta);
  }
  std::vector<torch::Tensor> data;
  data.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [key, tensor] : tensors) {
    if (key.empty() || key == "__metadata__" || header.contains(key)) {
      throw Error(ErrorKind::kInternal,
                  "safetensors: invalid or duplicate tensor name '" + key + "'");
    }
    if (!tensor.defined()) {
      throw Error(ErrorKind::kInternal, "safetensors: tensor '" + key + "' is undefined");
    }
    torch::Tensor t =
        tensor.device().is_cpu() && tensor.is_contiguous() ? tensor.detach() : cpu_copy(tensor);
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[key] = {{"dtype", dtype_name(t.scalar_type(), key)},
                   {"shape", t.sizes().vec()},
                   {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(std::move(t));
  }

  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  std::string out;
  out.reserve(8 + json.size() + offset);
  const uint64_t n = json.size();
  out.resize(8);
  util::store_le(out.data(), n, 8);
  out += json;
  for (const torch::Tensor& t : data) {
    out.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  }
  return out;
}

void save_safetensors(const std::string& path, const StateDict& tensors, const Metadata& metadata) {
  util::write_file_atomic(path, encode_safetensors(tensors, metadata));
}

StateDict decode_safetensors(const std::string& bytes, const std::string& origin,
                             Metadata* metadata) {
  if (bytes.size() < 8) {
    corrupt(origin, "truncated: " + std::to_string(bytes.size()) +
                        " bytes, need at least 8 for the header size");
  }
  const uint64_t header_size = util::load_le(bytes.data(), 8);
  if (header_size > bytes.size() - 8) {
    corrupt(origin, "header size " + std::to_string(header_size) + " exceeds the " +
                        std::to_string(bytes.size() - 8) +
                        " bytes after the size field (truncated?)");
  }
  if (header_size > kMaxHeaderBytes) {
    corrupt(origin, "header size " + std::to_string(header_size) + " exceeds the 100 MiB limit");
  }

  Json header;
  try {
    header =
        Json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<ptrdiff_t>(header_size));
  } catch (const nlohmann::json::exception& e) {
    corrupt(origin, std::string("bad header JSON: ") + e.what());
  }
  if (!header.is_object()) corrupt(origin, "bad header JSON: expected an object");

  const char* data = bytes.data() + 8 + header_size;
  const uint64_t data_size = bytes.size() - 8 - header_size;

  struct Entry {
    std::string name;
    torch::ScalarType type;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  Metadata meta;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) corrupt(origin, "__metadata__: expected an object of strings");
      for (const auto& [key, value] : info.items()) {
        if (!value.is_string()) corrupt(origin, "__metadata__." + key + ": expected a string");
        meta[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!info.is_object()) corrupt(origin, where + ": expected an object");
    if (!info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets")) {
      corrupt(origin, where + ": expected the fields dtype, shape and data_offsets");
    }
    Entry e{name, torch::kFloat32, {}, 0, 0};

    const Json& dtype = info["dtype"];
    if (!dtype.is_string()) corrupt(origin, where + ": dtype: expected a string");
    const auto* found =
        std::find_if(std::begin(kDtypes), std::end(kDtypes),
                     [&](const DtypeName& d) { return dtype.get<std::string>() == d.name; });
    if (found == std::end(kDtypes)) {
      corrupt(origin, where + ": unknown dtype '" + dtype.get<std::string>() +
                          "' (supported: F32 F16 BF16 F64 I64 I32 I16 I8 U8 BOOL)");
    }
    e.type = found->type;

    const Json& shape = info["shape"];
    if (!shape.is_array()) corrupt(origin, where + ": shape: expected an array");
    const uint64_t item = c10::elementSize(e.type);
    // Bytes the shape needs; `overflow` when that does not even fit 64 bits.
    uint64_t expected = item;
    bool overflow = false, has_zero = false;
    for (const Json& dim : shape) {
      const uint64_t d = json_u64(dim, origin, where + ": shape");
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        corrupt(origin, where + ": shape: dimension too large");
      }
      e.shape.push_back(static_cast<int64_t>(d));
      has_zero = has_zero || d == 0;
      overflow = __builtin_mul_overflow(expected, d, &expected) || overflow;
    }
    if (has_zero) {
      expected = 0;
      overflow = false;
    } else if (overflow) {
      expected = std::numeric_limits<uint64_t>::max();  // beyond any data section
    }

    const Json& offsets = info["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2) {
      corrupt(origin, where + ": data_offsets: expected [begin, end]");
    }
    e.begin = json_u64(offsets[0], origin, where + ": data_offsets");
    e.end = json_u64(offsets[1], origin, where + ": data_offsets");
    if (e.begin > e.end || e.end > data_size) {
      corrupt(origin, where + ": data_offsets [" + std::to_string(e.begin) + ", " +
                          std::to_string(e.end) + "] out of range of the " +
                          std::to_string(data_size) + "-byte data section");
    }
    if (e.end - e.begin != expected) {
      corrupt(origin, where + ": data_offsets span " + std::to_string(e.end - e.begin) +
                          " bytes but shape " + shape_string(e.shape) + " of " +
                          dtype.get<std::string>() + " needs " +
                          (overflow ? std::string("more than 2^64") : std::to_string(expected)));
    }
    entries.push_back(std::move(e));
  }

  // The tensors must tile the data section exactly: no overlap, no gap, nothing after.
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  for (const Entry& e : entries) {
    if (e.begin != cursor) {
      corrupt(origin, "tensor '" + e.name + "': data_offsets begin at " + std::to_string(e.begin) +
                          " but the previous tensor ends at " + std::to_string(cursor) +
                          (e.begin < cursor ? " (overlap)" : " (gap)"));
    }
    cursor = e.end;
  }
  if (cursor != data_size) {
    corrupt(origin, "the tensors cover " + std::to_string(cursor) + " of the " +
                        std::to_string(data_size) + " data bytes");
  }

  StateDict out;
  out.reserve(entries.size());
  for (const Entry& e : entries) {
    torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(e.type));
    if (e.end > e.begin) std::memcpy(t.data_ptr(), data + e.begin, e.end - e.begin);
    if (e.type == torch::kBool) {
      const auto* raw = reinterpret_cast<const unsigned char*>(data + e.begin);
      if (std::any_of(raw, raw + (e.end - e.begin), [](unsigned char c) { return c > 1; })) {
        corrupt(origin, "tensor '" + e.name + "': BOOL data holds a byte other than 0 or 1");
      }
    }
    out.emplace_back(e.name, std::move(t));
  }
  if (metadata) *metadata = std::move(meta);
  return out;
}

StateDict load_safetensors(const std::string& path, Metadata* metadata) {
  return decode_safetensors(util::read_file(path), path, metadata);
}

LoadReport load_state_dict(torch::nn::Module& module, const StateDict& tensors,
                           const std::string& origin, bool allow_classifier_mismatch) {
  std::unordered_map<std::string, const torch::Tensor*> given;
  for (const auto& [name, tensor] : tensors) {
    if (!given.emplace(name, &tensor).second) {
      throw DataError("state dict '" + origin + "': duplicate key '" + name + "'");
    }
  }

  // The module's own tensors (aliases, not copies), in state-dict order.
  std::vector<std::pair<std::string, torch::Tensor>> targets;
  module.apply(
      [&targets](const std::string& prefix, torch::nn::Module& m) {
        const std::string dotted = prefix.empty() ? "" : prefix + ".";
        for (auto& item : m.named_parameters(/*recurse=*/false)) {
          targets.emplace_back(dotted + item.key(), item.value());
        }
        for (auto& item : m.named_buffers(/*recurse=*/false)) {
          if (item.value().defined()) targets.emplace_back(dotted + item.key(), item.value());
        }
      },
      std::string());

  // Validate everything first so a failed load leaves the module untouched.
  LoadReport report;
  std::vector<std::pair<torch::Tensor, const torch::Tensor*>> copies;
  std::set<std::string> known;
  for (const auto& [name, target] : targets) {
    known.insert(name);
    auto it = given.find(name);
    const bool skippable = allow_classifier_mismatch && is_classifier_key(name);
    if (it == given.end()) {
      if (skippable) {
        report.reinitialised.push_back(name);
        continue;
      }
      throw DataError("state dict '" + origin + "': missing key '" + name +
                      "' (the model expects shape " + shape_string(target.sizes()) + ")");
    }
    const torch::Tensor& source = *it->second;
    if (!source.defined() || source.sizes() != target.sizes()) {
      if (skippable) {
        report.reinitialised.push_back(name);
        continue;
      }
      throw DataError("state dict '" + origin + "': shape mismatch for '" + name + "': file has " +
                      (source.defined() ? shape_string(source.sizes()) : "undefined") +
                      ", the model expects " + shape_string(target.sizes()));
    }
    copies.emplace_back(target, &source);
  }
  for (const auto& [name, tensor] : tensors) {
    if (known.count(name) || (allow_classifier_mismatch && is_classifier_key(name))) continue;
    throw DataError("state dict '" + origin + "': unexpected key '" + name + "' (shape " +
                    shape_string(tensor.sizes()) + ") that the model does not have");
  }

  torch::NoGradGuard no_grad;
  for (auto& [target, source] : copies) target.copy_(*source);  // keeps target dtype/device/layout
  return report;
}

}  // namespace trainer::model
