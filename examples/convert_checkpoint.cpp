// convert_checkpoint: Hugging Face models <-> our checkpoint directories (docs/huggingface.md; the
// mappings are include/parallel/hf_model.hpp and include/parallel/hf_gpt2.hpp).
//
//   convert_checkpoint --from hf --input HF_DIR --output ckpt          (writes ckpt/ and ckpt.yaml)
//   convert_checkpoint --to hf --input ckpt/ --output HF_DIR [--max-shard-size 5GB] [--dtype bf16]
//                      [--hf-config template/config.json] [--config model.yaml] [--merge-lora]
//   convert_checkpoint --to peft --input ckpt/ --output ADAPTER_DIR [--base-model NAME] [--dtype bf16]
//   convert_checkpoint --from hf-gpt2 --config model.yaml --input model.safetensors --output ckpt/
//   convert_checkpoint --to hf-gpt2 --input ckpt/ --output model.safetensors [--config model.yaml]
//
// --from hf reads a model folder (config.json, model.safetensors or shards with their index), takes
// the architecture from config.json (GPT-2, Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Mixtral,
// DeepSeek-V3) and writes a weights-only checkpoint at step 0 that any layout can load, plus ckpt.yaml: a
// whole training configuration whose model section is that model (pretrain_gpt --config ckpt.yaml --set
// checkpoint.load=ckpt). Export reads a checkpoint root or step directory; the model config comes from
// --config, else from the config the checkpoint stored in its extras; it writes transformers 5's config.json
// layout (rope_parameters, dtype) plus 4.x's names of the same values, as the architecture imported
// (model.hf_architecture: a Mistral stays MistralForCausalLM with its sliding_window).
// A LoRA run's checkpoint (model.lora, docs/lora.md) exports its adapters with --to peft (PEFT's
// adapter_model.safetensors and adapter_config.json) or merged into the weights with --merge-lora.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>

#include "parallel/hf_gpt2.hpp"
#include "parallel/hf_model.hpp"
#include "parallel/runtime.hpp"

