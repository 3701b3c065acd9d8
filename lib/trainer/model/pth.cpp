#include "trainer/model/pth.h"

#include <caffe2/serialize/versions.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <functional>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include "trainer/model/unpickler.h"
#include "trainer/util/bytes.h"
#include "trainer/util/error.h"
#include "trainer/util/fs.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "pth.cpp copies raw little-endian storage bytes and assumes a little-endian host"
#endif

namespace trainer::model {

namespace {

using detail::bad;
using detail::Kind;
using detail::kind_name;
using detail::Storage;
using detail::TensorRef;
using detail::unpickle;
using detail::Value;
using detail::ValuePtr;

// The n-byte little-endian unsigned integer at bytes[pos] (the caller has bounded pos + n).
uint64_t le_at(const std::string& bytes, uint64_t pos, int n) {
  return util::load_le(bytes.data() + pos, n);
}

// ---- From the unpickled value to tensors -------------------------------------------------------

// Raw bytes of a root storage: a pointer into memory that outlives the call, and its length.
using StorageBytes = std::function<std::pair<const char*, size_t>(const std::string& key)>;

// Builds contiguous tensors from tensor references, reading each storage's bytes in place (or
// from one aligned copy where they are misaligned). The views are bounded: each lies inside its
// storage and has at most as many elements, and all of them together take at most kOutputFactor
// times the file's size (a hostile file cannot make a small storage expand into terabytes through
// stride-0 views or repeated entries).
class Materialiser {
 public:
  static constexpr uint64_t kOutputFactor = 4;

  Materialiser(StorageBytes get, uint64_t file_bytes, std::string origin)
      : get_(std::move(get)),
        budget_(kOutputFactor * file_bytes + (1u << 20)),
        origin_(std::move(origin)) {}

  torch::Tensor operator()(const std::string& name, const TensorRef& ref) {
    const Storage& st = ref.storage->storage;
    const std::string where = "tensor '" + name + "'";
    const torch::Tensor& flat = storage(st, where);
    if (ref.sizes.size() != ref.strides.size()) {
      bad(origin_, where + ": " + std::to_string(ref.sizes.size()) + " sizes but " +
                       std::to_string(ref.strides.size()) + " strides");
    }
    // The highest element the view reaches, and its element count, must fit the storage.
    bool empty = false, overflow = ref.offset < 0;
    uint64_t last = 0, count = 1;
    for (size_t d = 0; d < ref.sizes.size(); ++d) {
      if (ref.sizes[d] < 0 || ref.strides[d] < 0) {
        bad(origin_, where + ": negative size or stride in dimension " + std::to_string(d));
      }
      empty = empty || ref.sizes[d] == 0;
      uint64_t span = 0;
      overflow =
          __builtin_mul_overflow(static_cast<uint64_t>(ref.sizes[d] > 0 ? ref.sizes[d] - 1 : 0),
                                 static_cast<uint64_t>(ref.strides[d]), &span) ||
          __builtin_add_overflow(last, span, &last) ||
          __builtin_mul_overflow(count, static_cast<uint64_t>(ref.sizes[d]), &count) || overflow;
    }
    const auto numel = static_cast<uint64_t>(flat.numel());
    if (!empty &&
        (overflow || __builtin_add_overflow(last, static_cast<uint64_t>(ref.offset), &last) ||
         last >= numel || count > numel)) {
      bad(origin_, where + ": offset " + std::to_string(ref.offset) + ", sizes " +
                       c10::str(c10::IntArrayRef(ref.sizes)) + " and strides " +
                       c10::str(c10::IntArrayRef(ref.strides)) + " do not fit its storage of " +
                       std::to_string(numel) + " elements");
    }
    const uint64_t bytes = empty ? 0 : count * flat.element_size();
    if (bytes > budget_) {
      bad(origin_, where + ": the tensors would take more than " + std::to_string(kOutputFactor) +
                       " times the file's size");
    }
    budget_ -= bytes;
    if (empty) return torch::empty(ref.sizes, flat.options());
    return flat.as_strided(ref.sizes, ref.strides, ref.offset).clone(at::MemoryFormat::Contiguous);
  }

