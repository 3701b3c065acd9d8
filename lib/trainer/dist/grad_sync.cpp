#include "trainer/dist/grad_sync.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include <spdlog/spdlog.h>

#include "trainer/util/device.h"
#include "trainer/util/error.h"

namespace trainer::dist {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Gloo has no bf16 kernels; fp32 holds every bf16 exactly and sums more precisely.
torch::ScalarType buffer_type(torch::ScalarType t) {
  return t == torch::kBFloat16 ? torch::kFloat : t;
}

}  // namespace

struct GradientSync::State {
  struct Slot {
    torch::Tensor param;
    size_t input_index = 0;  // position in the constructor's list
    size_t bucket = 0;
    size_t pos = 0;      // position within the bucket (its used flag)
    int64_t offset = 0;  // element offset of its gradient in the bucket's buffer
    torch::Tensor view;  // its gradient's place in the bucket, with the parameter's strides
    unsigned hook = 0;
    bool ready = false;  // its gradient arrived this step
  };
  // flat = [gradients of its slots, back to back | one "used" flag per slot]. The flags are
  // reduced with the gradients: a sum of 0 means no rank produced a gradient for that slot.
  // The last bucket to launch also carries [averaged buffers | one stop vote] after its flags.
  struct Bucket {
    std::vector<size_t> slots;
    torch::Tensor flat, grads, flags, riders, vote;
    size_t pending = 0;
    AsyncWork work;
  };

  State(ProcessGroup& g, GradSyncOptions o) : group(g), options(std::move(o)) {}

  ProcessGroup& group;
  GradSyncOptions options;
  bool accumulating = false;
  std::vector<Slot> slots;
  std::vector<std::pair<size_t, torch::Tensor>> frozen;  // ignored: not requiring grad at start
  std::vector<Bucket> buckets;
  size_t next_launch = 0;  // buckets launch strictly in index order, the same on every rank
  int launched_in_backward = 0;
  std::mutex mutex;
  std::exception_ptr error;  // a failure inside a hook, rethrown by finish()
  GradSyncStats stats;

  // On a GPU finish() reads nothing from the device: the buckets' used flags and the stop vote
  // are copied to pinned host memory without waiting and read at the next finish() (after that
  // step's backward has been queued, so the GPU never idles for it). Every rank reads the same
  // step's values, so the stop lands on the same step everywhere, one step later than on the CPU.
  bool on_device = false;
  torch::Tensor late_host;           // [flags of every bucket | vote], float, pinned
  std::function<bool()> late_ready;  // whether the copy into late_host has completed
  bool warned_unused = false;
  int read_late();  // the previous step's stop votes; checks its flags

  void build();
  void on_grad(size_t slot, const torch::Tensor& grad);
  void launch(size_t bucket, bool from_hook);
  void reset();
};

void GradientSync::State::build() {
  const double cap = std::max(options.bucket_mb, 0.0) * 1024.0 * 1024.0;
  struct Open {
    torch::Device device;
    torch::ScalarType dtype;
    std::vector<size_t> slots;
    double bytes = 0;
  };
  std::vector<Open> open;
  std::vector<std::vector<size_t>> assigned;
  // Reverse registration order: backward produces the last layers' gradients first.
  for (size_t i = slots.size(); i-- > 0;) {
    const auto& p = slots[i].param;
    const auto dtype = buffer_type(p.scalar_type());
    auto it = std::find_if(open.begin(), open.end(), [&](const Open& o) {
      return o.device == p.device() && o.dtype == dtype;
    });
    if (it == open.end()) {
      open.push_back(Open{p.device(), dtype, {}, 0});
      it = open.end() - 1;
    }
    const double bytes = static_cast<double>(p.numel() * c10::elementSize(dtype));
    if (!it->slots.empty() && it->bytes + bytes > cap) {
      assigned.push_back(std::move(it->slots));
      it->slots.clear();
      it->bytes = 0;
    }
    it->slots.push_back(i);
    it->bytes += bytes;
  }
  for (auto& o : open) {
    if (!o.slots.empty()) assigned.push_back(std::move(o.slots));
  }
  // Launch order: by the latest-registered parameter of each bucket, latest first.
  std::sort(assigned.begin(), assigned.end(),
            [](const auto& a, const auto& b) { return a.front() > b.front(); });

  int64_t rider_elems = 0;
  for (const auto& t : options.averaged_buffers) {
    if (!t.is_floating_point()) {
      throw Error(ErrorKind::kInternal, "GradientSync: averaged buffers must be floating point");
    }
    rider_elems += t.numel();
  }
  for (size_t b = 0; b < assigned.size(); ++b) {
    const bool last = b + 1 == assigned.size();
    Bucket bucket;
    bucket.slots = assigned[b];
    int64_t total = 0;
    for (size_t k = 0; k < bucket.slots.size(); ++k) {
      Slot& s = slots[bucket.slots[k]];
      s.bucket = b;
      s.pos = k;
      s.offset = total;
      total += s.param.numel();
    }
    const auto& first = slots[bucket.slots.front()].param;
    const int64_t n = static_cast<int64_t>(bucket.slots.size());
    const int64_t extra = last ? rider_elems + 1 : 0;
    bucket.flat = torch::zeros(
        {total + n + extra},
        torch::TensorOptions().dtype(buffer_type(first.scalar_type())).device(first.device()));
    bucket.grads = bucket.flat.narrow(0, 0, total);
    bucket.flags = bucket.flat.narrow(0, total, n);
    if (last) {
      bucket.riders = bucket.flat.narrow(0, total + n, rider_elems);
      bucket.vote = bucket.flat.narrow(0, total + n + rider_elems, 1);
    }
    for (size_t k : bucket.slots) {
      Slot& s = slots[k];
      auto place = bucket.grads.narrow(0, s.offset, s.param.numel());
      // Dense parameters (contiguous or channels_last) keep their strides in the bucket, so a
      // gradient is one straight copy in and .grad can be the bucket itself.
      s.view = s.param.is_non_overlapping_and_dense()
                   ? place.as_strided(s.param.sizes(), s.param.strides())
                   : place.view(s.param.sizes());
    }
    bucket.pending = bucket.slots.size();
    buckets.push_back(std::move(bucket));
  }
}

