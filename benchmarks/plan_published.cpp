// The planner against Megatron-LM's published A100 weak scaling (Narayanan et al., "Efficient
// Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC21, arXiv:2104.04473,
// Table 1): GPT 1.7B to 1T on 32 to 3,072 A100s (Selene: DGX A100 80GB nodes, 8 x HDR), with the
// paper's tensor- and pipeline-parallel sizes and batch sizes, sequence 2048, vocabulary 51,200,
// fp16 mixed precision and full activation recompute.
//
//   build/bin/plan_published [--hardware configs/hardware/dgx_a100_80gb.yaml] [--rows 0,1,...]
//                            [--attention unfused|fused] [--dropout 0.1] [--breakdown] [--search [--threads
//                            N]]
//
// The system planned is Megatron-LM's of 2021 as far as the planner can state it: attention unfused
// (the score matrix materialised; CostOptions, step_cost.hpp) and dropout 0.1 (its defaults for
// hidden and attention dropout), no sequence parallelism. --search searches each row's model and
// GPU count from the published layout (the search's warm start).
//
// The paper does not state the micro-batch size or the interleaving of every row; as the issue
// allows, the planner tries micro-batches 1, 2 and 4 (those that divide the batch) and keeps the
// fastest prediction. TFLOP/s per GPU are counted as the paper counts them (its equation 3, which
// includes the recompute forward): 96 B s l h^2 (1 + s / 6h + V / 16 l h) per step.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <sstream>
#include <vector>

#include "parallel/config.hpp"
#include "parallel/hardware.hpp"
#include "parallel/layout_search.hpp"
#include "parallel/step_cost.hpp"

