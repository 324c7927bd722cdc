// A GPT model chunk (docs/model.md): [embedding] -> transformer layers -> [final norm, output
// layer, vocab-parallel cross-entropy]. Forward and backward of each stage sit side by side; the
// per-micro-batch state lives in Saved (its ModelChunk::Activations) so several micro-batches can be in
// flight.
#include "parallel/gpt_model.hpp"

#include <cmath>
#include <optional>

#include "dropout.hpp"
#include "mtp_layer.hpp"
#include "norm.hpp"
#include "output_layer.hpp"
#include "parallel/init.hpp"
#include "parallel/layout_rules.hpp"
#include "parallel/ops.hpp"
#include "parallel/precision.hpp"
#include "transformer_layer.hpp"

namespace parallel {

using model::LayerEnv;

int64_t padded_vocab_size(int64_t vocab_size, int tensor_parallel_size) {
  const int64_t multiple = 128 * static_cast<int64_t>(tensor_parallel_size);
  return (vocab_size + multiple - 1) / multiple * multiple;
}

struct GPTModel::Saved final : ModelChunk::Activations {
  uint64_t micro_batch = 0;
  int64_t seq = 0, batch = 0;  // full s and b of this micro-batch
  Tensor loss_mask;            // [s * b] fp32 in the activations' order, or undefined
  Tensor positions;            // packed documents' positions [b, s_local] (host), or undefined
  Tensor position_ids;         // learned positions: the ids the forward looked up, for the backward
  std::shared_ptr<const cp::Layout> layout;  // the micro-batch's cp layout (PackedSequence); null: zigzag
  tp::VocabParallelEmbedding::Context embedding;
  std::vector<model::TransformerLayer::Context> layers;
  model::Norm::Context final_norm;
  tp::LinearContext output;
  tp::CrossEntropyContext loss;
  // Multi-token prediction, one entry per depth (empty in evaluation): the layer, its final norm,
  // the shared output layer's and the loss's contexts, and the [s * b] loss mask of its targets.
  std::vector<model::MTPLayer::Context> mtp;
  std::vector<model::Norm::Context> mtp_norm;
  std::vector<tp::LinearContext> mtp_output;
  std::vector<tp::CrossEntropyContext> mtp_loss;
  std::vector<Tensor> mtp_mask;
  // Split backward: backward_input done, backward_weight not yet; the first chunk's embedding
  // gradient (after the embedding dropout) waits here for W.
  bool weight_pending = false;
  Tensor embedding_grad;
};

struct GPTModel::Impl {
  LayerEnv env;
  Options options;
  // First chunk.
  std::unique_ptr<tp::VocabParallelEmbedding> word;
  std::optional<Parameter> position;  // learned positions only
  // Every chunk.
  std::vector<std::unique_ptr<model::TransformerLayer>> layers;
  // Last chunk.
  std::unique_ptr<model::Norm> final_norm;
  std::optional<Parameter>
      output_weight;  // untied "output.weight", or the tied copy on a chunk without embedding
  std::unique_ptr<model::OutputLayer> output;
  // Multi-token prediction (last chunk, model.mtp_num_layers): one layer per depth; the word
  // embedding's copy on a last chunk that holds neither the embedding nor a tied output weight.
  std::vector<std::unique_ptr<model::MTPLayer>> mtp;
  std::optional<Parameter> mtp_embedding;
  Tensor mtp_loss_sums;  // [D] fp32, the training forwards' sums since the last reset
  std::function<void(Parameter&)> grad_ready;
  std::function<void(Parameter&)> param_use;
  std::function<void(UnitPhase, const std::vector<Parameter*>&)> unit_hook;
  std::vector<Parameter*> embedding_params() {
    std::vector<Parameter*> out{&word->weight};
    if (position) out.push_back(&*position);
    return out;
  }
  std::vector<Parameter*> output_params() {  // what the output unit reads
    std::vector<Parameter*> out = final_norm->parameters();
    out.push_back(output_weight ? &*output_weight : &word->weight);
    return out;
  }
  // The word embedding the MTP layers read: the chunk's own, else its copy (tied output weight or
  // mtp_embedding).
  Parameter* mtp_embedding_weight() {
    if (word) return &word->weight;
    return mtp_embedding ? &*mtp_embedding : &*output_weight;
  }
  Parameter* output_weight_param() { return output_weight ? &*output_weight : &word->weight; }
  std::vector<Parameter*> mtp_params(std::size_t depth) {  // what MTP depth + 1's unit reads
    std::vector<Parameter*> out = mtp[depth]->parameters();
    out.push_back(mtp_embedding_weight());
    if (output_weight_param() != mtp_embedding_weight()) out.push_back(output_weight_param());
    return out;
  }
  template <typename Params>
  void unit(UnitPhase phase, Params&& params) {
    if (unit_hook) unit_hook(phase, params());
  }
  void ready(Parameter& p) const {
    if (grad_ready) grad_ready(p);
  }
  void use(Parameter& p) const {
    if (param_use) param_use(p);
  }
  // backward() and backward_input(): one walk over the chunk's units from the loss back to the
  // embedding (first: this chunk holds the embedding, last: the output layer and loss).
  Tensor walk_backward(const Tensor& grad, Saved& act, bool first, bool last, model::BackwardMode mode);
  // The embedding's backward from the gradient of its output (after its dropout): all weight step.
  void embedding_backward(Saved& act, const Tensor& dx);
  // Multi-token prediction on the last chunk: the depths' forward from the last layer's output h0
  // (their loss sums go to mtp_loss_sums), and their backward walk from `grad` (the main loss
  // sum's), returning d(h0) (undefined when the forward ran none).
  void mtp_forward(const Tensor& h0, const Tensor& targets, Saved& act, const PackedSequence& packed);
  Tensor mtp_backward(const Tensor& grad, Saved& act, model::BackwardMode mode);
  void mtp_backward_weight(Saved& act);
};

GPTModel::GPTModel(const ModelConfig& config, ChunkSpec spec, Options options, Communicator& tp)
    : impl_(std::make_unique<Impl>()), config_(config), spec_(spec) {
  // On meta the parameters are born on the meta allocator and init skips them (no values): the host
  // pays nothing, so a model bigger than the host can be planned. Elsewhere they start on the host.
  std::optional<ParameterDeviceScope> on_meta;
  if (options.device.is_meta()) on_meta.emplace(Device::meta());
  // LoRA: every parameter but the adapters is frozen and is built without a gradient.
  FrozenParameterScope frozen(config.lora.enabled());
  const int p = tp.size();
  LayerEnv& env = impl_->env;
  env.config = &config_;
  env.tp = &tp;
  env.sequence_parallel = options.sequence_parallel && p > 1;
  env.cp = options.cp;
  env.context_comm = options.context_comm;
  env.seed = options.seed;
  env.activation_dtype = compute_dtype(options.precision);
  env.ep = options.expert;
  env.etp = options.expert_tensor;
  env.hidden = config.hidden_size;
  env.heads = config.num_attention_heads;
  env.groups = config.num_query_groups > 0 ? config.num_query_groups : config.num_attention_heads;
  env.ffn = config.ffn_hidden_size > 0 ? config.ffn_hidden_size : 4 * config.hidden_size;
  // The layout rules validate_config checks, for the communicators actually given (same messages).
  check_layout(config, env.layout());
  env.head_dim = config.attention_head_dim();
  impl_->options = options;
  vocab_padded_ = padded_vocab_size(config.vocab_size, p);
  const float std = static_cast<float>(config.init_std);
  // proj and fc2 feed the residual stream: scaled down by sqrt(2L) (GPT-2).
  const float out_std = std / std::sqrt(2.0f * static_cast<float>(config.num_layers));
  const bool tied = config.tie_embeddings;

  if (spec.pre_process) {
    impl_->word = std::make_unique<tp::VocabParallelEmbedding>("embedding.word.weight", vocab_padded_,
                                                               env.hidden, env.sequence_parallel, tp);
    // Tied weights on a chunk that does not also hold the output layer are kept in sync with the
    // last stage's copy over the embedding group.
    // Multi-token prediction reads the embedding on the last stage too, tied or not.
    impl_->word->weight.shared_across_pipeline = (tied || config.mtp_num_layers > 0) && !spec.post_process;
    impl_->word->weight.unpadded_rows = config.vocab_size;
    init_normal(impl_->word->weight, options.seed, std);
    if (config.position_embedding == PositionEmbedding::Learned) {
      const int64_t max_pos =
          config.max_position_embeddings > 0 ? config.max_position_embeddings : config.seq_length;
      Parameter& pos = impl_->position.emplace();
      pos.name = "embedding.position.weight";
      pos.value = Tensor::zeros({max_pos, env.hidden}, DType::F32, parameter_device());
      pos.grad = parameter_grad({max_pos, env.hidden});
      pos.global_shape = {max_pos, env.hidden};
      pos.sequence_parallel_grad = env.sequence_parallel;  // each rank adds only its s-shard's rows
      init_normal(pos, options.seed, std);
    }
  }
  for (int i = 0; i < spec.num_layers; ++i) {
    auto layer = std::make_unique<model::TransformerLayer>(
        env, model::layer_spec(config_, spec.first_layer + i), options.recompute);
    for (Parameter* param : layer->parameters()) {
      const bool is_weight =
          param->name.ends_with(".weight") && param->name.find("norm") == std::string::npos;
      if (!is_weight) continue;  // norms start at 1 / 0 and biases at 0 (set by the layers)
      if (param->name.find(".lora_") != std::string::npos) continue;  // LoRA: below
      // Dense MLP, shared and routed experts all end in fc2.
      const bool residual =
          param->name.ends_with("attention.proj.weight") || param->name.ends_with("fc2.weight");
      init_normal(*param, options.seed, residual ? out_std : std);
    }
    impl_->layers.push_back(std::move(layer));
  }
  if (spec.post_process) {
    impl_->final_norm = std::make_unique<model::Norm>(env, "final_norm");
    Parameter* out_weight = nullptr;
    if (tied && spec.pre_process) {
      out_weight = &impl_->word->weight;
    } else {
      const int64_t rows = vocab_padded_ / p;
      Parameter& w = impl_->output_weight.emplace();
      w.name = tied ? "embedding.word.weight" : "output.weight";
      w.value = Tensor::zeros({rows, env.hidden}, DType::F32, parameter_device());
      w.grad = parameter_grad({rows, env.hidden});
      w.global_shape = {vocab_padded_, env.hidden};
      w.partition_dim = 0;
      w.partition_offset = tp.rank() * rows;
      w.shared_across_pipeline = tied;
      w.pipeline_copy = tied;
      w.unpadded_rows = config.vocab_size;
      // Same name and seed as the first stage's embedding: the layout-independent init makes the
      // two copies equal without any communication.
      init_normal(w, options.seed, std);
      out_weight = &w;
    }
    impl_->output = std::make_unique<model::OutputLayer>(env, out_weight);
    if (config.mtp_num_layers > 0 && !spec.pre_process && !tied) {
      // The embedding's copy for the MTP layers, kept equal to the first stage's as a tied output
      // weight is: same name and init, gradients summed over the embedding group (finalize_grads).
      const int64_t rows = vocab_padded_ / p;
      Parameter& w = impl_->mtp_embedding.emplace();
      w.name = "embedding.word.weight";
      w.value = Tensor::zeros({rows, env.hidden}, DType::F32, parameter_device());
      w.grad = parameter_grad({rows, env.hidden});
      w.global_shape = {vocab_padded_, env.hidden};
      w.partition_dim = 0;
      w.partition_offset = tp.rank() * rows;
      w.shared_across_pipeline = true;
      w.pipeline_copy = true;
      w.unpadded_rows = config.vocab_size;
      init_normal(w, options.seed, std);
    }
    for (int depth = 1; depth <= config.mtp_num_layers; ++depth) {
      auto layer =
          std::make_unique<model::MTPLayer>(env, depth, impl_->mtp_embedding_weight(), options.recompute);
      for (Parameter* param : layer->parameters()) {
        if (!param->name.ends_with(".weight") || param->name.find("norm") != std::string::npos) continue;
        const bool residual =
            param->name.ends_with("attention.proj.weight") || param->name.ends_with("fc2.weight");
        init_normal(*param, options.seed, residual ? out_std : std);
      }
      impl_->mtp.push_back(std::move(layer));
    }
  }
  if (config.lora.enabled()) {
    // LoRA (docs/lora.md): A as PEFT's kaiming_uniform_(a = sqrt(5)), i.e. uniform in
    // +-1/sqrt(in_features), B zero, so the adapted model starts as the base model. Everything else
    // is frozen: no gradient, so no gradient buffer, main copy or optimizer state either.
    for (Parameter* param : parameters()) {
      if (param->name.ends_with(".lora_A.weight")) {
        const float bound = 1.0f / std::sqrt(static_cast<float>(param->global_shape.back()));
        init_uniform(*param, options.seed, -bound, bound);
      } else if (!param->name.ends_with(".lora_B.weight")) {
        param->frozen = true;
        param->grad = Tensor();
      }
    }
  }
  // Layers read their weights through the Parameter objects at every call, so casting or moving
  // the tensors here changes the model. Init ran in fp32 (layout-independent); the 16-bit copy is
  // its rounding, and the optimizer's fp32 main weights start from that copy.
  cast_parameters(parameters(), env.activation_dtype);
  // Fused parts (gate|up of SwiGLU, a MoE expert's gate|up) stay back to back on the device.
  if (!options.device.is_cpu()) move_parameters(parameters(), options.device);
}

GPTModel::~GPTModel() = default;

ModelChunk::ActivationsPtr GPTModel::new_activations() const { return std::make_unique<Saved>(); }

namespace {

// The chunk's own activations (a chunk is only ever given those it made).
GPTModel::Saved& saved(ModelChunk::Activations& act) {
  auto* own = dynamic_cast<GPTModel::Saved*>(&act);
  PARALLEL_CHECK(own != nullptr, "GPTModel: given the activations of another kind of chunk");
  return *own;
}

}  // namespace

std::vector<Parameter*> GPTModel::parameters() {
  std::vector<Parameter*> out;
  if (impl_->word) out.push_back(&impl_->word->weight);
  if (impl_->position) out.push_back(&*impl_->position);
  for (auto& layer : impl_->layers)
    for (Parameter* p : layer->parameters()) out.push_back(p);
  if (impl_->final_norm)
    for (Parameter* p : impl_->final_norm->parameters()) out.push_back(p);
  if (impl_->output_weight) out.push_back(&*impl_->output_weight);
  if (impl_->mtp_embedding) out.push_back(&*impl_->mtp_embedding);
  for (auto& layer : impl_->mtp)
    for (Parameter* p : layer->parameters()) out.push_back(p);
  return out;
}

const Tensor& GPTModel::mtp_loss_sums() const { return impl_->mtp_loss_sums; }
void GPTModel::reset_mtp_loss_sums() { impl_->mtp_loss_sums = Tensor(); }

void GPTModel::set_training(bool training) { impl_->env.training = training; }
void GPTModel::set_moe_loss_scale(double scale) { impl_->env.moe_loss_scale = scale; }

GPTModel::MoEStatistics GPTModel::moe_statistics() const {
  MoEStatistics out;
  std::vector<model::MoELayer*> moes;
  for (const auto& layer : impl_->layers) moes.push_back(layer->moe());
  for (const auto& layer : impl_->mtp) moes.push_back(layer->moe());
  for (model::MoELayer* moe : moes) {
    if (moe == nullptr) continue;
    const model::MoEStats& s = moe->stats();
    out.aux_loss += s.aux_loss + s.seq_aux_loss;
    out.z_loss += s.z_loss;
    out.calls += s.calls;
    out.dropped += s.dropped;
    if (out.tokens_per_expert.empty()) out.tokens_per_expert.assign(s.tokens_per_expert.size(), 0);
    for (std::size_t e = 0; e < s.tokens_per_expert.size(); ++e)
      out.tokens_per_expert[e] += s.tokens_per_expert[e];
  }
  return out;
}

void GPTModel::reset_moe_statistics() {
  std::vector<model::MoELayer*> moes;
  for (const auto& layer : impl_->layers) moes.push_back(layer->moe());
  for (const auto& layer : impl_->mtp) moes.push_back(layer->moe());
  for (model::MoELayer* moe : moes)
    if (moe != nullptr) {
      model::MoEStats& s = moe->stats();
      const std::size_t n = s.tokens_per_expert.size();
      s = model::MoEStats{};
      s.tokens_per_expert.assign(n, 0);
    }
}

std::vector<Parameter*> GPTModel::router_buffers() {
  std::vector<Parameter*> out;
  for (auto& layer : impl_->layers)
    if (model::MoELayer* moe = layer->moe(); moe != nullptr && moe->gate.bias.value.defined())
      out.push_back(&moe->gate.bias);
  for (auto& layer : impl_->mtp)  // after the chunk's layers (the trainer's metrics read those first)
    if (model::MoELayer* moe = layer->moe(); moe != nullptr && moe->gate.bias.value.defined())
      out.push_back(&moe->gate.bias);
  return out;
}

void GPTModel::update_router_bias(const std::vector<GPTModel*>& chunks, Communicator& world) {
  if (chunks.empty() || !chunks.front()->config_.moe_router_expert_bias) return;
  const ModelConfig& c = chunks.front()->config_;
  const int64_t E = c.num_experts;
  // Every layer's loads in one vector by global layer index: a rank adds those of the layers it
  // holds (its tokens' share), so the sum holds each layer's loads over the ranks that routed its
  // tokens (dp, cp, the tp shards under sp; every pipeline stage its own layers). Ranks that see
  // the same tokens (tp without sp) count them alike, which scales every expert's load and the
  // mean the same: the sign does not change. Integers, so the sum is exact in any order.
  // The MTP layers continue the numbering (layers num_layers .. num_layers + D - 1).
  Tensor load = Tensor::zeros({(c.num_layers + c.mtp_num_layers) * E}, DType::I64);
  const auto each_moe = [&](auto&& fn) {
    for (GPTModel* chunk : chunks) {
      for (int i = 0; i < chunk->spec_.num_layers; ++i)
        if (model::MoELayer* moe = chunk->impl_->layers[static_cast<std::size_t>(i)]->moe())
          fn(*moe, chunk->spec_.first_layer + i);
      for (std::size_t k = 0; k < chunk->impl_->mtp.size(); ++k)
        if (model::MoELayer* moe = chunk->impl_->mtp[k]->moe()) fn(*moe, c.num_layers + static_cast<int>(k));
    }
  };
  int64_t* l = load.data<int64_t>();
  each_moe([&](model::MoELayer& moe, int layer) {
    std::copy(moe.gate.load().begin(), moe.gate.load().end(), l + layer * E);
  });
  world.all_reduce(load);
  l = load.data<int64_t>();
  each_moe([&](model::MoELayer& moe, int layer) {
    const int64_t* mine = l + layer * E;
    moe.gate.update_bias(std::vector<int64_t>(mine, mine + E));
  });
}

void GPTModel::reset_router_load() {
  for (auto& layer : impl_->layers)
    if (model::MoELayer* moe = layer->moe()) std::fill(moe->gate.load().begin(), moe->gate.load().end(), 0);
  for (auto& layer : impl_->mtp)
    if (model::MoELayer* moe = layer->moe()) std::fill(moe->gate.load().begin(), moe->gate.load().end(), 0);
}

Device GPTModel::device() const { return impl_->options.device; }

void GPTModel::set_grad_ready_hook(std::function<void(Parameter&)> hook) {
  impl_->grad_ready = std::move(hook);
}

void GPTModel::set_param_use_hook(std::function<void(Parameter&)> hook) {
  impl_->param_use = std::move(hook);
}

void GPTModel::set_unit_hook(std::function<void(UnitPhase, const std::vector<Parameter*>&)> hook) {
  impl_->unit_hook = std::move(hook);
}

std::vector<std::vector<Parameter*>> GPTModel::units() {
  std::vector<std::vector<Parameter*>> out;
  if (impl_->word) out.push_back(impl_->embedding_params());
  for (auto& layer : impl_->layers) out.push_back(layer->parameters());
  if (impl_->final_norm) {
    out.push_back(impl_->final_norm->parameters());
    if (impl_->output_weight) out.back().push_back(&*impl_->output_weight);
  }
  for (std::size_t k = 0; k < impl_->mtp.size(); ++k) {
    std::vector<Parameter*>& unit = out.emplace_back();
    // The embedding's copy (if any) goes with the first MTP layer, which reads it first.
    if (k == 0 && impl_->mtp_embedding) unit.push_back(&*impl_->mtp_embedding);
    for (Parameter* p : impl_->mtp[k]->parameters()) unit.push_back(p);
  }
  return out;
}

namespace {

// targets [b, s] -> [s * b] in the activations' (s, b) order.
Tensor targets_sb(const Tensor& targets) {
  const int64_t b = targets.size(0), s = targets.size(1);
  Tensor t = targets.contiguous();
  Tensor out = Tensor::empty({s, b}, DType::I32, targets.device());
  for (int64_t i = 0; i < b; ++i) {
    Tensor column = out.narrow(1, i, 1);
    column.copy_(t.select(i).view({s, 1}));
  }
  return out.view({s * b});
}

// Row r of x [s_local(/tp), b, h], batch entry e, of a packed micro-batch has its own position
// positions[e, row0 + r] (row0: the sp shard's first row of this rank's cp share).
int64_t packed_row0(const LayerEnv& env, int64_t s_local) {
  const bool sharded = env.sequence_parallel && env.tp->size() > 1;
  return sharded ? env.tp->rank() * s_local : 0;
}
// The position ids [b, s_local] int32 of x's rows, on `device`: each row's global position
// (LayerEnv::positions), or with packed documents each token's own (reset) position. The learned
// table is then an embedding looked up by these ids, as Megatron does with its position_ids: two
// ops per micro-batch whatever the sequence length (one op per row would make a meta run, and the
// memory plan with it, grow with the sequence). On meta the ids have a shape and no values.
Tensor position_ids(const LayerEnv& env, int64_t s, int64_t b, const Tensor& packed, const cp::Layout* layout,
                    Device device) {
  if (device.is_meta()) return Tensor::empty({b, s}, DType::I32, device);
  Tensor ids = Tensor::empty({b, s}, DType::I32, Device::cpu());
  int32_t* out = ids.data<int32_t>();
  if (packed.defined()) {
    const int64_t row0 = packed_row0(env, s), stride = packed.size(1);
    const Tensor host = packed.device().is_cpu() ? packed.contiguous() : packed.to(Device::cpu());
    const int32_t* pos = host.data<int32_t>();
    for (int64_t e = 0; e < b; ++e)
      for (int64_t r = 0; r < s; ++r) out[e * s + r] = pos[e * stride + row0 + r];
  } else {
    for (const cp::Segment& seg : env.positions(s, layout))
      for (int64_t i = 0; i < seg.rows; ++i)
        for (int64_t e = 0; e < b; ++e) out[e * s + seg.row + i] = static_cast<int32_t>(seg.position + i);
  }
  return device.is_cpu() ? ids : ids.to(device);
}
// x [s_local, b, h] += table[ids]; the backward adds dy's rows into dtable's (embedding_backward
// accumulates).
void add_positions(const Tensor& ids, Tensor& x, const Tensor& table) {
  Tensor rows = Tensor::empty(x.shape(), x.dtype(), x.device());
  ops::embedding_forward(ids, table, 0, rows);
  ops::add_(x, rows);
}
void positions_backward(const Tensor& ids, const Tensor& dy, Tensor& dtable) {
  ops::embedding_backward(ids, dy, 0, dtable);
}

// [b, s] fp32 -> [s * b] in the activations' (s, b) order.
Tensor mask_sb(const Tensor& mask) {
  const int64_t b = mask.size(0), s = mask.size(1);
  Tensor t = mask.contiguous();
  Tensor out = Tensor::empty({s, b}, DType::F32, mask.device());
  for (int64_t i = 0; i < b; ++i) {
    Tensor column = out.narrow(1, i, 1);
    column.copy_(t.select(i).view({s, 1}));
  }
  return out.view({s * b});
}

}  // namespace

Tensor GPTModel::forward(const Tensor& input, const Tensor& targets, Activations& activations,
                         uint64_t micro_batch) {
  return forward(input, targets, activations, micro_batch, PackedSequence{});
}

Tensor GPTModel::forward(const Tensor& input, const Tensor& targets, Activations& activations,
                         uint64_t micro_batch, const PackedSequence& packed) {
  Saved& act = saved(activations);
  Impl& m = *impl_;
  const LayerEnv& env = m.env;
  const int p = env.tp->size();
  act.micro_batch = micro_batch;
  act.positions = packed.positions;
  act.layout = packed.layout;
  Tensor x;
  if (spec_.pre_process) {
    PARALLEL_CHECK(input.dim() == 2 && input.dtype() == DType::I32,
                   "GPTModel: tokens {} must be [b, s] int32", input.str());
    act.batch = input.size(0);
    act.seq = input.size(1);
    m.unit(UnitPhase::BeforeForward, [&] { return m.embedding_params(); });
    m.use(m.word->weight);
    x = m.word->forward(input, act.embedding);  // [s(/tp), b, h], reduced over tp
    if (m.position) {
      PARALLEL_CHECK(act.seq * env.cp_size() <= m.position->value.size(0),
                     "GPTModel: sequence {} exceeds {} positions", act.seq * env.cp_size(),
                     m.position->value.size(0));
      // Added after the tp reduction: each rank adds the positions of its own s-shard.
      m.use(*m.position);
      act.position_ids =
          position_ids(env, x.size(0), x.size(1), packed.positions, act.layout.get(), x.device());
      add_positions(act.position_ids, x, m.position->value);
    }
    // The embedding output (word + position, after the tp reduction) is a bf16 tensor on the GPU.
    x = model::dropout_forward(env, x, {-1, 0}, micro_batch, act.layout.get());
    m.unit(UnitPhase::AfterForward, [&] { return m.embedding_params(); });
  } else {
    x = input;
    act.seq = input.size(0) * (env.sequence_parallel ? p : 1);
    act.batch = input.size(1);
  }
  if (act.layout != nullptr)
    PARALLEL_CHECK(act.layout->cp_size() == env.cp_size() && act.layout->local_length() == act.seq,
                   "GPTModel: a cp layout of {} tokens over {} ranks does not fit {} local tokens at cp = {}",
                   act.layout->seq(), act.layout->cp_size(), act.seq, env.cp_size());
  act.layers.resize(m.layers.size());
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    const auto params = [&] { return m.layers[i]->parameters(); };
    m.unit(UnitPhase::BeforeForward, params);
    for (Parameter* p : m.layers[i]->parameters()) m.use(*p);
    act.layers[i].positions = packed.positions;
    act.layers[i].doc_start = packed.doc_start;
    act.layers[i].layout = packed.layout;
    x = m.layers[i]->forward(x, act.layers[i], micro_batch);
    m.unit(UnitPhase::AfterForward, params);
  }
  if (!spec_.post_process) return x;

