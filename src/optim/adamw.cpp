// The optimizer step shared by AdamW and the distributed optimizer (unscale / overflow check, global
// norm, clip, PyTorch's AdamW update, write-back), and AdamW's set-up over all parameters.
#include <cmath>
#include <unordered_map>

#include "parallel/grad_norm.hpp"
#include "parallel/ops.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/precision.hpp"

namespace parallel {
namespace {}  // namespace

OptimizerGroups OptimizerGroups::from(ParallelState& state) {
  OptimizerGroups g;
  g.model = &state.model();
  g.dp = &state.dp_cp();  // dense parameters are replicated over dp x cp
  g.expert_model = &state.expert_model();
  g.expert_dp = &state.edp();
  g.tp_rank = state.coord().tp;
  g.tp = &state.tp();
  g.expert_tp = &state.etp();
  g.first_pipeline_stage = state.is_first_stage();
  return g;
}

Optimizer::Optimizer(const OptimizerConfig& config, Precision precision, OptimizerGroups groups, bool sharded)
    : config_(config), precision_(precision), groups_(groups), sharded_(sharded) {
  has_experts_ = groups.model_has_experts;
  if (precision == Precision::FP16)
    scaler_ = std::make_unique<DynamicLossScaler>(config.initial_loss_scale, config.loss_scale_window);
}

void Optimizer::allocate_state(int64_t numel, bool need_main, Device device) {
  if (need_main) main_ = Tensor::zeros({numel}, DType::F32, device);
}

std::size_t Optimizer::state_bytes() const {
  std::size_t bytes = 0;
  for (const Tensor* t : {&main_, &exp_avg_, &exp_avg_sq_, &momentum_})
    if (t->defined()) bytes += t->nbytes();
  return bytes;
}

bool muon_parameter(const Parameter& p) {
  // LoRA's adapters stay with AdamW (docs/lora.md, "Optimizers"): orthogonalising a rank-r factor
  // on its own has no meaning for the product B A that the model uses.
  const bool adapter = p.name.ends_with(".lora_A.weight") || p.name.ends_with(".lora_B.weight");
  return p.global_shape.size() == 2 && p.unpadded_rows < 0 && !p.name.starts_with("embedding.") &&
         !p.name.starts_with("output.") && !adapter;
}

Optimizer::Slot Optimizer::make_slot(Parameter* p, Tensor grad, Tensor main, Tensor target) {
  Slot s;
  s.param = p;
  s.grad = grad;
  s.main = main;
  s.target = target;
  s.muon = config_.type == OptimizerType::Muon && muon_parameter(*p);
  // Megatron (and GPT practice): no decay for biases and norm weights, i.e. anything 1-D.
  s.weight_decay = p->global_shape.size() >= 2 ? static_cast<float>(config_.weight_decay) : 0.0f;
  return s;
}

void Optimizer::bind_state(Device device) {
  int64_t adam = 0, muon = 0;
  for (const Slot& s : slots_) (s.muon ? muon : adam) += s.grad.numel();
  // Through the library allocator on the parameters' device (a meta run counts these bytes).
  exp_avg_ = Tensor::zeros({adam}, DType::F32, device);
  exp_avg_sq_ = Tensor::zeros({adam}, DType::F32, device);
  if (config_.type == OptimizerType::Muon) momentum_ = Tensor::zeros({muon}, DType::F32, device);
  adam = muon = 0;
  for (Slot& s : slots_) {
    const int64_t n = s.grad.numel();
    if (s.muon) {
      s.momentum = momentum_.narrow(0, muon, n);
      muon += n;
    } else {
      s.exp_avg = exp_avg_.narrow(0, adam, n);
      s.exp_avg_sq = exp_avg_sq_.narrow(0, adam, n);
      adam += n;
    }
  }
}

void Optimizer::add_muon_matrices(const std::vector<Parameter*>& params,
                                  const std::function<int64_t(Parameter*)>& numel, Communicator* shard,
                                  Device device) {
  if (config_.type != OptimizerType::Muon) return;
  std::unordered_map<const Parameter*, int> slot_of;
  for (std::size_t i = 0; i < slots_.size(); ++i) slot_of.emplace(slots_[i].param, static_cast<int>(i));
  for (Parameter* p : params) {
    if (!muon_parameter(*p)) continue;
    MuonMatrix m;
    m.param = p;
    m.device = device;
    m.local_numel = numel(p);
    m.shard = shard != nullptr && shard->size() > 1 ? shard : nullptr;
    Communicator* tp = p->expert ? groups_.expert_tp : groups_.tp;
    const int64_t whole = p->global_shape[0] * p->global_shape[1];
    if (p->partition_dim >= 0 && m.local_numel != whole) {
      PARALLEL_CHECK(tp != nullptr && tp->size() > 1 && m.local_numel * tp->size() == whole,
                     "Muon: {} holds {} of its {} elements here; it needs the tensor-parallel group its "
                     "slices are split over (OptimizerGroups::{})",
                     p->name, m.local_numel, whole, p->expert ? "expert_tp" : "tp");
      m.tp = tp;
    }
    auto it = slot_of.find(p);
    m.slot = it == slot_of.end() ? -1 : it->second;
    muon_.push_back(m);
  }
}

ops::AdamWTensors Optimizer::adamw_tensors(const Slot& s) {
  return {.param = s.main,
          .grad = s.grad,
          .exp_avg = s.exp_avg,
          .exp_avg_sq = s.exp_avg_sq,
          .model_copy = s.target,
          .weight_decay = s.weight_decay};
}

std::string Optimizer::overlap_refusal() const {
  if (scaler_)
    return "fp16's loss scaler checks every gradient for an overflow before any update (train.precision "
           "fp16)";
  if (config_.clip_grad > 0)
    return "clipping scales every gradient by the global norm, known only once every bucket is reduced "
           "(optimizer.clip_grad > 0)";
  if (config_.type != OptimizerType::AdamW)
    return "Muon orthogonalises whole matrices with collectives of its own, not bucket by bucket "
           "(optimizer.type muon)";
  for (const Slot& s : slots_)
    if (s.replica < 0) return "an optimizer over plain Parameters has no data-parallel buckets";
  return {};
}

void Optimizer::begin_overlapped_update(double lr, bool during_backward) {
  const std::string refusal = overlap_refusal();
  PARALLEL_CHECK(refusal.empty(), "Optimizer: no overlapped update: {}", refusal);
  const std::vector<DataParallel*> replicas = data_parallels();
  if (overlap_.slots.empty()) {
    // Slots were made bucket by bucket: list each bucket's once.
    overlap_.slots.resize(replicas.size());
    for (std::size_t r = 0; r < replicas.size(); ++r)
      overlap_.slots[r].resize(replicas[r]->buffer().buckets().size());
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      PARALLEL_CHECK(s.replica >= 0 && s.bucket >= 0, "Optimizer: {} has no bucket", s.param->name);
      overlap_.slots[static_cast<std::size_t>(s.replica)][static_cast<std::size_t>(s.bucket)].push_back(
          static_cast<int>(i));
    }
  }
  overlap_.done.assign(replicas.size(), {});
  for (std::size_t r = 0; r < replicas.size(); ++r)
    overlap_.done[r].assign(replicas[r]->buffer().buckets().size(), 0);
  overlap_.lr = lr;
  // Exactly the scalars step() would use: no clipping (clip_coefficient(norm, 0) is 1).
  ops::AdamWStep& h = overlap_.h;
  h.lr = lr;
  h.beta1 = config_.beta1;
  h.beta2 = config_.beta2;
  h.eps = config_.eps;
  h.step = updates_ + 1;
  h.grad_scale = 1.0f;
  overlap_.armed = true;
  for (std::size_t r = 0; r < replicas.size(); ++r) {
    const int replica = static_cast<int>(r);
    replicas[r]->set_bucket_reduced_hook([this, replica](int bucket) { update_bucket(replica, bucket); },
                                         during_backward);
  }
}