 private:
  const torch::Tensor& storage(const Storage& st, const std::string& where) {
    const std::string id = st.key + "@" + std::to_string(st.offset) + "+" +
                           std::to_string(st.numel) + ":" + c10::toString(st.dtype);
    const auto cached = flats_.find(id);
    if (cached != flats_.end()) return cached->second;
    const auto [data, length] = bytes_of(st.key);
    const uint64_t item = c10::elementSize(st.dtype);
    uint64_t need = 0;
    if (__builtin_add_overflow(static_cast<uint64_t>(st.offset), static_cast<uint64_t>(st.numel),
                               &need) ||
        __builtin_mul_overflow(need, item, &need) || need > length) {
      bad(origin_, where + ": storage '" + st.key + "' declares " + std::to_string(st.numel) +
                       " elements of " + std::to_string(item) + " bytes" +
                       (st.offset ? " at element " + std::to_string(st.offset) : std::string()) +
                       " but holds " + std::to_string(length) + " bytes");
    }
    const uint64_t bytes = static_cast<uint64_t>(st.numel) * item;
    if (bytes > budget_) {
      bad(origin_, where + ": the storages would take more than " + std::to_string(kOutputFactor) +
                       " times the file's size");
    }
    budget_ -= bytes;
    const char* src = data + st.offset * item;
    if (st.dtype == torch::kBool) {
      const auto* raw = reinterpret_cast<const unsigned char*>(src);
      for (int64_t k = 0; k < st.numel; ++k) {
        if (raw[k] > 1) bad(origin_, where + ": bool storage holds a byte other than 0 or 1");
      }
    }
    const auto options = torch::TensorOptions().dtype(st.dtype);
    torch::Tensor flat;
    if (reinterpret_cast<uintptr_t>(src) % item == 0) {
      // Aligned (zip records always are): a read-only view of the bytes, which outlive it;
      // the views taken from it are cloned.
      flat = torch::from_blob(const_cast<char*>(src), {st.numel}, options);
    } else {  // a legacy stream's storage at an odd offset: an aligned copy
      flat = torch::empty({st.numel}, options);
      if (bytes > 0) std::memcpy(flat.data_ptr(), src, bytes);
    }
    return flats_.emplace(id, std::move(flat)).first->second;
  }

  // A root storage's bytes, asked of get_ once per key (the zip checks a record's CRC-32 then),
  // however many views of it the tensors take.
  std::pair<const char*, size_t> bytes_of(const std::string& key) {
    const auto known = raw_.find(key);
    if (known != raw_.end()) return known->second;
    return raw_.emplace(key, get_(key)).first->second;
  }

