#include "trainer/loop/events.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "trainer/data/image.h"
#include "trainer/data/tfrecord.h"
#include "trainer/loop/proto/event.pb.h"
#include "trainer/util/bytes.h"
#include "trainer/util/error.h"
#include "trainer/util/fs.h"

namespace trainer::train {

namespace {

namespace pb = tbproto;

constexpr const char* kFilePrefix = "events.out.tfevents.";

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// events.out.tfevents.<secs>.<host>.<pid>.v2, named to sort after every events file already in
// `dir`, because TensorBoard reads a run's files in name order and takes a step that goes back as
// a restart: <secs> is now, or one more than the newest file's when that is not older (a resume
// within the same second). A name taken already gets .<n> before .v2.
fs::path new_event_file(const fs::path& dir) {
  int64_t secs = static_cast<int64_t>(wall_time_now());
  for (const fs::path& file : event_files(dir)) {
    const std::string name = file.filename().string().substr(std::string(kFilePrefix).size());
    const std::string digits = name.substr(0, name.find('.'));
    if (!digits.empty() && digits.size() < 19 &&
        digits.find_first_not_of("0123456789") == std::string::npos) {
      secs = std::max<int64_t>(secs, std::stoll(digits) + 1);
    }
  }
  const std::string stem = kFilePrefix + std::to_string(secs) + "." + host_name() + "." +
                           std::to_string(static_cast<int64_t>(getpid()));
  fs::path path = dir / (stem + ".v2");
  for (int n = 1; fs::exists(path); ++n) path = dir / (stem + "." + std::to_string(n) + ".v2");
  return path;
}

std::string serialize(const pb::Event& event) {
  std::string bytes;
  if (!event.SerializeToString(&bytes)) {
    throw Error(ErrorKind::kInternal, "cannot serialize a tensorflow.Event");
  }
  return bytes;
}

constexpr int kDtDouble = 2;  // tensorflow.DataType DT_DOUBLE (not declared: never written)

// `x` as tensor_content holds a DT_FLOAT: 4 bytes, little-endian.
std::string le_bytes(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((bits >> (8 * i)) & 0xff);
  return out;
}

SummaryValue to_value(const pb::Summary::Value& v) {
  SummaryValue out;
  out.tag = v.tag();
  if (v.has_metadata()) {
    out.has_metadata = true;
    out.plugin = v.metadata().plugin_data().plugin_name();
    out.data_class = v.metadata().data_class();
  }
  if (v.has_tensor()) {
    const pb::TensorProto& t = v.tensor();
    out.dtype = t.dtype();
    for (const auto& d : t.tensor_shape().dim()) out.shape.push_back(d.size());
    out.floats.assign(t.float_val().begin(), t.float_val().end());
    for (const double x : t.double_val()) out.floats.push_back(static_cast<float>(x));
    // TensorFlow's writers put numbers in tensor_content: little-endian, row-major.
    const std::string& raw = t.tensor_content();
    if (out.floats.empty() && !raw.empty()) {
      out.from_content = true;
      if (t.dtype() == pb::DT_FLOAT && raw.size() % 4 == 0) {
        for (size_t at = 0; at < raw.size(); at += 4)
          out.floats.push_back(util::load_le_real<float>(raw.data() + at));
      } else if (t.dtype() == kDtDouble && raw.size() % 8 == 0) {
        for (size_t at = 0; at < raw.size(); at += 8) {
          out.floats.push_back(static_cast<float>(util::load_le_real<double>(raw.data() + at)));
        }
      }
    }
    out.strings.assign(t.string_val().begin(), t.string_val().end());
  } else if (v.value_case() == pb::Summary::Value::kSimpleValue) {
    out.simple_value = true;
    out.floats.push_back(v.simple_value());
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Reading and trimming

std::vector<EventRecord> read_events(const fs::path& file) {
  data::RecordReader reader(file.string(), data::Compression::kNone);
  std::vector<EventRecord> out;
  std::string bytes;
  while (reader.read(&bytes)) {
    pb::Event event;
    if (!event.ParseFromString(bytes)) {
      throw DataError(file.string() + ": record " + std::to_string(out.size()) +
                      " is not a tensorflow.Event");
    }
    EventRecord r;
    r.wall_time = event.wall_time();
    r.step = event.step();
    r.file_version = event.file_version();
    for (const auto& v : event.summary().value()) r.values.push_back(to_value(v));
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    // (not a temp file that trim_events left behind when it was stopped)
    if (entry.is_regular_file() && name.rfind(kFilePrefix, 0) == 0 &&
        name.find(".tmp-") == std::string::npos) {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

void trim_events(const fs::path& dir, int64_t last_step) {
  for (const fs::path& file : event_files(dir)) {
    data::RecordReader reader(file.string(), data::Compression::kNone);
    std::vector<std::string> kept;
    bool dropped = false;
    std::string bytes;
    try {
      while (reader.read(&bytes)) {
        pb::Event event;
        if (!event.ParseFromString(bytes)) {
          dropped = true;
          break;
        }
        if (event.step() > last_step) {
          dropped = true;
          continue;
        }
        kept.push_back(bytes);
      }
    } catch (const data::RecordError&) {
      dropped = true;  // cut short by a crash: what came before it stays
    }
    if (!dropped) continue;
    std::string framed;
    for (const std::string& record : kept) framed += data::frame_record(record);
    util::write_file_atomic(file, framed);
  }
}

// ---------------------------------------------------------------------------------------------
// EventWriter

struct EventWriter::Impl {
  fs::path path;
  std::mutex mu;  // guards everything below
  std::condition_variable wake;
  data::RecordWriter writer;
  bool closing = false, closed = false;
  std::string flush_error;  // what the flusher thread met, thrown by the next call
  std::thread flusher;

  explicit Impl(fs::path p) : path(std::move(p)), writer(path.string()) {}

  void write(const pb::Event& event) {  // mu held
    if (!flush_error.empty()) throw DataError(flush_error);
    if (closed) throw Error(ErrorKind::kInternal, "EventWriter: write after close");
    writer.write(serialize(event));
  }

  pb::TensorProto* add_value(pb::Event* event, const std::string& tag, const char* plugin,
                             int data_class, int dtype);
};

EventWriter::EventWriter(const fs::path& dir, double flush_secs) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw DataError("cannot create '" + dir.string() + "': " + ec.message());
  impl_ = std::make_unique<Impl>(new_event_file(dir));
  pb::Event first;
  first.set_wall_time(wall_time_now());
  first.set_file_version("brain.Event:2");
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->write(first);
    impl_->writer.flush();
  }
  const auto period = std::chrono::duration<double>(flush_secs);
  impl_->flusher = std::thread([w = impl_.get(), period] {
    std::unique_lock<std::mutex> lock(w->mu);
    while (!w->closing) {
      w->wake.wait_for(lock, period);
      if (w->closed || !w->flush_error.empty()) continue;
      try {
        w->writer.flush();
      } catch (const std::exception& e) {
        w->flush_error = e.what();
      }
    }
  });
}

EventWriter::~EventWriter() {
  try {
    close();
  } catch (...) {  // quietly: close() is where errors are reported
  }
}

namespace {

pb::Event event_at(int64_t step) {
  pb::Event event;
  event.set_wall_time(wall_time_now());
  event.set_step(step);
  return event;
}

}  // namespace

// A value of `tag` in `event` holding a tensor of `dtype`, with its plugin metadata on every
// value as TF2's tf.summary.* ops write it (TF1's FileWriter kept it on a tag's first value only;
// TensorBoard reads either). mu held.
pb::TensorProto* EventWriter::Impl::add_value(pb::Event* event, const std::string& tag,
                                              const char* plugin, int data_class, int dtype) {
  auto* value = event->mutable_summary()->add_value();
  value->set_tag(tag);
  auto* meta = value->mutable_metadata();
  meta->mutable_plugin_data()->set_plugin_name(plugin);
  meta->set_data_class(static_cast<pb::SummaryMetadata::DataClass>(data_class));
  auto* t = value->mutable_tensor();
  t->set_dtype(static_cast<pb::DataType>(dtype));
  t->mutable_tensor_shape();  // no dims: a scalar, unless the caller adds some
  return t;
}

// One event per value, as tf.summary.scalar (one op per value) and Keras's callback write them.
void EventWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (const auto& [tag, x] : values) {
    pb::Event event = event_at(step);
    impl_->add_value(&event, tag, "scalars", pb::SummaryMetadata::DATA_CLASS_SCALAR, pb::DT_FLOAT)
        ->set_tensor_content(le_bytes(static_cast<float>(x)));
    impl_->write(event);
  }
}

void EventWriter::text(int64_t step, const std::string& tag, const std::string& markdown) {
  pb::Event event = event_at(step);
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->add_value(&event, tag, "text", pb::SummaryMetadata::DATA_CLASS_TENSOR, pb::DT_STRING)
      ->add_string_val(markdown);
  impl_->write(event);
}

void EventWriter::images(int64_t step, const std::string& tag,
                         const std::vector<std::string>& encoded, int64_t width, int64_t height) {
  pb::Event event = event_at(step);
  std::lock_guard<std::mutex> lock(impl_->mu);
  pb::TensorProto* t = impl_->add_value(
      &event, tag, "images", pb::SummaryMetadata::DATA_CLASS_BLOB_SEQUENCE, pb::DT_STRING);
  t->mutable_tensor_shape()->add_dim()->set_size(static_cast<int64_t>(encoded.size()) + 2);
  t->add_string_val(std::to_string(width));
  t->add_string_val(std::to_string(height));
  for (const std::string& image : encoded) t->add_string_val(image);
  impl_->write(event);
}

void EventWriter::flush() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!impl_->flush_error.empty()) throw DataError(impl_->flush_error);
  if (!impl_->closed) impl_->writer.flush();
}

void EventWriter::close() {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->closing = true;
  }
  impl_->wake.notify_all();
  if (impl_->flusher.joinable()) impl_->flusher.join();
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->closed) return;
  impl_->closed = true;
  if (!impl_->flush_error.empty()) throw DataError(impl_->flush_error);
  impl_->writer.close();
}

