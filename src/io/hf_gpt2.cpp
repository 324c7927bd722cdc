// Hugging Face GPT-2 <-> our parameters and checkpoints (include/parallel/hf_gpt2.hpp).
#include "parallel/hf_gpt2.hpp"

#include <cstring>
#include <filesystem>
#include <vector>

#include "parallel/checkpoint.hpp"
#include "parallel/error.hpp"
#include "parallel/hf_model.hpp"
#include "parallel/safetensors.hpp"

namespace parallel::hf_gpt2 {
namespace {

namespace fs = std::filesystem;

// Conversion errors are user input errors (a wrong file or config): one clean line, no file:line.
[[noreturn]] void fail(const std::string& message) { throw Error("hf-gpt2: " + message); }

constexpr const char* kPrefix = "transformer.";

int64_t ffn_size(const ModelConfig& c) {
  return c.ffn_hidden_size > 0 ? c.ffn_hidden_size : 4 * c.hidden_size;
}
int64_t max_positions(const ModelConfig& c) {
  return c.max_position_embeddings > 0 ? c.max_position_embeddings : c.seq_length;
}

// [rows, cols] -> contiguous fp32 [cols, rows].
Tensor transpose2d(const Tensor& t) {
  PARALLEL_CHECK(t.dim() == 2, "transpose of {}", t.str());
  const Tensor src = t.to(DType::F32).contiguous();
  const int64_t rows = src.size(0), cols = src.size(1);
  Tensor out = Tensor::empty({cols, rows}, DType::F32);
  const float* s = src.data<float>();
  float* d = out.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) d[c * rows + r] = s[r * cols + c];
  return out;
}

Tensor f32_copy(const Tensor& t) { return t.to(DType::F32).contiguous().clone(); }

bool same_values(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const std::vector<float> x = a.to_float_vector(), y = b.to_float_vector();
  return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// The HF tensors a GPT-2 of `config` has (names without prefix) and their shapes.
std::map<std::string, Shape> hf_shapes(const ModelConfig& c) {
  const int64_t h = c.hidden_size, f = ffn_size(c);
  std::map<std::string, Shape> s;
  s["wte.weight"] = {c.vocab_size, h};
  s["wpe.weight"] = {max_positions(c), h};
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    s[p + "ln_1.weight"] = {h};
    s[p + "ln_1.bias"] = {h};
    s[p + "attn.c_attn.weight"] = {h, 3 * h};
    s[p + "attn.c_attn.bias"] = {3 * h};
    s[p + "attn.c_proj.weight"] = {h, h};
    s[p + "attn.c_proj.bias"] = {h};
    s[p + "ln_2.weight"] = {h};
    s[p + "ln_2.bias"] = {h};
    s[p + "mlp.c_fc.weight"] = {h, f};
    s[p + "mlp.c_fc.bias"] = {f};
    s[p + "mlp.c_proj.weight"] = {f, h};
    s[p + "mlp.c_proj.bias"] = {h};
  }
  s["ln_f.weight"] = {h};
  s["ln_f.bias"] = {h};
  return s;
}

// "h.3.attn.bias" and "h.3.attn.masked_bias": attention-mask buffers, not parameters.
bool is_attention_buffer(const std::string& name) {
  if (!name.starts_with("h.")) return false;
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
}

// The layer count an HF file holds: 1 + the highest i of any "h.{i}." name.
int hf_layer_count(const std::map<std::string, Tensor>& stripped) {
  int layers = 0;
  for (const auto& [name, t] : stripped) {
    if (!name.starts_with("h.")) continue;
    const std::size_t dot = name.find('.', 2);
    try {
      layers = std::max(layers, std::stoi(name.substr(2, dot - 2)) + 1);
    } catch (const std::exception&) {
      // Not a layer index: reported as an unexpected tensor below.
    }
  }
  return layers;
}

// The training layout is irrelevant to conversion and may not fit one rank (e.g. tensor: 8).
std::vector<std::string> one_rank_overrides() {
  return {"parallel.tensor=1",           "parallel.pipeline=1",
          "parallel.virtual_stages=1",   "parallel.sequence_parallel=false",
          "parallel.context=1",          "parallel.expert=1",
          "parallel.expert_tensor=1",    "parallel.first_stage_layers=0",
          "parallel.last_stage_layers=0"};
}

}  // namespace