  const auto output_params = [&] { return m.output_params(); };
  m.unit(UnitPhase::BeforeForward, output_params);
  for (Parameter* p : m.final_norm->parameters()) m.use(*p);
  Tensor y = m.final_norm->forward(x, act.final_norm);
  // A weight tied to this chunk's own embedding was already used by the lookup above.
  if (m.output_weight) m.use(*m.output_weight);
  Tensor logits = m.output->forward(y, act.output);  // [s, b, Vp/tp]
  const int64_t n = act.seq * act.batch, v_local = logits.size(-1);
  PARALLEL_CHECK(targets.dim() == 2 && targets.size(0) == act.batch && targets.size(1) == act.seq,
                 "GPTModel: targets {} must be [b, s] = [{}, {}]", targets.str(), act.batch, act.seq);
  Tensor losses = tp::vocab_parallel_cross_entropy(*env.tp, logits.view({n, v_local}), targets_sb(targets),
                                                   env.tp->rank() * v_local, config_.vocab_size, act.loss);
  // The sum over tokens as a column sum of [n, 1]: stays on the device, no extra op needed.
  Tensor total = Tensor::zeros({1}, DType::F32, losses.device());
  if (packed.loss_mask.defined()) {
    // data.eod_mask_loss: sum_i mask_i loss_i as a [1, n] x [n, 1] product.
    PARALLEL_CHECK(packed.loss_mask.dim() == 2 && packed.loss_mask.size(0) == act.batch &&
                       packed.loss_mask.size(1) == act.seq && packed.loss_mask.dtype() == DType::F32,
                   "GPTModel: loss mask {} must be fp32 [b, s] = [{}, {}]", packed.loss_mask.str(), act.batch,
                   act.seq);
    act.loss_mask = mask_sb(packed.loss_mask);
    Tensor out = total.view({1, 1});
    ops::gemm(losses.view({1, n}), false, act.loss_mask.view({n, 1}), false, out);
  } else {
    ops::bias_backward(losses.view({n, 1}), total);
  }
  m.unit(UnitPhase::AfterForward, output_params);
  // Evaluation reports the main loss only: the MTP layers run when training.
  if (!m.mtp.empty() && env.training) m.mtp_forward(x, targets, act, packed);
  return total;
}

