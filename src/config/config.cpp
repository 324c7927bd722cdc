// Config: YAML <-> typed structs, overrides, validation, and the --help reference.
//
// Every key is listed exactly once, in the for_each_field() overloads below (key, member,
// description). Loading, overrides, config_to_yaml(), config_reference() and the key names in
// validation messages all walk those lists, so adding a key means adding one line.
#include "parallel/config.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <set>
#include <span>
#include <sstream>
#include <string_view>
#include <type_traits>

#include "io/input_file.hpp"
#include "parallel/blended_dataset.hpp"
#include "parallel/error.hpp"
#include "parallel/layout_rules.hpp"
#include "parallel/node_local.hpp"
#include "rules.hpp"

namespace parallel {
namespace {

// ---- enum names (lowercase, in declaration order, so the enum's value indexes the list) --------

constexpr std::string_view kNormalizationNames[] = {"layernorm", "rmsnorm"};
constexpr std::string_view kActivationNames[] = {"gelu", "swiglu"};
constexpr std::string_view kPositionEmbeddingNames[] = {"learned", "rope"};
constexpr std::string_view kAttentionTypeNames[] = {"mha", "mla"};
constexpr std::string_view kRopeScalingNames[] = {"none", "linear", "llama3", "yarn"};
constexpr std::string_view kPrecisionNames[] = {"fp32", "bf16", "fp16"};
constexpr std::string_view kRecomputeNames[] = {"none", "selective", "full"};
constexpr std::string_view kLrDecayNames[] = {"constant", "linear", "cosine"};
constexpr std::string_view kDeviceKindNames[] = {"cpu", "cuda"};
constexpr std::string_view kShardingNames[] = {"none", "optim", "optim_grads", "optim_grads_params"};
constexpr std::string_view kPipelineScheduleNames[] = {"auto",  "gpipe", "1f1b",      "interleaved",
                                                       "zb-h1", "zb-v",  "dualpipe-v"};
constexpr std::string_view kContextCommNames[] = {"p2p", "a2a", "allgather"};
constexpr std::string_view kContextLayoutNames[] = {"auto", "zigzag", "balanced"};
constexpr std::string_view kMoeDispatcherNames[] = {"alltoall", "allgather"};
constexpr std::string_view kMoeScoreFunctionNames[] = {"softmax", "sigmoid"};
constexpr std::string_view kGuardPolicyNames[] = {"stop", "skip", "warn"};
constexpr std::string_view kOptimizerTypeNames[] = {"adamw", "muon"};
constexpr std::string_view kMuonScaleNames[] = {"match_rms_adamw", "original"};
constexpr std::string_view kOverlapUpdateNames[] = {"auto", "true", "false"};

std::span<const std::string_view> names_of(Normalization) { return kNormalizationNames; }
std::span<const std::string_view> names_of(Activation) { return kActivationNames; }
std::span<const std::string_view> names_of(PositionEmbedding) { return kPositionEmbeddingNames; }
std::span<const std::string_view> names_of(AttentionType) { return kAttentionTypeNames; }
std::span<const std::string_view> names_of(RopeScalingType) { return kRopeScalingNames; }
std::span<const std::string_view> names_of(Precision) { return kPrecisionNames; }
std::span<const std::string_view> names_of(Recompute) { return kRecomputeNames; }
std::span<const std::string_view> names_of(LrDecay) { return kLrDecayNames; }
std::span<const std::string_view> names_of(DeviceKind) { return kDeviceKindNames; }
std::span<const std::string_view> names_of(Sharding) { return kShardingNames; }
std::span<const std::string_view> names_of(PipelineSchedule) { return kPipelineScheduleNames; }
std::span<const std::string_view> names_of(ContextComm) { return kContextCommNames; }
std::span<const std::string_view> names_of(ContextLayout) { return kContextLayoutNames; }
std::span<const std::string_view> names_of(MoeDispatcher) { return kMoeDispatcherNames; }
std::span<const std::string_view> names_of(MoeScoreFunction) { return kMoeScoreFunctionNames; }
std::span<const std::string_view> names_of(GuardPolicy) { return kGuardPolicyNames; }
std::span<const std::string_view> names_of(OptimizerType) { return kOptimizerTypeNames; }
std::span<const std::string_view> names_of(MuonScale) { return kMuonScaleNames; }
std::span<const std::string_view> names_of(OverlapUpdate) { return kOverlapUpdateNames; }

template <typename T>
concept NamedEnum = std::is_enum_v<T> && requires(T value) {
  names_of(value);
};

constexpr std::string_view kTokenizers[] = {"GPT2BPETokenizer", "ByteLevel", "gpt2", "HuggingFace"};

// ---- the key tables ----------------------------------------------------------------------------
// S is the section struct, const or not; f(key, member, description) is called once per key.

template <typename S, typename F>
requires std::same_as<std::remove_const_t<S>, ModelConfig>
void for_each_field(S& s, F&& f) {
  f("num_layers", s.num_layers, "number of transformer layers");
  f("hidden_size", s.hidden_size, "width of the residual stream");
  f("num_attention_heads", s.num_attention_heads, "attention heads per layer");
  f("num_query_groups", s.num_query_groups,
    "key/value heads for grouped-query attention (0: num_attention_heads)");
  f("head_dim", s.head_dim,
    "size of each attention head (0: hidden_size / num_attention_heads; Qwen3 sets it apart)");
  f("ffn_hidden_size", s.ffn_hidden_size,
    "MLP inner width (0: 4 * hidden_size; set it explicitly for swiglu)");
  f("vocab_size", s.vocab_size, "real vocabulary size (padded to a multiple of 128 * tensor internally)");
  f("seq_length", s.seq_length, "tokens per sample");
  f("max_position_embeddings", s.max_position_embeddings, "learned position table size (0: seq_length)");
  f("normalization", s.normalization, "normalization layer");
  f("activation", s.activation, "MLP activation");
  f("position_embedding", s.position_embedding, "position encoding");
  f("add_bias", s.add_bias, "biases in linear layers");
  f("add_qkv_bias", s.add_qkv_bias, "biases on the query, key and value linears even when add_bias is false");
  f("qk_norm", s.qk_norm, "RMSNorm over each query and key head before rope (Qwen3)");
  f("tie_embeddings", s.tie_embeddings, "share the input embedding with the output layer");
  f("dropout", s.dropout, "dropout probability for attention and hidden states");
  f("init_std", s.init_std, "standard deviation of the normal weight initialization");
  f("norm_epsilon", s.norm_epsilon, "epsilon of the normalization layers");
  f("rope_theta", s.rope_theta, "base of the rotary embedding frequencies");
  f("num_experts", s.num_experts, "experts per MoE layer (0: dense MLPs only)");
  f("moe_router_topk", s.moe_router_topk, "experts each token is routed to");
  f("moe_ffn_hidden_size", s.moe_ffn_hidden_size, "inner width of each expert's MLP (0: ffn_hidden_size)");
  f("moe_layer_freq", s.moe_layer_freq, "every k-th layer (0, k, 2k, ...) is a MoE layer");
  f("moe_aux_loss_coeff", s.moe_aux_loss_coeff, "weight of the Switch/GShard load-balancing loss (0: off)");
  f("moe_z_loss_coeff", s.moe_z_loss_coeff, "weight of the router z-loss (0: off)");
  f("moe_capacity_factor", s.moe_capacity_factor,
    "expert capacity as a multiple of tokens * topk / experts; assignments beyond it are dropped (0: "
    "dropless)");
  f("moe_shared_expert_ffn_hidden_size", s.moe_shared_expert_ffn_hidden_size,
    "inner width of a shared expert every token passes through (0: none)");
  f("moe_token_dispatcher", s.moe_token_dispatcher,
    "how tokens reach other expert-parallel ranks: alltoall or allgather");
  f("moe_router_score_function", s.moe_router_score_function,
    "expert scores from the router logits: softmax over the experts or sigmoid per expert");
  f("moe_norm_topk_prob", s.moe_norm_topk_prob, "divide the chosen experts' weights by their sum");
  f("moe_routed_scaling_factor", s.moe_routed_scaling_factor, "multiply the combine weights by this");
  f("moe_n_group", s.moe_n_group, "experts in this many equal groups for group-limited routing");
  f("moe_topk_group", s.moe_topk_group, "each token's experts come from its best this-many groups");
  f("moe_router_expert_bias", s.moe_router_expert_bias,
    "auxiliary-loss-free balancing: a per-expert bias on the scores that only chooses experts");
  f("moe_router_force_load_balancing", s.moe_router_force_load_balancing,
    "benchmarking: route token t's j-th choice to expert (t k + j) mod E whatever the scores, so every "
    "expert gets its exact share (changes the model's routing)");
  f("moe_bias_update_speed", s.moe_bias_update_speed,
    "the expert bias's step per update: bias += speed * sign(mean load - load)");
  f("moe_seq_aux_loss_coeff", s.moe_seq_aux_loss_coeff, "weight of the sequence-wise balance loss (0: off)");
  f("moe_first_k_dense_replace", s.moe_first_k_dense_replace, "layers below this one keep the dense MLP");
  f("mtp_num_layers", s.mtp_num_layers,
    "multi-token prediction depth: extra layers predicting tokens 2..D+1 ahead (0: off)");
  f("mtp_loss_scaling_factor", s.mtp_loss_scaling_factor,
    "weight of the multi-token prediction loss (the mean over depths) in the objective");
  f("attention", s.attention,
    "mha (multi-head / grouped-query attention) or mla (DeepSeek's multi-head latent attention)");
  f("q_lora_rank", s.q_lora_rank, "mla: rank of the query bottleneck (0: one plain query projection)");
  f("kv_lora_rank", s.kv_lora_rank, "mla: rank of the compressed key-value latent");
  f("qk_nope_head_dim", s.qk_nope_head_dim, "mla: query/key head dimensions without rope");
  f("qk_rope_head_dim", s.qk_rope_head_dim,
    "mla: query/key head dimensions with rope (the key's shared by all heads)");
  f("v_head_dim", s.v_head_dim, "mla: value head dimension");
  f("rope_scaling", s.rope_scaling.type,
    "scaling of the rotary frequencies for longer contexts (Hugging Face's rope_type)");
  f("rope_scaling_factor", s.rope_scaling.factor,
    "linear, llama3 and yarn: how much longer the context is than trained");
  f("rope_low_freq_factor", s.rope_scaling.low_freq_factor,
    "llama3: wavelengths above original / this are scaled");
  f("rope_high_freq_factor", s.rope_scaling.high_freq_factor,
    "llama3: wavelengths below original / this are kept");
  f("rope_original_max_position_embeddings", s.rope_scaling.original_max_position_embeddings,
    "llama3 and yarn: the context length before scaling");
  f("rope_beta_fast", s.rope_scaling.beta_fast, "yarn: rotations below which frequencies are interpolated");
  f("rope_beta_slow", s.rope_scaling.beta_slow, "yarn: rotations above which frequencies are kept");
  f("rope_mscale", s.rope_scaling.mscale, "yarn: numerator mscale of the attention factor (0: unset)");
  f("rope_mscale_all_dim", s.rope_scaling.mscale_all_dim,
    "yarn: denominator mscale of the attention factor, and DeepSeek's softmax-scale correction (0: unset)");
  f("rope_attention_factor", s.rope_scaling.attention_factor,
    "yarn: factor on the rotary cos/sin (0: derived from factor, mscale and mscale_all_dim)");
  f("rope_truncate", s.rope_scaling.truncate, "yarn: round the correction range to whole dimensions");
  f("sliding_window", s.sliding_window,
    "a query sees itself and this many - 1 positions before it (Mistral; 0: all)");
  f("sliding_window_pattern", s.sliding_window_pattern,
    "every this-th layer is global, the others windowed (Gemma; 0: all windowed)");
  f("max_window_layers", s.max_window_layers, "layers below this one are global (Qwen2; 0: none)");
  f("hf_architecture", s.hf_architecture,
    "the Hugging Face architecture convert_checkpoint --to hf writes (empty: chosen by the model)");
  f("hf_rope_interleave", s.hf_rope_interleave,
    "mla: the Hugging Face checkpoint's rope rows are interleaved (DeepSeek-V3's rope_interleave); "
    "convert_checkpoint permutes them, the model is the same");
  f("lora.rank", s.lora.rank, "LoRA adapter rank; > 0 freezes every other parameter (docs/lora.md; 0: off)");
  f("lora.alpha", s.lora.alpha, "LoRA scale numerator: adapters add (alpha / rank) * B A x");
  f("lora.dropout", s.lora.dropout, "dropout on the LoRA adapters' input");
  f("lora.target_modules", s.lora.target_modules,
    "linears that get adapters: q, k, v, o, fc1, gate, up, fc2, or Hugging Face's q_proj, k_proj, v_proj, "
    "o_proj, gate_proj, up_proj, down_proj, Mixtral's w1, w3, w2 (comma-separated or a YAML list; on a MoE "
    "model "
    "the MLP names adapt the experts too)");
}

template <typename S, typename F>
requires std::same_as<std::remove_const_t<S>, ParallelConfig>
void for_each_field(S& s, F&& f) {
  f("tensor", s.tensor, "tensor-parallel size");
  f("pipeline", s.pipeline, "pipeline-parallel size (number of stages)");
  f("virtual_stages", s.virtual_stages, "model chunks per pipeline stage (interleaved schedule when > 1)");
  f("pipeline_schedule", s.pipeline_schedule,
    "auto (interleaved if virtual_stages > 1, else 1F1B), gpipe, 1f1b, interleaved, zb-h1, zb-v, "
    "dualpipe-v (docs/pipeline.md)");
  f("sequence_parallel", s.sequence_parallel, "split norms and dropout along the sequence over tensor ranks");
  f("context", s.context,
    "context-parallel size: each sample's sequence is cut into 2 * context chunks, rank i holding chunks i "
    "and 2 * context - 1 - i");
  f("context_comm", s.context_comm,
    "how context-parallel attention sees the whole sequence: p2p (ring attention), a2a (Ulysses "
    "all-to-all over heads), allgather (gather K/V)");
  f("context_layout", s.context_layout,
    "which positions each context-parallel rank holds: zigzag (chunks i and 2 * context - 1 - i), balanced "
    "(granules assigned so that every rank's attention work under documents and windows is equal), auto "
    "(balanced for p2p and allgather with data.reset_attention_mask or model.sliding_window, else zigzag)");
  f("expert", s.expert,
    "expert-parallel size: MoE experts split over this many of the tensor * context * data ranks of a "
    "pipeline stage");
  f("expert_tensor", s.expert_tensor,
    "tensor-parallel size inside experts: each expert's inner width split over this many ranks of the "
    "expert grid (expert * expert_tensor must divide tensor * context * data)");
  f("first_stage_layers", s.first_stage_layers, "layers on the first pipeline stage (0: split evenly)");
  f("last_stage_layers", s.last_stage_layers, "layers on the last pipeline stage (0: split evenly)");
  f("node_local", s.node_local,
    "groups that must lie inside one node, comma-separated: tp, cp, dp, pp, ep, etp, edp, shard (the HSDP "
    "shard group); checked against MPI's nodes at start-up (docs/multinode.md)");
}

template <typename S, typename F>
requires std::same_as<std::remove_const_t<S>, TrainConfig>
void for_each_field(S& s, F&& f) {
  f("micro_batch_size", s.micro_batch_size, "samples per micro-batch per data-parallel rank");
  f("global_batch_size", s.global_batch_size, "samples per optimizer step over all data-parallel ranks");
  f("steps", s.steps, "optimizer steps to train");
  f("seed", s.seed, "random seed");
  f("precision", s.precision, "parameter and compute precision");
  f("recompute", s.recompute, "activation recomputation");
  f("log_interval", s.log_interval, "steps between log lines");
  f("eval_interval", s.eval_interval, "steps between evaluations (0: never)");
  f("eval_steps", s.eval_steps, "batches per evaluation");
  f("output_dir", s.output_dir, "directory for logs and metrics");
  f("tensorboard_dir", s.tensorboard_dir,
    "directory for TensorBoard event files of the metrics.jsonl scalars (empty: none)");
  f("device", s.device, "where to compute");
  f("peak_tflops", s.peak_tflops,
    "peak TFLOP/s per rank for MFU (0: the GPU's known or CPU's measured peak)");
  f("comm_timeout_s", s.comm_timeout_s,
    "seconds a rank waits for a collective or transfer before the watchdog ends the job");
  f("nonfinite_policy", s.nonfinite_policy,
    "a step whose loss or gradient norm is inf or NaN: stop the run (naming step and ranks) or skip its "
    "update");
  f("spike_factor", s.spike_factor,
    "a loss or gradient norm above this times the median of the last spike_window steps is a spike (0: off)");
  f("spike_window", s.spike_window, "steps whose median the spike factor applies to");
  f("spike_policy", s.spike_policy, "a spike: stop the run, skip its update, or warn and update");
  f("max_consecutive_skips", s.max_consecutive_skips,
    "skipped updates in a row (non-finite, spike or fp16 overflow) after which the run stops (0: no limit)");
  f("sdc_check_interval", s.sdc_check_interval,
    "every this many steps, run the step's forward and backward twice from the same state and compare each "
    "rank's results bitwise, to catch silent data corruption (0: off)");
  f("sdc_policy", s.sdc_policy, "a rank whose two runs differ: stop the run (naming step and rank) or warn");
}

template <typename S, typename F>
requires std::same_as<std::remove_const_t<S>, OptimizerConfig>
void for_each_field(S& s, F&& f) {
  f("type", s.type,
    "adamw, or muon: Muon for 2-D hidden weights, AdamW for embeddings, output layer, norms and biases");
  f("lr", s.lr, "peak learning rate");
  f("min_lr", s.min_lr, "learning rate at the end of the decay");
  f("warmup_steps", s.warmup_steps, "steps of linear warmup from 0 to lr");
  f("lr_decay", s.lr_decay, "learning-rate decay after warmup");
  f("weight_decay", s.weight_decay, "decoupled (AdamW) weight decay");
  f("beta1", s.beta1, "Adam first-moment decay");
  f("beta2", s.beta2, "Adam second-moment decay");
  f("eps", s.eps, "Adam epsilon");
  f("clip_grad", s.clip_grad, "global gradient-norm clip (0: no clipping)");
  f("distributed", s.distributed, "shard optimizer state over data-parallel ranks (sharding: optim)");
  f("sharding", s.sharding,
    "what is sharded over data-parallel ranks: optimizer state, + gradients, + parameters (ZeRO-1/2/3)");
  f("sharding_group_size", s.sharding_group_size,
    "HSDP: shard within groups of this many data-parallel ranks, replicate across groups (0: all)");
  f("reshard_after_forward", s.reshard_after_forward,
    "optim_grads_params: free a unit's gathered parameters after its forward (gather again for backward)");
  f("prefetch_units", s.prefetch_units,
    "optim_grads_params: units whose parameter all-gather runs ahead of the computing one");
  f("overlap_grad_reduce", s.overlap_grad_reduce, "overlap gradient reduction with the backward pass");
  f("overlap_param_gather", s.overlap_param_gather, "overlap parameter all-gather with the forward pass");
  f("overlap_update", s.overlap_update,
    "auto, true or false: update each gradient bucket as soon as its reduction is final, during the backward "
    "(only where bitwise the same: clip_grad 0, no fp16, adamw, no guard that skips; auto: then on when "
    "reductions start in the backward)");
  f("bucket_size", s.bucket_size, "gradient bucket size in elements (0: max(40M, 1M * data))");
  f("initial_loss_scale", s.initial_loss_scale, "initial dynamic loss scale (fp16 only)");
  f("loss_scale_window", s.loss_scale_window,
    "steps without overflow before the loss scale grows (fp16 only)");
  f("muon_momentum", s.muon_momentum, "Muon momentum (the buffer's EMA decay, torch.optim.Muon's)");
  f("muon_nesterov", s.muon_nesterov, "Muon: orthogonalise the Nesterov look-ahead, not the buffer");
  f("muon_ns_steps", s.muon_ns_steps, "Muon: Newton-Schulz iterations (quintic 3.4445, -4.7750, 2.0315)");
  f("muon_scale", s.muon_scale,
    "Muon update scale of an [A, B] matrix: match_rms_adamw 0.2*sqrt(max(A,B)), original sqrt(max(1,A/B))");
}

template <typename S, typename F>
requires std::same_as<std::remove_const_t<S>, DataConfig>
void for_each_field(S& s, F&& f) {
  f("path", s.path,
    "indexed-dataset prefix, \"synthetic\", or a weighted blend: a YAML list [{weight: 0.7, path: a}, "
    "{weight: 0.3, path: b}] or Megatron's \"0.7 a 0.3 b\" (docs/data.md)");
  f("split", s.split, "train,validation,test weights, e.g. \"969,30,1\": each dataset of data.path is split");
  f("train_path", s.train_path,
    "the train split's own blend, every document of each dataset (as data.path; empty: data.path split by "
    "data.split)");
  f("valid_path", s.valid_path, "the validation split's own blend (as train_path)");
  f("test_path", s.test_path, "the test split's own blend (as train_path)");
  f("cache_path", s.cache_path,
    "directory of blend index files (empty: `cache` beside the blend's first dataset)");
  f("shuffle", s.shuffle, "shuffle samples each epoch");
  f("tokenizer", s.tokenizer,
    "GPT2BPETokenizer, ByteLevel, gpt2 (alias of GPT2BPETokenizer) or HuggingFace (a tokenizer.json: "
    "data.tokenizer_file)");
  f("vocab_file", s.vocab_file, "GPT2BPETokenizer: the vocabulary file");
  f("merge_file", s.merge_file, "GPT2BPETokenizer: the BPE merges file");
  f("tokenizer_file", s.tokenizer_file,
    "HuggingFace: the tokenizer.json (preprocess_data's --tokenizer-file; convert_checkpoint --from hf "
    "sets it)");
  f("reset_position_ids", s.reset_position_ids,
    "positions restart at 0 after each end-of-document token (Megatron's; docs/data.md)");
  f("reset_attention_mask", s.reset_attention_mask,
    "a token attends only to its own document: none across an end-of-document token (Megatron's)");
  f("eod_mask_loss", s.eod_mask_loss,
    "no loss where the input token is end-of-document, i.e. on predicting the next document's first token "
    "(Megatron's)");
  f("eod_token", s.eod_token,
    "the end-of-document id the three keys above split at (-1: the tokenizer's, from data.vocab_file or "
    "data.tokenizer_file)");
  f("format", s.format,
    "gpt (windows over concatenated documents) or sft (fine-tuning: whole samples with a loss mask, packed "
    "apart; docs/data.md)");
  f("loss_mask_path", s.loss_mask_path,
    "sft: the loss mask dataset of data.path (empty: PREFIX_loss_mask_document beside PREFIX_text_document)");
}

template <typename S, typename F>
requires std::same_as<std::remove_const_t<S>, CheckpointConfig>
void for_each_field(S& s, F&& f) {
  f("dir", s.dir, "checkpoint directory (empty: no checkpoints)");
  f("save_interval", s.save_interval, "steps between checkpoints (0: only at the end)");
  f("load", s.load,
    "checkpoint to resume from: empty, \"latest\", a checkpoint root or one step's directory");
  f("keep_last", s.keep_last, "checkpoints to keep (0: all)");
  f("async", s.async,
    "copy the state to host memory and write it on a background thread while training goes on");
}

// C is Config or const Config; f(section name, section struct).
template <typename C, typename F>
requires std::same_as<std::remove_const_t<C>, Config>
void for_each_section(C& c, F&& f) {
  f("model", c.model);
  f("parallel", c.parallel);
  f("train", c.train);
  f("optimizer", c.optimizer);
  f("data", c.data);
  f("checkpoint", c.checkpoint);
}

// f(section, key, member, description) for every key.
template <typename C, typename F>
void for_each_key(C& c, F&& f) {
  for_each_section(c, [&](const char* section, auto& s) {
    for_each_field(s, [&](const char* key, auto& member, const char* description) {
      f(section, key, member, description);
    });
  });
}

// Values computed by validate_config(): named in messages, but never read from YAML nor written.
template <typename C, typename F>
void for_each_derived(C& c, F&& f) {
  f("parallel", "data", c.parallel.data, "it is derived: world size / (tensor * pipeline * context)");
}

// ---- values: text, display, type names -----------------------------------------------------------

// A string as it appears in messages: double-quoted, escaped so that a message stays one line.
std::string quoted(std::string_view text) {
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (ch == '\n') {
      out += "\\n";
    } else {
      out += ch;
    }
  }
  return out + '"';
}

std::string format_double(double value) {
  std::string text = fmt::format("{}", value);  // shortest text that reads back exactly
  // Keep floats recognisable as floats, to people ("65536" reads as an integer) and to YAML 1.1
  // readers such as PyYAML, which want a '.' in a float ("1e-05" would be a string there).
  size_t exponent = text.find('e');
  if (text.find('.') == std::string::npos && text.find_first_of("in") == std::string::npos) {
    text.insert(exponent == std::string::npos ? text.size() : exponent, ".0");
  }
  return text;
}

// The value as YAML scalar text (unquoted): used for config_to_yaml() and, for non-strings, messages.
template <typename T>
std::string to_text(const T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    return value ? "true" : "false";
  } else if constexpr (std::is_same_v<T, double>) {
    return format_double(value);
  } else if constexpr (std::is_same_v<T, std::string>) {
    return value;
  } else if constexpr (NamedEnum<T>) {
    return std::string(names_of(value)[static_cast<size_t>(value)]);
  } else {
    static_assert(std::is_integral_v<T>);
    return std::to_string(value);
  }
}

