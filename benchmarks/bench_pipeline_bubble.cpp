// The measured pipeline bubble: per-rank busy time (inside forward/backward) and idle time (blocked
// in receives) of 1F1B, zero-bubble ZB-H1, interleaved 1F1B (v = 2), ZB-V and DualPipe-V on a small
// GPT, next to the theory (p-1)/m, (p-1)/(3m) (ZB-H1 with F = B = W), (p-1)/(v*m) and (p-1)/(6m)
// (the V schedules with F = B = W: the ramp alone) (docs/pipeline.md), and each rank's allocator
// peak during the step (activation memory).
//
//   OMP_NUM_THREADS=1 mpirun -np 4 --oversubscribe ./bin/bench_pipeline_bubble [--hidden 256]
//       [--seq 128] [--layers-per-rank 4] [--steps 2] [--micro-batches 4,8,16]
//       [--schedules 1f1b,zb-h1,interleaved,zb-v,dualpipe-v]
//
// A plain main rather than Google Benchmark: every rank must run the same steps in lockstep, and the
// quantity of interest is a ratio per rank, not a time per iteration. Pipeline size = world size.
// Rank 0 prints one row per (schedule, m, rank), averaged over the timed steps (one untimed step
// first), and a summary row with the mean over ranks (peak_MB: the largest rank's). Two measured bubbles:
//   idle/busy      time blocked in receives over compute time;
//   (span-b)/b     the theory's definition: the step's makespan (slowest rank, all ranks start
//                  together after a barrier) minus this rank's compute, over its compute; it also
//                  counts the time a rank has finished and the pipeline has not.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "parallel/gpt_model.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/pipeline.hpp"
#include "parallel/runtime.hpp"