void GradientSync::State::on_grad(size_t index, const torch::Tensor& grad) {
  std::lock_guard<std::mutex> lock(mutex);
  if (error || accumulating) return;
  try {
    Slot& s = slots[index];
    Bucket& b = buckets[s.bucket];
    if (s.ready) {
      throw Error(ErrorKind::kInternal,
                  "GradientSync: parameter #" + std::to_string(s.input_index) +
                      " received a second gradient before finish(); call finish() after every "
                      "backward (accumulating gradients over several backward passes is not "
                      "supported)");
    }
    if (grad.defined() && grad.is_sparse()) {
      throw Error(ErrorKind::kInternal, "GradientSync: sparse gradients are not supported");
    }
    torch::NoGradGuard no_grad;
    // What .grad would hold after this backward: the incoming gradient plus what earlier
    // (accumulating) backward passes left in .grad.
    const torch::Tensor& held = s.param.grad();
    if (grad.defined() && held.defined()) {
      at::add_out(s.view, held, grad);
    } else if (grad.defined() || held.defined()) {
      s.view.copy_(grad.defined() ? grad : held);
    } else {
      s.view.zero_();
    }
    if (grad.defined() || held.defined()) {
      b.flags.narrow(0, static_cast<int64_t>(s.pos), 1).fill_(1);
    }
    s.ready = true;
    --b.pending;
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      launch(next_launch, /*from_hook=*/true);
    }
  } catch (...) {
    error = std::current_exception();
  }
}

// Caller holds the mutex. Gradients that did not arrive count as zero (their flag stays 0).
void GradientSync::State::launch(size_t index, bool from_hook) {
  Bucket& b = buckets[index];
  torch::NoGradGuard no_grad;
  if (b.pending > 0) {
    for (size_t k : b.slots) {
      const Slot& s = slots[k];
      if (!s.ready) s.view.zero_();
    }
  }
  if (b.vote.defined()) {
    int64_t at = 0;
    for (const auto& t : options.averaged_buffers) {
      b.riders.narrow(0, at, t.numel()).view(t.sizes()).copy_(t);
      at += t.numel();
    }
    b.vote.fill_(options.stop_vote && options.stop_vote() ? 1 : 0);
  }
  b.work = group.all_reduce_sum_async(b.flat);
  ++next_launch;
  if (from_hook) ++launched_in_backward;
}

int GradientSync::State::read_late() {
  if (!late_ready) return 0;
  while (!late_ready()) std::this_thread::yield();  // queued a step ago: done or nearly
  late_ready = nullptr;
  const float* v = late_host.data_ptr<float>();
  const int64_t n = late_host.numel() - 1;
  for (int64_t i = 0; i < n && !warned_unused; ++i) {
    if (v[i] > 0) continue;
    warned_unused = true;
    spdlog::warn(
        "GradientSync: a trainable parameter got no gradient on any replica in a step; on a GPU "
        "it was given a zero gradient (the trainer does not wait for the device to find out, as "
        "DDP's find_unused_parameters=False), where on the CPU it keeps none");
  }
  return static_cast<int>(v[n] + 0.5f);
}

void GradientSync::State::reset() {
  for (auto& s : slots) s.ready = false;
  for (auto& b : buckets) {
    b.pending = b.slots.size();
    b.work = AsyncWork();
    b.flags.zero_();
  }
  next_launch = 0;
  launched_in_backward = 0;
  error = nullptr;
}

GradientSync::GradientSync(ProcessGroup& group, std::vector<torch::Tensor> parameters,
                           double bucket_mb)
    : GradientSync(group, std::move(parameters), GradSyncOptions{bucket_mb, {}, {}}) {}

