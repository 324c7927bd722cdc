// The memory plan (memory_plan.hpp, docs/memory.md): static buffers from the DDP layout rule, and
// activations from a walk over this rank's real schedule in which every forward and backward
// allocates and frees what the model's layers allocate and free, in the same order.
#include "parallel/memory_plan.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <set>
#include <unordered_set>

#include "parallel/allocator.hpp"
#include "parallel/comm_log.hpp"
#include "parallel/communicator.hpp"
#include "parallel/error.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/grad_buffer.hpp"
#include "parallel/meta.hpp"
#include "parallel/meta_communicator.hpp"
#include "parallel/ops.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/pipeline.hpp"
#include "parallel/pipeline_schedule.hpp"
#include "parallel/precision.hpp"
#include "parallel/train_step.hpp"

namespace parallel {
namespace {

int64_t to_bytes(double b) {
  // Absurd configurations overflow int64 in the products; the plan says "more than ever fits".
  constexpr double kMax = 4.0e18;
  return static_cast<int64_t>(std::llround(std::min(std::max(b, 0.0), kMax)));
}

// ---- parameters ---------------------------------------------------------------------------------

// One chunk's parameter units (a parameter, or the parts of one fused storage) in registration
// order, as the layers create them (src/model, src/tp): embedding, position table, per layer
// input_norm, fused q|k|v weight and bias, proj, post_attention_norm, fc1 (fused gate|up), fc2,
// then final_norm and the output weight.
// Very deep chunks (more than kExactLayers layers) count each layer as one unit of its aligned span:
// the same total but for where a bucket closes inside a layer (at most one bucket's padding each),
// and the plan stays fast and small for a million layers.
constexpr int kExactLayers = 4096;

// `model_units` (if given) gets, per buffer unit, the model unit it belongs to (GPTModel::units():
// the embedding, each layer, the output), numbered from `first_model_unit`; returns the next number.
std::vector<int64_t> chunk_parameter_units(const ModelConfig& m, const ChunkSpec& spec, int tp,
                                           bool distributed, std::vector<int>* model_units = nullptr,
                                           int* next_model_unit = nullptr) {
  const int64_t h = m.hidden_size, heads = m.num_attention_heads;
  const int64_t groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  const int64_t d = m.attention_head_dim(), ffn = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * h;
  const int64_t nq = heads / tp * d, nkv = groups / tp * d, f = ffn / tp;
  const bool layernorm = m.normalization == Normalization::LayerNorm;
  const int64_t vocab_local = padded_vocab_size(m.vocab_size, tp) / tp;
  std::vector<int64_t> units;
  auto norm = [&] {
    units.push_back(h);
    if (layernorm) units.push_back(h);
  };
  int unit_id = next_model_unit ? *next_model_unit : 0;
  auto tag = [&](std::size_t from) {  // buffer units [from, end) belong to one model unit
    if (model_units)
      while (model_units->size() < units.size()) model_units->push_back(unit_id);
    (void)from;
    ++unit_id;
  };
  if (spec.pre_process) {
    units.push_back(vocab_local * h);
    if (m.position_embedding == PositionEmbedding::Learned)
      units.push_back((m.max_position_embeddings > 0 ? m.max_position_embeddings : m.seq_length) * h);
    tag(0);
  }
  const std::size_t before_layers = units.size();
  // One layer's dense units (MoE layers: router and shared expert instead of the MLP; the experts
  // live in their own buffer, expert_elements_per_rank).
  auto layer_units = [&](bool moe) {
    norm();
    if (m.is_mla()) {
      // LatentAttention's parameters in order: [q_down, q_latent_norm, q_up | query], kv_down, kv_norm,
      // kv_up, proj; the down projections and their norms whole on every tp rank.
      const int64_t dqk = m.qk_nope_head_dim + m.qk_rope_head_dim, hl = heads / tp;
      if (m.q_lora_rank > 0) {
        units.push_back(int64_t{m.q_lora_rank} * h);
        units.push_back(m.q_lora_rank);
        units.push_back(hl * dqk * m.q_lora_rank);
      } else {
        units.push_back(hl * dqk * h);
      }
      units.push_back(int64_t{m.kv_lora_rank + m.qk_rope_head_dim} * h);
      units.push_back(m.kv_lora_rank);
      units.push_back(hl * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank);
      units.push_back(h * hl * m.v_head_dim);
    } else {
      units.push_back((nq + 2 * nkv) * h);
      if (m.add_bias || m.add_qkv_bias) units.push_back(nq + 2 * nkv);
      if (m.qk_norm) {  // q_norm and k_norm: [d] each, replicated
        units.push_back(d);
        units.push_back(d);
      }
      units.push_back(h * nq);
      if (m.add_bias) units.push_back(h);
    }
    norm();
    const int64_t mf = moe ? m.moe_shared_expert_ffn_hidden_size / tp : f;
    const int64_t mf1 = m.activation == Activation::SwiGLU ? 2 * mf : mf;
    if (moe) units.push_back(static_cast<int64_t>(m.num_experts) * h);
    if (mf > 0) {
      units.push_back(mf1 * h);
      if (m.add_bias) units.push_back(mf1);
      units.push_back(h * mf);
      if (m.add_bias) units.push_back(h);
    }
  };
  // Multi-token prediction (post_process): per depth, the embedding's copy first when the chunk
  // holds neither the embedding nor a tied output weight, then enorm, hnorm, eh_proj (whole on every
  // tp rank), a layer of the last layer's make-up and the depth's final norm (GPTModel::units()).
  auto mtp_units = [&] {
    if (!spec.post_process) return;
    for (int k = 1; k <= m.mtp_num_layers; ++k) {
      if (k == 1 && !m.tie_embeddings && !spec.pre_process) units.push_back(vocab_local * h);
      norm();
      norm();
      units.push_back(2 * h * h);
      layer_units(m.is_moe_layer(m.num_layers - 1));
      norm();
      tag(0);
    }
  };
  if (m.num_experts > 0) {
    // Layers differ (moe_layer_freq): every layer exactly.
    for (int i = 0; i < spec.num_layers; ++i) {
      layer_units(m.is_moe_layer(spec.first_layer + i));
      tag(0);
    }
    if (spec.post_process) {
      norm();
      if (!(m.tie_embeddings && spec.pre_process)) units.push_back(vocab_local * h);
      tag(0);
    }
    mtp_units();
    if (next_model_unit) *next_model_unit = unit_id;
    return units;
  }
  for (int i = 0; i < std::min(spec.num_layers, 1); ++i) layer_units(false);
  // Every layer has the units of the first one.
  const std::vector<int64_t> layer(units.begin() + static_cast<std::ptrdiff_t>(before_layers), units.end());
  units.resize(before_layers);
  if (spec.num_layers > kExactLayers && !layer.empty()) {
    // The span one layer takes in the buffer (laid out in reverse): every unit but the last placed
    // (the first registered) ends on a 64-element boundary with the distributed optimizer.
    int64_t span = 0;
    for (std::size_t i = 0; i < layer.size(); ++i)
      span += distributed && i > 0 ? (layer[i] + 63) / 64 * 64 : layer[i];
    for (int i = 0; i < spec.num_layers; ++i) {
      units.push_back(span);
      tag(units.size() - 1);
    }
  } else {
    for (int i = 0; i < spec.num_layers; ++i) {
      units.insert(units.end(), layer.begin(), layer.end());
      tag(units.size() - layer.size());
    }
  }
  if (spec.post_process) {
    norm();
    if (!(m.tie_embeddings && spec.pre_process)) units.push_back(vocab_local * h);
    tag(0);
  }
  mtp_units();
  if (next_model_unit) *next_model_unit = unit_id;
  return units;
}

// LoRA (docs/lora.md): the units of one chunk's buffer, which holds the adapters only (the base is
// frozen, outside it), tagged with their model units as chunk_parameter_units does. Per layer, in
// registration order: the q|k|v A's (one storage) and B's, proj's A and B, the fc1 / gate|up A's and
// B's, fc2's A and B.
std::vector<int64_t> chunk_lora_units(const ModelConfig& m, const ChunkSpec& spec, int tp,
                                      std::vector<int>* model_units, int* next_model_unit) {
  const int64_t h = m.hidden_size, heads = m.num_attention_heads, r = m.lora.rank;
  const int64_t groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  const int64_t d = h / heads, ffn = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * h;
  const int64_t nq = heads / tp * d, nkv = groups / tp * d, f = ffn / tp;
  std::vector<int64_t> units;
  int unit_id = *next_model_unit;
  auto tag = [&] {
    while (model_units->size() < units.size()) model_units->push_back(unit_id);
    ++unit_id;
  };
  // A column-parallel linear's parts (local output rows each): the A's [r, h] in one unit, a B each.
  auto column = [&](std::initializer_list<std::pair<const char*, int64_t>> parts) {
    int64_t pairs = 0;
    for (const auto& [module, rows] : parts) pairs += m.lora_targets(module) ? 1 : 0;
    if (pairs == 0) return;
    units.push_back(pairs * r * h);
    for (const auto& [module, rows] : parts)
      if (m.lora_targets(module)) units.push_back(rows * r);
  };
  // A row-parallel linear: A [r, in_local], B [h, r].
  auto row = [&](const char* module, int64_t in_local) {
    if (!m.lora_targets(module)) return;
    units.push_back(r * in_local);
    units.push_back(h * r);
  };
  if (spec.pre_process) tag();
  const bool swiglu = m.activation == Activation::SwiGLU;
  for (int i = 0; i < spec.num_layers; ++i) {
    column({{"q", nq}, {"k", nkv}, {"v", nkv}});
    row("o", nq);
    if (swiglu)
      column({{"gate", f}, {"up", f}});
    else
      column({{"fc1", f}});
    row("fc2", f);
    tag();
  }
  if (spec.post_process) tag();
  *next_model_unit = unit_id;
  return units;
}

// Elements of this rank's MoE experts in one chunk (num_experts / ep per MoE layer, fc1 and fc2,
// 1/etp of each): the trainer's expert DataParallel buffer, unsharded, its gradients fp32.
double expert_elements_per_rank(const ModelConfig& m, const ChunkSpec& spec, int ep, int etp) {
  if (m.num_experts <= 0) return 0;
  const double fe = m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : m.ffn_hidden_size;
  const double fe1 = m.activation == Activation::SwiGLU ? 2 * fe : fe;
  int moe_layers = 0;
  for (int i = 0; i < spec.num_layers; ++i) moe_layers += m.is_moe_layer(spec.first_layer + i);
  if (spec.post_process && m.is_moe_layer(m.num_layers - 1)) moe_layers += m.mtp_num_layers;  // MTP layers
  return moe_layers * static_cast<double>(m.num_experts / ep) * (fe1 + fe) / etp * m.hidden_size;
}

// Elements of the weights one chunk's GEMMs take as b (q|k|v, proj, fc1, fc2 per layer, and the
// output layer's weight, tied or not): what an ops::WeightPackingScope packs, in each of two
// orientations (x W^T forward, dy W backward).
double chunk_gemm_weight_elements(const ModelConfig& m, const ChunkSpec& spec, int tp) {
  const double h = m.hidden_size, heads = m.num_attention_heads;
  const double groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  const double d = m.attention_head_dim(), ffn = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * h;
  const double nq = heads / tp * d, nkv = groups / tp * d, f = ffn / tp;
  const double f1 = m.activation == Activation::SwiGLU ? 2 * f : f;
  double elements = spec.num_layers * ((nq + 2 * nkv) * h + h * nq + f1 * h + h * f);
  if (spec.post_process) elements += static_cast<double>(padded_vocab_size(m.vocab_size, tp)) / tp * h;
  // Multi-token prediction: each depth's eh_proj and layer (the output weight is packed once).
  if (spec.post_process)
    elements += m.mtp_num_layers * (2 * h * h + (nq + 2 * nkv) * h + h * nq + f1 * h + h * f);
  return elements;
}

// Whether the trainer packs weights for a step (trainer.cpp opens the scope under the same rule).
bool packs_weights(const Config& c, int micro_batches) {
  return micro_batches > 1 && c.train.device == DeviceKind::CPU && ops::WeightPackingScope::enabled() &&
         ops::WeightPackingScope::packs(compute_dtype(c.train.precision)) &&
         c.optimizer.sharding != Sharding::OptimGradsParams;
}

// Bytes of optimizer state per element of the state tensors: exp_avg and exp_avg_sq, and the
// fp32 main weights under bf16/fp16 (sharding.hpp's table is these per-element bytes spread over
// the shards; plan_static applies them to the padded buffers).
double optimizer_bytes_per_element(Precision precision) { return precision == Precision::FP32 ? 8.0 : 12.0; }

struct StaticBytes {
  double parameters = 0, gradients = 0, optimizer = 0;
  // Between steps (no unit gathered or reducing) and what a checkpoint save allocates on top: with a
  // sharded optimizer every rank gathers the full fp32 state (train_state.cpp), and ZeRO-3 gathers
  // every parameter.
  double steady = 0, save = 0;
};

StaticBytes plan_static(const Config& c, const std::vector<ChunkSpec>& chunks) {
  const Sharding sharding = c.optimizer.sharding;
  const bool sharded_optimizer = c.optimizer.distributed || sharding != Sharding::None;
  const bool shard_grads = sharding == Sharding::OptimGrads || sharding == Sharding::OptimGradsParams;
  const bool shard_params = sharding == Sharding::OptimGradsParams;
  // Dense parameters are replicated, and their optimizer state sharded, over dp x cp.
  const int replicas = c.parallel.data * c.parallel.context;
  const int shard_ranks = c.optimizer.sharding_group_size > 0 ? c.optimizer.sharding_group_size : replicas;
  std::vector<int64_t> units;
  std::vector<int> model_units;
  int next_model_unit = 0;
  // LoRA: the buffers hold the adapters; the frozen base lives beside them in the compute dtype.
  const bool lora = c.model.lora.enabled();
  double frozen = 0;
  for (const ChunkSpec& spec : chunks) {
    if (lora) {
      for (int64_t u : chunk_parameter_units(c.model, spec, c.parallel.tensor, false))
        frozen += static_cast<double>(u);
      for (int64_t u : chunk_lora_units(c.model, spec, c.parallel.tensor, &model_units, &next_model_unit))
        units.push_back(u);
      continue;
    }
    for (int64_t u : chunk_parameter_units(c.model, spec, c.parallel.tensor, sharded_optimizer, &model_units,
                                           &next_model_unit))
      units.push_back(u);
  }
  // The buffer's layout order (grad_buffer.hpp): reverse registration order, which is also reverse
  // model-unit order with each unit's parameters reversed.
  std::reverse(units.begin(), units.end());
  std::reverse(model_units.begin(), model_units.end());
  BufferOptions options;
  options.param_dtype = compute_dtype(c.train.precision);
  options.bucket_size = c.optimizer.bucket_size;
  options.data_parallel_size = replicas;
  options.distributed_optimizer = sharded_optimizer;
  options.shard_ranks = shard_ranks;
  // Sharded gradients: buckets follow the model's units, so each unit gathers and reduces alone.
  const BufferLayout layout = layout_buffer(units, options, shard_grads ? model_units : std::vector<int>{});
  // Bytes of each model unit's buckets, for the units gathered or reduced at full size at a time.
  std::map<int, double> unit_numel;
  {
    std::size_t u = 0;
    int64_t bucket_start = 0;
    for (const int64_t b : layout.bucket_numels) {
      while (u + 1 < units.size() && layout.unit_offsets[u] < bucket_start) ++u;
      unit_numel[model_units.empty() ? 0 : model_units[u]] += static_cast<double>(b);
      bucket_start += b;
    }
  }
  double largest_unit = 0;
  for (const auto& [unit, n] : unit_numel) largest_unit = std::max(largest_unit, n);
  double shard = 0;
  for (int64_t b : layout.bucket_numels) shard += static_cast<double>(chunk_of(b, shard_ranks, 0).count);
  const double numel = static_cast<double>(layout.numel);
  const double pe = static_cast<double>(dtype_size(options.param_dtype));

  StaticBytes s;
  // ZeRO's per-parameter bytes (sharding.hpp) on the padded buffers, plus what a step holds at full
  // size: with sharded parameters the unit computing and optimizer.prefetch_units gathered ahead
  // (every unit from its forward to its backward without reshard_after_forward).
  s.parameters = (shard_params ? shard : numel) * pe;
  if (shard_params)
    s.parameters +=
        (c.optimizer.reshard_after_forward ? (1.0 + c.optimizer.prefetch_units) * largest_unit : numel) * pe;
  // Sharded gradients (data_parallel.cpp): the unit computing its backward holds its full-size
  // gradients, and up to prefetch_units + 1 earlier ones wait in reductions, each with a shard-sized
  // output.
  const double in_flight = c.optimizer.prefetch_units + 1.0;
  s.gradients = (shard_grads ? shard + (in_flight + 1) * largest_unit + in_flight * largest_unit / shard_ranks
                             : numel) *
                4.0;
  s.optimizer = (sharded_optimizer ? shard : numel) * optimizer_bytes_per_element(c.train.precision);
  s.steady = (shard_params ? shard : numel) * pe + (shard_grads ? shard : numel) * 4.0 + s.optimizer;
  s.parameters += frozen * pe;
  s.steady += frozen * pe;
  if (sharded_optimizer) {
    double largest_bucket = 0;
    for (int64_t b : layout.bucket_numels) largest_bucket = std::max(largest_bucket, static_cast<double>(b));
    s.save = numel * optimizer_bytes_per_element(c.train.precision) + largest_bucket / shard_ranks * 4.0;
  }
  if (shard_params) s.save += numel * pe;
  // MoE experts: their own buffer, sharded as the dense one but over expert-dp (tp x cp x dp /
  // (ep x etp) ranks; under HSDP over expert-dp / the dense replica count, as the trainer does).
  // Unpadded; the working terms take one MoE layer's experts as the largest expert unit.
  double experts = 0, expert_layer = 0;
  for (const ChunkSpec& spec : chunks) {
    experts += expert_elements_per_rank(c.model, spec, c.parallel.expert, c.parallel.expert_tensor);
    expert_layer =
        std::max(expert_layer, expert_elements_per_rank(c.model, {spec.first_layer, 1, false, false},
                                                        c.parallel.expert, c.parallel.expert_tensor));
    for (int i = 1; i < spec.num_layers; ++i)
      expert_layer =
          std::max(expert_layer, expert_elements_per_rank(c.model, {spec.first_layer + i, 1, false, false},
                                                          c.parallel.expert, c.parallel.expert_tensor));
  }
  if (experts > 0) {
    const int expert_dp = c.parallel.tensor * c.parallel.context * c.parallel.data /
                          std::max(1, c.parallel.expert * c.parallel.expert_tensor);
    const double ke = std::max(1, c.optimizer.sharding_group_size > 0
                                      ? expert_dp / std::max(1, replicas / c.optimizer.sharding_group_size)
                                      : expert_dp);
    const double opt = optimizer_bytes_per_element(c.train.precision);
    const double param_shard = shard_params ? experts / ke : experts;
    const double grad_shard = shard_grads ? experts / ke : experts;
    const double state = sharded_optimizer ? experts / ke : experts;
    s.parameters += param_shard * pe;
    if (shard_params)
      s.parameters +=
          (c.optimizer.reshard_after_forward ? (1.0 + c.optimizer.prefetch_units) * expert_layer : experts) *
          pe;
    s.gradients +=
        (grad_shard + (shard_grads ? (in_flight + 1) * expert_layer + in_flight * expert_layer / ke : 0)) *
        4.0;
    s.optimizer += state * opt;
    s.steady += param_shard * pe + grad_shard * 4.0 + state * opt;
    if (sharded_optimizer) s.save += experts * opt;
    if (shard_params) s.save += experts * pe;
  }
  return s;
}

// The executors' action lists and message orders (train and evaluation), host memory.
double schedule_bytes(const Config& c, int micro_batches) {
  const double mv = static_cast<double>(micro_batches) * c.parallel.virtual_stages;
  const bool pipelined = c.parallel.pipeline > 1;
  const double actions = mv * (pipelined ? 6 : 2) + mv * (pipelined ? 3 : 1);
  const double keys = pipelined ? 3 * mv : 0;
  constexpr double kKeyBytes = 16;  // PipelineExecutor's message key: a flag and three ints
  return actions * sizeof(pipeline::Action) + keys * kKeyBytes;
}

std::string gib(double bytes) { return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024 * 1024)); }

}  // namespace