const fs::path& EventWriter::path() const { return impl_->path; }

// ---------------------------------------------------------------------------------------------
// Summaries

Summaries::Summaries(const fs::path& logs_dir, const config::LoggingSpec& spec, int64_t resume_step)
    : logs_dir_(logs_dir), flush_secs_(spec.flush_secs), images_per_epoch_(spec.images_per_epoch) {
  trim_events(logs_dir / "train", resume_step);
  trim_events(logs_dir / "validation", resume_step);
  train_ = std::make_unique<EventWriter>(logs_dir / "train", flush_secs_);
}

void Summaries::job_spec(int64_t step, const std::string& yaml) {
  if (!train_) return;
  // Indented four spaces: a Markdown code block, so TensorBoard shows the YAML as it is.
  std::string markdown;
  size_t start = 0;
  while (start < yaml.size()) {
    const size_t end = yaml.find('\n', start);
    const size_t stop = end == std::string::npos ? yaml.size() : end;
    markdown += "    " + yaml.substr(start, stop - start) + "\n";
    start = stop + 1;
  }
  train_->text(step, "job_spec", markdown);
}

void Summaries::train_step(int64_t step, const std::map<std::string, double>& record) {
  if (!train_) return;
  std::vector<std::pair<std::string, double>> values;
  for (const char* name : {"loss", "accuracy", "learning_rate", "images_per_sec", "data_wait_s",
                           "comm_wait_s", "loss_scale", "skipped_step"}) {
    const auto it = record.find(name);
    if (it != record.end()) values.emplace_back(name, it->second);
  }
  train_->scalars(step, values);
}