void check_config(const ModelConfig& c) {
  auto require = [](bool ok, const std::string& what) {
    if (!ok) fail("the config is not a GPT-2 architecture: " + what);
  };
  require(c.normalization == Normalization::LayerNorm, "model.normalization must be layernorm");
  require(c.activation == Activation::GeLU, "model.activation must be gelu");
  require(c.num_experts == 0, "model.num_experts must be 0 (GPT-2 has dense MLPs)");
  require(c.position_embedding == PositionEmbedding::Learned, "model.position_embedding must be learned");
  require(c.add_bias, "model.add_bias must be true");
  require(c.tie_embeddings, "model.tie_embeddings must be true");
  require(
      c.num_query_groups == 0 || c.num_query_groups == c.num_attention_heads,
      "model.num_query_groups must equal model.num_attention_heads (GPT-2 has no grouped-query attention)");
}

std::map<std::string, Shape> parameter_shapes(const ModelConfig& c) {
  const int64_t h = c.hidden_size, f = ffn_size(c);
  std::map<std::string, Shape> s;
  s["embedding.word.weight"] = {c.vocab_size, h};
  s["embedding.position.weight"] = {max_positions(c), h};
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    for (const char* norm : {"input_norm", "post_attention_norm"}) {
      s[p + norm + ".weight"] = {h};
      s[p + norm + ".bias"] = {h};
    }
    for (const char* qkv : {"query", "key", "value", "proj"}) {
      s[p + "attention." + qkv + ".weight"] = {h, h};
      s[p + "attention." + qkv + ".bias"] = {h};
    }
    s[p + "mlp.fc1.weight"] = {f, h};
    s[p + "mlp.fc1.bias"] = {f};
    s[p + "mlp.fc2.weight"] = {h, f};
    s[p + "mlp.fc2.bias"] = {h};
  }
  s["final_norm.weight"] = {h};
  s["final_norm.bias"] = {h};
  return s;
}