// The value as shown in messages and the reference: strings quoted, everything else as YAML text.
template <typename T>
std::string display(const T& value) {
  if constexpr (std::is_same_v<T, std::string>) {
    return quoted(value);
  } else {
    return to_text(value);
  }
}

std::string join(std::span<const std::string_view> names, std::string_view separator) {
  std::string out;
  for (std::string_view name : names) {
    if (!out.empty()) out += separator;
    out += name;
  }
  return out;
}

template <typename T>
std::string type_name() {
  if constexpr (std::is_same_v<T, bool>) {
    return "bool";
  } else if constexpr (std::is_same_v<T, double>) {
    return "float";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "string";
  } else if constexpr (NamedEnum<T>) {
    return join(names_of(T{}), "|");
  } else if constexpr (std::is_unsigned_v<T>) {
    return "uint";
  } else {
    return "int";
  }
}

// ---- reading a value from YAML -------------------------------------------------------------------

// `text` with every byte that would not print as itself escaped as \xNN: control characters and
// bytes that are not part of valid UTF-8 (a binary file given as a config must not put raw bytes
// on the terminal). Valid UTF-8 (a path with an accent) is kept as written.
std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    // Length of the UTF-8 sequence starting here (1 for ASCII), 0 if `byte` cannot start one.
    std::size_t len = byte < 0x80           ? 1
                      : (byte >> 5) == 0x6  ? 2
                      : (byte >> 4) == 0xe  ? 3
                      : (byte >> 3) == 0x1e ? 4
                                            : 0;
    if (len > 1 && byte < 0xc2) len = 0;  // overlong two-byte forms
    for (std::size_t k = 1; k < len; ++k)
      if (i + k >= text.size() || (static_cast<unsigned char>(text[i + k]) & 0xc0) != 0x80) len = 0;
    if (len == 0 || (len == 1 && (byte < 0x20 || byte == 0x7f))) {
      out += fmt::format("\\x{:02x}", byte);
      ++i;
      continue;
    }
    out.append(text.substr(i, len));
    i += len;
  }
  return out;
}

