#include "parallel/train_step.hpp"

#include <algorithm>
#include <optional>

#include "parallel/allocator.hpp"
#include "parallel/checkpoint.hpp"
#include "parallel/finalize_grads.hpp"
#include "parallel/ops.hpp"
#include "parallel/precision.hpp"

namespace parallel {

namespace {

// The DDP bookkeeping the executor must not know about: only the last micro-batch's backward of a
// chunk makes its gradients final (and may start their bucket's reduction). MoE: the dense and the
// expert replica alike.
class DataParallelAwareModel final : public pipeline::PipelineModel {
 public:
  DataParallelAwareModel(pipeline::ChunkPipelineModel& inner, std::vector<DataParallel*> replicas,
                         int micro_batches)
      : inner_(inner), replicas_(std::move(replicas)), micro_batches_(micro_batches) {}
  Tensor forward(int chunk, int micro_batch, const Tensor& input) override {
    return inner_.forward(chunk, micro_batch, input);
  }
  Tensor backward(int chunk, int micro_batch, const Tensor& grad) override {
    set_last(micro_batch);
    return inner_.backward(chunk, micro_batch, grad);
  }
  // Split backward: gradients are written, and grad-ready hooks fire, in the weight step only.
  Tensor backward_input(int chunk, int micro_batch, const Tensor& grad) override {
    return inner_.backward_input(chunk, micro_batch, grad);
  }
  void backward_weight(int chunk, int micro_batch) override {
    set_last(micro_batch);
    inner_.backward_weight(chunk, micro_batch);
  }
  // The silent-data-corruption check compares each rank's own gradients, so while it holds no
  // bucket starts its reduction during the backward: finish_grad_sync() launches them all after.
  // The same buckets are reduced by the same operation, so the result is bitwise the same.
  void hold_reduction(bool hold) { hold_ = hold; }