const MemoryTerm& RankMemoryPlan::biggest() const {
  PARALLEL_CHECK(!terms.empty(), "memory plan: rank {} has no terms", rank);
  return *std::max_element(terms.begin(), terms.end(),
                           [](const MemoryTerm& a, const MemoryTerm& b) { return a.bytes < b.bytes; });
}

const RankMemoryPlan& MemoryPlan::largest() const {
  PARALLEL_CHECK(!ranks.empty(), "memory plan: no ranks");
  return *std::max_element(ranks.begin(), ranks.end(), [](const RankMemoryPlan& a, const RankMemoryPlan& b) {
    return a.peak_bytes < b.peak_bytes;
  });
}

MemoryPlan plan_memory(const Config& c, int world_size) { return plan_memory_on_meta(c, world_size); }

namespace {

// What one meta run of the trainer's first two steps leaves on the meta allocator, as one rank.
struct MetaRun {
  double params = 0, grads = 0;  // the buffers DataParallel holds between steps
  double held = 0;               // everything live between steps (and after construction)
  double peak = 0;               // the high-water mark, model construction included
};

MetaRun run_on_meta(const Config& c, int rank, int world_size) {
  Allocator& alloc = allocator_for(Device::meta());
  const auto live = [&alloc] { return static_cast<int64_t>(alloc.stats().allocated); };
  const int64_t base = live();
  MetaRun m;
  MetaCommunicator world(rank, world_size, std::make_shared<CommLog>());
  TrainStep step(c, world, Device::meta());
  int64_t held = live() - base;
  // The buffers as DataParallel holds them between steps: full, or this rank's shards.
  for (DataParallel* d : step.optimizer().data_parallels()) {
    ParamAndGradBuffer& buf = d->buffer();
    for (const Bucket& bucket : buf.buckets()) {
      if (buf.params_sharded()) m.params += static_cast<double>(bucket.param_shard.nbytes());
      if (buf.grads_sharded()) m.grads += static_cast<double>(bucket.grad_shard.nbytes());
    }
    if (!buf.params_sharded()) m.params += static_cast<double>(buf.param_data().nbytes());
    if (!buf.grads_sharded()) m.grads += static_cast<double>(buf.grad_data().nbytes());
  }
  // Frozen parameters (LoRA's base weights) live outside the buffers, in the compute dtype: they are
  // parameters, not optimizer state.
  std::unordered_set<const Parameter*> frozen;
  for (Parameter* p : step.parameters())
    if (p->frozen && frozen.insert(p).second) m.params += static_cast<double>(p->value.nbytes());
  // Synthetic micro-batches: this rank's cp share of the sequence (shapes only). Packed documents
  // (data.format sft, data.reset_*, data.eod_mask_loss) carry what the trainer's do: positions on
  // the host (any valid values), document starts over the whole sequence and a loss mask.
  const int64_t b = c.train.micro_batch_size, s = c.model.seq_length / c.parallel.context;
  const bool sft = c.data.format == "sft";
  const bool positions = sft || c.data.reset_position_ids, documents = sft || c.data.reset_attention_mask,
             mask = sft || c.data.eod_mask_loss;
  const int64_t seq = c.model.seq_length;
  const auto data = [=](int) {
    pipeline::MicroBatch mb{Tensor::empty({b, s}, DType::I32, Device::meta()),
                            Tensor::empty({b, s}, DType::I32, Device::meta())};
    if (positions) {
      mb.packed.positions = Tensor::empty({b, s}, DType::I32);
      int32_t* p = mb.packed.positions.data<int32_t>();
      for (int64_t i = 0; i < b * s; ++i) p[i] = static_cast<int32_t>(i % s);
    }
    if (documents) mb.packed.doc_start = Tensor::empty({b, seq}, DType::I32, Device::meta());
    if (mask) mb.packed.loss_mask = Tensor::empty({b, s}, DType::F32, Device::meta());
    return mb;
  };
  // The trainer's first two steps: the second runs with the first's optimizer state live.
  for (int t = 0; t < 2; ++t) {
    step.run(t, data, c.optimizer.lr);
    held = std::max(held, live() - base);
  }
  m.held = static_cast<double>(held);
  m.peak = static_cast<double>(std::max(step.construction_peak_bytes(), step.peak_bytes()) - base);
  return m;
}

// Layers per model chunk where every chunk has the same number (no first_stage_layers /
// last_stage_layers); 0 otherwise.
int uniform_chunk_layers(const Config& c) {
  const int chunks = c.parallel.pipeline * c.parallel.virtual_stages;
  if (c.parallel.first_stage_layers > 0 || c.parallel.last_stage_layers > 0) return 0;
  return c.model.num_layers % chunks == 0 ? c.model.num_layers / chunks : 0;
}

}  // namespace