  StorageBytes get_;
  uint64_t budget_;
  std::string origin_;
  std::unordered_map<std::string, std::pair<const char*, size_t>> raw_;  // key -> its bytes
  std::unordered_map<std::string, torch::Tensor> flats_;                 // one per view
};

bool all_tensors(const Value& dict) {
  for (const auto& [key, value] : dict.dict) {
    if (key->kind != Kind::kString || value->kind != Kind::kTensor) return false;
  }
  return true;
}

// The state dict inside the unpickled object: the object itself, or a checkpoint's entry.
const Value& find_state_dict(const Value& root, const std::string& origin) {
  if (root.kind != Kind::kDict) {
    bad(origin, std::string("holds ") + kind_name(root.kind) +
                    (root.kind == Kind::kObject ? " (" + root.s + ")" : "") +
                    ", not a state dict (save one with torch.save(model.state_dict(), PATH))");
  }
  if (!root.dict.empty() && all_tensors(root)) return root;
  for (const char* key : {"state_dict", "model", "model_state_dict"}) {
    for (const auto& [k, v] : root.dict) {
      if (k->kind == Kind::kString && k->s == key && v->kind == Kind::kDict && !v->dict.empty()) {
        return *v;
      }
    }
  }
  // Name the first entry that is not a tensor, so the user sees what the dict is.
  for (const auto& [k, v] : root.dict) {
    if (k->kind != Kind::kString) bad(origin, "a dict key is not a string, so it is no state dict");
    if (v->kind != Kind::kTensor) {
      bad(origin, "entry '" + k->s + "' is " + kind_name(v->kind) +
                      (v->kind == Kind::kObject ? " (" + v->s + ")" : "") +
                      ", not a tensor, and there is no 'state_dict' or 'model' entry holding one");
    }
  }
  bad(origin, "holds an empty dict, not a state dict");
}

StateDict to_state_dict(const Value& root, StorageBytes get, uint64_t file_bytes,
                        const std::string& origin) {
  Materialiser materialise(std::move(get), file_bytes, origin);
  const Value& dict = find_state_dict(root, origin);
  // A model saved from inside DistributedDataParallel has every key under "module.".
  bool ddp = true;
  for (const auto& entry : dict.dict) ddp = ddp && entry.first->s.rfind("module.", 0) == 0;
  StateDict out;
  out.reserve(dict.dict.size());
  for (const auto& [k, v] : dict.dict) {
    const std::string name = ddp ? k->s.substr(7) : k->s;
    if (name.empty()) bad(origin, "a state dict key is empty");
    out.emplace_back(name, materialise(name, v->tensor));
  }
  return out;
}

// ---- Containers --------------------------------------------------------------------------------

// The legacy stream's first pickle: protocol 2, LONG1 of 10 bytes (0x1950a86a20f9469cfc6c), STOP.
const std::string kLegacyMagic("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.", 15);

bool is_zip(const std::string& bytes) { return bytes.compare(0, 4, "PK\x03\x04", 4) == 0; }

// Legacy torch.save (before PyTorch 1.6): pickles of the magic number, the protocol version and
// sys_info, then the object, then the sorted list of storage keys; then per key an int64 element
// count and the raw storage bytes.
bool is_legacy(const std::string& bytes) {
  return bytes.compare(0, kLegacyMagic.size(), kLegacyMagic) == 0;
}

StateDict decode_legacy(const std::string& bytes, const std::string& origin) {
  size_t pos = kLegacyMagic.size();  // the magic number's pickle, matched by is_legacy()
  const ValuePtr version = unpickle(bytes, pos, origin).root;
  if (version->kind != Kind::kInt || version->i != 1001) {
    bad(origin, "legacy torch.save protocol version is not 1001");
  }
  const ValuePtr sys_info = unpickle(bytes, pos, origin).root;
  if (sys_info->kind == Kind::kDict) {
    for (const auto& [k, v] : sys_info->dict) {
      if (k->kind == Kind::kString && k->s == "little_endian" && v->kind == Kind::kBool &&
          v->i == 0) {
        bad(origin, "was saved on a big-endian machine; re-save it on a little-endian one");
      }
    }
  }
  const detail::Unpickled object = unpickle(bytes, pos, origin);
  const ValuePtr keys = unpickle(bytes, pos, origin).root;
  if (keys->kind != Kind::kList) bad(origin, "the legacy storage key list is missing");

  // The storages follow in key order, each an int64 element count and its bytes; the element
  // size comes from the type the object's persistent ids gave the key.
  std::unordered_map<std::string, std::pair<const char*, size_t>> storages;
  for (const ValuePtr& key : keys->items) {
    if (key->kind != Kind::kString) bad(origin, "a legacy storage key is not a string");
    const auto type = object.storage_types.find(key->s);
    if (type == object.storage_types.end()) {
      bad(origin, "storage '" + key->s + "' is listed but no tensor refers to it");
    }
    if (bytes.size() - pos < 8) bad(origin, "truncated before storage '" + key->s + "'");
    const uint64_t numel = le_at(bytes, pos, 8);
    pos += 8;
    uint64_t length = 0;
    if (__builtin_mul_overflow(numel, c10::elementSize(type->second), &length) ||
        length > bytes.size() - pos) {
      bad(origin, "storage '" + key->s + "' declares " + std::to_string(numel) +
                      " elements but the file ends " + std::to_string(bytes.size() - pos) +
                      " bytes later (truncated?)");
    }
    storages[key->s] = {bytes.data() + pos, static_cast<size_t>(length)};
    pos += length;
  }
  return to_state_dict(
      *object.root,
      [&](const std::string& key) {
        const auto it = storages.find(key);
        if (it == storages.end()) bad(origin, "storage '" + key + "' is not in the file");
        return it->second;
      },
      bytes.size(), origin);
}

// ---- The zip container -------------------------------------------------------------------------
// torch.save's zip (PyTorch >= 1.6) is read here, not through LibTorch's PyTorchStreamReader:
// that reader throws from its constructor on malformed archives after miniz has allocated its
// state, which is then never freed (two fuzz findings: no version record, and a zip64 end record
// that says the directory is empty), parses the version with a throwing
// std::stoull, has miniz's CRC checks off, and copies every record. torch.save stores its
// records uncompressed, so reading them is bounds checks over the file's bytes: one parse of the
// central directory, each record found through it, bounded by the file, its local header
// checked, its CRC-32 verified, and its bytes used where they lie.

struct Member {
  uint32_t crc = 0;
  uint16_t flags = 0;
  uint16_t method = 0;      // 0: stored
  uint64_t compressed = 0;  // sizes and offset after any zip64 extra field
  uint64_t size = 0;
  uint64_t local = 0;  // offset of its local header
};

class ZipArchive {
 public:
  // Parses the central directory (zip64 included) and finds the archive folder and the format
  // version. Throws DataError on anything malformed.
  ZipArchive(const std::string& bytes, std::string origin)
      : bytes_(bytes), origin_(std::move(origin)) {
    read_directory();
    const size_t slash = first_.find('/');
    if (slash == std::string::npos) {
      bad(origin_, "zip member '" + first_ + "' is not in a folder: not a torch.save archive");
    }
    prefix_ = first_.substr(0, slash + 1);
    check_version();
  }