// Every message goes through here: one line, nothing unprintable.
[[noreturn]] void fail(const std::string& message) { throw ConfigError("config: " + printable(message)); }

// The whole of `text` as a number of type T (no leading '+', no trailing junk).
template <typename T>
bool parse_number(const std::string& text, T& out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return !text.empty() && ec == std::errc() && end == text.data() + text.size();
}

// What the user wrote, for messages: numbers and booleans as they are, anything else quoted.
std::string display_raw(const YAML::Node& node) {
  if (node.IsNull()) return "null";
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  const std::string& text = node.Scalar();
  double number = 0;
  bool plain = node.Tag() != "!" && (parse_number(text, number) || text == "true" || text == "false");
  return plain ? text : quoted(text);
}

// Sets `field` from `node` (a scalar, a null, or something else) or throws naming `name`.
// Types follow the field, not YAML's guess: `path: 123` is the string "123", but a quoted "10"
// for an integer key is an error, since quoting is how YAML says "this is a string".
template <typename T>
void assign(const std::string& name, const YAML::Node& node, T& field) {
  auto wrong = [&](std::string_view rule) {
    fail(fmt::format("{} = {}: {}", name, display_raw(node), rule));
  };
  bool quoted_scalar = node.IsScalar() && node.Tag() == "!";
  const std::string text = node.IsScalar() && !quoted_scalar ? node.Scalar() : std::string();
  if constexpr (std::is_same_v<T, std::string>) {
    if (node.IsNull()) {
      field.clear();  // `load:` with nothing after it means "no value"
    } else if (node.IsScalar()) {
      field = node.Scalar();
    } else {
      wrong("expected a string");
    }
  } else if constexpr (std::is_same_v<T, bool>) {
    if (text == "true" || text == "True" || text == "TRUE") {
      field = true;
    } else if (text == "false" || text == "False" || text == "FALSE") {
      field = false;
    } else {
      wrong("expected true or false");
    }
  } else if constexpr (std::is_same_v<T, double>) {
    double value = 0;
    // from_chars rejects a leading '+', which YAML allows.
    std::string digits = text.starts_with('+') ? text.substr(1) : text;
    if (!parse_number(digits, value)) wrong("expected a number");
    if (!std::isfinite(value)) wrong("expected a finite number");
    field = value;
  } else if constexpr (NamedEnum<T>) {
    auto names = names_of(T{});
    auto it = std::find(names.begin(), names.end(), text);
    if (it == names.end()) wrong("must be one of " + join(names, ", "));
    field = static_cast<T>(it - names.begin());
  } else {
    static_assert(std::is_integral_v<T>);
    std::string digits = text.starts_with('+') ? text.substr(1) : text;
    T value{};
    if (!parse_number(digits, value)) {
      // Tell "too big" apart from "not a number" (e.g. 2.5 or "ten").
      bool all_digits = !digits.empty() && digits.find_first_not_of("-0123456789") == std::string::npos;
      if (all_digits && digits != "-") {
        wrong(fmt::format("out of range [{}, {}]", std::numeric_limits<T>::min(),
                          std::numeric_limits<T>::max()));
      }
      wrong(std::is_unsigned_v<T> ? "expected a non-negative integer" : "expected an integer");
    }
    field = value;
  }
}