MTPTargets mtp_targets(const Tensor& targets, int depths) {
  PARALLEL_CHECK(targets.dim() == 2 && targets.dtype() == DType::I32 && depths >= 1,
                 "mtp_targets: targets {} must be [b, S] int32, depths {} >= 1", targets.str(), depths);
  const int64_t b = targets.size(0), S = targets.size(1), D = depths;
  MTPTargets out;
  if (targets.device().is_meta()) {
    out.targets = Tensor::empty({D, b, S}, DType::I32, targets.device());
    out.mask = Tensor::empty({D, b, S}, DType::F32, targets.device());
    return out;
  }
  PARALLEL_CHECK(targets.device().is_cpu(), "mtp_targets: targets {} must be on the host", targets.str());
  out.targets = Tensor::zeros({D, b, S}, DType::I32);
  out.mask = Tensor::zeros({D, b, S}, DType::F32);
  const Tensor t = targets.contiguous();
  const int32_t* in = t.data<int32_t>();
  int32_t* shifted = out.targets.data<int32_t>();
  float* mask = out.mask.data<float>();
  for (int64_t k = 1; k <= D; ++k)
    for (int64_t e = 0; e < b; ++e)
      for (int64_t i = 0; i + k < S; ++i) {
        const int64_t at = ((k - 1) * b + e) * S + i;
        shifted[at] = in[e * S + i + k];
        mask[at] = 1.0f;
      }
  return out;
}

