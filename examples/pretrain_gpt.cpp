// GPT pretraining: one YAML config composes tensor, pipeline and data parallelism.
//
//   mpirun -np 4 build/bin/pretrain_gpt --config configs/quickstart.yaml [--set section.key=value ...]
//
// Every rank reads and validates the config before any work; a bad key or value ends every rank
// with one line naming it (exit 2). Metrics go to <train.output_dir>/metrics.jsonl.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "parallel/config.hpp"
#include "parallel/hardware.hpp"
#include "parallel/layout_search.hpp"
#include "parallel/memory_plan.hpp"
#include "parallel/preflight.hpp"
#include "parallel/runtime.hpp"
#include "parallel/step_cost.hpp"
#include "parallel/trainer.hpp"

int main(int argc, char** argv) {
  CLI::App app{"GPT pretraining with tensor, sequence, context, pipeline and data parallelism (libparallel)"};
  std::string config_file;
  std::vector<std::string> overrides;
  app.add_option("--config", config_file, "YAML config (see docs/configuration.md)")
      ->check(CLI::ExistingFile);
  app.add_option("--set", overrides, "override one key: section.key=value (repeatable)");
  bool plan_only = false, no_memory_check = false;
  app.add_flag("--plan", plan_only,
               "write every rank's memory plan to <train.output_dir>/plan.json, print it and exit without "
               "training (docs/memory.md)");
  int plan_world_size = 0;
  app.add_option("--world-size", plan_world_size,
                 "with --plan: plan a job of this many ranks (default: the ranks launched), so a large job "
                 "can be planned from one process")
      ->check(CLI::Range(1, 1 << 16));
  std::string attention_kernel = "fused";
  app.add_option("--attention-kernel", attention_kernel,
                 "with --plan --hardware: how the planned system runs attention: fused (this library's "
                 "kernel) or unfused (the score matrix materialised, as Megatron-LM in 2021, with "
                 "model.dropout on the probabilities; docs/planner.md)")
      ->check(CLI::IsMember({"fused", "unfused"}));
  std::string hardware_file;
  app.add_option("--hardware", hardware_file,
                 "with --plan: also predict the step time on this machine (configs/hardware/*.yaml; "
                 "docs/planner.md): time per stage, step time, tokens/s, MFU, bubble and exposed "
                 "communication, added to plan.json")
      ->check(CLI::ExistingFile);
  int ranks_per_node = 0;
  app.add_option("--ranks-per-node", ranks_per_node,
                 "with --hardware: ranks placed on each node (default: the machine's devices per node); "
                 "more than its devices time-shares them")
      ->check(CLI::Range(1, 1 << 16));
  bool breakdown = false;
  app.add_flag("--breakdown", breakdown,
               "with --plan and --hardware: also print each stage's predicted compute per op kind (count, "
               "seconds, share, rate)");
  bool search = false;
  int search_top = 5;
  app.add_flag(
      "--search", search,
      "with --plan and --hardware: enumerate the layouts of the model on --world-size ranks that fit "
      "memory, rank them by predicted step time, print the best and write them to plan.json "
      "(docs/planner.md \"Search\")");
  app.add_option("--top", search_top, "with --search: how many layouts to keep")->check(CLI::Range(1, 1000));
  int search_threads = 0;
  app.add_option("--search-threads", search_threads,
                 "with --search: threads that plan layouts at once (0: the machine's hardware threads; the "
                 "result is the same for any number)")
      ->check(CLI::Range(0, 256));
  int search_stage_layer_shift = parallel::plan::SearchOptions{}.stage_layer_shift;
  app.add_option("--search-stage-layer-shift", search_stage_layer_shift,
                 "with --search: how many layers the first and last pipeline stage may hold fewer or more "
                 "than the others (parallel.first_stage_layers / last_stage_layers; 0: the even split only)")
      ->check(CLI::Range(0, 64));
  bool plan_on_meta = false;
  app.add_flag("--meta", plan_on_meta,
               "with --plan: plan by running the trainer's first two steps on the meta device, once per "
               "pipeline stage (docs/planner.md), instead of the layer walk");
  app.add_flag("--no-memory-check", no_memory_check,
               "train even when the memory plan says the largest rank does not fit");
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
    if (search && (!plan_only || hardware_file.empty()))
      throw parallel::ConfigError("pretrain_gpt: --search needs --plan and --hardware FILE");
    if (plan_on_meta && !plan_only) throw parallel::ConfigError("pretrain_gpt: --meta is for --plan only");
    if (plan_world_size > 0 && !plan_only)
      throw parallel::ConfigError(
          "pretrain_gpt: --world-size is for --plan only (training uses the ranks launched)");
    if ((!hardware_file.empty() || ranks_per_node > 0) && !plan_only)
      throw parallel::ConfigError("pretrain_gpt: --hardware and --ranks-per-node are for --plan only");
    if (breakdown && hardware_file.empty())
      throw parallel::ConfigError("pretrain_gpt: --breakdown needs --plan and --hardware FILE");
    if (ranks_per_node > 0 && hardware_file.empty())
      throw parallel::ConfigError("pretrain_gpt: --ranks-per-node needs --hardware FILE");
    const int world_size = plan_only && plan_world_size > 0 ? plan_world_size : rt.world_size();
    const parallel::Config config = parallel::load_config(config_file, overrides, world_size);
    const parallel::plan::CostOptions cost_options{.attention = attention_kernel == "unfused"
                                                                    ? parallel::plan::AttentionKernel::Unfused
                                                                    : parallel::plan::AttentionKernel::Fused,
                                                   .attention_dropout = config.model.dropout};
    if (plan_only) {
      // Every rank, so that all fail alike (one line naming train.output_dir, exit 2).
      parallel::check_writable_dir("train.output_dir", config.train.output_dir,
                                   "rank" + std::to_string(rt.rank()));
      if (search) {
        if (rt.rank() != 0) return 0;
        const parallel::HardwareDescription hw = parallel::load_hardware(hardware_file);
        const parallel::plan::SearchResult result =
            parallel::plan::search_layouts(config, world_size, hw,
                                           {.top_k = search_top,
                                            .ranks_per_node = ranks_per_node,
                                            .cost = cost_options,
                                            .stage_layer_shift = search_stage_layer_shift,
                                            .threads = search_threads});
        std::printf("layouts of %d ranks on %s (%s):\n%s", world_size, hw.name.c_str(), hardware_file.c_str(),
                    parallel::plan::search_table(result).c_str());
        const std::filesystem::path file = std::filesystem::path(config.train.output_dir) / "plan.json";
        std::ofstream out(file);
        out << parallel::plan::search_json(result, world_size, hardware_file);
        out.flush();
        if (!out)
          throw std::runtime_error("train.output_dir = \"" + config.train.output_dir + "\": cannot write " +
                                   file.string());
        std::printf("wrote %s\n", file.string().c_str());
        return 0;
      }
      const parallel::MemoryPlan plan = plan_on_meta ? parallel::plan_memory_on_meta(config, world_size)
                                                     : parallel::plan_memory(config, world_size);
      if (rt.rank() == 0) {
        const std::filesystem::path dir(config.train.output_dir);
        std::string json = parallel::memory_plan_json(plan);
        if (!hardware_file.empty()) {
          const parallel::HardwareDescription hw = parallel::load_hardware(hardware_file);
          const parallel::plan::StepPlan time =
              parallel::plan::plan_step(config, world_size, hw, ranks_per_node, cost_options);
          std::printf("time on %s (%s):\n%s", hw.name.c_str(), hardware_file.c_str(),
                      parallel::plan::step_plan_table(time).c_str());
          if (breakdown) std::printf("%s", parallel::plan::step_plan_breakdown(time).c_str());
          // One object: the time fields first, then the memory plan's.
          std::string fields = parallel::plan::step_plan_json(time);
          fields.erase(fields.find_last_of('}'));
          json = fields + ",\n" + json.substr(json.find('{') + 1);
        }
        std::ofstream out(dir / "plan.json");
        out << json;
        out.flush();
        if (!out)
          throw std::runtime_error("train.output_dir = \"" + config.train.output_dir + "\": cannot write " +
                                   (dir / "plan.json").string());
        std::printf("%s", parallel::memory_plan_table(plan).c_str());
        // Planned for another world size: how many ranks will share a node is not known here.
        const parallel::MemoryLimit limit =
            parallel::host_memory_limit(plan_world_size > 0 ? 1 : rt.launch().local_size);
        if (limit.bytes > 0 && plan_world_size > 0)
          std::printf("this node: %.2f GiB (%s), to be shared by the ranks placed on it\n",
                      static_cast<double>(limit.bytes) / (1 << 30), limit.source.c_str());
        else if (limit.bytes > 0)
          std::printf("limit: %.2f GiB per rank (%s): %s\n", static_cast<double>(limit.bytes) / (1 << 30),
                      limit.source.c_str(),
                      plan.largest().peak_bytes <= limit.bytes ? "fits" : "does NOT fit");
        std::printf("wrote %s\n", (dir / "plan.json").string().c_str());
      }
      return 0;
    }
    parallel::Trainer trainer(config, rt.world(), {.check_memory = !no_memory_check});
    trainer.train();
    return 0;
  });
}
