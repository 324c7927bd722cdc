// LoRA adapters of a checkpoint -> a PEFT adapter folder (adapter_model.safetensors and
// adapter_config.json, as peft's save_pretrained writes them for a LoraConfig on a causal LM).
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "parallel/error.hpp"
#include "parallel/hf_model.hpp"
#include "parallel/safetensors.hpp"

namespace parallel::hf {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

[[noreturn]] void fail(const std::string& message) { throw Error("peft: " + message); }

// Our module names -> Hugging Face's (adapter_config.json's target_modules).
const char* hf_module_name(const std::string& ours) {
  if (ours == "q") return "q_proj";
  if (ours == "k") return "k_proj";
  if (ours == "v") return "v_proj";
  if (ours == "o") return "o_proj";
  if (ours == "gate") return "gate_proj";
  if (ours == "up") return "up_proj";
  if (ours == "fc2") return "down_proj";
  fail(fmt::format("model.lora.target_modules: {} has no Llama-family module", ours));
}

// A whole number as an integer (PEFT writes r and, usually, lora_alpha as ints).
json number(double v) {
  if (std::floor(v) == v && std::fabs(v) < 1e15) return static_cast<int64_t>(v);
  return v;
}

}  // namespace

void export_peft(const std::string& checkpoint_path, const std::string& dir, Communicator& world,
                 const PeftOptions& options) {
  const ModelConfig model =
      options.model != nullptr ? *options.model : model_config_of_checkpoint(checkpoint_path);
  if (!model.lora.enabled())
    fail(fmt::format("{} is not a LoRA checkpoint (its model.lora.rank is 0)", checkpoint_path));
  if (architecture_for(model) == Architecture::GPT2)
    fail("PEFT adapters are written for the Llama family (GPT-2's fused c_attn has no q/k/v modules)");
  if (model.num_experts > 0)
    fail(
        fmt::format("{}: a MoE model's adapters (model.num_experts = {}) cannot be written: PEFT export of "
                    "expert adapters is not supported yet (docs/lora.md)",
                    checkpoint_path, model.num_experts));
  const fs::path root(dir);
  if (fs::exists(root / "adapter_model.safetensors") || fs::exists(root / "adapter_config.json"))
    fail(fmt::format("{} already holds an adapter; write into an empty or new directory", dir));

  const int64_t r = model.lora.rank;
  std::map<std::string, Shape> shapes;
  const std::vector<LoraModule> modules = lora_modules(model);
  for (const LoraModule& m : modules) {
    shapes[m.ours + ".lora_A.weight"] = {r, m.in};
    shapes[m.ours + ".lora_B.weight"] = {m.out, r};
  }
  const std::map<std::string, Tensor> params = load_parameters(checkpoint_path, shapes, world);
  std::map<std::string, Tensor> tensors;
  for (const LoraModule& m : modules)
    for (const char* factor : {"lora_A", "lora_B"}) {
      const Tensor& t = params.at(fmt::format("{}.{}.weight", m.ours, factor));
      tensors[fmt::format("base_model.model.{}.{}.weight", m.hf, factor)] = t.to(options.dtype).contiguous();
    }

  json targets = json::array();
  for (const std::string& t : lora_target_modules(model.lora.target_modules))
    targets.push_back(hf_module_name(t));
  // The keys of peft's LoraConfig.save_pretrained, with its defaults for what we do not use.
  const json config = {
      {"alpha_pattern", json::object()},
      {"auto_mapping", nullptr},
      {"base_model_name_or_path", options.base_model_name_or_path},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"layer_replication", nullptr},
      {"layers_pattern", nullptr},
      {"layers_to_transform", nullptr},
      {"loftq_config", json::object()},
      {"lora_alpha", number(model.lora.alpha)},
      {"lora_dropout", model.lora.dropout},
      {"megatron_config", nullptr},
      {"megatron_core", "megatron.core"},
      {"modules_to_save", nullptr},
      {"peft_type", "LORA"},
      {"r", r},
      {"rank_pattern", json::object()},
      {"revision", nullptr},
      {"target_modules", targets},
      {"task_type", "CAUSAL_LM"},
      {"use_dora", false},
      {"use_rslora", false},
  };
  fs::create_directories(root);
  safetensors::save((root / "adapter_model.safetensors").string(), tensors, {{"format", "pt"}});
  const std::string path = (root / "adapter_config.json").string();
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << config.dump(2) << "\n";
    out.flush();
    if (!out) fail(fmt::format("cannot write {}", tmp));
  }
  fs::rename(tmp, path);
}

}  // namespace parallel::hf