void Optimizer::update_bucket(int replica, int bucket) {
  if (!overlap_.armed) return;
  char& done = overlap_.done[static_cast<std::size_t>(replica)][static_cast<std::size_t>(bucket)];
  if (done) return;
  before_bucket_update(replica, bucket);
  std::vector<ops::AdamWTensors> tensors;
  for (int i : overlap_.slots[static_cast<std::size_t>(replica)][static_cast<std::size_t>(bucket)])
    tensors.push_back(adamw_tensors(slots_[static_cast<std::size_t>(i)]));
  ops::adamw_update_multi_(tensors, overlap_.h);
  done = 1;
  after_bucket_update(replica, bucket);
}

void Optimizer::disarm() {
  if (!overlap_.armed) return;
  for (DataParallel* d : data_parallels()) d->set_bucket_reduced_hook(nullptr, false);
  overlap_.armed = false;
}

StepResult Optimizer::step(double lr, const std::function<bool(double grad_norm)>& skip_update) {
  StepResult r;
  // The overlapped update: finish_grad_sync() has reported every bucket, so every bucket was
  // updated; what is left is the norm for the result (the gradients are untouched), and the caller's
  // last word (skip_update), which can no longer undo the updates.
  const bool overlapped = overlap_.armed;
  PARALLEL_CHECK(
      !overlapped || lr == overlap_.lr,
      "Optimizer: step(lr {}) after begin_overlapped_update(lr {}): the buckets already use the latter", lr,
      overlap_.lr);
  before_update();
  Communicator* dp = sharded_ ? groups_.dp : nullptr;
  Communicator* expert_dp = sharded_ ? groups_.expert_dp : nullptr;
  if (scaler_) {
    r.loss_scale = scaler_->scale();
    const float inv = static_cast<float>(1.0 / scaler_->scale());
    for (Slot& s : slots_) ops::scale_(s.grad, inv);
  }

  // The global norm, summed on the gradients' device and reduced there: one host read per step.
  // It doubles as the fp16 overflow check: a sum of squares is finite exactly when every gradient
  // element is (short of values beyond 1e19, which no unscaled gradient reaches), and the
  // reductions carry an inf or NaN to every rank, so all ranks make the same decision. Gradients
  // left out of the norm (tp replicas, the tied embedding's second copy) equal ones counted.
  const Device device = slots_.empty() ? Device::cpu() : slots_.front().grad.device();
  Tensor sum_sq = Tensor::zeros({1}, DType::F32, device);
  // MoE experts: summed over their own groups (grad_norm.hpp).
  Tensor expert_sq = has_experts_ ? Tensor::zeros({1}, DType::F32, device) : Tensor();
  // Each sum over its gradients in one pass (one OpenMP region per list on the CPU), in slot order.
  std::vector<Tensor> dense_grads, expert_grads;
  for (const Slot& s : slots_) {
    if (s.param->expert) {
      expert_grads.push_back(s.grad);
    } else if (counts_toward_grad_norm(*s.param, groups_.tp_rank, groups_.first_pipeline_stage)) {
      dense_grads.push_back(s.grad);
    }
  }
  ops::sum_of_squares_accumulate_multi(dense_grads, sum_sq);
  if (!expert_grads.empty()) ops::sum_of_squares_accumulate_multi(expert_grads, expert_sq);
  r.grad_norm = reduce_grad_norm(sum_sq, groups_.model, dp, expert_sq, groups_.expert_model, expert_dp);
  if (scaler_) {
    const bool overflow = !std::isfinite(r.grad_norm);
    scaler_->update(overflow);
    if (overflow) {
      r.skipped = true;
      r.overflow = true;
      r.grad_norm = 0.0;
      return r;
    }
  }
  if (skip_update && skip_update(r.grad_norm)) {
    r.skipped = true;
    disarm();
    return r;
  }
  r.clip_coef = clip_coefficient(r.grad_norm, config_.clip_grad);

  ++updates_;
  ops::AdamWStep h;
  h.lr = lr;
  h.beta1 = config_.beta1;
  h.beta2 = config_.beta2;
  h.eps = config_.eps;
  h.step = updates_;
  h.grad_scale = static_cast<float>(r.clip_coef);
  if (overlapped) {
    PARALLEL_CHECK(h.step == overlap_.h.step && h.grad_scale == 1.0f,
                   "Optimizer: the overlapped update's step {} (clip 1) differs from step()'s {} (clip {})",
                   overlap_.h.step, h.step, h.grad_scale);
    // Normally none is left: finish_grad_sync() reported every bucket.
    const std::vector<DataParallel*> replicas = data_parallels();
    for (std::size_t d = 0; d < replicas.size(); ++d)
      for (std::size_t b = 0; b < overlap_.done[d].size(); ++b)
        update_bucket(static_cast<int>(d), static_cast<int>(b));
  } else {
    std::vector<ops::AdamWTensors> tensors;
    for (const Slot& s : slots_)
      if (!s.muon) tensors.push_back(adamw_tensors(s));
    ops::adamw_update_multi_(tensors, h);
  }
  if (!muon_.empty()) muon_update(lr, h.grad_scale);
  after_update();
  disarm();
  return r;
}

