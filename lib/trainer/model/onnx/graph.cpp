#include "trainer/model/onnx/graph.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <cstring>
#include <numeric>

namespace trainer::model::onnx {

namespace {

namespace pb = ::ONNX_NAMESPACE;

constexpr int64_t kIrVersion = 7;  // ONNX 1.8: the IR that opset 13 came with
constexpr const char* kBatch = "batch";

int32_t elem_type(ElemType t) {
  return t == ElemType::kUint8 ? pb::TensorProto_DataType_UINT8 : pb::TensorProto_DataType_FLOAT;
}

void fill_value_info(const ValueInfo& v, pb::ValueInfoProto* out) {
  out->set_name(v.name);
  if (!v.doc.empty()) out->set_doc_string(v.doc);
  auto* tensor = out->mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(elem_type(v.type));
  auto* shape = tensor->mutable_shape();
  for (const int64_t d : v.dims) {
    auto* dim = shape->add_dim();
    if (d < 0) {
      dim->set_dim_param(kBatch);
    } else {
      dim->set_dim_value(d);
    }
  }
}

ValueInfo read_value_info(const pb::ValueInfoProto& v) {
  ValueInfo out;
  out.name = v.name();
  out.doc = v.doc_string();
  const auto& tensor = v.type().tensor_type();
  out.type =
      tensor.elem_type() == pb::TensorProto_DataType_UINT8 ? ElemType::kUint8 : ElemType::kFloat;
  for (const auto& d : tensor.shape().dim()) {
    out.dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
  }
  return out;
}

int64_t element_count(const std::vector<int64_t>& dims) {
  return std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<int64_t>());
}

// The checker (structure, types, every node against its schema at the model's opset), then
// strict shape inference with type checks, as onnx.checker.check_model(full_check=True) does.
void check(const pb::ModelProto& model) {
  try {
    pb::checker::check_model(model);
    pb::ModelProto inferred = model;
    pb::shape_inference::InferShapes(inferred, pb::OpSchemaRegistry::Instance(),
                                     pb::ShapeInferenceOptions(true, 1, false));
  } catch (const std::exception& e) {
    throw GraphError(std::string("the ONNX checker refuses the model: ") + e.what());
  }
}

}  // namespace

void Graph::add_initializer(const std::string& name, std::vector<int64_t> dims,
                            std::vector<float> data) {
  if (element_count(dims) != static_cast<int64_t>(data.size())) {
    throw GraphError("initializer '" + name + "': " + std::to_string(data.size()) +
                     " values for its shape");
  }
  initializers_.push_back({name, std::move(dims), std::move(data)});
}

void Graph::add_node(std::string op_type, std::vector<std::string> inputs,
                     std::vector<std::string> outputs, std::vector<Attribute> attributes) {
  nodes_.push_back(
      {std::move(op_type), std::move(inputs), std::move(outputs), std::move(attributes)});
}

std::string Graph::serialize(int opset, const ModelMeta& meta) const {
  if (opset < kMinOpset || opset > kMaxOpset) {
    throw GraphError("opset " + std::to_string(opset) + " is not one this writer knows (" +
                     std::to_string(kMinOpset) + " to " + std::to_string(kMaxOpset) + ")");
  }
  pb::ModelProto model;
  model.set_ir_version(kIrVersion);
  model.set_producer_name(meta.producer_name);
  model.set_producer_version(meta.producer_version);
  model.set_model_version(meta.model_version);
  auto* op = model.add_opset_import();
  op->set_domain("");
  op->set_version(opset);
  for (const auto& [key, value] : meta.properties) {
    auto* prop = model.add_metadata_props();
    prop->set_key(key);
    prop->set_value(value);
  }
  pb::GraphProto* graph = model.mutable_graph();
  graph->set_name(meta.graph_name);
  if (!meta.doc.empty()) graph->set_doc_string(meta.doc);
  for (const ValueInfo& v : inputs_) fill_value_info(v, graph->add_input());
  for (const ValueInfo& v : outputs_) fill_value_info(v, graph->add_output());
  for (const Initializer& init : initializers_) {
    pb::TensorProto* t = graph->add_initializer();
    t->set_name(init.name);
    t->set_data_type(pb::TensorProto_DataType_FLOAT);
    for (const int64_t d : init.dims) t->add_dims(d);
    std::string raw(init.data.size() * sizeof(float), '\0');  // x86-64 and aarch64: LE
    std::memcpy(raw.data(), init.data.data(), raw.size());
    t->set_raw_data(std::move(raw));
  }
  int index = 0;
  for (const Node& n : nodes_) {
    pb::NodeProto* node = graph->add_node();
    node->set_op_type(n.op_type);
    node->set_name(n.op_type + "_" + std::to_string(index++));
    for (const auto& in : n.inputs) node->add_input(in);
    for (const auto& out : n.outputs) node->add_output(out);
    for (const Attribute& a : n.attributes) {
      pb::AttributeProto* attr = node->add_attribute();
      attr->set_name(a.name);
      switch (a.kind) {
        case Attribute::Kind::kInt:
          attr->set_type(pb::AttributeProto_AttributeType_INT);
          attr->set_i(a.i);
          break;
        case Attribute::Kind::kFloat:
          attr->set_type(pb::AttributeProto_AttributeType_FLOAT);
          attr->set_f(a.f);
          break;
        case Attribute::Kind::kInts:
          attr->set_type(pb::AttributeProto_AttributeType_INTS);
          for (const int64_t v : a.ints) attr->add_ints(v);
          break;
      }
    }
  }
  check(model);
  std::string bytes;
  if (!model.SerializeToString(&bytes)) {
    throw GraphError("the model does not serialise (over protobuf's 2 GiB limit?)");
  }
  return bytes;
}

ModelSummary summarize(const std::string& bytes) {
  pb::ModelProto model;
  if (!model.ParseFromString(bytes)) throw GraphError("not an ONNX model (protobuf parse failed)");
  check(model);
  ModelSummary s;
  s.ir_version = model.ir_version();
  s.producer_name = model.producer_name();
  for (const auto& op : model.opset_import()) {
    if (op.domain().empty() || op.domain() == "ai.onnx") s.opset = op.version();
  }
  const auto& graph = model.graph();
  for (const auto& v : graph.input()) s.inputs.push_back(read_value_info(v));
  for (const auto& v : graph.output()) s.outputs.push_back(read_value_info(v));
  for (const auto& n : graph.node()) ++s.op_counts[n.op_type()];
  for (const auto& t : graph.initializer()) {
    ++s.initializers;
    int64_t n = 1;
    for (const int64_t d : t.dims()) n *= d;
    s.parameters += n;
  }
  for (const auto& p : model.metadata_props()) s.properties[p.key()] = p.value();
  return s;
}

}  // namespace trainer::model::onnx
