#include "trainer/model/pth.h"

#include <caffe2/serialize/versions.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include "trainer/util/bytes.h"
#include "trainer/util/error.h"
#include "trainer/util/fs.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "pth.cpp copies raw little-endian storage bytes and assumes a little-endian host"
#endif

namespace trainer::model {

namespace {

[[noreturn]] void bad(const std::string& origin, const std::string& what) {
  throw DataError("'" + origin + "': " + what);
}

// The n-byte little-endian unsigned integer at bytes[pos] (the caller has bounded pos + n).
uint64_t le_at(const std::string& bytes, uint64_t pos, int n) {
  return util::load_le(bytes.data() + pos, n);
}

// ---- Values of the restricted unpickler --------------------------------------------------------

struct Value;
using ValuePtr = std::shared_ptr<Value>;

enum class Kind {
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kTuple,
  kList,
  kDict,
  kGlobal,
  kStorage,
  kTensor,
  kObject
};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "a bool";
    case Kind::kInt:
      return "an int";
    case Kind::kFloat:
      return "a float";
    case Kind::kString:
      return "a string";
    case Kind::kTuple:
      return "a tuple";
    case Kind::kList:
      return "a list";
    case Kind::kDict:
      return "a dict";
    case Kind::kGlobal:
      return "a class or function";
    case Kind::kStorage:
      return "a storage";
    case Kind::kTensor:
      return "a tensor";
    case Kind::kObject:
      return "an object";
  }
  return "a value";
}

struct Storage {
  std::string key;  // zip: record data/<key>; legacy: the root storage's key
  torch::ScalarType dtype = torch::kFloat;
  int64_t offset = 0;  // elements into the root storage (legacy views only)
  int64_t numel = 0;
};

struct TensorRef {
  ValuePtr storage;  // kind kStorage
  int64_t offset = 0;
  std::vector<int64_t> sizes, strides;
};

struct Value {
  Kind kind = Kind::kNone;
  int depth = 1;        // nesting, capped so hostile input cannot recurse deep on destruction
  bool frozen = false;  // inside another value: no longer mutable, so depth stays true
  int64_t i = 0;
  double f = 0;
  std::string s;                                    // string; global "module.name"; object's class
  std::vector<ValuePtr> items;                      // tuple, list
  std::vector<std::pair<ValuePtr, ValuePtr>> dict;  // dict, in insertion order
  Storage storage;
  TensorRef tensor;
};

constexpr int kMaxDepth = 64;
constexpr int64_t kMaxDims = 64;

ValuePtr make(Kind kind) {
  auto v = std::make_shared<Value>();
  v->kind = kind;
  return v;
}

// ---- The unpickler -----------------------------------------------------------------------------

torch::ScalarType storage_dtype(const std::string& global, const std::string& origin) {
  static const std::unordered_map<std::string, torch::ScalarType> kTypes = {
      {"torch.FloatStorage", torch::kFloat}, {"torch.DoubleStorage", torch::kDouble},
      {"torch.HalfStorage", torch::kHalf},   {"torch.BFloat16Storage", torch::kBFloat16},
      {"torch.LongStorage", torch::kLong},   {"torch.IntStorage", torch::kInt},
      {"torch.ShortStorage", torch::kShort}, {"torch.CharStorage", torch::kChar},
      {"torch.ByteStorage", torch::kByte},   {"torch.BoolStorage", torch::kBool},
  };
  const auto it = kTypes.find(global);
  if (it == kTypes.end()) {
    bad(origin, "unsupported storage type " + global +
                    " (supported: Float, Double, Half, BFloat16, Long, Int, Short, Char, Byte and "
                    "Bool storages)");
  }
  return it->second;
}

class Unpickler {
 public:
  // Reads one pickle starting at bytes[pos]; on return pos is just past its STOP.
  Unpickler(const std::string& bytes, size_t& pos, std::string origin)
      : bytes_(bytes), pos_(pos), origin_(std::move(origin)) {}

  // Every storage the pickle referred to: key -> element type.
  const std::unordered_map<std::string, torch::ScalarType>& storage_types() const {
    return storage_types_;
  }

