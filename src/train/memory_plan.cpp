// The memory plan (memory_plan.hpp, docs/memory.md): static buffers from the DDP layout rule, and
// activations from a walk over this rank's real schedule in which every forward and backward
// allocates and frees what the model's layers allocate and free, in the same order.
#include "parallel/memory_plan.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <set>

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
std::vector<int64_t> chunk_parameter_units(const ModelConfig& m, const GPTChunkSpec& spec, int tp,
                                           bool distributed, std::vector<int>* model_units = nullptr,
                                           int* next_model_unit = nullptr) {
  const int64_t h = m.hidden_size, heads = m.num_attention_heads;
  const int64_t groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  const int64_t d = h / heads, ffn = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * h;
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
    units.push_back((nq + 2 * nkv) * h);
    if (m.add_bias || m.add_qkv_bias) units.push_back(nq + 2 * nkv);
    units.push_back(h * nq);
    if (m.add_bias) units.push_back(h);
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
  if (next_model_unit) *next_model_unit = unit_id;
  return units;
}

// Elements of this rank's MoE experts in one chunk (num_experts / ep per MoE layer, fc1 and fc2,
// 1/etp of each): the trainer's expert DataParallel buffer, unsharded, its gradients fp32.
double expert_elements_per_rank(const ModelConfig& m, const GPTChunkSpec& spec, int ep, int etp) {
  if (m.num_experts <= 0) return 0;
  const double fe = m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : m.ffn_hidden_size;
  const double fe1 = m.activation == Activation::SwiGLU ? 2 * fe : fe;
  int moe_layers = 0;
  for (int i = 0; i < spec.num_layers; ++i) moe_layers += m.is_moe_layer(spec.first_layer + i);
  return moe_layers * static_cast<double>(m.num_experts / ep) * (fe1 + fe) / etp * m.hidden_size;
}

