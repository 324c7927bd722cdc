#pragma once
// The training configuration: typed structs with defaults, read from YAML, overridden by
// `--set section.key=value`, and validated strictly before any rank starts work.
//
// Every problem throws parallel::ConfigError with one line that names the key, the value and the
// rule, e.g.
//   config: model.num_attention_heads = 6: must be divisible by parallel.tensor (4)
//   config: model.hidden_sise: unknown key (did you mean model.hidden_size?)
//   config: train.steps = "ten": expected an integer
// Key names follow Megatron's arguments, cleaned up (docs/configuration.md lists them all).
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/dtype.hpp"  // Precision
#include "parallel/rope.hpp"   // RopeScaling

namespace parallel {

enum class Normalization { LayerNorm, RMSNorm };
enum class Activation { GeLU, SwiGLU };
enum class PositionEmbedding { Learned, Rope };
// mha: multi-head / grouped-query self-attention; mla: DeepSeek-V2/V3's multi-head latent attention.
enum class AttentionType { MHA, MLA };
enum class Recompute { None, Selective, Full };
enum class LrDecay { Constant, Linear, Cosine };
enum class DeviceKind { CPU, CUDA };
// parallel.pipeline_schedule (docs/pipeline.md). Auto: interleaved when virtual_stages > 1, else
// 1F1B (no pipelining on one stage). ZeroBubbleH1 ("zb-h1"): 1F1B with split backward, the weight
// steps moved into the cool-down bubbles. ZeroBubbleV ("zb-v") and DualPipeV ("dualpipe-v"): two
// chunks per rank in a V placement (virtual_stages 2).
enum class PipelineSchedule { Auto, GPipe, OneFOneB, Interleaved, ZeroBubbleH1, ZeroBubbleV, DualPipeV };
// What data parallelism shards over the dp ranks (Megatron-FSDP's names; ZeRO stages 0-3):
// nothing, the optimizer state, + gradients, + parameters (docs/optimizer.md).
enum class Sharding { None, Optim, OptimGrads, OptimGradsParams };
// How context-parallel attention sees the whole sequence (parallel.context_comm; docs/parallelism.md):
// ring attention (K/V blocks passed around the cp ring with send/recv, overlapped with the block
// computation), Ulysses (all-to-all from sequence-sharded to head-sharded and back), or an
// all-gather of K/V.
enum class ContextComm { P2P, A2A, AllGather };
// Which positions each context-parallel rank holds (parallel.context_layout; context_parallel.hpp):
// the zigzag of 2 * context chunks, or granules balanced by the attention work that documents and
// windows leave; auto: balanced for p2p and allgather when documents (data.reset_attention_mask)
// or a sliding window are on, else the zigzag.
enum class ContextLayout { Auto, Zigzag, Balanced };
// model.moe_token_dispatcher: how tokens reach the experts of other expert-parallel ranks.
// AllToAll: each rank sends each expert's tokens to its owner (variable-size all-to-all, counts
// first). AllGather: every rank gathers all tokens of the ep group and runs its experts on those
// routed to them; the outputs are reduce-scattered back.
enum class MoeDispatcher { AllToAll, AllGather };
// model.moe_router_score_function: how the router turns its logits into expert scores (router.hpp):
// a softmax over the experts (Switch, Mixtral, Qwen3-MoE) or an independent sigmoid per expert
// (DeepSeek-V3).
enum class MoeScoreFunction { Softmax, Sigmoid };
// What the trainer's guard does with a step whose loss or gradient norm is not finite
// (train.nonfinite_policy) or spikes (train.spike_policy): stop the run, skip the update, or (spikes
// only) warn and update. docs/configuration.md#training-guards.
enum class GuardPolicy { Stop, Skip, Warn };
// optimizer.type: AdamW for every parameter, or Muon for the 2-D hidden weights (attention,
// MLP, router and expert matrices) with AdamW for the rest (docs/optimizer.md#muon).
enum class OptimizerType { AdamW, Muon };
// optimizer.muon_scale: how Muon's orthogonalised update of an [A, B] matrix is scaled before the
// learning rate: MatchRmsAdamW 0.2 * sqrt(max(A, B)) (Moonlight: the update's RMS matches AdamW's,
// so AdamW's lr and weight decay carry over), Original sqrt(max(1, A / B)) (Keller Jordan's).
enum class MuonScale { MatchRmsAdamW, Original };
// optimizer.overlap_update: whether each gradient bucket's AdamW update runs as soon as its
// reduction is final, overlapping the rest of the backward (docs/optimizer.md#the-overlapped-update).
// Auto: wherever that is exact and reductions start during the backward; True: required (the
// config is refused where it cannot be exact); False: never.
enum class OverlapUpdate { Auto, True, False };

// LoRA fine-tuning (docs/lora.md): low-rank adapters A [rank, in] and B [out, rank] on the target
// linears, output += (alpha / rank) * B A dropout(x); every other parameter is frozen. rank 0: off.
struct LoraConfig {
  int rank = 0;
  double alpha = 8.0;
  double dropout = 0.0;
  // Comma-separated (a YAML list is accepted too): q, k, v, o (attention output), fc1 (GeLU MLP),
  // gate, up (SwiGLU MLP), fc2 (MLP output), or Hugging Face's q_proj, k_proj, v_proj, o_proj,
  // gate_proj, up_proj, down_proj, fc_in/fc_out ... (lora_target_modules() maps them).
  std::string target_modules = "q,v";
  bool enabled() const { return rank > 0; }
  double scale() const { return alpha / rank; }
};

// The target modules in our names, in the order q, k, v, o, fc1, gate, up, fc2, each once. Throws
// parallel::Error naming `key` and the module for an unknown name or an empty list.
std::vector<std::string> lora_target_modules(const std::string& text,
                                             const std::string& key = "model.lora.target_modules");

struct ModelConfig {
  int num_layers = 2;
  int hidden_size = 64;
  int num_attention_heads = 4;
  int num_query_groups = 0;  // 0: same as num_attention_heads (no grouped-query attention)
  int head_dim = 0;         // per-head size of queries, keys and values; 0: hidden_size / num_attention_heads
  int ffn_hidden_size = 0;  // 0: 4 * hidden_size
  int vocab_size = 50257;   // real vocabulary; padded to a multiple of 128 * tensor internally
  int seq_length = 128;
  int max_position_embeddings = 0;  // 0: seq_length
  Normalization normalization = Normalization::LayerNorm;
  Activation activation = Activation::GeLU;
  PositionEmbedding position_embedding = PositionEmbedding::Learned;
  bool add_bias = true;
  bool add_qkv_bias = false;  // biases on query, key and value even without add_bias (Qwen2)
  // RMSNorm over each head of the queries and of the keys (weights [head_dim], shared by the heads),
  // before rope (Qwen3's q_norm / k_norm).
  bool qk_norm = false;
  bool tie_embeddings = true;
  double dropout = 0.0;
  double init_std = 0.02;
  double norm_epsilon = 1e-5;
  double rope_theta = 10000.0;
  // Mixture of experts (docs/model.md, "Mixture of experts"). num_experts 0: every layer dense.
  int num_experts = 0;
  int moe_router_topk = 2;
  int moe_ffn_hidden_size = 0;  // 0: ffn_hidden_size
  int moe_layer_freq = 1;       // layers i with i % moe_layer_freq == 0 are MoE layers
  double moe_aux_loss_coeff = 0.0;
  double moe_z_loss_coeff = 0.0;
  double moe_capacity_factor = 0.0;           // 0: dropless
  int moe_shared_expert_ffn_hidden_size = 0;  // 0: no shared expert
  MoeDispatcher moe_token_dispatcher = MoeDispatcher::AllToAll;
  // Routing (docs/model.md, "Routing"; src/model/router.hpp).
  MoeScoreFunction moe_router_score_function = MoeScoreFunction::Softmax;
  bool moe_norm_topk_prob = false;         // combine weights divided by the chosen scores' sum
  double moe_routed_scaling_factor = 1.0;  // combine weights multiplied by this
  int moe_n_group = 1;                     // experts in this many groups (group-limited routing)
  int moe_topk_group = 1;                  // a token's experts come from its best this-many groups
  bool moe_router_expert_bias = false;     // aux-loss-free balancing (e_score_correction_bias)
  double moe_bias_update_speed = 0.001;    // the bias's step per optimizer update
  double moe_seq_aux_loss_coeff = 0.0;     // DeepSeek-V3's sequence-wise balance loss (alpha)
  int moe_first_k_dense_replace = 0;       // layers below this one keep the dense MLP
  // Benchmarking: every expert gets exactly its share of the assignments whatever the scores (token
  // t's j-th choice expert (t k + j) mod E, the meta run's assumption; router.hpp). Changes the routing.
  bool moe_router_force_load_balancing = false;
  bool is_moe_layer(int layer) const {
    return num_experts > 0 && layer >= moe_first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  // Multi-token prediction (DeepSeek-V3's MTP; docs/model.md, "Multi-token prediction"): this many
  // extra depths after the last layer, depth k predicting the token k + 1 ahead from the previous
  // depth's hidden state and the embedding of the token k ahead, each with the make-up of the last
  // layer. Its loss, the mean over depths, enters the objective times mtp_loss_scaling_factor.
  int mtp_num_layers = 0;  // 0: off
  double mtp_loss_scaling_factor = 0.1;
  // Multi-head latent attention (attention: mla; docs/model.md, "Multi-head latent attention"):
  // queries through a rank-q_lora_rank bottleneck with its RMSNorm (0: one plain projection), keys
  // and values from a rank-kv_lora_rank latent with its RMSNorm, query/key heads of
  // qk_nope_head_dim + qk_rope_head_dim (the rope part of the key one head shared by all), value
  // heads of v_head_dim. The rope dimensions are in rotate-half order (Llama's); DeepSeek-V3's
  // rope_interleave is a permutation of the weights, for the Hugging Face conversion.
  AttentionType attention = AttentionType::MHA;
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  bool is_mla() const { return attention == AttentionType::MLA; }
  RopeScaling rope_scaling;  // model.rope_scaling* keys: none, linear or llama3 (parallel/rope.hpp)
  // Sliding-window attention (Mistral's sliding_window): a query sees itself and the
  // sliding_window - 1 positions before it; 0: all. Which layers are windowed:
  //   sliding_window_pattern = n > 0: every n-th layer (layers n-1, 2n-1, ...) is global, the rest
  //                                    windowed (Gemma-2/3's pattern); 0: every layer windowed;
  //   max_window_layers = m: layers below m are global (Qwen2's max_window_layers); 0: none.
  int sliding_window = 0;
  int sliding_window_pattern = 0;
  int max_window_layers = 0;
  // The window of layer `layer` (0-based, global index): 0 for a global layer.
  int attention_head_dim() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  int64_t layer_window(int layer) const {
    if (sliding_window <= 0 || layer < max_window_layers) return 0;
    if (sliding_window_pattern > 0 && (layer + 1) % sliding_window_pattern == 0) return 0;
    return sliding_window;
  }
  // The Hugging Face architecture the model came from and exports as ("MistralForCausalLM", ...;
  // docs/huggingface.md). It does not change the model; "" lets the export choose by the model's shape.
  std::string hf_architecture;
  // DeepSeek-V3's rope_interleave: the Hugging Face checkpoint holds the rope rows of the queries and
  // of kv_down in interleaved pairs (2i, 2i+1); ours are in rotate-half order (i, i + r/2). The import
  // permutes those rows and the export permutes them back; like hf_architecture it does not change
  // the model. Only with attention: mla.
  bool hf_rope_interleave = false;
  LoraConfig lora;  // model.lora.*: LoRA adapters (rank 0: none)
  // Whether `module` (q, k, v, o, fc1, gate, up, fc2) carries an adapter.
  bool lora_targets(const std::string& module) const;
};

struct ParallelConfig {
  int tensor = 1;
  int pipeline = 1;
  int virtual_stages = 1;
  PipelineSchedule pipeline_schedule = PipelineSchedule::Auto;
  bool sequence_parallel = false;
  int context = 1;  // context parallel: each sample's sequence is split over `context` ranks
  ContextComm context_comm = ContextComm::P2P;
  ContextLayout context_layout = ContextLayout::Auto;
  // Expert parallelism folds onto the dense ranks (Megatron-Core): experts split over `expert`
  // ranks (times expert_tensor) out of tensor * context * data; it does not divide the world.
  int expert = 1;
  // Tensor parallelism inside experts: each expert's width split over expert_tensor ranks
  // (moe_ffn_hidden_size divisible by it; layout_rules.hpp).
  int expert_tensor = 1;
  // Explicit layer counts for the first / last pipeline stage (0: split evenly).
  int first_stage_layers = 0;
  int last_stage_layers = 0;
  // Groups that must lie inside one node, comma-separated (tp, cp, dp, pp, ep, etp, edp, shard;
  // node_map.hpp): checked against MPI's node map at start-up, a run that breaks it is refused.
  std::string node_local;
  int data = 0;  // derived: world / (tensor * pipeline * context); not a YAML key
};

struct TrainConfig {
  int micro_batch_size = 1;
  int global_batch_size = 8;
  int steps = 10;
  uint64_t seed = 1234;
  Precision precision = Precision::FP32;
  Recompute recompute = Recompute::None;
  int log_interval = 1;
  int eval_interval = 0;  // 0: never
  int eval_steps = 1;
  std::string output_dir = "runs/default";
  std::string tensorboard_dir;  // TensorBoard event files (rank 0); empty: none
  DeviceKind device = DeviceKind::CPU;
  double peak_tflops = 0.0;       // per rank, for MFU; 0: the device's known peak (CPU: measured default)
  double comm_timeout_s = 600.0;  // watchdog deadline of every blocking communication wait (NCCL's)
  // Training guards (docs/configuration.md#training-guards).
  GuardPolicy nonfinite_policy = GuardPolicy::Stop;  // stop or skip; never warn
  double spike_factor = 0.0;  // a loss or grad norm above this times the running median spikes; 0: off
  int spike_window = 20;      // steps in the running median
  GuardPolicy spike_policy = GuardPolicy::Skip;
  int max_consecutive_skips = 20;  // skipped updates in a row (any cause) that stop the run; 0: no limit
  // Silent data corruption check: every this many steps the step's forward and backward run twice
  // from the same state and each rank compares its two results bitwise; 0: off.
  int sdc_check_interval = 0;
  GuardPolicy sdc_policy = GuardPolicy::Stop;  // a rank whose two runs differ: stop or warn
};

struct OptimizerConfig {
  OptimizerType type = OptimizerType::AdamW;
  double lr = 3e-4;
  double min_lr = 0.0;
  int warmup_steps = 0;
  LrDecay lr_decay = LrDecay::Cosine;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double clip_grad = 1.0;  // 0: no clipping
  // `distributed: true` is the spelling of `sharding: optim`, and true whenever sharding != none.
  bool distributed = false;
  Sharding sharding = Sharding::None;
  int sharding_group_size = 0;        // HSDP: shard within groups of this many dp ranks; 0: all of dp
  bool reshard_after_forward = true;  // optim_grads_params: free a unit's params after its forward
  int prefetch_units = 1;             // optim_grads_params: units gathered ahead of the computing one
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  OverlapUpdate overlap_update = OverlapUpdate::Auto;
  int64_t bucket_size = 0;              // elements; 0: Megatron's default max(40M, 1M * dp)
  double initial_loss_scale = 65536.0;  // fp16 only
  int loss_scale_window = 1000;         // fp16 only
  // Muon (type muon): torch.optim.Muon's defaults, the scale Moonlight's.
  double muon_momentum = 0.95;
  bool muon_nesterov = true;
  int muon_ns_steps = 5;
  MuonScale muon_scale = MuonScale::MatchRmsAdamW;
};

struct DataConfig {
  // A blend (blended_dataset.hpp): one indexed-dataset prefix, "synthetic", or weight/path pairs in
  // Megatron's flat form "0.7 a 0.3 b". YAML lists are stored in that form.
  std::string path = "synthetic";
  // A split's own blend (Megatron's --train-data-path ...); empty: data.path split by data.split.
  std::string train_path;
  std::string valid_path;
  std::string test_path;
  std::string cache_path;  // directory of blend index files; empty: `cache` beside the first dataset
  std::string split = "969,30,1";
  bool shuffle = true;
  // GPT2BPETokenizer | ByteLevel | gpt2 (alias) | HuggingFace. The trainer reads it for the
  // end-of-document id and checks its vocabulary fits model.vocab_size (check_tokenizer).
  std::string tokenizer = "gpt2";
  std::string vocab_file;      // GPT2BPETokenizer
  std::string merge_file;      // GPT2BPETokenizer
  std::string tokenizer_file;  // HuggingFace: the tokenizer.json
  // Documents packed into a sequence (Megatron's keys and semantics; docs/data.md): positions
  // restart after each end-of-document token, attention does not cross documents, and the loss
  // on end-of-document targets is masked out.
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
  int eod_token = -1;  // the end-of-document id for the three above; -1: the tokenizer's
  // "gpt": windows over the concatenated documents. "sft": fine-tuning (docs/data.md, "Fine-tuning
  // data"): each document is a sample with a loss mask, samples are packed whole into sequences
  // that keep them apart, and the loss is the mean over the masked-in tokens of the global batch.
  std::string format = "gpt";
  // sft: the loss mask dataset of data.path (one dataset). Empty: each dataset's PREFIX_text_document
  // reads PREFIX_loss_mask_document.
  std::string loss_mask_path;
};

struct CheckpointConfig {
  std::string dir;        // empty: no checkpoints
  int save_interval = 0;  // 0: only at the end (if dir is set)
  std::string load;       // empty, "latest", a checkpoint root, or one step's directory
  int keep_last = 0;      // 0: keep all
  // Copy the state to host buffers and write it on a background thread while training goes on
  // (docs/checkpoints.md, "Asynchronous saves").
  bool async = false;
};

struct Config {
  ModelConfig model;
  ParallelConfig parallel;
  TrainConfig train;
  OptimizerConfig optimizer;
  DataConfig data;
  CheckpointConfig checkpoint;
};

// Parses YAML text (file_name is used in messages only), applies overrides of the form
// "section.key=value" in order, and validates against `world_size` ranks. Throws ConfigError.
Config parse_config(const std::string& yaml_text, const std::vector<std::string>& overrides, int world_size,
                    const std::string& file_name = "<string>");
// Reads `path` (a missing or unreadable file is a ConfigError) and calls parse_config.
Config load_config(const std::string& path, const std::vector<std::string>& overrides, int world_size);
// Checks every rule and fills the derived fields (parallel.data, 0-defaults). Idempotent.
void validate_config(Config& config, int world_size);
// The whole configuration as YAML, every key present: stored in checkpoints and run directories.
std::string config_to_yaml(const Config& config);
// One line per key with its type, default and meaning: for --help.
std::string config_reference();

}  // namespace parallel
