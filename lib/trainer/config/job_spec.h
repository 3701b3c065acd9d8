// The job spec: one typed tree with a default for every field (leveldb's options.h style).
// YAML -> JobSpec is a pure function that either returns a complete, validated value or throws
// ConfigError naming the file, the dotted field and the value it got. An unknown key is an
// error. Components receive only their sub-struct, by const reference. Plain values: thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/data/source_options.h"

namespace trainer::config {

// Upper bounds of the fields whose value sizes memory (a model layer, an image, a wait), shared
// with readers of files that carry the same values (model.json).
inline constexpr int64_t kMaxClasses = 100000;     // model.num_classes
inline constexpr int64_t kMaxHeadHidden = 65536;   // model.head_hidden
inline constexpr int kMaxImageSize = 4096;         // data.image_size
inline constexpr int kMaxBatchSize = 4096;         // train.per_replica_batch_size
inline constexpr double kMaxTimeoutS = 7 * 86400;  // distributed.*timeout_s: a week

// One place examples are listed from (data.train, data.validation): data's SourceOptions, the
// one definition of these fields.
using SourceSpec = data::SourceOptions;

struct ModelSpec {
  std::string arch = "resnet50";  // one of model::supported_archs() (ResNet family, EfficientNet)
  int num_classes = 0;            // 0 (written `auto`) = number of classes in the data
  int head_hidden = 0;            // 0 = torchvision's single `fc`; N = fc.0 Linear(N) + ReLU +
                                  // fc.2 Linear(classes), the tutorial's Dense(N, relu) head
  std::string pretrained;         // .pth/.safetensors path, URL or torchvision:NAME ("" = none)
  bool freeze_backbone = false;   // train only the classifier (`fc*`)
  bool freeze_batchnorm = false;  // BN layers stay in eval mode, statistics fixed
  bool sync_batchnorm = false;    // BN statistics in training over the global batch (SyncBN)
};

struct ColorJitterSpec {  // torchvision ColorJitter; 0 = that part off
  double brightness = 0;  // factor in [max(0, 1 - b), 1 + b]
  double contrast = 0;    // factor in [max(0, 1 - c), 1 + c]
  double saturation = 0;  // factor in [max(0, 1 - s), 1 + s]
  double hue = 0;         // shift in [-h, h], h <= 0.5
};

struct AugmentSpec {
  bool horizontal_flip = false;      // flip left-right with probability 0.5
  bool random_resized_crop = false;  // torchvision RandomResizedCrop(image_size)
  double crop_scale_min = 0.08;      // smallest crop area fraction (torchvision: 0.08)
  bool vertical_flip = false;        // flip top-bottom with probability 0.5 (leaves have no up)
  bool rotate90 = false;             // rotate by a random multiple of 90 degrees
  double rotate_degrees = 0;         // RandomRotation(-d, +d), nearest; 0 = off
  ColorJitterSpec color_jitter;
  std::string policy =
      "none";                 // none | trivial_augment_wide | rand_augment | auto_augment | augmix
  int magnitude = 0;          // rand_augment magnitude (0..30) / augmix severity (1..10);
                              // 0 (written `auto`) = torchvision's default (9 / 3)
  int num_ops = 0;            // rand_augment ops per image; 0 (`auto`) = 2
  double random_erasing = 0;  // RandomErasing probability (torchvision's scale and ratio)
};

struct DataSpec {
  SourceSpec train;                      // required
  SourceSpec validation;                 // optional (path "" = no validation)
  std::vector<std::string> class_names;  // optional; default: from the train source
  int image_size = 224;                  // square side images are resized to (tutorial: 300)
  std::string normalize = "imagenet";    // unit (x/255, as the tutorial) | imagenet (mean/std)
  AugmentSpec augment;
  bool shuffle = true;                // reshuffle the training examples every epoch
  int64_t seed = 0;                   // data order and augmentation seed
  int num_workers = 0;                // decode threads; 0 (written `auto`) = from the thread
                                      // budget of the cores this process may use
  int prefetch_batches = 2;           // batches decoded ahead of the model
  std::string on_corrupt = "fail";    // fail | skip (counted and logged)
  std::string shard_policy = "auto";  // auto | file | data | off (multi-worker sharding)
  int interleave = 4;                 // tfrecord: record files read at once (tf.data interleave)
  int shuffle_buffer = 1000;          // tfrecord: shuffle buffer in examples (tf.data shuffle)
  std::string cache = "none";         // none | memory: keep decoded, resized images (uint8)
                                      // after their first use, as tf.data's .cache()
  bool reduced_decode = true;         // JPEG: decode at 1/2, 1/4 or 1/8 scale (libjpeg DCT
                                      // scaling) when that still covers image_size
  std::string interpolation = "bilinear";  // bilinear | bicubic (crops and resizes)
  std::string eval_resize = "square";      // square (the tutorial) | shorter_side (torchvision)
  int eval_resize_size = 0;         // shorter_side: the shorter side before the crop; 0 (`auto`) =
                                    // eval_crop_size / 0.875 (256 for 224); square: unused
  int eval_crop_size = 0;           // evaluation input side; 0 (`auto`) = image_size
  std::string sampler = "uniform";  // uniform | balanced (each class equally likely)
  double validation_split = 0;      // > 0: hold out this fraction of data.train as the
                                    // validation set, chosen with data.seed (Keras'
                                    // validation_split); data.validation.path must be ""
};

// Whether the job has validation data: a validation source, or a part of data.train held out.
inline bool has_validation(const DataSpec& data) {
  return !data.validation.path.empty() || data.validation_split > 0;
}

struct OptimizerSpec {
  std::string name = "adam";      // adam | adamw | sgd
  double learning_rate = 1e-4;    // base learning rate (tutorial: Adam 1e-4)
  double momentum = 0.9;          // sgd only
  double weight_decay = 0.0;      // L2 (adam, sgd) or decoupled (adamw)
  bool nesterov = false;          // sgd only
  std::string norm_weight_decay;  // BatchNorm weights and biases; "" = weight_decay
  std::string bias_weight_decay;  // other biases; "" = weight_decay
};

struct LrScheduleSpec {
  std::string name = "constant";    // constant | cosine | step
  double warmup_epochs = 0.0;       // linear warm-up from 0 over this many epochs
  int step_epochs = 30;             // step: multiply by gamma every this many epochs
  double gamma = 0.1;               // step: decay factor
  double min_lr = 0.0;              // cosine: final learning rate; plateau: the floor
  double factor = 0.1;              // plateau: multiply by this when the metric stalls
  int patience = 10;                // plateau: epochs without improvement before reducing
  std::string metric = "val_loss";  // plateau: val_loss (mode min) | val_accuracy (mode max)
};

struct EmaSpec {
  double decay = 0;      // 0 = off; torchvision's model_ema_decay (0.99998), adjusted for the
                         // global batch, every_steps and epochs as its reference does
  int every_steps = 32;  // update the average every N optimizer steps
};

struct EarlyStoppingSpec {
  int patience = 0;                     // 0 = off; stop after N epochs without improvement
  std::string metric = "val_accuracy";  // val_accuracy | val_loss
  double min_delta = 0;                 // an improvement smaller than this does not count
};

struct TrainSpec {
  int epochs = 5;
  int per_replica_batch_size = 64;  // global batch = this x number of replicas
  OptimizerSpec optimizer;
  LrScheduleSpec lr_schedule;
  double label_smoothing = 0.0;         // in [0, 1)
  std::string precision = "fp32";       // fp32 | bf16 (autocast) | fp16 (autocast + dynamic loss
                                        // scaling; CUDA only) | auto (CPU: the faster of fp32 and
                                        // bf16 in a timing of the model's own convolutions at
                                        // start-up, loop/kernel_choice.h; bf16 on an sm80+ GPU,
                                        // fp16 on sm70/sm75 GPUs such as the T4, else fp32)
  std::string deterministic = "auto";   // auto | true | false: bit-reproducible kernels (cuDNN
                                        // deterministic, no benchmark mode, cuBLAS workspace);
                                        // auto = true on CPU, false on GPUs (benchmark mode on)
  std::string channels_last = "false";  // true | false | auto: NHWC memory format for the
                                        // convolutions; auto = CPU: the faster layout in the same
                                        // timing; GPU: true under fp16/bf16 autocast
  int threads = 0;                      // intra-op threads; 0 = the cores this process may use (its
                                        // CPU affinity mask), less those the decode threads need
  int micro_batch_size = 0;      // 0 = off; N = split each per-replica batch into micro-batches
                                 // of N with gradient accumulation (one optimizer step and
                                 // one all-reduce per batch; BN statistics per micro-batch)
  std::string device = "auto";   // auto | cpu | cuda (this local rank's GPU) | cuda:N
  int64_t seed = 42;             // model initialisation seed
  int64_t max_steps = 0;         // 0 = no limit; stop after this many steps (smoke runs)
  std::string scale_lr = "off";  // off | linear (learning rate x number of replicas)
  double mixup_alpha = 0;        // 0 = off; lambda ~ Beta(alpha, alpha) per batch
  double cutmix_alpha = 0;       // 0 = off; with both, one of the two per batch, half and half
  EmaSpec ema;
  double clip_grad_norm = 0;  // 0 = off; max L2 norm of the global (averaged) gradient
  std::vector<std::string> class_weights = {"none"};  // none | balanced | [w0, w1, ...]
  std::string loss = "cross_entropy";                 // cross_entropy | focal | bi_tempered
  double focal_gamma = 2.0;                           // focal: (1 - p)^gamma
  double bi_tempered_t1 = 0.8;                        // bi_tempered: t1 <= 1 (1 = log loss)
  double bi_tempered_t2 = 1.2;                        // bi_tempered: t2 >= 1 (1 = softmax)
  EarlyStoppingSpec early_stopping;
};

struct CheckpointSpec {
  int every_epochs = 1;  // write a checkpoint every N epochs (and at the end)
  int every_steps = 0;   // also every N steps, mid-epoch (bounds the work a failure costs); 0 = off
  int keep = 3;          // newest checkpoints kept
  std::string keep_best = "off";  // off | val_accuracy | val_loss: JOB_DIR/model_best
};

struct DistributedSpec {
  std::string backend = "auto";       // auto (nccl on cuda, else gloo) | gloo | nccl
  double rendezvous_timeout_s = 900;  // how long workers wait for the chief at start
  double timeout_s = 1800;            // a collective that takes longer is an error (exit 4)
  double bucket_mb = 25;              // gradient all-reduce bucket size
  std::string interface;              // network interface for Gloo ("" = this task's host)
  std::string cluster = "auto";       // role source: auto | tf_config | slurm | torchrun
};

struct LoggingSpec {
  int every_steps = 10;        // plain log line / metrics record every N steps
  std::string level = "info";  // trace | debug | info | warn | error
  bool tensorboard = true;     // the chief writes event files under JOB_DIR/logs/{train,validation}
  double flush_secs = 30;      // event files are flushed at least this often (and at exit)
  int images_per_epoch = 4;    // training input images shown per epoch (0 = none)
};

struct ExportSpec {
  bool onnx = false;                // also write JOB_DIR/model/model.onnx (chief, at the end)
  bool onnx_preprocessing = false;  // its input: uint8 NHWC RGB, normalised inside the graph
  int onnx_opset = 13;              // 13 (what OpenCV 4.6's DNN reads) to 17
  std::string weights = "ema";      // ema (when train.ema.decay > 0) | raw
};

struct JobSpec {
  ModelSpec model;
  DataSpec data;
  TrainSpec train;
  CheckpointSpec checkpoint;
  DistributedSpec distributed;
  LoggingSpec logging;
  ExportSpec export_;  // `export` in YAML (a C++ keyword)
};

// Parses YAML text (origin names the file in messages), applies `overrides` ("a.b.c=value",
// the value parsed as a YAML scalar or flow sequence), fills defaults and validates the whole.
// Relative source paths are kept as written. Throws ConfigError.
JobSpec parse_job_spec(const std::string& yaml_text, const std::vector<std::string>& overrides,
                       const std::string& origin);

// Checks every field of an already-typed spec (the checks parse_job_spec runs after reading),
// throwing ConfigError "<origin>: <dotted field>: <what was expected>, got '<value>'" for the
// first problem in declaration order. For specs built in code (tests, tools).
void validate_job_spec(const JobSpec& spec, const std::string& origin);

// Reads `path` ("" = defaults only) and calls parse_job_spec. Throws ConfigError (also for an
// unreadable file, naming it).
JobSpec load_job_spec(const std::string& path, const std::vector<std::string>& overrides);

// The resolved spec as YAML that parse_job_spec reads back to an equal value (job.yaml).
std::string to_yaml(const JobSpec& spec);

// The resolved spec as a JSON object with the same tree (inspect's `job`).
nlohmann::json to_json(const JobSpec& spec);

// Every field as (dotted path, canonical value text), in declaration order.
std::vector<std::pair<std::string, std::string>> flatten(const JobSpec& spec);

struct FieldDifference {
  std::string field;  // dotted path
  std::string left;   // value in the first spec
  std::string right;  // value in the second spec
};

// The first field (declaration order) whose value differs, ignoring any field whose dotted path
// starts with one of `ignored_prefixes` (e.g. "train.epochs", "logging."). nullopt = same.
std::optional<FieldDifference> first_difference(const JobSpec& a, const JobSpec& b,
                                                const std::vector<std::string>& ignored_prefixes);

// The fields that may change between runs of the same job (resume still applies): how long it
// runs ("train.epochs", "train.max_steps"), what it logs and how often it saves ("logging.",
// "checkpoint."), and what changes only speed or robustness, never a bit of the results
// ("train.threads", "data.num_workers", "data.prefetch_batches", "distributed.timeout_s",
// "distributed.rendezvous_timeout_s", "distributed.interface", and "data.cache" unless
// `spec` crops at random: a cached image is cropped after the resize, so the cache then changes
// the pixels). Not listed because they change bits: distributed.backend and bucket_mb (the order
// of the sums with 3 or more workers), data.reduced_decode, train.device, train.precision.
std::vector<std::string> resumable_changes(const JobSpec& spec);

// Hex digest of flatten(spec) (stable across runs and machines), leaving out the fields that
// first_difference would ignore with the same prefixes.
std::string fingerprint(const JobSpec& spec, const std::vector<std::string>& ignored_prefixes = {});

// N of a train.device written "cuda:N" (N in 0..9999, no sign or leading zeros, as
// torch::Device reads it), else -1.
int cuda_device_index(const std::string& device);

// Human-readable reference of every field with its default and comment (for --help / README).
std::string field_reference();

}  // namespace trainer::config