void Summaries::input_images(int64_t step, const torch::Tensor& images) {
  if (!train_ || images_per_epoch_ == 0 || images.size(0) == 0) return;
  const int64_t n = std::min<int64_t>(images_per_epoch_, images.size(0));
  std::vector<std::string> pngs;
  for (int64_t i = 0; i < n; ++i) pngs.push_back(data::encode_png(images[i]));
  train_->images(step, "input_images", pngs, images.size(2), images.size(1));
}

void Summaries::epoch(int64_t step, const std::map<std::string, double>& record) {
  if (!train_) return;
  auto pick = [&record](const char* loss, const char* accuracy) {
    std::vector<std::pair<std::string, double>> values;
    if (const auto it = record.find(loss); it != record.end()) {
      values.emplace_back("epoch_loss", it->second);
    }
    if (const auto it = record.find(accuracy); it != record.end()) {
      values.emplace_back("epoch_accuracy", it->second);
    }
    return values;
  };
  if (auto train = pick("train_loss", "train_accuracy"); !train.empty()) {
    train_->scalars(step, train);
  }
  if (auto val = pick("val_loss", "val_accuracy"); !val.empty()) {
    if (!validation_)
      validation_ = std::make_unique<EventWriter>(logs_dir_ / "validation", flush_secs_);
    validation_->scalars(step, val);
  }
}

void Summaries::close() {
  if (train_) train_->close();
  if (validation_) validation_->close();
}

}  // namespace trainer::train
