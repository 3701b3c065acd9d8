#include "trainer/loop/step.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "trainer/loop/optimizer.h"
#include "trainer/util/rng.h"
#include "trainer/util/signals.h"

namespace trainer::train {

namespace {

std::vector<torch::Tensor> trainable_parameters(const model::Net& net) {
  std::vector<torch::Tensor> out;
  for (const auto& p : net->parameters()) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

// The BN running statistics (running_mean, running_var), averaged across replicas every step.
std::vector<torch::Tensor> bn_statistics(const model::Net& net) {
  std::vector<torch::Tensor> out;
  for (const auto& item : net->named_buffers()) {
    if (item.value().is_floating_point() && item.key().find("running_") != std::string::npos) {
      out.push_back(item.value());
    }
  }
  return out;
}

// SyncBatchNorm's sums over the replicas, on the process group (blocking, in graph order: every
// replica runs the same graph, so the collectives match up).
class GroupStatsReducer : public model::StatsReducer {
 public:
  explicit GroupStatsReducer(dist::ProcessGroup& group) : group_(group) {}
  void sum_(torch::Tensor& t) override { group_.all_reduce_sum({t}); }

 private:
  dist::ProcessGroup& group_;
};

model::Net placed(model::Net net, const ModelSettings& settings) {
  place_model(net, settings);
  return net;
}

}  // namespace

Stepper::Stepper(const config::JobSpec& spec, const ModelSettings& settings, bool distributed,
                 model::Net net)
    : spec_(spec),
      settings_(settings),
      distributed_(distributed),
      net_(placed(std::move(net), settings)),
      params_(trainable_parameters(net_)),
      optimizer_(
          make_optimizer(spec.train.optimizer, weight_decay_groups(*net_, spec.train.optimizer))),
      scaler_(settings.loss_scaling()) {
  loss_.kind = spec.train.loss;
  loss_.label_smoothing = spec.train.label_smoothing;
  loss_.focal_gamma = spec.train.focal_gamma;
  loss_.t1 = spec.train.bi_tempered_t1;
  loss_.t2 = spec.train.bi_tempered_t2;
  mix_.mixup_alpha = spec.train.mixup_alpha;
  mix_.cutmix_alpha = spec.train.cutmix_alpha;
}

void Stepper::set_class_weights(const std::vector<double>& weights) {
  if (weights.empty()) {
    loss_.class_weights = torch::Tensor();
    return;
  }
  std::vector<float> w(weights.begin(), weights.end());
  loss_.class_weights = torch::tensor(w, torch::kFloat32).to(settings_.device);
}

void Stepper::connect(dist::ProcessGroup& group) {
  dist::GradSyncOptions o;
  o.bucket_mb = spec_.distributed.bucket_mb;
  if (!spec_.model.freeze_batchnorm) o.averaged_buffers = bn_statistics(net_);
  o.stop_vote = [] { return util::stop_requested(); };
  sync_ = std::make_unique<dist::GradientSync>(group, params_, std::move(o));
  if (distributed_ && spec_.model.sync_batchnorm && !spec_.model.freeze_batchnorm) {
    bn_reducer_ = std::make_shared<GroupStatsReducer>(group);
    model::set_batchnorm_reducer(*net_, bn_reducer_);
    spdlog::info("model.sync_batchnorm: BN statistics over the global batch ({} replicas)",
                 group.world_size());
  }
  if (distributed_) {
    spdlog::info("gradients: {} all-reduce buckets of about {} MB over {} ({} replicas){}",
                 sync_->num_buckets(), spec_.distributed.bucket_mb, group.backend(),
                 group.world_size(),
                 spec_.model.freeze_batchnorm ? "" : "; BN statistics averaged in the last bucket");
  }
}

uint64_t example_noise_seed(int64_t data_seed, int64_t epoch, int64_t example) {
  constexpr uint64_t kNoiseStream = 0x6e6f697365726f77ULL;  // "noiserow"
  return util::mix_seed(
      static_cast<uint64_t>(data_seed),
      {static_cast<uint64_t>(epoch), static_cast<uint64_t>(example), kNoiseStream});
}

StepResult Stepper::step(const data::Batch& batch, double lr, uint64_t mix_seed, int64_t epoch) {
  set_learning_rate(*optimizer_, lr);
  // Reset, not zero: the first backward hands its gradient over without a fill and an add.
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  StepResult r;
  r.examples = batch.images.size(0);
  r.loss_scale = scaler_.enabled() ? scaler_.scale() : 0;
  if (r.examples > 0) {
    const int64_t micro =
        spec_.train.micro_batch_size > 0 ? spec_.train.micro_batch_size : r.examples;
    // Mixup/CutMix: one draw for the replica batch, each example mixed with the one before it
    // in the batch, micro-batch by micro-batch (only the rows at hand and their partners are
    // made float); the loss takes the mixed soft targets, the hits count their argmax.
    const MixDraw draw = mix_.enabled()
                             ? draw_mix(mix_, batch.images.size(1), batch.images.size(2), mix_seed)
                             : MixDraw{};
    const bool mixing = draw.kind != "none";
    const torch::Tensor images =
        mixing ? batch.images.to(settings_.device, /*non_blocking=*/true) : batch.images;
    const torch::Tensor all_labels =
        mixing ? prepare_labels(batch.labels, settings_) : batch.labels;
    // Class-weighted cross-entropy over hard labels: PyTorch divides by the summed weight of the
    // batch's labels, so each micro-batch's sum is divided by the whole replica batch's.
    const bool weighted_hard =
        !mixing && loss_.kind == "cross_entropy" && loss_.class_weights.defined();
    torch::Tensor weight_total;
    if (weighted_hard) {
      weight_total = loss_.class_weights.index_select(0, prepare_labels(batch.labels, settings_))
                         .sum()
                         .clamp_min(1e-12);  // all-zero weights: a zero loss, not 0 / 0
    }
    for (int64_t start = 0; start < r.examples; start += micro) {
      const int64_t len = std::min(micro, r.examples - start);
      const bool last = start + len >= r.examples;
      sync_->set_accumulating(!last);
      torch::Tensor input = prepare_input(images.narrow(0, start, len), settings_);
      torch::Tensor target = prepare_labels(all_labels.narrow(0, start, len), settings_);
      if (mixing) {
        const torch::Tensor rows =
            ((torch::arange(start, start + len, torch::kInt64) + (r.examples - 1)) % r.examples)
                .to(images.device());
        const Mixed m =
            apply_mix_rows(input, prepare_input(images.index_select(0, rows), settings_), target,
                           all_labels.index_select(0, rows), net_->options().num_classes, draw);
        input = m.images;
        target = m.targets;
      }
      const torch::Tensor labels = target.dim() == 2 ? target.argmax(1) : target;
      std::vector<uint64_t> row_seeds;  // a batch without example indices: torch's generator
      if (static_cast<int64_t>(batch.indices.size()) == r.examples) {
        for (int64_t i = start; i < start + len; ++i) {
          row_seeds.push_back(
              example_noise_seed(spec_.data.seed, epoch, batch.indices[static_cast<size_t>(i)]));
        }
      }
      net_->set_row_seeds(std::move(row_seeds));
      struct ClearSeeds {  // also when the forward or backward throws
        model::Net& net;
        ~ClearSeeds() { net->set_row_seeds({}); }
      } clear_seeds{net_};
      const torch::Tensor logits = forward_logits(net_, input, settings_);
      torch::Tensor loss;   // this micro-batch's mean loss (metrics)
      torch::Tensor share;  // its part of the batch's loss: the parts add up to the batch's
      if (weighted_hard) {
        share = weighted_cross_entropy_sum(logits, target, loss_) / weight_total;
        loss = share * (static_cast<double>(r.examples) / len);
      } else {
        loss = training_loss(logits, target, loss_);
        share = len == r.examples ? loss : loss * (static_cast<double>(len) / r.examples);
      }
      scaler_.scale_loss(share).backward();
      torch::NoGradGuard no_grad;
      const torch::Tensor loss_part = loss.detach().to(torch::kDouble) * static_cast<double>(len);
      const torch::Tensor hits = logits.argmax(1).eq(labels).sum();
      r.loss_sum = r.loss_sum.defined() ? r.loss_sum + loss_part : loss_part;
      r.correct = r.correct.defined() ? r.correct + hits : hits;
    }
  }
  sync_->set_accumulating(false);
  sync_->finish();
  bool step_ok = true;
  if (scaler_.enabled()) {
    const HostSyncAllowed intended;  // GradScaler.step reads its overflow flag the same way
    step_ok = scaler_.unscale_and_update(params_);
    r.skipped = !step_ok;
  }
  if (step_ok && spec_.train.clip_grad_norm > 0)
    clip_grad_norm(params_, spec_.train.clip_grad_norm);
  if (step_ok && (r.examples > 0 || distributed_)) optimizer_->step();
  return r;
}

torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> norms;
  for (const auto& p : params) {
    if (p.grad().defined()) norms.push_back(p.grad().detach().norm(2));
  }
  if (norms.empty()) return torch::zeros({});
  const torch::Tensor total = torch::stack(norms).norm(2);
  const torch::Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
  for (const auto& p : params) {
    if (p.grad().defined()) p.grad().detach().mul_(coef);
  }
  return total;
}

bool Stepper::stop_everywhere() const {
  return distributed_ ? sync_->last_step().stop_votes > 0 : util::stop_requested();
}

void set_train_mode(model::Net& net, const config::ModelSpec& spec) {
  net->train();
  if (spec.freeze_batchnorm) model::set_batchnorm_eval(*net);
}

std::vector<torch::Tensor> replica_state(const model::Net& net) {
  std::vector<torch::Tensor> state = net->parameters();
  for (const auto& b : net->buffers()) state.push_back(b);
  return state;
}

}  // namespace trainer::train