std::map<std::string, Tensor> from_hf(const std::map<std::string, Tensor>& hf, const ModelConfig& config,
                                      const std::string& source, bool allow_nonfinite) {
  check_config(config);
  // Strip the optional prefix; the model's own names must then be unique.
  std::map<std::string, Tensor> in;
  std::map<std::string, std::string> original;  // stripped -> name in the file, for messages
  for (const auto& [name, t] : hf) {
    const std::string key = name.starts_with(kPrefix) ? name.substr(std::strlen(kPrefix)) : name;
    if (!in.emplace(key, t).second)
      fail(fmt::format("{}: '{}' appears both with and without the '{}' prefix", source, key, kPrefix));
    original[key] = name;
  }

  const int layers = hf_layer_count(in);
  if (layers != config.num_layers)
    fail(fmt::format("{} holds {} layers (h.0 .. h.{}), but the config has model.num_layers = {}", source,
                     layers, layers - 1, config.num_layers));

  const std::map<std::string, Shape> expected = hf_shapes(config);
  for (const auto& [name, t] : in) {
    if (expected.count(name) || is_attention_buffer(name)) continue;
    if (name == "lm_head.weight") {
      // GPT-2 ties the output layer to wte; an lm_head that differs would be silently lost.
      const auto wte = in.find("wte.weight");
      if (t.dtype() == DType::F8E4M3 || (wte != in.end() && wte->second.dtype() == DType::F8E4M3))
        fail(
            fmt::format("{}: '{}' or 'wte.weight' has dtype fp8_e4m3, expected f32, bf16 or f16 (fp8 is "
                        "storage-only here: no conversion)",
                        source, original[name]));
      if (wte == in.end() || !same_values(t, wte->second))
        fail(fmt::format("{}: '{}' differs from the word embedding (untied GPT-2 heads are not supported)",
                         source, original[name]));
      continue;
    }
    fail(fmt::format("{}: unexpected tensor '{}' {} (not part of a GPT-2 model)", source, original[name],
                     shape_str(t.shape())));
  }
  for (const auto& [name, shape] : expected) {
    const auto it = in.find(name);
    if (it == in.end()) fail(fmt::format("{}: missing tensor '{}'", source, name));
    if (!is_floating(it->second.dtype()) || it->second.dtype() == DType::F8E4M3)
      fail(fmt::format(
          "{}: '{}' has dtype {}, expected f32, bf16 or f16{}", source, original[name],
          dtype_name(it->second.dtype()),
          it->second.dtype() == DType::F8E4M3 ? " (fp8 is storage-only here: no conversion)" : ""));
    if (it->second.shape() != shape)
      fail(
          fmt::format("{}: '{}' has shape {}, but the config (model.vocab_size {}, model.hidden_size {}, "
                      "model.ffn_hidden_size {}, model.max_position_embeddings {}) needs {}",
                      source, original[name], shape_str(it->second.shape()), config.vocab_size,
                      config.hidden_size, ffn_size(config), max_positions(config), shape_str(shape)));
    if (!allow_nonfinite) hf::check_finite(it->second, source, original[name]);
  }

  const int64_t h = config.hidden_size;
  std::map<std::string, Tensor> out;
  out["embedding.word.weight"] = f32_copy(in.at("wte.weight"));
  out["embedding.position.weight"] = f32_copy(in.at("wpe.weight"));
  for (int i = 0; i < config.num_layers; ++i) {
    const std::string src = "h." + std::to_string(i) + ".", dst = "layers." + std::to_string(i) + ".";
    out[dst + "input_norm.weight"] = f32_copy(in.at(src + "ln_1.weight"));
    out[dst + "input_norm.bias"] = f32_copy(in.at(src + "ln_1.bias"));
    // c_attn's output columns are [query | key | value], h each.
    const Tensor qkv_w = transpose2d(in.at(src + "attn.c_attn.weight"));  // [3h, h]
    const Tensor qkv_b = in.at(src + "attn.c_attn.bias");
    const char* parts[3] = {"query", "key", "value"};
    for (int part = 0; part < 3; ++part) {
      out[dst + "attention." + parts[part] + ".weight"] = qkv_w.narrow(0, part * h, h).clone();
      out[dst + "attention." + parts[part] + ".bias"] = f32_copy(qkv_b.narrow(0, part * h, h));
    }
    out[dst + "attention.proj.weight"] = transpose2d(in.at(src + "attn.c_proj.weight"));
    out[dst + "attention.proj.bias"] = f32_copy(in.at(src + "attn.c_proj.bias"));
    out[dst + "post_attention_norm.weight"] = f32_copy(in.at(src + "ln_2.weight"));
    out[dst + "post_attention_norm.bias"] = f32_copy(in.at(src + "ln_2.bias"));
    out[dst + "mlp.fc1.weight"] = transpose2d(in.at(src + "mlp.c_fc.weight"));
    out[dst + "mlp.fc1.bias"] = f32_copy(in.at(src + "mlp.c_fc.bias"));
    out[dst + "mlp.fc2.weight"] = transpose2d(in.at(src + "mlp.c_proj.weight"));
    out[dst + "mlp.fc2.bias"] = f32_copy(in.at(src + "mlp.c_proj.bias"));
  }
  out["final_norm.weight"] = f32_copy(in.at("ln_f.weight"));
  out["final_norm.bias"] = f32_copy(in.at("ln_f.bias"));
  return out;
}

