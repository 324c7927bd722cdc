// Model chunks behind the executor's PipelineModel interface: owns one Activations object per
// (chunk, micro-batch) in flight, so the model itself never learns which schedule runs it.
#include <algorithm>

#include "parallel/error.hpp"
#include "parallel/ops.hpp"
#include "parallel/pipeline.hpp"

namespace parallel::pipeline {

ChunkPipelineModel::ChunkPipelineModel(std::vector<ModelChunk*> chunks) : chunks_(std::move(chunks)) {
  PARALLEL_CHECK(!chunks_.empty(), "ChunkPipelineModel: no chunks");
  for (ModelChunk* chunk : chunks_) PARALLEL_CHECK(chunk != nullptr, "ChunkPipelineModel: null chunk");
}

void ChunkPipelineModel::start_step(MicroBatchFn data, Tensor loss_scale, uint64_t first_micro_batch_id) {
  PARALLEL_CHECK(activations_.empty(),
                 "ChunkPipelineModel: {} micro-batches of the last step are still in flight",
                 activations_.size());
  data_ = std::move(data);
  loss_scale_ = std::move(loss_scale);
  first_id_ = first_micro_batch_id;
  forward_only_ = false;
  for (ModelChunk* chunk : chunks_) chunk->set_training(true);
  loss_sum_ = Tensor::zeros({1}, DType::F32, chunks_.front()->device());
  peak_live_ = 0;
}

void ChunkPipelineModel::start_forward_only(MicroBatchFn data) {
  start_step(std::move(data), Tensor());
  forward_only_ = true;
  for (ModelChunk* chunk : chunks_) chunk->set_training(false);
}

Tensor ChunkPipelineModel::forward(int chunk, int micro_batch, const Tensor& input) {
  PARALLEL_CHECK(chunk >= 0 && chunk < static_cast<int>(chunks_.size()), "ChunkPipelineModel: no chunk {}",
                 chunk);
  ModelChunk& model = *chunks_[static_cast<std::size_t>(chunk)];
  PARALLEL_CHECK(data_ != nullptr, "ChunkPipelineModel: start_step() was not called");
  // Every chunk reads the micro-batch: a middle one for its documents (MicroBatch::packed).
  const MicroBatch batch = data_(micro_batch);
  auto act = model.new_activations();
  Tensor out = model.forward(model.pre_process() ? batch.tokens : input, batch.targets, *act,
                             first_id_ + static_cast<uint64_t>(micro_batch), batch.packed);
  if (model.post_process()) ops::add_(loss_sum_, out);
  if (forward_only_) return out;  // no backward will come: let the saved activations go now
  const bool fresh = activations_.emplace(std::pair{chunk, micro_batch}, std::move(act)).second;
  PARALLEL_CHECK(fresh, "ChunkPipelineModel: second forward of chunk {} micro-batch {}", chunk, micro_batch);
  peak_live_ = std::max(peak_live_, live_activations());
  return out;
}

ChunkPipelineModel::Saved::iterator ChunkPipelineModel::saved_for_backward(int chunk, int micro_batch,
                                                                           const Tensor& grad, Tensor& seed) {
  auto it = activations_.find({chunk, micro_batch});
  PARALLEL_CHECK(it != activations_.end(),
                 "ChunkPipelineModel: backward of chunk {} micro-batch {} before its forward", chunk,
                 micro_batch);
  const ModelChunk& model = *chunks_[static_cast<std::size_t>(chunk)];
  if (model.post_process())
    PARALLEL_CHECK(loss_scale_.defined() && loss_scale_.numel() == 1,
                   "ChunkPipelineModel: the last chunk's backward needs a [1] loss scale (start_step)");
  seed = model.post_process() ? loss_scale_ : grad;
  return it;
}

Tensor ChunkPipelineModel::backward(int chunk, int micro_batch, const Tensor& grad) {
  Tensor seed;
  auto it = saved_for_backward(chunk, micro_batch, grad, seed);
  Tensor dx = chunks_[static_cast<std::size_t>(chunk)]->backward(seed, *it->second);
  activations_.erase(it);  // the backward freed the saved tensors; drop the rest with the object
  return dx;
}

Tensor ChunkPipelineModel::backward_input(int chunk, int micro_batch, const Tensor& grad) {
  Tensor seed;
  auto it = saved_for_backward(chunk, micro_batch, grad, seed);
  // The activations stay until the weight step: it needs the layers' inputs.
  return chunks_[static_cast<std::size_t>(chunk)]->backward_input(seed, *it->second);
}

void ChunkPipelineModel::backward_weight(int chunk, int micro_batch) {
  auto it = activations_.find({chunk, micro_batch});
  PARALLEL_CHECK(it != activations_.end(),
                 "ChunkPipelineModel: weight step of chunk {} micro-batch {} before its forward", chunk,
                 micro_batch);
  chunks_[static_cast<std::size_t>(chunk)]->backward_weight(*it->second);
  activations_.erase(it);
}

bool ChunkPipelineModel::computes_loss() const {
  return std::any_of(chunks_.begin(), chunks_.end(), [](const ModelChunk* c) { return c->post_process(); });
}

std::vector<Parameter*> ChunkPipelineModel::parameters() {
  std::vector<Parameter*> out;
  for (ModelChunk* chunk : chunks_)
    for (Parameter* p : chunk->parameters()) out.push_back(p);
  return out;
}

}  // namespace parallel::pipeline
