// Hugging Face model folders <-> our checkpoints (include/parallel/hf_model.hpp).
#include "parallel/hf_model.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <vector>

#include "io/input_file.hpp"
#include "parallel/checkpoint.hpp"
#include "parallel/error.hpp"
#include "parallel/hf_gpt2.hpp"
#include "parallel/log.hpp"
#include "parallel/safetensors.hpp"

namespace parallel::hf {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Conversion errors are user input errors (a wrong folder or config): one clean line, no file:line.
[[noreturn]] void fail(const std::string& message) { throw Error("hf: " + message); }

constexpr const char* kConfigName = "config.json";
constexpr const char* kSingleName = "model.safetensors";
constexpr const char* kIndexName = "model.safetensors.index.json";

std::string read_text(const std::string& path) { return io::read_regular(path, "hf"); }

// Written to a temporary name and renamed: a reader never sees half a config or index.
void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) fail(fmt::format("cannot write {}", tmp));
  }
  fs::rename(tmp, path);
}

json parse_json(const std::string& text, const std::string& source) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    fail(fmt::format("{}: not valid JSON: {}", source, what));
  }
}

// ---- config.json keys --------------------------------------------------------------------------

// The one table of the top-level config.json keys each family may carry (docs/huggingface.md,
// "config.json keys"). Nothing that changes the model is ever ignored: a key is
//   Read     mapped into ModelConfig by the family's reader below, and checked;
//   Inert    known not to change the model or its training (token ids, generation and output
//            switches, the storage dtype, the file's bookkeeping);
//   Default  inert at the value given (JSON; null counts as it too), refused at any other value;
//   Refused  known to change the model in a way we do not implement;
// and a key in no row for the family is refused too ("KEY = VALUE: not supported: it changes the
// model"). The readers may only read Read keys, and must read every Read key present: both are
// checked on every config (an internal error names a row out of step with its reader).
enum class Use { Read, Inert, Default, Refused };

constexpr unsigned kGpt2 = 1, kLlama = 2, kMistral = 4, kQwen2 = 8, kQwen3 = 16, kQwen3Moe = 32,
                   kMixtral = 64, kDeepseekV3 = 128;
constexpr unsigned kMoE = kQwen3Moe | kMixtral;
// The Llama-shaped families: RMSNorm, SwiGLU, rope (DeepSeek-V3 with latent attention).
constexpr unsigned kLlamaFamily = kLlama | kMistral | kQwen2 | kQwen3 | kMoE | kDeepseekV3,
                   kAll = kGpt2 | kLlamaFamily;

struct KeyRow {
  std::string_view key;
  unsigned families;
  Use use;
  std::string_view note = "";  // Default: the inert value (JSON); Refused: why
};

// clang-format off
constexpr KeyRow kKeys[] = {
    // Which mapping: every family.
    {"architectures", kAll, Use::Read},
    {"model_type", kAll, Use::Read},
    {"vocab_size", kAll, Use::Read},
    {"initializer_range", kAll, Use::Read},
    {"tie_word_embeddings", kAll, Use::Read},
    // The Llama family (LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config of transformers 4.x and 5.x).
    {"hidden_size", kLlamaFamily, Use::Read},
    {"intermediate_size", kLlamaFamily, Use::Read},
    {"num_hidden_layers", kLlamaFamily, Use::Read},
    {"num_attention_heads", kLlamaFamily, Use::Read},
    {"num_key_value_heads", kLlamaFamily, Use::Read},
    {"head_dim", kLlamaFamily, Use::Read},
    {"max_position_embeddings", kLlamaFamily, Use::Read},
    {"rms_norm_eps", kLlamaFamily, Use::Read},
    {"hidden_act", kLlamaFamily, Use::Read},
    {"attention_dropout", kLlamaFamily, Use::Read},
    {"rope_theta", kLlamaFamily, Use::Read},       // transformers 4.x
    {"rope_scaling", kLlamaFamily, Use::Read},     // transformers 4.x
    {"rope_parameters", kLlamaFamily, Use::Read},  // transformers 5.x: rope_theta and the scaling together
    {"partial_rotary_factor", kLlamaFamily, Use::Default, "1.0"},
    {"attention_bias", kLlama | kQwen3 | kQwen3Moe | kDeepseekV3, Use::Read},
    {"mlp_bias", kLlama, Use::Read},
    // Llama's tensor-parallel pretraining split of its linears: the same products in another order
    // (transformers 4.x), ignored by 5.x.
    {"pretraining_tp", kLlama | kDeepseekV3, Use::Inert},
    {"max_sequence_length", kLlama, Use::Inert},  // Llama 1 conversions; transformers never read it
    {"sliding_window", kMistral | kQwen2 | kQwen3 | kMoE, Use::Read},
    {"use_sliding_window", kQwen2 | kQwen3 | kQwen3Moe, Use::Read},
    {"max_window_layers", kQwen2 | kQwen3 | kQwen3Moe, Use::Read},
    {"layer_types", kQwen2 | kQwen3, Use::Read},  // transformers 4.57+ and 5.x
    // Mixture of experts (Qwen3MoeConfig, MixtralConfig). num_experts is Qwen3-MoE's name in
    // transformers 4.x, num_local_experts Mixtral's and 5.x's for both.
    {"num_local_experts", kMoE | kDeepseekV3, Use::Read},  // DeepSeek-V3: 5.x's alias of n_routed_experts
    {"num_experts", kQwen3Moe, Use::Read},
    {"num_experts_per_tok", kMoE | kDeepseekV3, Use::Read},
    {"moe_intermediate_size", kQwen3Moe | kDeepseekV3, Use::Read},
    {"decoder_sparse_step", kQwen3Moe, Use::Read},
    {"mlp_only_layers", kQwen3Moe, Use::Read},
    {"norm_topk_prob", kQwen3Moe | kDeepseekV3, Use::Read},
    // transformers adds the router's balancing loss to the loss only with output_router_logits (its
    // coefficient is inert otherwise); its loss pools all layers' tokens, which our per-layer aux
    // loss does not: refused when on.
    {"output_router_logits", kMoE | kDeepseekV3, Use::Default, "false"},
    {"router_aux_loss_coef", kMoE, Use::Inert},
    {"router_jitter_noise", kMixtral, Use::Default, "0.0"},
    // DeepSeek-V3 (DeepseekV3Config of transformers 4.x and 5.x): multi-head latent attention, sigmoid
    // group-limited routing with an expert bias, shared experts, dense first layers.
    {"q_lora_rank", kDeepseekV3, Use::Read},  // null: one plain q_proj
    {"kv_lora_rank", kDeepseekV3, Use::Read},
    {"qk_nope_head_dim", kDeepseekV3, Use::Read},
    {"qk_rope_head_dim", kDeepseekV3, Use::Read},
    {"qk_head_dim", kDeepseekV3, Use::Read},  // written by transformers: qk_nope_head_dim + qk_rope_head_dim
    {"v_head_dim", kDeepseekV3, Use::Read},
    {"rope_interleave", kDeepseekV3, Use::Read},
    {"n_routed_experts", kDeepseekV3, Use::Read},
    {"n_shared_experts", kDeepseekV3, Use::Read},
    {"routed_scaling_factor", kDeepseekV3, Use::Read},
    {"n_group", kDeepseekV3, Use::Read},
    {"topk_group", kDeepseekV3, Use::Read},
    {"first_k_dense_replace", kDeepseekV3, Use::Read},
    {"num_nextn_predict_layers", kDeepseekV3, Use::Read},  // multi-token prediction layers (not imported)
    {"num_mtp_layers", kDeepseekV3, Use::Read},            // transformers 5's alias of the same
    // DeepSeek's own configuration_deepseek.py (the hub folders' config.json): the routing transformers
    // implements is noaux_tc with sigmoid scores, every layer from first_k_dense_replace on a MoE
    // layer; ep_size only spreads the experts over the processes of DeepSeek's inference code (the
    // same model). transformers trains without DeepSeek's balance loss (aux_loss_alpha, seq_aux): set
    // model.moe_seq_aux_loss_coeff after import for it.
    {"topk_method", kDeepseekV3, Use::Default, "\"noaux_tc\""},
    {"scoring_func", kDeepseekV3, Use::Default, "\"sigmoid\""},
    {"moe_layer_freq", kDeepseekV3, Use::Default, "1"},
    {"ep_size", kDeepseekV3, Use::Inert},
    {"aux_loss_alpha", kDeepseekV3, Use::Inert},
    {"seq_aux", kDeepseekV3, Use::Inert},
    // GPT-2 (GPT2Config).
    {"n_layer", kGpt2, Use::Read},
    {"n_embd", kGpt2, Use::Read},
    {"n_head", kGpt2, Use::Read},
    {"n_inner", kGpt2, Use::Read},
    {"n_positions", kGpt2, Use::Read},
    {"n_ctx", kGpt2, Use::Read},
    {"layer_norm_epsilon", kGpt2, Use::Read},
    {"activation_function", kGpt2, Use::Read},
    {"resid_pdrop", kGpt2, Use::Read},
    {"embd_pdrop", kGpt2, Use::Read},
    {"attn_pdrop", kGpt2, Use::Read},
    {"scale_attn_by_inverse_layer_idx", kGpt2, Use::Read},
    {"scale_attn_weights", kGpt2, Use::Default, "true"},
    {"reorder_and_upcast_attn", kGpt2, Use::Inert},  // the same attention, computed in float32
    // GPT2DoubleHeadsModel's sequence-summary head, not part of GPT2LMHeadModel.
    {"summary_type", kGpt2, Use::Inert},
    {"summary_use_proj", kGpt2, Use::Inert},
    {"summary_activation", kGpt2, Use::Inert},
    {"summary_proj_to_labels", kGpt2, Use::Inert},
    {"summary_first_dropout", kGpt2, Use::Inert},
    {"add_cross_attention", kAll, Use::Default, "false"},
    // Every family: the storage dtype (tensors carry their own), tokens, generation, outputs, bookkeeping.
    {"torch_dtype", kAll, Use::Inert},  // transformers 4.x
    {"dtype", kAll, Use::Inert},        // transformers 5.x
    {"transformers_version", kAll, Use::Inert},
    {"_name_or_path", kAll, Use::Inert},
    {"_commit_hash", kAll, Use::Inert},
    {"_attn_implementation", kAll, Use::Inert},  // eager / sdpa / flash: the same attention
    {"_attn_implementation_autoset", kAll, Use::Inert},
    {"attn_implementation", kAll, Use::Inert},
    {"bos_token_id", kAll, Use::Inert},
    {"eos_token_id", kAll, Use::Inert},
    {"pad_token_id", kAll, Use::Inert},
    {"sep_token_id", kAll, Use::Inert},
    {"decoder_start_token_id", kAll, Use::Inert},
    {"use_cache", kAll, Use::Inert},
    {"output_attentions", kAll, Use::Inert},
    {"output_hidden_states", kAll, Use::Inert},
    {"return_dict", kAll, Use::Inert},
    {"torchscript", kAll, Use::Default, "false"},  // true: tied embeddings become two copies
    {"use_bfloat16", kAll, Use::Inert},
    {"tf_legacy_loss", kAll, Use::Inert},
    {"chunk_size_feed_forward", kAll, Use::Inert},  // the same feed-forward, in chunks
    {"id2label", kAll, Use::Inert},                  // labels of classification heads
    {"label2id", kAll, Use::Inert},
    {"problem_type", kAll, Use::Inert},
    {"finetuning_task", kAll, Use::Inert},
    {"tokenizer_class", kAll, Use::Inert},
    {"prefix", kAll, Use::Inert},
    {"task_specific_params", kAll, Use::Inert},
    {"is_decoder", kAll, Use::Inert},  // causal either way for these models
    {"is_encoder_decoder", kAll, Use::Default, "false"},
    {"tie_encoder_decoder", kAll, Use::Default, "false"},
    {"cross_attention_hidden_size", kAll, Use::Default, "null"},
    {"pruned_heads", kAll, Use::Default, "{}"},
    // Generation settings of transformers 4.x configs (generation_config.json since).
    {"max_length", kAll, Use::Inert}, {"min_length", kAll, Use::Inert}, {"do_sample", kAll, Use::Inert},
    {"early_stopping", kAll, Use::Inert}, {"num_beams", kAll, Use::Inert}, {"num_beam_groups", kAll, Use::Inert},
    {"diversity_penalty", kAll, Use::Inert}, {"temperature", kAll, Use::Inert}, {"top_k", kAll, Use::Inert},
    {"top_p", kAll, Use::Inert}, {"typical_p", kAll, Use::Inert}, {"repetition_penalty", kAll, Use::Inert},
    {"length_penalty", kAll, Use::Inert}, {"no_repeat_ngram_size", kAll, Use::Inert},
    {"encoder_no_repeat_ngram_size", kAll, Use::Inert}, {"bad_words_ids", kAll, Use::Inert},
    {"num_return_sequences", kAll, Use::Inert}, {"output_scores", kAll, Use::Inert},
    {"return_dict_in_generate", kAll, Use::Inert}, {"forced_bos_token_id", kAll, Use::Inert},
    {"forced_eos_token_id", kAll, Use::Inert}, {"remove_invalid_values", kAll, Use::Inert},
    {"exponential_decay_length_penalty", kAll, Use::Inert}, {"suppress_tokens", kAll, Use::Inert},
    {"begin_suppress_tokens", kAll, Use::Inert},
    // Known, and changing the model.
    {"quantization_config", kAll, Use::Refused, "quantized weights"},
    // DeepSeek-V3's hub folders (and Kimi K2's, Moonlight's) name DeepSeek's own modeling code, the
    // code transformers' DeepseekV3 was ported from; check_keys allows it when every class it names is
    // a DeepseekV3 one (inert: the export writes transformers' layout, without it). Any other family,
    // or other classes: the folder's own model, refused.
    {"auto_map", kDeepseekV3, Use::Inert},
    {"auto_map", kAll, Use::Refused, "the folder's own modeling code (trust_remote_code)"},
    {"use_mrope", kQwen2, Use::Default, "false"},
};
// clang-format on

