#pragma once
// A model that is not GPT, built from libparallel's public parts only: a bidirectional transformer
// encoder that classifies a token sequence. Token and learned position embeddings, pre-norm layers
// (LayerNorm, non-causal multi-head attention, GeLU MLP), a final LayerNorm, mean pooling over the
// sequence and a linear head with cross-entropy over the classes.
//
// Tensor parallelism comes from the library's layers: the vocabulary and the classes are split over
// tp (VocabParallelEmbedding, a column-parallel head with tp::vocab_parallel_cross_entropy), the
// attention heads and the MLP's hidden features too (column-parallel in, row-parallel out). With
// sequence parallelism the activations between layers are [s/tp, b, h] and the replicated
// parameters that see only their sequence shard (norms, positions) are marked
// sequence_parallel_grad, which finalize_grads sums over tp.
//
// As a ModelChunk (parallel/model_chunk.hpp) it holds layers [first_layer, first_layer + count) and,
// on the first chunk, the embeddings, on the last the final norm and the head: pipeline schedules
// and DataParallel (any sharding mode) drive it without knowing what it computes. It runs the fused
// backward only, so the schedules with a split backward (zb-h1, zb-v, dualpipe-v) refuse it.
#include <cstdint>
#include <functional>
#include <memory>
#include <parallel/communicator.hpp>
#include <parallel/model_chunk.hpp>
#include <parallel/parameter.hpp>
#include <parallel/tensor_parallel.hpp>
#include <vector>

namespace encoder {

struct EncoderConfig {
  int vocab = 32;   // divisible by tp
  int seq = 8;      // divisible by tp under sequence parallelism
  int hidden = 16;  // h
  int heads = 4;    // divisible by tp
  int ffn = 32;     // MLP hidden features, divisible by tp
  int layers = 4;   // over all pipeline stages
  int classes = 4;  // divisible by tp
  float init_std = 0.2f;
  uint64_t seed = 7;  // initialisation: element i of parameter `name` is f(seed, name, i)
  bool sequence_parallel = false;
};

class EncoderChunk final : public parallel::ModelChunk {
 public:
  // tp: the tensor-parallel group (ParallelState::tp()); it must outlive the chunk.
  EncoderChunk(const EncoderConfig& config, parallel::ChunkSpec spec, parallel::Communicator& tp);
  ~EncoderChunk() override;

  bool pre_process() const override { return spec_.pre_process; }
  bool post_process() const override { return spec_.post_process; }
  ActivationsPtr new_activations() const override;
  // First chunk: input tokens [b, s] int32. Last chunk: targets [b] int32, returns the sum of the
  // b per-sample losses ([1] fp32). Otherwise returns hidden states [s(/tp), b, h].
  parallel::Tensor forward(const parallel::Tensor& input, const parallel::Tensor& targets, Activations& act,
                           uint64_t micro_batch) override;
  parallel::Tensor backward(const parallel::Tensor& grad, Activations& act) override;

  std::vector<parallel::Parameter*> parameters() override;
  std::vector<std::vector<parallel::Parameter*>> units() override;
  void set_grad_ready_hook(std::function<void(parallel::Parameter&)> hook) override {
    ready_ = std::move(hook);
  }
  void set_param_use_hook(std::function<void(parallel::Parameter&)> hook) override { use_ = std::move(hook); }
  void set_unit_hook(std::function<void(UnitPhase, const std::vector<parallel::Parameter*>&)> hook) override {
    unit_ = std::move(hook);
  }
  void set_training(bool) override {}  // no dropout
  parallel::Device device() const override { return parallel::Device::cpu(); }

 private:
  struct Layer;
  struct Saved;
  void before(UnitPhase phase, const std::vector<parallel::Parameter*>& unit);
  void after(UnitPhase phase, const std::vector<parallel::Parameter*>& unit);

  EncoderConfig config_;
  parallel::ChunkSpec spec_;
  parallel::Communicator& tp_;
  int64_t seq_local_;  // s / tp under sequence parallelism, else s
  // First chunk.
  std::unique_ptr<parallel::tp::VocabParallelEmbedding> embedding_;
  parallel::Parameter position_;  // [s, h], replicated over tp
  // Last chunk.
  parallel::Parameter final_norm_weight_, final_norm_bias_;
  std::unique_ptr<parallel::tp::ColumnParallelLinear> head_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::vector<parallel::Parameter*>> units_;
  std::function<void(parallel::Parameter&)> ready_, use_;
  std::function<void(UnitPhase, const std::vector<parallel::Parameter*>&)> unit_;
};

}  // namespace encoder