namespace parallel {
namespace {

struct Args {
  int hidden = 256, seq = 128, layers_per_rank = 4, steps = 3, micro_batch_size = 2;
  std::vector<int> micro_batches{4, 8, 16};
  std::vector<std::string> schedules{"1f1b", "zb-h1", "interleaved", "zb-v", "dualpipe-v"};
};

std::vector<std::string> split_list(const std::string& value) {
  std::vector<std::string> out;
  std::stringstream ss(value);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--hidden")
      a.hidden = std::stoi(value);
    else if (key == "--seq")
      a.seq = std::stoi(value);
    else if (key == "--layers-per-rank")
      a.layers_per_rank = std::stoi(value);
    else if (key == "--steps")
      a.steps = std::stoi(value);
    else if (key == "--micro-batches") {
      a.micro_batches.clear();
      for (const std::string& item : split_list(value)) a.micro_batches.push_back(std::stoi(item));
    } else if (key == "--schedules") {
      a.schedules = split_list(value);
    } else {
      PARALLEL_FAIL("bench_pipeline_bubble: unknown argument {}", key);
    }
  }
  return a;
}

Tensor make_ids(int64_t b, int64_t s, int vocab, int micro_batch, int shift) {
  std::vector<int32_t> ids(static_cast<std::size_t>(b * s));
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int32_t>((i * 97 + 31 * micro_batch + 13 * shift) % static_cast<std::size_t>(vocab));
  return Tensor::from_vector(ids, {b, s});
}

// Per-rank means over the timed steps: busy, idle, total seconds.
struct Row {
  double busy = 0, idle = 0, total = 0;
  double peak = 0;  // bytes allocated during the step above its start, the largest over the steps
};

// Runs `steps + 1` steps of one (v, m) and returns every rank's row (on every rank).
std::vector<Row> run_case(ParallelState& state, const Args& a, int v, int m, PipelineSchedule kind) {
  const int p = state.pp().size(), r = state.coord().pp;
  ModelConfig c;
  c.num_layers = a.layers_per_rank * p;
  c.hidden_size = a.hidden;
  c.num_attention_heads = 4;
  c.vocab_size = 1024;
  c.seq_length = a.seq;
  std::vector<std::unique_ptr<GPTModel>> chunks;
  std::vector<GPTModel*> ptrs;
  for (const ChunkSpec& spec :
       pipeline::stage_layout({c.num_layers, p, v, 0, 0, pipeline::placement_of(kind)}, r)) {
    chunks.push_back(std::make_unique<GPTModel>(c, spec, GPTModel::Options{}, state.tp()));
    ptrs.push_back(chunks.back().get());
  }
  pipeline::ChunkPipelineModel model(ptrs);
  pipeline::PipelineExecutor executor(state.pp(),
                                      {.micro_batches = m,
                                       .virtual_stages = v,
                                       .activation_shape = {c.seq_length, a.micro_batch_size, c.hidden_size},
                                       .kind = kind});
  const Tensor loss_scale = Tensor::full({1}, 1.0 / (m * a.micro_batch_size * c.seq_length), DType::F32);
  auto data = [&](int mb) {
    return pipeline::MicroBatch{make_ids(a.micro_batch_size, c.seq_length, c.vocab_size, mb, 0),
                                make_ids(a.micro_batch_size, c.seq_length, c.vocab_size, mb, 1)};
  };
  Row mine;
  for (int step = 0; step <= a.steps; ++step) {
    zero_grads(model.parameters());
    model.start_step(data, loss_scale);
    state.pp().barrier();  // every rank starts the step together, as after an optimizer step
    const pipeline::StepStats s = executor.run(model);
    if (step == 0) continue;  // first touch of buffers, connection set-up
    mine.busy += s.busy_seconds / a.steps;
    mine.idle += s.idle_seconds / a.steps;
    mine.total += s.total_seconds / a.steps;
    mine.peak = std::max(mine.peak, static_cast<double>(s.peak_allocated_bytes - s.start_allocated_bytes));
  }
  // fp32 keeps microsecond resolution for steps of minutes: plenty for a ratio.
  Tensor local =
      Tensor::from_vector(std::vector<float>{static_cast<float>(mine.busy), static_cast<float>(mine.idle),
                                             static_cast<float>(mine.total), static_cast<float>(mine.peak)},
                          {4});
  Tensor all = Tensor::empty({4 * p}, DType::F32);
  state.pp().all_gather(local, all);
  const float* v4 = all.data<float>();
  std::vector<Row> rows(static_cast<std::size_t>(p));
  for (int i = 0; i < p; ++i)
    rows[static_cast<std::size_t>(i)] = {v4[4 * i], v4[4 * i + 1], v4[4 * i + 2], v4[4 * i + 3]};
  return rows;
}

int bench(Runtime& rt, int argc, char** argv) {
  const Args a = parse(argc, argv);
  const int p = rt.world_size();
  ParallelSizes sizes;
  sizes.pipeline = p;
  ParallelState state(rt.world(), RankGrid(sizes));
  const bool print = rt.rank() == 0;
  if (print) {
    std::printf(
        "pipeline bubble: p=%d, GPT hidden %d, heads 4, seq %d, micro-batch %d, %d layers per rank, "
        "%d timed steps (+1 warm-up), OMP_NUM_THREADS=%s\n",
        p, a.hidden, a.seq, a.micro_batch_size, a.layers_per_rank, a.steps,
        std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "unset");
    std::printf("%-12s %3s %5s %10s %10s %10s %10s %11s %8s %9s\n", "schedule", "m", "rank", "busy_ms",
                "idle_ms", "span_ms", "idle/busy", "(span-b)/b", "theory", "peak_MB");
  }
  struct Schedule {
    const char* name;
    int v;
    PipelineSchedule kind;
    double theory_factor;  // bubble over (p-1)/(v*m)
  };
  for (const Schedule& sch : {Schedule{"1F1B", 1, PipelineSchedule::OneFOneB, 1.0},
                              Schedule{"zb-h1", 1, PipelineSchedule::ZeroBubbleH1, 1.0 / 3.0},
                              Schedule{"interleaved2", 2, PipelineSchedule::Interleaved, 1.0},
                              Schedule{"zb-v", 2, PipelineSchedule::ZeroBubbleV, 1.0 / 3.0},
                              Schedule{"dualpipe-v", 2, PipelineSchedule::DualPipeV, 1.0 / 3.0}}) {
    const int v = sch.v;
    if (std::find(a.schedules.begin(), a.schedules.end(), pipeline::schedule_name(sch.kind)) ==
        a.schedules.end())
      continue;
    if (p < 2 && sch.kind != PipelineSchedule::OneFOneB) continue;
    const bool v_placement = pipeline::placement_of(sch.kind) == pipeline::Placement::V;
    for (int m : a.micro_batches) {
      if (v_placement ? m < 2 * p : v > 1 && m % p != 0) continue;
      const std::vector<Row> rows = run_case(state, a, v, m, sch.kind);
      const double theory = sch.theory_factor * static_cast<double>(p - 1) / (v * m);
      const char* name = sch.name;
      double span = 0, busy = 0, idle = 0, peak = 0;
      for (const Row& row : rows) span = std::max(span, row.total);
      for (int r = 0; r < p; ++r) {
        const Row& row = rows[static_cast<std::size_t>(r)];
        busy += row.busy / p;
        idle += row.idle / p;
        peak = std::max(peak, row.peak);
        if (print)
          std::printf("%-12s %3d %5d %10.1f %10.1f %10.1f %10.3f %11.3f %8.3f %9.2f\n", name, m, r,
                      1e3 * row.busy, 1e3 * row.idle, 1e3 * span, row.idle / row.busy,
                      (span - row.busy) / row.busy, theory, row.peak / 1e6);
      }
      if (print)
        std::printf("%-12s %3d %5s %10.1f %10.1f %10.1f %10.3f %11.3f %8.3f %9.2f\n", name, m, "mean",
                    1e3 * busy, 1e3 * idle, 1e3 * span, idle / busy, (span - busy) / busy, theory,
                    peak / 1e6);
    }
  }
  return 0;
}

}  // namespace
}  // namespace parallel

int main(int argc, char** argv) {
  return parallel::run_main(argc, argv,
                            [&](parallel::Runtime& rt) { return parallel::bench(rt, argc, argv); });
}
