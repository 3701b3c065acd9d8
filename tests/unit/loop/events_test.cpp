// TensorBoard event files: read back with the project's reader, and checked byte by byte against
// TensorFlow's formats without the project's .proto: the TFRecord framing (lengths and masked
// CRC-32C) by hand, and every field of the Event, Summary, SummaryMetadata and TensorProto
// messages by a small protobuf wire-format walker with TensorFlow's field numbers written out
// (tensorflow/core/util/event.proto, core/framework/summary.proto, tensor.proto,
// tensor_shape.proto, types.proto). Also: the flusher thread, trimming on resume, file order.
#include "common/catch.h"

#include <opencv2/imgcodecs.hpp>

#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "train_test_util.h"
#include "trainer/config/job_spec.h"
#include "trainer/data/tfrecord.h"
#include "trainer/loop/events.h"
#include "trainer/util/crc32c.h"

using namespace trainer::train;
using namespace trainer::train::testing;

namespace {

// --- TFRecord framing, by hand ----------------------------------------------------------------

uint64_t le64(const std::string& b, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + i]);
  return v;
}
uint32_t le32(const std::string& b, size_t at) {
  return static_cast<uint32_t>(le64(b.substr(at, 4) + std::string(4, '\0'), 0));
}

// The payloads of a TFRecord file, every length and CRC checked: [u64 length][u32 masked CRC-32C
// of the length][data][u32 masked CRC-32C of the data], nothing after the last record.
std::vector<std::string> framed_records(const fs::path& file) {
  const std::string b = read_bytes(file);
  std::vector<std::string> out;
  size_t at = 0;
  while (at < b.size()) {
    REQUIRE(at + 12 <= b.size());
    const uint64_t len = le64(b, at);
    CHECK(le32(b, at + 8) == trainer::util::mask_crc(trainer::util::crc32c(b.data() + at, 8)));
    REQUIRE(at + 12 + len + 4 <= b.size());
    const std::string data = b.substr(at + 12, len);
    CHECK(le32(b, at + 12 + len) ==
          trainer::util::mask_crc(trainer::util::crc32c(data.data(), data.size())));
    out.push_back(data);
    at += 12 + len + 4;
  }
  CHECK(at == b.size());
  return out;
}

// --- protobuf wire format, by hand ------------------------------------------------------------

// A message's fields: number -> list of (wire type, raw value). Varints are decoded; fixed64 and
// fixed32 keep their little-endian bytes; length-delimited fields keep their payload.
struct Field {
  int wire = 0;
  uint64_t varint = 0;
  std::string bytes;
};
using Fields = std::multimap<int, Field>;

uint64_t read_varint(const std::string& b, size_t* at) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    REQUIRE(*at < b.size());
    const auto byte = static_cast<unsigned char>(b[(*at)++]);
    v |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return v;
  }
  FAIL("varint longer than 10 bytes");
  return 0;
}

Fields parse_fields(const std::string& b) {
  Fields fields;
  size_t at = 0;
  while (at < b.size()) {
    const uint64_t key = read_varint(b, &at);
    Field f;
    f.wire = static_cast<int>(key & 7);
    switch (f.wire) {
      case 0:
        f.varint = read_varint(b, &at);
        break;
      case 1:
        REQUIRE(at + 8 <= b.size());
        f.bytes = b.substr(at, 8);
        at += 8;
        break;
      case 2: {
        const uint64_t len = read_varint(b, &at);
        REQUIRE(at + len <= b.size());
        f.bytes = b.substr(at, len);
        at += len;
        break;
      }
      case 5:
        REQUIRE(at + 4 <= b.size());
        f.bytes = b.substr(at, 4);
        at += 4;
        break;
      default:
        FAIL("wire type " << f.wire);
    }
    fields.emplace(static_cast<int>(key >> 3), f);
  }
  return fields;
}

// The one field `number`, of wire type `wire`.
const Field& one(const Fields& fields, int number, int wire) {
  INFO("field " << number);
  REQUIRE(fields.count(number) == 1);
  const Field& f = fields.find(number)->second;
  REQUIRE(f.wire == wire);
  return f;
}
std::vector<Field> all(const Fields& fields, int number) {
  std::vector<Field> out;
  const auto range = fields.equal_range(number);
  for (auto it = range.first; it != range.second; ++it) out.push_back(it->second);
  return out;
}