unsigned family_bit(Architecture a) {
  switch (a) {
    case Architecture::GPT2:
      return kGpt2;
    case Architecture::Llama:
      return kLlama;
    case Architecture::Mistral:
      return kMistral;
    case Architecture::Qwen2:
      return kQwen2;
    case Architecture::Qwen3:
      return kQwen3;
    case Architecture::Qwen3Moe:
      return kQwen3Moe;
    case Architecture::Mixtral:
      return kMixtral;
    case Architecture::DeepseekV3:
      return kDeepseekV3;
  }
  return 0;
}

const KeyRow* key_row(std::string_view key, Architecture a) {
  for (const KeyRow& row : kKeys)
    if (row.key == key && (row.families & family_bit(a)) != 0) return &row;
  return nullptr;
}

// A DeepSeek-V3 folder's auto_map: {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
// "AutoModel": "modeling_deepseek.DeepseekV3Model", "AutoModelForCausalLM":
// "modeling_deepseek.DeepseekV3ForCausalLM"}. Any class that is not one of those three is another model.
void check_deepseek_auto_map(const json& value, const std::string& source) {
  static const std::set<std::string> classes = {"DeepseekV3Config", "DeepseekV3Model",
                                                "DeepseekV3ForCausalLM"};
  bool ok = value.is_object();
  for (auto it = value.begin(); ok && it != value.end(); ++it) {
    const std::string name = it->is_string() ? it->get<std::string>() : "";
    const std::size_t dot = name.rfind('.');
    ok = classes.count(dot == std::string::npos ? name : name.substr(dot + 1)) != 0;
  }
  if (!ok)
    fail(
        fmt::format("{}: auto_map = {}: not supported: it names modeling code other than DeepSeek-V3's own "
                    "(DeepseekV3Config, DeepseekV3Model, DeepseekV3ForCausalLM)",
                    source, value.dump()));
}

// Before reading: every key is in the table, and Default / Refused keys allow the model.
void check_keys(const json& j, Architecture a, const std::string& source) {
  for (const auto& [key, value] : j.items()) {
    const KeyRow* row = key_row(key, a);
    if (row == nullptr)
      fail(
          fmt::format("{}: {} = {}: not supported: it changes the model, or may ({} keys that are read or "
                      "known inert: docs/huggingface.md)",
                      source, key, value.dump(), architecture_name(a)));
    if (row->use == Use::Refused)
      fail(fmt::format("{}: {} = {}: not supported: it changes the model ({})", source, key, value.dump(),
                       row->note));
    if (key == "auto_map") check_deepseek_auto_map(value, source);
    if (row->use == Use::Default && !value.is_null() && value != json::parse(row->note))
      fail(fmt::format("{}: {} = {}: not supported: it changes the model (only {} is read)", source, key,
                       value.dump(), row->note));
  }
}

// A key of config.json, read with the type the model needs; absent (or null) keys take `fallback`
// when one is given, else are an error. Remembers every key it was asked about (top-level only).
class Fields {
 public:
  // prefix: how the keys are named in messages ("rope_scaling." for the keys of that object).
  Fields(const json& j, std::string source, std::string prefix = "")
      : j_(j), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const {
    asked_.insert(key);
    return j_.contains(key) && !j_[key].is_null();
  }
  // In the object at all, null included.
  bool present(const char* key) const {
    asked_.insert(key);
    return j_.contains(key);
  }
  const std::string& source() const { return source_; }
  const std::string& prefix() const { return prefix_; }
  const json& raw(const char* key) const {
    asked_.insert(key);
    return j_[key];
  }
  const std::set<std::string>& asked() const { return asked_; }

  int64_t integer(const char* key, std::optional<int64_t> fallback = std::nullopt) const {
    if (!has(key)) return required(key, fallback);
    const json& v = j_[key];
    if (!v.is_number_integer()) bad(key, v, "expected an integer");
    const int64_t x = v.get<int64_t>();
    if (x < 1) bad(key, v, "must be >= 1");
    return x;
  }
  double number(const char* key, std::optional<double> fallback = std::nullopt) const {
    if (!has(key)) return required(key, fallback);
    const json& v = j_[key];
    if (!v.is_number()) bad(key, v, "expected a number");
    return v.get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_[key];
    if (!v.is_boolean()) bad(key, v, "expected true or false");
    return v.get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_[key];
    if (!v.is_string()) bad(key, v, "expected a string");
    return v.get<std::string>();
  }

  [[noreturn]] void bad(const std::string& key, const json& value, const std::string& rule) const {
    fail(fmt::format("{}: {}{} = {}: {}", source_, prefix_, key, value.dump(), rule));
  }

 private:
  template <typename T>
  T required(const char* key, std::optional<T> fallback) const {
    if (!fallback) fail(fmt::format("{}: missing key '{}{}'", source_, prefix_, key));
    return *fallback;
  }

  const json& j_;
  std::string source_, prefix_;
  mutable std::set<std::string> asked_;
};

// After reading: the reader asked about Read keys only, and about every Read key the config holds.
void check_reader_against_table(const json& j, Architecture a, const Fields& f) {
  for (const std::string& key : f.asked()) {
    const KeyRow* row = key_row(key, a);
    if (row == nullptr || row->use != Use::Read)
      fail(fmt::format("internal: the {} reader reads '{}', which the key table does not mark Read",
                       architecture_name(a), key));
  }
  for (const auto& [key, value] : j.items()) {
    const KeyRow* row = key_row(key, a);
    if (row != nullptr && row->use == Use::Read && !f.asked().count(key))
      fail(fmt::format("internal: the key table marks '{}' Read for {}, but its reader ignores it", key,
                       architecture_name(a)));
  }
}

// Sizes: each must be an int, and a whole model of them must be countable. A config.json with
// num_hidden_layers 1e9 would otherwise build 1e9 layers' worth of tensor names before any check.
constexpr int64_t kMaxLayers = 1 << 16;

int checked_int(const Fields& f, const char* key, std::optional<int64_t> fallback = std::nullopt) {
  const int64_t v = f.integer(key, fallback);
  if (v > std::numeric_limits<int>::max()) f.bad(key, json(v), "too large");
  return static_cast<int>(v);
}

int checked_layers(const Fields& f, const char* key) {
  const int64_t v = f.integer(key);
  if (v > kMaxLayers) f.bad(key, json(v), fmt::format("too large (at most {} layers)", kMaxLayers));
  return static_cast<int>(v);
}

Architecture architecture_from_json(const json& j, const std::string& source) {
  static const std::map<std::string, Architecture> by_name = {
      {"GPT2LMHeadModel", Architecture::GPT2},       {"LlamaForCausalLM", Architecture::Llama},
      {"MistralForCausalLM", Architecture::Mistral}, {"Qwen2ForCausalLM", Architecture::Qwen2},
      {"Qwen3ForCausalLM", Architecture::Qwen3},     {"Qwen3MoeForCausalLM", Architecture::Qwen3Moe},
      {"MixtralForCausalLM", Architecture::Mixtral}, {"DeepseekV3ForCausalLM", Architecture::DeepseekV3}};
  static const std::map<std::string, Architecture> by_type = {
      {"gpt2", Architecture::GPT2},       {"llama", Architecture::Llama},
      {"mistral", Architecture::Mistral}, {"qwen2", Architecture::Qwen2},
      {"qwen3", Architecture::Qwen3},     {"qwen3_moe", Architecture::Qwen3Moe},
      {"mixtral", Architecture::Mixtral}, {"deepseek_v3", Architecture::DeepseekV3}};
  const std::string supported =
      "GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
      "Qwen3MoeForCausalLM, MixtralForCausalLM, DeepseekV3ForCausalLM";
  std::optional<Architecture> named, typed;
  if (j.contains("architectures") && !j["architectures"].is_null()) {
    const json& a = j["architectures"];
    if (!a.is_array() || a.size() != 1 || !a[0].is_string())
      fail(fmt::format("{}: architectures = {}: expected a list of one name ({})", source, a.dump(),
                       supported));
    const auto it = by_name.find(a[0].get<std::string>());
    if (it == by_name.end())
      fail(fmt::format("{}: architectures = {}: not supported (supported: {})", source, a.dump(), supported));
    named = it->second;
  }
  if (j.contains("model_type") && !j["model_type"].is_null()) {
    const json& t = j["model_type"];
    const auto it = t.is_string() ? by_type.find(t.get<std::string>()) : by_type.end();
    if (it == by_type.end())
      fail(fmt::format("{}: model_type = {}: not supported (supported: {})", source, t.dump(),
                       "gpt2, llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, deepseek_v3"));
    typed = it->second;
  }
  // transformers builds the model from model_type and names it by architectures: both must agree.
  if (named && typed && *named != *typed)
    fail(fmt::format("{}: architectures = {} and model_type = {} disagree", source, j["architectures"].dump(),
                     j["model_type"].dump()));
  if (named) return *named;
  if (typed) return *typed;
  fail(fmt::format("{}: missing key 'architectures' (one of {})", source, supported));
}

ModelConfig gpt2_model(const Fields& f) {
  ModelConfig m;
  f.has("architectures");
  f.has("model_type");
  m.num_layers = checked_layers(f, "n_layer");
  m.hidden_size = checked_int(f, "n_embd");
  m.num_attention_heads = checked_int(f, "n_head");
  m.ffn_hidden_size = f.has("n_inner") ? checked_int(f, "n_inner") : 4 * m.hidden_size;
  m.vocab_size = checked_int(f, "vocab_size");
  m.max_position_embeddings = checked_int(f, "n_positions", 1024);
  // n_ctx: the older name of n_positions (transformers reads n_positions only).
  if (f.has("n_ctx") && f.integer("n_ctx") != m.max_position_embeddings)
    f.bad("n_ctx", f.raw("n_ctx"), fmt::format("must equal n_positions ({})", m.max_position_embeddings));
  m.seq_length = std::min(m.max_position_embeddings, 4096);
  m.normalization = Normalization::LayerNorm;
  m.activation = Activation::GeLU;
  m.position_embedding = PositionEmbedding::Learned;
  m.add_bias = true;
  m.tie_embeddings = true;
  m.norm_epsilon = f.number("layer_norm_epsilon", 1e-5);
  m.init_std = f.number("initializer_range", 0.02);
  m.dropout = f.number("resid_pdrop", 0.1);
  // One model.dropout for the residual, embedding and attention dropouts.
  for (const char* key : {"embd_pdrop", "attn_pdrop"})
    if (const double p = f.number(key, 0.1); p != m.dropout)
      f.bad(key, json(p),
            fmt::format("not supported: must equal resid_pdrop ({}; one model.dropout)", m.dropout));
  // Our GeLU is the tanh approximation (transformers' "gelu_new").
  const std::string act = f.string("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    f.bad("activation_function", json(act),
          "not supported (only the tanh GeLU: gelu_new, gelu_pytorch_tanh)");
  if (!f.boolean("tie_word_embeddings", true))
    f.bad("tie_word_embeddings", json(false), "untied GPT-2 heads are not supported");
  if (f.boolean("scale_attn_by_inverse_layer_idx", false))
    f.bad("scale_attn_by_inverse_layer_idx", json(true), "not supported");
  m.hf_architecture = "GPT2LMHeadModel";
  return m;
}

// One rope object: transformers 4.x's rope_scaling ({"rope_type" or the older "type": "default" |
// "linear" | "llama3" | "yarn", factor, ...}) or 5.x's rope_parameters (the same, plus rope_theta; a
// missing rope_type is "default" there). Every key of the object is read or refused. yarn's
// original_max_position_embeddings may be missing: transformers then takes max_position_embeddings
// (standardize_rope_params), which read_rope fills in (`original_missing`). A top-level
// original_max_position_embeddings (Phi-3's place, which transformers prefers) is not in the key
// table, hence refused.
struct RopeObject {
  RopeScaling scaling;
  std::optional<double> theta;
  bool original_missing = false;
};