  bool has(const std::string& record) const { return members_.count(prefix_ + record) != 0; }

  // A record's bytes, where they lie in the file: stored, inside the file, CRC-32 checked.
  std::pair<const char*, size_t> record(const std::string& record) const {
    const auto it = members_.find(prefix_ + record);
    if (it == members_.end()) bad(origin_, "record '" + record + "' is not in the zip archive");
    const Member& m = it->second;
    if (m.flags & 1) bad(origin_, "record '" + record + "' is encrypted");
    if (m.method != 0) {
      bad(origin_, "record '" + record + "' is compressed; torch.save writes stored records only");
    }
    if (m.compressed != m.size) {
      bad(origin_, "record '" + record + "' is stored but its sizes differ (" +
                       std::to_string(m.compressed) + " and " + std::to_string(m.size) + ")");
    }
    const uint64_t file = bytes_.size();
    if (m.local > file || file - m.local < 30 || le_at(bytes_, m.local, 4) != 0x04034b50) {
      bad(origin_, "record '" + record + "' has no local header where the directory says");
    }
    const uint64_t name_len = le_at(bytes_, m.local + 26, 2);
    const uint64_t start = m.local + 30 + name_len + le_at(bytes_, m.local + 28, 2);
    if (start > file || file - start < m.size) {
      bad(origin_, "record '" + record + "' runs past the end of the file (truncated?)");
    }
    if (bytes_.compare(m.local + 30, name_len, it->first) != 0) {
      bad(origin_, "record '" + record + "': its local header names another member");
    }
    // Records of a well-formed zip do not overlap, so all that is read and checked fits in the
    // file once; members whose ranges overlap could otherwise ask for the file's size in CRC
    // work per record.
    checked_bytes_ += m.size;
    if (checked_bytes_ > file) {
      bad(origin_, "record '" + record + "' overlaps others: the records read take more bytes " +
                       "than the file holds");
    }
    const char* data = bytes_.data() + start;
    const uint32_t computed = util::crc32(data, m.size);
    // A stored CRC of 0 means none was computed (PyTorch >= 2.5 with
    // torch.serialization.set_crc32_options(False)); torch.load does not check it either.
    if (m.crc != 0 && computed != m.crc) {
      std::ostringstream msg;
      msg << "record '" << record << "' fails its CRC-32 check (stored 0x" << std::hex << m.crc
          << ", computed 0x" << computed << "): the file is damaged";
      bad(origin_, msg.str());
    }
    return {data, static_cast<size_t>(m.size)};
  }