double as_double(const std::string& b) {
  double d;
  std::memcpy(&d, b.data(), 8);
  return d;
}
float as_float(const std::string& b) {
  float f;
  std::memcpy(&f, b.data(), 4);
  return f;
}

// TensorFlow's field numbers.
namespace event {  // tensorflow.Event
constexpr int kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5;
}
namespace summary {  // tensorflow.Summary, Summary.Value
constexpr int kValue = 1;
constexpr int kTag = 1, kMetadata = 9, kTensor = 8;
}  // namespace summary
namespace metadata {  // tensorflow.SummaryMetadata, its PluginData
constexpr int kPluginData = 1, kDataClass = 4;
constexpr int kPluginName = 1;
constexpr uint64_t kScalar = 1, kTensor = 2, kBlobSequence = 3;  // DataClass
}  // namespace metadata
namespace tensor {  // tensorflow.TensorProto, TensorShapeProto, its Dim; DataType
constexpr int kDtype = 1, kShape = 2, kTensorContent = 4, kFloatVal = 5, kStringVal = 8;
constexpr int kDim = 2, kDimSize = 1;
constexpr uint64_t kDtFloat = 1, kDtString = 7;
}  // namespace tensor

struct Checked {
  double wall_time = 0;
  int64_t step = 0;
  Fields summary;  // empty for a file_version event
};

// An Event's own fields checked against event.proto.
Checked check_event(const std::string& record) {
  const Fields e = parse_fields(record);
  Checked c;
  c.wall_time = as_double(one(e, event::kWallTime, 1).bytes);
  if (e.count(event::kStep)) c.step = static_cast<int64_t>(one(e, event::kStep, 0).varint);
  if (e.count(event::kSummary)) c.summary = parse_fields(one(e, event::kSummary, 2).bytes);
  return c;
}

// A Summary.Value: its tag, the plugin named by its metadata ("" if none), its data class and
// its TensorProto's fields.
struct Value {
  std::string tag, plugin;
  uint64_t data_class = 0;
  Fields tensor;
};
std::vector<Value> values_of(const Fields& summary) {
  std::vector<Value> out;
  for (const Field& f : all(summary, summary::kValue)) {
    REQUIRE(f.wire == 2);
    const Fields v = parse_fields(f.bytes);
    Value value;
    value.tag = one(v, summary::kTag, 2).bytes;
    if (v.count(summary::kMetadata)) {
      const Fields m = parse_fields(one(v, summary::kMetadata, 2).bytes);
      const Fields plugin = parse_fields(one(m, metadata::kPluginData, 2).bytes);
      value.plugin = one(plugin, metadata::kPluginName, 2).bytes;
      value.data_class = one(m, metadata::kDataClass, 0).varint;
    }
    value.tensor = parse_fields(one(v, summary::kTensor, 2).bytes);
    out.push_back(value);
  }
  return out;
}

std::vector<int64_t> dims_of(const Fields& t) {
  std::vector<int64_t> dims;
  const Fields shape = parse_fields(one(t, tensor::kShape, 2).bytes);
  for (const Field& d : all(shape, tensor::kDim)) {
    dims.push_back(static_cast<int64_t>(one(parse_fields(d.bytes), tensor::kDimSize, 0).varint));
  }
  return dims;
}

trainer::config::LoggingSpec logging(int images = 2) {
  trainer::config::LoggingSpec spec;
  spec.images_per_epoch = images;
  return spec;
}

// Steps of `tag` over every file of a run, in the order TensorBoard reads them.
std::vector<int64_t> steps_of(const fs::path& run, const std::string& tag) {
  std::vector<int64_t> steps;
  for (const fs::path& file : event_files(run)) {
    for (const EventRecord& r : read_events(file)) {
      for (const SummaryValue& v : r.values) {
        if (v.tag == tag) steps.push_back(r.step);
      }
    }
  }
  return steps;
}

}  // namespace