RopeObject rope_object(const Fields& f, const char* name) {
  const json& r = f.raw(name);
  if (!r.is_object()) f.bad(name, r, "expected null or an object");
  const std::string prefix = std::string(name) + ".";
  const Fields rf(r, f.source(), prefix);
  const bool v5 = std::string_view(name) == "rope_parameters";
  const char* type_key = r.contains("rope_type") ? "rope_type" : "type";
  if (r.contains("rope_type") && r.contains("type") && r["rope_type"] != r["type"])
    fail(fmt::format("{}: {}rope_type = {} and {}type = {} disagree", f.source(), prefix,
                     r["rope_type"].dump(), prefix, r["type"].dump()));
  const std::string type = rf.string(type_key, v5 ? "default" : "");
  if (type.empty()) fail(fmt::format("{}: missing key '{}rope_type'", f.source(), prefix));
  std::set<std::string> keys = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  RopeObject out;
  if (rf.has("rope_theta")) out.theta = rf.number("rope_theta");
  if (rf.has("partial_rotary_factor") && rf.number("partial_rotary_factor") != 1.0)
    rf.bad("partial_rotary_factor", r["partial_rotary_factor"], "not supported: it changes the model");
  if (type != "default" && type != "linear" && type != "llama3" && type != "yarn")
    rf.bad(type_key, json(type), "not supported (only \"default\", \"linear\", \"llama3\" and \"yarn\")");
  if (type != "default") {
    keys.insert("factor");
    out.scaling.factor = rf.number("factor");
    if (out.scaling.factor <= 0) rf.bad("factor", r["factor"], "must be > 0");
    out.scaling.type = RopeScalingType::Linear;
  }
  if (type == "llama3") {
    keys.insert({"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
    RopeScaling& s = out.scaling;
    s.type = RopeScalingType::Llama3;
    s.low_freq_factor = rf.number("low_freq_factor");
    s.high_freq_factor = rf.number("high_freq_factor");
    s.original_max_position_embeddings = static_cast<double>(rf.integer("original_max_position_embeddings"));
    if (s.low_freq_factor <= 0) rf.bad("low_freq_factor", r["low_freq_factor"], "must be > 0");
    if (s.high_freq_factor <= s.low_freq_factor)
      rf.bad("high_freq_factor", r["high_freq_factor"], "must be > low_freq_factor");
  }
  if (type == "yarn") {
    // transformers' _compute_yarn_parameters: beta_fast / beta_slow null or 0 mean 32 / 1, mscale and
    // mscale_all_dim null or 0 leave the attention factor to factor alone, attention_factor null
    // derives it, truncate defaults to true.
    keys.insert({"original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                 "attention_factor", "truncate"});
    RopeScaling& s = out.scaling;
    s.type = RopeScalingType::Yarn;
    auto optional_number = [&](const char* key, double fallback) {
      return rf.has(key) && !r[key].is_null() ? rf.number(key) : fallback;
    };
    if (rf.has("original_max_position_embeddings") && !r["original_max_position_embeddings"].is_null())
      s.original_max_position_embeddings =
          static_cast<double>(rf.integer("original_max_position_embeddings"));
    else
      out.original_missing = true;
    s.beta_fast = optional_number("beta_fast", 0.0);
    s.beta_slow = optional_number("beta_slow", 0.0);
    if (s.beta_fast == 0.0) s.beta_fast = 32.0;
    if (s.beta_slow == 0.0) s.beta_slow = 1.0;
    s.mscale = optional_number("mscale", 0.0);
    s.mscale_all_dim = optional_number("mscale_all_dim", 0.0);
    s.attention_factor = optional_number("attention_factor", 0.0);
    if (rf.has("truncate") && !r["truncate"].is_null()) s.truncate = rf.boolean("truncate", true);
    if (s.beta_slow < 0) rf.bad("beta_slow", r["beta_slow"], "must be > 0");
    if (s.beta_fast < s.beta_slow) rf.bad("beta_fast", r["beta_fast"], "must be >= beta_slow");
    if (s.attention_factor < 0) rf.bad("attention_factor", r["attention_factor"], "must be > 0");
  }
  for (const auto& [key, value] : r.items())
    if (!keys.count(key))
      rf.bad(key, value, fmt::format("not supported: it changes the model (rope_type {})", type));
  return out;
}

bool same_scaling(const RopeScaling& a, const RopeScaling& b) {
  if (a.type != b.type) return false;
  if (a.type == RopeScalingType::None) return true;
  if (a.factor != b.factor) return false;
  if (a.type == RopeScalingType::Llama3)
    return a.low_freq_factor == b.low_freq_factor && a.high_freq_factor == b.high_freq_factor &&
           a.original_max_position_embeddings == b.original_max_position_embeddings;
  if (a.type == RopeScalingType::Yarn)
    return a.original_max_position_embeddings == b.original_max_position_embeddings &&
           a.beta_fast == b.beta_fast && a.beta_slow == b.beta_slow && a.mscale == b.mscale &&
           a.mscale_all_dim == b.mscale_all_dim && a.attention_factor == b.attention_factor &&
           a.truncate == b.truncate;
  return true;
}

// The rotary embedding of both layouts: transformers 4.x's top-level rope_theta and rope_scaling,
// 5.x's rope_parameters. Where a config carries more than one, they must agree (transformers 5
// takes rope_parameters' theta but rope_scaling's type, 4.x the top-level keys only: a config that
// says two things is read differently by each version, so it is refused, naming both keys).
void read_rope(const Fields& f, ModelConfig& m) {
  struct Theta {
    std::string key;
    double value;
  };
  std::vector<Theta> thetas;
  if (f.has("rope_theta")) thetas.push_back({"rope_theta", f.number("rope_theta")});
  std::optional<RopeObject> scaling, parameters;
  if (f.has("rope_scaling")) scaling = rope_object(f, "rope_scaling");
  if (f.has("rope_parameters")) parameters = rope_object(f, "rope_parameters");
  if (scaling && scaling->theta) thetas.push_back({"rope_scaling.rope_theta", *scaling->theta});
  if (parameters && parameters->theta) thetas.push_back({"rope_parameters.rope_theta", *parameters->theta});
  for (const Theta& t : thetas)
    if (t.value != thetas.front().value)
      fail(fmt::format(
          "{}: {} = {} and {} = {} disagree: not supported (transformers 4.x and 5.x would read "
          "different models)",
          f.source(), thetas.front().key, json(thetas.front().value).dump(), t.key, json(t.value).dump()));
  m.rope_theta = thetas.empty() ? 10000.0 : thetas.front().value;
  if (scaling && parameters && !same_scaling(scaling->scaling, parameters->scaling))
    fail(
        fmt::format("{}: rope_scaling = {} and rope_parameters = {} disagree: not supported (transformers "
                    "4.x and 5.x would read different models)",
                    f.source(), f.raw("rope_scaling").dump(), f.raw("rope_parameters").dump()));
  if (parameters) m.rope_scaling = parameters->scaling;
  if (scaling) m.rope_scaling = scaling->scaling;
  const bool original_missing =
      (parameters && parameters->original_missing) || (scaling && scaling->original_missing);
  if (m.rope_scaling.type == RopeScalingType::Yarn && original_missing)  // transformers' default
    m.rope_scaling.original_max_position_embeddings =
        static_cast<double>(f.integer("max_position_embeddings"));
}

// Qwen3-MoE's and Mixtral's experts: softmax over all experts, top-k, dropless, SwiGLU experts
// without biases, no shared expert (our MoELayer, docs/model.md). Mixtral always renormalises the
// top-k weights to sum 1 (model.moe_norm_topk_prob), Qwen3-MoE with norm_topk_prob; neither scales
// them. MoE layers other than every layer (decoder_sparse_step, mlp_only_layers) are refused.
void read_moe(const Fields& f, Architecture a, ModelConfig& m) {
  std::optional<int64_t> experts;
  for (const char* key : {"num_local_experts", "num_experts"}) {
    if (a == Architecture::Mixtral && std::string_view(key) == "num_experts")
      continue;  // Qwen3-MoE's 4.x name
    if (!f.has(key)) continue;
    const int64_t e = f.integer(key);
    if (experts && *experts != e)
      f.bad(key, f.raw(key), fmt::format("must equal num_local_experts ({})", *experts));
    experts = e;
  }
  if (!experts) fail(fmt::format("{}: missing key 'num_local_experts'", f.source()));
  if (*experts > 65536) f.bad("num_local_experts", json(*experts), "too large (at most 65536 experts)");
  m.num_experts = static_cast<int>(*experts);
  m.moe_router_topk = checked_int(f, "num_experts_per_tok");
  m.moe_layer_freq = 1;
  m.moe_capacity_factor = 0.0;
  m.moe_aux_loss_coeff = 0.0;  // output_router_logits is false (key table)
  m.moe_z_loss_coeff = 0.0;
  if (a == Architecture::Mixtral) {
    m.moe_ffn_hidden_size = m.ffn_hidden_size;  // intermediate_size is each expert's width
    m.moe_norm_topk_prob = true;
    return;
  }
  m.moe_ffn_hidden_size = checked_int(f, "moe_intermediate_size");
  if (const int64_t step = f.integer("decoder_sparse_step", 1); step != 1)
    f.bad("decoder_sparse_step", f.raw("decoder_sparse_step"),
          "not supported (only 1: every layer a MoE layer)");
  if (f.has("mlp_only_layers")) {
    const json& dense = f.raw("mlp_only_layers");
    if (!dense.is_array()) f.bad("mlp_only_layers", dense, "expected a list of layer indices");
    if (!dense.empty()) f.bad("mlp_only_layers", dense, "not supported (only []: every layer a MoE layer)");
  }
  m.moe_norm_topk_prob = f.boolean("norm_topk_prob", false);
}

// What every Llama-family block shares: RMSNorm, SwiGLU, rope (read_rope), no biases, no dropout
// (attention_dropout refused), tied embeddings and init std as the config says.
void read_llama_block(const Fields& f, ModelConfig& m) {
  m.normalization = Normalization::RMSNorm;
  m.activation = Activation::SwiGLU;
  m.position_embedding = PositionEmbedding::Rope;
  m.norm_epsilon = f.number("rms_norm_eps", 1e-6);
  read_rope(f, m);
  m.tie_embeddings = f.boolean("tie_word_embeddings", false);
  m.init_std = f.number("initializer_range", 0.02);
  // transformers drops attention probabilities only; model.dropout drops hidden states too.
  if (const double p = f.number("attention_dropout", 0.0); p != 0.0)
    f.bad("attention_dropout", f.raw("attention_dropout"),
          "not supported: it changes the training (model.dropout also drops hidden states; set it after "
          "import)");
  m.dropout = 0.0;
  m.add_bias = false;
}

ModelConfig llama_model(const Fields& f, Architecture a) {
  ModelConfig m;
  f.has("architectures");
  f.has("model_type");
  m.num_layers = checked_layers(f, "num_hidden_layers");
  m.hidden_size = checked_int(f, "hidden_size");
  m.num_attention_heads = checked_int(f, "num_attention_heads");
  m.num_query_groups = checked_int(f, "num_key_value_heads", m.num_attention_heads);
  m.ffn_hidden_size = checked_int(f, "intermediate_size");
  m.vocab_size = checked_int(f, "vocab_size");
  const int64_t default_positions = a == Architecture::Llama     ? 2048
                                    : a == Architecture::Mistral ? 131072
                                                                 : 32768;  // Qwen2, Qwen3(-MoE), Mixtral
  m.max_position_embeddings = checked_int(f, "max_position_embeddings", default_positions);
  read_llama_block(f, m);
  m.add_qkv_bias = a == Architecture::Qwen2;
  m.qk_norm = a == Architecture::Qwen3 || a == Architecture::Qwen3Moe;

  if (const std::string act = f.string("hidden_act", "silu"); act != "silu")
    f.bad("hidden_act", json(act), "not supported (only silu: SwiGLU)");
  // head_dim: per head, free of hidden_size (transformers: hidden_size / num_attention_heads when
  // absent, except Qwen3Config, whose default is 128). model.head_dim stays 0 when it is the quotient.
  const int64_t head_dim = f.has("head_dim")          ? f.integer("head_dim")
                           : a == Architecture::Qwen3 ? 128
                           : m.hidden_size % m.num_attention_heads == 0
                               ? m.hidden_size / m.num_attention_heads
                               : 0;
  if (head_dim == 0)
    fail(
        fmt::format("{}: missing key 'head_dim' (hidden_size {} is not a multiple of num_attention_heads {})",
                    f.source(), m.hidden_size, m.num_attention_heads));
  if (head_dim > std::numeric_limits<int>::max()) f.bad("head_dim", f.raw("head_dim"), "too large");
  if (head_dim * m.num_attention_heads != m.hidden_size) m.head_dim = static_cast<int>(head_dim);
  // Qwen3's attention_bias puts biases on q, k, v and o only: no model.* key holds that.
  if ((a == Architecture::Qwen3 || a == Architecture::Qwen3Moe) && f.boolean("attention_bias", false))
    f.bad("attention_bias", json(true), "not supported (biases on q, k, v and o_proj only)");
  if (a == Architecture::Llama) {
    const bool attention_bias = f.boolean("attention_bias", false), mlp_bias = f.boolean("mlp_bias", false);
    if (attention_bias != mlp_bias)
      f.bad(attention_bias ? "attention_bias" : "mlp_bias", json(true),
            "not supported without the other (attention_bias and mlp_bias map to model.add_bias)");
    m.add_bias = attention_bias;
  }
  int seq = std::min(m.max_position_embeddings, 4096);
  if (a == Architecture::Qwen2 || a == Architecture::Qwen3) {
    // Qwen2 and Qwen3: with use_sliding_window, layers from max_window_layers on are windowed (transformers'
    // layer_types); without it, transformers ignores both (5.x writes sliding_window null).
    const bool windowed = f.boolean("use_sliding_window", false);
    if (windowed) {
      m.sliding_window = checked_int(f, "sliding_window");
      if (m.sliding_window <= 0)
        f.bad("sliding_window", f.raw("sliding_window"), "must be > 0 with use_sliding_window");
      m.max_window_layers = f.has("max_window_layers") ? checked_int(f, "max_window_layers") : 0;
    } else {
      if (f.has("sliding_window")) f.integer("sliding_window");
      if (f.has("max_window_layers")) f.integer("max_window_layers");
    }
    if (f.has("layer_types")) {
      const json& types = f.raw("layer_types");
      if (!types.is_array() || types.size() != static_cast<std::size_t>(m.num_layers))
        f.bad("layer_types", types,
              fmt::format("expected a list of num_hidden_layers ({}) names", m.num_layers));
      for (int i = 0; i < m.num_layers; ++i) {
        const char* want = m.layer_window(i) > 0 ? "sliding_attention" : "full_attention";
        if (types[static_cast<std::size_t>(i)] != want)
          f.bad(
              "layer_types", types,
              fmt::format("layer {} must be \"{}\" (use_sliding_window, sliding_window and max_window_layers "
                          "say so)",
                          i, want));
      }
    }
  }
  // Mistral's and Mixtral's window: model.sliding_window, on every layer.
  if ((a == Architecture::Mistral || a == Architecture::Mixtral) && f.has("sliding_window"))
    m.sliding_window = checked_int(f, "sliding_window");
  if (a == Architecture::Qwen3Moe) {
    // Qwen3-MoE windows every layer with use_sliding_window (5.x; 4.x's max_window_layers is unused).
    if (f.boolean("use_sliding_window", false))
      f.bad("use_sliding_window", json(true), "not supported for Qwen3MoeForCausalLM");
    if (f.has("sliding_window")) f.integer("sliding_window");
    if (f.has("max_window_layers")) f.integer("max_window_layers");
  }
  if (a == Architecture::Qwen3Moe || a == Architecture::Mixtral) read_moe(f, a, m);
  m.seq_length = seq;
  m.hf_architecture = architecture_name(a);
  return m;
}

// A count that may be 0 (first_k_dense_replace, num_nextn_predict_layers); absent or null: fallback.
int checked_count(const Fields& f, const char* key, int fallback) {
  if (!f.has(key)) return fallback;
  const json& v = f.raw(key);
  if (!v.is_number_integer()) f.bad(key, v, "expected an integer");
  const int64_t x = v.get<int64_t>();
  if (x < 0) f.bad(key, v, "must be >= 0");
  if (x > kMaxLayers) f.bad(key, v, "too large");
  return static_cast<int>(x);
}

// DeepseekV3ForCausalLM (DeepseekV3Config; defaults are transformers'): multi-head latent attention
// (model.attention mla) and DeepSeek-V3's mixture of experts: sigmoid scores, group-limited top-k
// chosen with the expert bias (e_score_correction_bias, model.moe_router_expert_bias), the chosen
// scores renormalised (norm_topk_prob) and scaled (routed_scaling_factor), n_shared_experts shared
// experts as one MLP moe_intermediate_size * n_shared_experts wide, layers below
// first_k_dense_replace dense (intermediate_size wide). transformers derives head_dim
// (= qk_rope_head_dim) and qk_head_dim (= qk_nope_head_dim + qk_rope_head_dim) and writes both: a
// file that says otherwise is refused.
ModelConfig deepseek_v3_model(const Fields& f, int& mtp_layers) {
  ModelConfig m;
  f.has("architectures");
  f.has("model_type");
  m.num_layers = checked_layers(f, "num_hidden_layers");
  m.hidden_size = checked_int(f, "hidden_size");
  m.num_attention_heads = checked_int(f, "num_attention_heads");
  if (f.has("num_key_value_heads") && f.integer("num_key_value_heads") != m.num_attention_heads)
    f.bad("num_key_value_heads", f.raw("num_key_value_heads"),
          fmt::format(
              "not supported: must equal num_attention_heads ({}; latent attention gives every head its "
              "own key and value)",
              m.num_attention_heads));
  m.num_query_groups = m.num_attention_heads;
  m.ffn_hidden_size = checked_int(f, "intermediate_size", 18432);
  m.vocab_size = checked_int(f, "vocab_size");
  m.max_position_embeddings = checked_int(f, "max_position_embeddings", 4096);
  read_llama_block(f, m);
  if (const std::string act = f.string("hidden_act", "silu"); act != "silu")
    f.bad("hidden_act", json(act), "not supported (only silu: SwiGLU)");
  // attention_bias puts biases on q_a_proj (or q_proj), kv_a_proj_with_mqa and o_proj only.
  if (f.boolean("attention_bias", false))
    f.bad("attention_bias", json(true), "not supported (latent attention without biases)");

  // Latent attention. q_lora_rank null: one plain q_proj; absent: transformers' default 1536.
  m.attention = AttentionType::MLA;
  m.q_lora_rank = f.has("q_lora_rank") ? checked_int(f, "q_lora_rank") : f.present("q_lora_rank") ? 0 : 1536;
  m.kv_lora_rank = checked_int(f, "kv_lora_rank", 512);
  m.qk_nope_head_dim = checked_int(f, "qk_nope_head_dim", 128);
  m.qk_rope_head_dim = checked_int(f, "qk_rope_head_dim", 64);
  m.v_head_dim = checked_int(f, "v_head_dim", 128);
  if (f.has("head_dim") && f.integer("head_dim") != m.qk_rope_head_dim)
    f.bad("head_dim", f.raw("head_dim"),
          fmt::format("must equal qk_rope_head_dim ({}; transformers sets it so)", m.qk_rope_head_dim));
  if (f.has("qk_head_dim") && f.integer("qk_head_dim") != m.qk_nope_head_dim + m.qk_rope_head_dim)
    f.bad("qk_head_dim", f.raw("qk_head_dim"),
          fmt::format("must equal qk_nope_head_dim + qk_rope_head_dim ({}; transformers sets it so)",
                      m.qk_nope_head_dim + m.qk_rope_head_dim));
  m.hf_rope_interleave = f.boolean("rope_interleave", true);

  // Experts.
  const int experts = checked_int(f, "n_routed_experts", 256);
  if (experts > 65536)
    f.bad("n_routed_experts", f.raw("n_routed_experts"), "too large (at most 65536 experts)");
  if (f.has("num_local_experts") && f.integer("num_local_experts") != experts)
    f.bad("num_local_experts", f.raw("num_local_experts"),
          fmt::format("must equal n_routed_experts ({}; its alias)", experts));
  m.num_experts = experts;
  m.moe_router_topk = checked_int(f, "num_experts_per_tok", 8);
  m.moe_ffn_hidden_size = checked_int(f, "moe_intermediate_size", 2048);
  const int64_t shared = f.integer("n_shared_experts", 1);
  if (shared * m.moe_ffn_hidden_size > std::numeric_limits<int>::max())
    f.bad("n_shared_experts", f.raw("n_shared_experts"), "too large");
  m.moe_shared_expert_ffn_hidden_size = static_cast<int>(shared * m.moe_ffn_hidden_size);
  m.moe_router_score_function = MoeScoreFunction::Sigmoid;
  m.moe_norm_topk_prob = f.boolean("norm_topk_prob", true);
  m.moe_routed_scaling_factor = f.number("routed_scaling_factor", 2.5);
  if (m.moe_routed_scaling_factor <= 0)
    f.bad("routed_scaling_factor", f.raw("routed_scaling_factor"), "must be > 0");
  m.moe_n_group = checked_int(f, "n_group", 8);
  m.moe_topk_group = checked_int(f, "topk_group", 4);
  m.moe_router_expert_bias = true;  // transformers' router always holds e_score_correction_bias
  m.moe_first_k_dense_replace = checked_count(f, "first_k_dense_replace", 3);
  m.moe_layer_freq = 1;
  m.moe_capacity_factor = 0.0;
  m.moe_aux_loss_coeff = 0.0;  // output_router_logits is false (key table)
  m.moe_z_loss_coeff = 0.0;
  m.moe_seq_aux_loss_coeff = 0.0;

  // Multi-token prediction: transformers 4.x has no such key, 5.x names it num_nextn_predict_layers
  // (num_mtp_layers its alias; default 1).
  mtp_layers = checked_count(f, "num_nextn_predict_layers", 1);
  if (f.has("num_mtp_layers") && checked_count(f, "num_mtp_layers", 0) != mtp_layers) {
    if (!f.has("num_nextn_predict_layers"))
      mtp_layers = checked_count(f, "num_mtp_layers", 0);
    else
      f.bad("num_mtp_layers", f.raw("num_mtp_layers"),
            fmt::format("must equal num_nextn_predict_layers ({}; its alias)", mtp_layers));
  }
  m.seq_length = std::min(m.max_position_embeddings, 4096);
  m.hf_architecture = "DeepseekV3ForCausalLM";
  return m;
}

// ---- tensor checks, shared by every architecture -----------------------------------------------

void check_dtype(const Tensor& t, const std::string& source, const std::string& name) {
  if (!is_floating(t.dtype()) || t.dtype() == DType::F8E4M3)
    fail(fmt::format("{}: '{}' has dtype {}, expected f32, bf16 or f16{}", source, name,
                     dtype_name(t.dtype()),
                     t.dtype() == DType::F8E4M3 ? " (fp8 is storage-only here: no conversion)" : ""));
}

bool same_values(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const std::vector<float> x = a.to_float_vector(), y = b.to_float_vector();
  return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

Tensor f32_copy(const Tensor& t) { return t.to(DType::F32).contiguous().clone(); }

struct Entry {
  std::string hf, ours;
  Shape shape;
  // DeepSeek-V3's rope_interleave (model.hf_rope_interleave): rows [rope_start, rope_start + rope) of
  // every block of rope_block rows are the rope dimensions, interleaved in the checkpoint; 0: none.
  int64_t rope_block = 0, rope_start = 0, rope = 0;
};

// The checkpoint holds a rope block's rows in interleaved pairs (x0, x1, x2, x3, ...), we in
// rotate-half order (x0, x2, ..., x1, x3, ...): the same attention scores, since queries and keys are
// permuted alike (tests/reference/make_mla_fixture.py). to_ours: checkpoint -> ours; else back.
Tensor permute_rope_rows(const Tensor& w, const Entry& e, bool to_ours) {
  Tensor in = w.to(DType::F32).contiguous();
  Tensor out = in.clone();
  const int64_t rows = in.size(0), cols = in.numel() / rows, half = e.rope / 2;
  const float* src = in.data<float>();
  float* dst = out.data<float>();
  for (int64_t b = 0; b + e.rope_block <= rows; b += e.rope_block)
    for (int64_t i = 0; i < e.rope; ++i) {
      const int64_t interleaved = b + e.rope_start + i,
                    rotate_half = b + e.rope_start + (i % 2) * half + i / 2;
      const int64_t from = to_ours ? interleaved : rotate_half, to = to_ours ? rotate_half : interleaved;
      std::memcpy(dst + to * cols, src + from * cols, static_cast<std::size_t>(cols) * sizeof(float));
    }
  return out;
}

// The Llama family's tensors in config order (the mapping table of the header). A MoE layer's
// router and experts are named by the architecture (Mixtral: block_sparse_moe.{gate, experts.E.w1
// (gate), w3 (up), w2 (down)}; Qwen3-MoE: mlp.{gate, experts.E.gate_proj, up_proj, down_proj}), one
// tensor per expert as transformers 4.x and 5.x save them (5.x holds them fused in memory, as
// experts.gate_up_proj [E, 2f, h] and experts.down_proj [E, h, f], and splits them on save).
std::vector<Entry> llama_entries(const ModelConfig& m, Architecture a) {
  const int64_t h = m.hidden_size, hq = m.num_attention_heads;
  const int64_t hkv = m.num_query_groups > 0 ? m.num_query_groups : hq, d = m.attention_head_dim(),
                f = m.ffn_hidden_size;
  const bool qkv_bias = m.add_bias || m.add_qkv_bias;
  std::vector<Entry> e;
  e.push_back({"model.embed_tokens.weight", "embedding.word.weight", {m.vocab_size, h}});
  for (int i = 0; i < m.num_layers; ++i) {
    const std::string src = fmt::format("model.layers.{}.", i), dst = fmt::format("layers.{}.", i);
    e.push_back({src + "input_layernorm.weight", dst + "input_norm.weight", {h}});
    const struct {
      const char *hf, *ours;
      int64_t out, in;
      bool bias;
    } linears[] = {{"self_attn.q_proj", "attention.query", hq * d, h, qkv_bias},
                   {"self_attn.k_proj", "attention.key", hkv * d, h, qkv_bias},
                   {"self_attn.v_proj", "attention.value", hkv * d, h, qkv_bias},
                   {"self_attn.o_proj", "attention.proj", h, hq * d, m.add_bias},
                   {"mlp.gate_proj", "mlp.gate", f, h, m.add_bias},
                   {"mlp.up_proj", "mlp.up", f, h, m.add_bias},
                   {"mlp.down_proj", "mlp.fc2", h, f, m.add_bias}};
    const bool moe = m.is_moe_layer(i);
    for (const auto& l : linears) {
      if (moe && std::string_view(l.ours).starts_with("mlp.")) continue;
      e.push_back({src + l.hf + ".weight", dst + l.ours + ".weight", {l.out, l.in}});
      if (l.bias) e.push_back({src + l.hf + ".bias", dst + l.ours + ".bias", {l.out}});
    }
    if (m.qk_norm) {  // Qwen3: one RMSNorm weight over head_dim for the queries, one for the keys
      e.push_back({src + "self_attn.q_norm.weight", dst + "attention.q_norm.weight", {d}});
      e.push_back({src + "self_attn.k_norm.weight", dst + "attention.k_norm.weight", {d}});
    }
    e.push_back({src + "post_attention_layernorm.weight", dst + "post_attention_norm.weight", {h}});
    if (moe) {
      const int64_t fe = m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : f;
      const bool mixtral = a == Architecture::Mixtral;
      const std::string block = src + (mixtral ? "block_sparse_moe." : "mlp.");
      e.push_back({block + "gate.weight", dst + "mlp.router.weight", {m.num_experts, h}});
      for (int x = 0; x < m.num_experts; ++x) {
        const std::string hx = fmt::format("{}experts.{}.", block, x),
                          ox = fmt::format("{}mlp.experts.{}.", dst, x);
        e.push_back({hx + (mixtral ? "w1" : "gate_proj") + ".weight", ox + "gate.weight", {fe, h}});
        e.push_back({hx + (mixtral ? "w3" : "up_proj") + ".weight", ox + "up.weight", {fe, h}});
        e.push_back({hx + (mixtral ? "w2" : "down_proj") + ".weight", ox + "fc2.weight", {h, fe}});
      }
    }
  }
  e.push_back({"model.norm.weight", "final_norm.weight", {h}});
  if (!m.tie_embeddings) e.push_back({"lm_head.weight", "output.weight", {m.vocab_size, h}});
  return e;
}

// DeepseekV3ForCausalLM's tensors in config order (the mapping table of the header): latent
// attention, dense layers below first_k_dense_replace, then MoE layers with their router, expert
// bias, routed experts (one tensor per expert, as transformers 4.x and 5.x save them) and shared
// experts (one MLP). With model.mtp_num_layers = D, DeepSeek's multi-token prediction layers follow
// as its checkpoints hold them, model.layers.{L + k - 1}.* for depth k (L = num_hidden_layers):
// enorm, hnorm, eh_proj, a decoder layer of the last layer's make-up and shared_head.norm (our
// final_norm). Their embed_tokens and shared_head.head copies are not entries (mtp_copies).
std::vector<Entry> deepseek_v3_entries(const ModelConfig& m) {
  const int64_t h = m.hidden_size, H = m.num_attention_heads, n = m.qk_nope_head_dim, r = m.qk_rope_head_dim,
                dv = m.v_head_dim, rq = m.q_lora_rank, c = m.kv_lora_rank, f = m.ffn_hidden_size;
  const int64_t interleaved = m.hf_rope_interleave ? r : 0;
  std::vector<Entry> e;
  // Layer `i`'s tensors, of the make-up of layer `like` (an MTP layer's is the last layer's).
  const auto layer = [&](int i, int like) {
    const std::string src = fmt::format("model.layers.{}.", i), dst = fmt::format("layers.{}.", i);
    e.push_back({src + "input_layernorm.weight", dst + "input_norm.weight", {h}});
    if (rq > 0) {
      e.push_back({src + "self_attn.q_a_proj.weight", dst + "attention.q_down.weight", {rq, h}});
      e.push_back({src + "self_attn.q_a_layernorm.weight", dst + "attention.q_latent_norm.weight", {rq}});
      e.push_back({src + "self_attn.q_b_proj.weight",
                   dst + "attention.q_up.weight",
                   {H * (n + r), rq},
                   n + r,
                   n,
                   interleaved});
    } else {
      e.push_back({src + "self_attn.q_proj.weight",
                   dst + "attention.query.weight",
                   {H * (n + r), h},
                   n + r,
                   n,
                   interleaved});
    }
    e.push_back({src + "self_attn.kv_a_proj_with_mqa.weight",
                 dst + "attention.kv_down.weight",
                 {c + r, h},
                 c + r,
                 c,
                 interleaved});
    e.push_back({src + "self_attn.kv_a_layernorm.weight", dst + "attention.kv_norm.weight", {c}});
    e.push_back({src + "self_attn.kv_b_proj.weight", dst + "attention.kv_up.weight", {H * (n + dv), c}});
    e.push_back({src + "self_attn.o_proj.weight", dst + "attention.proj.weight", {h, H * dv}});
    e.push_back({src + "post_attention_layernorm.weight", dst + "post_attention_norm.weight", {h}});
    if (!m.is_moe_layer(like)) {
      e.push_back({src + "mlp.gate_proj.weight", dst + "mlp.gate.weight", {f, h}});
      e.push_back({src + "mlp.up_proj.weight", dst + "mlp.up.weight", {f, h}});
      e.push_back({src + "mlp.down_proj.weight", dst + "mlp.fc2.weight", {h, f}});
      return;
    }
    const int64_t fe = m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : f,
                  fs = m.moe_shared_expert_ffn_hidden_size;
    e.push_back({src + "mlp.gate.weight", dst + "mlp.router.weight", {m.num_experts, h}});
    e.push_back({src + "mlp.gate.e_score_correction_bias",
                 dst + "mlp.router.e_score_correction_bias",
                 {m.num_experts}});
    for (int x = 0; x < m.num_experts; ++x) {
      const std::string hx = fmt::format("{}mlp.experts.{}.", src, x),
                        ox = fmt::format("{}mlp.experts.{}.", dst, x);
      e.push_back({hx + "gate_proj.weight", ox + "gate.weight", {fe, h}});
      e.push_back({hx + "up_proj.weight", ox + "up.weight", {fe, h}});
      e.push_back({hx + "down_proj.weight", ox + "fc2.weight", {h, fe}});
    }
    e.push_back(
        {src + "mlp.shared_experts.gate_proj.weight", dst + "mlp.shared_expert.gate.weight", {fs, h}});
    e.push_back({src + "mlp.shared_experts.up_proj.weight", dst + "mlp.shared_expert.up.weight", {fs, h}});
    e.push_back({src + "mlp.shared_experts.down_proj.weight", dst + "mlp.shared_expert.fc2.weight", {h, fs}});
  };
  e.push_back({"model.embed_tokens.weight", "embedding.word.weight", {m.vocab_size, h}});
  for (int i = 0; i < m.num_layers; ++i) layer(i, i);
  e.push_back({"model.norm.weight", "final_norm.weight", {h}});
  if (!m.tie_embeddings) e.push_back({"lm_head.weight", "output.weight", {m.vocab_size, h}});
  for (int k = 1; k <= m.mtp_num_layers; ++k) {
    const int i = m.num_layers + k - 1;
    const std::string src = fmt::format("model.layers.{}.", i), dst = fmt::format("layers.{}.", i);
    e.push_back({src + "enorm.weight", dst + "enorm.weight", {h}});
    e.push_back({src + "hnorm.weight", dst + "hnorm.weight", {h}});
    e.push_back({src + "eh_proj.weight", dst + "eh_proj.weight", {h, 2 * h}});
    layer(i, m.num_layers - 1);
    e.push_back({src + "shared_head.norm.weight", dst + "final_norm.weight", {h}});
  }
  return e;
}

// DeepSeek's MTP layers carry copies of the shared embedding and output head (its checkpoints hold
// them per layer; the model shares them): {checkpoint name, the tensor it copies}.
std::vector<std::pair<std::string, std::string>> mtp_copies(const ModelConfig& m) {
  std::vector<std::pair<std::string, std::string>> out;
  for (int k = 1; k <= m.mtp_num_layers; ++k) {
    const std::string src = fmt::format("model.layers.{}.", m.num_layers + k - 1);
    out.emplace_back(src + "embed_tokens.weight", "model.embed_tokens.weight");
    out.emplace_back(src + "shared_head.head.weight",
                     m.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  }
  return out;
}

std::vector<Entry> entries_for(const ModelConfig& m, Architecture a) {
  return a == Architecture::DeepseekV3 ? deepseek_v3_entries(m) : llama_entries(m, a);
}

void check_llama_shape(const ModelConfig& m) {
  if (m.normalization != Normalization::RMSNorm || m.activation != Activation::SwiGLU ||
      m.position_embedding != PositionEmbedding::Rope)
    fail(
        "the model is not a Llama-family architecture: model.normalization must be rmsnorm, model.activation "
        "swiglu and model.position_embedding rope");
  if (m.ffn_hidden_size <= 0) fail("model.ffn_hidden_size must be set explicitly for a Llama-family model");
}

// Buffers some exports carry that are not parameters (transformers < 4.31 saved the rotary
// frequencies of every layer; they follow from rope_theta).
bool is_llama_buffer(const std::string& name) { return name.ends_with(".self_attn.rotary_emb.inv_freq"); }

std::map<std::string, Tensor> llama_from_hf(const std::map<std::string, Tensor>& hf, Architecture a,
                                            const ModelConfig& m, const std::string& source,
                                            bool allow_nonfinite) {
  check_llama_shape(m);
  const std::vector<Entry> entries = entries_for(m, a);
  std::set<std::string> known;
  for (const Entry& e : entries) known.insert(e.hf);
  const std::map<std::string, std::string> copies = [&] {
    std::map<std::string, std::string> c;
    if (a == Architecture::DeepseekV3)
      for (const auto& [copy, of] : mtp_copies(m)) c[copy] = of;
    return c;
  }();
  for (const auto& [copy, of] : copies) {
    // The MTP layer's embedding and output head are the model's own: a copy that differs would be
    // a model other than the one we train.
    const auto it = hf.find(copy), base = hf.find(of);
    if (it == hf.end()) fail(fmt::format("{}: missing tensor '{}'", source, copy));
    check_dtype(it->second, source, copy);
    if (base != hf.end() && !same_values(it->second, base->second))
      fail(
          fmt::format("{}: '{}' differs from '{}'; the multi-token prediction layer must share the "
                      "model's embedding and output head (a copy, as DeepSeek's checkpoints hold it)",
                      source, copy, of));
  }
  for (const auto& [name, t] : hf) {
    if (known.count(name) || copies.count(name) || is_llama_buffer(name)) continue;
    if (name == "lm_head.weight" && m.tie_embeddings) {
      // Tied: an lm_head that differs from the embedding would be silently lost.
      check_dtype(t, source, name);
      const auto embed = hf.find("model.embed_tokens.weight");
      if (embed != hf.end()) check_dtype(embed->second, source, embed->first);
      if (embed == hf.end() || !same_values(t, embed->second))
        fail(
            fmt::format("{}: 'lm_head.weight' differs from 'model.embed_tokens.weight', but config.json has "
                        "tie_word_embeddings = true",
                        source));
      continue;
    }
    fail(
        fmt::format("{}: unexpected tensor '{}' {} (not part of this model: num_hidden_layers = {}, "
                    "tie_word_embeddings = {}, biases {}{})",
                    source, name, shape_str(t.shape()), m.num_layers, m.tie_embeddings,
                    m.add_bias       ? "everywhere"
                    : m.add_qkv_bias ? "on q/k/v only"
                                     : "none",
                    m.qk_norm ? ", q_norm and k_norm" : ""));
  }
  std::map<std::string, Tensor> out;
  for (const Entry& e : entries) {
    const auto it = hf.find(e.hf);
    if (it == hf.end()) fail(fmt::format("{}: missing tensor '{}'", source, e.hf));
    check_dtype(it->second, source, e.hf);
    if (it->second.shape() != e.shape)
      fail(
          fmt::format("{}: '{}' has shape {}, but the config (hidden_size {}, num_attention_heads {}, "
                      "num_key_value_heads {}, head_dim {}, intermediate_size {}, vocab_size {}) needs {}",
                      source, e.hf, shape_str(it->second.shape()), m.hidden_size, m.num_attention_heads,
                      m.num_query_groups > 0 ? m.num_query_groups : m.num_attention_heads,
                      m.attention_head_dim(), m.ffn_hidden_size, m.vocab_size, shape_str(e.shape)));
    if (!allow_nonfinite) check_finite(it->second, source, e.hf);
    out[e.ours] = e.rope > 0 ? permute_rope_rows(it->second, e, true) : f32_copy(it->second);
  }
  return out;
}

std::map<std::string, Tensor> llama_to_hf(const std::map<std::string, Tensor>& params, Architecture a,
                                          const ModelConfig& m, DType dtype) {
  check_llama_shape(m);
  std::map<std::string, Tensor> out;
  for (const Entry& e : entries_for(m, a)) {
    const auto it = params.find(e.ours);
    if (it == params.end()) fail(fmt::format("missing parameter '{}'", e.ours));
    Tensor t = it->second;
    // The vocabulary may arrive padded (a checkpoint that stored the padded rows).
    if (t.dim() == 2 && e.shape.size() == 2 && t.size(0) > e.shape[0] && t.size(1) == e.shape[1] &&
        (e.ours == "embedding.word.weight" || e.ours == "output.weight"))
      t = t.narrow(0, 0, e.shape[0]);
    if (t.shape() != e.shape)
      fail(fmt::format("parameter '{}' has shape {}, but the config needs {}", e.ours, shape_str(t.shape()),
                       shape_str(e.shape)));
    if (e.rope > 0) t = permute_rope_rows(t, e, false);
    out[e.hf] = t.to(DType::F32).to(dtype).contiguous().clone();
  }
  if (a == Architecture::DeepseekV3)
    for (const auto& [copy, of] : mtp_copies(m)) out[copy] = out.at(of).clone();
  return out;
}

std::string torch_dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "float32";
    case DType::BF16:
      return "bfloat16";
    case DType::F16:
      return "float16";
    default:
      fail(fmt::format("cannot export as {}: expected f32, bf16 or f16", dtype_name(t)));
  }
}

}  // namespace

// ---- shared checks -----------------------------------------------------------------------------

void check_finite(const Tensor& t, const std::string& source, const std::string& name) {
  const std::vector<float> values = t.to_float_vector();
  int64_t bad = 0, first = -1;
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i])) {
      if (bad++ == 0) first = static_cast<int64_t>(i);
    }
  if (bad > 0)
    fail(
        fmt::format("{}: tensor '{}' holds {} non-finite value(s) (the first, {}, at flat index {}); pass "
                    "--allow-nonfinite to import it anyway",
                    source, name, bad, values[static_cast<std::size_t>(first)], first));
}