// Elements of the weights one chunk's GEMMs take as b (q|k|v, proj, fc1, fc2 per layer, and the
// output layer's weight, tied or not): what an ops::WeightPackingScope packs, in each of two
// orientations (x W^T forward, dy W backward).
double chunk_gemm_weight_elements(const ModelConfig& m, const GPTChunkSpec& spec, int tp) {
  const double h = m.hidden_size, heads = m.num_attention_heads;
  const double groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  const double d = h / heads, ffn = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * h;
  const double nq = heads / tp * d, nkv = groups / tp * d, f = ffn / tp;
  const double f1 = m.activation == Activation::SwiGLU ? 2 * f : f;
  double elements = spec.num_layers * ((nq + 2 * nkv) * h + h * nq + f1 * h + h * f);
  if (spec.post_process) elements += static_cast<double>(padded_vocab_size(m.vocab_size, tp)) / tp * h;
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

StaticBytes plan_static(const Config& c, const std::vector<GPTChunkSpec>& chunks) {
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
  for (const GPTChunkSpec& spec : chunks)
    for (int64_t u : chunk_parameter_units(c.model, spec, c.parallel.tensor, sharded_optimizer, &model_units,
                                           &next_model_unit))
      units.push_back(u);
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
  for (const GPTChunkSpec& spec : chunks) {
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

// ---- activations --------------------------------------------------------------------------------

// kPacked: the packed 16-bit weights of a WeightPackingScope (trainer.cpp opens one per step when
// packs_weights): each orientation of a chunk's weights appears at its first use in the step, the
// forward one at the chunk's first forward, the backward one at its first backward.
enum Kind { kActivations = 0, kCommunication = 1, kWorkspace = 2, kPacked = 3, kKinds = 4 };

// Live bytes by kind and the split at the moment the total was largest.
struct Tracker {
  std::array<double, kKinds> now{}, at_peak{};
  double peak = 0;
  static double sum(const std::array<double, kKinds>& a) {
    double s = 0;
    for (double x : a) s += x;
    return s;
  }
  void alloc(Kind k, double n) {
    now[k] += n;
    const double total = sum(now);
    if (total > peak) {
      peak = total;
      at_peak = now;
    }
  }
  void free(Kind k, double n) { now[k] -= n; }
  // A tensor that lives only inside one call.
  void touch(Kind k, double n) {
    alloc(k, n);
    free(k, n);
  }
  // A call that builds `result` (kept as `out`) through `temp` bytes of workspace freed on return.
  void through(double temp, Kind out, double result) {
    alloc(kWorkspace, temp);
    alloc(out, result);
    free(kWorkspace, temp);
  }
  // `n` more runs of what `one` recorded from empty (identical layers): the largest total is at the
  // last run when a run leaves bytes behind, else at the first. O(1) for any n.
  void repeat(const Tracker& one, int n) {
    if (n <= 0) return;
    const double net = sum(one.now);
    const double k = net >= 0 ? n - 1 : 0;
    const double total = sum(now) + k * net + one.peak;
    if (total > peak) {
      peak = total;
      for (int i = 0; i < kKinds; ++i) at_peak[i] = now[i] + k * one.now[i] + one.at_peak[i];
    }
    for (int i = 0; i < kKinds; ++i) now[i] += n * one.now[i];
  }
};

// One rank's per-micro-batch tensor sizes (bytes) for one chunk's layers.
struct Dims {
  double e = 4;            // activation element (the compute dtype)
  double T = 0, Tl = 0;    // tokens of a micro-batch: s * b, and this rank's s-shard (SP) * b
  double h = 0;            // hidden
  double nq = 0, nkv = 0;  // local query / key-value widths (heads / tp * head_dim)
  double heads = 0;        // local query heads
  double f = 0, f1 = 0;    // local ffn width, fc1 output width (2f for swiglu)
  double vocab = 0;        // local padded vocabulary
  double norm_stats = 8;   // fp32 bytes per row: mean + rstd (layernorm), rstd (rmsnorm)
  // What one attention call allocates besides its outputs, forward and backward.
  double attn_fwd = 0, attn_bwd = 0;
  bool sp = false;
  bool tp_gt1 = false;
  bool dropout = false;  // dropout > 0 writes a fresh tensor (its mask is regenerated, not kept)
  // 16-bit GEMMs without a oneDNN kernel on this CPU run widened to fp32 (kernels/cpu/gemm.cpp).
  bool widen_gemm = false;
  // A MoE layer's MLP (src/model/moe.cpp), under balanced routing (the walk cannot know the router's
  // choices; dropless runs move rows between ranks with the data): this rank routes its Tl tokens to
  // N = Tl k rows, and its local experts compute R = N * etp rows (each ep rank receives, on
  // average, as many rows as it sends; etp gathers its peers' rows).
  bool moe = false;
  int moe_freq = 0;  // model.moe_layer_freq when the model has experts, else 0 (every layer dense)
  double experts = 0, local_experts = 0, N = 0, R = 0;
  int ep = 1, etp = 1;
  bool allgather_dispatch = false;
  double fm = 0, fm1 = 0;  // an expert's local inner width (moe_ffn / etp) and its fc1 output width
  double fs = 0, fs1 = 0;  // the shared expert's local width (0: none) and its fc1 output width

  double X() const { return Tl * h * e; }    // an activation between layers
  double full() const { return T * h * e; }  // the same, gathered along s
  double qkv() const { return T * (nq + 2 * nkv) * e; }
  double core() const { return T * (2 * nq + 2 * nkv) * e + 4.0 * T * heads; }  // q, k, v, out, lse
};

Dims chunk_dims(const Config& c) {
  const ModelConfig& m = c.model;
  const int tp = c.parallel.tensor;
  Dims d;
  d.e = static_cast<double>(dtype_size(compute_dtype(c.train.precision)));
  d.sp = c.parallel.sequence_parallel && tp > 1;
  d.tp_gt1 = tp > 1;
  d.dropout = m.dropout > 0;
  d.widen_gemm = c.train.device == DeviceKind::CPU && d.e != 4 &&
                 ops::gemm_implementation(compute_dtype(c.train.precision)).starts_with("widened");
  // This rank's tokens: its cp share of each sample (two chunks of seq_length / (2 cp)).
  const double s = static_cast<double>(m.seq_length / c.parallel.context), b = c.train.micro_batch_size;
  d.T = s * b;
  d.Tl = (d.sp ? s / tp : s) * b;
  d.h = m.hidden_size;
  const double heads = m.num_attention_heads;
  const double groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  const double head_dim = d.h / heads;
  d.heads = heads / tp;
  d.nq = heads / tp * head_dim;
  d.nkv = groups / tp * head_dim;
  d.f = (m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4.0 * d.h) / tp;
  d.f1 = m.activation == Activation::SwiGLU ? 2 * d.f : d.f;
  d.vocab = static_cast<double>(padded_vocab_size(m.vocab_size, tp)) / tp;
  d.norm_stats = m.normalization == Normalization::LayerNorm ? 8 : 4;
  if (m.num_experts > 0) {
    const double etp = c.parallel.expert_tensor;
    d.experts = m.num_experts;
    d.moe_freq = m.moe_layer_freq;
    d.ep = c.parallel.expert;
    d.etp = c.parallel.expert_tensor;
    d.local_experts = d.experts / d.ep;
    d.allgather_dispatch = m.moe_token_dispatcher == MoeDispatcher::AllGather;
    d.N = d.Tl * m.moe_router_topk;
    d.R = d.N * etp;
    d.fm = (m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : d.f * tp) / etp;
    d.fm1 = m.activation == Activation::SwiGLU ? 2 * d.fm : d.fm;
    d.fs = static_cast<double>(m.moe_shared_expert_ffn_hidden_size) / tp;
    d.fs1 = m.activation == Activation::SwiGLU ? 2 * d.fs : d.fs;
  }
  // The CPU kernel's own figure for one call (ops::attention_workspace_bytes: tiles, packed bf16
  // operands, row sums, fp32 copies of widened 16-bit inputs); the CUDA kernels' are not modelled.
  if (c.train.device == DeviceKind::CPU) {
    const DType dt = compute_dtype(c.train.precision);
    const auto sl = static_cast<int64_t>(s), bl = static_cast<int64_t>(b),
               hd = static_cast<int64_t>(head_dim);
    const auto hq = static_cast<int64_t>(heads / tp), hkv = static_cast<int64_t>(groups / tp);
    d.attn_fwd = static_cast<double>(ops::attention_workspace_bytes(dt, sl, bl, hq, hkv, hd, false));
    d.attn_bwd = static_cast<double>(ops::attention_workspace_bytes(dt, sl, bl, hq, hkv, hd, true));
    // Context parallelism's buffers while the core runs (src/cp): the kernel's own workspace above
    // is for the largest call, the rank's causal 2L x 2L block.
    const int cp = c.parallel.context;
    if (cp > 1) {
      const double kv = 2 * d.T * d.nkv * d.e, kv32 = 2 * d.T * d.nkv * 4, q32 = d.T * d.nq * 4;
      switch (c.parallel.context_comm) {
        case ContextComm::P2P:  // own packed K/V + the one arriving; fp32 output; fp32 dQ and dK/dV
          d.attn_fwd += 2 * kv + q32 + 4.0 * d.T * d.heads;
          d.attn_bwd += 2 * kv + q32 + 3 * kv32;
          break;
        case ContextComm::AllGather:  // every rank's K/V; the backward's dK/dV of all of them
          d.attn_fwd += (1 + cp) * kv + q32 + 4.0 * d.T * d.heads;
          d.attn_bwd += (1 + cp) * kv + q32 + (1 + cp) * kv32;
          break;
        case ContextComm::A2A:  // send and receive buffers of the all-to-alls, head-sharded copies
          d.attn_fwd += 2 * d.T * (d.nq + 2 * d.nkv) * d.e;
          d.attn_bwd += 2 * d.T * (2 * d.nq + 2 * d.nkv) * d.e;
          break;
      }
    }
  }
  return d;
}

// A GEMM c = a b of a, b, c elements: where the CPU widens 16-bit operands, fp32 copies of a and b,
// and of c when it is 16-bit (c16_elems; 0 for an fp32 weight gradient), live for the call.
void gemm(Tracker& t, const Dims& d, double a_elems, double b_elems, double c16_elems) {
  if (d.widen_gemm) t.touch(kWorkspace, 4 * (a_elems + b_elems + c16_elems));
}

// ---- MoE layers (src/model/moe.cpp), under balanced routing ----

// How many of the layers [first, first + n) are MoE layers (ModelConfig::is_moe_layer).
int moe_layers(const Dims& d, int first, int n) {
  int count = 0;
  for (int i = first; i < first + n; ++i) count += d.moe_freq > 0 && i % d.moe_freq == 0;
  return count;
}
Dims moe_dims(const Dims& d) {
  Dims m = d;
  m.moe = d.moe_freq > 0;
  return m;
}

// Rows through the ep dispatch towards the experts (MoELayer::dispatch, back = false): `rows`
// bytes in, the same out (each rank receives as many rows as it sends), the result kept as `out`.
void moe_dispatch_in(Tracker& t, const Dims& d, double rows, Kind out) {
  if (d.ep == 1) return;  // the input itself goes on
  if (d.allgather_dispatch)
    t.through(rows + d.ep * rows, out, rows);  // this rank's block padded, every rank's; its experts' rows
  else
    t.through(rows, out, rows);  // received in rank order; regrouped by local expert
}

// The way back (back = true): the experts' `rows` in, this rank's permuted rows out.
void moe_dispatch_back(Tracker& t, const Dims& d, double rows, Kind out) {
  if (d.ep == 1) return;
  if (d.allgather_dispatch)  // fp32: every rank's rows scattered, reduce-scattered, narrowed
    t.through((d.ep + 2) * (rows / d.e * 4), out, rows);
  else
    t.through(rows, out, rows);  // reordered by source rank
}

// gather_over_etp: the etp peers' rows (`rows` each) gathered, `rows * etp` kept as `out`.
void moe_gather_etp(Tracker& t, const Dims& d, double rows, Kind out) {
  if (d.etp == 1) return;
  t.through(rows + d.etp * rows, out, d.etp * rows);  // own block padded, all blocks
}

// reduce_scatter_over_etp: `rows * etp` partial sums in, this rank's `rows` out.
void moe_reduce_scatter_etp(Tracker& t, const Dims& d, double rows, Kind out) {
  if (d.etp == 1) return;
  t.through(d.etp * rows, out, rows);  // scattered to their padded places
}

// The shared expert (a tensor-parallel MLP beside the routed experts), forward and backward.
void moe_shared_forward(Tracker& t, const Dims& d, Kind keep) {
  if (d.fs == 0) return;
  if (d.sp) t.alloc(keep, d.full());          // its input gathered along s
  t.alloc(keep, d.T * (d.fs1 + d.fs) * d.e);  // pre-activation, activation
  t.touch(kWorkspace, d.full() + d.X());      // its output before and after the reduction
}
double moe_shared_context(const Dims& d) {
  return d.fs == 0 ? 0.0 : (d.sp ? d.full() : 0.0) + d.T * (d.fs1 + d.fs) * d.e;
}

// norm2 and the MoE MLP (MoELayer::forward) after x2; the output (one X) goes to `out_kind`.
void moe_forward(Tracker& t, const Dims& d, Kind keep, Kind out_kind) {
  const double row = d.h * d.e, Nr = d.N * row, Rr = d.R * row;
  const double probs = 4 * d.Tl * d.experts;
  t.alloc(keep, d.X());  // m: the router's and the experts' input (ctx.x), never gathered
  t.alloc(keep, d.Tl * d.norm_stats);
  t.through(probs, keep, probs);  // fp32 logits; probabilities
  t.alloc(kWorkspace, Nr);        // x_perm, a local of the forward
  // Dispatch over ep, then over etp: the experts' input is kept.
  const Kind after_ep = d.etp > 1 ? kWorkspace : keep;
  moe_dispatch_in(t, d, Nr, after_ep);
  moe_gather_etp(t, d, Nr, keep);
  if (d.etp > 1 && d.ep > 1) t.free(kWorkspace, Nr);  // the ep result, a temporary
  t.alloc(keep, d.R * (d.fm1 + d.fm) * d.e);          // pre-activation, activation
  gemm(t, d, d.R * d.h, d.fm1 * d.h, d.R * d.fm1);
  gemm(t, d, d.R * d.fm, d.h * d.fm, d.R * d.h);
  t.alloc(kWorkspace, Rr);  // expert_out, a local of the forward
  // Back over etp, then over ep: out_perm, kept for the combine's backward.
  moe_reduce_scatter_etp(t, d, Nr, d.ep > 1 ? kWorkspace : keep);
  moe_dispatch_back(t, d, Nr, keep);
  if (d.etp > 1 && d.ep > 1) t.free(kWorkspace, Nr);
  // Combine (ops::gather_sum_rows, fp32 inside): y in the activation dtype, then each token's rows
  // (int64) and combine weights (fp32) for the call.
  t.alloc(out_kind, d.X());
  t.touch(kWorkspace, 12 * d.N);
  moe_shared_forward(t, d, keep);
  t.free(kWorkspace, Rr + Nr);  // expert_out, x_perm
  // Without ep and etp, expert_in and out_perm are x_perm and expert_out themselves: the context
  // holds them past the forward.
  if (d.ep == 1 && d.etp == 1) t.alloc(keep, Nr + Rr);
  if (d.sp) t.free(kWorkspace, d.X());  // norm1's output a, a local of the forward
}

// What moe_forward keeps for the backward besides x2 and norm1's part.
double moe_context(const Dims& d) {
  const double row = d.h * d.e;
  return d.X() + d.Tl * d.norm_stats + 4 * d.Tl * d.experts + d.R * row + d.R * (d.fm1 + d.fm) * d.e +
         d.N * row + moe_shared_context(d);
}

// The MoE MLP's backward (backward_input then backward_weight) with dy live; leaves its dx (one X,
// kWorkspace) and frees the MoE context except norm2's statistics (the caller's, with x2).
void moe_backward(Tracker& t, const Dims& d, Kind ctx) {
  const double row = d.h * d.e, Nr = d.N * row, Rr = d.R * row;
  const double probs = 4 * d.Tl * d.experts, y32 = 4 * d.Tl * d.h, idx = 8 * d.N, n4 = 4 * d.N;
  // The combine's backward: each row's token (int64), d(out_perm) = weight * dy in the activation
  // dtype (the weights fp32, for the call), d(weight) per row and d(probs), both fp32.
  t.alloc(kWorkspace, idx + Nr);
  t.touch(kWorkspace, n4);
  t.alloc(kWorkspace, n4 + probs);
  t.free(ctx, Nr);  // out_perm
  const Kind after_ep = d.etp > 1 ? kWorkspace : kActivations;
  if (d.ep > 1) moe_dispatch_in(t, d, Nr, after_ep);
  moe_gather_etp(t, d, Nr, kActivations);  // d_expert_out (until the weight step)
  if (d.ep > 1 && d.etp > 1) t.free(kWorkspace, Nr);
  t.free(kWorkspace, Nr);
  if (d.ep == 1 && d.etp == 1) t.alloc(kActivations, Rr);  // d_expert_out is the dtype copy itself
  t.alloc(kActivations, d.R * d.fm1 * d.e);                // d_pre (until the weight step)
  t.alloc(kWorkspace, Rr);                                 // dx_local
  t.touch(kWorkspace, d.R / std::max(1.0, d.local_experts) * d.fm * d.e);  // du, one expert's rows
  gemm(t, d, d.R * d.h, d.h * d.fm, d.R * d.fm);
  gemm(t, d, d.R * d.fm1, d.fm1 * d.h, d.R * d.h);
  t.free(ctx, d.R * d.fm1 * d.e);  // pre
  moe_reduce_scatter_etp(t, d, Nr, kWorkspace);
  moe_dispatch_back(t, d, Nr, kWorkspace);
  if (d.etp > 1 && d.ep > 1) t.free(kWorkspace, Nr);  // the etp result, the dispatch's input
  // Unpermute (ops::gather_sum_rows into fp32 dx32, each token's rows as int64 for the call), then
  // dx_perm goes (unless it is dx_local itself).
  t.alloc(kWorkspace, y32);
  t.touch(kWorkspace, idx);
  if (d.etp > 1 || d.ep > 1) t.free(kWorkspace, Nr);
  t.alloc(kWorkspace, probs);                     // dlogits in fp32
  t.alloc(kActivations, d.Tl * d.experts * d.e);  // d_logits (until the weight step)
  t.alloc(kWorkspace, d.X() + y32);               // the router's dx and its fp32 copy
  t.alloc(kWorkspace, d.X());                     // dx in the activation dtype (stays)
  if (d.fs > 0) {
    t.touch(kWorkspace, d.T * (d.fs1 + d.fs) * d.e + 2 * d.full());  // the shared expert's backward
    t.free(ctx, moe_shared_context(d));
  }
  t.free(kWorkspace, idx + n4 + probs + Rr + y32 + probs + d.X() + y32);
  // The weight step's GEMMs, then the context goes: m, probs, expert_in, act and the weight-step
  // tensors.
  gemm(t, d, d.R * d.h, d.R * d.fm, 0);
  gemm(t, d, d.R * d.fm1, d.R * d.h, 0);
  t.free(kActivations, Rr + d.R * d.fm1 * d.e + d.Tl * d.experts * d.e);
  t.free(ctx, d.X() + probs + Rr + d.R * d.fm * d.e);
}

// One transformer layer (src/model/transformer_layer.cpp, attention.cpp, mlp.cpp, norm.cpp and the
// tp linears), tensor by tensor. `keep` is where the tensors the backward needs go: kActivations
// when the forward keeps them, kWorkspace when they are rebuilt (full recompute) and dropped.
// Returns nothing; the layer's output (one X, kActivations) stays allocated.
void layer_forward_impl(Tracker& t, const Dims& d, Kind keep, bool keep_core, Kind out_kind) {
  // norm1: output a, row statistics.
  t.alloc(d.sp ? kWorkspace : keep, d.X());  // a: the qkv linear's saved input unless gathered
  t.alloc(keep, d.Tl * d.norm_stats);
  if (d.sp) t.alloc(keep, d.full());  // qkv input gathered along s
  t.alloc(kWorkspace, d.qkv());       // qkv projection output
  gemm(t, d, d.T * d.h, (d.nq + 2 * d.nkv) * d.h, d.qkv() / d.e);
  t.alloc(keep, d.core());  // q, k, v, out, lse
  t.touch(kWorkspace, d.attn_fwd);
  // proj: the partial product, reduce-scattered under SP.
  if (d.sp) {
    t.alloc(kWorkspace, d.full());
    gemm(t, d, d.T * d.nq, d.h * d.nq, d.T * d.h);
    t.alloc(keep, d.X());  // x2
    t.free(kWorkspace, d.full());
  } else {
    t.alloc(keep, d.X());  // x2 (all-reduced in place)
    gemm(t, d, d.T * d.nq, d.h * d.nq, d.T * d.h);
  }
  // x2 = x + dropout(o) and norm2(x2) in one fused op: x2 reuses o's storage, no dropout tensor.
  if (keep_core) {
    t.free(kWorkspace, d.qkv());
  } else {  // selective: qkv is kept, the core is rebuilt in the backward
    t.free(kWorkspace, d.qkv());
    t.alloc(keep, d.qkv());
    t.free(keep, d.core());
  }
  if (d.moe) {
    moe_forward(t, d, keep, out_kind);
    return;
  }
  // norm2, fc1, activation, fc2.
  t.alloc(d.sp ? kWorkspace : keep, d.X());  // m
  t.alloc(keep, d.Tl * d.norm_stats);
  if (d.sp) t.alloc(keep, d.full());  // fc1 input gathered
  t.alloc(keep, d.T * d.f1 * d.e);    // pre-activation
  gemm(t, d, d.T * d.h, d.f1 * d.h, d.T * d.f1);
  t.alloc(keep, d.T * d.f * d.e);  // activation (fc2's saved input)
  if (d.sp) {
    t.alloc(kWorkspace, d.full());
    gemm(t, d, d.T * d.f, d.h * d.f, d.T * d.h);
    t.alloc(out_kind, d.X());
    t.free(kWorkspace, d.full());
    t.free(kWorkspace, 2 * d.X());  // the norms' outputs a and m, locals of the forward
  } else {
    t.alloc(out_kind, d.X());
    gemm(t, d, d.T * d.f, d.h * d.f, d.T * d.h);
  }
  // out = x2 + dropout(y) is fused in place into y: no dropout tensor.
}

// What layer_forward_impl keeps for the backward (not the output).
double layer_context(const Dims& d, bool keep_core) {
  if (d.moe)  // x2, norm1's statistics, the qkv linear's input, the attention's part, the MoE's
    return d.X() + d.Tl * d.norm_stats + (d.sp ? d.full() : d.X()) + (keep_core ? d.core() : d.qkv()) +
           moe_context(d);
  double ctx = d.X() + 2 * d.Tl * d.norm_stats + d.T * (d.f1 + d.f) * d.e;  // x2, stats, pre, act
  ctx += 2 * (d.sp ? d.full() : d.X());                                     // linear inputs
  ctx += keep_core ? d.core() : d.qkv();
  return ctx;
}

void layer_forward(Tracker& t, const Dims& d, Recompute rc) {
  if (rc != Recompute::Full) {
    layer_forward_impl(t, d, kActivations, rc == Recompute::None, kActivations);
    return;
  }
  layer_forward_impl(t, d, kWorkspace, true, kActivations);
  t.free(kWorkspace, layer_context(d, true));
}

// The layer's backward with dy (one X, kWorkspace) live; leaves dx (one X, kWorkspace) in its place.
// Frees the layer's context; the input and output activations are the caller's.
void layer_backward(Tracker& t, const Dims& d, Recompute rc) {
  Kind ctx = kActivations;
  if (rc == Recompute::Full) {
    layer_forward_impl(t, d, kWorkspace, true, kWorkspace);
    t.free(kWorkspace, d.X());  // the recomputed output is dropped at once
    ctx = kWorkspace;
  }
  const Kind core_kind = rc == Recompute::None ? kActivations : kWorkspace;
  const double lin_in = d.sp ? d.full() : d.X();
  if (d.dropout) t.alloc(kWorkspace, d.X());  // dropout's gradient, live through the MLP's backward
  if (d.moe) {
    moe_backward(t, d, ctx);
  } else {
    // MLP: fc2 (gathers dy under SP), the activation's backward, fc1 (reduce-scatters dx under SP).
    if (d.sp) t.alloc(kWorkspace, d.full());
    gemm(t, d, d.T * d.h, d.T * d.f, 0);   // fc2's weight gradient (fp32)
    t.alloc(kWorkspace, d.T * d.f * d.e);  // du
    gemm(t, d, d.T * d.h, d.h * d.f, d.T * d.f);
    t.free(ctx, d.T * d.f * d.e);  // fc2's saved input
    if (d.sp) t.free(kWorkspace, d.full());
    t.alloc(kWorkspace, d.T * d.f1 * d.e);  // dpre
    t.free(ctx, d.T * d.f1 * d.e);          // pre
    t.alloc(kWorkspace, d.full());          // fc1's dx
    gemm(t, d, d.T * d.f1, d.f1 * d.h, d.T * d.h);
    gemm(t, d, d.T * d.f1, d.T * d.h, 0);  // fc1's weight gradient
    if (d.sp) {
      t.alloc(kWorkspace, d.X());
      t.free(kWorkspace, d.full());
    }
    t.free(ctx, lin_in);                           // fc1's saved input
    t.free(kWorkspace, d.T * (d.f + d.f1) * d.e);  // du, dpre
  }
  if (d.dropout) t.free(kWorkspace, d.X());   // the MLP's dropout gradient, a temporary of its call
  t.alloc(kWorkspace, d.X());                 // norm2's fused backward: d(x2)
  if (d.dropout) t.alloc(kWorkspace, d.X());  // and the attention branch's gradient (through dropout)
  t.free(ctx, d.X() + d.Tl * d.norm_stats);   // x2, stats
  // Attention: selective rebuilds the core from the kept qkv.
  if (rc == Recompute::Selective) {
    t.alloc(kWorkspace, d.core());
    t.touch(kWorkspace, d.attn_fwd);
    t.free(kActivations, d.qkv());
  }
  if (d.sp) t.alloc(kWorkspace, d.full());
  gemm(t, d, d.T * d.h, d.T * d.nq, 0);   // proj's weight gradient
  t.alloc(kWorkspace, d.T * d.nq * d.e);  // dout
  gemm(t, d, d.T * d.h, d.h * d.nq, d.T * d.nq);
  if (d.sp) t.free(kWorkspace, d.full());
  t.alloc(kWorkspace, d.qkv());  // dq, dk, dv
  t.touch(kWorkspace, d.attn_bwd);
  t.free(rc == Recompute::Selective ? kWorkspace : (rc == Recompute::Full ? kWorkspace : core_kind),
         d.core());
  t.alloc(kWorkspace, d.qkv());   // dqkv
  t.alloc(kWorkspace, d.full());  // qkv's dx
  gemm(t, d, d.qkv() / d.e, (d.nq + 2 * d.nkv) * d.h, d.T * d.h);
  gemm(t, d, d.qkv() / d.e, d.T * d.h, 0);  // qkv's weight gradient
  if (d.sp) {
    t.alloc(kWorkspace, d.X());
    t.free(kWorkspace, d.full());
  }
  t.free(ctx, lin_in + d.Tl * d.norm_stats);           // qkv's saved input, norm1's statistics
  t.free(kWorkspace, d.T * d.nq * d.e + 2 * d.qkv());  // dout, dq|dk|dv, dqkv
  if (d.dropout) t.free(kWorkspace, d.X());
  t.alloc(kWorkspace, d.X());  // norm1's dx
  // Locals dm, dx2, da go; dx stays (dy is freed by the caller).
  t.free(kWorkspace, 3 * d.X());
}

void chunk_forward(Tracker& t, const Dims& d, const GPTChunkSpec& spec, Recompute rc) {
  if (spec.pre_process) {
    t.alloc(kActivations, 4 * d.T);                         // tokens (kept by the embedding)
    t.alloc(kWorkspace, 4 * d.T);                           // targets of the data batch
    t.through(d.sp ? d.full() : 0.0, kActivations, d.X());  // the lookup (full-length under SP), scattered
    if (d.dropout) t.touch(kActivations, d.X());  // the embedding dropout's output replaces its input
  }
  // Dense and MoE layers (moe_layer_freq): each kind walked once and repeated; the kind whose
  // transient peak rises further above what it leaves behind goes last, where the peak is.
  const int moe = moe_layers(d, spec.first_layer, spec.num_layers);
  const Dims dm = moe_dims(d);
  Tracker dense_layer, moe_layer;
  layer_forward(dense_layer, d, rc);
  layer_forward(moe_layer, dm, rc);
  const auto rise = [](const Tracker& x) { return x.peak - Tracker::sum(x.now); };
  if (rise(moe_layer) >= rise(dense_layer)) {
    t.repeat(dense_layer, spec.num_layers - moe);
    t.repeat(moe_layer, moe);
  } else {
    t.repeat(moe_layer, moe);
    t.repeat(dense_layer, spec.num_layers - moe);
  }
  if (spec.post_process) {
    if (!spec.pre_process) t.alloc(kWorkspace, 8 * d.T);  // the data batch (tokens, targets)
    t.alloc(d.sp ? kWorkspace : kActivations, d.X());     // final norm output
    t.alloc(kActivations, d.Tl * d.norm_stats);
    if (d.sp) t.alloc(kActivations, d.full());   // output layer input gathered
    t.alloc(kActivations, d.T * d.vocab * d.e);  // logits
    gemm(t, d, d.T * d.h, d.vocab * d.h, d.T * d.vocab);
    t.alloc(kActivations, 4 * d.T);   // targets in (s, b) order
    t.alloc(kActivations, 12 * d.T);  // row max, target logit, sum of exponentials
    t.touch(kWorkspace, 4 * d.T);     // per-token losses
    if (d.sp) t.free(kWorkspace, d.X());
    t.free(kWorkspace, 8 * d.T);
  } else {
    if (spec.pre_process) t.free(kWorkspace, 4 * d.T);
    // The output is not kept: it goes to the next stage (the walk counts it until sent).
    t.free(kActivations, d.X());
  }
}

// Bytes a chunk keeps per micro-batch from its forward to its backward (input included).
double chunk_kept(const Dims& d, const GPTChunkSpec& spec, Recompute rc) {
  Tracker t;
  chunk_forward(t, d, spec, rc);
  return t.now[kActivations] + (spec.pre_process ? 0.0 : d.X());  // the received input is the executor's
}

// Backward of a chunk with its kept tensors live. Frees them; leaves the input gradient (non-first
// global stage: one X, kCommunication, sent by the caller) or nothing.
void chunk_backward(Tracker& t, const Dims& d, const GPTChunkSpec& spec, Recompute rc, double kept) {
  double freed = 0;
  auto free_kept = [&](double n) {
    t.free(kActivations, n);
    freed += n;
  };
  if (spec.post_process) {
    t.alloc(kWorkspace, 4 * d.T);               // the loss gradient
    t.alloc(kWorkspace, d.T * d.vocab * d.e);   // dlogits
    free_kept(d.T * d.vocab * d.e + 16 * d.T);  // logits, targets, row statistics
    t.alloc(kWorkspace, d.full());              // output layer's dx
    gemm(t, d, d.T * d.vocab, d.vocab * d.h, d.T * d.h);
    gemm(t, d, d.T * d.vocab, d.T * d.h, 0);  // the output weight's gradient
    if (d.sp) {
      t.alloc(kWorkspace, d.X());
      t.free(kWorkspace, d.full());
    }
    free_kept(d.sp ? d.full() : d.X());                 // output layer input
    t.alloc(kWorkspace, d.X());                         // final norm's dx
    t.free(kWorkspace, d.X());                          // the output layer's
    free_kept(d.X() + d.Tl * d.norm_stats);             // last layer output, statistics
    t.free(kWorkspace, 4 * d.T + d.T * d.vocab * d.e);  // the loss gradient and dlogits: block locals
  } else {
    t.alloc(kCommunication, d.X());  // received output gradient
  }
  const Dims dm = moe_dims(d);
  const auto per_layer = [&](const Dims& kind) {
    return rc == Recompute::Full ? 0.0 : layer_context(kind, rc == Recompute::None);
  };
  // The last layer first (it consumes the chunk's output gradient), then the others, alike.
  auto one_layer = [&](Tracker& on, const Dims& kind, bool frees_dy) {
    layer_backward(on, kind, rc);
    on.free(kActivations, d.X());  // the layer's input goes with its context
    if (frees_dy) on.free(kWorkspace, d.X());
  };
  if (spec.num_layers > 0) {
    const int moe = moe_layers(d, spec.first_layer, spec.num_layers);
    const bool last_moe = moe_layers(d, spec.first_layer + spec.num_layers - 1, 1) == 1;
    // The received output gradient stays with the executor until the chunk's backward ends.
    one_layer(t, last_moe ? dm : d, spec.post_process);
    Tracker dense_rest, moe_rest;
    one_layer(dense_rest, d, true);
    one_layer(moe_rest, dm, true);
    t.repeat(moe_rest, moe - (last_moe ? 1 : 0));
    t.repeat(dense_rest, spec.num_layers - moe - (last_moe ? 0 : 1));
    freed += (spec.num_layers - moe) * (per_layer(d) + d.X()) + moe * (per_layer(dm) + d.X());
  }
  if (spec.pre_process && d.dropout) t.touch(kWorkspace, d.X());  // the embedding dropout's gradient
  if (spec.pre_process && d.sp) t.touch(kWorkspace, d.full());    // gathered gradient for the lookup
  // Whatever the forward kept that the walk above did not name (tokens, the odd statistic).
  const double rest = kept - freed;
  if (std::abs(rest) > 0) t.free(kActivations, rest);
  // dx: the input gradient to send (until its send completes), or dropped on the first stage.
  t.free(kWorkspace, d.X());
  if (!spec.pre_process) t.alloc(kCommunication, d.X());
  if (!spec.post_process) t.free(kCommunication, d.X());  // the received output gradient
}

// What a split backward keeps from a chunk's input step (B) to its weight step (W): every linear
// layer's input and output gradient (the logits' gradient for the output layer), and the
// embedding's gradient with its tokens (GPTModel::backward_input). The norms finish in B.
double chunk_weight_state(const Dims& d, const GPTChunkSpec& spec) {
  const double shard = d.sp ? d.X() : 0.0;       // a row-parallel layer's own s-shard of dy
  const double attention = (d.full() + d.qkv())  // qkv
                           + (d.T * d.nq * d.e + d.full() + shard);  // proj
  const double mlp = (d.full() + d.T * d.f1 * d.e)                   // fc1
                     + (d.T * d.f * d.e + d.full() + shard);         // fc2
  // A MoE layer (MoELayer::backward_input): its context stays whole until the weight step, with
  // the experts' output gradients, d_pre and the router's logit gradients.
  const double row = d.h * d.e;
  const double moe = d.X() + 4 * d.Tl * d.experts + 2 * d.R * row + d.R * (d.fm + d.fm1) * d.e +
                     d.Tl * d.experts * d.e + moe_shared_context(d);
  const int moe_count = moe_layers(d, spec.first_layer, spec.num_layers);
  double out = spec.num_layers * attention + (spec.num_layers - moe_count) * mlp + moe_count * moe;
  if (spec.post_process) out += (d.sp ? d.full() : d.X()) + d.T * d.vocab * d.e;
  if (spec.pre_process) out += d.X() + 4 * d.T;
  return out;
}

struct ScheduleWalk {
  double peak = 0;
  std::array<double, kKinds> at_peak{};
};

ScheduleWalk walk_schedule(const Config& c, const std::vector<GPTChunkSpec>& chunks, int pp_rank,
                           int micro_batches) {
  const int p = c.parallel.pipeline, v = c.parallel.virtual_stages;
  const Dims d = chunk_dims(c);
  const Recompute rc = c.train.recompute;
  // The in-flight pattern repeats after the warm-up: a few groups of micro-batches show the peak.
  int m = micro_batches;
  if (m > 4 * p) m = 4 * p;
  const pipeline::ScheduleParams params{p, pp_rank, m, v, c.parallel.pipeline_schedule};
  const pipeline::Schedule schedule = pipeline::make_schedule(params);
  std::vector<double> kept(chunks.size());
  for (std::size_t i = 0; i < chunks.size(); ++i) kept[i] = chunk_kept(d, chunks[i], rc);

  // Sends the executor batches with a receive from the same neighbour (paired_exchanges): they
  // complete with the batch, before the next compute.
  const pipeline::Placement placement = pipeline::placement_of(c.parallel.pipeline_schedule);
  std::set<std::size_t> batched_sends;
  if (p > 1)
    for (const pipeline::PairedExchange& e : pipeline::paired_exchanges(params, pipeline::make_schedule))
      for (std::size_t i = e.begin; i < e.end; ++i) {
        const pipeline::Action& a = schedule[i];
        if (a.op != pipeline::Op::SendForward && a.op != pipeline::Op::SendBackward) continue;
        const int dest = pipeline::global_stage(p, pp_rank, a.chunk, placement) +
                         (a.op == pipeline::Op::SendForward ? 1 : -1);
        if (pipeline::stage_owner(p, dest, placement).rank == e.peer) batched_sends.insert(i);
      }

  Tracker t;
  // Bytes of one orientation of each chunk's packed weights (0 when the step does not pack).
  std::vector<double> packed(chunks.size(), 0.0);
  if (packs_weights(c, micro_batches))
    for (std::size_t i = 0; i < chunks.size(); ++i)
      packed[i] = chunk_gemm_weight_elements(c.model, chunks[i], c.parallel.tensor) *
                  static_cast<double>(dtype_size(compute_dtype(c.train.precision)));
  std::vector<bool> packed_forward(chunks.size(), false), packed_backward(chunks.size(), false);
  const auto pack = [&](std::vector<bool>& done, std::size_t chunk) {
    if (done[chunk]) return;
    done[chunk] = true;
    t.alloc(kPacked, packed[chunk]);
  };

  double pending_sends = 0;  // sends still in flight while the next action computes
  double batched = 0;        // sends of a batch, freed when it completes (before the next compute)
  const int last = p * v - 1;
  for (std::size_t i = 0; i < schedule.size(); ++i) {
    const pipeline::Action& a = schedule[i];
    const GPTChunkSpec& spec = chunks[static_cast<std::size_t>(a.chunk)];
    const int g = pipeline::global_stage(p, pp_rank, a.chunk, placement);
    const bool compute = a.op == pipeline::Op::Forward || a.op == pipeline::Op::Backward ||
                         a.op == pipeline::Op::BackwardInput || a.op == pipeline::Op::BackwardWeight;
    if (compute) {
      t.free(kCommunication, batched);
      batched = 0;
    }
    switch (a.op) {
      case pipeline::Op::RecvForward:
        t.alloc(kActivations, d.X());  // becomes the chunk's saved input
        break;
      case pipeline::Op::RecvBackward:
        break;  // allocated inside chunk_backward
      case pipeline::Op::Forward: {
        pack(packed_forward, static_cast<std::size_t>(a.chunk));
        chunk_forward(t, d, spec, rc);
        if (g != last) t.alloc(kCommunication, d.X());  // the output, until its send completes
        t.free(kCommunication, pending_sends);
        pending_sends = 0;
        break;
      }
      case pipeline::Op::Backward: {
        pack(packed_backward, static_cast<std::size_t>(a.chunk));
        chunk_backward(t, d, spec, rc, kept[static_cast<std::size_t>(a.chunk)]);
        t.free(kCommunication, pending_sends);
        pending_sends = 0;
        break;
      }
      // Split backward (zero-bubble): B frees what the fused backward frees, less what W still
      // reads, which stays until W (an estimate from the layers' saved tensors; the walk's
      // in-flight pattern is the schedule's own).
      case pipeline::Op::BackwardInput: {
        pack(packed_backward, static_cast<std::size_t>(a.chunk));
        chunk_backward(t, d, spec, rc, kept[static_cast<std::size_t>(a.chunk)]);
        t.alloc(kActivations, chunk_weight_state(d, spec));
        t.free(kCommunication, pending_sends);
        pending_sends = 0;
        break;
      }
      case pipeline::Op::BackwardWeight:
        t.free(kActivations, chunk_weight_state(d, spec));
        break;
      case pipeline::Op::SendForward:
      case pipeline::Op::SendBackward:
        (batched_sends.count(i) ? batched : pending_sends) += d.X();
        break;
    }
  }
  t.free(kCommunication, pending_sends + batched);
  return {t.peak, t.at_peak};
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

MemoryPlan plan_memory(const Config& c, int world_size) {
  const RankGrid grid = RankGrid::from_world(world_size, c.parallel.tensor, c.parallel.pipeline,
                                             c.parallel.context, c.parallel.expert, c.parallel.expert_tensor);
  const int dp = grid.sizes().data;
  const int micro_batches = c.train.global_batch_size / (c.train.micro_batch_size * dp);
  const std::string activation_keys =
      c.parallel.pipeline > 1
          ? "model.num_layers, model.seq_length, train.micro_batch_size, model.hidden_size, "
            "parallel.pipeline, train.recompute"
          : "model.num_layers, model.seq_length, train.micro_batch_size, model.hidden_size, train.recompute";
  const std::string static_keys =
      "model.num_layers, model.hidden_size, model.vocab_size, parallel.tensor, "
      "parallel.pipeline";

  std::map<int, RankMemoryPlan> by_stage;  // ranks of one pipeline stage have the same plan
  for (int pp = 0; pp < c.parallel.pipeline; ++pp) {
    const auto chunks = pipeline::stage_layout(pipeline::LayoutParams::of(c), pp);
    const StaticBytes s = plan_static(c, chunks);
    const ScheduleWalk walk = walk_schedule(c, chunks, pp, micro_batches);
    RankMemoryPlan r;
    r.pp = pp;
    r.terms = {
        {"parameters", to_bytes(s.parameters), static_keys + ", train.precision"},
        {"gradients", to_bytes(s.gradients), static_keys},
        {"optimizer", to_bytes(s.optimizer), static_keys + ", optimizer.distributed, train.precision"},
        {"activations", to_bytes(walk.at_peak[kActivations]), activation_keys},
        {"communication", to_bytes(walk.at_peak[kCommunication]),
         "model.seq_length, train.micro_batch_size, model.hidden_size"},
        {"workspace", to_bytes(walk.at_peak[kWorkspace]),
         "model.seq_length, train.micro_batch_size, model.vocab_size, model.ffn_hidden_size"},
        {"schedule", to_bytes(schedule_bytes(c, micro_batches)),
         "train.global_batch_size, train.micro_batch_size, parallel.virtual_stages"},
    };
    if (packs_weights(c, micro_batches))
      r.terms.push_back(
          {"packed_weights", to_bytes(walk.at_peak[kPacked]), static_keys + ", train.precision"});
    // A checkpoint save, between steps, may peak above training: what it needs beyond that peak.
    double trained = 0;
    for (const MemoryTerm& term : r.terms)
      if (term.name != "schedule") trained += static_cast<double>(term.bytes);
    const double save = c.checkpoint.dir.empty() ? 0.0 : std::max(0.0, s.steady + s.save - trained);
    r.terms.push_back(
        {"checkpoint", to_bytes(save), "checkpoint.dir, optimizer.distributed, optimizer.sharding"});
    for (const MemoryTerm& term : r.terms) {
      r.peak_bytes += term.bytes;
      if (term.name != "schedule") r.allocator_bytes += term.bytes;
    }
    by_stage[pp] = std::move(r);
  }
  MemoryPlan plan;
  for (int rank = 0; rank < world_size; ++rank) {
    const Coord coord = grid.coord(rank);
    RankMemoryPlan r = by_stage.at(coord.pp);
    r.rank = rank;
    r.tp = coord.tp;
    r.cp = coord.cp;
    r.dp = coord.dp;
    plan.ranks.push_back(std::move(r));
  }
  return plan;
}

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
  // Synthetic micro-batches: this rank's cp share of the sequence (shapes only).
  const int64_t b = c.train.micro_batch_size, s = c.model.seq_length / c.parallel.context;
  const auto data = [b, s](int) {
    return pipeline::MicroBatch{Tensor::empty({b, s}, DType::I32, Device::meta()),
                                Tensor::empty({b, s}, DType::I32, Device::meta())};
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
  for (int rank = 0; rank < world_size; ++rank) {
    // One run per pipeline stage: its first rank. The other ranks of a stage hold equal shares of
    // equal tensors (tp, cp, dp and ep positions differ in which share, not its size).
    const Coord coord = grid.coord(rank);
    if (by_stage.count(coord.pp) != 0) continue;
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
    // The save's gathered state: still the layout arithmetic (plan_static), not a meta run.
    const double save = c.checkpoint.dir.empty() ? 0.0 : std::max(0.0, st.steady + st.save - m.peak);
    r.terms.push_back(
        {"checkpoint", to_bytes(save), "checkpoint.dir, optimizer.distributed, optimizer.sharding"});
    for (const MemoryTerm& term : r.terms) {
      r.peak_bytes += term.bytes;
      if (term.name != "schedule") r.allocator_bytes += term.bytes;
    }
    by_stage[coord.pp] = std::move(r);
  }
  MemoryPlan plan;
  for (int rank = 0; rank < world_size; ++rank) {
    const Coord coord = grid.coord(rank);
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
