// What a micro-batch keeps per transformer layer for its backward (layout_search.hpp), measured by
// running the model's layers on the meta device: nothing about a layer's saved tensors is written
// here, so a layer that keeps more (dropout masks, recompute's checkpoints, a new kernel's buffers)
// is counted by running it.
#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <optional>

#include "parallel/allocator.hpp"
#include "parallel/comm_log.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/layout_search.hpp"
#include "parallel/meta_communicator.hpp"
#include "parallel/parallel_state.hpp"

namespace parallel::plan {
namespace {

// Live meta bytes a forward of the first `layers` layers (with the embedding: the chunk's input is
// the micro-batch's tokens, so the hidden states' dtype and layout are the model's own) leaves
// behind, its output included, on rank 0 of layout c.
double kept_after_forward(const Config& c, ParallelState& state, int layers) {
  Allocator& alloc = allocator_for(Device::meta());
  const ParallelConfig& p = c.parallel;
  const bool moe = c.model.num_experts > 0;
  GPTModel::Options options{.sequence_parallel = p.sequence_parallel,
                            .recompute = c.train.recompute,
                            .seed = c.train.seed,
                            .precision = c.train.precision,
                            .device = Device::meta(),
                            .expert = moe ? &state.ep() : nullptr,
                            .expert_tensor = moe ? &state.etp() : nullptr,
                            .cp = &state.cp(),
                            .context_comm = p.context_comm};
  const ChunkSpec spec{.first_layer = 0, .num_layers = layers, .pre_process = true, .post_process = false};
  GPTModel model(c.model, spec, options, state.tp());
  const int64_t b = c.train.micro_batch_size, s = c.model.seq_length / p.context;
  const Tensor tokens = Tensor::empty({b, s}, DType::I32, Device::meta());
  const auto live = [&alloc] { return static_cast<double>(alloc.stats().allocated); };
  const double before = live();
  ModelChunk::ActivationsPtr act = model.new_activations();
  const Tensor out = model.forward(tokens, Tensor(), *act, 0);
  return live() - before;
}

}  // namespace

double kept_activation_bytes_per_layer(const Config& c) {
  const ParallelConfig& p = c.parallel;
  const ModelConfig& m = c.model;
  if (m.num_layers < 2) return 0;
  const int world = p.tensor * p.pipeline * p.context * p.data;
  MetaCommunicator comm(0, world, std::make_shared<CommLog>());
  ParallelState state(comm,
                      RankGrid::from_world(world, p.tensor, p.pipeline, p.context, p.expert, p.expert_tensor),
                      Device::meta());
  // Layer j's share: the forward of layers [0, j] less that of [0, j). It holds the layer's saved
  // tensors and its output, which the next layer saves as its input or frees (either way the
  // layer's own); a stage of L such layers keeps L times it per micro-batch in flight. Dense and
  // MoE layers differ: the smaller of the two (the first layer of each kind after layer 0 is
  // measured; a kind the first 16 layers do not show leaves no floor).
  bool has_dense = false, has_expert = false;
  for (int j = 0; j < m.num_layers; ++j) (m.is_moe_layer(j) ? has_expert : has_dense) = true;
  std::map<int, double> forward;  // layers -> kept bytes
  const auto kept_by = [&](int layers) {
    auto at = forward.find(layers);
    if (at == forward.end()) at = forward.emplace(layers, kept_after_forward(c, state, layers)).first;
    return at->second;
  };
  std::optional<double> dense, expert;
  for (int j = 1; j < std::min(m.num_layers, 17) && ((has_dense && !dense) || (has_expert && !expert)); ++j) {
    std::optional<double>& kind = m.is_moe_layer(j) ? expert : dense;
    if (!kind) kind = std::max(0.0, kept_by(j + 1) - kept_by(j));
  }
  if ((has_dense && !dense) || (has_expert && !expert)) return 0;
  double kept = std::numeric_limits<double>::infinity();
  if (has_dense) kept = std::min(kept, *dense);
  if (has_expert) kept = std::min(kept, *expert);
  return kept;
}

}  // namespace parallel::plan
