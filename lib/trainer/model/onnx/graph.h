// A small ONNX graph writer over the ONNX project's own protobuf types (libonnx-dev's
// onnx/onnx_pb.h) and checker (onnx::checker::check_model). This header has no ONNX, protobuf
// or LibTorch types: only graph.cpp includes ONNX (it is compiled in its own library,
// trainer_onnx, so LibTorch's include directories never meet ONNX's and no other source sees
// protobuf). model/onnx_export.cpp walks a ResNet and describes it here. Not thread-safe (an
// object being built); the free functions are.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace trainer::model::onnx {

// The ONNX opsets the writer accepts (every node it is asked for has the same meaning in each).
inline constexpr int kDefaultOpset = 13;
inline constexpr int kMinOpset = 13;
inline constexpr int kMaxOpset = 17;  // what libonnx 1.12's checker knows

// The writer or the checker refused the model (a bug of the caller: the message says what).
class GraphError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class ElemType { kFloat, kUint8 };

// A graph input or output; a dimension of -1 is the dynamic batch dimension ("batch").
struct ValueInfo {
  std::string name;
  ElemType type = ElemType::kFloat;
  std::vector<int64_t> dims;
  std::string doc;
};

// A node attribute: one int, one float, or a list of ints.
struct Attribute {
  std::string name;
  enum class Kind { kInt, kFloat, kInts } kind = Kind::kInt;
  int64_t i = 0;
  float f = 0;
  std::vector<int64_t> ints;
  static Attribute of(std::string name, int64_t v) {
    return {std::move(name), Kind::kInt, v, 0, {}};
  }
  static Attribute real(std::string name, float v) {
    return {std::move(name), Kind::kFloat, 0, v, {}};
  }
  static Attribute list(std::string name, std::vector<int64_t> v) {
    return {std::move(name), Kind::kInts, 0, 0, std::move(v)};
  }
};

struct ModelMeta {
  std::string producer_name;
  std::string producer_version;
  std::string graph_name;
  std::string doc;  // the graph's doc_string
  int64_t model_version = 0;
  std::vector<std::pair<std::string, std::string>> properties;  // metadata_props, in order
};

class Graph {
 public:
  void add_input(ValueInfo v) { inputs_.push_back(std::move(v)); }
  void add_output(ValueInfo v) { outputs_.push_back(std::move(v)); }
  // An fp32 constant (stored as raw little-endian bytes, as torch.onnx.export stores them).
  // data.size() must be the product of dims.
  void add_initializer(const std::string& name, std::vector<int64_t> dims, std::vector<float> data);
  void add_node(std::string op_type, std::vector<std::string> inputs,
                std::vector<std::string> outputs, std::vector<Attribute> attributes = {});
  size_t node_count() const { return nodes_.size(); }

  // The model as bytes: ir_version 7 (the IR of opset 13), the default domain at `opset`, the
  // metadata; checked with onnx::checker::check_model (full check) before it is returned.
  // Throws GraphError for an opset out of range or a model the checker refuses.
  std::string serialize(int opset, const ModelMeta& meta) const;

 private:
  struct Node {
    std::string op_type;
    std::vector<std::string> inputs, outputs;
    std::vector<Attribute> attributes;
  };
  struct Initializer {
    std::string name;
    std::vector<int64_t> dims;
    std::vector<float> data;
  };
  std::vector<ValueInfo> inputs_, outputs_;
  std::vector<Initializer> initializers_;
  std::vector<Node> nodes_;
};

// What an ONNX file says about itself (for `trainer export`'s summary and for tests). Parses
// and checks the bytes with the ONNX library; throws GraphError when they are not a valid model.
struct ModelSummary {
  int64_t ir_version = 0;
  int64_t opset = 0;  // of the default domain
  std::string producer_name;
  std::vector<ValueInfo> inputs, outputs;  // a dynamic dimension is -1
  std::map<std::string, int64_t> op_counts;
  int64_t initializers = 0;
  int64_t parameters = 0;  // elements in the initializers
  std::map<std::string, std::string> properties;
};
ModelSummary summarize(const std::string& bytes);

}  // namespace trainer::model::onnx
