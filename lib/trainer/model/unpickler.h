// Private to model/: the restricted unpickler of the torch.save reader, and the values it builds.
// Its one user is pth.cpp (the zip's data.pkl and the legacy stream's pickles), which turns the
// values into tensors; fuzz/fuzz_pth.cpp reaches it through decode_pth(). This is the .pth
// reader's hostile-input boundary: in Python a pickle is a program, here it is only data, and
// nothing a file names is ever called or imported.
//
// Accepted: the opcodes of protocols 2 to 4 a state dict is written with (PROTO, FRAME, STOP,
// MARK, POP, POP_MARK, DUP; None, NEWTRUE/NEWFALSE, BININT/BININT1/BININT2, LONG1 of at most 8
// bytes, BINFLOAT, BINUNICODE/SHORT_BINUNICODE, BINSTRING/SHORT_BINSTRING; the tuple, list and
// dict opcodes, APPEND(S), SETITEM(S); BINPUT/LONG_BINPUT/MEMOIZE, BINGET/LONG_BINGET; GLOBAL,
// STACK_GLOBAL, REDUCE, NEWOBJ, BUILD with its state dropped; BINPERSID). A GLOBAL is a name
// (at most 256 bytes). REDUCE of a name gives: collections.OrderedDict() an empty dict;
// torch._utils._rebuild_tensor{,_v2} a tensor reference (not yet checked against its storage:
// pth.cpp's Materialiser does that); torch._utils._rebuild_parameter{,_with_state},
// torch.jit._pickle.restore_type_tag and torch._tensor._rebuild_from_type_v2 (of a Tensor or
// Parameter) their tensor or value; any other name, and any NEWOBJ, an inert kObject that fails
// the load only if the state dict holds it. A persistent id must be ('storage', one of the ten
// torch.<Type>Storage classes, key, location, size[, legacy view]).
//
// Refused, as a DataError "'<origin>': pickle byte N: ...": every other opcode (text opcodes,
// INST, OBJ, EXT*, NEWOBJ_EX, bytes and sets, the out-of-band buffers), truncation, stack and
// memo misuse, a stack over 2^24 items, values nested deeper than 64, tensors of more than 64
// dimensions, and changing a container already inside another (values form a DAG built bottom-up:
// no cycles, so nothing recurses without bound). Free functions; thread-safe on distinct inputs.
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace trainer::model::detail {

// Throws DataError("'<origin>': <what>"): the form of every error the .pth reader reports.
[[noreturn]] void bad(const std::string& origin, const std::string& what);

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

// "None", "an int", "a dict", ...: for messages.
const char* kind_name(Kind k);

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

// One pickle's value, and every storage it referred to: key -> element type.
struct Unpickled {
  ValuePtr root;
  std::unordered_map<std::string, torch::ScalarType> storage_types;
};

// Reads one pickle starting at bytes[pos]; on return pos is just past its STOP. `origin` names
// the file in messages. Throws DataError as above.
Unpickled unpickle(const std::string& bytes, size_t& pos, const std::string& origin);

}  // namespace trainer::model::detail