  ValuePtr run() {
    for (;;) {
      const size_t at = pos_;
      const auto op = static_cast<unsigned char>(take(1)[0]);
      switch (op) {
        case 0x80:
          take(1);
          break;  // PROTO
        case 0x95:
          take(8);
          break;     // FRAME (protocol 4): no-op here
        case '.': {  // STOP
          if (stack_.size() != 1 || !marks_.empty()) fail(at, "STOP with a malformed stack");
          return stack_.back();
        }
        case '(':
          marks_.push_back(stack_.size());
          break;  // MARK
        case '0':
          pop(at);
          break;  // POP
        case '1':
          pop_mark(at);
          break;  // POP_MARK
        case '2':
          push(top(at));
          break;  // DUP
        case 'N':
          push(make(Kind::kNone));
          break;
        case 0x88:
          push(boolean(true));
          break;  // NEWTRUE
        case 0x89:
          push(boolean(false));
          break;  // NEWFALSE
        case 'J':
          push(integer(static_cast<int32_t>(le(4))));
          break;  // BININT
        case 'K':
          push(integer(static_cast<int64_t>(le(1))));
          break;  // BININT1
        case 'M':
          push(integer(static_cast<int64_t>(le(2))));
          break;  // BININT2
        case 0x8a:
          push(long1(at));
          break;  // LONG1
        case 'G':
          push(binfloat());
          break;  // BINFLOAT
        case 'X':
          push(string(le(4), at));
          break;  // BINUNICODE
        case 0x8c:
          push(string(le(1), at));
          break;  // SHORT_BINUNICODE
        case 'T':
          push(string(le(4), at));
          break;  // BINSTRING (Python 2)
        case 'U':
          push(string(le(1), at));
          break;  // SHORT_BINSTRING (Python 2)
        case ')':
          push(make(Kind::kTuple));
          break;  // EMPTY_TUPLE
        case 't':
          push(sequence(Kind::kTuple, pop_mark(at), at));
          break;
        case 0x85:
          push(tuple_of(1, at));
          break;  // TUPLE1
        case 0x86:
          push(tuple_of(2, at));
          break;  // TUPLE2
        case 0x87:
          push(tuple_of(3, at));
          break;  // TUPLE3
        case ']':
          push(make(Kind::kList));
          break;  // EMPTY_LIST
        case 'l':
          push(sequence(Kind::kList, pop_mark(at), at));
          break;     // LIST
        case 'a': {  // APPEND
          ValuePtr item = pop(at);
          append(top(at), {std::move(item)}, at);
          break;
        }
        case 'e': {  // APPENDS
          std::vector<ValuePtr> items = pop_mark(at);
          append(top(at), std::move(items), at);
          break;
        }
        case '}':
          push(make(Kind::kDict));
          break;     // EMPTY_DICT
        case 'd': {  // DICT
          ValuePtr d = make(Kind::kDict);
          set_items(d, pop_mark(at), at);
          push(d);
          break;
        }
        case 's': {  // SETITEM
          ValuePtr value = pop(at);
          ValuePtr key = pop(at);
          set_items(top(at), {std::move(key), std::move(value)}, at);
          break;
        }
        case 'u': {  // SETITEMS
          std::vector<ValuePtr> items = pop_mark(at);
          set_items(top(at), std::move(items), at);
          break;
        }
        case 'q':
          memo_[le(1)] = top(at);
          break;  // BINPUT
        case 'r':
          memo_[le(4)] = top(at);
          break;  // LONG_BINPUT
        case 0x94:
          memo_[memo_.size()] = top(at);
          break;  // MEMOIZE (protocol 4)
        case 'h':
          push(memo(le(1), at));
          break;  // BINGET
        case 'j':
          push(memo(le(4), at));
          break;     // LONG_BINGET
        case 'c': {  // GLOBAL "module\nname\n"
          std::string module = line(at);
          std::string name = line(at);
          push(global(module + "." + name));
          break;
        }
        case 0x93: {  // STACK_GLOBAL (protocol 4)
          ValuePtr name = pop(at);
          ValuePtr module = pop(at);
          if (module->kind != Kind::kString || name->kind != Kind::kString) {
            fail(at, "STACK_GLOBAL expects two strings");
          }
          push(global(module->s + "." + name->s));
          break;
        }
        case 'R': {  // REDUCE
          ValuePtr args = pop(at);
          ValuePtr callable = pop(at);
          push(reduce(callable, args, at));
          break;
        }
        case 0x81: {  // NEWOBJ
          ValuePtr args = pop(at);
          ValuePtr cls = pop(at);
          push(object(cls, args, at));
          break;
        }
        case 'b':
          pop(at);
          top(at);
          break;  // BUILD: the state is not applied
        case 'Q':
          push(persistent(pop(at), at));
          break;  // BINPERSID
        default: {
          std::ostringstream hex;
          hex << "0x" << std::hex << static_cast<int>(op);
          fail(at, "unsupported pickle opcode " + hex.str() +
                       " (a state dict saved by torch.save uses protocol 2)");
        }
      }
    }
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& what) const {
    bad(origin_, "pickle byte " + std::to_string(at) + ": " + what);
  }