 private:
  void set_last(int micro_batch) {
    for (DataParallel* d : replicas_) d->set_is_last_microbatch(!hold_ && micro_batch == micro_batches_ - 1);
  }
  bool hold_ = false;
  pipeline::ChunkPipelineModel& inner_;
  std::vector<DataParallel*> replicas_;
  int micro_batches_;
};

}  // namespace

TrainStep::TrainStep(const Config& config, Communicator& world, Device device)
    : cfg_(config), world_(world), device_(device) {
  const Config& c = cfg_;
  Allocator& alloc = allocator_for(device_);
  alloc.reset_peak();
  const auto grid = RankGrid::from_world(world.size(), c.parallel.tensor, c.parallel.pipeline,
                                         c.parallel.context, c.parallel.expert, c.parallel.expert_tensor);
  // On GPUs every group is a NCCL communicator on this rank's device (ParallelState).
  state_ = std::make_unique<ParallelState>(world, grid, device_);

  // This rank's model chunks (one per virtual pipeline stage).
  const auto specs = pipeline::stage_layout(pipeline::LayoutParams::of(c), state_->coord().pp);
  const bool moe = c.model.num_experts > 0;
  GPTModel::Options options{.sequence_parallel = c.parallel.sequence_parallel,
                            .recompute = c.train.recompute,
                            .seed = c.train.seed,
                            .precision = c.train.precision,
                            .device = device_,
                            .expert = moe ? &state_->ep() : nullptr,
                            .expert_tensor = moe ? &state_->etp() : nullptr,
                            .cp = &state_->cp(),
                            .context_comm = c.parallel.context_comm};
  std::vector<GPTModel*> raw;
  for (const ChunkSpec& spec : specs) {
    chunks_.push_back(std::make_unique<GPTModel>(c.model, spec, options, state_->tp()));
    raw.push_back(chunks_.back().get());
  }
  model_ = std::make_unique<pipeline::ChunkPipelineModel>(raw);
  sample_peak();
  construction_peak_ = peak_;
  peak_ = 0;
  alloc.reset_peak();

  // Parameter count of the whole model: every element counted once, by the rank that would write it
  // to a checkpoint, without vocabulary padding. Before DDP: with sharded parameters the values are
  // gathered only while a unit computes. Shapes only: the same on meta.
  int64_t local = 0;
  for (Parameter* p : parameters())
    if (checkpoint::is_replica_writer(*p, state_->coord()))
      local += checkpoint::from_parameter(*p, true).local.numel();
  Tensor count = Tensor::full({1}, static_cast<double>(local), DType::F32);
  world_.all_reduce(count);
  parameter_count_ = static_cast<int64_t>(count.to_float_vector()[0]);

  // Data parallelism owns the parameter and gradient buffers; the optimizer works on them. Dense
  // parameters are replicated over dp x cp (the cp ranks see other tokens of the same samples).
  DataParallelOptions ddp_options = DataParallelOptions::from(c.optimizer, c.train.precision);
  // A pipeline stage whose layers are all dense (moe_layer_freq, first_k_dense_replace) holds no
  // expert parameter and so no expert replica; it still joins the experts' norm reduction.
  const std::vector<Parameter*> local_params = parameters();
  const bool local_experts =
      std::any_of(local_params.begin(), local_params.end(), [](const Parameter* p) { return p->expert; });
  if (moe && local_experts) {
    // MoE: dense parameters over dp x cp, experts over expert-dp (averaged over dp x cp too), each
    // sharded as optimizer.sharding says over its own group; one hook per chunk serves both.
    DataParallelOptions experts = ddp_options.for_experts(state_->dp_cp().size(), state_->edp().size());
    experts.install_hooks = false;
    ddp_options.params = DataParallelOptions::Params::Dense;
    ddp_options.install_hooks = false;
    expert_ddp_ = std::make_unique<DataParallel>(raw, state_->edp(), experts);
  }
  ddp_ = std::make_unique<DataParallel>(raw, state_->dp_cp(), ddp_options);
  if (expert_ddp_)
    shared_hooks_ =
        std::make_unique<SharedChunkHooks>(raw, std::vector<DataParallel*>{ddp_.get(), expert_ddp_.get()});
  auto groups = OptimizerGroups::from(*state_);
  groups.model_has_experts = moe;
  optimizer_ = make_optimizer(*ddp_, c.optimizer, groups, expert_ddp_.get());

  // The overlapped update (docs/optimizer.md#the-overlapped-update). Exact only where step() would
  // not look at every gradient before updating any: the optimizer's conditions, and a guard that
  // never skips (a Stop verdict also declines the update, but the run then ends without saving).
  {
    std::string why = optimizer_->overlap_refusal();
    const TrainConfig& t = c.train;
    if (why.empty() && (t.nonfinite_policy == GuardPolicy::Skip ||
                        (t.spike_factor > 0 && t.spike_policy == GuardPolicy::Skip)))
      why = "the training guard may skip an update (train.nonfinite_policy or train.spike_policy skip)";
    const Sharding sharding = ddp_->options().sharding;
    const bool in_backward = c.optimizer.overlap_grad_reduce || sharding == Sharding::OptimGrads ||
                             sharding == Sharding::OptimGradsParams;
    switch (c.optimizer.overlap_update) {
      case OverlapUpdate::False:
        why = "optimizer.overlap_update false";
        break;
      case OverlapUpdate::True:
        PARALLEL_CHECK(why.empty(), "optimizer.overlap_update: true is not exact here: {}", why);
        break;
      case OverlapUpdate::Auto:
        if (why.empty() && !in_backward)
          why = "no reduction starts during the backward (optimizer.overlap_grad_reduce false)";
        break;
    }
    overlap_update_ = why.empty();
    // Pipeline schedules: a wait inside the schedule could stall the stages that wait for this one;
    // the buckets are updated once the rank's last backward is done (finish_grad_sync).
    overlap_during_backward_ = c.parallel.pipeline == 1;
    overlap_description_ = !overlap_update_           ? "off (" + why + ")"
                           : overlap_during_backward_ ? std::string("on (during the backward)")
                                                      : std::string("on (after the pipeline schedule)");
  }

  micro_batches_ = c.train.global_batch_size / (c.train.micro_batch_size * grid.sizes().data);
  const bool sp = c.parallel.sequence_parallel && c.parallel.tensor > 1;
  pipeline::ExecutorOptions exec;
  exec.micro_batches = micro_batches_;
  exec.virtual_stages = c.parallel.virtual_stages;
  exec.kind = c.parallel.pipeline_schedule;
  // A stage sends this rank's tokens: its cp share of the sequence, and of that its tp shard under sp.
  exec.activation_shape = {c.model.seq_length / c.parallel.context / (sp ? c.parallel.tensor : 1),
                           c.train.micro_batch_size, c.model.hidden_size};
  exec.dtype = compute_dtype(c.train.precision);  // stages pass 16-bit activations under bf16/fp16
  exec.device = device_;
  executor_ = std::make_unique<pipeline::PipelineExecutor>(state_->pp(), exec);
  exec.schedule = pipeline::forward_only;
  eval_executor_ = std::make_unique<pipeline::PipelineExecutor>(state_->pp(), exec);
  driver_ = std::make_unique<DataParallelAwareModel>(*model_, optimizer_->data_parallels(), micro_batches_);
}

TrainStep::~TrainStep() = default;

void TrainStep::wrap_pipeline_model(const ModelWrapper& wrap) { wrapped_ = wrap ? wrap(*driver_) : nullptr; }

int64_t TrainStep::peak_bytes() const {
  return std::max(peak_, static_cast<int64_t>(allocator_for(device_).stats().peak_allocated));
}

void TrainStep::sample_peak() { peak_ = peak_bytes(); }

double TrainStep::global_mean_loss(double factor, double loss_tokens) {
  const bool counts = model_->computes_loss() && state_->coord().tp == 0;
  Tensor sum = Tensor::zeros({1}, DType::F32);
  // device -> host bytes; read once below. On meta there are no values: the sum stays 0.
  if (counts && !device_.is_meta()) sum.copy_(model_->loss_sum());
  if (factor != 1.0) ops::scale_(sum, static_cast<float>(factor));
  local_loss_ = sum.clone();  // read only when the trainer's guard stops the run
  world_.all_reduce(sum);
  const double tokens = loss_tokens > 0
                            ? loss_tokens
                            : static_cast<double>(cfg_.train.global_batch_size) * cfg_.model.seq_length;
  return sum.to_float_vector()[0] / tokens;
}

namespace {

uint32_t crc_of(const Tensor& t, uint32_t crc) {
  if (!t.defined() || t.numel() == 0 || t.device().is_meta()) return crc;
  const Tensor host = t.to(Device::cpu()).contiguous();
  return checkpoint::crc32c(host.data_ptr(), host.nbytes(), crc);
}

}  // namespace

StepOutcome TrainStep::run(int64_t step, const pipeline::MicroBatchFn& data, double lr, double loss_factor,
                           const SkipUpdate& skip_update, const RerunCheck& rerun, double loss_tokens) {
  const Config& c = cfg_;
  // d(objective)/d(local loss sum): the mean over this rank's tokens (DDP averages over dp x cp,
  // and each cp rank holds seq_length / cp tokens of every sample), times the fp16 loss scale.
  const double scale = optimizer_->loss_scaler() ? optimizer_->loss_scaler()->scale() : 1.0;
  // data.eod_mask_loss: the mean over the counted tokens of the global batch (loss_tokens), which
  // DDP's average over dp x cp turns into this per-rank figure.
  const double local_tokens =
      loss_tokens > 0 ? loss_tokens / static_cast<double>(state_->grid().sizes().data * c.parallel.context)
                      : static_cast<double>(micro_batches_) * c.train.micro_batch_size *
                            (c.model.seq_length / c.parallel.context);
  // MoE aux and z losses: averaged over the micro-batches like the loss, then over dp x cp by DDP
  // (each cp rank's router sees a part of the tokens, as its loss gradient does: times cp).
  for (auto& chunk : chunks_) chunk->set_moe_loss_scale(scale * c.parallel.context / micro_batches_);
  const int64_t batches_per_step = c.train.global_batch_size / c.train.micro_batch_size;  // global
  // Forward and backward from the parameters and the data alone (the dropout draws are keyed by the
  // seed, step and micro-batch), so that a second run must give the same bits.
  const auto forward_backward = [&] {
    ddp_->zero_grad();
    if (expert_ddp_) expert_ddp_->zero_grad();
    model_->start_step(data, Tensor::full({1}, loss_factor * scale / local_tokens, DType::F32, device_),
                       static_cast<uint64_t>(step * batches_per_step + state_->coord().dp * micro_batches_));
    sample_peak();  // the executor resets the allocator's peak
    // With several micro-batches every weight is packed once for all of them (ops.hpp's
    // WeightPackingScope); the optimizer writes the weights after the scope. The memory plan's
    // walk counts the packed copies (packs_weights in memory_plan.cpp decides the same way). Under ZeRO-3
    // param_data() is undefined (gathered weights come and go inside the step): no packing. The
    // overlapped update writes a bucket's weights inside the scope, but only once the last
    // micro-batch's backward is done with them: no packed copy of them is read afterwards.
    std::optional<ops::WeightPackingScope> packing;
    if (micro_batches_ > 1 && device_.is_cpu() && ops::WeightPackingScope::enabled())
      packing.emplace(
          expert_ddp_ ? std::vector<Tensor>{ddp_->buffer().param_data(), expert_ddp_->buffer().param_data()}
                      : std::vector<Tensor>{ddp_->buffer().param_data()});
    executor_->run(wrapped_ ? *wrapped_ : *driver_);
  };
  const auto fingerprint = [&] {
    RunFingerprint f;
    if (model_->computes_loss() && model_->loss_sum().defined()) f.loss = crc_of(model_->loss_sum(), 0);
    for (DataParallel* d : optimizer_->data_parallels()) f.grads = crc_of(d->buffer().grad_data(), f.grads);
    return f;
  };
  static_cast<DataParallelAwareModel&>(*driver_).hold_reduction(rerun.enabled);
  // The overlapped update: each bucket updated once its reduction is final. Not when the step runs
  // twice: the second run must start from the same weights.
  if (overlap_update_ && !rerun.enabled) optimizer_->begin_overlapped_update(lr, overlap_during_backward_);
  forward_backward();
  if (rerun.flip_first) {
    Tensor& grads = ddp_->buffer().grad_data();
    if (grads.defined() && grads.numel() > 0) {
      Tensor element = grads.narrow(0, grads.numel() / 2, 1);
      Tensor host = element.to(Device::cpu()).clone();
      const int bit = static_cast<int>(dtype_size(host.dtype())) * 8 - 12;  // a mantissa bit
      static_cast<unsigned char*>(host.data_ptr())[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
      element.copy_(host);
    }
  }
  if (rerun.enabled) {
    const RunFingerprint first = fingerprint();
    for (auto& chunk : chunks_) {  // counted once, from the re-run
      chunk->reset_moe_statistics();
      chunk->reset_mtp_loss_sums();
      chunk->reset_router_load();
    }
    forward_backward();
    static_cast<DataParallelAwareModel&>(*driver_).hold_reduction(false);
    if (rerun.compare) rerun.compare(first, fingerprint());
  }
  finalize_grads(parameters(), *state_);
  ddp_->finish_grad_sync();
  if (expert_ddp_) expert_ddp_->finish_grad_sync();
  // The loss before the update, so that the guard can keep a poisoned step from updating
  // anything; it sees the same loss and gradient norm on every rank, so all decide alike.
  StepOutcome out;
  out.loss = global_mean_loss(loss_factor, loss_tokens);
  std::function<bool(double)> skip;
  if (skip_update) skip = [&](double grad_norm) { return skip_update(out.loss, grad_norm); };
  out.update = optimizer_->step(lr, skip);
  // Aux-loss-free balancing: the expert biases move by the step's loads once the weights did.
  std::vector<GPTModel*> chunks;
  for (auto& chunk : chunks_) {
    chunks.push_back(chunk.get());
    if (out.update.skipped) chunk->reset_router_load();
  }
  if (!out.update.skipped) GPTModel::update_router_bias(chunks, world_);
  sample_peak();
  return out;
}

std::vector<Parameter*> TrainStep::buffers() const {
  std::vector<Parameter*> out;
  for (const auto& chunk : chunks_)
    for (Parameter* p : chunk->router_buffers()) out.push_back(p);
  return out;
}

}  // namespace parallel