std::map<std::string, Tensor> to_hf(const std::map<std::string, Tensor>& params, const ModelConfig& config,
                                    bool transformer_prefix) {
  check_config(config);
  std::map<std::string, Tensor> in;
  for (const auto& [name, shape] : parameter_shapes(config)) {
    const auto it = params.find(name);
    if (it == params.end()) fail(fmt::format("missing parameter '{}'", name));
    Tensor t = it->second;
    // The vocabulary may arrive padded (a checkpoint written before padding was trimmed).
    if (name == "embedding.word.weight" && t.dim() == 2 && t.size(0) > shape[0] && t.size(1) == shape[1])
      t = t.narrow(0, 0, shape[0]);
    if (t.shape() != shape)
      fail(fmt::format("parameter '{}' has shape {}, but the config needs {}", name, shape_str(t.shape()),
                       shape_str(shape)));
    in[name] = t;
  }

  const int64_t h = config.hidden_size;
  const std::string pre = transformer_prefix ? kPrefix : "";
  std::map<std::string, Tensor> out;
  out[pre + "wte.weight"] = f32_copy(in.at("embedding.word.weight"));
  out[pre + "wpe.weight"] = f32_copy(in.at("embedding.position.weight"));
  for (int i = 0; i < config.num_layers; ++i) {
    const std::string src = "layers." + std::to_string(i) + ".", dst = pre + "h." + std::to_string(i) + ".";
    out[dst + "ln_1.weight"] = f32_copy(in.at(src + "input_norm.weight"));
    out[dst + "ln_1.bias"] = f32_copy(in.at(src + "input_norm.bias"));
    Tensor qkv_w = Tensor::empty({3 * h, h}, DType::F32), qkv_b = Tensor::empty({3 * h}, DType::F32);
    const char* parts[3] = {"query", "key", "value"};
    for (int part = 0; part < 3; ++part) {
      qkv_w.narrow(0, part * h, h).copy_(in.at(src + "attention." + parts[part] + ".weight"));
      qkv_b.narrow(0, part * h, h).copy_(in.at(src + "attention." + parts[part] + ".bias"));
    }
    out[dst + "attn.c_attn.weight"] = transpose2d(qkv_w);  // [h, 3h]
    out[dst + "attn.c_attn.bias"] = qkv_b;
    out[dst + "attn.c_proj.weight"] = transpose2d(in.at(src + "attention.proj.weight"));
    out[dst + "attn.c_proj.bias"] = f32_copy(in.at(src + "attention.proj.bias"));
    out[dst + "ln_2.weight"] = f32_copy(in.at(src + "post_attention_norm.weight"));
    out[dst + "ln_2.bias"] = f32_copy(in.at(src + "post_attention_norm.bias"));
    out[dst + "mlp.c_fc.weight"] = transpose2d(in.at(src + "mlp.fc1.weight"));
    out[dst + "mlp.c_fc.bias"] = f32_copy(in.at(src + "mlp.fc1.bias"));
    out[dst + "mlp.c_proj.weight"] = transpose2d(in.at(src + "mlp.fc2.weight"));
    out[dst + "mlp.c_proj.bias"] = f32_copy(in.at(src + "mlp.fc2.bias"));
  }
  out[pre + "ln_f.weight"] = f32_copy(in.at("final_norm.weight"));
  out[pre + "ln_f.bias"] = f32_copy(in.at("final_norm.bias"));
  return out;
}

ModelConfig model_config_from_yaml(const std::string& yaml_text, const std::string& file_name) {
  return parse_config(yaml_text, one_rank_overrides(), 1, file_name).model;
}

Config config_for_conversion(const std::string& path) { return load_config(path, one_rank_overrides(), 1); }

std::string import_checkpoint(const std::string& hf_file, const Config& config, const std::string& root,
                              Communicator& world, bool allow_nonfinite) {
  if (world.size() != 1) fail(fmt::format("conversion runs on one process, not {}", world.size()));
  if (fs::exists(root) && !checkpoint::list_steps(root).empty())
    fail(fmt::format("{} already holds checkpoints; convert into an empty or new directory", root));
  return hf::save_imported(from_hf(safetensors::load(hf_file), config.model, hf_file, allow_nonfinite),
                           config, root, "hf-gpt2:" + fs::path(hf_file).filename().string(), world);
}

void export_checkpoint(const std::string& checkpoint_path, const ModelConfig* config,
                       const std::string& hf_file, Communicator& world, bool transformer_prefix) {
  if (world.size() != 1) fail(fmt::format("conversion runs on one process, not {}", world.size()));
  const ModelConfig model = config != nullptr ? *config : hf::model_config_of_checkpoint(checkpoint_path);
  check_config(model);
  // Whole tensors as saved (the word embedding may be padded in older checkpoints; to_hf drops
  // those rows).
  const std::map<std::string, Tensor> params =
      hf::load_parameters(checkpoint_path, parameter_shapes(model), world);
  safetensors::save(hf_file, to_hf(params, model, transformer_prefix), {{"format", "pt"}});
}

}  // namespace parallel::hf_gpt2
