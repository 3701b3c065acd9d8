// trainer: the command-line entry point. Parses argv with CLI11 into one options struct per
// subcommand and calls its run_x(); the one place that maps error kinds to exit codes.
// `train` is the default subcommand, so `trainer --config F --epochs 5 --job-dir D` works as in
// the TensorFlow multi-worker tutorial.
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "trainer/config/job_spec.h"
#include "trainer/job/commands.h"
#include "trainer/launch/supervisor.h"
#include "trainer/loop/runtime.h"
#include "trainer/util/error.h"
#include "trainer/util/log.h"
#include "trainer/util/memory.h"
#include "trainer/util/open_files.h"
#include "trainer/util/signals.h"

namespace {

using namespace trainer;

const std::set<std::string> kSubcommands = {"train",    "make-dataset", "predict",
                                            "evaluate", "inspect",      "launch",
                                            "convert",  "export",       "preview"};

void add_set_option(CLI::App* cmd, std::vector<std::string>* overrides) {
  cmd->add_option("--set", *overrides,
                  "Override a job-spec field, e.g. --set data.image_size=128 (repeatable)")
      ->type_name("KEY.PATH=VALUE")
      ->expected(1)
      ->take_all();
}

void add_cluster_option(CLI::App* cmd, std::string* source) {
  cmd->add_option("--cluster", *source,
                  "Where this task's role comes from: auto (TF_CONFIG, else torchrun's RANK/"
                  "WORLD_SIZE/MASTER_ADDR/MASTER_PORT), tf_config, slurm (srun's variables), "
                  "torchrun; sets distributed.cluster")
      ->check(CLI::IsMember({"auto", "tf_config", "slurm", "torchrun"}));
}

int run(int argc, char** argv) {
  CLI::App app{
      "trainer: synchronous data-parallel training of image classifiers (ResNet)\n"
      "The same binary runs on every node; TF_CONFIG tells each process its role.",
      "trainer"};
  app.set_version_flag("--version", [] { return train::version_report(TRAINER_VERSION); });
  app.require_subcommand(1);

  train::TrainOptions train_opts;
  auto* train_cmd = app.add_subcommand("train", "Train a model (the default subcommand)");
  train_cmd->add_option("--config", train_opts.config, "YAML job spec")->check(CLI::ExistingFile);
  train_cmd->add_option("--job-dir", train_opts.job_dir, "Job directory (outputs, checkpoints)")
      ->required();
  train_cmd->add_option("--epochs", train_opts.epochs, "Override train.epochs")
      ->check(CLI::PositiveNumber);
  add_set_option(train_cmd, &train_opts.overrides);
  std::string train_cluster;
  add_cluster_option(train_cmd, &train_cluster);
  train_cmd->add_flag("--overwrite", train_opts.overwrite,
                      "Discard a different job's outputs in --job-dir instead of refusing");
  train_cmd->footer("Job-spec fields (defaults):\n" + config::field_reference());

  train::MakeDatasetOptions make_opts;
  std::string splits = "train,validation";
  auto* make_cmd = app.add_subcommand(
      "make-dataset",
      "Write a synthetic, learnable Cassava-like dataset (ImageFolder JPEGs or TFRecord shards)");
  make_cmd->add_option("--out", make_opts.out_dir, "Output directory")->required();
  make_cmd->add_option("--classes", make_opts.classes, "Number of classes")->capture_default_str();
  make_cmd
      ->add_option("--per-class", make_opts.per_class,
                   "Images per class in the first split (later splits: a quarter)")
      ->capture_default_str();
  make_cmd->add_option("--image-size", make_opts.image_size, "Image side in pixels")
      ->capture_default_str();
  make_cmd->add_option("--seed", make_opts.seed, "Random seed")->capture_default_str();
  make_cmd->add_option("--splits", splits, "Comma-separated split names")->capture_default_str();
  make_cmd->add_option("--image-height", make_opts.image_height, "Image height (0 = square)")
      ->capture_default_str();
  make_cmd->add_option("--format", make_opts.format, "jpeg (ImageFolder) or tfrecord")
      ->capture_default_str();
  make_cmd->add_option("--shards", make_opts.shards, "tfrecord: record files per split")
      ->capture_default_str();
  make_cmd->add_flag("--tfds", make_opts.tfds,
                     "tfrecord: write a TFDS dataset directory (dataset_info.json, "
                     "label.labels.txt, <name>-<split>.tfrecord-NNNNN-of-MMMMM)");
  make_cmd->add_option("--name", make_opts.name, "tfds: dataset name")->capture_default_str();
  make_cmd->add_option("--image-key", make_opts.image_key, "tfrecord: image feature")
      ->capture_default_str();
  make_cmd
      ->add_option("--label-key", make_opts.label_key, "tfrecord: label feature (Kaggle: target)")
      ->capture_default_str();
  make_cmd->add_option("--compression", make_opts.compression, "tfrecord: none or gzip")
      ->capture_default_str();

  train::PredictOptions predict_opts;
  auto* predict_cmd = app.add_subcommand(
      "predict", "Classify images with an exported model (JSON lines, or a Kaggle-style CSV)");
  predict_cmd->add_option("--model", predict_opts.model_dir, "MODEL_DIR (JOB_DIR/model)")
      ->required();
  predict_cmd->add_option("--threads", predict_opts.threads, "Intra-op threads (0 = all cores)");
  predict_cmd
      ->add_option("--batch-size", predict_opts.batch_size,
                   "Images per forward pass (0 = the model's training batch)")
      ->check(CLI::NonNegativeNumber);
  predict_cmd
      ->add_option("--format", predict_opts.format,
                   "jsonl (path, label, index, probabilities) or csv (Kaggle's image_id,label); "
                   "default: csv when --out ends in .csv, else jsonl")
      ->check(CLI::IsMember({"jsonl", "csv"}));
  predict_cmd->add_option("--out", predict_opts.out,
                          "Write the predictions to this file (atomically, at the end) instead "
                          "of standard output");
  predict_cmd->add_flag("--overwrite", predict_opts.overwrite, "Replace --out if it exists");
  predict_cmd->add_option("--image-column", predict_opts.image_column,
                          "CSV manifests: the column of image paths (default: image_id, image, "
                          "path, filename or file, else the first)");
  predict_cmd->add_option("--image-root", predict_opts.image_root,
                          "CSV manifests: the directory image paths are relative to (default: "
                          "the manifest's)");
  predict_cmd
      ->add_option("--tta", predict_opts.tta,
                   "Test-time augmentation: none, flip (the image and its mirror) or dihedral "
                   "(its 8 flips and rotations by 90 degrees); the softmax averaged over them")
      ->check(CLI::IsMember({"none", "flip", "dihedral"}))
      ->capture_default_str();
  predict_cmd
      ->add_option("images", predict_opts.images,
                   "Images, directories (searched recursively), globs, or .csv manifests")
      ->required();
  predict_cmd->footer(
      "Example: trainer predict --model JOB_DIR/model --out submission.csv test_images/\n"
      "GIFs are not read (as torchvision's ImageFolder; OpenCV 4.6 cannot decode them).");

  train::ExportOptions export_opts;
  auto* export_cmd = app.add_subcommand(
      "export", "Write an exported model as an ONNX file for a serving stack (checked first)");
  export_cmd->add_option("--model", export_opts.model_dir, "MODEL_DIR (JOB_DIR/model)")->required();
  export_cmd->add_option("--format", export_opts.format, "onnx")
      ->check(CLI::IsMember({"onnx"}))
      ->capture_default_str();
  export_cmd->add_option("--out", export_opts.out, "The .onnx file to write")->required();
  export_cmd->add_flag("--overwrite", export_opts.overwrite, "Replace --out if it exists");
  export_cmd->add_flag("--include-preprocessing", export_opts.include_preprocessing,
                       "Input uint8 [batch, S, S, 3] RGB at the model's size; x / 255 and the "
                       "normalisation run inside the graph");
  export_cmd->add_option("--opset", export_opts.opset, "ONNX opset (13 to 17)")
      ->check(CLI::Range(13, 17))
      ->capture_default_str();
  export_cmd->footer(
      "Example: trainer export --model JOB_DIR/model --format onnx --out model.onnx\n"
      "Input 'input' [batch, 3, S, S] float32 (or 'image' with --include-preprocessing);\n"
      "outputs 'logits' and 'probabilities'; the preprocessing contract and class names are\n"
      "in the file's metadata_props (and in model.json's preprocessing).");

  train::EvaluateOptions eval_opts;
  auto* eval_cmd = app.add_subcommand(
      "evaluate", "Evaluate an exported model on a source of the config's data (JSON)");
  eval_cmd->add_option("--model", eval_opts.model_dir, "MODEL_DIR (JOB_DIR/model)")->required();
  eval_cmd->add_option("--config", eval_opts.config, "YAML job spec")
      ->required()
      ->check(CLI::ExistingFile);
  eval_cmd->add_option("--split", eval_opts.split, "validation | train")
      ->check(CLI::IsMember({"validation", "train"}))
      ->capture_default_str();
  eval_cmd
      ->add_option("--tta", eval_opts.tta,
                   "Test-time augmentation: none, flip or dihedral (as predict's); the loss and "
                   "accuracy of the softmax averaged over the views")
      ->check(CLI::IsMember({"none", "flip", "dihedral"}))
      ->capture_default_str();
  add_set_option(eval_cmd, &eval_opts.overrides);

  train::InspectOptions inspect_opts;
  auto* inspect_cmd = app.add_subcommand(
      "inspect", "Dry run: print the resolved job, this process's role and the data plan (JSON)");
  inspect_cmd->add_option("--config", inspect_opts.config, "YAML job spec")
      ->check(CLI::ExistingFile);
  inspect_cmd->add_option("--job-dir", inspect_opts.job_dir, "Job directory (reported only)");
  inspect_cmd->add_option("--epochs", inspect_opts.epochs, "Override train.epochs")
      ->check(CLI::PositiveNumber);
  add_set_option(inspect_cmd, &inspect_opts.overrides);
  std::string inspect_cluster;
  add_cluster_option(inspect_cmd, &inspect_cluster);

  train::PreviewOptions preview_opts;
  auto* preview_cmd = app.add_subcommand(
      "preview",
      "Write what the model is fed: a contact sheet, the input and target arrays, and every "
      "augmentation parameter drawn");
  preview_cmd->add_option("--config", preview_opts.config, "YAML job spec")
      ->required()
      ->check(CLI::ExistingFile);
  add_set_option(preview_cmd, &preview_opts.overrides);
  preview_cmd->add_option("--split", preview_opts.split, "train | validation")
      ->check(CLI::IsMember({"train", "validation"}))
      ->capture_default_str();
  preview_cmd->add_option("--count", preview_opts.count, "Examples to show (1..1024)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  preview_cmd->add_option("--epoch", preview_opts.epoch, "The epoch whose order and draws to show")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  preview_cmd->add_option("--out", preview_opts.out, "Output directory")->required();
  preview_cmd->footer(
      "Example: trainer preview --config job.yaml --count 32 --out preview/\n"
      "Writes preview.png, inputs.npy (float32 N x 3 x H x W), targets.npy (float32 N x classes)\n"
      "and examples.jsonl (source, label, augmentation parameters, mixing) for each example.");

  launch::LaunchOptions launch_opts;
  auto* launch_cmd = app.add_subcommand(
      "launch", "Run a local cluster: N processes on 127.0.0.1, each with its own TF_CONFIG");
  launch_cmd->add_option("--workers", launch_opts.workers, "Worker processes (1..64)")
      ->capture_default_str();
  launch_cmd->add_flag("--chief", launch_opts.chief, "Also start a chief task (rank 0)");
  launch_cmd->add_flag("--evaluator", launch_opts.evaluator,
                       "Also start an evaluator task: it evaluates every new checkpoint on the "
                       "validation split into JOB_DIR/eval/metrics.jsonl");
  launch_cmd
      ->add_option("--base-port", launch_opts.base_port,
                   "First port (chief, then workers); 0 = pick free ports")
      ->capture_default_str();
  bool no_pin = false;
  launch_cmd
      ->add_option("--max-restarts", launch_opts.max_restarts,
                   "Restart the whole group up to N times when a process dies or fails with a "
                   "data or distributed error (it resumes from the newest checkpoint)")
      ->check(CLI::Range(0, 1000));
  launch_cmd->add_flag("--no-pin", no_pin,
                       "Do not give each process its own slice of the CPUs (sched_setaffinity)");
  launch_cmd->add_option("train-args", launch_opts.args, "What every process runs, after `--`");
  launch_cmd->positionals_at_end();
  launch_cmd->footer(
      "Example: trainer launch --workers 2 --chief -- --config job.yaml --job-dir DIR\n"
      "Output lines are prefixed [chief], [worker i]; SIGINT/SIGTERM are forwarded; when one\n"
      "process fails the others are stopped and its exit code is returned.");

  train::ConvertOptions convert_opts;
  auto* convert_cmd = app.add_subcommand(
      "convert", "Write a torch.save state dict (.pth, e.g. torchvision's) as .safetensors");
  convert_cmd->add_option("IN", convert_opts.input, "A .pth (torch.save) or .safetensors file")
      ->required();
  convert_cmd->add_option("OUT", convert_opts.output, "The .safetensors file to write")->required();
  convert_cmd->add_flag("--overwrite", convert_opts.overwrite, "Replace OUT if it exists");
  convert_cmd->footer(
      "Example: trainer convert resnet50-11ad3fa6.pth resnet50.safetensors\n"
      "model.pretrained also reads a .pth directly; converting once skips the unpickling and\n"
      "gives a file torchvision's and Hugging Face's safetensors loaders read too.");

  // Every --help ends with the exit codes its command can return (util/error.cpp's exit_code).
  const std::string local_codes =
      "Exit codes: 0 ok; 1 internal error (a bug: please report it); 2 usage or config error; "
      "3 data or I/O error.";
  const std::string training_codes =
      "Exit codes: 0 ok; 1 internal error (a bug: please report it); 2 usage, config or "
      "cluster-spec error; 3 data or I/O error; 4 distributed error (a peer lost, a timeout); "
      "143 stopped by SIGTERM or SIGINT (a checkpoint holds where it stopped).";
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    const bool training = sub->get_name() == "train" || sub->get_name() == "launch";
    const std::string footer = sub->get_footer();
    sub->footer((footer.empty() ? "" : footer + "\n") + (training ? training_codes : local_codes));
  }
  app.footer("Without a subcommand, `train` is assumed: trainer --config job.yaml --job-dir DIR\n" +
             training_codes);

  // `train` is the default subcommand.
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && !kSubcommands.count(args[0]) && args[0] != "--help" && args[0] != "-h" &&
      args[0] != "--version") {
    args.insert(args.begin(), "train");
  }
  std::reverse(args.begin(), args.end());  // CLI11 parses a reversed vector
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return exit_code(ErrorKind::kUsage);
  }

  util::setup_logging("info");
  // --cluster is distributed.cluster, after any --set of it.
  if (!train_cluster.empty())
    train_opts.overrides.push_back("distributed.cluster=" + train_cluster);
  if (!inspect_cluster.empty()) {
    inspect_opts.overrides.push_back("distributed.cluster=" + inspect_cluster);
  }
  if (*train_cmd) return train::run_train(train_opts);
  if (*make_cmd) {
    make_opts.splits.clear();
    for (size_t start = 0; start <= splits.size();) {
      const size_t comma = std::min(splits.find(',', start), splits.size());
      make_opts.splits.push_back(splits.substr(start, comma - start));
      start = comma + 1;
    }
    return train::run_make_dataset(make_opts, std::cout);
  }
  if (*predict_cmd) return train::run_predict(predict_opts, std::cout);
  if (*eval_cmd) return train::run_evaluate(eval_opts, std::cout);
  if (*preview_cmd) return train::run_preview(preview_opts, std::cout);
  if (*inspect_cmd) return train::run_inspect(inspect_opts, std::cout);
  if (*convert_cmd) return train::run_convert(convert_opts, std::cout);
  if (*export_cmd) return train::run_export(export_opts, std::cout);
  if (*launch_cmd) {
    launch_opts.pin_cpus = !no_pin;
    return launch::run_launch(launch_opts);
  }
  return exit_code(ErrorKind::kUsage);
}

}  // namespace

int main(int argc, char** argv) {
  trainer::util::configure_allocator();    // before any large allocation
  trainer::util::ignore_sigpipe();         // a dead peer's socket is an error, not a kill
  trainer::util::raise_open_file_limit();  // a socket per peer: hundreds of tasks need more
  try {
    return run(argc, argv);
  } catch (...) {
    const trainer::ErrorSummary failure = trainer::describe_exception(std::current_exception());
    spdlog::error("{}", failure.message);
    return trainer::exit_code(failure.kind);
  }
}