void GPTModel::Impl::mtp_forward(const Tensor& h0, const Tensor& targets, Saved& act,
                                 const PackedSequence& packed) {
  const int64_t D = static_cast<int64_t>(mtp.size());
  // A loss mask or documents would have to shift with each depth (validate_config refuses them).
  PARALLEL_CHECK(!packed.loss_mask.defined() && !packed.doc_start.defined() && !packed.positions.defined(),
                 "GPTModel: multi-token prediction does not shift loss masks or documents yet");
  Tensor shifted = packed.mtp_targets, mask = packed.mtp_mask;
  if (!shifted.defined()) {
    // On meta (the memory plan's synthetic micro-batches) only the shapes matter.
    const Device dev = targets.device();
    PARALLEL_CHECK(env.cp_size() == 1 || dev.is_meta(),
                   "GPTModel: multi-token prediction under context parallelism needs the micro-batch's "
                   "PackedSequence::mtp_targets, cut from the whole sequence");
    const bool host = dev.is_cpu() || dev.is_meta();
    MTPTargets t = mtp_targets(host ? targets : targets.to(Device::cpu()), static_cast<int>(D));
    shifted = host ? t.targets : t.targets.to(dev);
    mask = host ? t.mask : t.mask.to(dev);
  }
  PARALLEL_CHECK(shifted.dim() == 3 && shifted.size(0) == D && shifted.size(1) == act.batch &&
                     shifted.size(2) == act.seq && mask.defined() && mask.shape() == shifted.shape(),
                 "GPTModel: mtp targets {} and mask {} must be [D, b, s] = [{}, {}, {}]", shifted.str(),
                 mask.str(), D, act.batch, act.seq);
  if (!mtp_loss_sums.defined()) mtp_loss_sums = Tensor::zeros({D}, DType::F32, h0.device());
  const std::size_t depths = mtp.size();
  act.mtp.resize(depths);
  act.mtp_norm.resize(depths);
  act.mtp_output.resize(depths);
  act.mtp_loss.resize(depths);
  act.mtp_mask.resize(depths);
  const int64_t n = act.seq * act.batch;
  Tensor h = h0;
  for (std::size_t k = 0; k < depths; ++k) {
    const auto params = [&] { return mtp_params(k); };
    unit(UnitPhase::BeforeForward, params);
    if (k == 0 && mtp_embedding) use(*mtp_embedding);
    for (Parameter* p : mtp[k]->parameters()) use(*p);
    // Depth k + 1 embeds t_{i+k+1}: the targets at depth 1, then the previous depth's targets.
    const Tensor tokens = k == 0 ? targets : shifted.select(static_cast<int64_t>(k) - 1);
    model::MTPLayer::Context& ctx = act.mtp[k];
    ctx.layer.positions = packed.positions;
    ctx.layer.doc_start = packed.doc_start;
    ctx.layer.layout = packed.layout;
    h = mtp[k]->forward(h, ctx, tokens, act.micro_batch);
    const Tensor y = mtp[k]->norm.forward(h, act.mtp_norm[k]);
    const Tensor logits = output->forward(y, act.mtp_output[k]);  // [s, b, Vp/tp]
    const int64_t v_local = logits.size(-1);
    const Tensor losses = tp::vocab_parallel_cross_entropy(
        *env.tp, logits.view({n, v_local}), targets_sb(shifted.select(static_cast<int64_t>(k))),
        env.tp->rank() * v_local, env.config->vocab_size, act.mtp_loss[k]);
    act.mtp_mask[k] = mask_sb(mask.select(static_cast<int64_t>(k)));
    Tensor sum = mtp_loss_sums.narrow(0, static_cast<int64_t>(k), 1).view({1, 1});
    ops::gemm(losses.view({1, n}), false, act.mtp_mask[k].view({n, 1}), false, sum, 1.0f, 1.0f);
    unit(UnitPhase::AfterForward, params);
  }
}