int main(int argc, char** argv) {
  std::string from, to, config_path, input, output, max_shard_size = "5GB", dtype = "f32", hf_config;
  std::string base_model;
  bool no_prefix = false, allow_nonfinite = false, merge_lora = false;
  CLI::App app{"Convert Hugging Face models to and from libparallel checkpoints"};
  CLI::Option* from_opt =
      app.add_option("--from", from,
                     "import: the input's format (hf: a model folder; hf-gpt2: one GPT-2 file)")
          ->check(CLI::IsMember({"hf", "hf-gpt2"}));
  CLI::Option* to_opt =
      app.add_option("--to", to, "export: the output's format (hf, hf-gpt2, peft: a LoRA run's adapters)")
          ->check(CLI::IsMember({"hf", "hf-gpt2", "peft"}));
  from_opt->excludes(to_opt);
  app.add_option(
         "--config", config_path,
         "training config YAML (its model section must match the weights); required with --from hf-gpt2")
      ->check(CLI::ExistingFile);
  app.add_option(
         "--input", input,
         "--from hf: a model folder; --from hf-gpt2: a model.safetensors; --to: a checkpoint root or step "
         "directory")
      ->required();
  app.add_option(
         "--output", output,
         "--from: a new checkpoint root; --to hf: the folder to write; --to hf-gpt2: the model.safetensors")
      ->required();
  app.add_option("--max-shard-size", max_shard_size,
                 "--to hf: shard the safetensors above this size (5GB, 500MB: powers of 1000; 2GiB; bytes)");
  app.add_option("--dtype", dtype, "--to hf: the tensors' dtype (f32, bf16, f16)")
      ->check(CLI::IsMember({"f32", "fp32", "float32", "bf16", "bfloat16", "f16", "fp16", "float16"}));
  app.add_option("--hf-config", hf_config,
                 "--to hf: a config.json whose architecture (else model.hf_architecture's) and other keys "
                 "(token ids, "
                 "...) the written one keeps")
      ->check(CLI::ExistingFile);
  app.add_flag("--merge-lora", merge_lora,
               "--to hf: a LoRA checkpoint's weights with the adapters merged in (W + alpha / r * B A)");
  app.add_option("--base-model", base_model,
                 "--to peft: adapter_config.json's base_model_name_or_path (a hub name or folder)");
  app.add_flag("--no-transformer-prefix", no_prefix,
               "--to hf-gpt2: name tensors wte.weight, h.0. ... instead of transformer.wte.weight, ...");
  app.add_flag("--allow-nonfinite", allow_nonfinite,
               "--from: import weights holding NaN or infinity (refused by default, naming the tensor)");
  try {
    app.parse(argc, argv);
    if (from.empty() == to.empty()) throw CLI::ValidationError("give exactly one of --from or --to");
    if (from == "hf-gpt2" && config_path.empty()) throw CLI::ValidationError("--from hf-gpt2 needs --config");
    if (merge_lora && to != "hf") throw CLI::ValidationError("--merge-lora goes with --to hf");
    if (!base_model.empty() && to != "peft") throw CLI::ValidationError("--base-model goes with --to peft");
    if (from == "hf" && !config_path.empty())
      throw CLI::ValidationError("--from hf takes the model from the folder's config.json: drop --config");
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, in the same shape as the library's errors.
    std::fprintf(stderr, "convert_checkpoint: %s (see --help)\n", e.what());
    return 2;
  }

  return parallel::run_main(argc, argv, [&](parallel::Runtime& rt) {
    try {
      if (from == "hf") {
        const std::string dir = parallel::hf::import_folder(input, output, rt.world(), allow_nonfinite);
        std::printf("wrote %s and %s\n", dir.c_str(), parallel::hf::config_path_for(output).c_str());
      } else if (from == "hf-gpt2") {
        const parallel::Config config = parallel::hf_gpt2::config_for_conversion(config_path);
        const std::string dir =
            parallel::hf_gpt2::import_checkpoint(input, config, output, rt.world(), allow_nonfinite);
        std::printf("wrote %s\n", dir.c_str());
      } else {
        parallel::ModelConfig model;
        if (!config_path.empty()) model = parallel::hf_gpt2::config_for_conversion(config_path).model;
        if (to == "hf") {
          parallel::hf::ExportOptions options;
          options.model = config_path.empty() ? nullptr : &model;
          options.max_shard_bytes = parallel::hf::parse_size(max_shard_size);
          options.merge_lora = merge_lora;
          options.dtype = parallel::dtype_from_name(dtype == "f32"   ? "fp32"
                                                    : dtype == "f16" ? "fp16"
                                                                     : dtype);
          if (!hf_config.empty()) {
            std::ifstream in(hf_config);
            std::stringstream text;
            text << in.rdbuf();
            options.template_config = text.str();
          }
          parallel::hf::export_folder(input, output, rt.world(), options);
        } else if (to == "peft") {
          parallel::hf::PeftOptions options;
          options.model = config_path.empty() ? nullptr : &model;
          options.base_model_name_or_path = base_model;
          options.dtype = parallel::dtype_from_name(dtype == "f32"   ? "fp32"
                                                    : dtype == "f16" ? "fp16"
                                                                     : dtype);
          parallel::hf::export_peft(input, output, rt.world(), options);
        } else {
          parallel::hf_gpt2::export_checkpoint(input, config_path.empty() ? nullptr : &model, output,
                                               rt.world(), !no_prefix);
        }
        std::printf("wrote %s\n", output.c_str());
      }
    } catch (const std::exception& e) {
      // Conversion runs on one process, so there are no peers to bring down: one line and exit 1.
      std::fprintf(stderr, "convert_checkpoint: %s\n", e.what());
      return 1;
    }
    return 0;
  });
}
