#pragma once
// Hugging Face model folders <-> our checkpoints, for the architectures config.json can name:
// GPT2LMHeadModel (the mapping of hf_gpt2.hpp), LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM and
// DeepseekV3ForCausalLM (docs/huggingface.md). Used by examples/convert_checkpoint (--from
// hf, --to hf).
//
// A folder holds config.json and either model.safetensors or shards model-0000k-of-0000n.safetensors
// listed by model.safetensors.index.json ({"weight_map": {tensor: file}}). Tensors may be F32, BF16
// or F16; they are converted to F32.
//
// Llama family mapping (names only: both sides store linear weights [out, in], and HF's rotary
// embedding rotates the half-split pairs (i, i + d/2), as our ops::rope_forward does, so q_proj and
// k_proj rows need no permutation; checkpoints from Meta's original code, which rotate interleaved
// pairs (2i, 2i+1), are converted to this layout by transformers' own script before they get here):
//   model.embed_tokens.weight [V, h]                 -> embedding.word.weight
//   model.layers.{i}.input_layernorm.weight          -> layers.{i}.input_norm.weight
//   model.layers.{i}.self_attn.q_proj.{weight,bias}  -> layers.{i}.attention.query.*   [hq·d, h]
//   model.layers.{i}.self_attn.k_proj.{weight,bias}  -> layers.{i}.attention.key.*     [hkv·d, h]
//   model.layers.{i}.self_attn.v_proj.{weight,bias}  -> layers.{i}.attention.value.*   [hkv·d, h]
//   model.layers.{i}.self_attn.o_proj.{weight,bias}  -> layers.{i}.attention.proj.*    [h, hq·d]
//   model.layers.{i}.self_attn.q_norm.weight         -> layers.{i}.attention.q_norm.weight  [d] (Qwen3)
//   model.layers.{i}.self_attn.k_norm.weight         -> layers.{i}.attention.k_norm.weight  [d] (Qwen3)
//   model.layers.{i}.post_attention_layernorm.weight -> layers.{i}.post_attention_norm.weight
//   model.layers.{i}.mlp.gate_proj.{weight,bias}     -> layers.{i}.mlp.gate.*          [f, h]
//   model.layers.{i}.mlp.up_proj.{weight,bias}       -> layers.{i}.mlp.up.*            [f, h]
//   model.layers.{i}.mlp.down_proj.{weight,bias}     -> layers.{i}.mlp.fc2.*           [h, f]
//   model.norm.weight                                -> final_norm.weight
//   lm_head.weight [V, h]                            -> output.weight (untied only)
// MoE layers (Qwen3MoeForCausalLM; MixtralForCausalLM's names in brackets), every layer:
//   model.layers.{i}.mlp.gate.weight [E, h] [block_sparse_moe.gate]       -> layers.{i}.mlp.router.weight
//   ...mlp.experts.{e}.gate_proj.weight [f_e, h] [block_sparse_moe.experts.{e}.w1] ->
//   mlp.experts.{e}.gate.weight
//   ...mlp.experts.{e}.up_proj.weight   [f_e, h] [...w3]                  -> mlp.experts.{e}.up.weight
//   ...mlp.experts.{e}.down_proj.weight [h, f_e] [...w2]                  -> mlp.experts.{e}.fc2.weight
// DeepseekV3ForCausalLM (model.attention mla; rope rows permuted with model.hf_rope_interleave, see
// docs/huggingface.md), per layer i (MoE layers from first_k_dense_replace on):
//   ...self_attn.q_a_proj.weight [rq, h]           -> layers.{i}.attention.q_down.weight
//   ...self_attn.q_a_layernorm.weight [rq]         -> layers.{i}.attention.q_latent_norm.weight
//   ...self_attn.q_b_proj.weight [H (n + r), rq]   -> layers.{i}.attention.q_up.weight
//   ...self_attn.q_proj.weight [H (n + r), h]      -> layers.{i}.attention.query.weight (q_lora_rank null)
//   ...self_attn.kv_a_proj_with_mqa.weight [c + r, h] -> layers.{i}.attention.kv_down.weight
//   ...self_attn.kv_a_layernorm.weight [c]         -> layers.{i}.attention.kv_norm.weight
//   ...self_attn.kv_b_proj.weight [H (n + dv), c]  -> layers.{i}.attention.kv_up.weight
//   ...self_attn.o_proj.weight [h, H dv]           -> layers.{i}.attention.proj.weight
//   ...mlp.gate.weight [E, h], mlp.gate.e_score_correction_bias [E] -> layers.{i}.mlp.router.weight,
//                                                     layers.{i}.mlp.router.e_score_correction_bias
//   ...mlp.experts.{e}.{gate,up,down}_proj.weight  -> layers.{i}.mlp.experts.{e}.{gate,up,fc2}.weight
//   ...mlp.shared_experts.{gate,up,down}_proj.weight -> layers.{i}.mlp.shared_expert.{gate,up,fc2}.weight
// and the dense layers' mlp.{gate,up,down}_proj as above. Multi-token prediction depth k
// (model.mtp_num_layers = num_nextn_predict_layers; i = num_hidden_layers + k - 1):
//   model.layers.{i}.{enorm,hnorm}.weight [h]      -> layers.{i}.{enorm,hnorm}.weight
//   model.layers.{i}.eh_proj.weight [h, 2h]        -> layers.{i}.eh_proj.weight
//   model.layers.{i}.shared_head.norm.weight [h]   -> layers.{i}.final_norm.weight
//   model.layers.{i}.<a decoder layer like the last one's> -> layers.{i}.<its names above>
//   model.layers.{i}.embed_tokens.weight, shared_head.head.weight: copies of model.embed_tokens and
//   lm_head (must be equal on import; written on export).
// Biases: q/k/v with model.add_qkv_bias (Qwen2) or model.add_bias; o_proj and the MLP with
// model.add_bias (Llama's attention_bias together with mlp_bias). Tied models (tie_word_embeddings)
// have no lm_head; one in the file is accepted only if it equals the embedding.
//
// config.json -> ModelConfig, in the layouts of transformers 4.x (rope_theta, rope_scaling,
// torch_dtype) and 5.x (rope_parameters, dtype): hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, head_dim, vocab_size, max_position_embeddings,
// rms_norm_eps, the rotary embedding (theta; "default", "linear" or "llama3" scaling ->
// model.rope_scaling*), tie_word_embeddings, initializer_range, Mistral's sliding_window
// (-> model.sliding_window), Qwen2/Qwen3's windows, head_dim (-> model.head_dim when it is not
// hidden_size / num_attention_heads), Qwen3's qk-norm (-> model.qk_norm), the architecture
// (-> model.hf_architecture); RMSNorm, SwiGLU and RoPE
// always. Every key is in one table per family (src/io/hf_model.cpp, kKeys): read, known inert, or
// refused in one line naming it ("KEY = VALUE: not supported: it changes the model"); nothing that
// changes the model is ignored. Two keys that disagree (rope_theta and rope_parameters.rope_theta)
// are refused naming both. docs/huggingface.md has the table and the rules.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "parallel/communicator.hpp"
#include "parallel/config.hpp"
#include "parallel/tensor.hpp"