  const char* take(size_t n) {
    if (n > bytes_.size() - pos_) {
      fail(pos_, "truncated (needs " + std::to_string(n) + " more bytes, " +
                     std::to_string(bytes_.size() - pos_) + " left)");
    }
    const char* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }

  uint64_t le(size_t n) {
    take(n);
    return le_at(bytes_, pos_ - n, static_cast<int>(n));
  }

  std::string line(size_t at) {
    const size_t end = bytes_.find('\n', pos_);
    if (end == std::string::npos) fail(at, "truncated inside a GLOBAL name");
    if (end - pos_ > 256) fail(at, "GLOBAL name longer than 256 bytes");
    std::string s = bytes_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }

  void push(ValuePtr v) {
    if (stack_.size() >= (1u << 24)) fail(pos_, "stack too deep");
    stack_.push_back(std::move(v));
  }

  ValuePtr pop(size_t at) {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
      fail(at, "pops an empty stack");
    }
    ValuePtr v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }

  const ValuePtr& top(size_t at) const {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
      fail(at, "reads an empty stack");
    }
    return stack_.back();
  }

  std::vector<ValuePtr> pop_mark(size_t at) {
    if (marks_.empty()) fail(at, "no MARK to pop to");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<ValuePtr> items(
        std::make_move_iterator(stack_.begin() + static_cast<ptrdiff_t>(mark)),
        std::make_move_iterator(stack_.end()));
    stack_.resize(mark);
    return items;
  }

  ValuePtr memo(uint64_t index, size_t at) const {
    const auto it = memo_.find(index);
    if (it == memo_.end()) fail(at, "memo entry " + std::to_string(index) + " never stored");
    return it->second;
  }

  static ValuePtr boolean(bool b) {
    ValuePtr v = make(Kind::kBool);
    v->i = b ? 1 : 0;
    return v;
  }

  static ValuePtr integer(int64_t i) {
    ValuePtr v = make(Kind::kInt);
    v->i = i;
    return v;
  }

  ValuePtr long1(size_t at) {
    const size_t n = le(1);
    if (n > 8) fail(at, "integer of " + std::to_string(n) + " bytes (at most 8 supported)");
    uint64_t u = le(n);
    if (n > 0 && n < 8 && (u >> (8 * n - 1)) & 1) u |= ~uint64_t{0} << (8 * n);  // sign-extend
    return integer(static_cast<int64_t>(u));
  }

  ValuePtr binfloat() {
    const auto* p = reinterpret_cast<const unsigned char*>(take(8));
    uint64_t bits = 0;
    for (int k = 0; k < 8; ++k) bits = (bits << 8) | p[k];  // big-endian
    ValuePtr v = make(Kind::kFloat);
    std::memcpy(&v->f, &bits, sizeof bits);
    return v;
  }

  ValuePtr string(uint64_t n, size_t at) {
    if (n > bytes_.size() - pos_)
      fail(at, "string of " + std::to_string(n) + " bytes runs past the end");
    ValuePtr v = make(Kind::kString);
    v->s.assign(take(n), n);
    return v;
  }

  ValuePtr global(const std::string& name) {
    ValuePtr v = make(Kind::kGlobal);
    v->s = name;
    return v;
  }

  int depth_of(const std::vector<ValuePtr>& items, size_t at) const {
    int d = 0;
    for (const ValuePtr& item : items) d = std::max(d, item->depth);
    if (d + 1 > kMaxDepth) fail(at, "values nested deeper than " + std::to_string(kMaxDepth));
    return d + 1;
  }

  static void freeze(const std::vector<ValuePtr>& items) {
    for (const ValuePtr& item : items) item->frozen = true;
  }

  ValuePtr sequence(Kind kind, std::vector<ValuePtr> items, size_t at) {
    ValuePtr v = make(kind);
    v->depth = depth_of(items, at);
    freeze(items);
    v->items = std::move(items);
    return v;
  }

  ValuePtr tuple_of(size_t n, size_t at) {
    if (stack_.size() < n || (!marks_.empty() && stack_.size() - n < marks_.back())) {
      fail(at, "TUPLE" + std::to_string(n) + " on a stack of fewer items");
    }
    std::vector<ValuePtr> items(std::make_move_iterator(stack_.end() - static_cast<ptrdiff_t>(n)),
                                std::make_move_iterator(stack_.end()));
    stack_.resize(stack_.size() - n);
    return sequence(Kind::kTuple, std::move(items), at);
  }

  // A container is filled while it is on the stack, before it goes into another value (that is
  // how pickle writes a state dict). Mutating one that is already inside another is refused, so
  // values form a DAG built bottom-up: no cycles, and every depth stays exact.
  void grow(const ValuePtr& container, const std::vector<ValuePtr>& items, size_t at) const {
    if (container->frozen) fail(at, "modifies a container already inside another value");
    for (const ValuePtr& item : items) {
      if (item == container) fail(at, "puts a container inside itself");
    }
    container->depth = std::max(container->depth, depth_of(items, at));
    freeze(items);
  }

  void append(const ValuePtr& list, std::vector<ValuePtr> items, size_t at) {
    if (list->kind == Kind::kObject) return;  // an inert object's list-like state: dropped
    if (list->kind != Kind::kList) fail(at, std::string("APPEND to ") + kind_name(list->kind));
    grow(list, items, at);
    for (auto& item : items) list->items.push_back(std::move(item));
  }

  void set_items(const ValuePtr& dict, std::vector<ValuePtr> items, size_t at) {
    if (dict->kind == Kind::kObject) return;
    if (dict->kind != Kind::kDict) fail(at, std::string("SETITEM on ") + kind_name(dict->kind));
    if (items.size() % 2 != 0) fail(at, "SETITEMS with an odd number of items");
    grow(dict, items, at);
    for (size_t k = 0; k < items.size(); k += 2) {
      dict->dict.emplace_back(std::move(items[k]), std::move(items[k + 1]));
    }
  }

  ValuePtr object(const ValuePtr& cls, const ValuePtr& args, size_t at) {
    ValuePtr v = make(Kind::kObject);
    v->s = cls->kind == Kind::kGlobal ? cls->s : std::string("?");
    v->depth = depth_of({cls, args}, at);
    return v;
  }

  int64_t int_arg(const ValuePtr& v, const std::string& what, size_t at) const {
    if (v->kind != Kind::kInt && v->kind != Kind::kBool) {
      fail(at, what + ": expected an int, got " + kind_name(v->kind));
    }
    return v->i;
  }

  std::vector<int64_t> ints(const ValuePtr& v, const std::string& what, size_t at) const {
    if (v->kind != Kind::kTuple && v->kind != Kind::kList) {
      fail(at, what + ": expected a tuple of ints, got " + kind_name(v->kind));
    }
    if (static_cast<int64_t>(v->items.size()) > kMaxDims) fail(at, what + ": too many dimensions");
    std::vector<int64_t> out;
    for (const ValuePtr& item : v->items) out.push_back(int_arg(item, what, at));
    return out;
  }

  // torch._utils._rebuild_tensor{,_v2}(storage, storage_offset, size, stride, ...).
  ValuePtr rebuild_tensor(const std::vector<ValuePtr>& args, size_t at) {
    if (args.size() < 4) fail(at, "_rebuild_tensor with fewer than 4 arguments");
    if (args[0]->kind != Kind::kStorage) {
      fail(at, std::string("_rebuild_tensor of ") + kind_name(args[0]->kind) + ", not a storage");
    }
    ValuePtr v = make(Kind::kTensor);
    v->tensor.storage = args[0];
    v->tensor.offset = int_arg(args[1], "tensor storage offset", at);
    v->tensor.sizes = ints(args[2], "tensor size", at);
    v->tensor.strides = ints(args[3], "tensor stride", at);
    return v;
  }

  ValuePtr reduce(const ValuePtr& callable, const ValuePtr& args, size_t at) {
    if (callable->kind != Kind::kGlobal) return object(callable, args, at);
    if (args->kind != Kind::kTuple) fail(at, "REDUCE arguments are not a tuple");
    const std::string& f = callable->s;
    const std::vector<ValuePtr>& a = args->items;
    if (f == "collections.OrderedDict") {
      if (!a.empty()) return object(callable, args, at);
      return make(Kind::kDict);
    }
    if (f == "torch._utils._rebuild_tensor_v2" || f == "torch._utils._rebuild_tensor") {
      return rebuild_tensor(a, at);
    }
    if (f == "torch._utils._rebuild_parameter" ||
        f == "torch._utils._rebuild_parameter_with_state") {
      if (a.empty()) fail(at, f + " without arguments");
      return a[0];  // the parameter's data; requires_grad and hooks do not matter here
    }
    if (f == "torch.jit._pickle.restore_type_tag") {  // (value, "Dict[str, Tensor]"): LibTorch's
      if (a.empty()) fail(at, f + " without arguments");  // torch::pickle_save tags a dict
      return a[0];
    }
    if (f == "torch._tensor._rebuild_from_type_v2") {  // (func, type, args, state)
      if (a.size() < 3) fail(at, f + " with fewer than 3 arguments");
      if (a[1]->kind == Kind::kGlobal &&
          (a[1]->s == "torch._tensor.Tensor" || a[1]->s == "torch.Tensor" ||
           a[1]->s == "torch.nn.parameter.Parameter")) {
        return reduce(a[0], a[2], at);
      }
    }
    return object(callable, args, at);  // inert: nothing is ever called
  }

  ValuePtr persistent(const ValuePtr& pid, size_t at) {
    if (pid->kind != Kind::kTuple || pid->items.size() < 5 ||
        pid->items[0]->kind != Kind::kString || pid->items[0]->s != "storage") {
      fail(at, "persistent id is not ('storage', type, key, location, size)");
    }
    const std::vector<ValuePtr>& p = pid->items;
    if (p[1]->kind != Kind::kGlobal) fail(at, "storage type is not a class");
    if (p[2]->kind != Kind::kString) fail(at, "storage key is not a string");
    ValuePtr v = make(Kind::kStorage);
    v->storage.dtype = storage_dtype(p[1]->s, origin_);
    v->storage.key = p[2]->s;
    v->storage.numel = int_arg(p[4], "storage size", at);
    if (v->storage.numel < 0) fail(at, "negative storage size");
    storage_types_.emplace(v->storage.key, v->storage.dtype);
    if (p.size() > 5 && p[5]->kind == Kind::kTuple) {  // legacy view: (view_key, offset, size)
      const std::vector<ValuePtr>& view = p[5]->items;
      if (view.size() != 3 || view[0]->kind != Kind::kString) fail(at, "malformed storage view");
      v->storage.offset = int_arg(view[1], "storage view offset", at);
      v->storage.numel = int_arg(view[2], "storage view size", at);
      if (v->storage.offset < 0 || v->storage.numel < 0) fail(at, "negative storage view");
    }
    return v;
  }

  const std::string& bytes_;
  size_t& pos_;
  std::string origin_;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, ValuePtr> memo_;
  std::unordered_map<std::string, torch::ScalarType> storage_types_;
};

