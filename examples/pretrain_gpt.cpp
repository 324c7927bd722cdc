// GPT pretraining: one YAML config composes tensor, pipeline and data parallelism.
//
//   mpirun -np 4 build/bin/pretrain_gpt --config configs/quickstart.yaml [--set section.key=value ...]
//
// Every rank reads and validates the config before any work; a bad key or value ends every rank
// with one line naming it (exit 2). Metrics go to <train.output_dir>/metrics.jsonl.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "parallel/config.hpp"
#include "parallel/runtime.hpp"
#include "parallel/trainer.hpp"

int main(int argc, char** argv) {
  CLI::App app{"GPT pretraining with tensor, pipeline and data parallelism (libparallel)"};
  std::string config_file;
  std::vector<std::string> overrides;
  app.add_option("--config", config_file, "YAML config (see docs/configuration.md)")
      ->check(CLI::ExistingFile);
  app.add_option("--set", overrides, "override one key: section.key=value (repeatable)");
  app.footer("Config keys:\n" + parallel::config_reference());
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);  // --help prints and returns 0; a bad flag prints one line and returns non-zero
  }
  if (config_file.empty()) {
    std::fprintf(stderr, "pretrain_gpt: --config FILE is required (see --help)\n");
    return 2;
  }
  return parallel::run_main(argc, argv, [&](parallel::Runtime& rt) {
    const parallel::Config config = parallel::load_config(config_file, overrides, rt.world_size());
    parallel::Trainer trainer(config, rt.world());
    trainer.train();
    return 0;
  });
}
