#include "trainer/model/unpickler.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "trainer/util/bytes.h"
#include "trainer/util/error.h"

namespace trainer::model::detail {

void bad(const std::string& origin, const std::string& what) {
  throw DataError("'" + origin + "': " + what);
}

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

namespace {

constexpr int kMaxDepth = 64;
constexpr int64_t kMaxDims = 64;

ValuePtr make(Kind kind) {
  auto v = std::make_shared<Value>();
  v->kind = kind;
  return v;
}

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

  // Every storage the pickle referred to: key -> element type. Moved out, after run().
  std::unordered_map<std::string, torch::ScalarType> take_storage_types() {
    return std::move(storage_types_);
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
    return util::load_le(bytes_.data() + pos_ - n, static_cast<int>(n));
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

}  // namespace

Unpickled unpickle(const std::string& bytes, size_t& pos, const std::string& origin) {
  Unpickler unpickler(bytes, pos, origin);
  Unpickled out;
  out.root = unpickler.run();
  out.storage_types = unpickler.take_storage_types();
  return out;
}

}  // namespace trainer::model::detail