TEST_CASE("event files match TensorFlow's framing and field numbers", "[events]") {
  TempDir dir("events");
  const double before =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  fs::path file;
  {
    EventWriter w(dir / "run", 30);
    file = w.path();
    w.scalars(7, {{"loss", 0.25}, {"accuracy", 0.5}});
    w.scalars(8, {{"loss", 0.125}});
    w.text(7, "job_spec", "    a: 1\n");
    w.images(7, "input_images", {"PNG1", "PNG22"}, 32, 24);
    w.close();
  }
  const std::string name = file.filename().string();
  CHECK(name.rfind("events.out.tfevents.", 0) == 0);
  CHECK(name.size() > 3);
  CHECK(name.substr(name.size() - 3) == ".v2");
  CHECK(name.find("." + std::to_string(::getpid()) + ".v2") != std::string::npos);

  const std::vector<std::string> records = framed_records(file);
  REQUIRE(records.size() == 6);

  // 1: the file version, step 0, a plausible wall time
  const Fields first = parse_fields(records[0]);
  CHECK(one(first, event::kFileVersion, 2).bytes == "brain.Event:2");
  CHECK(first.count(event::kStep) == 0);  // 0 is not written in proto3
  const double t0 = as_double(one(first, event::kWallTime, 1).bytes);
  CHECK(t0 >= before - 1);
  CHECK(t0 < before + 60);

  // 2-4: scalars as TF2's tf.summary.scalar writes them (kubeflow-katib's real file): one value
  // per event, a DT_FLOAT tensor of shape [] whose 4 little-endian bytes are in tensor_content,
  // the "scalars" metadata on every value, the tag's second value included
  const std::vector<std::pair<std::string, float>> want{
      {"loss", 0.25f}, {"accuracy", 0.5f}, {"loss", 0.125f}};
  double wall = t0;
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("record " << i + 1);
    const Checked s = check_event(records[1 + i]);
    CHECK(s.step == (i < 2 ? 7 : 8));
    CHECK(s.wall_time >= wall);
    wall = s.wall_time;
    const std::vector<Value> v = values_of(s.summary);
    REQUIRE(v.size() == 1);
    CHECK(v[0].tag == want[i].first);
    CHECK(v[0].plugin == "scalars");
    CHECK(v[0].data_class == metadata::kScalar);
    CHECK(one(v[0].tensor, tensor::kDtype, 0).varint == tensor::kDtFloat);
    CHECK(dims_of(v[0].tensor).empty());
    CHECK(v[0].tensor.count(tensor::kFloatVal) == 0);
    CHECK(as_float(one(v[0].tensor, tensor::kTensorContent, 2).bytes) == want[i].second);
  }

  // 4: text as tf.summary.text writes it: a DT_STRING scalar, plugin "text"
  const std::vector<Value> text = values_of(check_event(records[4]).summary);
  REQUIRE(text.size() == 1);
  CHECK(text[0].tag == "job_spec");
  CHECK(text[0].plugin == "text");
  CHECK(text[0].data_class == metadata::kTensor);
  CHECK(one(text[0].tensor, tensor::kDtype, 0).varint == tensor::kDtString);
  CHECK(dims_of(text[0].tensor).empty());
  CHECK(one(text[0].tensor, tensor::kStringVal, 2).bytes == "    a: 1\n");

  // 5: images as tf.summary.image writes them: [width, height, image...], plugin "images"
  const std::vector<Value> img = values_of(check_event(records[5]).summary);
  REQUIRE(img.size() == 1);
  CHECK(img[0].tag == "input_images");
  CHECK(img[0].plugin == "images");
  CHECK(img[0].data_class == metadata::kBlobSequence);
  CHECK(one(img[0].tensor, tensor::kDtype, 0).varint == tensor::kDtString);
  CHECK(dims_of(img[0].tensor) == std::vector<int64_t>{4});
  std::vector<std::string> strings;
  for (const Field& f : all(img[0].tensor, tensor::kStringVal)) strings.push_back(f.bytes);
  CHECK(strings == std::vector<std::string>{"32", "24", "PNG1", "PNG22"});

  // The project's reader sees the same.
  const std::vector<EventRecord> back = read_events(file);
  REQUIRE(back.size() == 6);
  CHECK(back[0].file_version == "brain.Event:2");
  CHECK(back[2].values[0].floats == std::vector<float>{0.5f});
  CHECK(back[2].values[0].from_content);
  CHECK(back[3].values[0].has_metadata);
  CHECK(back[5].values[0].strings.size() == 4);
}