const char* architecture_name(Architecture a) {
  switch (a) {
    case Architecture::GPT2:
      return "GPT2LMHeadModel";
    case Architecture::Llama:
      return "LlamaForCausalLM";
    case Architecture::Mistral:
      return "MistralForCausalLM";
    case Architecture::Qwen2:
      return "Qwen2ForCausalLM";
    case Architecture::Qwen3:
      return "Qwen3ForCausalLM";
    case Architecture::Qwen3Moe:
      return "Qwen3MoeForCausalLM";
    case Architecture::Mixtral:
      return "MixtralForCausalLM";
    case Architecture::DeepseekV3:
      return "DeepseekV3ForCausalLM";
  }
  return "?";
}

HfModel model_from_config_json(const std::string& json_text, const std::string& source) {
  const json j = parse_json(json_text, source);
  if (!j.is_object()) fail(fmt::format("{}: expected a JSON object", source));
  HfModel out;
  out.architecture = architecture_from_json(j, source);
  check_keys(j, out.architecture, source);
  const Fields f(j, source);
  out.model = out.architecture == Architecture::GPT2         ? gpt2_model(f)
              : out.architecture == Architecture::DeepseekV3 ? deepseek_v3_model(f, out.mtp_layers)
                                                             : llama_model(f, out.architecture);
  check_reader_against_table(j, out.architecture, f);
  // The rules of our config (divisibility, ...), named by our keys.
  Config c;
  c.model = out.model;
  try {
    validate_config(c, 1);
  } catch (const ConfigError& e) {
    fail(fmt::format("{}: {}", source, e.what()));
  }
  out.model = c.model;
  return out;
}

