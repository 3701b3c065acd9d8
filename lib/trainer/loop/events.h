// TensorBoard event files without TensorFlow: tensorflow.Event messages (proto/event.proto, with
// TensorFlow's field numbers) in TFRecord framing (data::RecordWriter, masked CRC-32C).
// EventWriter appends to one new file events.out.tfevents.<secs>.<host>.<pid>.v2 in a run dir;
// Summaries is the chief's pair of runs, JOB_DIR/logs/train and logs/validation, laid out as
// Keras's TensorBoard callback lays them out; read_events() reads a file back (tests, tools).
// EventWriter is thread-safe (its own thread flushes it every flush_secs); Summaries is not.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainer/config/job_spec.h"

namespace trainer::train {

namespace fs = std::filesystem;

// One Summary.Value as read back.
struct SummaryValue {
  std::string tag;
  bool has_metadata = false;   // the value carries a SummaryMetadata
  std::string plugin;          // metadata.plugin_data.plugin_name ("" when the value has none)
  int data_class = 0;          // metadata.data_class (0 unset, 1 scalar, 2 tensor, 3 blob seq.)
  int dtype = 0;               // tensor.dtype (1 DT_FLOAT, 2 DT_DOUBLE, 7 DT_STRING; 0 = none)
  std::vector<int64_t> shape;  // tensor.tensor_shape's dim sizes
  // The numbers: tensor.float_val / double_val, else tensor.tensor_content (DT_FLOAT or
  // DT_DOUBLE, little-endian: what TensorFlow writes), else a legacy simple_value.
  std::vector<float> floats;
  bool from_content = false;         // floats came from tensor_content
  bool simple_value = false;         // a legacy simple_value (Keras in TF 2.3, TF1), no tensor
  std::vector<std::string> strings;  // tensor.string_val
};

// One Event record as read back.
struct EventRecord {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;          // set only in a file's first record ("brain.Event:2")
  std::vector<SummaryValue> values;  // Event.summary
};

// Every record of an events file, in order. Throws DataError naming the file for a record that
// is not an Event, data::RecordError for bad framing (CRCs, lengths).
std::vector<EventRecord> read_events(const fs::path& file);

// The events files (events.out.tfevents.*) in `dir`, sorted by name, which is the order
// TensorBoard reads them in; none when `dir` does not exist.
std::vector<fs::path> event_files(const fs::path& dir);

// For a run that resumes at `last_step`: drops the records with a larger step (written by the
// run that went on past that checkpoint before it stopped) from every events file in `dir`, so
// that a curve never doubles back. A file that needs it is rewritten (temp file, fsync, rename);
// a record that cannot be read ends its file (a crash cut it short). Throws DataError.
void trim_events(const fs::path& dir, int64_t last_step);

class EventWriter {
 public:
  // Creates `dir` and a new events file in it, whose first record carries file_version
  // "brain.Event:2", and starts the thread that flushes it every `flush_secs`. Throws DataError.
  EventWriter(const fs::path& dir, double flush_secs);
  ~EventWriter();  // close(), errors dropped
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // One event per scalar, in tf.summary.scalar's form: a DT_FLOAT tensor of shape [] whose
  // 4 bytes are in tensor_content, with the "scalars" plugin metadata (data_class scalar) on
  // every value.
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // Markdown for TensorBoard's Text tab (a DT_STRING scalar, plugin "text").
  void text(int64_t step, const std::string& tag, const std::string& markdown);
  // Encoded images of one size (tf.summary.image's form: a DT_STRING vector [width, height,
  // image 1, ...], plugin "images").
  void images(int64_t step, const std::string& tag, const std::vector<std::string>& encoded,
              int64_t width, int64_t height);

  void flush();  // hands everything written so far to the OS; throws DataError
  void close();  // stops the flusher, flushes and closes; throws a DataError the flusher met
  const fs::path& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The chief's summaries: per step loss, accuracy, learning_rate, images_per_sec, data_wait_s
// (and comm_wait_s with several workers, loss_scale and skipped_step with fp16) in logs/train; per
// epoch epoch_loss and epoch_accuracy in logs/train (training) and logs/validation (validation), so
// TensorBoard draws the two on one chart; the resolved job spec as text and a few input images per
// epoch in logs/train. A default-constructed Summaries (another worker, logging.tensorboard: false)
// writes nothing.
class Summaries {
 public:
  Summaries() = default;
  // resume_step: records after it are trimmed from earlier files first (see trim_events).
  Summaries(const fs::path& logs_dir, const config::LoggingSpec& spec, int64_t resume_step);

  void job_spec(int64_t step, const std::string& yaml);
  void train_step(int64_t step, const std::map<std::string, double>& record);
  // The first logging.images_per_epoch images of a [B, S, S, 3] uint8 RGB pipeline batch.
  void input_images(int64_t step, const torch::Tensor& images);
  // The epoch's record: train_loss/train_accuracy and, when present, val_loss/val_accuracy.
  void epoch(int64_t step, const std::map<std::string, double>& record);
  // Flushes and closes the files (at the end of training; the destructor does it quietly).
  void close();

 private:
  fs::path logs_dir_;
  double flush_secs_ = 30;
  int images_per_epoch_ = 0;
  std::unique_ptr<EventWriter> train_, validation_;  // validation_: opened at its first record
};

}  // namespace trainer::train