MemoryPlan plan_memory_on_meta(const Config& c, int world_size, const MetaPlanOptions& options) {
  const RankGrid grid = RankGrid::from_world(world_size, c.parallel.tensor, c.parallel.pipeline,
                                             c.parallel.context, c.parallel.expert, c.parallel.expert_tensor);
  const int dp = grid.sizes().data;
  const int micro_batches = c.train.global_batch_size / (c.train.micro_batch_size * dp);
  const std::string static_keys =
      "model.num_layers, model.hidden_size, model.vocab_size, parallel.tensor, "
      "parallel.pipeline";
  const std::string activation_keys =
      c.parallel.pipeline > 1
          ? "model.num_layers, model.seq_length, train.micro_batch_size, model.hidden_size, "
            "parallel.pipeline, train.recompute"
          : "model.num_layers, model.seq_length, train.micro_batch_size, model.hidden_size, train.recompute";
  // The run's micro-batches: past the warm-up the in-flight pattern repeats, so a step of
  // 4 * pipeline micro-batches (a multiple of pipeline, and at least the 2 * pipeline zb-v and
  // dualpipe-v need) peaks as the configured one does. The schedule term keeps the configured count.
  Config run = c;
  const int cap = options.max_micro_batches > 0 ? options.max_micro_batches : 4 * c.parallel.pipeline;
  if (micro_batches > cap) run.train.global_batch_size = cap * c.train.micro_batch_size * dp;
  // Chunks of many identical layers: every figure of the run is affine in the layers per chunk
  // (each layer adds its parameters, gradients, state and kept activations; the peak moment's
  // place in the schedule does not move), so two runs with few layers - whole periods of the MoE
  // pattern - give the line, read at the configured count.
  const int layers = uniform_chunk_layers(c);
  const int period = c.model.num_experts > 0 ? std::max(1, c.model.moe_layer_freq) : 1;
  const int chunks = c.parallel.pipeline * c.parallel.virtual_stages;
  const bool extrapolate = options.max_layers > 0 && layers > options.max_layers && 4 * period < layers;
  std::map<int, RankMemoryPlan> by_stage;
  // One run per pipeline stage: its first rank. The other ranks of a stage hold equal shares of
  // equal tensors (tp, cp, dp and ep positions differ in which share, not its size). First and
  // last first: they hold the embedding and the output layer, and the first the most micro-batches
  // in flight, so a plan asked to stop above a limit usually stops after one run.
  const int stages = c.parallel.pipeline;
  std::vector<int> order{0};
  if (stages > 1) order.push_back(stages - 1);
  for (int pp = 1; pp + 1 < stages; ++pp) order.push_back(pp);
  bool complete = true;
  for (int pp : order) {
    if (options.max_stages > 0 && static_cast<int>(by_stage.size()) >= options.max_stages) {
      complete = false;
      break;
    }
    const int rank = grid.rank(Coord{.pp = pp});
    const Coord coord = grid.coord(rank);
    MetaRun m;
    if (!extrapolate) {
      m = run_on_meta(run, rank, world_size);
    } else {
      const int l1 = 2 * period, l2 = 4 * period;
      Config small = run;
      small.model.num_layers = chunks * l1;
      const MetaRun a = run_on_meta(small, rank, world_size);
      small.model.num_layers = chunks * l2;
      const MetaRun b = run_on_meta(small, rank, world_size);
      const double at = static_cast<double>(layers - l1) / static_cast<double>(l2 - l1);
      const auto line = [at](double x, double y) { return x + (y - x) * at; };
      m = {line(a.params, b.params), line(a.grads, b.grads), line(a.held, b.held), line(a.peak, b.peak)};
    }
    const auto chunks_of_stage = pipeline::stage_layout(pipeline::LayoutParams::of(c), coord.pp);
    const StaticBytes st = plan_static(c, chunks_of_stage);
    RankMemoryPlan r;
    r.pp = coord.pp;
    const double between = std::max(m.held, m.params + m.grads);
    r.terms = {
        {"parameters", to_bytes(m.params), static_keys + ", train.precision"},
        {"gradients", to_bytes(m.grads), static_keys},
        // What else lives between steps: the optimizer's state (and the fp32 main weights).
        {"optimizer", to_bytes(between - m.params - m.grads),
         static_keys + ", optimizer.distributed, train.precision"},
        // Everything a step holds above that: activations, pipeline messages, kernels' workspaces,
        // gathered ZeRO-3 units (one term on meta).
        {"activations", to_bytes(std::max(0.0, m.peak - between)), activation_keys},
        {"schedule", to_bytes(schedule_bytes(c, micro_batches)),
         "train.global_batch_size, train.micro_batch_size, parallel.virtual_stages"},
    };
    // The trainer packs 16-bit weights once per step on the CPU (WeightPackingScope, a CPU
    // kernel's cache that the meta run does not make): both orientations of every GEMM weight of
    // this stage, an upper bound (the backward one of a chunk appears at its first backward).
    if (packs_weights(c, micro_batches)) {
      double packed = 0;
      for (const ChunkSpec& spec : chunks_of_stage)
        packed += 2 * chunk_gemm_weight_elements(c.model, spec, c.parallel.tensor) *
                  static_cast<double>(dtype_size(compute_dtype(c.train.precision)));
      r.terms.push_back({"packed_weights", to_bytes(packed), static_keys + ", train.precision"});
    }
    // The save's gathered state: still the layout arithmetic (plan_static), not a meta run.
    const double save = c.checkpoint.dir.empty() ? 0.0 : std::max(0.0, st.steady + st.save - m.peak);
    r.terms.push_back(
        {"checkpoint", to_bytes(save), "checkpoint.dir, optimizer.distributed, optimizer.sharding"});
    for (const MemoryTerm& term : r.terms) {
      r.peak_bytes += term.bytes;
      if (term.name != "schedule") r.allocator_bytes += term.bytes;
    }
    const bool above = options.stop_above_allocator_bytes > 0 &&
                       static_cast<double>(r.allocator_bytes) > options.stop_above_allocator_bytes;
    by_stage[coord.pp] = std::move(r);
    if (above) {
      complete = false;
      break;
    }
  }
  MemoryPlan plan;
  plan.complete = complete;
  for (int rank = 0; rank < world_size; ++rank) {
    const Coord coord = grid.coord(rank);
    if (by_stage.count(coord.pp) == 0) continue;
    RankMemoryPlan r = by_stage.at(coord.pp);
    r.rank = rank;
    r.tp = coord.tp;
    r.cp = coord.cp;
    r.dp = coord.dp;
    plan.ranks.push_back(std::move(r));
  }
  return plan;
}