Architecture architecture_for(const ModelConfig& m) {
  const bool gpt2 = m.normalization == Normalization::LayerNorm && m.activation == Activation::GeLU &&
                    m.position_embedding == PositionEmbedding::Learned;
  if (gpt2)
    hf_gpt2::check_config(m);
  else
    check_llama_shape(m);
  if (!m.hf_architecture.empty()) {
    for (const Architecture a :
         {Architecture::GPT2, Architecture::Llama, Architecture::Mistral, Architecture::Qwen2,
          Architecture::Qwen3, Architecture::Qwen3Moe, Architecture::Mixtral, Architecture::DeepseekV3})
      if (m.hf_architecture == architecture_name(a)) {
        if ((a == Architecture::GPT2) != gpt2)
          fail(fmt::format("model.hf_architecture = {} cannot hold this model (a {}-shaped one)",
                           m.hf_architecture, gpt2 ? "GPT-2" : "Llama"));
        return a;
      }
    fail(fmt::format(
        "model.hf_architecture = {}: not supported (GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, "
        "Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM, DeepseekV3ForCausalLM)",
        m.hf_architecture));
  }
  if (gpt2) return Architecture::GPT2;
  if (m.is_mla()) return Architecture::DeepseekV3;
  if (m.num_experts > 0) return m.qk_norm ? Architecture::Qwen3Moe : Architecture::Mixtral;
  if (m.qk_norm) return Architecture::Qwen3;
  if (m.add_qkv_bias && !m.add_bias) return Architecture::Qwen2;
  return m.sliding_window > 0 ? Architecture::Mistral : Architecture::Llama;
}