// From the last depth back to the first: each depth's loss seeds its output layer and norm, whose
// input gradient joins the one the next depth's layer passed back.
Tensor GPTModel::Impl::mtp_backward(const Tensor& grad, Saved& act, model::BackwardMode mode) {
  if (act.mtp.empty()) return Tensor();
  const bool fused = mode == model::BackwardMode::Fused;
  const std::size_t depths = act.mtp.size();
  const double D = static_cast<double>(depths), S = static_cast<double>(act.seq * env.cp_size());
  const int64_t n = act.seq * act.batch;
  Tensor dh;
  for (std::size_t k = depths; k-- > 0;) {
    const auto params = [&] { return mtp_params(k); };
    unit(UnitPhase::BeforeBackward, params);
    // d(objective)/d(loss_i) of depth k + 1: the main loss's seed times factor / D, over the
    // B (S - k - 1) targets of the global batch where the main loss has B S.
    const double depth = static_cast<double>(k + 1);
    const float weight = static_cast<float>(env.config->mtp_loss_scaling_factor / D * S / (S - depth));
    Tensor grad_loss = Tensor::zeros({n, 1}, DType::F32, grad.device());
    ops::gemm(act.mtp_mask[k].view({n, 1}), false, grad.view({1, 1}), false, grad_loss, weight, 0.0f);
    const Tensor dlogits = tp::vocab_parallel_cross_entropy_backward(grad_loss.view({n}), act.mtp_loss[k]);
    const Tensor dy = model::backward_step(*output, dlogits, act.mtp_output[k], mode);
    Tensor dhk = model::backward_step(mtp[k]->norm, dy, act.mtp_norm[k], mode);
    if (dh.defined()) ops::add_(dhk, dh);
    dh = model::backward_step(*mtp[k], dhk, act.mtp[k], mode);
    if (fused) {
      for (Parameter* p : mtp[k]->parameters()) ready(*p);
      if (k == 0 && mtp_embedding) ready(*mtp_embedding);
    }
    unit(UnitPhase::AfterBackward, params);
  }
  act.mtp_mask.clear();
  act.mtp_loss.clear();
  if (fused) {
    act.mtp.clear();
    act.mtp_norm.clear();
    act.mtp_output.clear();
  }
  return dh;
}