namespace parallel::hf {

enum class Architecture { GPT2, Llama, Mistral, Qwen2, Qwen3, Qwen3Moe, Mixtral, DeepseekV3 };

// "GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
// "Qwen3MoeForCausalLM", "MixtralForCausalLM", "DeepseekV3ForCausalLM".
const char* architecture_name(Architecture a);

// The model a config.json describes (`source` names the file in messages). Throws parallel::Error
// with one line naming the key for an unknown architecture or a setting we do not implement.
struct HfModel {
  Architecture architecture = Architecture::Llama;
  ModelConfig model;
  // DeepSeek-V3's num_nextn_predict_layers: multi-token prediction layers the checkpoint may carry
  // as model.layers.{num_hidden_layers + k - 1}.* (k = 1..D). import_folder imports them as
  // model.mtp_num_layers when the folder holds them all, without them (said in one line) when it
  // holds none, and refuses a partial set. `model` itself has mtp_num_layers 0.
  int mtp_layers = 0;
};
HfModel model_from_config_json(const std::string& json_text, const std::string& source);

// The architecture that holds `model`: model.hf_architecture when set (the one it was imported
// from), else by its shape (GPT-2 for LayerNorm/GeLU/learned positions; Qwen2 for the Llama shape
// with add_qkv_bias and no other bias; Mistral with a sliding window; Llama otherwise). Throws for a
// model no HF architecture here represents (e.g. RMSNorm with GeLU).
Architecture architecture_for(const ModelConfig& model);

// config.json text for `model`, in transformers 5's layout (rope_parameters, dtype) plus 4.x's names
// of the same values (rope_theta, rope_scaling, torch_dtype). `template_json` (a config.json, may be
// empty) supplies every key we do not own (token ids, ...); `torch_dtype` is the tensors' dtype
// ("float32", "bfloat16", "float16"). Throws when `architecture` cannot hold `model`.
std::string config_json_for(const ModelConfig& model, Architecture architecture,
                            const std::string& torch_dtype, const std::string& template_json = "");

// Every tensor of a folder (single file or sharded with its index). A shard that lacks a tensor
// its index names, a tensor in a shard but not in the index, or one in two files is an error.
std::map<std::string, Tensor> load_folder(const std::string& dir);

// Writes config.json and the tensors: model.safetensors when their bytes fit max_shard_bytes,
// else model-0000k-of-0000n.safetensors (tensors in name order, a new shard when the next tensor
// would overflow; a tensor larger than the limit gets a shard of its own) and the index. Creates
// `dir`; refuses one that already holds a config.json or safetensors.
void save_folder(const std::string& dir, const std::map<std::string, Tensor>& tensors,
                 const std::string& config_json, int64_t max_shard_bytes);

// "5GB", "500MB", "10KB" (powers of 1000, as transformers), "2GiB", "64MiB", "1KiB" (powers of 1024)
// or plain bytes -> bytes. Throws parallel::Error naming the text.
int64_t parse_size(const std::string& text);

// HF tensors -> our global parameters (F32, vocabulary unpadded), and back (F32; dtype converts
// the result). The checks of hf_gpt2::from_hf apply: missing, unexpected, misshapen, non-float
// and (unless allow_nonfinite) non-finite tensors are one-line errors naming the tensor.
std::map<std::string, Tensor> from_hf(const std::map<std::string, Tensor>& hf, Architecture architecture,
                                      const ModelConfig& model, const std::string& source,
                                      bool allow_nonfinite = false);
std::map<std::string, Tensor> to_hf(const std::map<std::string, Tensor>& params, Architecture architecture,
                                    const ModelConfig& model, DType dtype = DType::F32);

// Our global parameter names and shapes for a Llama-family `model` (vocabulary unpadded).
std::map<std::string, Shape> llama_parameter_shapes(const ModelConfig& model);

// The shared halves of every importer and exporter (hf_gpt2 uses them too).
// NaN or infinity in imported weights is a broken file or a diverged run: training from it would
// produce NaN losses far from the cause, so importers refuse it, naming the tensor.
void check_finite(const Tensor& t, const std::string& source, const std::string& name);
// Global F32 parameters -> a weights-only checkpoint at step 0 under `root` (extras
// {"config_yaml", "converted_from"}); refuses a root that already holds checkpoints. One process.
std::string save_imported(const std::map<std::string, Tensor>& params, const Config& config,
                          const std::string& root, const std::string& converted_from, Communicator& world);
// The model config stored in a checkpoint's extras ("config_yaml", or "config"), reset to one rank.
ModelConfig model_config_of_checkpoint(const std::string& checkpoint_path);
// The whole tensors `shapes` names from a checkpoint (root, step directory or "latest"), each as
// saved (the vocabulary may be padded in older checkpoints). Weights only. One process.
std::map<std::string, Tensor> load_parameters(const std::string& checkpoint_path,
                                              const std::map<std::string, Shape>& shapes,
                                              Communicator& world);

// HF folder -> checkpoint root `root` (step_00000000, latest) plus `root`.yaml: the default
// training configuration with the folder's model (seq_length: the smallest of
// max_position_embeddings, Mistral's sliding_window and 4096) and, when the folder has a
// tokenizer.json, data.tokenizer HuggingFace with data.tokenizer_file its absolute path. Returns the
// step directory.
std::string import_folder(const std::string& hf_dir, const std::string& root, Communicator& world,
                          bool allow_nonfinite = false);

struct ExportOptions {
  const ModelConfig* model = nullptr;  // else the checkpoint's stored config
  std::string template_config;         // a config.json whose other keys are kept (may be empty)
  int64_t max_shard_bytes = 5'000'000'000;
  DType dtype = DType::F32;  // F32, BF16 or F16
  // A LoRA checkpoint (model.lora): write W + (alpha / rank) B A for every adapted linear (computed
  // in double from the fp32 checkpoint). Without it a LoRA checkpoint exports its base weights only
  // (the adapters go to --to peft).
  bool merge_lora = false;
};
// Checkpoint -> HF folder (config.json, safetensors, index when sharded). Optimizer state is ignored.
void export_folder(const std::string& checkpoint_path, const std::string& hf_dir, Communicator& world,
                   const ExportOptions& options = {});

// ---- LoRA adapters in PEFT's format (docs/huggingface.md, "PEFT adapters") ----------------------

// One adapted linear of a Llama-family model: its Hugging Face module path
// ("model.layers.0.self_attn.q_proj") and our parameter prefix ("layers.0.attention.query"), with
// the base weight's [out, in]. Every model.lora target of every layer, in layer order.
struct LoraModule {
  std::string hf, ours;
  int64_t out = 0, in = 0;
};
std::vector<LoraModule> lora_modules(const ModelConfig& model);

struct PeftOptions {
  const ModelConfig* model = nullptr;   // else the checkpoint's stored config
  std::string base_model_name_or_path;  // adapter_config.json's; may be empty
  DType dtype = DType::F32;             // F32, BF16 or F16
};
// Checkpoint of a LoRA run -> a PEFT adapter folder: adapter_model.safetensors with PEFT's names
// ("base_model.model.<module>.lora_A.weight" [r, in], "...lora_B.weight" [out, r]) and
// adapter_config.json (peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, lora_dropout,
// target_modules as Hugging Face's module names, ...). Llama family only (GPT-2's fused c_attn has
// no q/k/v modules of its own). Creates `dir`; refuses one that already holds an adapter.
void export_peft(const std::string& checkpoint_path, const std::string& dir, Communicator& world,
                 const PeftOptions& options = {});

// The YAML path import_folder writes for `root` ("out/ckpt/" -> "out/ckpt.yaml").
std::string config_path_for(const std::string& root);

}  // namespace parallel::hf