 private:
  [[noreturn]] void malformed(const std::string& what) const {
    bad(origin_, "malformed zip central directory: " + what);
  }

  void read_directory() {
    const std::string& b = bytes_;
    const uint64_t size = b.size();
    // The end-of-central-directory record: in the last 64 KiB + 22 bytes.
    if (size < 22) malformed("file too short");
    uint64_t eocd = size - 22;
    const uint64_t lowest = size > 22 + 65535 ? size - 22 - 65535 : 0;
    while (le_at(b, eocd, 4) != 0x06054b50) {
      if (eocd == lowest) malformed("no end record (truncated?)");
      --eocd;
    }
    uint64_t entries = le_at(b, eocd + 10, 2);
    uint64_t offset = le_at(b, eocd + 16, 4);
    if (le_at(b, eocd + 4, 4) != 0 || le_at(b, eocd + 8, 2) != entries) {
      malformed("spans several disks");
    }
    if (eocd >= 20 && le_at(b, eocd - 20, 4) == 0x07064b50) {  // zip64 locator -> zip64 record
      const uint64_t z = le_at(b, eocd - 20 + 8, 8);
      if (size < 56 || z > size - 56 || le_at(b, z, 4) != 0x06064b50) {
        malformed("bad zip64 end record");
      }
      if (le_at(b, z + 16, 8) != 0 || le_at(b, z + 24, 8) != le_at(b, z + 32, 8)) {
        malformed("spans several disks");
      }
      entries = le_at(b, z + 32, 8);
      offset = le_at(b, z + 48, 8);
    }
    if (entries == 0) malformed("no members");
    uint64_t pos = offset;
    for (uint64_t k = 0; k < entries; ++k) {
      const std::string entry = "entry " + std::to_string(k);
      if (pos > size || size - pos < 46 || le_at(b, pos, 4) != 0x02014b50) {
        malformed(entry + " out of place");
      }
      const uint64_t name_len = le_at(b, pos + 28, 2);
      const uint64_t extra_len = le_at(b, pos + 30, 2);
      const uint64_t rest = name_len + extra_len + le_at(b, pos + 32, 2);
      if (size - pos - 46 < rest) malformed(entry + " runs past the end");
      Member m;
      m.flags = static_cast<uint16_t>(le_at(b, pos + 8, 2));
      m.method = static_cast<uint16_t>(le_at(b, pos + 10, 2));
      m.crc = static_cast<uint32_t>(le_at(b, pos + 16, 4));
      m.compressed = le_at(b, pos + 20, 4);
      m.size = le_at(b, pos + 24, 4);
      m.local = le_at(b, pos + 42, 4);
      zip64_extra(pos + 46 + name_len, extra_len, m, entry);
      std::string name = b.substr(pos + 46, name_len);
      if (k == 0) first_ = name;
      if (!members_.emplace(name, m).second) malformed("member '" + name + "' appears twice");
      pos += 46 + rest;
    }
  }

  // Sizes and offset too large for the entry's 32-bit fields are in its zip64 extra field (id 1),
  // in this order, each present only when the entry's field is 0xffffffff.
  void zip64_extra(uint64_t pos, uint64_t len, Member& m, const std::string& entry) const {
    const bool want[3] = {m.size == 0xffffffff, m.compressed == 0xffffffff, m.local == 0xffffffff};
    if (!want[0] && !want[1] && !want[2]) return;
    const uint64_t end = pos + len;
    while (end - pos >= 4) {
      const uint64_t id = le_at(bytes_, pos, 2);
      const uint64_t n = le_at(bytes_, pos + 2, 2);
      if (end - pos - 4 < n) break;
      if (id == 1) {
        uint64_t at = pos + 4;
        uint64_t* fields[3] = {&m.size, &m.compressed, &m.local};
        for (int f = 0; f < 3; ++f) {
          if (!want[f]) continue;
          if (at + 8 > pos + 4 + n) malformed(entry + ": zip64 extra field too short");
          *fields[f] = le_at(bytes_, at, 8);
          at += 8;
        }
        return;
      }
      pos += 4 + n;
    }
    malformed(entry + ": sizes need a zip64 extra field it lacks");
  }

