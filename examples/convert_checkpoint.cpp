// convert_checkpoint: Hugging Face GPT-2 safetensors <-> our checkpoint directories
// (docs/checkpoints.md, "Importing and exporting HF GPT-2"; the mapping is include/parallel/hf_gpt2.hpp).
//
//   convert_checkpoint --from hf-gpt2 --config model.yaml --input model.safetensors --output ckpt/
//   convert_checkpoint --to hf-gpt2 --input ckpt/ --output model.safetensors [--config model.yaml]
//
// Import writes a weights-only checkpoint at step 0 (ckpt/step_00000000 and ckpt/latest) that any
// layout can load. Export reads a checkpoint root or step directory; the model config comes from
// --config, else from the config the checkpoint stored in its extras.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include "parallel/hf_gpt2.hpp"
#include "parallel/runtime.hpp"

int main(int argc, char** argv) {
  std::string from, to, config_path, input, output;
  bool no_prefix = false, allow_nonfinite = false;
  CLI::App app{"Convert Hugging Face GPT-2 weights to and from libparallel checkpoints"};
  CLI::Option* from_opt = app.add_option("--from", from, "import: the input's format (hf-gpt2)")
                              ->check(CLI::IsMember({"hf-gpt2"}));
  CLI::Option* to_opt =
      app.add_option("--to", to, "export: the output's format (hf-gpt2)")->check(CLI::IsMember({"hf-gpt2"}));
  from_opt->excludes(to_opt);
  app.add_option("--config", config_path,
                 "training config YAML (its model section must match the weights); required with --from")
      ->check(CLI::ExistingFile);
  app.add_option("--input", input,
                 "--from: an HF model.safetensors; --to: a checkpoint root or step directory")
      ->required();
  app.add_option("--output", output, "--from: a new checkpoint root; --to: the model.safetensors to write")
      ->required();
  app.add_flag("--no-transformer-prefix", no_prefix,
               "--to: name tensors wte.weight, h.0. ... instead of transformer.wte.weight, ...");
  app.add_flag("--allow-nonfinite", allow_nonfinite,
               "--from: import weights holding NaN or infinity (refused by default, naming the tensor)");
  try {
    app.parse(argc, argv);
    if (from.empty() == to.empty())
      throw CLI::ValidationError("give exactly one of --from hf-gpt2 or --to hf-gpt2");
    if (!from.empty() && config_path.empty()) throw CLI::ValidationError("--from hf-gpt2 needs --config");
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, in the same shape as the library's errors.
    std::fprintf(stderr, "convert_checkpoint: %s (see --help)\n", e.what());
    return 2;
  }

  return parallel::run_main(argc, argv, [&](parallel::Runtime& rt) {
    try {
      if (!from.empty()) {
        const parallel::Config config = parallel::hf_gpt2::config_for_conversion(config_path);
        const std::string dir =
            parallel::hf_gpt2::import_checkpoint(input, config, output, rt.world(), allow_nonfinite);
        std::printf("wrote %s\n", dir.c_str());
      } else {
        parallel::ModelConfig model;
        if (!config_path.empty()) model = parallel::hf_gpt2::config_for_conversion(config_path).model;
        parallel::hf_gpt2::export_checkpoint(input, config_path.empty() ? nullptr : &model, output,
                                             rt.world(), !no_prefix);
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
