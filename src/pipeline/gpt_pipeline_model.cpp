// GPT chunks behind the executor's PipelineModel interface: owns one Activations object per
// (chunk, micro-batch) in flight, so the model itself never learns which schedule runs it.
#include <algorithm>

#include "parallel/error.hpp"
#include "parallel/ops.hpp"
#include "parallel/pipeline.hpp"

namespace parallel::pipeline {

GPTPipelineModel::GPTPipelineModel(std::vector<GPTModel*> chunks) : chunks_(std::move(chunks)) {
  PARALLEL_CHECK(!chunks_.empty(), "GPTPipelineModel: no chunks");
  for (GPTModel* chunk : chunks_) PARALLEL_CHECK(chunk != nullptr, "GPTPipelineModel: null chunk");
}

void GPTPipelineModel::start_step(MicroBatchFn data, Tensor loss_scale, uint64_t first_micro_batch_id) {
  PARALLEL_CHECK(activations_.empty(),
                 "GPTPipelineModel: {} micro-batches of the last step are still in flight",
                 activations_.size());
  data_ = std::move(data);
  loss_scale_ = std::move(loss_scale);
  first_id_ = first_micro_batch_id;
  forward_only_ = false;
  for (GPTModel* chunk : chunks_) chunk->set_training(true);
  loss_sum_ = Tensor::zeros({1}, DType::F32, chunks_.front()->device());
  peak_live_ = 0;
}

void GPTPipelineModel::start_forward_only(MicroBatchFn data) {
  start_step(std::move(data), Tensor());
  forward_only_ = true;
  for (GPTModel* chunk : chunks_) chunk->set_training(false);
}

Tensor GPTPipelineModel::forward(int chunk, int micro_batch, const Tensor& input) {
  PARALLEL_CHECK(chunk >= 0 && chunk < static_cast<int>(chunks_.size()), "GPTPipelineModel: no chunk {}",
                 chunk);
  GPTModel& model = *chunks_[static_cast<std::size_t>(chunk)];
  const GPTChunkSpec& spec = model.spec();
  MicroBatch batch;
  if (spec.pre_process || spec.post_process) {
    PARALLEL_CHECK(data_ != nullptr, "GPTPipelineModel: start_step() was not called");
    batch = data_(micro_batch);
  }
  auto act = model.new_activations();
  Tensor out = model.forward(spec.pre_process ? batch.tokens : input, batch.targets, *act,
                             first_id_ + static_cast<uint64_t>(micro_batch));
  if (spec.post_process) ops::add_(loss_sum_, out);
  if (forward_only_) return out;  // no backward will come: let the saved activations go now
  const bool fresh = activations_.emplace(std::pair{chunk, micro_batch}, std::move(act)).second;
  PARALLEL_CHECK(fresh, "GPTPipelineModel: second forward of chunk {} micro-batch {}", chunk, micro_batch);
  peak_live_ = std::max(peak_live_, live_activations());
  return out;
}

std::map<std::pair<int, int>, GPTModel::ActivationsPtr>::iterator GPTPipelineModel::saved_for_backward(
    int chunk, int micro_batch, const Tensor& grad, Tensor& seed) {
  auto it = activations_.find({chunk, micro_batch});
  PARALLEL_CHECK(it != activations_.end(),
                 "GPTPipelineModel: backward of chunk {} micro-batch {} before its forward", chunk,
                 micro_batch);
  const GPTModel& model = *chunks_[static_cast<std::size_t>(chunk)];
  if (model.spec().post_process)
    PARALLEL_CHECK(loss_scale_.defined() && loss_scale_.numel() == 1,
                   "GPTPipelineModel: the last chunk's backward needs a [1] loss scale (start_step)");
  seed = model.spec().post_process ? loss_scale_ : grad;
  return it;
}

Tensor GPTPipelineModel::backward(int chunk, int micro_batch, const Tensor& grad) {
  Tensor seed;
  auto it = saved_for_backward(chunk, micro_batch, grad, seed);
  Tensor dx = chunks_[static_cast<std::size_t>(chunk)]->backward(seed, *it->second);
  activations_.erase(it);  // the backward freed the saved tensors; drop the rest with the object
  return dx;
}

Tensor GPTPipelineModel::backward_input(int chunk, int micro_batch, const Tensor& grad) {
  Tensor seed;
  auto it = saved_for_backward(chunk, micro_batch, grad, seed);
  // The activations stay until the weight step: it needs the layers' inputs.
  return chunks_[static_cast<std::size_t>(chunk)]->backward_input(seed, *it->second);
}

void GPTPipelineModel::backward_weight(int chunk, int micro_batch) {
  auto it = activations_.find({chunk, micro_batch});
  PARALLEL_CHECK(it != activations_.end(),
                 "GPTPipelineModel: weight step of chunk {} micro-batch {} before its forward", chunk,
                 micro_batch);
  chunks_[static_cast<std::size_t>(chunk)]->backward_weight(*it->second);
  activations_.erase(it);
}

bool GPTPipelineModel::computes_loss() const {
  return std::any_of(chunks_.begin(), chunks_.end(),
                     [](const GPTModel* c) { return c->spec().post_process; });
}

std::vector<Parameter*> GPTPipelineModel::parameters() {
  std::vector<Parameter*> out;
  for (GPTModel* chunk : chunks_)
    for (Parameter* p : chunk->parameters()) out.push_back(p);
  return out;
}

}  // namespace parallel::pipeline