static json rope_scaling_json(const RopeScaling& s) {
  switch (s.type) {
    case RopeScalingType::None:
      return nullptr;
    case RopeScalingType::Linear:
      return {{"rope_type", "linear"}, {"factor", s.factor}};
    case RopeScalingType::Llama3:
      return {{"rope_type", "llama3"},
              {"factor", s.factor},
              {"low_freq_factor", s.low_freq_factor},
              {"high_freq_factor", s.high_freq_factor},
              {"original_max_position_embeddings", static_cast<int64_t>(s.original_max_position_embeddings)}};
    case RopeScalingType::Yarn: {
      // As transformers 5 writes a yarn rope_parameters: the keys that are set (mscale,
      // mscale_all_dim and attention_factor when given, truncate when false), no nulls.
      json j = {
          {"rope_type", "yarn"},
          {"factor", s.factor},
          {"original_max_position_embeddings", static_cast<int64_t>(s.original_max_position_embeddings)},
          {"beta_fast", s.beta_fast},
          {"beta_slow", s.beta_slow}};
      if (s.mscale != 0) j["mscale"] = s.mscale;
      if (s.mscale_all_dim != 0) j["mscale_all_dim"] = s.mscale_all_dim;
      if (s.attention_factor != 0) j["attention_factor"] = s.attention_factor;
      if (!s.truncate) j["truncate"] = false;
      return j;
    }
  }
  return nullptr;
}

// transformers 5.x's rope_parameters: rope_theta with the scaling's keys (rope_type "default" unscaled).
static json rope_parameters_json(const ModelConfig& m) {
  json p = rope_scaling_json(m.rope_scaling);
  if (p.is_null()) p = {{"rope_type", "default"}};
  p["rope_theta"] = m.rope_theta;
  return p;
}

// The router options Qwen3-MoE and Mixtral can hold (docs/model.md, "Routing"): softmax scores, the
// top k of all experts, unscaled weights renormalised or not (Mixtral: always), no expert bias, no
// sequence-wise balance loss, a MoE layer from the first layer on, the top-k chosen by score (not
// forced to balance). Anything else is refused in one line naming the key.
static void check_router(const ModelConfig& m, Architecture a) {
  const std::string_view name = architecture_name(a);
  const auto refuse = [&](std::string_view key, const std::string& value, std::string_view rule) {
    fail(fmt::format("{} cannot hold this model: model.{} = {} ({})", name, key, value, rule));
  };
  if (m.moe_router_score_function != MoeScoreFunction::Softmax)
    refuse("moe_router_score_function", "sigmoid", "it scores the experts by a softmax");
  if (m.moe_n_group != 1) refuse("moe_n_group", std::to_string(m.moe_n_group), "it has no expert groups");
  if (m.moe_topk_group != 1)
    refuse("moe_topk_group", std::to_string(m.moe_topk_group), "it has no expert groups");
  if (m.moe_router_expert_bias) refuse("moe_router_expert_bias", "true", "its router has no expert bias");
  if (m.moe_router_force_load_balancing)
    refuse("moe_router_force_load_balancing", "true", "its router chooses the top-k scores");
  if (m.moe_routed_scaling_factor != 1.0)
    refuse("moe_routed_scaling_factor", fmt::format("{}", m.moe_routed_scaling_factor),
           "it does not scale the routed experts' weights");
  if (m.moe_seq_aux_loss_coeff != 0.0)
    refuse("moe_seq_aux_loss_coeff", fmt::format("{}", m.moe_seq_aux_loss_coeff),
           "it has no sequence-wise balance loss");
  if (m.moe_first_k_dense_replace != 0)
    refuse("moe_first_k_dense_replace", std::to_string(m.moe_first_k_dense_replace),
           "every layer is a MoE layer");
  if (a == Architecture::Mixtral && !m.moe_norm_topk_prob)
    refuse("moe_norm_topk_prob", "false", "it always renormalises the top-k weights to sum 1");
  if (a == Architecture::Mixtral && m.moe_ffn_hidden_size > 0 && m.moe_ffn_hidden_size != m.ffn_hidden_size)
    refuse(
        "moe_ffn_hidden_size", std::to_string(m.moe_ffn_hidden_size),
        fmt::format("its experts are intermediate_size wide: model.ffn_hidden_size = {}", m.ffn_hidden_size));
}

// What DeepseekV3ForCausalLM can hold (docs/model.md, "Routing"): latent attention and DeepSeek-V3's
// experts, scored by a sigmoid and chosen with the expert bias (its router always holds one), every
// layer from model.moe_first_k_dense_replace on a MoE layer, dropless, with n_shared_experts >= 1
// shared experts of the routed experts' width (one MLP n times as wide). Groups, top-k
// renormalisation and scaling are its own keys; the balance losses and the bias's update speed are
// training settings. Anything else is refused in one line naming the key.
static void check_deepseek_v3(const ModelConfig& m) {
  const auto refuse = [&](std::string_view key, const std::string& value, std::string_view rule) {
    fail(fmt::format("DeepseekV3ForCausalLM cannot hold this model: model.{} = {} ({})", key, value, rule));
  };
  if (!m.is_mla()) refuse("attention", "mha", "it has multi-head latent attention");
  if (m.num_experts == 0) refuse("num_experts", "0", "it is a mixture of experts");
  if (m.moe_router_score_function != MoeScoreFunction::Sigmoid)
    refuse("moe_router_score_function", "softmax", "it scores the experts by a sigmoid");
  if (!m.moe_router_expert_bias)
    refuse("moe_router_expert_bias", "false", "its router always chooses with an expert bias");
  if (m.moe_router_force_load_balancing)
    refuse("moe_router_force_load_balancing", "true", "its router chooses the top-k scores");
  if (m.moe_layer_freq != 1)
    refuse("moe_layer_freq", std::to_string(m.moe_layer_freq),
           "every layer from first_k_dense_replace on is a MoE layer");
  if (m.moe_capacity_factor > 0)
    refuse("moe_capacity_factor", fmt::format("{}", m.moe_capacity_factor), "it is dropless");
  const int expert = m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : m.ffn_hidden_size;
  if (m.moe_shared_expert_ffn_hidden_size <= 0 || m.moe_shared_expert_ffn_hidden_size % expert != 0)
    refuse("moe_shared_expert_ffn_hidden_size", std::to_string(m.moe_shared_expert_ffn_hidden_size),
           fmt::format("its shared experts are n_shared_experts >= 1 times moe_intermediate_size ({}) wide",
                       expert));
}