// backward_weight()'s part for the MTP layers, in mtp_backward's order.
void GPTModel::Impl::mtp_backward_weight(Saved& act) {
  for (std::size_t k = act.mtp.size(); k-- > 0;) {
    const auto params = [&] { return mtp_params(k); };
    unit(UnitPhase::BeforeBackward, params);
    output->backward_weight(act.mtp_output[k]);
    mtp[k]->norm.backward_weight(act.mtp_norm[k]);
    mtp[k]->backward_weight(act.mtp[k]);
    for (Parameter* p : mtp[k]->parameters()) ready(*p);
    if (k == 0 && mtp_embedding) ready(*mtp_embedding);
    unit(UnitPhase::AfterBackward, params);
  }
  act.mtp.clear();
  act.mtp_norm.clear();
  act.mtp_output.clear();
}

namespace {

// d(loss sum)/d(loss_i) = grad for every token: the [1] seed broadcast on the device (a bias added
// to a zero column) so the host never reads the scale.
Tensor per_token_loss_grad(const Tensor& grad, const GPTModel::Saved& act, const char* who) {
  PARALLEL_CHECK(grad.numel() == 1, "{}: the last chunk takes a [1] gradient, got {}", who, grad.str());
  const int64_t n = act.seq * act.batch;
  Tensor grad_loss = Tensor::zeros({n, 1}, DType::F32, grad.device());
  if (act.loss_mask.defined()) {  // d(sum_i mask_i loss_i)/d(loss_i) = mask_i
    ops::gemm(act.loss_mask.view({n, 1}), false, grad.view({1, 1}), false, grad_loss);
    return grad_loss.view({n});
  }
  ops::add_bias(grad_loss, grad.view({1}));
  return grad_loss.view({n});
}

}  // namespace

