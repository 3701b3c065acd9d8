// The field table of the job spec: the one place that lists every field, in declaration order,
// with its YAML name, one-line doc and rule. YAML reading, unknown-key detection, to_yaml,
// to_json, flatten, validation and field_reference are all visitors over it. Private to config/.
//
// A visitor V provides:
//   template <class T> void operator()(const char* name, T& value, const Field& rule);  // a leaf
//   template <class S> void section(const char* name, S& sub, const char* doc);  // nested struct
//   template <class F> void check(const char* name, F&& problem);  // cross-field rule: problem()
//                                     returns "" or what is wrong with field `name` (relative)
// Visitors that do not validate derive from NoChecks. Stateless templates: thread-safe.
#pragma once

#include <string>

#include "trainer/config/job_spec.h"
#include "trainer/config/values.h"

namespace trainer::config::detail {

// train.device: auto, cpu, cuda or cuda:N (cuda_device_index).
inline bool is_device_name(const std::string& d) {
  return d == "auto" || d == "cpu" || d == "cuda" || cuda_device_index(d) >= 0;
}

struct NoChecks {
  template <class F>
  void check(const char*, F&&) {}
};

template <class V>
void visit(SourceSpec& s, V& v) {
  v("format", s.format,
    Field("how the examples are listed").one_of({"imagefolder", "csv", "tfrecord"}));
  v("path", s.path,
    Field("imagefolder: class dirs; csv: manifest; tfrecord: files, glob or TFDS dir (\"\" = none)")
        .scalar_or_list());
  v.check("path", [&s] {
    if (s.path.size() <= 1 || s.format == "tfrecord") return std::string();
    return "a list of paths needs format tfrecord, got format " + in_quotes(s.format);
  });
  v("image_column", s.image_column, Field("csv: column holding the image path (relative)"));
  v("label_column", s.label_column, Field("csv: column holding the label (index or name)"));
  v("image_root", s.image_root,
    Field("csv: dir image paths are relative to (\"\" = the manifest's)"));
  v("split", s.split,
    Field("tfrecord TFDS dir: train|validation|test (\"\" = this source's name)"));
  v.check("split", [&s] {
    if (s.split.empty() || s.split == "train" || s.split == "validation" || s.split == "test")
      return std::string();
    return "expected one of train|validation|test (or \"\"), got " + in_quotes(s.split);
  });
  v("image_key", s.image_key, Field("tfrecord: feature with the encoded image (bytes)"));
  v("label_key", s.label_key, Field("tfrecord: feature with the class index (Kaggle: target)"));
  v("compression", s.compression,
    Field("tfrecord: auto = gzip when the file starts with the gzip magic")
        .one_of({"auto", "none", "gzip"}));
}

template <class V>
void visit(ModelSpec& s, V& v) {
  v("arch", s.arch,
    Field("network architecture")
        .one_of({"resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d",
                 "resnext101_32x8d", "resnext101_64x4d", "wide_resnet50_2", "wide_resnet101_2",
                 "efficientnet_b0", "efficientnet_b1", "efficientnet_b2", "efficientnet_b3",
                 "efficientnet_b4"}));
  v("num_classes", s.num_classes,
    Field("classifier outputs (auto = the number of classes in the data)")
        .at_least(0)
        .at_most(kMaxClasses)
        .zero_means("auto"));
  v("head_hidden", s.head_hidden,
    Field("0 = torchvision's classifier; N = Linear(N) + ReLU + Linear(classes) (fc.0/fc.2; "
          "EfficientNet: classifier.1/classifier.3 after its dropout)")
        .at_least(0)
        .at_most(kMaxHeadHidden));
  v("pretrained", s.pretrained,
    Field("ImageNet weights to start from: a .pth (torch.save) or .safetensors path, an "
          "http(s):// URL, or torchvision:NAME (IMAGENET1K_V1, IMAGENET1K_V2, DEFAULT), fetched "
          "into $TORCH_HOME/hub/checkpoints (\"\" = none)"));
  v("freeze_backbone", s.freeze_backbone,
    Field("train only the classifier (fc*; EfficientNet: classifier*, all of features frozen)"));
  v("freeze_batchnorm", s.freeze_batchnorm, Field("BN layers stay in eval mode, statistics fixed"));
  v("sync_batchnorm", s.sync_batchnorm,
    Field("BN statistics in training over the global batch, not each replica's (SyncBatchNorm)"));
}

template <class V>
void visit(ColorJitterSpec& s, V& v) {
  v("brightness", s.brightness,
    Field("factor in [max(0, 1-b), 1+b]; 0 = off").at_least(0).at_most(10));
  v("contrast", s.contrast, Field("factor in [max(0, 1-c), 1+c]; 0 = off").at_least(0).at_most(10));
  v("saturation", s.saturation,
    Field("factor in [max(0, 1-s), 1+s]; 0 = off").at_least(0).at_most(10));
  v("hue", s.hue, Field("hue shift in [-h, h]; 0 = off").at_least(0).at_most(0.5));
}

template <class V>
void visit(AugmentSpec& s, V& v) {
  v("horizontal_flip", s.horizontal_flip, Field("flip left-right with probability 0.5"));
  v("random_resized_crop", s.random_resized_crop,
    Field("torchvision RandomResizedCrop(image_size)"));
  v("crop_scale_min", s.crop_scale_min,
    Field("smallest crop area fraction (torchvision: 0.08)").above(0).at_most(1));
  v("vertical_flip", s.vertical_flip, Field("flip top-bottom with probability 0.5"));
  v("rotate90", s.rotate90, Field("rotate by a random multiple of 90 degrees"));
  v("rotate_degrees", s.rotate_degrees,
    Field("RandomRotation(-d, d), nearest, black corners; 0 = off").at_least(0).at_most(180));
  v.section("color_jitter", s.color_jitter, "torchvision ColorJitter");
  v("policy", s.policy,
    Field("automatic augmentation policy (torchvision's, ImageNet policy for auto_augment)")
        .one_of({"none", "trivial_augment_wide", "rand_augment", "auto_augment", "augmix"}));
  v("magnitude", s.magnitude,
    Field("rand_augment magnitude (0..30) or augmix severity (1..10); auto = 9 / 3")
        .at_least(0)
        .at_most(30)
        .zero_means("auto"));
  v.check("magnitude", [&s] {
    if (s.magnitude == 0 || s.policy == "rand_augment") return std::string();
    if (s.policy == "augmix") {
      return std::string(s.magnitude <= 10 ? "" : "augmix severity: expected 1..10 (or auto)");
    }
    return "only rand_augment and augmix have a magnitude, got policy " + in_quotes(s.policy);
  });
  v("num_ops", s.num_ops,
    Field("rand_augment: operations per image; auto = 2")
        .at_least(0)
        .at_most(14)
        .zero_means("auto"));
  v.check("num_ops", [&s] {
    if (s.num_ops == 0 || s.policy == "rand_augment") return std::string();
    return "only rand_augment has num_ops, got policy " + in_quotes(s.policy);
  });
  v("random_erasing", s.random_erasing,
    Field("RandomErasing probability (scale 0.02..0.33, ratio 0.3..3.3); 0 = off")
        .at_least(0)
        .at_most(1));
}

template <class V>
void visit(DataSpec& s, V& v) {
  v.section("train", s.train, "the training examples (required)");
  v.check("train.path", [&s] {
    return std::string(
        s.train.path.empty() ? "required (class folders, a csv manifest or TFRecord files)" : "");
  });
  v.section("validation", s.validation, "the validation examples (path \"\" = none)");
  v("class_names", s.class_names, Field("class order ([] = from the train source)"));
  v.check("class_names", [&s] { return class_names_problem(s.class_names); });
  v("image_size", s.image_size,
    Field("square side images are resized to (tutorial: 300)").at_least(16).at_most(kMaxImageSize));
  v("normalize", s.normalize,
    Field("unit = x/255 as the tutorial, imagenet = mean/std").one_of({"unit", "imagenet"}));
  v.section("augment", s.augment, "training-time augmentation");
  v("shuffle", s.shuffle, Field("reshuffle the training examples every epoch"));
  v("seed", s.seed, Field("data order and augmentation seed"));
  v("num_workers", s.num_workers,
    Field("decode threads (auto = from this process's thread budget)")
        .at_least(0)
        .at_most(256)
        .zero_means("auto"));
  v("prefetch_batches", s.prefetch_batches,
    Field("batches decoded ahead of the model").at_least(1).at_most(64));
  v("on_corrupt", s.on_corrupt,
    Field("on an undecodable image; skip = count, log and go on").one_of({"fail", "skip"}));
  v("shard_policy", s.shard_policy,
    Field("how workers split the data (auto = file if enough even files, else data)")
        .one_of({"auto", "file", "data", "off"}));
  v("interleave", s.interleave,
    Field("tfrecord: record files read at once (tf.data interleave)").at_least(1).at_most(256));
  v("shuffle_buffer", s.shuffle_buffer,
    Field("tfrecord: shuffle buffer in examples (tf.data shuffle)").at_least(1).at_most(1000000));
  v("cache", s.cache,
    Field("memory = keep decoded, resized images after first use").one_of({"none", "memory"}));
  v("reduced_decode", s.reduced_decode,
    Field("JPEG: decode at 1/2, 1/4, 1/8 scale when that still covers image_size"));
  v("interpolation", s.interpolation,
    Field("resampling of crops and resizes").one_of({"bilinear", "bicubic"}));
  v("eval_resize", s.eval_resize,
    Field("square = whole image to eval_crop_size (tutorial); shorter_side = resize + centre crop")
        .one_of({"square", "shorter_side"}));
  v("eval_resize_size", s.eval_resize_size,
    Field("shorter_side: shorter side before the crop; auto = eval_crop_size / 0.875")
        .at_least(0)
        .at_most(kMaxImageSize)
        .zero_means("auto"));
  v.check("eval_resize_size", [&s] {
    const int crop = s.eval_crop_size > 0 ? s.eval_crop_size : s.image_size;
    if (s.eval_resize_size == 0) return std::string();
    if (s.eval_resize != "shorter_side") {
      return std::string("only used with data.eval_resize: shorter_side; leave it auto");
    }
    if (s.eval_resize_size >= crop) return std::string();
    return "expected at least the evaluation crop (" + std::to_string(crop) + "), got " +
           in_quotes(std::to_string(s.eval_resize_size));
  });
  v("eval_crop_size", s.eval_crop_size,
    Field("evaluation input side; auto = image_size")
        .at_least(0)
        .at_most(kMaxImageSize)
        .zero_means("auto"));
  v.check("eval_crop_size", [&s] {
    if (s.eval_crop_size == 0 || s.eval_crop_size >= 16) return std::string();
    return "expected at least 16 (or auto), got " + in_quotes(std::to_string(s.eval_crop_size));
  });
  v("sampler", s.sampler,
    Field("balanced = draw each class equally often (with replacement), the same on every rank")
        .one_of({"uniform", "balanced"}));
  v("validation_split", s.validation_split,
    Field("hold out this fraction of data.train as validation, chosen with data.seed; 0 = off")
        .at_least(0)
        .at_most(0.9));
  v.check("validation_split", [&s] {
    if (s.validation_split == 0 || s.validation.path.empty()) return std::string();
    return "set either data.validation.path or data.validation_split, not both (got " +
           format_double(s.validation_split) + " and a validation path)";
  });
}

template <class V>
void visit(OptimizerSpec& s, V& v) {
  v("name", s.name, Field("optimizer").one_of({"adam", "adamw", "sgd"}));
  v("learning_rate", s.learning_rate,
    Field("base learning rate (tutorial: Adam 1e-4); 0 = the parameters stay as loaded (as "
          "torch.optim allows; BN running statistics still update)")
        .at_least(0));
  v("momentum", s.momentum, Field("sgd only").at_least(0).below(1));
  v("weight_decay", s.weight_decay, Field("L2 (adam, sgd) or decoupled (adamw)").at_least(0));
  v("nesterov", s.nesterov, Field("Nesterov momentum (sgd with momentum > 0 only)"));
  v.check("nesterov", [&s] {
    if (!s.nesterov || (s.name == "sgd" && s.momentum > 0)) return std::string();
    return "true requires name sgd with momentum > 0, got name " + in_quotes(s.name) +
           " and momentum " + format_double(s.momentum);
  });
  v("norm_weight_decay", s.norm_weight_decay,
    Field("weight decay of normalization layers (\"\" = weight_decay)"));
  v.check("norm_weight_decay", [&s] { return weight_decay_problem(s.norm_weight_decay); });
  v("bias_weight_decay", s.bias_weight_decay,
    Field("weight decay of the other biases (\"\" = weight_decay)"));
  v.check("bias_weight_decay", [&s] { return weight_decay_problem(s.bias_weight_decay); });
}

template <class V>
void visit(LrScheduleSpec& s, V& v) {
  v("name", s.name,
    Field("schedule after the warm-up; plateau = ReduceLROnPlateau on the validation metric")
        .one_of({"constant", "cosine", "step", "plateau"}));
  v("warmup_epochs", s.warmup_epochs,
    Field("linear warm-up from 0 over this many epochs").at_least(0));
  v("step_epochs", s.step_epochs,
    Field("step: multiply by gamma every this many epochs").at_least(1));
  v("gamma", s.gamma, Field("step: decay factor").above(0).at_most(1));
  v("min_lr", s.min_lr, Field("cosine: final learning rate; plateau: the floor").at_least(0));
  v("factor", s.factor,
    Field("plateau: multiply the rate by this when it stalls").above(0).below(1));
  v("patience", s.patience,
    Field("plateau: epochs without improvement before reducing").at_least(0).at_most(100000));
  v("metric", s.metric,
    Field("plateau: val_loss (lower is better) or val_accuracy")
        .one_of({"val_loss", "val_accuracy"}));
}

template <class V>
void visit(EmaSpec& s, V& v) {
  v("decay", s.decay,
    Field("EMA of the weights (torchvision: 0.99998, adjusted for batch and steps); 0 = off")
        .at_least(0)
        .below(1));
  v("every_steps", s.every_steps,
    Field("update the average every N optimizer steps").at_least(1).at_most(1000000));
}

template <class V>
void visit(EarlyStoppingSpec& s, V& v) {
  v("patience", s.patience,
    Field("stop after N epochs without improvement; 0 = off").at_least(0).at_most(100000));
  v("metric", s.metric, Field("what must improve").one_of({"val_accuracy", "val_loss"}));
  v("min_delta", s.min_delta, Field("smallest change that counts as improvement").at_least(0));
}

template <class V>
void visit(TrainSpec& s, V& v) {
  v("epochs", s.epochs, Field("passes over the training data").at_least(1).at_most(1000000));
  v("per_replica_batch_size", s.per_replica_batch_size,
    Field("examples per step per replica; global batch = this x replicas")
        .at_least(1)
        .at_most(kMaxBatchSize));
  v.section("optimizer", s.optimizer, "the optimizer");
  v.section("lr_schedule", s.lr_schedule, "the learning-rate schedule");
  v.check("lr_schedule.warmup_epochs", [&s] {
    if (s.lr_schedule.warmup_epochs < s.epochs) return std::string();
    return "expected a number less than train.epochs (" + std::to_string(s.epochs) + "), got " +
           in_quotes(format_double(s.lr_schedule.warmup_epochs));
  });
  v("label_smoothing", s.label_smoothing,
    Field("cross-entropy label smoothing").at_least(0).below(1));
  v("precision", s.precision,
    Field("compute precision; bf16 = autocast; fp16 = autocast with dynamic loss scaling (GPUs); "
          "auto = CPU: the faster of fp32 and bf16, timed at start-up on the model's own "
          "convolutions; GPU: bf16 on sm80+, fp16 on sm70/sm75")
        .one_of({"fp32", "bf16", "fp16", "auto"}));
  v("deterministic", s.deterministic,
    Field("bit-reproducible kernels; auto = on for CPU (free), off on GPUs (cuDNN benchmark mode)")
        .one_of({"auto", "true", "false"}));
  v("channels_last", s.channels_last,
    Field("NHWC memory format for the convolutions; auto = CPU: the faster layout, timed at "
          "start-up with train.precision; GPU: true under fp16/bf16 autocast")
        .one_of({"false", "true", "auto"}));
  v("threads", s.threads,
    Field("intra-op threads; 0 = the cores of this process's CPU affinity mask")
        .at_least(0)
        .at_most(1024));
  v("micro_batch_size", s.micro_batch_size,
    Field("split each per-replica batch into micro-batches of N (gradient accumulation)")
        .at_least(0)
        .zero_means("off"));
  v.check("micro_batch_size", [&s] {
    if (s.micro_batch_size <= s.per_replica_batch_size) return std::string();
    return "expected at most train.per_replica_batch_size (" +
           std::to_string(s.per_replica_batch_size) + "), got " +
           in_quotes(std::to_string(s.micro_batch_size));
  });
  v("device", s.device,
    Field("auto = cuda when available; cuda = GPU (local rank mod GPUs); cuda:N = GPU N "
          "(auto|cpu|cuda|cuda:N)"));
  v.check("device", [&s] {
    if (is_device_name(s.device)) return std::string();
    return "expected auto, cpu, cuda or cuda:N, got " + in_quotes(s.device);
  });
  v("seed", s.seed, Field("model initialisation seed"));
  v("max_steps", s.max_steps,
    Field("stop after this many steps (smoke runs); 0 = no limit").at_least(0));
  v("scale_lr", s.scale_lr,
    Field("linear = learning rate x number of replicas").one_of({"off", "linear"}));
  v("mixup_alpha", s.mixup_alpha,
    Field("mixup: lambda ~ Beta(a, a) per batch; 0 = off").at_least(0).at_most(100));
  v("cutmix_alpha", s.cutmix_alpha,
    Field("CutMix: lambda ~ Beta(a, a) per batch; 0 = off (both set: one of them per batch)")
        .at_least(0)
        .at_most(100));
  v.section("ema", s.ema, "exponential moving average of the weights");
  v("clip_grad_norm", s.clip_grad_norm,
    Field("max L2 norm of the averaged gradient; 0 = off").at_least(0));
  v("class_weights", s.class_weights,
    Field("loss weight per class: none, balanced (n / (classes x count)) or [w0, w1, ...]")
        .scalar_or_list());
  v.check("class_weights", [&s] { return class_weights_problem(s.class_weights); });
  v("loss", s.loss, Field("training loss").one_of({"cross_entropy", "focal", "bi_tempered"}));
  v("focal_gamma", s.focal_gamma, Field("focal: the focusing exponent").at_least(0).at_most(10));
  v("bi_tempered_t1", s.bi_tempered_t1,
    Field("bi_tempered: log temperature (1 = log loss)").above(0).at_most(1));
  v("bi_tempered_t2", s.bi_tempered_t2,
    Field("bi_tempered: exp temperature (1 = softmax)").at_least(1).below(5));
  v.section("early_stopping", s.early_stopping, "stop when validation stops improving");
}

template <class V>
void visit(CheckpointSpec& s, V& v) {
  v("every_epochs", s.every_epochs,
    Field("write a checkpoint every N epochs (and at the end)").at_least(1));
  v("every_steps", s.every_steps,
    Field("also every N steps, mid-epoch (bounds the work a failure costs)")
        .at_least(0)
        .zero_means("off"));
  v("keep", s.keep, Field("newest checkpoints kept").at_least(1));
  v("keep_best", s.keep_best,
    Field("also keep the best epoch's model in JOB_DIR/model_best")
        .one_of({"off", "val_accuracy", "val_loss"}));
}

template <class V>
void visit(DistributedSpec& s, V& v) {
  v("backend", s.backend,
    Field("collectives (auto = nccl on cuda, else gloo)").one_of({"auto", "gloo", "nccl"}));
  v("rendezvous_timeout_s", s.rendezvous_timeout_s,
    Field("seconds workers wait for the chief at start").above(0).at_most(kMaxTimeoutS));
  v("timeout_s", s.timeout_s,
    Field("seconds before a collective fails (exit 4)").above(0).at_most(kMaxTimeoutS));
  v("bucket_mb", s.bucket_mb,
    Field("gradient all-reduce bucket size in MB").above(0).at_most(4096));
  v("interface", s.interface, Field("network interface for Gloo (\"\" = this task's host)"));
  v("cluster", s.cluster,
    Field("where each task's role comes from: auto = TF_CONFIG, else torchrun's RANK/WORLD_SIZE")
        .one_of({"auto", "tf_config", "slurm", "torchrun"}));
}

template <class V>
void visit(LoggingSpec& s, V& v) {
  v("every_steps", s.every_steps,
    Field("plain log line every N steps (metrics.jsonl gets every step)").at_least(1));
  v("level", s.level, Field("log level").one_of({"trace", "debug", "info", "warn", "error"}));
  v("tensorboard", s.tensorboard,
    Field("chief writes TensorBoard event files to JOB_DIR/logs/train and logs/validation"));
  v("flush_secs", s.flush_secs,
    Field("event files are flushed at least every N seconds, and at exit").above(0).at_most(3600));
  v("images_per_epoch", s.images_per_epoch,
    Field("training input images written to the event file per epoch (PNG)")
        .at_least(0)
        .at_most(64));
}

template <class V>
void visit(ExportSpec& s, V& v) {
  v("onnx", s.onnx,
    Field("also write JOB_DIR/model/model.onnx at the end (trainer export --format onnx)"));
  v("onnx_preprocessing", s.onnx_preprocessing,
    Field("model.onnx takes uint8 NHWC RGB and normalises inside the graph"));
  v("onnx_opset", s.onnx_opset, Field("ONNX opset of model.onnx").at_least(13).at_most(17));
  v("weights", s.weights,
    Field("ema = the EMA weights when train.ema.decay > 0; raw = the trained weights")
        .one_of({"ema", "raw"}));
}

template <class V>
void visit(JobSpec& s, V& v) {
  v.section("model", s.model, "the network");
  v.section("data", s.data, "where the examples come from and how they are prepared");
  v.section("train", s.train, "the training loop");
  v.section("checkpoint", s.checkpoint, "checkpoints (written by the chief)");
  v.section("distributed", s.distributed, "multi-worker training (TF_CONFIG)");
  v.section("logging", s.logging, "log lines, metrics and TensorBoard summaries");
  v.section("export", s.export_, "what the chief writes to JOB_DIR/model besides safetensors");
  // What needs a validation set to decide.
  const bool validates = has_validation(s.data);
  v.check("checkpoint.keep_best", [&s, validates] {
    if (s.checkpoint.keep_best == "off" || validates) return std::string();
    return "needs validation data (data.validation.path or data.validation_split), got " +
           in_quotes(s.checkpoint.keep_best);
  });
  v.check("train.early_stopping.patience", [&s, validates] {
    if (s.train.early_stopping.patience == 0 || validates) return std::string();
    return "needs validation data (data.validation.path or data.validation_split), got " +
           in_quotes(std::to_string(s.train.early_stopping.patience));
  });
  v.check("train.lr_schedule.name", [&s, validates] {
    if (s.train.lr_schedule.name != "plateau" || validates) return std::string();
    return std::string(
        "plateau needs validation data (data.validation.path or data.validation_split)");
  });
}

// The names of S's fields and sections, in order (for unknown-key messages).
struct NameCollector : NoChecks {
  std::vector<std::string> names;
  template <class T>
  void operator()(const char* name, T&, const Field&) {
    names.emplace_back(name);
  }
  template <class S>
  void section(const char* name, S&, const char*) {
    names.emplace_back(name);
  }
};

template <class S>
std::vector<std::string> field_names() {
  S scratch;
  NameCollector c;
  visit(scratch, c);
  return c.names;
}

}  // namespace trainer::config::detail