namespace {

struct Row {
  const char* params;
  int heads, hidden, layers, tp, pp, gpus, batch;
  double published_tflops;  // achieved teraFLOP/s per GPU, Table 1
};

// Narayanan et al. SC21, Table 1 (weak scaling on Selene).
constexpr Row kTable1[] = {
    {"1.7B", 24, 2304, 24, 1, 1, 32, 512, 137},          {"3.6B", 32, 3072, 30, 2, 1, 64, 512, 138},
    {"7.5B", 32, 4096, 36, 4, 1, 128, 512, 142},         {"18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135},
    {"39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138},       {"76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140},
    {"145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148},    {"310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155},
    {"529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163}, {"1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 163},
};

// The row's model and published layout with micro-batch `mb`.
std::string row_yaml(const Row& r, int mb, double dropout) {
  return fmt::format(R"(
model:
  num_layers: {}
  hidden_size: {}
  num_attention_heads: {}
  vocab_size: 51200
  seq_length: 2048
  dropout: {}
parallel: {{tensor: {}, pipeline: {}}}
train: {{micro_batch_size: {}, global_batch_size: {}, precision: fp16, recompute: full, steps: 1}}
data: {{path: synthetic}}
)",
                     r.layers, r.hidden, r.heads, dropout, r.tp, r.pp, mb, r.batch);
}

// Compute seconds of one representative's step by op (replayed micro-batches counted), the largest
// first: where the predicted time goes.
std::string op_breakdown(const parallel::Config& c, int world_size, int rank,
                         const parallel::plan::CostModel& cost) {
  using parallel::TimelineEntry;
  const parallel::plan::RankTrace t = parallel::plan::trace_step(c, world_size, rank);
  std::vector<double> times(t.timeline.size() + 1, 0.0);  // difference array of replay coverage
  for (const TimelineEntry& e : t.timeline)
    if (e.kind == TimelineEntry::Kind::Replay) {
      times[static_cast<std::size_t>(e.replay_begin)] += 1;
      times[static_cast<std::size_t>(e.replay_end)] -= 1;
    }
  std::map<std::string, double> seconds;
  double total = 0, repeat = 1;
  for (std::size_t i = 0; i < t.timeline.size(); ++i) {
    repeat += times[i];
    const TimelineEntry& e = t.timeline[i];
    if (e.kind != TimelineEntry::Kind::Op) continue;
    const double s = repeat * cost.op_seconds(e.op);
    seconds[e.op.op] += s;
    total += s;
  }
  std::vector<std::pair<double, std::string>> sorted;
  for (const auto& [op, s] : seconds) sorted.emplace_back(s, op);
  std::sort(sorted.rbegin(), sorted.rend());
  std::string out = fmt::format("rank {} compute {:.3f} s:", rank, total);
  for (const auto& [s, op] : sorted)
    if (s > 0.005 * total) out += fmt::format(" {} {:.3f} ({:.1f} %),", op, s, 100 * s / total);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Predicted vs published TFLOP/s per GPU for Megatron-LM's SC21 Table 1"};
  std::string hardware = "configs/hardware/dgx_a100_80gb.yaml", rows_arg;
  std::vector<int> micro_batches{1, 2, 4};
  app.add_option("--hardware", hardware, "hardware description")->check(CLI::ExistingFile);
  app.add_option("--rows", rows_arg, "comma-separated row indices (default: all)");
  app.add_option("--micro-batches", micro_batches, "micro-batch sizes to try");
  bool search = false, breakdown = false;
  int search_threads = 0;
  app.add_option("--threads", search_threads,
                 "with --search: threads that plan layouts at once (0: the machine's hardware threads; the "
                 "result is the same for any number)")
      ->check(CLI::Range(0, 256));
  int stage_layer_shift = parallel::plan::SearchOptions{}.stage_layer_shift;
  app.add_option("--stage-layer-shift", stage_layer_shift,
                 "with --search: how many layers the first and last pipeline stage may hold fewer or more "
                 "than the others (0: the even split only)")
      ->check(CLI::Range(0, 64));
  std::string attention = "unfused";
  double dropout = 0.1;
  app.add_option("--attention", attention,
                 "attention kernel of the system planned: unfused (Megatron-LM 2021: the score matrix "
                 "materialised) or fused (this library's)")
      ->check(CLI::IsMember({"fused", "unfused"}));
  app.add_option("--dropout", dropout,
                 "hidden and attention dropout (Megatron-LM's defaults, 0.1 both; the model's dropout and "
                 "the unfused attention's)");
  app.add_flag("--breakdown", breakdown,
               "after each row, the first stage's compute seconds by op (where the predicted time goes)");
  app.add_flag(
      "--search", search,
      "also search each row's layouts (layout_search.hpp) and print the fastest, its step time against "
      "the published layout's prediction, and the search's time");
  CLI11_PARSE(app, argc, argv);
  const parallel::HardwareDescription hw = parallel::load_hardware(hardware);
  const parallel::plan::CostOptions options{.attention = attention == "fused"
                                                             ? parallel::plan::AttentionKernel::Fused
                                                             : parallel::plan::AttentionKernel::Unfused,
                                            .attention_dropout = dropout};
  std::vector<int> rows;
  if (rows_arg.empty()) {
    for (int i = 0; i < static_cast<int>(std::size(kTable1)); ++i) rows.push_back(i);
  } else {
    std::stringstream ss(rows_arg);
    std::string item;
    while (std::getline(ss, item, ',')) rows.push_back(std::stoi(item));
  }
  std::printf("hardware: %s (%s); attention %s, dropout %g\n\n", hw.name.c_str(), hardware.c_str(),
              attention.c_str(), dropout);
  std::printf(
      "| model | GPUs | tp | pp | dp | batch | micro-batch | published TFLOP/s/GPU | predicted | predicted / "
      "published | step (s) | bubble | exposed tp / dp / pp (s) | plan time (s) |%s\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|%s\n",
      search ? " searched: fastest layout | its step (s) | searched / published-layout step | enumerated / "
               "simulated / memory plans | search time (s) |"
             : "",
      search ? "---|---|---|---|---|" : "");
  std::vector<double> errors;
  for (int i : rows) {
    const Row& r = kTable1[i];
    const int dp = r.gpus / (r.tp * r.pp);
    double best_tflops = 0;
    parallel::plan::StepPlan best;
    int best_mb = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int mb : micro_batches) {
      if ((r.batch / dp) % mb != 0) continue;
      const parallel::Config c = parallel::parse_config(row_yaml(r, mb, dropout), {}, r.gpus);
      parallel::plan::StepPlan p = parallel::plan::plan_step(c, r.gpus, hw, 0, options);
      const double B = r.batch, s = 2048, l = r.layers, h = r.hidden, V = 51200;
      const double flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
      const double tflops = flops / (p.sim.step_time_s * r.gpus) / 1e12;
      if (tflops > best_tflops) {
        best_tflops = tflops;
        best = std::move(p);
        best_mb = mb;
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double ratio = best_tflops / r.published_tflops;
    errors.push_back(std::abs(ratio - 1));
    std::string searched;
    if (search) {
      // From the published layout (planned first: the search's warm start), over every layout.
      const parallel::Config c = parallel::parse_config(row_yaml(r, best_mb, dropout), {}, r.gpus);
      const std::clock_t cpu_start = std::clock();
      const parallel::plan::SearchResult found = parallel::plan::search_layouts(
          c, r.gpus, hw,
          {.top_k = 1, .cost = options, .stage_layer_shift = stage_layer_shift, .threads = search_threads});
      const double cpu = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
      if (found.top.empty()) {
        searched = fmt::format(" none fits | | | | {:.1f} / {:.1f} |", cpu, found.seconds);
      } else {
        const auto& best_layout = found.top.front();
        searched = fmt::format(" {} | {:.2f} | {:.3f} | {} / {} / {} | {:.1f} / {:.1f} |", best_layout.layout,
                               best_layout.step_time_s, best_layout.step_time_s / best.sim.step_time_s,
                               found.enumerated, found.simulated, found.memory_plans, cpu, found.seconds);
      }
    }
    std::printf(
        "| %s | %d | %d | %d | %d | %d | %d | %.0f | %.1f | %.3f | %.2f | %.1f %% | %.2f / %.2f / %.2f | "
        "%.1f |%s\n",
        r.params, r.gpus, r.tp, r.pp, dp, r.batch, best_mb, r.published_tflops, best_tflops, ratio,
        best.sim.step_time_s, 100 * best.sim.bubble_fraction, best.sim.exposed_s.at("tp"),
        best.sim.exposed_s.at("dp"), best.sim.exposed_s.at("pp"), seconds, searched.c_str());
    if (breakdown) {
      const parallel::Config c = parallel::parse_config(row_yaml(r, best_mb, dropout), {}, r.gpus);
      const parallel::plan::CostModel cost(hw, r.gpus, 0, options);
      std::printf("    %s\n", op_breakdown(c, r.gpus, 0, cost).c_str());
    }
    std::fflush(stdout);
  }
  std::vector<double> sorted = errors;
  std::sort(sorted.begin(), sorted.end());
  if (!sorted.empty())
    std::printf("\n%zu rows: median |error| %.1f %%, worst %.1f %%\n", sorted.size(),
                100 * (sorted.size() % 2 ? sorted[sorted.size() / 2]
                                         : (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]) / 2),
                100 * sorted.back());
  return 0;
}