GradientSync::GradientSync(ProcessGroup& group, std::vector<torch::Tensor> parameters,
                           GradSyncOptions options)
    : state_(std::make_unique<State>(group, std::move(options))) {
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (!parameters[i].defined()) continue;
    if (!parameters[i].requires_grad()) {
      state_->frozen.emplace_back(i, parameters[i]);
      continue;
    }
    State::Slot s;
    s.param = parameters[i];
    s.input_index = i;
    state_->slots.push_back(std::move(s));
  }
  if (!group.communicates()) return;
  state_->build();
  state_->on_device = !state_->buckets.empty() && state_->buckets.front().flat.is_cuda();
  State* state = state_.get();
  for (size_t k = 0; k < state_->slots.size(); ++k) {
    auto& s = state_->slots[k];
    s.hook =
        s.param.register_hook([state, k](const torch::Tensor& grad) { state->on_grad(k, grad); });
  }
}

GradientSync::~GradientSync() {
  if (!state_->group.communicates()) return;
  for (auto& s : state_->slots) {
    try {
      s.param.remove_hook(s.hook);
    } catch (...) {
      // The parameter outlived its autograd meta; nothing left to remove.
    }
  }
}

void GradientSync::finish() {
  State& st = *state_;
  if (!st.group.communicates()) return;
  const auto start = Clock::now();
  std::lock_guard<std::mutex> lock(st.mutex);
  GradSyncStats stats;
  try {
    // Even after a failed hook every bucket is launched and waited for, so that all ranks
    // stay in step (the same collectives in the same order) before the error is thrown.
    while (st.next_launch < st.buckets.size()) st.launch(st.next_launch, /*from_hook=*/false);
    stats.buckets = static_cast<int>(st.buckets.size());
    stats.launched_in_backward = st.launched_in_backward;
    const auto wait_start = Clock::now();
    for (auto& b : st.buckets) b.work.wait();
    stats.wait_s = seconds_since(wait_start);
    if (st.error) std::rethrow_exception(st.error);
    for (const auto& [index, param] : st.frozen) {
      if (param.requires_grad()) {  // its gradient would silently differ between replicas
        throw Error(ErrorKind::kInternal,
                    "GradientSync: parameter #" + std::to_string(index) +
                        " was frozen when GradientSync was built and now requires grad; build a "
                        "new GradientSync after changing which parameters train");
      }
    }

    torch::NoGradGuard no_grad;
    const double world = static_cast<double>(st.group.world_size());
    if (st.on_device) {
      stats.stop_votes = st.read_late();
      std::vector<torch::Tensor> late;
      for (auto& b : st.buckets) late.push_back(b.flags.to(torch::kFloat));
      late.push_back(st.buckets.back().vote.to(torch::kFloat));
      const torch::Tensor device_late = torch::cat(late);
      st.late_host = torch::empty(device_late.sizes(),
                                  torch::TensorOptions().dtype(torch::kFloat).pinned_memory(true));
      st.late_host.copy_(device_late, /*non_blocking=*/true);
      st.late_ready = util::device_ready_probe(device_late.device());
    }
    for (auto& b : st.buckets) {
      stats.bytes += b.flat.numel() * static_cast<int64_t>(b.flat.element_size());
      if (b.vote.defined() && !st.on_device) {
        stats.stop_votes = static_cast<int>(b.vote.item<double>() + 0.5);
      }
      b.flat.div_(world);
      if (b.riders.defined()) {
        int64_t at = 0;
        for (auto& t : st.options.averaged_buffers) {
          t.copy_(b.riders.narrow(0, at, t.numel()).view(t.sizes()));
          at += t.numel();
        }
      }
      // On the CPU, a parameter no rank produced a gradient for keeps its .grad as it is; on a
      // GPU every one gets the bucket's (read_late checks the flags a step later).
      torch::Tensor used;
      if (!st.on_device) used = (b.flags > 0).to(torch::kCPU);
      for (size_t k = 0; k < b.slots.size(); ++k) {
        if (used.defined() && !used.data_ptr<bool>()[k]) continue;
        auto& p = st.slots[b.slots[k]].param;
        const auto& s = st.slots[b.slots[k]];
        if (s.view.scalar_type() == p.scalar_type() && s.view.strides() == p.strides()) {
          p.mutable_grad() = s.view;  // the bucket is the gradient: no copy
        } else {
          if (!p.grad().defined()) p.mutable_grad() = torch::empty_like(p);
          p.mutable_grad().copy_(s.view);  // bf16 parameters: back from the fp32 bucket
        }
      }
    }
  } catch (...) {
    st.reset();
    throw;
  }
  stats.finish_s = seconds_since(start);
  st.stats = stats;
  st.reset();
}

void GradientSync::set_accumulating(bool on) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->accumulating = on;
}

const GradSyncStats& GradientSync::last_step() const { return state_->stats; }

int GradientSync::num_buckets() const { return static_cast<int>(state_->buckets.size()); }

std::vector<std::vector<size_t>> GradientSync::bucket_assignment() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : state_->buckets) {
    std::vector<size_t> indices;
    for (size_t k : b.slots) indices.push_back(state_->slots[k].input_index);
    out.push_back(std::move(indices));
  }
  return out;
}

}  // namespace trainer::dist