// ---- finding keys --------------------------------------------------------------------------------

// Edits (insert, delete, replace, swap two neighbours) between a typo and a key; a typed prefix of a
// key ("warmup" for "warmup_steps") counts as one edit, since that is how keys get half-remembered.
size_t edit_distance(std::string_view typed, std::string_view key) {
  if (typed.size() >= 3 && key.starts_with(typed)) return 1;
  const size_t n = typed.size(), m = key.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      size_t cost = typed[i - 1] == key[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && typed[i - 1] == key[j - 2] && typed[i - 2] == key[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

// Close enough to be a typo: a third of the word, at least one edit, at most three.
bool is_close(std::string_view typed, size_t distance) {
  return distance <= std::clamp<size_t>(typed.size() / 3, 1, 3);
}

std::vector<std::string_view> section_names() {
  const Config defaults;
  std::vector<std::string_view> names;
  for_each_section(defaults, [&](const char* section, const auto&) { names.emplace_back(section); });
  return names;
}

// " (did you mean model.hidden_size?)" for the nearest key in any section (same section wins ties),
// or "" when nothing is close.
std::string suggest_key(const std::string& section, const std::string& key) {
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  const Config defaults;
  for_each_key(defaults, [&](const char* s, const char* k, const auto&, const char*) {
    size_t distance = edit_distance(key, k) * 2 + (section == s ? 0 : 1);
    if (distance < best_distance) {
      best_distance = distance;
      best = fmt::format("{}.{}", s, k);
    }
  });
  return is_close(key, best_distance / 2) ? " (did you mean " + best + "?)" : "";
}

std::string suggest_section(const std::string& section) {
  for (std::string_view name : section_names()) {
    if (is_close(section, edit_distance(section, name))) return fmt::format(" (did you mean {}?)", name);
  }
  return " (sections: " + join(section_names(), ", ") + ")";
}

void require_known_section(const std::string& section) {
  auto names = section_names();
  if (std::find(names.begin(), names.end(), section) == names.end()) {
    fail(fmt::format("{}: unknown section{}", section, suggest_section(section)));
  }
}

std::string scalar_or(const YAML::Node& node, std::string_view fallback) {
  return node.IsScalar() ? node.Scalar() : std::string(fallback);
}

bool is_blend_key(const std::string& section, const std::string& key) {
  return section == "data" &&
         (key == "path" || key == "train_path" || key == "valid_path" || key == "test_path");
}

// A blend given as a YAML list, in Megatron's flat form "W1 P1 W2 P2 ...": items are maps
// {weight: W, path: P}, or weights and paths alternating ([0.7, a, 0.3, b]).
std::string blend_from_list(const std::string& name, const YAML::Node& list) {
  if (list.size() == 0) fail(fmt::format("{} = []: an empty blend (give at least one dataset)", name));
  std::vector<BlendEntry> entries;
  auto weight_of = [&](const YAML::Node& node, const std::string& where) {
    double value = 0;
    const std::string text = node.IsScalar() && node.Tag() != "!" ? node.Scalar() : std::string();
    if (!parse_number(text.starts_with('+') ? text.substr(1) : text, value))
      fail(fmt::format("{}: weight {}: expected a number", where, display_raw(node)));
    return value;
  };
  auto path_of = [&](const YAML::Node& node, const std::string& where) {
    if (!node.IsScalar() || node.Scalar().empty())
      fail(fmt::format("{}: path {}: expected a dataset prefix", where, display_raw(node)));
    const std::string& path = node.Scalar();
    if (path.find_first_of(" \t\r\n") != std::string::npos)
      fail(
          fmt::format("{}: path {}: a path in a blend cannot hold white space (the blend is stored as "
                      "\"W1 P1 W2 P2 ...\")",
                      where, quoted(path)));
    return path;
  };
  if (list[0].IsMap()) {
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string where = fmt::format("{}[{}]", name, i);
      const YAML::Node& item = list[i];
      if (!item.IsMap())
        fail(fmt::format("{} = {}: expected {{weight: W, path: P}} like the items before", where,
                         display_raw(item)));
      for (const auto& kv : item) {
        const std::string k = scalar_or(kv.first, "<non-scalar key>");
        if (k != "weight" && k != "path")
          fail(fmt::format("{}: unknown key {} (an item has weight and path)", where, quoted(k)));
      }
      if (!item["weight"] || !item["path"]) fail(fmt::format("{}: needs both weight and path", where));
      entries.push_back({weight_of(item["weight"], where), path_of(item["path"], where)});
    }
  } else {
    if (list.size() % 2 != 0)
      fail(fmt::format("{}: {} items: expected weights and paths alternating [W1, P1, W2, P2, ...]", name,
                       list.size()));
    for (std::size_t i = 0; i < list.size(); i += 2) {
      const std::string where = fmt::format("{}[{}]", name, i);
      entries.push_back(
          {weight_of(list[i], where), path_of(list[i + 1], fmt::format("{}[{}]", name, i + 1))});
    }
  }
  return format_blend(entries);
}

// Sets section.key from `node`; unknown and derived keys are errors.
void set_key(Config& c, const std::string& section, const std::string& key, const YAML::Node& node) {
  const std::string name = section + "." + key;
  if (node.IsSequence() && section == "model" && key == "lora.target_modules") {
    std::string joined;
    for (const auto& item : node) {
      if (!item.IsScalar()) fail(fmt::format("{}: every item must be a module name", name));
      joined += (joined.empty() ? "" : ",") + item.Scalar();
    }
    set_key(c, section, key, YAML::Node(joined));
    return;
  }
  if (node.IsSequence() && is_blend_key(section, key)) {
    YAML::Node flat(blend_from_list(name, node));
    set_key(c, section, key, flat);
    return;
  }
  bool found = false;
  for_each_key(c, [&](const char* s, const char* k, auto& member, const char*) {
    if (section == s && key == k) {
      assign(name, node, member);
      found = true;
    }
  });
  if (found) return;
  for_each_derived(c, [&](const char* s, const char* k, const auto&, const char* why) {
    if (section == s && key == k) fail(fmt::format("{}: not a configuration key: {}", name, why));
  });
  fail(fmt::format("{}: unknown key{}", name, suggest_key(section, key)));
}

void apply_document(Config& c, const YAML::Node& root, const std::string& file_name) {
  if (!root || root.IsNull()) return;  // an empty document: all defaults
  if (!root.IsMap()) fail(fmt::format("{}: the top level must be a map of sections", file_name));
  std::set<std::string> seen;
  for (const auto& entry : root) {
    const std::string section = scalar_or(entry.first, "<non-scalar key>");
    require_known_section(section);
    const YAML::Node& body = entry.second;
    if (body.IsNull()) continue;  // a section with every key commented out
    if (!body.IsMap())
      fail(fmt::format("{}: must be a map of key: value, got {}", section, display_raw(body)));
    for (const auto& item : body) {
      const std::string key = scalar_or(item.first, "<non-scalar key>");
      // A nested map (model.lora) is the same as its dotted keys (lora.rank).
      if (item.second.IsMap() && section == "model" && key == "lora") {
        for (const auto& sub : item.second) {
          const std::string dotted = key + "." + scalar_or(sub.first, "<non-scalar key>");
          if (!seen.insert(section + "." + dotted).second)
            fail(fmt::format("{}.{}: given twice", section, dotted));
          set_key(c, section, dotted, sub.second);
        }
        continue;
      }
      // yaml-cpp keeps both entries of a repeated key; the second would silently win.
      if (!seen.insert(section + "." + key).second) fail(fmt::format("{}.{}: given twice", section, key));
      set_key(c, section, key, item.second);
    }
  }
}

std::string trim(std::string_view text) {
  size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return "";
  size_t end = text.find_last_not_of(" \t");
  return std::string(text.substr(begin, end - begin + 1));
}

void apply_override(Config& c, const std::string& override_text) {
  size_t equals = override_text.find('=');
  std::string name = trim(override_text.substr(0, equals));
  size_t dot = name.find('.');
  if (equals == std::string::npos || dot == std::string::npos || dot == 0 || dot + 1 == name.size()) {
    fail(fmt::format("override {}: expected section.key=value", quoted(override_text)));
  }
  std::string value = override_text.substr(equals + 1);
  YAML::Node node;
  try {
    node = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    fail(fmt::format("override {}: the value is not a YAML scalar: {}", quoted(override_text), e.msg));
  }
  std::string section = name.substr(0, dot);
  require_known_section(section);
  set_key(c, section, name.substr(dot + 1), node);
}

// ---- validation ------------------------------------------------------------------------------------

}  // namespace

// ---- detail::Rules (src/config/rules.hpp) ---------------------------------------------------------

namespace detail {

std::string Rules::key_at(const void* field) const {
  std::string name;
  auto match = [&](const char* s, const char* k, const auto& member, const char*) {
    if (static_cast<const void*>(&member) == field) name = fmt::format("{}.{}", s, k);
  };
  for_each_key(c_, match);
  for_each_derived(c_, match);
  if (name.empty()) throw Error("config: internal error: a rule names a field that is not in the key tables");
  return name;
}

void Rules::fail_at(const void* field, std::string_view rule) const {
  std::string value;
  auto match = [&](const char*, const char*, const auto& member, const char*) {
    if (static_cast<const void*>(&member) == field) value = display(member);
  };
  for_each_key(c_, match);
  for_each_derived(c_, match);
  fail(fmt::format("{} = {}: {}", key_at(field), value, rule));
}

void Rules::divisible(const int& field, std::initializer_list<Term> by, std::string_view when) const {
  long long product = 1;
  for (const Term& t : by) product *= t.value;
  if (field % product == 0) return;
  std::string names, values;
  for (const Term& t : by) {
    names += (names.empty() ? "" : " * ") + t.name;
    values += (values.empty() ? "" : " * ") + std::to_string(t.value);
  }
  std::string amount = by.size() == 1 ? values : fmt::format("{} = {}", values, product);
  require(false, field, fmt::format("must be divisible by {} ({}){}", names, amount, when));
}

void Rules::in_range(const double& field, double lo, double hi, bool hi_inclusive,
                     std::string_view hi_name) const {
  bool ok = field >= lo && (hi_inclusive ? field <= hi : field < hi);
  std::string upper =
      hi_name.empty() ? format_double(hi) : fmt::format("{} ({})", hi_name, format_double(hi));
  require(ok, field, fmt::format("must be in [{}, {}{}", format_double(lo), upper, hi_inclusive ? "]" : ")"));
}

}  // namespace detail

namespace {

using detail::Rules;

constexpr int kMaxLayers = 1 << 20;
// How many times longer (or shorter) the context may be than trained: published scalings use 2 to
// a few hundred.
constexpr double kMinRopeScalingFactor = 1e-3, kMaxRopeScalingFactor = 1e3;

// Parses data.split: up to three comma-separated non-negative numbers; missing ones are 0.
bool valid_split(const std::string& split) {
  std::vector<std::string> parts;
  std::stringstream stream(split);
  for (std::string part; std::getline(stream, part, ',');) parts.push_back(trim(part));
  if (split.empty() || split.back() == ',' || parts.size() > 3) return false;
  double sum = 0;
  for (const std::string& part : parts) {
    double value = 0;
    if (!parse_number(part, value) || !std::isfinite(value) || value < 0) return false;
    sum += value;
  }
  return sum > 0;
}

}  // namespace

void validate_config(Config& c, int world_size) {
  if (world_size < 1) fail(fmt::format("world size = {}: must be >= 1", world_size));
  const Rules rules(c);
  ModelConfig& m = c.model;
  ParallelConfig& p = c.parallel;
  TrainConfig& t = c.train;
  OptimizerConfig& o = c.optimizer;

  // Counts first: every later rule divides by some of them.
  for (const int* count :
       {&m.num_layers, &m.hidden_size, &m.num_attention_heads, &m.vocab_size, &m.seq_length,
        &t.micro_batch_size, &t.global_batch_size, &t.steps, &p.tensor, &p.pipeline, &p.virtual_stages,
        &p.context, &p.expert, &t.log_interval, &t.eval_steps, &o.loss_scale_window}) {
    rules.at_least(*count, 1);
  }
  for (const int* count : {&m.num_query_groups, &m.head_dim, &m.ffn_hidden_size, &m.max_position_embeddings,
                           &t.eval_interval, &o.warmup_steps, &c.checkpoint.save_interval,
                           &c.checkpoint.keep_last, &p.first_stage_layers, &p.last_stage_layers}) {
    rules.at_least(*count, 0);
  }
  rules.at_least(o.bucket_size, int64_t{0});
  rules.at_least(p.expert_tensor, 1);
  for (const std::string& group : split_group_list(p.node_local)) {
    const auto names = node_local_group_names();
    rules.require(
        std::find(names.begin(), names.end(), group) != names.end(), p.node_local,
        fmt::format("unknown group '{}' (a comma-separated list of {})", group, fmt::join(names, ", ")));
  }
  // The memory plan and the model keep a record per layer: a count near 2^31 would take tens of
  // GiB (pretrain_gpt --plan was OOM-killed after 77 s) before any check could speak. No model is
  // near this bound (the deepest published stacks have about a thousand layers).
  rules.require(m.num_layers <= kMaxLayers, m.num_layers, fmt::format("must be <= {}", kMaxLayers));

  // 0 means "the usual default"; filling it in here keeps every consumer from re-deriving it.
  if (m.num_query_groups == 0) m.num_query_groups = m.num_attention_heads;
  if (m.ffn_hidden_size == 0) {
    // 4 * hidden_size must itself be an int (it was signed overflow for hidden_size >= 2^29).
    rules.require(
        m.hidden_size <= std::numeric_limits<int>::max() / 4, m.hidden_size,
        fmt::format("must be <= {} when {} is 0 (it defaults to 4 * {})", std::numeric_limits<int>::max() / 4,
                    rules.key(m.ffn_hidden_size), rules.key(m.hidden_size)));
    m.ffn_hidden_size = 4 * m.hidden_size;
  }
  if (m.max_position_embeddings == 0) m.max_position_embeddings = m.seq_length;

  // Mixture of experts.
  for (const int* count : {&m.num_experts, &m.moe_ffn_hidden_size, &m.moe_shared_expert_ffn_hidden_size})
    rules.at_least(*count, 0);
  for (const double* coeff : {&m.moe_aux_loss_coeff, &m.moe_z_loss_coeff, &m.moe_capacity_factor})
    rules.at_least(*coeff, 0.0);
  rules.at_least(m.moe_layer_freq, 1);
  rules.at_least(m.moe_router_topk, 1);
  // Routing (router.hpp).
  rules.at_least(m.moe_seq_aux_loss_coeff, 0.0);
  rules.at_least(m.moe_bias_update_speed, 0.0);
  rules.at_least(m.moe_first_k_dense_replace, 0);
  rules.require(m.moe_routed_scaling_factor > 0, m.moe_routed_scaling_factor, "must be > 0");
  rules.at_least(m.moe_n_group, 1);
  rules.require(m.moe_topk_group >= 1 && m.moe_topk_group <= m.moe_n_group, m.moe_topk_group,
                fmt::format("must be in [1, {}] ({})", rules.key(m.moe_n_group), m.moe_n_group));
  if (m.num_experts > 0 && m.moe_n_group > 1) {
    rules.require(m.num_experts % m.moe_n_group == 0, m.moe_n_group,
                  fmt::format("must divide {} ({})", rules.key(m.num_experts), m.num_experts));
    // A group scores by the sum of its two best experts (DeepSeek-V3).
    rules.require(m.num_experts / m.moe_n_group >= 2, m.moe_n_group,
                  fmt::format("must leave at least 2 experts per group ({} = {})", rules.key(m.num_experts),
                              m.num_experts));
    rules.require(
        m.moe_router_topk <= m.moe_topk_group * (m.num_experts / m.moe_n_group), m.moe_router_topk,
        fmt::format("must be <= {} * experts per group ({}) so that the eligible groups hold enough "
                    "experts",
                    rules.key(m.moe_topk_group), m.moe_topk_group * (m.num_experts / m.moe_n_group)));
  }
  rules.require(!m.moe_router_force_load_balancing || m.num_experts > 0, m.moe_router_force_load_balancing,
                fmt::format("requires {} > 0 (there is no router to force)", rules.key(m.num_experts)));
  if (m.moe_ffn_hidden_size == 0) m.moe_ffn_hidden_size = m.ffn_hidden_size;
  // Multi-token prediction.
  rules.at_least(m.mtp_num_layers, 0);
  rules.at_least(m.mtp_loss_scaling_factor, 0.0);
  if (m.mtp_num_layers > 0) {
    rules.require(m.mtp_num_layers < m.seq_length, m.mtp_num_layers,
                  fmt::format("must be below {} ({}): depth k predicts the token k + 1 ahead",
                              rules.key(m.seq_length), m.seq_length));
    // DeepSeek-V3's MTP embeds the tokens without positions (rope works inside its layer).
    rules.require(m.position_embedding == PositionEmbedding::Rope, m.mtp_num_layers,
                  fmt::format("must be 0 with {} = learned: the MTP layers take rope positions",
                              rules.key(m.position_embedding)));
    rules.require(
        !m.lora.enabled(), m.mtp_num_layers,
        fmt::format("must be 0 with {} > 0: no adapters on the MTP layers yet", rules.key(m.lora.rank)));
  }

  // The data-parallel size is whatever the world has left; experts fold onto it.
  long long model_ranks = 1LL * p.tensor * p.pipeline * p.context;
  if (world_size % model_ranks != 0) {
    fail(fmt::format("world size = {}: must be divisible by {} * {} * {} ({} * {} * {} = {})", world_size,
                     rules.key(p.tensor), rules.key(p.pipeline), rules.key(p.context), p.tensor, p.pipeline,
                     p.context, model_ranks));
  }
  p.data = static_cast<int>(world_size / model_ranks);
  // Model shape against tensor, context and expert parallelism (layout_rules.hpp; the model checks
  // the same rules for the communicators it is given).
  check_layout(m, p);
  // Multi-head latent attention: its own head sizes; the mha keys' sizes do not apply.
  if (m.is_mla()) {
    const std::string mla = fmt::format("with {} = mla", rules.key(m.attention));
    rules.require(m.position_embedding == PositionEmbedding::Rope, m.position_embedding,
                  fmt::format("must be rope {}", mla));
    rules.require(!m.add_bias && !m.add_qkv_bias, m.add_bias,
                  fmt::format("must be false {} (and {} too): latent attention has no biases", mla,
                              rules.key(m.add_qkv_bias)));
    rules.require(m.num_query_groups == m.num_attention_heads, m.num_query_groups,
                  fmt::format("must be 0 or {} ({}) {}: every head has its own key and value",
                              rules.key(m.num_attention_heads), m.num_attention_heads, mla));
    rules.require(
        m.head_dim == 0, m.head_dim,
        fmt::format("must be 0 {} (its head sizes are qk_nope_head_dim, qk_rope_head_dim, v_head_dim)", mla));
    rules.require(!m.qk_norm, m.qk_norm, fmt::format("must be false {}", mla));
    rules.require(!m.lora.enabled(), m.lora.rank,
                  fmt::format("must be 0 {}: no adapters on latent attention yet", mla));
    rules.at_least(m.q_lora_rank, 0);
    rules.at_least(m.kv_lora_rank, 1);
    rules.at_least(m.qk_nope_head_dim, 1);
    rules.at_least(m.qk_rope_head_dim, 2);
    rules.require(m.qk_rope_head_dim % 2 == 0, m.qk_rope_head_dim, "must be even (rope rotates pairs)");
    rules.at_least(m.v_head_dim, 1);
  } else {
    const std::string why = fmt::format("needs {} = mla", rules.key(m.attention));
    rules.require(!m.hf_rope_interleave, m.hf_rope_interleave, why);
    for (const int* size :
         {&m.q_lora_rank, &m.kv_lora_rank, &m.qk_nope_head_dim, &m.qk_rope_head_dim, &m.v_head_dim})
      rules.require(*size == 0, *size, why);
  }
  // Positions (after the layout rules: the head dimension below needs heads to divide hidden).
  if (m.position_embedding == PositionEmbedding::Rope && !m.is_mla()) {
    const int head_dim = m.attention_head_dim();
    if (m.head_dim > 0)
      rules.require(head_dim % 2 == 0, m.head_dim, "must be even for rope position embeddings");
    else
      rules.require(head_dim % 2 == 0, m.hidden_size,
                    fmt::format("the head dimension {} / {} = {} must be even for rope position embeddings",
                                rules.key(m.hidden_size), rules.key(m.num_attention_heads), head_dim));
  } else {
    rules.require(m.seq_length <= m.max_position_embeddings, m.seq_length,
                  fmt::format("must be <= {} ({}) with learned position embeddings",
                              rules.key(m.max_position_embeddings), m.max_position_embeddings));
  }

  // Layers over pipeline stages.
  if (p.first_stage_layers == 0 && p.last_stage_layers == 0) {
    rules.divisible(m.num_layers, {rules.term(p.pipeline), rules.term(p.virtual_stages)});
  } else {
    const int& explicit_field = p.first_stage_layers > 0 ? p.first_stage_layers : p.last_stage_layers;
    rules.require(p.pipeline > 1, explicit_field, fmt::format("requires {} > 1", rules.key(p.pipeline)));
    rules.require(p.virtual_stages == 1, p.virtual_stages,
                  fmt::format("must be 1 when {} or {} is set", rules.key(p.first_stage_layers),
                              rules.key(p.last_stage_layers)));
    int other_stages = p.pipeline - (p.first_stage_layers > 0) - (p.last_stage_layers > 0);
    // 64-bit: both explicit counts may be up to INT_MAX.
    const long long remaining = 1LL * m.num_layers - p.first_stage_layers - p.last_stage_layers;
    std::string given =
        fmt::format("{} ({}) and {} ({})", rules.key(p.first_stage_layers), p.first_stage_layers,
                    rules.key(p.last_stage_layers), p.last_stage_layers);
    if (other_stages == 0) {
      rules.require(remaining == 0, m.num_layers,
                    fmt::format("must equal {} + {} when {} is 2", rules.key(p.first_stage_layers),
                                rules.key(p.last_stage_layers), rules.key(p.pipeline)) +
                        fmt::format(" (given {})", given));
    } else {
      rules.require(
          remaining > 0 && remaining % other_stages == 0, m.num_layers,
          fmt::format("after {}, the remaining layers ({}) must split evenly over the other stages ({})",
                      given, remaining, other_stages));
    }
  }

  // Batches.
  rules.divisible(t.global_batch_size, {rules.term(t.micro_batch_size), rules.term(p.data)});
  if (p.virtual_stages > 1) {
    rules.require(p.pipeline > 1, p.virtual_stages,
                  fmt::format("requires {} > 1 (got {})", rules.key(p.pipeline), p.pipeline));
  }
  const int micro_batches = t.global_batch_size / (t.micro_batch_size * p.data);
  const bool v_schedule = p.pipeline_schedule == PipelineSchedule::ZeroBubbleV ||
                          p.pipeline_schedule == PipelineSchedule::DualPipeV;
  if (p.virtual_stages > 1 && !v_schedule) {
    // Megatron's interleaved schedule walks micro-batches in groups of `pipeline`.
    rules.require(
        micro_batches % p.pipeline == 0, t.global_batch_size,
        fmt::format("the number of micro-batches ({} / ({} * {}) = {}) must be divisible by {} ({}) when "
                    "{} > 1",
                    rules.key(t.global_batch_size), rules.key(t.micro_batch_size), rules.key(p.data),
                    micro_batches, rules.key(p.pipeline), p.pipeline, rules.key(p.virtual_stages)));
  }
  switch (p.pipeline_schedule) {
    case PipelineSchedule::Auto:
      break;
    case PipelineSchedule::Interleaved:
      rules.require(p.virtual_stages > 1, p.pipeline_schedule,
                    fmt::format("requires {} > 1 (got {})", rules.key(p.virtual_stages), p.virtual_stages));
      break;
    case PipelineSchedule::GPipe:
    case PipelineSchedule::OneFOneB:
    case PipelineSchedule::ZeroBubbleH1:
      rules.require(p.virtual_stages == 1, p.pipeline_schedule,
                    fmt::format("requires {} = 1 (got {})", rules.key(p.virtual_stages), p.virtual_stages));
      break;
    case PipelineSchedule::ZeroBubbleV:
    case PipelineSchedule::DualPipeV:
      // Two chunks per rank in a V; both schedules fill their warm-up with 2 * pipeline micro-batches.
      rules.require(p.virtual_stages == 2, p.pipeline_schedule,
                    fmt::format("requires {} = 2 (got {})", rules.key(p.virtual_stages), p.virtual_stages));
      rules.require(
          micro_batches >= 2 * p.pipeline, t.global_batch_size,
          fmt::format("the number of micro-batches ({} / ({} * {}) = {}) must be at least 2 * {} ({}) "
                      "for {} = {}",
                      rules.key(t.global_batch_size), rules.key(t.micro_batch_size), rules.key(p.data),
                      micro_batches, rules.key(p.pipeline), 2 * p.pipeline, rules.key(p.pipeline_schedule),
                      p.pipeline_schedule == PipelineSchedule::ZeroBubbleV ? "zb-v" : "dualpipe-v"));
      break;
  }
  // Real-valued knobs.
  rules.in_range(m.dropout, 0.0, 1.0, false);
  rules.require(m.init_std > 0, m.init_std, "must be > 0");
  rules.require(m.norm_epsilon > 0, m.norm_epsilon, "must be > 0");
  // Frequencies are rope_theta^(-2i/d) (<= 1 only when rope_theta >= 1) and, scaled, divided by the
  // factor: a subnormal factor (1e-310 passed "> 0") makes them infinite and the loss NaN.
  rules.require(m.rope_theta >= 1, m.rope_theta, "must be >= 1");
  rules.at_least(m.sliding_window, 0);
  rules.at_least(m.sliding_window_pattern, 0);
  rules.at_least(m.max_window_layers, 0);
  if (m.sliding_window == 0) {
    rules.require(m.sliding_window_pattern == 0, m.sliding_window_pattern,
                  fmt::format("needs {} > 0", rules.key(m.sliding_window)));
    rules.require(m.max_window_layers == 0, m.max_window_layers,
                  fmt::format("needs {} > 0", rules.key(m.sliding_window)));
  }
  if (m.lora.enabled()) {
    const LoraConfig& l = m.lora;
    rules.in_range(l.dropout, 0.0, 1.0, false);
    rules.require(l.alpha > 0, l.alpha, "must be > 0");
    // The experts' rows are tokens permuted by the router: the dropout keyed by global (position,
    // element) index (docs/lora.md) has no such key there yet.
    rules.require(
        m.num_experts == 0 || l.dropout == 0.0, l.dropout,
        fmt::format("LoRA dropout on MoE models ({} > 0) is not supported", rules.key(m.num_experts)));
    const std::vector<std::string> targets = lora_target_modules(l.target_modules);
    const bool swiglu = m.activation == Activation::SwiGLU;
    if (m.num_experts > 0) {
      // Experts and dense parameters live in separate data-parallel buffers; the dense one needs
      // at least one trained parameter: an attention adapter, or an MLP one on a dense layer
      // (moe_layer_freq > 1) or a shared expert.
      const bool attention = std::any_of(targets.begin(), targets.end(), [](const std::string& t) {
        return t == "q" || t == "k" || t == "v" || t == "o";
      });
      const bool dense_mlp = m.moe_layer_freq > 1 || m.moe_shared_expert_ffn_hidden_size > 0;
      rules.require(attention || dense_mlp, l.target_modules,
                    "adapters on the experts alone are not supported: add an attention target (q, k, v, o)");
    }
    for (const std::string& t : targets) {
      rules.require(!(swiglu && t == "fc1"), l.target_modules,
                    "fc1 is the GeLU MLP's input linear; a swiglu MLP has gate and up");
      rules.require(swiglu || (t != "gate" && t != "up"), l.target_modules,
                    fmt::format("{} exists only in a swiglu MLP; the GeLU MLP's input linear is fc1", t));
    }
  } else {
    rules.at_least(m.lora.rank, 0);
  }
  if (m.rope_scaling.type != RopeScalingType::None) {
    const RopeScaling& rs = m.rope_scaling;
    rules.require(m.position_embedding == PositionEmbedding::Rope, rs.type,
                  fmt::format("needs {} = rope", rules.key(m.position_embedding)));
    rules.in_range(rs.factor, kMinRopeScalingFactor, kMaxRopeScalingFactor, true);
    if (rs.type == RopeScalingType::Llama3) {
      rules.require(rs.low_freq_factor > 0, rs.low_freq_factor, "must be > 0");
      rules.require(
          rs.high_freq_factor > rs.low_freq_factor, rs.high_freq_factor,
          fmt::format("must be > {} ({})", rules.key(rs.low_freq_factor), display(rs.low_freq_factor)));
      rules.require(rs.original_max_position_embeddings > 0, rs.original_max_position_embeddings,
                    "must be > 0");
    }
    if (rs.type == RopeScalingType::Yarn) {
      rules.require(rs.original_max_position_embeddings > 0, rs.original_max_position_embeddings,
                    "must be > 0");
      rules.require(rs.beta_slow > 0, rs.beta_slow, "must be > 0");
      rules.require(rs.beta_fast >= rs.beta_slow, rs.beta_fast,
                    fmt::format("must be >= {} ({})", rules.key(rs.beta_slow), display(rs.beta_slow)));
      rules.require(rs.attention_factor >= 0, rs.attention_factor, "must be >= 0 (0: derived)");
    }
  }
  if (m.rope_scaling.type != RopeScalingType::Yarn) {
    // yarn's keys under another type would be silently ignored: refused instead.
    const RopeScaling& rs = m.rope_scaling;
    const RopeScaling unset;
    const std::string why = fmt::format("needs {} = yarn", rules.key(rs.type));
    rules.require(rs.beta_fast == unset.beta_fast, rs.beta_fast, why);
    rules.require(rs.beta_slow == unset.beta_slow, rs.beta_slow, why);
    rules.require(rs.mscale == unset.mscale, rs.mscale, why);
    rules.require(rs.mscale_all_dim == unset.mscale_all_dim, rs.mscale_all_dim, why);
    rules.require(rs.attention_factor == unset.attention_factor, rs.attention_factor, why);
    rules.require(rs.truncate == unset.truncate, rs.truncate, why);
  }
  rules.require(t.peak_tflops >= 0, t.peak_tflops, "must be >= 0");
  rules.require(t.comm_timeout_s > 0, t.comm_timeout_s, "must be > 0");
  rules.require(t.nonfinite_policy != GuardPolicy::Warn, t.nonfinite_policy,
                "must be stop or skip (an update with inf or NaN gradients ruins every weight)");
  rules.require(t.spike_factor == 0 || t.spike_factor > 1, t.spike_factor, "must be 0 (off) or > 1");
  rules.at_least(t.spike_window, 1);
  rules.at_least(t.max_consecutive_skips, 0);
  rules.at_least(t.sdc_check_interval, 0);
  rules.require(
      t.sdc_policy != GuardPolicy::Skip, t.sdc_policy,
      "must be stop or warn (the two runs came from the same state: which one is wrong is unknown)");
  rules.require(o.lr > 0, o.lr, "must be > 0");
  rules.in_range(o.min_lr, 0.0, o.lr, true, rules.key(o.lr));
  rules.in_range(o.beta1, 0.0, 1.0, false);
  rules.in_range(o.beta2, 0.0, 1.0, false);
  rules.require(o.eps > 0, o.eps, "must be > 0");
  rules.require(o.weight_decay >= 0, o.weight_decay, "must be >= 0");
  rules.require(o.clip_grad >= 0, o.clip_grad, "must be >= 0");
  rules.require(o.initial_loss_scale > 0, o.initial_loss_scale, "must be > 0");
  rules.in_range(o.muon_momentum, 0.0, 1.0, false);
  rules.require(o.muon_ns_steps >= 1 && o.muon_ns_steps < 100, o.muon_ns_steps,
                "must be in [1, 100) (torch.optim.Muon's bound)");
  rules.require(o.warmup_steps <= t.steps, o.warmup_steps,
                fmt::format("must be <= {} ({})", rules.key(t.steps), t.steps));
  // `distributed: true` is the old spelling of `sharding: optim`; afterwards it says whether
  // optimizer state is sharded at all (idempotent: a written config reads back the same).
  if (o.distributed && o.sharding == Sharding::None) o.sharding = Sharding::Optim;
  o.distributed = o.sharding != Sharding::None;
  rules.require(!o.overlap_param_gather || o.distributed, o.overlap_param_gather,
                fmt::format("requires {} = true", rules.key(o.distributed)));
  // The overlapped update changes no bit of the result, or it is refused: every condition under
  // which step() would look at all gradients before updating any (optimizer.hpp).
  if (o.overlap_update == OverlapUpdate::True) {
    const auto need = [&](bool ok, const std::string& rule) {
      rules.require(ok, o.overlap_update, "requires " + rule + " (docs/optimizer.md#the-overlapped-update)");
    };
    need(o.clip_grad == 0, fmt::format("{} = 0: clipping needs the global norm of every gradient before any "
                                       "update",
                                       rules.key(o.clip_grad)));
    need(t.precision != Precision::FP16,
         fmt::format("{} other than fp16: the loss scaler checks every gradient before any update",
                     rules.key(t.precision)));
    need(o.type == OptimizerType::AdamW,
         fmt::format("{} = adamw: Muon orthogonalises whole matrices", rules.key(o.type)));
    need(t.nonfinite_policy != GuardPolicy::Skip &&
             (t.spike_factor == 0 || t.spike_policy != GuardPolicy::Skip),
         fmt::format("{} and {} other than skip: a skipped update cannot be undone",
                     rules.key(t.nonfinite_policy), rules.key(t.spike_policy)));
  }
  rules.require(o.sharding_group_size >= 0, o.sharding_group_size, "must be >= 0");
  if (o.sharding_group_size > 0) {
    rules.require(o.sharding != Sharding::None, o.sharding_group_size,
                  fmt::format("requires {} other than none", rules.key(o.sharding)));
    // Dense gradients are reduced, and optimizer state sharded, over dp x cp.
    if (p.context > 1)
      rules.require(p.data * p.context % o.sharding_group_size == 0, o.sharding_group_size,
                    fmt::format("must divide {} * {} ({} * {})", rules.key(p.data), rules.key(p.context),
                                p.data, p.context));
    else
      rules.require(p.data % o.sharding_group_size == 0, o.sharding_group_size,
                    fmt::format("must divide {} ({})", rules.key(p.data), p.data));
    // MoE: the experts keep the dense replica count (dp x cp / group size) and shard over the
    // rest of expert-dp (tp x cp x dp / (ep x etp) ranks).
    const long long dense = 1LL * p.data * p.context;
    const long long expert_dp = 1LL * p.tensor * p.context * p.data / (1LL * p.expert * p.expert_tensor);
    if (m.num_experts > 0 && dense % o.sharding_group_size == 0 && expert_dp > 0)
      rules.require(expert_dp % (dense / o.sharding_group_size) == 0, o.sharding_group_size,
                    fmt::format("with MoE, the replicas (data * {} / {} = {}) must divide the expert data "
                                "parallel size ({} * {} * data / ({} * {}) = {})",
                                rules.key(p.context), rules.key(o.sharding_group_size),
                                dense / o.sharding_group_size, rules.key(p.tensor), rules.key(p.context),
                                rules.key(p.expert), rules.key(p.expert_tensor), expert_dp));
  }
  rules.require(o.reshard_after_forward || o.sharding == Sharding::OptimGradsParams, o.reshard_after_forward,
                fmt::format("may be false only with {} = optim_grads_params (the only mode that gathers "
                            "parameters per unit)",
                            rules.key(o.sharding)));
  rules.require(o.prefetch_units >= 0, o.prefetch_units, "must be >= 0");
  // The check compares each rank's own gradients before they are reduced over data parallelism;
  // sharded gradients are reduce-scattered micro-batch by micro-batch during the backward.
  rules.require(t.sdc_check_interval == 0 || o.sharding == Sharding::None || o.sharding == Sharding::Optim,
                t.sdc_check_interval,
                fmt::format("needs {} = none or optim (optim_grads and optim_grads_params reduce gradients "
                            "during the backward, before a rank's own can be compared)",
                            rules.key(o.sharding)));

  // Data. Blends: the weights (negative, NaN, a zero sum), pairs and "synthetic" alone. A split's own
  // blend replaces data.path for that split.
  for (const std::string* blend : {&c.data.path, &c.data.train_path, &c.data.valid_path, &c.data.test_path}) {
    if (blend != &c.data.path && blend->empty()) continue;
    try {
      parse_blend(*blend);
    } catch (const Error& e) {
      rules.require(false, *blend, e.what());
    }
  }
  rules.at_least(c.data.eod_token, -1);
  if (c.data.eod_token >= 0 && c.model.vocab_size > 0)
    rules.require(c.data.eod_token < c.model.vocab_size, c.data.eod_token,
                  fmt::format("must be below {} ({})", rules.key(c.model.vocab_size), c.model.vocab_size));
  if ((c.data.reset_position_ids || c.data.reset_attention_mask || c.data.eod_mask_loss) &&
      c.data.eod_token < 0 && c.data.tokenizer != "ByteLevel" && c.data.tokenizer != "HuggingFace")
    rules.require(!c.data.vocab_file.empty(), c.data.eod_token,
                  fmt::format("is needed (or {}) to find documents for {}, {} and {}",
                              rules.key(c.data.vocab_file), rules.key(c.data.reset_position_ids),
                              rules.key(c.data.reset_attention_mask), rules.key(c.data.eod_mask_loss)));
  rules.require(c.data.format == "gpt" || c.data.format == "sft", c.data.format, "must be gpt or sft");
  // Multi-token prediction shifts the targets by each depth; a loss mask or documents would have to
  // shift with them (and be counted per depth), which is not done yet: refused, never ignored.
  if (c.model.mtp_num_layers > 0)
    rules.require(c.data.format == "gpt" && !c.data.eod_mask_loss && !c.data.reset_attention_mask &&
                      !c.data.reset_position_ids,
                  c.model.mtp_num_layers,
                  fmt::format("must be 0 with {} = sft, {}, {} or {}: multi-token prediction does not shift "
                              "loss masks or documents yet",
                              rules.key(c.data.format), rules.key(c.data.eod_mask_loss),
                              rules.key(c.data.reset_attention_mask), rules.key(c.data.reset_position_ids)));
  if (c.data.format == "sft") {
    rules.require(
        !c.data.eod_mask_loss, c.data.eod_mask_loss,
        fmt::format("must be false with {} = sft (the loss mask dataset decides which tokens count)",
                    rules.key(c.data.format)));
    for (const std::string* blend :
         {&c.data.path, &c.data.train_path, &c.data.valid_path, &c.data.test_path}) {
      bool synthetic = false;
      try {
        for (const BlendEntry& e : parse_blend(*blend)) synthetic = synthetic || e.path == "synthetic";
      } catch (const Error&) {  // reported above
      }
      rules.require(!synthetic, *blend,
                    fmt::format("cannot be synthetic with {} = sft (samples need a loss mask dataset)",
                                rules.key(c.data.format)));
    }
  }
  if (!c.data.loss_mask_path.empty()) {
    rules.require(c.data.format == "sft", c.data.loss_mask_path,
                  fmt::format("needs {} = sft", rules.key(c.data.format)));
    bool one = false;
    try {
      one = parse_blend(c.data.path).size() == 1;
    } catch (const Error&) {
    }
    rules.require(one, c.data.loss_mask_path,
                  fmt::format("is the mask of one dataset, and {} is a blend (name each dataset "
                              "PREFIX_text_document beside its PREFIX_loss_mask_document instead)",
                              rules.key(c.data.path)));
  }
  rules.require(valid_split(c.data.split), c.data.split,
                "must be one to three comma-separated non-negative numbers (\"a,b,c\") with a positive sum");
  rules.require(
      std::find(std::begin(kTokenizers), std::end(kTokenizers), c.data.tokenizer) != std::end(kTokenizers),
      c.data.tokenizer, "must be one of " + join(kTokenizers, ", "));
  if (c.data.tokenizer == "HuggingFace")
    rules.require(
        !c.data.tokenizer_file.empty(), c.data.tokenizer_file,
        fmt::format("is needed with {} = HuggingFace (the tokenizer.json)", rules.key(c.data.tokenizer)));
  else
    rules.require(c.data.tokenizer_file.empty(), c.data.tokenizer_file,
                  fmt::format("is read only with {} = HuggingFace, not {}", rules.key(c.data.tokenizer),
                              c.data.tokenizer));
}

namespace {

// Receives a YAML stream's events and keeps only where the last document started.
class DocumentStart final : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override { mark_ = mark; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
  }
  void OnMapEnd() override {}
  const YAML::Mark& mark() const { return mark_; }

 private:
  YAML::Mark mark_;
};

// The number of documents in `text`. Not YAML::LoadAll: in yaml-cpp 0.7 a document that starts
// with a stray ',' (a flow entry outside [ ] or { }) parses as null without consuming the ',', so
// LoadAll reads that same document forever while its memory grows (a config of one ',' hung the
// loader; found by fuzz/config_yaml.cpp). A document starting where the previous one did is that
// loop, and is a syntax error.
std::size_t count_documents(const std::string& text, const std::string& file_name) {
  std::istringstream stream(text);
  YAML::Parser parser(stream);
  DocumentStart start;
  std::size_t documents = 0;
  int previous = -1;
  while (parser.HandleNextDocument(start)) {
    const YAML::Mark& at = start.mark();
    if (at.pos == previous) {
      const std::string token = at.pos >= 0 && static_cast<std::size_t>(at.pos) < text.size()
                                    ? std::string(1, text[static_cast<std::size_t>(at.pos)])
                                    : std::string("end of input");
      fail(fmt::format("{}:{}:{}: YAML syntax error: unexpected {} here (the parser cannot go on)", file_name,
                       at.line + 1, at.column + 1, quoted(token)));
    }
    previous = at.pos;
    ++documents;
  }
  return documents;
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::vector<std::string>& overrides, int world_size,
                    const std::string& file_name) {
  YAML::Node root;
  try {
    // Every document is counted, not just the first read: Load reads the first and silently
    // ignores any after a `---`.
    const std::size_t documents = count_documents(yaml_text, file_name);
    if (documents > 1)
      fail(fmt::format("{}: holds {} YAML documents (separated by ---); a config must be exactly one",
                       file_name, documents));
    if (documents == 1) root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    fail(
        fmt::format("{}:{}:{}: YAML syntax error: {}", file_name, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  Config c;
  apply_document(c, root, file_name);
  for (const std::string& override_text : overrides) apply_override(c, override_text);
  validate_config(c, world_size);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides, int world_size) {
  // A regular file only: every rank reads it, and a FIFO (or /dev/stdin) would block or be read by
  // one rank alone.
  std::string reason;
  const int fd = io::open_regular(path, &reason);
  if (fd < 0) fail(fmt::format("cannot read {}: {}", quoted(path), reason));
  std::string text;
  char buffer[1 << 14];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof(buffer))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      fail(fmt::format("cannot read {}: {}", quoted(path), std::strerror(err)));
    }
    text.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return parse_config(text, overrides, world_size, path);
}

std::string config_to_yaml(const Config& c) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  for_each_section(c, [&](const char* section, const auto& s) {
    out << YAML::Key << section << YAML::Value << YAML::BeginMap;
    for_each_field(s, [&](const char* key, const auto& member, const char*) {
      out << YAML::Key << key << YAML::Value;
      if constexpr (std::is_same_v<std::decay_t<decltype(member)>, std::string>) {
        // Always quoted so that a string such as "123" or "" reads back as a string.
        out << YAML::DoubleQuoted << member;
      } else {
        out << to_text(member);
      }
    });
    out << YAML::EndMap;
  });
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::string config_reference() {
  struct Row {
    std::string key, type, value, description;
  };
  std::vector<Row> rows;
  const Config defaults;
  for_each_key(defaults,
               [&](const char* section, const char* key, const auto& member, const char* description) {
                 rows.push_back({fmt::format("{}.{}", section, key),
                                 type_name<std::decay_t<decltype(member)>>(), display(member), description});
               });
  size_t key_width = 0, type_width = 0, value_width = 0;
  for (const Row& row : rows) {
    key_width = std::max(key_width, row.key.size());
    type_width = std::max(type_width, row.type.size());
    value_width = std::max(value_width, row.value.size());
  }
  std::string out = fmt::format("{:<{}}  {:<{}}  {:<{}}  {}\n", "key", key_width, "type", type_width,
                                "default", value_width, "description");
  for (const Row& row : rows) {
    out += fmt::format("{:<{}}  {:<{}}  {:<{}}  {}\n", row.key, key_width, row.type, type_width, row.value,
                       value_width, row.description);
  }
  return out;
}

// ---- LoRA target modules ---------------------------------------------------------------------

std::vector<std::string> lora_target_modules(const std::string& text, const std::string& key) {
  // Ours first, then Hugging Face's names of the same linears (Llama/Mistral/Qwen2's, GPT-J's).
  static const std::pair<std::string_view, std::string_view> kNames[] = {{"q", "q"},
                                                                         {"k", "k"},
                                                                         {"v", "v"},
                                                                         {"o", "o"},
                                                                         {"fc1", "fc1"},
                                                                         {"gate", "gate"},
                                                                         {"up", "up"},
                                                                         {"fc2", "fc2"},
                                                                         {"q_proj", "q"},
                                                                         {"k_proj", "k"},
                                                                         {"v_proj", "v"},
                                                                         {"o_proj", "o"},
                                                                         {"gate_proj", "gate"},
                                                                         {"up_proj", "up"},
                                                                         {"down_proj", "fc2"},
                                                                         {"fc_in", "fc1"},
                                                                         {"fc_out", "fc2"},
                                                                         // Mixtral's experts
                                                                         {"w1", "gate"},
                                                                         {"w3", "up"},
                                                                         {"w2", "fc2"}};
  static const std::string_view kOrder[] = {"q", "k", "v", "o", "fc1", "gate", "up", "fc2"};
  std::set<std::string> chosen;
  std::string item;
  std::stringstream in(text);
  while (std::getline(in, item, ',')) {
    item = trim(item);
    if (item.empty()) continue;
    std::string_view ours;
    for (const auto& [name, mapped] : kNames)
      if (item == name) ours = mapped;
    if (ours.empty())
      fail(fmt::format(
          "{} = {}: unknown module {} (q, k, v, o, fc1, gate, up, fc2, or q_proj, k_proj, v_proj, "
          "o_proj, gate_proj, up_proj, down_proj, w1, w3, w2)",
          key, quoted(text), quoted(item)));
    chosen.insert(std::string(ours));
  }
  if (chosen.empty()) fail(fmt::format("{} = {}: names no module", key, quoted(text)));
  std::vector<std::string> out;
  for (std::string_view m : kOrder)
    if (chosen.count(std::string(m))) out.emplace_back(m);
  return out;
}

bool ModelConfig::lora_targets(const std::string& module) const {
  if (!lora.enabled()) return false;
  const std::vector<std::string> targets = lora_target_modules(lora.target_modules);
  return std::find(targets.begin(), targets.end(), module) != targets.end();
}

}  // namespace parallel