// Fused (backward()): every unit's B and W; the grad-ready hook fires after each unit's last
// contribution. InputOnly (backward_input()): every unit's B; what their W steps need stays in
// `act`, with the embedding's whole backward, until backward_weight().
Tensor GPTModel::Impl::walk_backward(const Tensor& grad, Saved& act, bool first, bool last,
                                     model::BackwardMode mode) {
  const bool fused = mode == model::BackwardMode::Fused;
  Tensor dx;
  if (last) {
    const Tensor grad_loss =
        per_token_loss_grad(grad, act, fused ? "GPTModel::backward" : "GPTModel::backward_input");
    // The MTP depths first: the output weight's last contribution is then the main loss's.
    const Tensor dh_mtp = mtp_backward(grad, act, mode);
    const auto params = [&] { return output_params(); };
    unit(UnitPhase::BeforeBackward, params);
    Tensor dlogits = tp::vocab_parallel_cross_entropy_backward(grad_loss, act.loss);
    // The loss is computed in fp32 from the bf16 logits; the gradient goes back as bf16 logits' grad.
    dx = model::backward_step(*output, dlogits, act.output, mode);
    // A weight tied to this chunk's own embedding gets its last contribution there, below.
    if (fused && output_weight) ready(*output_weight);
    dx = model::backward_step(*final_norm, dx, act.final_norm, mode);
    if (fused)
      for (Parameter* p : final_norm->parameters()) ready(*p);
    unit(UnitPhase::AfterBackward, params);
    if (dh_mtp.defined()) ops::add_(dx, dh_mtp);
  } else {
    dx = grad;
  }
  for (std::size_t i = layers.size(); i-- > 0;) {
    const auto params = [&] { return layers[i]->parameters(); };
    unit(UnitPhase::BeforeBackward, params);
    dx = model::backward_step(*layers[i], dx, act.layers[i], mode);
    if (fused)
      for (Parameter* p : layers[i]->parameters()) ready(*p);
    unit(UnitPhase::AfterBackward, params);
  }
  if (fused) act.layers.clear();
  if (!first) return dx;
  if (!fused) {
    // The embedding has no input gradient: everything from here on is its weight step.
    act.embedding_grad = model::dropout_backward(env, dx, {-1, 0}, act.micro_batch, act.layout.get());
    return Tensor();
  }
  unit(UnitPhase::BeforeBackward, [&] { return embedding_params(); });
  dx = model::dropout_backward(env, dx, {-1, 0}, act.micro_batch, act.layout.get());
  embedding_backward(act, dx);
  unit(UnitPhase::AfterBackward, [&] { return embedding_params(); });
  return Tensor();
}

