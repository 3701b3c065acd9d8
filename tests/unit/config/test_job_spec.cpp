// Job-spec parsing: a table of valid and invalid YAML documents and --set overrides. Every
// invalid case checks that the message names the place (file:line or the override) and the
// dotted field.
#include "common/catch.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include "trainer/config/job_spec.h"
#include "trainer/util/error.h"

using trainer::ConfigError;
using trainer::config::flatten;
using trainer::config::JobSpec;
using trainer::config::parse_job_spec;
using trainer::test::Contains;

namespace {

const std::string kTrainPath = "data.train.path=/d";  // the one required field

// The message of the ConfigError parse_job_spec throws, or "(no error)".
std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides) {
  try {
    parse_job_spec(yaml, overrides, "job.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

// The canonical text of one field (flatten), or "(no such field)".
std::string field(const JobSpec& s, const std::string& path) {
  for (const auto& [p, v] : flatten(s))
    if (p == path) return v;
  return "(no such field)";
}

struct Bad {
  const char* name;
  std::string yaml;
  std::vector<std::string> overrides;  // kTrainPath is prepended unless the case says "bare"
  bool bare;                           // true: no kTrainPath
  std::vector<std::string> expect;     // substrings of the message
};

const std::vector<Bad> kBad = {
    // --- upper bounds of the fields that size memory or a wait (each says its bound) -------
    {"prefetch too deep",
     "",
     {"data.prefetch_batches=65"},
     false,
     {"data.prefetch_batches", "65", "64"}},
    {"interleave too wide", "", {"data.interleave=100000"}, false, {"data.interleave", "256"}},
    {"shuffle buffer too big",
     "",
     {"data.shuffle_buffer=2000000"},
     false,
     {"data.shuffle_buffer", "1000000"}},
    {"num_workers too many", "", {"data.num_workers=300"}, false, {"data.num_workers", "256"}},
    {"image too big", "", {"data.image_size=5000"}, false, {"data.image_size", "4096"}},
    {"batch too big",
     "",
     {"train.per_replica_batch_size=100000"},
     false,
     {"train.per_replica_batch_size", "4096"}},
    {"classes too many",
     "",
     {"model.num_classes=1000000000"},
     false,
     {"model.num_classes", "100000"}},
    {"head too wide", "", {"model.head_hidden=1000000000"}, false, {"model.head_hidden", "65536"}},
    {"timeout beyond a week",
     "",
     {"distributed.timeout_s=1e300"},
     false,
     {"distributed.timeout_s", "604800"}},
    {"rendezvous timeout beyond a week",
     "",
     {"distributed.rendezvous_timeout_s=1e12"},
     false,
     {"distributed.rendezvous_timeout_s", "604800"}},
    // --- unknown keys, with and without a hint ---------------------------------------------
    {"unknown top-level key",
     "modle:\n  arch: resnet18\n",
     {},
     false,
     {"job.yaml:1: unknown field 'modle'",
      "(expected one of: model, data, train, checkpoint, distributed, logging, export)",
      "did you mean 'model'?"}},
    {"unknown nested key",
     "train:\n  epochs: 3\n  optimzer:\n    name: sgd\n",
     {},
     false,
     {"job.yaml:3: unknown field 'train.optimzer'",
      "expected one of: epochs, per_replica_batch_size, optimizer,", "did you mean 'optimizer'?"}},
    {"unknown key in a source",
     "data:\n  train:\n    path: /d\n    formt: csv\n",
     {},
     true,
     {"job.yaml:4: unknown field 'data.train.formt'", "did you mean 'format'?"}},
    {"unknown key in validation source",
     "data:\n  validation:\n    paht: /v\n",
     {},
     false,
     {"job.yaml:3: unknown field 'data.validation.paht'", "did you mean 'path'?"}},
    {"unknown key in augment",
     "data:\n  augment:\n    flip: true\n",
     {},
     false,
     {"job.yaml:3: unknown field 'data.augment.flip'",
      "expected one of: horizontal_flip, random_resized_crop, crop_scale_min"}},
    {"unknown key, case differs",
     "train:\n  Epochs: 3\n",
     {},
     false,
     {"job.yaml:2: unknown field 'train.Epochs'", "did you mean 'epochs'?"}},
    {"unknown key in override",
     "",
     {"train.optimzer.name=sgd"},
     false,
     {"--set 'train.optimzer.name=sgd': unknown field 'train.optimzer'",
      "did you mean 'optimizer'?"}},
    {"unknown top-level key in override",
     "",
     {"modl.arch=resnet18"},
     false,
     {"--set 'modl.arch=resnet18': unknown field 'modl'", "did you mean 'model'?"}},
    {"unknown leaf in override",
     "",
     {"data.augment.flip=true"},
     false,
     {"--set 'data.augment.flip=true': unknown field 'data.augment.flip'"}},
    {"unknown key inside an override's mapping",
     "",
     {"train.optimizer={name: sgd, lr: 1}"},
     false,
     {"--set 'train.optimizer={name: sgd, lr: 1}': unknown field 'train.optimizer.lr'"}},
    {"key given twice",
     "train:\n  epochs: 1\n  epochs: 2\n",
     {},
     false,
     {"job.yaml:3: train.epochs: field given twice"}},

    // --- every enum with a bad value ----------------------------------------------------------
    {"bad arch",
     "model:\n  arch: vgg16\n",
     {},
     false,
     {"job.yaml:2: model.arch: expected one of "
      "resnet18|resnet34|resnet50|resnet101|resnet152|resnext50_32x4d|resnext101_32x8d|"
      "resnext101_64x4d|wide_resnet50_2|wide_resnet101_2|efficientnet_b0|efficientnet_b1|"
      "efficientnet_b2|efficientnet_b3|efficientnet_b4, got 'vgg16'"}},
    {"bad train format",
     "data:\n  train:\n    path: /d\n    format: tfrecords\n",
     {},
     true,
     {"job.yaml:4: data.train.format: expected one of imagefolder|csv|tfrecord, got 'tfrecords'"}},
    {"bad validation format",
     "data:\n  validation:\n    format: parquet\n",
     {},
     false,
     {"job.yaml:3: data.validation.format: expected one of imagefolder|csv|tfrecord, got "
      "'parquet'"}},
    {"bad normalize",
     "data:\n  normalize: none\n",
     {},
     false,
     {"job.yaml:2: data.normalize: expected one of unit|imagenet, got 'none'"}},
    {"bad on_corrupt",
     "data:\n  on_corrupt: ignore\n",
     {},
     false,
     {"job.yaml:2: data.on_corrupt: expected one of fail|skip, got 'ignore'"}},
    {"bad optimizer",
     "train:\n  optimizer:\n    name: rmsprop\n",
     {},
     false,
     {"job.yaml:3: train.optimizer.name: expected one of adam|adamw|sgd, got 'rmsprop'"}},
    {"bad schedule",
     "train:\n  lr_schedule:\n    name: linear\n",
     {},
     false,
     {"job.yaml:3: train.lr_schedule.name: expected one of constant|cosine|step|plateau, got "
      "'linear'"}},
    {"bad precision",
     "train:\n  precision: fp8\n",
     {},
     false,
     {"job.yaml:2: train.precision: expected one of fp32|bf16|fp16|auto, got 'fp8'"}},
    {"bad deterministic",
     "train:\n  deterministic: maybe\n",
     {},
     false,
     {"job.yaml:2: train.deterministic: expected one of auto|true|false, got 'maybe'"}},
    {"micro_batch_size above the batch",
     "train:\n  per_replica_batch_size: 8\n  micro_batch_size: 16\n",
     {},
     false,
     {"train.micro_batch_size: expected at most train.per_replica_batch_size (8), got '16'"}},
    {"micro_batch_size negative",
     "train:\n  micro_batch_size: -1\n",
     {},
     false,
     {"job.yaml:2: train.micro_batch_size: expected off or a positive integer, got '-1'"}},
    {"bad device",
     "train:\n  device: tpu\n",
     {},
     false,
     {"job.yaml:2: train.device: expected auto, cpu, cuda or cuda:N, got 'tpu'"}},
    {"device cuda:N with a leading zero",
     "",
     {"train.device=cuda:01"},
     false,
     {"--set 'train.device=cuda:01': train.device: expected auto, cpu, cuda or cuda:N, got "
      "'cuda:01'"}},
    {"device cuda:N without N",
     "train:\n  device: 'cuda:'\n",
     {},
     false,
     {"job.yaml:2: train.device: expected auto, cpu, cuda or cuda:N, got 'cuda:'"}},
    {"device cuda:N negative", "", {"train.device=cuda:-1"}, false, {"got 'cuda:-1'"}},
    {"device cuda:N past 9999", "", {"train.device=cuda:10000"}, false, {"got 'cuda:10000'"}},
    {"bad log level",
     "logging:\n  level: verbose\n",
     {},
     false,
     {"job.yaml:2: logging.level: expected one of trace|debug|info|warn|error, got 'verbose'"}},
    {"enum given a list",
     "model:\n  arch: [resnet18]\n",
     {},
     false,
     {"job.yaml:2: model.arch: expected one of resnet18|", "got a list"}},

    // --- numbers out of range -----------------------------------------------------------------
    {"num_classes 0",
     "model:\n  num_classes: 0\n",
     {},
     false,
     {"job.yaml:2: model.num_classes: expected auto or an integer in [1, 100000], got '0'"}},
    {"num_classes negative",
     "model:\n  num_classes: -3\n",
     {},
     false,
     {"job.yaml:2: model.num_classes: expected auto or an integer in [1, 100000], got '-3'"}},
    {"num_classes word",
     "model:\n  num_classes: many\n",
     {},
     false,
     {"job.yaml:2: model.num_classes: expected auto or an integer in [1, 100000], got 'many'"}},
    {"head_hidden negative",
     "model:\n  head_hidden: -1\n",
     {},
     false,
     {"job.yaml:2: model.head_hidden: expected an integer in [0, 65536], got '-1'"}},
    {"image_size small",
     "data:\n  image_size: 8\n",
     {},
     false,
     {"job.yaml:2: data.image_size: expected an integer in [16, 4096], got '8'"}},
    {"image_size large",
     "",
     {"data.image_size=5000"},
     false,
     {"--set 'data.image_size=5000': data.image_size: expected an integer in [16, 4096], got "
      "'5000'"}},
    {"crop_scale_min 0",
     "data:\n  augment:\n    crop_scale_min: 0\n",
     {},
     false,
     {"job.yaml:3: data.augment.crop_scale_min: expected a number in (0, 1], got '0'"}},
    {"crop_scale_min above 1",
     "",
     {"data.augment.crop_scale_min=1.5"},
     false,
     {"data.augment.crop_scale_min: expected a number in (0, 1], got '1.5'"}},
    {"num_workers 0",
     "data:\n  num_workers: 0\n",
     {},
     false,
     {"job.yaml:2: data.num_workers: expected auto or", "got '0'"}},
    {"num_workers too many",
     "data:\n  num_workers: 1000\n",
     {},
     false,
     {"job.yaml:2: data.num_workers: expected auto or an integer in [1, 256], got '1000'"}},
    {"prefetch_batches 0",
     "data:\n  prefetch_batches: 0\n",
     {},
     false,
     {"job.yaml:2: data.prefetch_batches: expected an integer in [1, 64], got '0'"}},
    {"epochs 0",
     "train:\n  epochs: 0\n",
     {},
     false,
     {"job.yaml:2: train.epochs: expected an integer in [1, 1000000], got '0'"}},
    {"batch 0",
     "train:\n  per_replica_batch_size: 0\n",
     {},
     false,
     {"job.yaml:2: train.per_replica_batch_size: expected an integer in [1, 4096], got '0'"}},
    {"learning_rate negative",
     "",
     {"train.optimizer.learning_rate=-1e-3"},
     false,
     {"train.optimizer.learning_rate: expected a non-negative number, got '-0.001'"}},
    {"momentum 1",
     "train:\n  optimizer:\n    momentum: 1\n",
     {},
     false,
     {"job.yaml:3: train.optimizer.momentum: expected a number in [0, 1), got '1'"}},
    {"weight_decay negative",
     "train:\n  optimizer:\n    weight_decay: -0.1\n",
     {},
     false,
     {"job.yaml:3: train.optimizer.weight_decay: expected a non-negative number, got '-0.1'"}},
    {"nesterov with adam",
     "train:\n  optimizer:\n    nesterov: true\n",
     {},
     false,
     {"job.yaml:3: train.optimizer.nesterov: true requires name sgd with momentum > 0",
      "got name 'adam'"}},
    {"nesterov without momentum",
     "train:\n  optimizer:\n    name: sgd\n    momentum: 0\n    nesterov: true\n",
     {},
     false,
     {"job.yaml:5: train.optimizer.nesterov:", "momentum 0"}},
    {"warmup negative",
     "train:\n  lr_schedule:\n    warmup_epochs: -1\n",
     {},
     false,
     {"job.yaml:3: train.lr_schedule.warmup_epochs: expected a non-negative number, got '-1'"}},
    {"warmup not below epochs",
     "train:\n  epochs: 5\n  lr_schedule:\n    warmup_epochs: 5\n",
     {},
     false,
     {"job.yaml:4: train.lr_schedule.warmup_epochs: expected a number less than train.epochs "
      "(5), got '5'"}},
    {"step_epochs 0",
     "train:\n  lr_schedule:\n    step_epochs: 0\n",
     {},
     false,
     {"job.yaml:3: train.lr_schedule.step_epochs: expected a positive integer, got '0'"}},
    {"gamma 0",
     "train:\n  lr_schedule:\n    gamma: 0\n",
     {},
     false,
     {"job.yaml:3: train.lr_schedule.gamma: expected a number in (0, 1], got '0'"}},
    {"gamma above 1",
     "",
     {"train.lr_schedule.gamma=2"},
     false,
     {"--set 'train.lr_schedule.gamma=2': train.lr_schedule.gamma: expected a number in (0, 1], "
      "got '2'"}},
    {"min_lr negative",
     "train:\n  lr_schedule:\n    min_lr: -1\n",
     {},
     false,
     {"job.yaml:3: train.lr_schedule.min_lr: expected a non-negative number, got '-1'"}},
    {"label_smoothing 1",
     "train:\n  label_smoothing: 1\n",
     {},
     false,
     {"job.yaml:2: train.label_smoothing: expected a number in [0, 1), got '1'"}},
    {"threads negative",
     "train:\n  threads: -2\n",
     {},
     false,
     {"job.yaml:2: train.threads: expected an integer in [0, 1024], got '-2'"}},
    {"max_steps negative",
     "train:\n  max_steps: -1\n",
     {},
     false,
     {"job.yaml:2: train.max_steps: expected a non-negative integer, got '-1'"}},
    {"checkpoint every 0",
     "checkpoint:\n  every_epochs: 0\n",
     {},
     false,
     {"job.yaml:2: checkpoint.every_epochs: expected a positive integer, got '0'"}},
    {"keep 0",
     "checkpoint:\n  keep: 0\n",
     {},
     false,
     {"job.yaml:2: checkpoint.keep: expected a positive integer, got '0'"}},
    {"log every 0",
     "logging:\n  every_steps: 0\n",
     {},
     false,
     {"job.yaml:2: logging.every_steps: expected a positive integer, got '0'"}},
    {"duplicate class",
     "data:\n  class_names: [cat, dog, cat]\n",
     {},
     false,
     {"job.yaml:2: data.class_names: expected distinct names, got 'cat' twice"}},
    {"empty class",
     "data:\n  class_names: [cat, '']\n",
     {},
     false,
     {"job.yaml:2: data.class_names: expected non-empty names, got '' at index 1"}},
    {"train path missing",
     "",
     {},
     true,
     {"job.yaml: data.train.path: required (class folders, a csv manifest or TFRecord files)"}},
    {"train path missing, section present",
     "data:\n  train:\n    format: csv\n",
     {},
     true,
     {"data.train.path: required"}},

    // --- type errors ----------------------------------------------------------------------------
    {"string for int",
     "train:\n  epochs: five\n",
     {},
     false,
     {"job.yaml:2: train.epochs: expected an integer in [1, 1000000], got 'five'"}},
    {"fraction for int",
     "train:\n  epochs: 2.5\n",
     {},
     false,
     {"job.yaml:2: train.epochs: expected an integer in [1, 1000000], got '2.5'"}},
    {"int overflow",
     "train:\n  epochs: 99999999999\n",
     {},
     false,
     {"job.yaml:2: train.epochs: expected an integer in [1, 1000000], got '99999999999'"}},
    {"int64 overflow",
     "train:\n  seed: 99999999999999999999\n",
     {},
     false,
     {"job.yaml:2: train.seed: expected an integer, got '99999999999999999999'"}},
    {"list for int",
     "train:\n  epochs: [1, 2]\n",
     {},
     false,
     {"job.yaml:2: train.epochs: expected an integer in [1, 1000000], got a list"}},
    {"map for int",
     "train:\n  epochs: {n: 1}\n",
     {},
     false,
     {"job.yaml:2: train.epochs: expected an integer in [1, 1000000], got a mapping"}},
    {"null for int",
     "train:\n  epochs:\n",
     {},
     false,
     {"job.yaml:2: train.epochs: expected an integer in [1, 1000000], got null"}},
    {"word for number",
     "train:\n  optimizer:\n    learning_rate: fast\n",
     {},
     false,
     {"job.yaml:3: train.optimizer.learning_rate: expected a non-negative number, got 'fast'"}},
    {"infinity for number",
     "train:\n  optimizer:\n    learning_rate: .inf\n",
     {},
     false,
     {"job.yaml:3: train.optimizer.learning_rate: expected a non-negative number, got '.inf'"}},
    {"word for bool",
     "data:\n  shuffle: maybe\n",
     {},
     false,
     {"job.yaml:2: data.shuffle: expected true or false, got 'maybe'"}},
    {"map for string",
     "model:\n  pretrained: {path: x}\n",
     {},
     false,
     {"job.yaml:2: model.pretrained: expected a string, got a mapping"}},
    {"scalar for list",
     "data:\n  class_names: cat\n",
     {},
     false,
     {"job.yaml:2: data.class_names: expected a list of strings, got 'cat'"}},
    {"nested list in list",
     "data:\n  class_names: [a, [b]]\n",
     {},
     false,
     {"job.yaml:2: data.class_names[1]: expected a string, got a list"}},
    {"scalar for section",
     "data: 5\n",
     {},
     true,
     {"job.yaml:1: data: expected a mapping of fields (train, validation, class_names,",
      "got '5'"}},
    {"scalar for source",
     "data:\n  train: /d\n",
     {},
     true,
     {"job.yaml:2: data.train: expected a mapping of fields (format, path,", "got '/d'"}},
    {"scalar for section in override",
     "",
     {"train.optimizer=sgd"},
     false,
     {"--set 'train.optimizer=sgd': train.optimizer: expected a mapping of fields"}},
    {"list at the top",
     "- model\n- data\n",
     {},
     true,
     {"job.yaml:1: expected a mapping of sections (model, data, train, checkpoint, distributed, "
      "logging, export)",
      "got a list"}},
    {"scalar at the top", "hello\n", {}, true, {"job.yaml:1: expected a mapping", "got 'hello'"}},
    {"two documents",
     "model: {}\n---\ndata: {}\n",
     {},
     true,
     {"job.yaml: expected one YAML document, got more"}},
    {"list as a key", "? [a, b]\n: 1\n", {}, true, {"job.yaml:1:", "expected field names"}},

    // --- malformed YAML -----------------------------------------------------------------------
    {"unclosed flow list",
     "train:\n  epochs: 1\n  seed: [1, 2\n  threads: 3\n",
     {},
     false,
     {"job.yaml:4: malformed YAML"}},
    {"bad indentation",
     "train:\n  epochs: 1\n   seed: 2\n",
     {},
     false,
     {"job.yaml:3: malformed YAML"}},
    {"tab indentation",
     "train:\n  epochs: 1\n\tseed: 2\n",
     {},
     false,
     {"job.yaml:3: malformed YAML"}},

    // --- malformed overrides --------------------------------------------------------------------
    {"override without =", "", {"xyz"}, false, {"--set 'xyz': expected field=value"}},
    {"override with empty key", "", {"=3"}, false, {"--set '=3': expected field=value"}},
    {"override with empty part",
     "",
     {"train..epochs=3"},
     false,
     {"--set 'train..epochs=3': expected a dotted field name"}},
    {"override with trailing dot", "", {"train.=3"}, false, {"--set 'train.=3'"}},
    {"override with malformed value",
     "",
     {"data.class_names=[a, b"},
     false,
     {"--set 'data.class_names=[a, b': malformed value"}},
    {"override with bad type",
     "",
     {"train.epochs=five"},
     false,
     {"--set 'train.epochs=five': train.epochs: expected an integer in [1, 1000000], got 'five'"}},
    {"bad class weight",
     "train:\n  class_weights: [1, -2, 1]\n",
     {},
     false,
     {"job.yaml:2: train.class_weights: expected none, balanced or a list of numbers in [0, 1e6], "
      "got '-2' at index 1"}},
    {"all-zero class weights",
     "train:\n  class_weights: [0, 0]\n",
     {},
     false,
     {"train.class_weights: expected at least one weight above 0"}},
    {"unknown class weighting",
     "",
     {"train.class_weights=inverse"},
     false,
     {"train.class_weights: expected none, balanced or a list of numbers in [0, 1e6], got "
      "'inverse'"}},
    {"bad norm weight decay",
     "train:\n  optimizer:\n    norm_weight_decay: lots\n",
     {},
     false,
     {"train.optimizer.norm_weight_decay: expected a number >= 0 or \"\" (= weight_decay), got "
      "'lots'"}},
    {"magnitude without a policy that has one",
     "data:\n  augment:\n    policy: trivial_augment_wide\n    magnitude: 5\n",
     {},
     false,
     {"data.augment.magnitude: only rand_augment and augmix have a magnitude, got policy "
      "'trivial_augment_wide'"}},
    {"augmix severity above 10",
     "data:\n  augment:\n    policy: augmix\n    magnitude: 12\n",
     {},
     false,
     {"data.augment.magnitude: augmix severity: expected 1..10"}},
    {"bad policy",
     "data:\n  augment:\n    policy: autoaugment\n",
     {},
     false,
     {"data.augment.policy: expected one of "
      "none|trivial_augment_wide|rand_augment|auto_augment|augmix, got 'autoaugment'"}},
    {"hue above 0.5",
     "",
     {"data.augment.color_jitter.hue=0.6"},
     false,
     {"data.augment.color_jitter.hue: expected a number in [0, 0.5], got '0.6'"}},
    {"eval resize below the crop",
     "data:\n  eval_resize: shorter_side\n  eval_resize_size: 200\n  eval_crop_size: 224\n",
     {},
     false,
     {"data.eval_resize_size: expected at least the evaluation crop (224), got '200'"}},
    {"keep_best without validation",
     "checkpoint:\n  keep_best: val_accuracy\n",
     {},
     false,
     {"checkpoint.keep_best: needs validation data (data.validation.path or "
      "data.validation_split), got 'val_accuracy'"}},
    {"plateau without validation",
     "train:\n  lr_schedule:\n    name: plateau\n",
     {},
     false,
     {"train.lr_schedule.name: plateau needs validation data (data.validation.path or "
      "data.validation_split)"}},
    {"early stopping without validation",
     "",
     {"train.early_stopping.patience=3"},
     false,
     {"train.early_stopping.patience: needs validation data (data.validation.path or "
      "data.validation_split), got '3'"}},
    {"validation path and split both set",
     "data:\n  validation:\n    path: v\n  validation_split: 0.2\n",
     {},
     false,
     {"data.validation_split: set either data.validation.path or data.validation_split, not both"}},
    {"validation split above 0.9",
     "",
     {"data.validation_split=0.95"},
     false,
     {"data.validation_split: expected a number in [0, 0.9], got '0.95'"}},
    {"bad loss",
     "train:\n  loss: hinge\n",
     {},
     false,
     {"job.yaml:2: train.loss: expected one of cross_entropy|focal|bi_tempered, got 'hinge'"}},
    {"override below a scalar",
     "",
     {"data.train.path.x=1"},
     false,
     {"--set 'data.train.path.x=1': cannot set a field inside 'data.train.path'"}},
    {"override overrides the file's good value",
     "train:\n  epochs: 3\n",
     {"train.epochs=0"},
     false,
     {"--set 'train.epochs=0': train.epochs: expected an integer in [1, 1000000], got '0'"}},
};

}  // namespace

TEST_CASE("invalid job specs name the place and the field", "[config]") {
  for (const Bad& c : kBad) {
    std::vector<std::string> overrides = c.overrides;
    if (!c.bare) overrides.insert(overrides.begin(), kTrainPath);
    const std::string message = error_of(c.yaml, overrides);
    INFO("case: " << c.name << "\nyaml:\n" << c.yaml << "message: " << message);
    for (const auto& part : c.expect) CHECK_THAT(message, Contains(part));
  }
}

TEST_CASE("no hint when no field name is close", "[config]") {
  const std::string message = error_of("data:\n  augment:\n    flip: true\n", {kTrainPath});
  CHECK_THAT(message, Contains("unknown field 'data.augment.flip'"));
  CHECK_THAT(message, !Contains("did you mean"));
  CHECK_THAT(error_of("zzzzzz: 1\n", {kTrainPath}), !Contains("did you mean"));
}

TEST_CASE("errors are ConfigError (exit code of a config problem)", "[config]") {
  try {
    parse_job_spec("model: {arch: vgg}\n", {kTrainPath}, "job.yaml");
    FAIL("no error");
  } catch (const trainer::Error& e) {
    CHECK(e.kind() == trainer::ErrorKind::kConfig);
  }
}

namespace {

struct Good {
  const char* name;
  std::string yaml;
  std::vector<std::string> overrides;
  std::vector<std::pair<std::string, std::string>> expect;  // field -> canonical text
};

const std::vector<Good> kGood = {
    {"only the train path",
     "data:\n  train:\n    path: /data/cassava/train\n",
     {},
     {{"data.train.path", "/data/cassava/train"}, {"model.arch", "resnet50"}}},
    {"comments only, path by override",
     "# nothing here\n",
     {kTrainPath},
     {{"data.train.path", "/d"}}},
    {"sections left empty",
     "model:\ndata:\n  train:\n    path: /d\n  augment:\nlogging: ~\n",
     {},
     {{"model.arch", "resnet50"}, {"data.augment.crop_scale_min", "0.08"}}},
    {"auto threads and decode threads, auto precision, micro-batches",
     "data:\n  num_workers: auto\ntrain:\n  precision: auto\n  per_replica_batch_size: 64\n"
     "  micro_batch_size: 16\n",
     {kTrainPath},
     {{"data.num_workers", "auto"},
      {"train.precision", "auto"},
      {"train.micro_batch_size", "16"},
      {"train.threads", "0"}}},
    {"micro-batches off by default",
     "",
     {kTrainPath},
     {{"train.micro_batch_size", "off"}, {"data.num_workers", "auto"}}},
    {"num_classes auto",
     "model:\n  num_classes: auto\n",
     {kTrainPath},
     {{"model.num_classes", "auto"}}},
    {"num_classes quoted auto",
     "model:\n  num_classes: \"auto\"\n",
     {kTrainPath},
     {{"model.num_classes", "auto"}}},
    {"num_classes number",
     "model:\n  num_classes: 10\n",
     {kTrainPath},
     {{"model.num_classes", "10"}}},
    {"num_classes by override",
     "model:\n  num_classes: 10\n",
     {kTrainPath, "model.num_classes=auto"},
     {{"model.num_classes", "auto"}}},
    {"a csv source",
     "data:\n  train:\n    format: csv\n    path: m.csv\n    image_column: file\n"
     "    label_column: y\n    image_root: imgs\n",
     {},
     {{"data.train.format", "csv"},
      {"data.train.path", "m.csv"},
      {"data.train.image_column", "file"},
      {"data.train.label_column", "y"},
      {"data.train.image_root", "imgs"}}},
    {"number spellings",
     "train:\n  optimizer:\n    learning_rate: 1e-3\n    momentum: .5\n"
     "    weight_decay: 1\n  label_smoothing: +0.1\n",
     {kTrainPath},
     {{"train.optimizer.learning_rate", "0.001"},
      {"train.optimizer.momentum", "0.5"},
      {"train.optimizer.weight_decay", "1"},
      {"train.label_smoothing", "0.1"}}},
    {"quoted number for int", "train:\n  epochs: \"7\"\n", {kTrainPath}, {{"train.epochs", "7"}}},
    {"bool spellings",
     "data:\n  shuffle: no\n  augment:\n    horizontal_flip: True\n",
     {kTrainPath},
     {{"data.shuffle", "false"}, {"data.augment.horizontal_flip", "true"}}},
    {"int64 seeds",
     "data:\n  seed: -5\ntrain:\n  seed: 9000000000\n  max_steps: 100\n",
     {kTrainPath},
     {{"data.seed", "-5"}, {"train.seed", "9000000000"}, {"train.max_steps", "100"}}},
    {"nesterov with sgd",
     "train:\n  optimizer: {name: sgd, momentum: 0.9, nesterov: true}\n",
     {kTrainPath},
     {{"train.optimizer.nesterov", "true"}}},
    {"class names",
     "data:\n  class_names: [cbb, cbsd, cgm, cmd, healthy]\n",
     {kTrainPath},
     {{"data.class_names", "[cbb, cbsd, cgm, cmd, healthy]"}}},
    {"string field given a null is empty",
     "model:\n  pretrained: ~\n",
     {kTrainPath},
     {{"model.pretrained", ""}}},
    {"overrides create the nested maps",
     "",
     {"data.train.path=/x", "data.augment.horizontal_flip=true", "train.optimizer.name=sgd",
      "train.lr_schedule.name=cosine"},
     {{"data.train.path", "/x"},
      {"data.augment.horizontal_flip", "true"},
      {"train.optimizer.name", "sgd"},
      {"train.lr_schedule.name", "cosine"}}},
    {"overrides fill a section that was left empty",
     "data:\n  augment:\n",
     {kTrainPath, "data.augment.random_resized_crop=true"},
     {{"data.augment.random_resized_crop", "true"}}},
    {"override beats the file, later beats earlier",
     "train:\n  epochs: 3\n",
     {kTrainPath, "train.epochs=4", "train.epochs=6"},
     {{"train.epochs", "6"}}},
    {"override parsed as YAML",
     "",
     {kTrainPath, "data.class_names=[a,b]", "train.epochs= 3"},
     {{"data.class_names", "[a, b]"}, {"train.epochs", "3"}}},
    {"empty override value is the empty string",
     "model:\n  pretrained: /w.safetensors\n",
     {kTrainPath, "model.pretrained="},
     {{"model.pretrained", ""}}},
    {"override with a mapping value",
     "",
     {kTrainPath, "train.optimizer={name: sgd, momentum: 0.5}"},
     {{"train.optimizer.name", "sgd"}, {"train.optimizer.momentum", "0.5"}}},
    {"override with spaces around the key",
     "",
     {kTrainPath, " train.epochs =2"},
     {{"train.epochs", "2"}}},
    {"override keeps the rest of the file",
     "train:\n  epochs: 3\n  seed: 7\n",
     {kTrainPath, "train.epochs=9"},
     {{"train.epochs", "9"}, {"train.seed", "7"}}},
    {"device cuda:N names one GPU",
     "train:\n  device: cuda:1\n",
     {kTrainPath},
     {{"train.device", "cuda:1"}}},
    {"device cuda:0", "", {kTrainPath, "train.device=cuda:0"}, {{"train.device", "cuda:0"}}},
};

}  // namespace

TEST_CASE("valid job specs and overrides", "[config]") {
  for (const Good& c : kGood) {
    INFO("case: " << c.name << "\nyaml:\n" << c.yaml);
    JobSpec s;
    REQUIRE_NOTHROW(s = parse_job_spec(c.yaml, c.overrides, "job.yaml"));
    for (const auto& [path, value] : c.expect) {
      INFO("field " << path);
      CHECK(field(s, path) == value);
    }
  }
}

TEST_CASE("an empty document gives every default", "[config]") {
  const JobSpec parsed = parse_job_spec("", {kTrainPath}, "job.yaml");
  JobSpec expected;
  expected.data.train.path = {"/d"};
  CHECK(flatten(parsed) == flatten(expected));
  CHECK(parsed.model.num_classes == 0);
  CHECK(parsed.train.optimizer.learning_rate == 1e-4);
  CHECK(parsed.data.class_names.empty());
  CHECK_FALSE(parsed.data.validation.enabled());
}

TEST_CASE("typed values land in the struct", "[config]") {
  const JobSpec s = parse_job_spec(
      "model:\n  arch: resnet18\n  num_classes: 5\n  head_hidden: 256\n"
      "data:\n  train: {path: tr}\n  validation: {path: va}\n  class_names: [a, b]\n"
      "train:\n  optimizer: {learning_rate: 0.003}\n",
      {}, "job.yaml");
  CHECK(s.model.arch == "resnet18");
  CHECK(s.model.num_classes == 5);
  CHECK(s.model.head_hidden == 256);
  CHECK(s.data.train.path == std::vector<std::string>{"tr"});
  CHECK(s.data.validation.enabled());
  CHECK(s.data.class_names == std::vector<std::string>{"a", "b"});
  CHECK(s.train.optimizer.learning_rate == 0.003);
}

TEST_CASE("validate_job_spec checks specs built in code", "[config]") {
  JobSpec s;
  s.data.train.path = {"/d"};
  CHECK_NOTHROW(trainer::config::validate_job_spec(s, "test"));
  s.train.optimizer.momentum = 1.5;
  CHECK_THROWS_WITH(trainer::config::validate_job_spec(s, "test"),
                    Contains("test: train.optimizer.momentum: expected a number in [0, 1), got "
                             "'1.5'"));
  s.train.optimizer.momentum = 0.9;
  s.train.optimizer.learning_rate = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(trainer::config::validate_job_spec(s, "test"),
                    Contains("train.optimizer.learning_rate: expected a non-negative number"));
}

TEST_CASE("the first problem in declaration order is reported", "[config]") {
  // model.arch comes before train.epochs
  CHECK_THAT(error_of("train:\n  epochs: 0\nmodel:\n  arch: x\n", {kTrainPath}),
             Contains("model.arch"));
}

TEST_CASE("load_job_spec reads a file and names it in errors", "[config]") {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("trainer_config_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path good = dir / "good.yaml";
  const fs::path bad = dir / "bad.yaml";
  std::ofstream(good) << "data:\n  train:\n    path: /d\ntrain:\n  epochs: 2\n";
  std::ofstream(bad) << "data:\n  train:\n    path: /d\ntrain:\n  epochs: zero\n";

  const JobSpec s = trainer::config::load_job_spec(good.string(), {"train.seed=3"});
  CHECK(s.train.epochs == 2);
  CHECK(s.train.seed == 3);
  CHECK_THROWS_WITH(
      trainer::config::load_job_spec(bad.string(), {}),
      Contains(bad.string() + ":5: train.epochs: expected an integer in [1, 1000000]"));
  CHECK_THROWS_AS(trainer::config::load_job_spec((dir / "missing.yaml").string(), {}), ConfigError);
  CHECK_THROWS_WITH(trainer::config::load_job_spec((dir / "missing.yaml").string(), {}),
                    Contains("missing.yaml"));
  CHECK_THROWS_WITH(trainer::config::load_job_spec(dir.string(), {}), Contains(dir.string()));
  CHECK(trainer::config::load_job_spec("", {kTrainPath}).data.train.path ==
        std::vector<std::string>{"/d"});
  CHECK_THROWS_WITH(trainer::config::load_job_spec("", {}), Contains("data.train.path: required"));
  fs::remove_all(dir);
}

TEST_CASE("tfrecord sources: path as a string or a list, split, keys", "[config]") {
  const JobSpec s = parse_job_spec(
      "data:\n  train:\n    format: tfrecord\n    path: [a/*.tfrec, b.tfrec]\n"
      "    label_key: target\n  validation: {format: tfrecord, path: tfds, split: test}\n",
      {}, "job.yaml");
  CHECK(s.data.train.path == std::vector<std::string>{"a/*.tfrec", "b.tfrec"});
  CHECK(s.data.train.label_key == "target");
  CHECK(s.data.train.image_key == "image");
  CHECK(s.data.validation.path == std::vector<std::string>{"tfds"});
  CHECK(s.data.validation.split == "test");
  CHECK(s.data.interleave == 4);
  CHECK(s.data.shuffle_buffer == 1000);
  CHECK(s.data.cache == "none");
  // One path is written back as a plain string, a list as a flow list.
  CHECK_THAT(trainer::config::to_yaml(s), Contains("    path: [a/*.tfrec, b.tfrec]"));
  CHECK_THAT(trainer::config::to_yaml(s), Contains("    path: tfds"));
  CHECK(trainer::config::to_json(s)["data"]["validation"]["path"] == "tfds");
  CHECK_THROWS_WITH(
      parse_job_spec("data:\n  train: {path: [a, b]}\n", {}, "job.yaml"),
      Contains("data.train.path: a list of paths needs format tfrecord, got format 'imagefolder'"));
  CHECK_THROWS_WITH(
      parse_job_spec("data:\n  train: {format: tfrecord, path: d, split: dev}\n", {}, "job.yaml"),
      Contains("data.train.split: expected one of train|validation|test"));
  CHECK_THROWS_WITH(parse_job_spec("data:\n  train: {path: {a: 1}}\n", {}, "job.yaml"),
                    Contains("data.train.path: expected a string or a list of strings"));
  CHECK_THROWS_WITH(parse_job_spec("data:\n  train: {path: d}\n  cache: disk\n", {}, "job.yaml"),
                    Contains("data.cache: expected one of none|memory, got 'disk'"));
  // --set with a flow list or an empty value (no validation source).
  const JobSpec o = parse_job_spec(
      "",
      {"data.train.format=tfrecord", "data.train.path=[x.tfrec, y.tfrec]", "data.validation.path="},
      "job.yaml");
  CHECK(o.data.train.path.size() == 2);
  CHECK_FALSE(o.data.validation.enabled());
}

TEST_CASE("text yaml-cpp cannot take is refused before it sees it (fuzzing regressions)",
          "[config]") {
  // Found by fuzz_job_spec: yaml-cpp 0.7 allocated until the process was killed on this input.
  const std::string hang = std::string(10, '\xf2') + "arch:\x1frv, 2t36\n";
  CHECK_THAT(error_of(hang, {}), Contains("job.yaml: line 1 (byte 0): not valid UTF-8"));
  CHECK_THAT(error_of("model:\n  arch: resnet18\x1f\n", {}),
             Contains("line 2") && Contains("control character U+001F"));
  CHECK_THAT(error_of("", {"model.arch=\xc3"}), Contains("not valid UTF-8"));
  CHECK_THAT(error_of(std::string((1 << 20) + 1, ' '), {}),
             Contains("more than a job spec may have"));
  // UTF-8 text and a byte-order mark are fine.
  CHECK_NOTHROW(parse_job_spec("\xef\xbb\xbf# caf\xc3\xa9 \xe2\x9c\x93\nmodel: {arch: resnet18}\n",
                               {kTrainPath}, "job.yaml"));
}

TEST_CASE(
    "a stray ',' where a document starts is malformed YAML, not an endless parse "
    "(fuzzing regression)",
    "[config]") {
  // Found by fuzz_job_spec: yaml-cpp 0.7's LoadAll() added empty documents for ever.
  for (const std::string text : {",", " ,", "# comment\n,", ", a"}) {
    INFO(text);
    CHECK_THAT(error_of(text, {}), Contains("malformed YAML: unexpected ','"));
  }
  CHECK_THAT(error_of("a: 1\n---\nb: 2\n", {}), Contains("expected one YAML document"));
}