std::vector<Optimizer::StateSlice> Optimizer::state_slices() const {
  std::vector<StateSlice> out;
  out.reserve(slots_.size());
  for (const Slot& s : slots_)
    out.push_back({s.param, s.param_offset, s.main, s.exp_avg, s.exp_avg_sq, s.momentum});
  return out;
}

void Optimizer::reset_main_from_params() {
  if (!main_.defined()) return;
  for (Slot& s : slots_) s.main.copy_(s.target);
}

AdamW::AdamW(const std::vector<Parameter*>& params, const OptimizerConfig& config, Precision precision,
             OptimizerGroups groups)
    : Optimizer(config, precision, groups, /*sharded=*/false) {
  int64_t total = 0;
  for (Parameter* p : params) {
    total += p->numel();
    has_experts_ = has_experts_ || p->expert;
  }
  const bool low = precision != Precision::FP32;
  allocate_state(total, low, params.empty() ? Device::cpu() : params.front()->value.device());
  int64_t offset = 0;
  for (Parameter* p : params) {
    const DType want = compute_dtype(precision);
    PARALLEL_CHECK(p->value.is_contiguous() && p->grad.is_contiguous() && p->grad.dtype() == DType::F32 &&
                       p->value.dtype() == want,
                   "AdamW: {} must be contiguous with a {} value (the precision policy's, precision.hpp) and "
                   "an fp32 gradient; got a {} value",
                   p->name, dtype_name(want), dtype_name(p->value.dtype()));
    const int64_t n = p->numel();
    Tensor value = p->value.flatten();
    Slot s;
    if (low) {
      // Main weights start from the model's 16-bit values, so both sides agree from step 0.
      Tensor main = main_.narrow(0, offset, n);
      main.copy_(value);
      s = make_slot(p, p->grad.flatten(), main, value);
    } else {
      s = make_slot(p, p->grad.flatten(), value, Tensor());
    }
    slots_.push_back(std::move(s));
    offset += n;
  }
  const Device device = params.empty() ? Device::cpu() : params.front()->value.device();
  bind_state(device);
  add_muon_matrices(
      params, [](Parameter* p) { return p->numel(); }, nullptr, device);
}