std::string memory_plan_json(const MemoryPlan& plan) {
  std::string out = fmt::format("{{\"world_size\": {}, \"largest_rank\": {}, \"ranks\": [", plan.ranks.size(),
                                plan.ranks.empty() ? -1 : plan.largest().rank);
  for (std::size_t i = 0; i < plan.ranks.size(); ++i) {
    const RankMemoryPlan& r = plan.ranks[i];
    out += fmt::format("{}\n  {{\"rank\": {}, \"tp\": {}, \"cp\": {}, \"pp\": {}, \"dp\": {}",
                       i == 0 ? "" : ",", r.rank, r.tp, r.cp, r.pp, r.dp);
    for (const MemoryTerm& t : r.terms) out += fmt::format(", \"{}\": {}", t.name, t.bytes);
    out += fmt::format(", \"peak_bytes\": {}}}", r.peak_bytes);
  }
  out += "\n]}\n";
  return out;
}

std::string memory_plan_table(const MemoryPlan& plan) {
  if (plan.ranks.empty()) return "";
  std::string out = "memory plan (MiB per rank)\n  pp";
  for (const MemoryTerm& t : plan.ranks.front().terms) out += fmt::format(" {:>13}", t.name);
  out += fmt::format(" {:>13}\n", "peak");
  std::map<int, const RankMemoryPlan*> stages;
  for (const RankMemoryPlan& r : plan.ranks) stages.emplace(r.pp, &r);
  for (const auto& [pp, r] : stages) {
    out += fmt::format("  {:>2}", pp);
    for (const MemoryTerm& t : r->terms) out += fmt::format(" {:>13.2f}", t.bytes / 1048576.0);
    out += fmt::format(" {:>13.2f}\n", r->peak_bytes / 1048576.0);
  }
  const RankMemoryPlan& big = plan.largest();
  out += fmt::format("largest: rank {} (pp {}), {}; biggest term {} ({})\n", big.rank, big.pp,
                     gib(static_cast<double>(big.peak_bytes)), big.biggest().name,
                     gib(static_cast<double>(big.biggest().bytes)));
  return out;
}