void GPTModel::Impl::embedding_backward(Saved& act, const Tensor& dx) {
  if (position) {
    if (!position->frozen) positions_backward(act.position_ids, dx, position->grad);
    ready(*position);
  }
  if (!word->weight.frozen) word->backward(dx, act.embedding);
  ready(word->weight);
}

Tensor GPTModel::backward(const Tensor& grad, Activations& activations) {
  return impl_->walk_backward(grad, saved(activations), spec_.pre_process, spec_.post_process,
                              model::BackwardMode::Fused);
}

// backward() split at the weight gradients.
Tensor GPTModel::backward_input(const Tensor& grad, Activations& activations) {
  Saved& act = saved(activations);
  PARALLEL_CHECK(!act.weight_pending, "GPTModel::backward_input: micro-batch {} already ran its input step",
                 act.micro_batch);
  act.weight_pending = true;
  return impl_->walk_backward(grad, act, spec_.pre_process, spec_.post_process,
                              model::BackwardMode::InputOnly);
}

// Each unit's weight step in backward()'s order, so a weight tied to this chunk's embedding gets
// its contributions in the same order as there; the grad-ready hook fires as in backward().
// The unit hooks bracket W too: it writes the gradients (which sharded data parallelism
// materialises at BeforeBackward) and reads no parameter values.
void GPTModel::backward_weight(Activations& activations) {
  Saved& act = saved(activations);
  Impl& m = *impl_;
  PARALLEL_CHECK(act.weight_pending, "GPTModel::backward_weight of micro-batch {} before its backward_input",
                 act.micro_batch);
  act.weight_pending = false;
  if (spec_.post_process) {
    m.mtp_backward_weight(act);
    const auto output_params = [&] { return m.output_params(); };
    m.unit(UnitPhase::BeforeBackward, output_params);
    m.output->backward_weight(act.output);
    if (m.output_weight) m.ready(*m.output_weight);
    m.final_norm->backward_weight(act.final_norm);
    for (Parameter* p : m.final_norm->parameters()) m.ready(*p);
    m.unit(UnitPhase::AfterBackward, output_params);
  }
  for (std::size_t i = m.layers.size(); i-- > 0;) {
    const auto params = [&] { return m.layers[i]->parameters(); };
    m.unit(UnitPhase::BeforeBackward, params);
    m.layers[i]->backward_weight(act.layers[i]);
    for (Parameter* p : m.layers[i]->parameters()) m.ready(*p);
    m.unit(UnitPhase::AfterBackward, params);
  }
  act.layers.clear();
  if (!spec_.pre_process) return;
  m.unit(UnitPhase::BeforeBackward, [&] { return m.embedding_params(); });
  const Tensor dx = std::move(act.embedding_grad);
  m.embedding_backward(act, dx);
  m.unit(UnitPhase::AfterBackward, [&] { return m.embedding_params(); });
}

}  // namespace parallel