ValuePtr unpickle(const std::string& bytes, size_t& pos, const std::string& origin) {
  return Unpickler(bytes, pos, origin).run();
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
  const ValuePtr version = unpickle(bytes, pos, origin);
  if (version->kind != Kind::kInt || version->i != 1001) {
    bad(origin, "legacy torch.save protocol version is not 1001");
  }
  const ValuePtr sys_info = unpickle(bytes, pos, origin);
  if (sys_info->kind == Kind::kDict) {
    for (const auto& [k, v] : sys_info->dict) {
      if (k->kind == Kind::kString && k->s == "little_endian" && v->kind == Kind::kBool &&
          v->i == 0) {
        bad(origin, "was saved on a big-endian machine; re-save it on a little-endian one");
      }
    }
  }
  Unpickler object(bytes, pos, origin);
  const ValuePtr root = object.run();
  const ValuePtr keys = unpickle(bytes, pos, origin);
  if (keys->kind != Kind::kList) bad(origin, "the legacy storage key list is missing");

  // The storages follow in key order, each an int64 element count and its bytes; the element
  // size comes from the type the object's persistent ids gave the key.
  std::unordered_map<std::string, std::pair<const char*, size_t>> storages;
  for (const ValuePtr& key : keys->items) {
    if (key->kind != Kind::kString) bad(origin, "a legacy storage key is not a string");
    const auto type = object.storage_types().find(key->s);
    if (type == object.storage_types().end()) {
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
      *root,
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
  const ValuePtr root = unpickle(pickle, pos, origin);
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