std::string config_json_for(const ModelConfig& m, Architecture a, const std::string& torch_dtype,
                            const std::string& template_json) {
  json j = template_json.empty() ? json::object() : parse_json(template_json, "the template config.json");
  if (!j.is_object()) fail("the template config.json is not a JSON object");
  const int64_t positions = m.max_position_embeddings > 0 ? m.max_position_embeddings : m.seq_length;
  const bool qwen = a == Architecture::Qwen2 || a == Architecture::Qwen3;
  const bool moe = a == Architecture::Qwen3Moe || a == Architecture::Mixtral;
  const bool deepseek = a == Architecture::DeepseekV3;
  if (deepseek) check_deepseek_v3(m);
  if (m.mtp_num_layers > 0 && !deepseek)
    fail(
        fmt::format("{} cannot hold this model: model.mtp_num_layers = {} (multi-token prediction layers: "
                    "DeepseekV3ForCausalLM can)",
                    architecture_name(a), m.mtp_num_layers));
  if (m.is_mla() && !deepseek)
    fail(fmt::format("{} cannot hold this model: model.attention = mla (DeepseekV3ForCausalLM can)",
                     architecture_name(a)));
  if (m.sliding_window > 0 && a != Architecture::Mistral && a != Architecture::Mixtral && !qwen)
    fail(
        fmt::format("{} cannot hold this model: it has model.sliding_window = {} (MistralForCausalLM, "
                    "MixtralForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM can)",
                    architecture_name(a), m.sliding_window));
  if (m.qk_norm != (a == Architecture::Qwen3 || a == Architecture::Qwen3Moe))
    fail(
        fmt::format("{} cannot hold this model: model.qk_norm = {} (Qwen3ForCausalLM and Qwen3MoeForCausalLM "
                    "have qk-norm, the others none)",
                    architecture_name(a), m.qk_norm));
  if (!deepseek && (m.num_experts > 0) != moe)
    fail(fmt::format("{} cannot hold this model: model.num_experts = {} ({})", architecture_name(a),
                     m.num_experts, moe ? "it is a mixture of experts" : "it has no experts"));
  if (moe) {
    check_router(m, a);
    if (m.moe_layer_freq != 1 || m.moe_shared_expert_ffn_hidden_size > 0 || m.moe_capacity_factor > 0)
      fail(fmt::format(
          "{} cannot hold this model: it has a MoE layer everywhere, no shared expert and no capacity "
          "(model.moe_layer_freq = {}, model.moe_shared_expert_ffn_hidden_size = {}, "
          "model.moe_capacity_factor = {})",
          architecture_name(a), m.moe_layer_freq, m.moe_shared_expert_ffn_hidden_size,
          m.moe_capacity_factor));
  }
  if (a == Architecture::Mistral && (m.sliding_window_pattern > 0 || m.max_window_layers > 0))
    fail(
        fmt::format("MistralForCausalLM cannot hold this model: it windows every layer, the model has "
                    "model.sliding_window_pattern = {} and model.max_window_layers = {}",
                    m.sliding_window_pattern, m.max_window_layers));
  if (qwen && m.sliding_window_pattern > 0)
    fail(
        fmt::format("{} cannot hold this model: model.sliding_window_pattern = {} (it has only "
                    "max_window_layers)",
                    architecture_name(a), m.sliding_window_pattern));
  j["architectures"] = json::array({architecture_name(a)});
  // The storage dtype under both names: dtype (transformers 5.x) and torch_dtype (4.x, read by 5.x too).
  j["dtype"] = torch_dtype;
  j["torch_dtype"] = torch_dtype;
  j["vocab_size"] = m.vocab_size;
  j["initializer_range"] = m.init_std;
  if (a == Architecture::GPT2) {
    hf_gpt2::check_config(m);
    j["model_type"] = "gpt2";
    j["n_layer"] = m.num_layers;
    j["n_embd"] = m.hidden_size;
    j["n_head"] = m.num_attention_heads;
    j["n_inner"] = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * m.hidden_size;
    j["n_positions"] = positions;
    j["n_ctx"] = positions;
    j["layer_norm_epsilon"] = m.norm_epsilon;
    j["activation_function"] = "gelu_new";
    j["tie_word_embeddings"] = true;
    for (const char* key : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) j[key] = m.dropout;
  } else {
    check_llama_shape(m);
    if (a == Architecture::Qwen2          ? (m.add_bias || !m.add_qkv_bias)
        : a == Architecture::Qwen3 || moe ? false
                                          : (m.add_qkv_bias && !m.add_bias))
      fail(fmt::format(
          "{} cannot hold this model: it has {} (model.add_bias = {}, model.add_qkv_bias = {})",
          architecture_name(a),
          a == Architecture::Qwen2 ? "biases on q/k/v only" : "q/k/v biases only with the other biases",
          m.add_bias, m.add_qkv_bias));
    if ((a == Architecture::Mistral || a == Architecture::Qwen3 || moe || deepseek) &&
        (m.add_bias || m.add_qkv_bias))
      fail(fmt::format(
          "{} cannot hold this model: it has no biases (model.add_bias = {}, model.add_qkv_bias = {})",
          architecture_name(a), m.add_bias, m.add_qkv_bias));
    j["model_type"] = a == Architecture::Llama      ? "llama"
                      : a == Architecture::Mistral  ? "mistral"
                      : a == Architecture::Qwen2    ? "qwen2"
                      : a == Architecture::Qwen3    ? "qwen3"
                      : a == Architecture::Qwen3Moe ? "qwen3_moe"
                      : deepseek                    ? "deepseek_v3"
                                                    : "mixtral";
    j["num_hidden_layers"] = m.num_layers;
    j["hidden_size"] = m.hidden_size;
    j["num_attention_heads"] = m.num_attention_heads;
    j["num_key_value_heads"] = m.num_query_groups > 0 ? m.num_query_groups : m.num_attention_heads;
    j["intermediate_size"] = m.ffn_hidden_size;
    j["max_position_embeddings"] = positions;
    j["rms_norm_eps"] = m.norm_epsilon;
    // transformers 5.x's rope_parameters, and the same rotary embedding in 4.x's keys (rope_theta,
    // rope_scaling), which 4.x reads and 5.x accepts: without them 4.x would fall back to theta 10000.
    j["rope_parameters"] = rope_parameters_json(m);
    j["rope_theta"] = m.rope_theta;
    j["rope_scaling"] = rope_scaling_json(m.rope_scaling);
    j["hidden_act"] = "silu";
    j["tie_word_embeddings"] = m.tie_embeddings;
    // Attention-probability dropout only; model.dropout (hidden states too) is a training setting here.
    j["attention_dropout"] = 0.0;
    if (a != Architecture::Qwen2 || j.contains("head_dim") || m.head_dim > 0)
      j["head_dim"] = m.attention_head_dim();
    if (a == Architecture::Llama) {
      j["attention_bias"] = m.add_bias;
      j["mlp_bias"] = m.add_bias;
    }
    if (a == Architecture::Qwen3 || a == Architecture::Qwen3Moe) j["attention_bias"] = false;
    if (a == Architecture::Qwen3Moe) {
      // The expert count under both names: num_local_experts (transformers 5.x), num_experts (4.x).
      j["num_local_experts"] = m.num_experts;
      j["num_experts"] = m.num_experts;
      j["num_experts_per_tok"] = m.moe_router_topk;
      j["moe_intermediate_size"] = m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : m.ffn_hidden_size;
      j["decoder_sparse_step"] = 1;
      j["mlp_only_layers"] = json::array();
      j["norm_topk_prob"] = m.moe_norm_topk_prob;
      j["output_router_logits"] = false;
      j["use_sliding_window"] = false;
      j["sliding_window"] = nullptr;
    }
    if (a == Architecture::Mixtral) {
      // MixtralConfig of transformers 5.x: intermediate_size is each expert's width (checked above),
      // the top-k weights are always renormalised, no jitter noise (training-time noise on the inputs).
      j["num_local_experts"] = m.num_experts;
      j["num_experts_per_tok"] = m.moe_router_topk;
      j["output_router_logits"] = false;
      j["router_jitter_noise"] = 0.0;
    }
    if (deepseek) {
      // DeepseekV3Config of transformers 5.x: head_dim is qk_rope_head_dim (the rotary embedding's
      // width), qk_head_dim the query/key head; q_lora_rank null for a plain q_proj. The multi-token
      // prediction layers (model.mtp_num_layers) as num_nextn_predict_layers: the folder holds them
      // as DeepSeek's checkpoints do (transformers' model has none and does not load them).
      j["head_dim"] = m.qk_rope_head_dim;
      j["attention_bias"] = false;
      j["q_lora_rank"] = m.q_lora_rank > 0 ? json(m.q_lora_rank) : json(nullptr);
      j["kv_lora_rank"] = m.kv_lora_rank;
      j["qk_nope_head_dim"] = m.qk_nope_head_dim;
      j["qk_rope_head_dim"] = m.qk_rope_head_dim;
      j["qk_head_dim"] = m.qk_nope_head_dim + m.qk_rope_head_dim;
      j["v_head_dim"] = m.v_head_dim;
      j["rope_interleave"] = m.hf_rope_interleave;
      const int expert = m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : m.ffn_hidden_size;
      j["n_routed_experts"] = m.num_experts;
      j["n_shared_experts"] = m.moe_shared_expert_ffn_hidden_size / expert;
      j["moe_intermediate_size"] = expert;
      j["num_experts_per_tok"] = m.moe_router_topk;
      j["n_group"] = m.moe_n_group;
      j["topk_group"] = m.moe_topk_group;
      j["routed_scaling_factor"] = m.moe_routed_scaling_factor;
      j["norm_topk_prob"] = m.moe_norm_topk_prob;
      j["first_k_dense_replace"] = m.moe_first_k_dense_replace;
      j["output_router_logits"] = false;
      j["num_nextn_predict_layers"] = m.mtp_num_layers;
      j.erase("num_mtp_layers");
    }
    if (a == Architecture::Mistral || a == Architecture::Mixtral)
      j["sliding_window"] = m.sliding_window > 0 ? json(m.sliding_window) : json(nullptr);
    if (qwen) {
      j["use_sliding_window"] = m.sliding_window > 0;
      if (m.sliding_window > 0) {
        j["sliding_window"] = m.sliding_window;
        j["max_window_layers"] = m.max_window_layers;
      }
      std::vector<std::string> types;
      for (int i = 0; i < m.num_layers; ++i)
        types.push_back(m.layer_window(i) > 0 ? "sliding_attention" : "full_attention");
      j["layer_types"] = json(types);
    }
  }
  return j.dump(2) + "\n";
}

std::map<std::string, Tensor> load_folder(const std::string& dir) {
  const fs::path root(dir);
  if (!fs::is_directory(root))
    fail(fmt::format("{}: not a directory (expected a Hugging Face model folder)", dir));
  const fs::path single = root / kSingleName, index = root / kIndexName;
  // As transformers: a single file wins over an index.
  if (fs::exists(single)) return safetensors::load(single.string());
  if (!fs::exists(index)) {
    if (fs::exists(root / "pytorch_model.bin") || fs::exists(root / "pytorch_model.bin.index.json"))
      fail(
          fmt::format("{}: only pytorch_model.bin weights (pickle); convert them to safetensors first", dir));
    fail(fmt::format("{}: neither {} nor {}", dir, kSingleName, kIndexName));
  }
  const std::string index_path = index.string();
  const json j = parse_json(read_text(index_path), index_path);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    fail(fmt::format("{}: missing key 'weight_map' (an object: tensor name -> file)", index_path));
  std::map<std::string, std::set<std::string>> by_file;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string())
      fail(fmt::format("{}: weight_map.{} = {}: expected a file name", index_path, name, file.dump()));
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      fail(
          fmt::format("{}: weight_map.{} = \"{}\": expected a file name in the folder", index_path, name, f));
    by_file[f].insert(name);
  }
  std::map<std::string, Tensor> out;
  for (const auto& [file, names] : by_file) {
    const std::string path = (root / file).string();
    if (!fs::exists(path))
      fail(fmt::format("{}: the shard {} is missing (named by {})", dir, file, kIndexName));
    std::map<std::string, Tensor> tensors = safetensors::load(path);
    for (auto& [name, t] : tensors) {
      if (!names.count(name))
        fail(fmt::format("{}: tensor '{}' is not listed for this file in {}", path, name, kIndexName));
      if (out.count(name)) fail(fmt::format("{}: tensor '{}' appears in two shards", dir, name));
      out.emplace(name, std::move(t));
    }
    for (const std::string& name : names)
      if (!out.count(name))
        fail(fmt::format("{}: {} lists tensor '{}' in {}, which does not hold it", dir, kIndexName, name,
                         file));
  }
  return out;
}

void save_folder(const std::string& dir, const std::map<std::string, Tensor>& tensors,
                 const std::string& config_json, int64_t max_shard_bytes) {
  if (max_shard_bytes <= 0) fail(fmt::format("the shard size must be > 0, not {}", max_shard_bytes));
  const fs::path root(dir);
  if (fs::exists(root)) {
    if (!fs::is_directory(root)) fail(fmt::format("{} exists and is not a directory", dir));
    for (const auto& entry : fs::directory_iterator(root)) {
      const std::string name = entry.path().filename().string();
      if (name == kConfigName || name.ends_with(".safetensors") || name == kIndexName)
        fail(fmt::format("{} already holds {}; export into an empty or new directory", dir, name));
    }
  }
  fs::create_directories(root);

  std::vector<std::vector<std::string>> shards(1);
  int64_t total = 0, in_shard = 0;
  for (const auto& [name, t] : tensors) {
    const auto bytes = static_cast<int64_t>(t.nbytes());
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(name);
    in_shard += bytes;
    total += bytes;
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (shards.size() == 1) {
    safetensors::save((root / kSingleName).string(), tensors, metadata);
  } else {
    json weight_map = json::object();
    for (std::size_t k = 0; k < shards.size(); ++k) {
      const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, shards.size());
      std::map<std::string, Tensor> part;
      for (const std::string& name : shards[k]) {
        part.emplace(name, tensors.at(name));
        weight_map[name] = file;
      }
      safetensors::save((root / file).string(), part, metadata);
    }
    // The index last: a folder with an index has all its shards.
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_text((root / kIndexName).string(), index.dump(2) + "\n");
  }
  write_text((root / kConfigName).string(), config_json);
}

int64_t parse_size(const std::string& text) {
  static const std::regex pattern(R"(^\s*([0-9]+)\s*([KMGT]i?B|B)?\s*$)", std::regex::icase);
  std::smatch match;
  if (!std::regex_match(text, match, pattern))
    fail(fmt::format("size \"{}\": expected bytes, or a number with KB/MB/GB (powers of 1000) or KiB/MiB/GiB",
                     text));
  int64_t value = 0;
  try {
    value = std::stoll(match[1].str());
  } catch (const std::exception&) {
    fail(fmt::format("size \"{}\": too large", text));
  }
  std::string unit = match[2].str();
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::toupper(c); });
  int64_t scale = 1;
  if (unit.size() >= 2) {
    const int power = static_cast<int>(std::string("KMGT").find(unit[0])) + 1;
    const int64_t base = unit.size() == 3 ? 1024 : 1000;
    for (int i = 0; i < power; ++i) scale *= base;
  }
  if (value <= 0 || value > std::numeric_limits<int64_t>::max() / scale)
    fail(fmt::format("size \"{}\": must be > 0 and fit 64 bits", text));
  return value * scale;
}

std::map<std::string, Shape> llama_parameter_shapes(const ModelConfig& m) {
  check_llama_shape(m);
  std::map<std::string, Shape> out;
  // Our names do not depend on the architecture, only on the attention (latent: DeepSeek-V3's).
  for (const Entry& e : entries_for(m, m.is_mla() ? Architecture::DeepseekV3 : Architecture::Llama))
    out[e.ours] = e.shape;
  return out;
}

std::vector<LoraModule> lora_modules(const ModelConfig& m) {
  check_llama_shape(m);
  const int64_t h = m.hidden_size, hq = m.num_attention_heads;
  const int64_t hkv = m.num_query_groups > 0 ? m.num_query_groups : hq, d = h / hq, f = m.ffn_hidden_size;
  const struct {
    const char *module, *hf, *ours;
    int64_t out, in;
  } linears[] = {{"q", "self_attn.q_proj", "attention.query", hq * d, h},
                 {"k", "self_attn.k_proj", "attention.key", hkv * d, h},
                 {"v", "self_attn.v_proj", "attention.value", hkv * d, h},
                 {"o", "self_attn.o_proj", "attention.proj", h, hq * d},
                 {"gate", "mlp.gate_proj", "mlp.gate", f, h},
                 {"up", "mlp.up_proj", "mlp.up", f, h},
                 {"fc2", "mlp.down_proj", "mlp.fc2", h, f}};
  std::vector<LoraModule> out;
  for (int i = 0; i < m.num_layers; ++i)
    for (const auto& l : linears)
      if (m.lora_targets(l.module))
        out.push_back({fmt::format("model.layers.{}.{}", i, l.hf), fmt::format("layers.{}.{}", i, l.ours),
                       l.out, l.in});
  return out;
}