TEST_CASE("the flusher hands records to the file within flush_secs", "[events]") {
  TempDir dir("events-flush");
  EventWriter w(dir / "run", 0.2);
  const auto size0 = fs::file_size(w.path());  // the version record, flushed at creation
  CHECK(size0 > 0);
  w.scalars(1, {{"loss", 1.0}});
  // A 1 MiB stdio buffer holds this record until something flushes it.
  const auto start = std::chrono::steady_clock::now();
  while (fs::file_size(w.path()) == size0 &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(fs::file_size(w.path()) > size0);
  CHECK(framed_records(w.path()).size() == 2);
}

TEST_CASE("without the flusher's turn, close() writes everything", "[events]") {
  TempDir dir("events-close");
  fs::path path;
  {
    EventWriter w(dir / "run", 3600);
    path = w.path();
    for (int step = 1; step <= 100; ++step) w.scalars(step, {{"loss", step * 0.5}});
    CHECK(framed_records(path).size() == 1);  // still buffered
  }                                           // the destructor closes
  CHECK(read_events(path).size() == 101);
}

TEST_CASE("trim_events drops the steps after the resume point, and only those", "[events]") {
  TempDir dir("events-trim");
  fs::path file;
  {
    EventWriter w(dir / "run", 30);
    file = w.path();
    for (int step = 1; step <= 10; ++step) w.scalars(step, {{"loss", step * 1.0}});
  }
  const std::string untouched = read_bytes(file);
  trim_events(dir / "run", 10);
  CHECK(read_bytes(file) == untouched);

  trim_events(dir / "run", 6);
  CHECK(steps_of(dir / "run", "loss") == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  CHECK(framed_records(file).size() == 7);  // the version record stays

  // A file cut short in its last record keeps the records before it.
  const std::string bytes = read_bytes(file);
  write_bytes(file, bytes.substr(0, bytes.size() - 5));
  trim_events(dir / "run", 100);
  CHECK(steps_of(dir / "run", "loss") == std::vector<int64_t>{1, 2, 3, 4, 5});
  CHECK(event_files(dir / "run").size() == 1);  // no temp file left

  trim_events(dir / "absent", 0);  // a run that does not exist yet is nothing to trim
}

TEST_CASE("Summaries: train and validation runs, the job spec, input images, resume", "[events]") {
  TempDir dir("events-summaries");
  const fs::path logs = dir / "logs";
  // Four 6x5 images whose pixels are their own coordinates.
  torch::Tensor images = torch::arange(4 * 5 * 6 * 3, torch::kInt64)
                             .remainder(251)
                             .to(torch::kUInt8)
                             .view({4, 5, 6, 3});
  {
    Summaries s(logs, logging(2), 0);
    s.job_spec(0, "model:\n  arch: resnet18\n");
    for (int step = 1; step <= 6; ++step) {
      std::map<std::string, double> record{{"loss", 1.0 / step},    {"accuracy", 0.1 * step},
                                           {"step_time_s", 1},      {"learning_rate", 0.01},
                                           {"images_per_sec", 100}, {"data_wait_s", 0}};
      if (step == 2) record.insert({{"loss_scale", 32768}, {"skipped_step", 1}});  // as fp16's
      s.train_step(step, record);
      if (step == 1 || step == 4) s.input_images(step, images);
    }
    s.epoch(3, {{"train_loss", 0.5}, {"train_accuracy", 0.6}, {"epoch_time_s", 9}});
    s.epoch(
        6,
        {{"train_loss", 0.4}, {"train_accuracy", 0.7}, {"val_loss", 0.45}, {"val_accuracy", 0.65}});
    s.close();
  }
  REQUIRE(event_files(logs / "train").size() == 1);
  REQUIRE(event_files(logs / "validation").size() == 1);
  CHECK(steps_of(logs / "train", "loss") == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  CHECK(steps_of(logs / "train", "data_wait_s").size() == 6);
  CHECK(steps_of(logs / "train", "step_time_s").empty());  // in metrics.jsonl only
  CHECK(steps_of(logs / "train", "loss_scale") == std::vector<int64_t>{2});  // fp16 only
  CHECK(steps_of(logs / "train", "skipped_step") == std::vector<int64_t>{2});
  CHECK(steps_of(logs / "train", "epoch_loss") == std::vector<int64_t>{3, 6});
  CHECK(steps_of(logs / "validation", "epoch_loss") == std::vector<int64_t>{6});
  CHECK(steps_of(logs / "validation", "epoch_accuracy") == std::vector<int64_t>{6});
  CHECK(steps_of(logs / "train", "input_images") == std::vector<int64_t>{1, 4});

  const std::vector<EventRecord> train = read_events(event_files(logs / "train")[0]);
  const SummaryValue* spec = nullptr;
  const SummaryValue* pictures = nullptr;
  for (const EventRecord& r : train) {
    for (const SummaryValue& v : r.values) {
      if (v.tag == "job_spec") spec = &v;
      if (v.tag == "input_images" && pictures == nullptr) pictures = &v;
    }
  }
  REQUIRE(spec != nullptr);
  CHECK(spec->strings == std::vector<std::string>{"    model:\n      arch: resnet18\n"});
  REQUIRE(pictures != nullptr);
  REQUIRE(pictures->strings.size() == 4);  // width, height, 2 images (images_per_epoch)
  CHECK(pictures->strings[0] == "6");
  CHECK(pictures->strings[1] == "5");
  for (int i = 0; i < 2; ++i) {
    const std::string& png = pictures->strings[2 + i];
    CHECK(png.substr(1, 3) == "PNG");
    const cv::Mat bgr =
        cv::imdecode(std::vector<uint8_t>(png.begin(), png.end()), cv::IMREAD_COLOR);
    REQUIRE(bgr.rows == 5);
    REQUIRE(bgr.cols == 6);
    bool same = true;
    for (int y = 0; y < 5; ++y) {
      for (int x = 0; x < 6; ++x) {
        const cv::Vec3b p = bgr.at<cv::Vec3b>(y, x);
        for (int c = 0; c < 3; ++c) {
          same = same && p[2 - c] == images[i][y][x][c].item<uint8_t>();
        }
      }
    }
    CHECK(same);  // lossless, RGB in the right order
  }

  SECTION("a resume at step 4 trims the old file and writes the rest to a new one after it") {
    {
      Summaries s(logs, logging(2), 4);
      s.job_spec(4, "x: 1\n");
      for (int step = 5; step <= 7; ++step) s.train_step(step, {{"loss", 2.0}});
      s.epoch(6, {{"val_loss", 0.3}, {"val_accuracy", 0.8}});
      s.close();
    }
    REQUIRE(event_files(logs / "train").size() == 2);
    CHECK(steps_of(logs / "train", "loss") == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7});
    CHECK(steps_of(logs / "train", "epoch_loss") == std::vector<int64_t>{3});
    CHECK(steps_of(logs / "validation", "epoch_loss") == std::vector<int64_t>{6});
    CHECK(event_files(logs / "validation").size() == 2);
  }

  SECTION("logging off: a default Summaries writes nothing") {
    Summaries off;
    off.job_spec(0, "x");
    off.train_step(1, {{"loss", 1}});
    off.input_images(1, images);
    off.epoch(1, {{"val_loss", 1}});
    off.close();
    CHECK(event_files(dir / "nothing").empty());
  }
}

TEST_CASE("read_events names a file that holds something else", "[events]") {
  TempDir dir("events-bad");
  const fs::path file = dir / "events.out.tfevents.1.h.1.v2";
  {
    trainer::data::RecordWriter w(file.string());
    w.write(std::string("\xff\xff\xff", 3));  // not a protobuf message
  }
  try {
    read_events(file);
    FAIL("no error");
  } catch (const trainer::DataError& e) {
    CHECK(std::string(e.what()).find(file.string()) != std::string::npos);
    CHECK(std::string(e.what()).find("not a tensorflow.Event") != std::string::npos);
  }
  write_bytes(file, "garbage that is no TFRecord");
  CHECK_THROWS_AS(read_events(file), trainer::DataError);
}
