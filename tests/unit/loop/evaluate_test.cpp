// EvalCounts' derived numbers on a hand-built confusion matrix, and evaluate() over a real
// loader of generated images.
#include "common/catch.h"

#include <nlohmann/json.hpp>

#include "train_test_util.h"
#include "trainer/data/image.h"
#include "trainer/data/loader.h"
#include "trainer/data/source.h"
#include "trainer/loop/evaluate.h"
#include "trainer/model/net.h"
#include "trainer/synth/synthetic.h"
#include "trainer/util/error.h"

using namespace trainer::train;
using namespace trainer::train::testing;

namespace {

// 8 examples of 3 classes: class 0 has 4 (3 right), class 1 has 4 (2 right), class 2 none.
EvalCounts hand_built() {
  EvalCounts c;
  c.num_examples = 8;
  c.loss_sum = 4.0;
  c.confusion = {{3, 1, 0}, {0, 2, 2}, {0, 0, 0}};
  c.skipped = 1;
  return c;
}

// Every module's is_training(), in modules() order.
std::vector<bool> training_flags(torch::nn::Module& net) {
  std::vector<bool> flags;
  for (const auto& m : net.modules(/*include_self=*/true)) flags.push_back(m->is_training());
  return flags;
}

}  // namespace

TEST_CASE("EvalCounts derives accuracy, per-class accuracy and mean loss", "[evaluate]") {
  const EvalCounts c = hand_built();
  CHECK(c.accuracy() == Approx(5.0 / 8));
  CHECK(c.loss() == Approx(0.5));
  CHECK(c.per_class_accuracy() == std::vector<double>{0.75, 0.5, 0.0});

  const nlohmann::json j = c.to_json({"cbb", "cmd", "healthy"});
  CHECK(j.at("accuracy").get<double>() == Approx(0.625));
  CHECK(j.at("loss").get<double>() == Approx(0.5));
  CHECK(j.at("num_examples") == 8);
  CHECK(j.at("skipped") == 1);
  CHECK(j.at("per_class") == nlohmann::json{{"cbb", 0.75}, {"cmd", 0.5}, {"healthy", 0.0}});
  CHECK(j.at("confusion_matrix") == nlohmann::json::parse("[[3, 1, 0], [0, 2, 2], [0, 0, 0]]"));
  CHECK(j.at("class_names") == nlohmann::json{"cbb", "cmd", "healthy"});

  SECTION("classes without a name are keyed by index") {
    const nlohmann::json k = c.to_json({"cbb"});
    CHECK(k.at("per_class") == nlohmann::json{{"cbb", 0.75}, {"1", 0.5}, {"2", 0.0}});
  }
}

TEST_CASE("EvalCounts of nothing is all zeros, not NaN", "[evaluate]") {
  EvalCounts c;
  c.confusion = {{0, 0}, {0, 0}};
  CHECK(c.accuracy() == 0.0);
  CHECK(c.loss() == 0.0);
  CHECK(c.per_class_accuracy() == std::vector<double>{0.0, 0.0});
  CHECK_NOTHROW(c.to_json({"a", "b"}).dump());
}

TEST_CASE("evaluate counts every example of the loader and restores the model's mode",
          "[evaluate]") {
  TempDir tmp;
  const trainer::data::Listing listing = trainer::train::testing::six_images(tmp);
  REQUIRE(listing.examples.size() == 6);

  trainer::data::LoaderOptions options;
  options.preprocess.image_size = 32;
  options.batch_size = 4;  // a full batch and a partial one
  options.num_workers = 1;

  torch::manual_seed(3);
  trainer::model::Net net = trainer::model::make_net({"resnet18", 3, 0});
  // The model's modes before evaluate: all training, all eval, or training with frozen BN.
  const int mode = GENERATE(0, 1, 2);
  INFO("mode " << mode);
  if (mode == 1) {
    net->eval();
  } else {
    net->train();
  }
  if (mode == 2) trainer::model::set_batchnorm_eval(*net);
  const std::vector<bool> modes_before = training_flags(*net);
  const bool start_training = mode != 1;
  REQUIRE(net->is_training() == start_training);

  SECTION("counts match a direct forward pass") {
    trainer::data::Loader loader(listing.examples, options);
    const EvalCounts counts = evaluate(net, loader, 3, ModelSettings{});
    CHECK(training_flags(*net) == modes_before);
    CHECK(counts.num_examples == 6);
    CHECK(counts.skipped == 0);

    // The same batches, through the model by hand.
    trainer::data::Loader again(listing.examples, options);
    again.start_epoch(0);
    net->eval();
    torch::NoGradGuard no_grad;
    double loss_sum = 0;
    std::vector<std::vector<int64_t>> confusion(3, std::vector<int64_t>(3, 0));
    while (auto batch = again.next()) {
      const torch::Tensor logits = net->forward(trainer::data::normalize_images(
          batch->images, trainer::data::Normalize::kImagenet, /*channels_last=*/false));
      loss_sum += torch::nn::functional::cross_entropy(
                      logits, batch->labels,
                      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone))
                      .sum()
                      .item<double>();
      const torch::Tensor predicted = logits.argmax(1);
      for (int64_t i = 0; i < batch->labels.size(0); ++i) {
        ++confusion[static_cast<size_t>(batch->labels[i].item<int64_t>())]
                   [static_cast<size_t>(predicted[i].item<int64_t>())];
      }
    }
    CHECK(counts.confusion == confusion);
    CHECK(counts.loss_sum == Approx(loss_sum).epsilon(1e-6));
    for (const auto& row : counts.confusion) {
      int64_t n = 0;
      for (int64_t v : row) n += v;
      CHECK(n == 2);  // 2 examples of each class
    }
  }
  SECTION("a label outside the model's classes is a DataError, mode restored") {
    std::vector<trainer::data::Example> examples = listing.examples;
    examples.back().label = 3;
    trainer::data::Loader loader(examples, options);
    CHECK_THROWS_AS(evaluate(net, loader, 3, ModelSettings{}), trainer::DataError);
    CHECK(training_flags(*net) == modes_before);
  }
}