std::map<std::string, Tensor> from_hf(const std::map<std::string, Tensor>& hf, Architecture a,
                                      const ModelConfig& m, const std::string& source, bool allow_nonfinite) {
  if (a == Architecture::GPT2) return hf_gpt2::from_hf(hf, m, source, allow_nonfinite);
  return llama_from_hf(hf, a, m, source, allow_nonfinite);
}

std::map<std::string, Tensor> to_hf(const std::map<std::string, Tensor>& params, Architecture a,
                                    const ModelConfig& m, DType dtype) {
  torch_dtype_name(dtype);  // rejects non-float dtypes
  if (a == Architecture::GPT2) {
    std::map<std::string, Tensor> out = hf_gpt2::to_hf(params, m, true);
    if (dtype != DType::F32)
      for (auto& [name, t] : out) t = t.to(dtype).contiguous();
    return out;
  }
  return llama_to_hf(params, a, m, dtype);
}

std::string save_imported(const std::map<std::string, Tensor>& params, const Config& config,
                          const std::string& root, const std::string& converted_from, Communicator& world) {
  if (world.size() != 1) fail(fmt::format("conversion runs on one process, not {}", world.size()));
  if (fs::exists(root) && !checkpoint::list_steps(root).empty())
    fail(fmt::format("{} already holds checkpoints; convert into an empty or new directory", root));
  std::vector<checkpoint::ShardedTensor> tensors;
  for (const auto& [name, t] : params) {
    checkpoint::ShardedTensor s;
    s.name = name;
    s.local = t;
    s.global_shape = t.shape();
    s.global_offset.assign(static_cast<std::size_t>(t.dim()), 0);
    s.replica_writer = true;
    tensors.push_back(std::move(s));
  }
  json extras;
  extras["config_yaml"] = config_to_yaml(config);
  extras["converted_from"] = converted_from;
  checkpoint::SaveOptions options;
  options.layout_json = R"({"tensor": 1, "pipeline": 1, "data": 1})";
  return checkpoint::save(root, 0, tensors, extras.dump(), world, options);
}

ModelConfig model_config_of_checkpoint(const std::string& checkpoint_path) {
  const checkpoint::CheckpointInfo info = checkpoint::read_info(checkpoint_path);
  json extras;
  try {
    extras = json::parse(info.extras_json.empty() ? "{}" : info.extras_json);
  } catch (const json::exception& e) {
    fail(fmt::format("{}: the extras are not valid JSON: {}", info.step_dir, e.what()));
  }
  std::string yaml;
  for (const char* key : {"config_yaml", "config"})
    if (extras.is_object() && extras.contains(key) && extras[key].is_string()) {
      yaml = extras[key].get<std::string>();
      break;
    }
  if (yaml.empty())
    fail(fmt::format("{} stores no model config (extras.config_yaml); pass --config", info.step_dir));
  return hf_gpt2::model_config_from_yaml(yaml, info.step_dir + " (extras.config_yaml)");
}

std::map<std::string, Tensor> load_parameters(const std::string& checkpoint_path,
                                              const std::map<std::string, Shape>& shapes,
                                              Communicator& world) {
  if (world.size() != 1) fail(fmt::format("conversion runs on one process, not {}", world.size()));
  const checkpoint::CheckpointInfo info = checkpoint::read_info(checkpoint_path);
  std::map<std::string, Shape> saved;
  for (const checkpoint::TensorInfo& t : info.tensors) saved[t.name] = t.global_shape;
  std::map<std::string, Tensor> params;
  std::vector<checkpoint::ShardedTensor> requests;
  for (const auto& [name, shape] : shapes) {
    const auto it = saved.find(name);
    if (it == saved.end())
      fail(fmt::format("{} has no tensor '{}' (is it a checkpoint of this model?)", info.step_dir, name));
    Tensor t = Tensor::empty(it->second, DType::F32);
    params[name] = t;
    checkpoint::ShardedTensor s;
    s.name = name;
    s.local = t;
    s.global_shape = it->second;
    s.global_offset.assign(it->second.size(), 0);
    requests.push_back(std::move(s));
  }
  checkpoint::LoadOptions options;
  options.weights_only = true;
  checkpoint::load(info.step_dir, requests, world, options);
  return params;
}

std::string config_path_for(const std::string& root) {
  std::string r = root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  return r + ".yaml";
}

// DeepSeek's checkpoints carry num_nextn_predict_layers = D multi-token prediction layers as
// model.layers.{num_hidden_layers + k - 1}.* (k = 1..D); transformers' own saves never do. Returns the
// model.mtp_num_layers to import with: D when the folder holds every MTP tensor, 0 (said in one line)
// when it holds none; a partial set is refused. Tensors beyond those layers are unexpected (from_hf
// refuses them).
static int mtp_layers_to_import(const std::map<std::string, Tensor>& tensors, const HfModel& hf,
                                const std::string& dir) {
  if (hf.mtp_layers == 0) return 0;
  const int first = hf.model.num_layers, last = first + hf.mtp_layers;
  const auto is_mtp = [&](const std::string& name) {
    int layer = -1;
    return name.starts_with("model.layers.") && std::sscanf(name.c_str(), "model.layers.%d.", &layer) == 1 &&
           layer >= first && layer < last;
  };
  ModelConfig with = hf.model;
  with.mtp_num_layers = hf.mtp_layers;
  std::vector<std::string> expected;
  for (const Entry& e : deepseek_v3_entries(with))
    if (is_mtp(e.hf)) expected.push_back(e.hf);
  for (const auto& [copy, of] : mtp_copies(with)) expected.push_back(copy);
  int64_t present = 0;
  for (const auto& [name, t] : tensors) present += is_mtp(name) ? 1 : 0;
  const std::string layers = hf.mtp_layers > 1
                                 ? fmt::format("model.layers.{}.* to model.layers.{}.*", first, last - 1)
                                 : fmt::format("model.layers.{}.*", first);
  if (present == 0) {
    logger().warn(
        "hf: {}: num_nextn_predict_layers = {}, but the folder holds no multi-token prediction tensors ({}); "
        "the model is imported without them (model.mtp_num_layers 0)",
        dir, hf.mtp_layers, layers);
    return 0;
  }
  for (const std::string& name : expected)
    if (!tensors.count(name))
      fail(fmt::format(
          "{}: num_nextn_predict_layers = {}: the multi-token prediction tensors ({}) are incomplete: {} of "
          "the {} expected are present, '{}' is missing",
          dir, hf.mtp_layers, layers, present, expected.size(), name));
  return hf.mtp_layers;
}

std::string import_folder(const std::string& hf_dir, const std::string& root, Communicator& world,
                          bool allow_nonfinite) {
  const std::string config_file = (fs::path(hf_dir) / kConfigName).string();
  if (!fs::exists(config_file))
    fail(fmt::format("{}: no {} (expected a Hugging Face model folder)", hf_dir, kConfigName));
  const HfModel hf = model_from_config_json(read_text(config_file), config_file);
  Config config;
  config.model = hf.model;
  // The folder's tokenizer.json, when it has one, is the training config's tokenizer (the trainer
  // reads its end-of-document id and checks its vocabulary against the model's). Absolute, so the
  // YAML works from any directory.
  if (const fs::path tokenizer = fs::path(hf_dir) / "tokenizer.json"; fs::is_regular_file(tokenizer)) {
    config.data.tokenizer = "HuggingFace";
    config.data.tokenizer_file = fs::absolute(tokenizer).lexically_normal().string();
  }
  validate_config(config, 1);
  const std::map<std::string, Tensor> tensors = load_folder(hf_dir);
  if (hf.architecture == Architecture::DeepseekV3) {
    config.model.mtp_num_layers = mtp_layers_to_import(tensors, hf, hf_dir);
    validate_config(config, 1);
  }
  const std::map<std::string, Tensor> params =
      from_hf(tensors, hf.architecture, config.model, hf_dir, allow_nonfinite);
  const std::string dir = save_imported(params, config, root,
                                        fmt::format("hf:{}:{}", architecture_name(hf.architecture),
                                                    fs::path(hf_dir).lexically_normal().string()),
                                        world);
  write_text(config_path_for(root), "# Written by convert_checkpoint --from hf from " + hf_dir + " (" +
                                        architecture_name(hf.architecture) + ").\n" + config_to_yaml(config));
  return dir;
}

void export_folder(const std::string& checkpoint_path, const std::string& hf_dir, Communicator& world,
                   const ExportOptions& options) {
  const ModelConfig model =
      options.model != nullptr ? *options.model : model_config_of_checkpoint(checkpoint_path);
  Architecture a = architecture_for(model);
  if (!options.template_config.empty()) {
    const json t = parse_json(options.template_config, "the template config.json");
    const Architecture named = architecture_from_json(t, "the template config.json");
    if ((named == Architecture::GPT2) != (a == Architecture::GPT2))
      fail(fmt::format("the template config.json names {}, which cannot hold this model (a {})",
                       architecture_name(named), architecture_name(a)));
    a = named;
  }
  // What cannot be exported at all is refused first, then the router options the family cannot hold.
  if (options.merge_lora && model.num_experts > 0)
    fail(
        fmt::format("--merge-lora: {} is a MoE model (model.num_experts = {}); merging expert adapters is "
                    "not supported yet (docs/lora.md)",
                    checkpoint_path, model.num_experts));
  // Before any weight is read: a router option can change which tensors exist (an expert bias, dense
  // first layers), and the refusal should name the option, not a tensor.
  if (model.num_experts > 0 && (a == Architecture::Qwen3Moe || a == Architecture::Mixtral))
    check_router(model, a);
  // Whether the architecture holds the model at all (latent attention, DeepSeek-V3's experts, ...),
  // also before any weight is read.
  const std::string config =
      config_json_for(model, a, torch_dtype_name(options.dtype), options.template_config);
  const std::map<std::string, Shape> shapes =
      a == Architecture::GPT2 ? hf_gpt2::parameter_shapes(model) : llama_parameter_shapes(model);
  std::map<std::string, Tensor> params = load_parameters(checkpoint_path, shapes, world);
  if (options.merge_lora) {
    if (!model.lora.enabled())
      fail(fmt::format("--merge-lora: {} is not a LoRA checkpoint (its model.lora.rank is 0)",
                       checkpoint_path));
    if (a == Architecture::GPT2) fail("--merge-lora: LoRA exports are for the Llama family");
    // W + (alpha / r) B A, in double, rounded once.
    const int64_t r = model.lora.rank;
    const double scale = model.lora.scale();
    for (const LoraModule& mod : lora_modules(model)) {
      const std::map<std::string, Tensor> ab = load_parameters(
          checkpoint_path,
          {{mod.ours + ".lora_A.weight", {r, mod.in}}, {mod.ours + ".lora_B.weight", {mod.out, r}}}, world);
      const std::vector<float> A = ab.at(mod.ours + ".lora_A.weight").to_float_vector();
      const std::vector<float> B = ab.at(mod.ours + ".lora_B.weight").to_float_vector();
      Tensor& w = params.at(mod.ours + ".weight");
      Tensor merged = w.to(DType::F32).contiguous().clone();
      float* out = merged.data<float>();
      for (int64_t o = 0; o < mod.out; ++o)
        for (int64_t i = 0; i < mod.in; ++i) {
          double sum = 0;
          for (int64_t k = 0; k < r; ++k) sum += double{B[o * r + k]} * double{A[k * mod.in + i]};
          out[o * mod.in + i] = static_cast<float>(double{out[o * mod.in + i]} + scale * sum);
        }
      w = merged;
    }
  }
  const std::map<std::string, Tensor> hf = to_hf(params, a, model, options.dtype);
  // What we wrote must read back as the same model (a template's other keys could contradict it).
  const HfModel back = model_from_config_json(config, hf_dir + "/config.json");
  Config expected, got;
  expected.model = model;
  got.model = back.model;
  got.model.seq_length = expected.model.seq_length;
  got.model.dropout = expected.model.dropout;
  // Training settings of a MoE that config.json does not hold (the balancing losses' weights, how
  // tokens travel between ranks).
  got.model.moe_aux_loss_coeff = expected.model.moe_aux_loss_coeff;
  got.model.moe_z_loss_coeff = expected.model.moe_z_loss_coeff;
  got.model.moe_token_dispatcher = expected.model.moe_token_dispatcher;
  got.model.moe_seq_aux_loss_coeff = expected.model.moe_seq_aux_loss_coeff;
  got.model.moe_bias_update_speed = expected.model.moe_bias_update_speed;
  got.model.hf_architecture = expected.model.hf_architecture;
  got.model.lora = expected.model.lora;  // adapters are not part of config.json
  // The MTP layers are num_nextn_predict_layers; their loss weight is a training setting.
  got.model.mtp_num_layers = back.mtp_layers;
  got.model.mtp_loss_scaling_factor = expected.model.mtp_loss_scaling_factor;
  validate_config(expected, 1);
  validate_config(got, 1);
  if (config_to_yaml(expected) != config_to_yaml(got))
    fail(fmt::format(
        "the config.json written for {} does not read back as the checkpoint's model (a template key "
        "contradicts it?)",
        architecture_name(a)));
  save_folder(hf_dir, hf, config, options.max_shard_bytes);
}

}  // namespace parallel::hf