void check_memory_plan(const MemoryPlan& plan, const MemoryLimit& limit, MemoryScope scope) {
  if (limit.bytes <= 0 || plan.ranks.empty()) return;
  auto in_scope = [scope](const MemoryTerm& t) {
    return scope == MemoryScope::All || (scope == MemoryScope::Host) == (t.name == "schedule");
  };
  // The plan as this memory sees it: the terms that live there.
  MemoryPlan seen;
  for (const RankMemoryPlan& r : plan.ranks) {
    RankMemoryPlan s = r;
    s.terms.clear();
    s.peak_bytes = 0;
    for (const MemoryTerm& t : r.terms)
      if (in_scope(t)) {
        s.terms.push_back(t);
        s.peak_bytes += t.bytes;
      }
    seen.ranks.push_back(std::move(s));
  }
  const RankMemoryPlan& big = seen.largest();
  if (big.peak_bytes <= limit.bytes) return;
  const MemoryTerm& term = big.biggest();
  throw ConfigError(fmt::format(
      "memory plan: rank {} needs {} at its peak, more than the {} it can use ({}); biggest term: {} {} "
      "({}); see pretrain_gpt --plan",
      big.rank, gib(static_cast<double>(big.peak_bytes)), gib(static_cast<double>(limit.bytes)), limit.source,
      term.name, gib(static_cast<double>(term.bytes)), term.keys));
}

}  // namespace parallel