  // The format version LibTorch records: what this reader knows is versions 1 to LibTorch's
  // maximum (the pickle layout of storages has not changed within them).
  void check_version() const {
    const char* name = has(".data/version") ? ".data/version" : "version";
    if (!has(name)) bad(origin_, "zip archive without a version record: not a torch.save file");
    const auto [data, n] = record(name);
    const std::string text(data, std::min<size_t>(n, 64));
    uint64_t value = 0;
    size_t k = text.find_first_not_of(" \t\n\r\f\v");
    const bool digits = k != std::string::npos && std::isdigit(static_cast<unsigned char>(text[k]));
    for (int d = 0; k < text.size() && std::isdigit(static_cast<unsigned char>(text[k])) && d < 6;
         ++k, ++d) {
      value = value * 10 + static_cast<uint64_t>(text[k] - '0');
    }
    if (!digits || value < caffe2::serialize::kMinSupportedFileFormatVersion ||
        value > caffe2::serialize::kMaxSupportedFileFormatVersion) {
      bad(origin_, "torch.save format version '" + text + "' is not one this reader knows (" +
                       std::to_string(caffe2::serialize::kMinSupportedFileFormatVersion) + " to " +
                       std::to_string(caffe2::serialize::kMaxSupportedFileFormatVersion) + ")");
    }
  }

  const std::string& bytes_;
  std::string origin_;
  std::unordered_map<std::string, Member> members_;
  mutable uint64_t checked_bytes_ = 0;  // bytes of the records read so far
  std::string first_;                   // the first member's name: its folder is the archive's
  std::string prefix_;                  // that folder and a slash
};

StateDict decode_zip(const std::string& bytes, const std::string& origin) {
  const ZipArchive zip(bytes, origin);
  if (zip.has("constants.pkl") || zip.has("code/__torch__.py")) {
    bad(origin,
        "is a TorchScript archive (torch.jit.save), not a state dict; save the weights "
        "with torch.save(model.state_dict(), PATH)");
  }
  if (!zip.has("data.pkl")) bad(origin, "zip archive without data.pkl: not a torch.save file");
  if (zip.has("byteorder")) {
    const auto [data, n] = zip.record("byteorder");
    if (std::string(data, n) != "little") {
      bad(origin, "was saved on a big-endian machine; re-save it on a little-endian one");
    }
  }
  const auto [pkl, pkl_size] = zip.record("data.pkl");
  const std::string pickle(pkl, pkl_size);
  size_t pos = 0;
  const ValuePtr root = unpickle(pickle, pos, origin).root;
  return to_state_dict(
      *root,
      [&](const std::string& key) {
        const std::string name = "data/" + key;
        if (key.find('/') != std::string::npos || !zip.has(name)) {
          bad(origin, "storage record '" + name + "' is missing");
        }
        return zip.record(name);
      },
      bytes.size(), origin);
}

}  // namespace

bool looks_like_pth(const std::string& bytes) { return is_zip(bytes) || is_legacy(bytes); }

StateDict decode_pth(const std::string& bytes, const std::string& origin) {
  if (is_zip(bytes)) return decode_zip(bytes, origin);
  if (is_legacy(bytes)) return decode_legacy(bytes, origin);
  bad(origin, "not a torch.save file (neither a zip archive nor a legacy torch.save stream)");
}

StateDict load_pth(const std::string& path) { return decode_pth(util::read_file(path), path); }

StateDict load_weights(const std::string& path) {
  std::string bytes = util::read_file(path);
  if (looks_like_pth(bytes)) return decode_pth(bytes, path);
  return decode_safetensors(bytes, path);
}

}  // namespace trainer::model