AdamW::AdamW(DataParallel& ddp, const OptimizerConfig& config, OptimizerGroups groups, DataParallel* experts)
    : Optimizer(config, ddp.options().precision, groups, /*sharded=*/false), ddp_(&ddp), experts_(experts) {
  const std::vector<DataParallel*> replicas = data_parallels();
  int64_t total = 0;
  for (DataParallel* d : replicas) {
    PARALLEL_CHECK(!d->options().distributed_optimizer,
                   "AdamW: this DDP reduce-scatters gradients; use DistributedOptimizer with it");
    total += d->buffer().numel();
    for (const Parameter* p : d->buffer().params()) has_experts_ = has_experts_ || p->expert;
  }
  ParamAndGradBuffer& first = ddp.buffer();
  const bool low = first.low_precision();
  allocate_state(total, low, first.grad_data().device());
  // The state of each replica's buffer is one contiguous range, in the buffer's own layout.
  int64_t base = 0;
  for (std::size_t r = 0; r < replicas.size(); ++r) {
    ParamAndGradBuffer& buf = replicas[r]->buffer();
    if (low) main_.narrow(0, base, buf.numel()).copy_(buf.param_data());
    for (Parameter* p : buf.params()) {
      const int64_t off = buf.offset_of(p), n = p->numel();
      Tensor grad = buf.grad_data().narrow(0, off, n);
      if (low) {
        slots_.push_back(
            make_slot(p, grad, main_.narrow(0, base + off, n), buf.param_data().narrow(0, off, n)));
      } else {
        slots_.push_back(make_slot(p, grad, buf.param_data().narrow(0, off, n), Tensor()));
      }
      slots_.back().replica = static_cast<int>(r);
      slots_.back().bucket = buf.bucket_of(p);
    }
    base += buf.numel();
  }
  bind_state(first.grad_data().device());
  // Gradients are all-reduced: every rank holds each matrix's whole tp slice.
  for (DataParallel* d : replicas)
    add_muon_matrices(
        d->buffer().params(), [d](Parameter* p) { return d->buffer().numel_of(p); }, nullptr,
        first.grad_data().device());
}

std::vector<DataParallel*> AdamW::data_parallels() {
  std::vector<DataParallel*> out;
  if (ddp_ != nullptr) out.push_back(ddp_);
  if (experts_ != nullptr) out.push_back(experts_);
  return out;
}

}  // namespace parallel
