#include "parallel/trainer.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

#include "gemm/gemm_rule.hpp"
#include "parallel/allocator.hpp"
#include "parallel/blended_dataset.hpp"
#include "parallel/checkpoint.hpp"
#include "parallel/context_parallel.hpp"
#include "parallel/conversion_passes.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/finalize_grads.hpp"
#include "parallel/gpt_dataset.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/hardware_peak.hpp"
#include "parallel/launch.hpp"
#include "parallel/log.hpp"
#include "parallel/lr_schedule.hpp"
#include "parallel/memory_plan.hpp"
#include "parallel/node_map.hpp"
#include "parallel/op_times.hpp"
#include "parallel/ops.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/pipeline.hpp"
#include "parallel/precision.hpp"
#include "parallel/preflight.hpp"
#include "parallel/signal_handler.hpp"
#include "parallel/tensorboard.hpp"
#include "parallel/train_state.hpp"
#include "parallel/train_step.hpp"
#include "parallel/training_guard.hpp"

namespace parallel {

namespace {

using Clock = std::chrono::steady_clock;

// The measured counterpart of `pretrain_gpt --plan --breakdown` (PARALLEL_OP_TIMES=1, op_times.hpp):
// per step, each op's calls and wall time, the communication waits, and the rest of the timed step
// (allocation outside the ops, views, host loops, the trainer's own work), as means over the steps
// after the first `warmup_steps` (benchmarks/plan_validation.sh's default warm-up).
struct OpTimesReport {
  static constexpr int64_t warmup_steps = 3;
  bool started = false;
  int64_t steps = 0;
  double step_seconds = 0, wait_seconds = 0;

  void start() {
    ops::reset_op_times();
    started = true;
  }
  void add_step(double seconds, double waited) {
    if (!started) return;
    ++steps;
    step_seconds += seconds;
    wait_seconds += waited;
  }
  void print(int rank) const {
    if (!started || steps == 0) return;
    const auto times = ops::op_times();
    std::vector<std::pair<std::string, ops::OpTime>> rows(times.begin(), times.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
    const double n = static_cast<double>(steps);
    double ops_seconds = 0;
    int64_t calls = 0;
    std::string out = fmt::format("op times, rank {}, mean of {} steps (us per step):\n", rank, steps);
    out += fmt::format("{:>28} {:>8} {:>10} {:>8}\n", "op", "calls", "us", "us/call");
    for (const auto& [op, t] : rows) {
      ops_seconds += t.seconds;
      calls += t.calls;
      out += fmt::format("{:>28} {:>8.1f} {:>10.1f} {:>8.2f}\n", op, static_cast<double>(t.calls) / n,
                         t.seconds / n * 1e6, t.seconds / static_cast<double>(t.calls) * 1e6);
    }
    out +=
        fmt::format("step {:.1f} us = ops {:.1f} ({:.1f} calls) + communication waits {:.1f} + rest {:.1f}\n",
                    step_seconds / n * 1e6, ops_seconds / n * 1e6, static_cast<double>(calls) / n,
                    wait_seconds / n * 1e6, (step_seconds - ops_seconds - wait_seconds) / n * 1e6);
    std::fputs(out.c_str(), stderr);
  }
};

// The process's minor page faults so far: a fault inside a step after the first means the step
// touched a page it had not touched before (a buffer newly mapped, or handed back to the OS and
// mapped again).
long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Dense peak of the GPUs we know, per precision: fp32 runs use fp32 CUDA cores (no TF32), bf16 and
// fp16 the tensor cores (the figures NVIDIA publishes for the SXM parts, without sparsity).
double known_gpu_peak_flops(const std::string& name, Precision precision) {
  const bool low = precision != Precision::FP32;
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos)
    return low ? 989e12 : 67e12;
  if (name.find("A100") != std::string::npos) return low ? 312e12 : 19.5e12;
  return 0.0;  // unknown: MFU is reported as 0 unless train.peak_tflops is set
}

// The peak MFU divides by, and where it comes from (for the start-up log line). A CPU rank is one
// process running omp_get_max_threads() threads: its peak is the process total measured for the run's
// precision, shared with the other ranks on the machine when they are not bound to cores
// (hardware_peak.hpp; PARALLEL_CPU_PEAK_GFLOPS overrides it).
struct RankPeak {
  double flops = 0.0;
  std::string source;
};

// The run's dominant GEMM timed once at start-up on a CPU: the MLP's first product over one
// micro-batch, [micro_batch * seq, h] @ [ffn, h]^T (unsplit, as one rank would run it without tensor
// parallelism) in the compute dtype, the fastest of three calls after a warm-up (oneDNN's primitive
// creation). Its fraction of the rank's peak for that precision says how close the step's main
// kernel runs to what this CPU can do, per dtype (issue 28); a few tens of ms at GPT-2 size.
struct GemmProbe {
  int64_t m = 0, n = 0, k = 0;
  double flops = 0.0;  // per second
};

GemmProbe probe_cpu_gemm(const ModelConfig& model, int micro_batch, Precision precision) {
  GemmProbe p;
  p.m = static_cast<int64_t>(micro_batch) * model.seq_length;
  p.k = model.hidden_size;
  p.n = model.ffn_hidden_size > 0 ? model.ffn_hidden_size : 4 * p.k;
  const DType dt = compute_dtype(precision);
  const Tensor a = Tensor::full({p.m, p.k}, 0.5, dt), b = Tensor::full({p.n, p.k}, 0.25, dt);
  Tensor out = Tensor::zeros({p.m, p.n}, dt);
  ops::gemm(a, false, b, true, out);
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto start = Clock::now();
    ops::gemm(a, false, b, true, out);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  p.flops = 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k) / best;
  return p;
}

RankPeak peak_flops_per_rank(const TrainConfig& train, Device device) {
  if (train.peak_tflops > 0) return {train.peak_tflops * 1e12, "train.peak_tflops"};
  if (device.is_cuda()) {
    const std::string name = device_name(device);
    return {known_gpu_peak_flops(name, train.precision), name + " (published dense peak)"};
  }
  const int local_ranks = discover_launch_from_environment().local_size;
  const double rank = cpu_peak_flops_per_rank(train.precision, local_ranks);
  std::string source = cpu_peak_source(train.precision);
  if (rank < cpu_peak_flops(train.precision))
    source += fmt::format(", the CPUs shared by {} unbound ranks", local_ranks);
  return {rank, source};
}

// One GPU per rank, chosen from the rank's index on its node (local_rank mod the visible GPUs),
// as torchrun / Megatron do. A missing GPU is a configuration problem, reported alike on all ranks.
Device select_device(const TrainConfig& train) {
  if (train.device == DeviceKind::CPU) return Device::cpu();
  const int count = cuda_device_count();
  if (count == 0)
    throw ConfigError(
        "config: train.device = cuda, but no GPU is usable here (a build without the CUDA backend, or no "
        "device "
        "visible); use train.device: cpu");
  return Device::cuda(discover_launch_from_environment().local_rank % count);
}

// PARALLEL_GEMM=timed picks each GEMM shape's implementation by timing it in this process
// (gemm/gemm_rule.hpp): ranks could choose differently and compute differently. Refused with more
// than one rank; the default (auto) is a fixed rule that every rank applies alike.
void refuse_timed_gemm(Device device, int world_size) {
  if (!device.is_cuda()) return;
  if (!kernels::gemm_mode_allowed(kernels::parse_gemm_mode(std::getenv("PARALLEL_GEMM")), world_size))
    throw ConfigError(
        fmt::format("PARALLEL_GEMM=timed on {} ranks: timing per process lets ranks choose different GEMM "
                    "implementations; use auto (the default, a fixed rule), ours or cublaslt",
                    world_size));
}

// What the largest rank may use, the same figure on every rank (the smallest any rank sees), so that
// all refuse or none does.
// Where the groups lie on the nodes (node_map.hpp), from MPI's own node map: logged when the job
// spans several nodes, and a group that parallel.node_local names but that crosses nodes refuses
// the run on every rank alike (they share the map). A launcher whose local rank or size disagrees
// with MPI's (the GPU choice and the memory limit's share follow the launcher's) is warned about.
void check_nodes(const Config& c, MpiCommunicator& world, const RankGrid& grid) {
  const LaunchInfo launch = discover_launch_from_environment();
  const NodeMap nodes = discover_nodes(world, launch.host);
  const auto placed = place_groups(nodes, grid, c.optimizer.sharding_group_size);
  std::vector<std::string> inside, across;
  for (const GroupPlacement& g : placed)
    (g.inside_node ? inside : across).push_back(fmt::format("{} ({})", g.name, g.size));
  if (nodes.num_nodes() > 1)
    progress().info("nodes: {}; inside a node: {}; across nodes: {}", nodes.describe(),
                    inside.empty() ? "none" : fmt::format("{}", fmt::join(inside, ", ")),
                    across.empty() ? "none" : fmt::format("{}", fmt::join(across, ", ")));
  const int local_rank = nodes.local_rank(world.rank());
  const auto local_size = static_cast<int>(nodes.ranks_on(nodes.node_of[world.rank()]).size());
  if (launch.source != "single process" &&
      (launch.local_rank != local_rank || launch.local_size != local_size))
    logger().warn(
        "the launcher ({}) says local rank {} of {}, MPI's node map {} of {} on {}; the GPU choice and "
        "the memory limit follow the launcher's",
        launch.source, launch.local_rank, launch.local_size, local_rank, local_size,
        nodes.hosts[nodes.node_of[world.rank()]]);
  for (const std::string& name : split_group_list(c.parallel.node_local))
    for (int r = 0; r < grid.world_size(); ++r) {
      const auto members = group_members(grid, name, r, c.optimizer.sharding_group_size);
      if (nodes.inside_one_node(members)) continue;
      throw ConfigError(
          fmt::format("config: parallel.node_local = {}: group {} (world ranks {}) spans nodes ({})",
                      c.parallel.node_local, name, fmt::join(members, ","), nodes.describe()));
    }
}

MemoryLimit agreed_memory_limit(Communicator& world, MemoryLimit limit) {
  Tensor t = Tensor::full({1}, 0.0, DType::I64);
  t.data<int64_t>()[0] = limit.bytes > 0 ? limit.bytes : std::numeric_limits<int64_t>::max();
  world.all_reduce(t, ReduceOp::Min);
  const int64_t agreed = t.data<int64_t>()[0];
  if (agreed == std::numeric_limits<int64_t>::max()) return {};
  if (agreed != limit.bytes) limit.source += "; the smallest figure over the ranks";
  limit.bytes = agreed;
  return limit;
}

// What a DDP actually shards (tests read the log lines), not what the config asked for.
const char* sharding_name(DataParallel& ddp) {
  const ParamAndGradBuffer& buf = ddp.buffer();
  return buf.params_sharded()                  ? "optim_grads_params"
         : buf.grads_sharded()                 ? "optim_grads"
         : ddp.options().distributed_optimizer ? "optim"
                                               : "none";
}

// Fault injection for the guards' tests: PARALLEL_INJECT_LOSS_SCALE="STEP:FACTOR[:RANK]" multiplies
// step STEP's loss (1-based, as logged) by FACTOR on rank RANK (every rank without one): its local
// loss sum and the gradient the backward starts from, so every gradient of that rank scales too.
// FACTOR may be nan or inf.
struct FaultInjection {
  int64_t step = 0;  // 0: none
  double factor = 1.0;
  int rank = -1;  // -1: every rank
  double factor_at(int64_t at_step, int at_rank) const {
    return step == at_step && (rank < 0 || rank == at_rank) ? factor : 1.0;
  }
  static FaultInjection from_environment() {
    FaultInjection f;
    const char* text = std::getenv("PARALLEL_INJECT_LOSS_SCALE");
    if (text == nullptr || *text == '\0') return f;
    char* end = nullptr;
    f.step = std::strtoll(text, &end, 10);
    bool ok = end != text && *end == ':' && f.step >= 1;
    if (ok) {
      const char* p = end + 1;
      f.factor = std::strtod(p, &end);
      ok = end != p;
      if (ok && *end == ':') {
        p = end + 1;
        f.rank = static_cast<int>(std::strtol(p, &end, 10));
        ok = end != p && f.rank >= 0;
      }
      ok = ok && *end == '\0';
    }
    if (!ok)
      throw ConfigError(
          fmt::format("PARALLEL_INJECT_LOSS_SCALE = \"{}\": expected STEP:FACTOR[:RANK] (STEP >= 1)", text));
    progress().warn("fault injection: the loss of step {} is multiplied by {} on {}", f.step, f.factor,
                    f.rank < 0 ? std::string("every rank") : fmt::format("rank {}", f.rank));
    return f;
  }
};

// Fault injection for the silent-data-corruption check's tests: PARALLEL_INJECT_BITFLIP="STEP:RANK"
// flips one mantissa bit of one element of rank RANK's gradients (before any reduction) in the first
// of the two runs of step STEP (1-based; the only run when the step is not checked).
struct BitFlipInjection {
  int64_t step = 0;  // 0: none
  int rank = 0;
  static BitFlipInjection from_environment() {
    BitFlipInjection f;
    const char* text = std::getenv("PARALLEL_INJECT_BITFLIP");
    if (text == nullptr || *text == '\0') return f;
    char* end = nullptr;
    f.step = std::strtoll(text, &end, 10);
    bool ok = end != text && *end == ':' && f.step >= 1;
    if (ok) {
      const char* p = end + 1;
      f.rank = static_cast<int>(std::strtol(p, &end, 10));
      ok = end != p && *end == '\0' && f.rank >= 0;
    }
    if (!ok)
      throw ConfigError(
          fmt::format("PARALLEL_INJECT_BITFLIP = \"{}\": expected STEP:RANK (STEP >= 1)", text));
    progress().warn("fault injection: one bit of rank {}'s gradients is flipped in the first run of step {}",
                    f.rank, f.step);
    return f;
  }
};

}  // namespace

struct Trainer::Impl {
  Config cfg;
  Communicator& world;  // the base interface: its calls carry the default arguments
  Device device;        // where this rank computes
  // The step: groups, model chunks, DDP, optimizer and executors (train_step.hpp).
  std::unique_ptr<TrainStep> train_step;
  ParallelState* state = nullptr;  // train_step's
  std::optional<LrSchedule> lr;
  std::optional<BlendedDataset> train_data, valid_data;
  std::unique_ptr<MetricsWriter> metrics;  // rank 0 only
  // Rank 0, when train.tensorboard_dir is set: the same scalars as metrics, for TensorBoard.
  std::unique_ptr<TensorBoardWriter> tensorboard;
  // Installed when start-up is over: until then SIGTERM keeps its default action and ends the
  // process at once (there is nothing to save yet), instead of waiting for the first step.
  std::optional<StopFlag> stop;
  int64_t step = 0;
  double flops_per_token = 0;
  double peak_flops = 0;  // per rank, for MFU; 0: unknown (MFU reported as 0)
  std::vector<StepMetrics> history;
  std::optional<TrainingGuard> guard;
  FaultInjection fault;
  BitFlipInjection bitflip;
  // checkpoint.async: the save whose background write is in flight (at most one).
  checkpoint::AsyncSave async_save;
  // This rank's allocator high-water mark since the trainer started: the model's construction and
  // everything after (TrainStep samples it before each pipeline run, which resets the allocator's
  // peak, and after each step).
  int64_t measured_peak() const {
    return std::max(train_step->construction_peak_bytes(), train_step->peak_bytes());
  }

  Impl(const Config& config, MpiCommunicator& w)
      : cfg(config), world(w), device(select_device(config.train)) {
    refuse_timed_gemm(device, world.size());
  }

  int64_t tokens_per_batch() const {
    return static_cast<int64_t>(cfg.train.global_batch_size) * cfg.model.seq_length;
  }
  std::vector<Parameter*> parameters() const { return train_step->parameters(); }

  // The first balanced layout, in the log: how far the busiest cp rank's attention work is above
  // the mean on it and on the zigzag (cp::rank_load).
  mutable bool layout_reported = false;
  void report_layout(const cp::Layout& layout, const Tensor& docs,
                     const std::vector<cp::LayerMix>& mix) const {
    layout_reported = true;
    const auto ratio = [&](const cp::Layout& l) {
      const std::vector<double> load = cp::rank_load(l, docs, mix);
      double total = 0, top = 0;
      for (double x : load) total += x, top = std::max(top, x);
      return top * static_cast<double>(load.size()) / std::max(total, 1.0);
    };
    progress().info(
        "context layout: balanced; first micro-batch: {}, busiest cp rank {:.3f}x the mean attention work "
        "(zigzag {:.3f}x)",
        layout.is_zigzag()
            ? std::string("the zigzag kept")
            : fmt::format("{} granules of {} tokens per rank", layout.granules(0).size(), layout.granule()),
        ratio(layout), ratio(cp::Layout::zigzag(layout.seq(), layout.cp_size())));
  }

  // Micro-batch `mb` of global batch `batch` for this data-parallel rank, on this rank's device:
  // the cp ranks of a dp rank read the same samples and keep their own rows of each (their two
  // chunks, or their granules of the balanced layout).
  pipeline::MicroBatchFn data_of(const BlendedDataset& data, int64_t batch) const {
    const int dp_rank = state->coord().dp, dp_size = state->grid().sizes().data;
    const int cp_rank = state->coord().cp, cp_size = state->grid().sizes().context;
    const Device dev = device;
    const bool documents = data.options().dataset.masks_attention();
    const bool balanced = cp::uses_balanced_layout(cfg.parallel, cfg.model, documents);
    const std::vector<cp::LayerMix> mix = cp::layer_mix(cfg.model);
    return [this, &data, batch, dp_rank, dp_size, cp_rank, cp_size, dev, documents, balanced, mix](int mb) {
      MicroBatch m = data.micro_batch(batch, dp_rank, dp_size, mb);
      pipeline::MicroBatch out;
      // parallel.context_layout: the balanced layout is worked out from the documents and windows
      // of this micro-batch (the same on every cp rank: they read the same samples).
      if (balanced) {
        const Tensor docs = documents ? m.doc_start : Tensor();
        auto layout =
            std::make_shared<const cp::Layout>(cp::balanced_layout(docs, m.tokens.size(1), cp_size, mix));
        if (!layout_reported) report_layout(*layout, docs, mix);
        if (!layout->is_zigzag()) out.packed.layout = std::move(layout);
      }
      const cp::Layout* layout = out.packed.layout.get();
      const auto slice = [&](const Tensor& t) {
        return layout != nullptr ? layout->slice(t, cp_rank) : cp::slice_sequence(t, cp_rank, cp_size);
      };
      out.tokens = slice(m.tokens).to(dev);
      out.targets = slice(m.targets).to(dev);
      // Documents (data.reset_*, data.eod_mask_loss): positions stay on the host (they pick rope
      // runs and position rows), doc_start covers the whole sequence (attention's blocks index it
      // by global position), the loss mask is sliced like the targets.
      if (m.positions.defined() && data.options().dataset.resets_positions())
        out.packed.positions = slice(m.positions);
      if (m.doc_start.defined() && documents) out.packed.doc_start = m.doc_start.to(dev);
      if (m.loss_mask.defined() && data.options().dataset.masks_loss())
        out.packed.loss_mask = slice(m.loss_mask).to(dev);
      // Multi-token prediction: each depth's targets cut from the whole sequence, then sliced like
      // the targets (a cp rank's last positions predict tokens another rank holds).
      if (cfg.model.mtp_num_layers > 0) {
        const MTPTargets t = mtp_targets(m.targets, cfg.model.mtp_num_layers);
        const int64_t rows = t.targets.size(0) * t.targets.size(1), S = t.targets.size(2);
        const auto slice_depths = [&](const Tensor& x) {
          return slice(x.view({rows, S}))
              .contiguous()
              .view({t.targets.size(0), t.targets.size(1), -1})
              .to(dev);
        };
        out.packed.mtp_targets = slice_depths(t.targets);
        out.packed.mtp_mask = slice_depths(t.mask);
      }
      return out;
    };
  }

  // MoE statistics of the step (metrics.hpp, StepMetrics::moe_*): every rank's chunks hold their own
  // micro-batches' sums; tp ranks under sequence parallelism route different tokens (their counts
  // add) but computed the aux and z losses from the same all-reduced statistics (counted once).
  void moe_metrics(StepMetrics& s, int64_t global_micro_batches) {
    std::vector<float> local(2, 0.0f);
    for (const auto& chunk : train_step->chunks()) {
      const GPTModel::MoEStatistics st = chunk->moe_statistics();
      chunk->reset_moe_statistics();
      if (st.tokens_per_expert.empty()) continue;
      if (local.size() == 2) local.resize(2 + st.tokens_per_expert.size(), 0.0f);
      if (state->coord().tp == 0 && state->coord().cp == 0) {
        local[0] += static_cast<float>(st.aux_loss);
        local[1] += static_cast<float>(st.z_loss);
      }
      for (std::size_t e = 0; e < st.tokens_per_expert.size(); ++e)
        local[2 + e] += static_cast<float>(st.tokens_per_expert[e]);
    }
    local.resize(2 + static_cast<std::size_t>(cfg.model.num_experts), 0.0f);
    Tensor sums = Tensor::from_vector(local, {static_cast<int64_t>(local.size())});
    world.all_reduce(sums);
    const float* v = sums.data<float>();  // host values: no device read
    s.moe_aux_loss = v[0] / static_cast<double>(global_micro_batches);
    s.moe_z_loss = v[1] / static_cast<double>(global_micro_batches);
    s.moe_tokens_per_expert.assign(local.size() - 2, 0);
    for (std::size_t e = 0; e + 2 < local.size(); ++e) s.moe_tokens_per_expert[e] = std::llround(v[2 + e]);
    if (cfg.model.moe_router_expert_bias) expert_bias_metrics(s);
  }

  // Multi-token prediction's losses of the step: every chunk with the MTP layers holds its
  // micro-batches' sums per depth (the same on every tp rank: counted by tp rank 0), summed over
  // the world; depth k's mean is over the B (S - k) targets inside the sequences of the batch.
  void mtp_metrics(StepMetrics& s) {
    const int D = cfg.model.mtp_num_layers;
    std::vector<float> local(static_cast<std::size_t>(D), 0.0f);
    for (const auto& chunk : train_step->chunks()) {
      const Tensor& sums = chunk->mtp_loss_sums();
      if (sums.defined() && !sums.device().is_meta() && state->coord().tp == 0) {
        const std::vector<float> v = sums.to_float_vector();
        for (int k = 0; k < D; ++k) local[static_cast<std::size_t>(k)] += v[static_cast<std::size_t>(k)];
      }
      chunk->reset_mtp_loss_sums();
    }
    Tensor sums = Tensor::from_vector(local, {D});
    world.all_reduce(sums);
    const float* v = sums.data<float>();
    s.mtp_losses.clear();
    s.mtp_loss = 0.0;
    for (int k = 0; k < D; ++k) {
      const double targets = static_cast<double>(cfg.train.global_batch_size) *
                             static_cast<double>(cfg.model.seq_length - (k + 1));
      s.mtp_losses.push_back(static_cast<double>(v[k]) / targets);
      s.mtp_loss += s.mtp_losses.back() / D;
    }
  }

  // Every MoE layer's expert bias, from the ranks that hold it: the largest and the smallest value
  // of each entry over them (unheld entries are -inf / +inf), so the spread shows whether every rank
  // moved it alike.
  void expert_bias_metrics(StepMetrics& s) {
    const ModelConfig& m = cfg.model;
    const int64_t E = m.num_experts, L = m.num_layers;
    std::vector<float> hi(static_cast<std::size_t>(2 * L * E), -INFINITY);  // [max; -min]
    for (const auto& chunk : train_step->chunks()) {
      const std::vector<Parameter*> biases = chunk->router_buffers();
      std::size_t next = 0;
      for (int i = chunk->spec().first_layer; i < chunk->spec().first_layer + chunk->spec().num_layers; ++i) {
        if (!m.is_moe_layer(i)) continue;
        const std::vector<float> b = biases.at(next++)->value.to_float_vector();
        for (int64_t e = 0; e < E; ++e) {
          hi[static_cast<std::size_t>(i * E + e)] = b[static_cast<std::size_t>(e)];
          hi[static_cast<std::size_t>((L + i) * E + e)] = -b[static_cast<std::size_t>(e)];
        }
      }
    }
    Tensor t = Tensor::from_vector(hi, {2 * L * E});
    world.all_reduce(t, ReduceOp::Max);
    const float* v = t.data<float>();
    s.moe_expert_bias.clear();
    s.moe_expert_bias_spread = 0.0;
    for (int64_t i = 0; i < L; ++i) {
      if (!m.is_moe_layer(static_cast<int>(i))) continue;
      std::vector<float>& layer = s.moe_expert_bias.emplace_back();
      for (int64_t e = 0; e < E; ++e) {
        layer.push_back(v[i * E + e]);
        s.moe_expert_bias_spread =
            std::max(s.moe_expert_bias_spread, static_cast<double>(v[i * E + e]) + v[(L + i) * E + e]);
      }
    }
  }

  // data.eod_mask_loss or data.format sft: the number of tokens whose loss counts in the global batch `batch`
  // of `data`. Every rank that computes a loss (last stage, tp rank 0; every dp and cp rank) counts its own
  // micro-batches' masks (read again from the data, which is cheap and deterministic), summed over the world.
  // Otherwise every token: tokens_per_batch().
  double loss_tokens(const BlendedDataset& data, int64_t batch, int64_t micro_batches) {
    if (!data.options().dataset.masks_loss()) return static_cast<double>(tokens_per_batch());
    // An integer count: an fp32 sum stops being exact above 2^24 counted tokens per global batch.
    Tensor count = Tensor::zeros({1}, DType::I64);
    if (train_step->model().computes_loss() && state->coord().tp == 0) {
      const pipeline::MicroBatchFn fn = data_of(data, batch);
      int64_t local = 0;
      for (int64_t mb = 0; mb < micro_batches; ++mb)
        for (float x : fn(static_cast<int>(mb)).packed.loss_mask.to_float_vector())
          local += x != 0.0f ? 1 : 0;
      count.data<int64_t>()[0] = local;
    }
    world.all_reduce(count);
    return static_cast<double>(std::max<int64_t>(1, count.data<int64_t>()[0]));
  }

  // The guard stops the run at `at_step`: every rank throws the same AgreedStop (exit 3), its
  // message naming the ranks whose own loss sum (before the reduction) or gradients are not finite.
  [[noreturn]] void stop_run(int64_t at_step, const std::string& why) {
    Tensor mine = Tensor::zeros({2}, DType::F32);
    const Tensor& local_loss = train_step->local_loss();
    if (local_loss.defined() && !std::isfinite(local_loss.to_float_vector()[0])) mine.data<float>()[0] = 1;
    for (DataParallel* d : train_step->optimizer().data_parallels()) {
      Tensor& grads = d->buffer().grad_data();
      if (!grads.defined() || grads.numel() == 0) continue;
      Tensor sq = Tensor::zeros({1}, DType::F32, grads.device());
      ops::sum_of_squares_accumulate(grads, sq);
      if (!std::isfinite(sq.to_float_vector()[0])) mine.data<float>()[1] = 1;
    }
    Tensor all = Tensor::zeros({2 * world.size()}, DType::F32);
    world.all_gather(mine, all);
    std::vector<int> bad_loss, bad_grads;
    for (int r = 0; r < world.size(); ++r) {
      if (all.data<float>()[2 * r] != 0) bad_loss.push_back(r);
      if (all.data<float>()[2 * r + 1] != 0) bad_grads.push_back(r);
    }
    const auto ranks = [](const std::vector<int>& list) {
      return fmt::format("{} {}", list.size() == 1 ? "rank" : "ranks", fmt::join(list, ","));
    };
    std::string where;
    if (!bad_loss.empty()) where += fmt::format("; the loss is not finite on {}", ranks(bad_loss));
    if (!bad_grads.empty()) where += fmt::format("; the gradients are not finite on {}", ranks(bad_grads));
    finish_async_save("the run stops anyway");
    logger().flush();
    throw AgreedStop(fmt::format("train: step {}: {}{}", at_step, why, where), 3);
  }

  // At each log line: every rank's mean busy time per step (host floats, one small all-gather over
  // the world), and a warning on rank 0 naming the ranks far above the median (find_stragglers:
  // more than 2x, and at least 0.1 s above it).
  void warn_stragglers(double busy_s) {
    const int n = world.size();
    if (n < 2) return;
    Tensor mine = Tensor::full({1}, busy_s, DType::F32);
    Tensor all = Tensor::zeros({n}, DType::F32);
    world.all_gather(mine, all);
    if (world.rank() != 0) return;
    const float* p = all.data<float>();
    const std::vector<double> busy(p, p + n);
    const std::vector<int> slow = find_stragglers(busy);
    if (!slow.empty()) progress().warn("{}", straggler_warning(busy, slow));
  }

  void save(int64_t at_step) {
    TrainProgress progress;
    progress.step = at_step;
    progress.consumed_samples = at_step * cfg.train.global_batch_size;
    progress.seed = cfg.train.seed;
    progress.config_yaml = config_to_yaml(cfg);
    if (!cfg.checkpoint.async) {
      const auto start = Clock::now();
      const std::string dir =
          save_train_state(cfg.checkpoint.dir, progress, parameters(), &train_step->optimizer(), *state,
                           cfg.checkpoint.keep_last, train_step->buffers());
      parallel::progress().info("saved checkpoint {} in {:.0f} ms", dir, milliseconds_since(start));
      return;
    }
    finish_async_save("training goes on");  // at most one save in flight
    const auto start = Clock::now();
    start_save_train_state(async_save, cfg.checkpoint.dir, progress, parameters(), &train_step->optimizer(),
                           *state, cfg.checkpoint.keep_last, train_step->buffers());
    parallel::progress().info(
        "checkpoint of step {}: copied to host memory in {:.0f} ms, writing in the background", at_step,
        milliseconds_since(start));
  }

  static double milliseconds_since(Clock::time_point start) {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  }

  // What `latest` names now (for the message of a failed save).
  std::string latest_name() const {
    std::ifstream in(std::filesystem::path(cfg.checkpoint.dir) / "latest");
    std::string name;
    if (!(in >> name)) return "no checkpoint (there is none yet)";
    return name;
  }

  // Collective: publishes the pending asynchronous save (waiting for this rank's write). A failed
  // background write is logged on every rank and `latest` stays where it was; `then` says what
  // happens next ("training goes on"), or is null where nothing can make up for the lost save any
  // more (the end of training): then the failure ends the run.
  void finish_async_save(const char* then) {
    if (!async_save.pending()) return;
    const int64_t saved = async_save.step();
    const auto start = Clock::now();
    try {
      const std::string dir = async_save.finish(world);
      const std::string during = step == saved + 1 ? fmt::format(" while step {} ran", step)
                                 : step > saved    ? fmt::format(" while steps {}-{} ran", saved + 1, step)
                                                   : std::string();
      parallel::progress().info("saved checkpoint {} (written in the background{}; waited {:.0f} ms)", dir,
                                during, milliseconds_since(start));
    } catch (const Error& e) {
      const std::string message =
          fmt::format("{}; {}/latest still names {}", e.what(), cfg.checkpoint.dir, latest_name());
      if (then == nullptr) throw Error(message);
      logger().error("{}; {}", message, then);
    }
  }

  // The pending asynchronous save is published at the first step boundary where every rank's
  // write has ended (one all-reduce per step while one is pending).
  void poll_async_save() {
    if (async_save.pending() && async_save.all_written(world)) finish_async_save("training goes on");
  }

  // ---- the silent-data-corruption check (docs/configuration.md#training-guards) ----

  // Collective: every rank says whether its two runs of step `at_step` agreed; the ranks whose did
  // not are named, and train.sdc_policy applies.
  void compare_runs(int64_t at_step, const RunFingerprint& first, const RunFingerprint& second) {
    const int n = world.size();
    Tensor mine = Tensor::zeros({2}, DType::I32);
    mine.data<int32_t>()[0] = first.loss != second.loss;
    mine.data<int32_t>()[1] = first.grads != second.grads;
    Tensor all = Tensor::zeros({2 * n}, DType::I32);
    world.all_gather(mine, all);
    std::vector<int> loss, grads, suspects;
    for (int r = 0; r < n; ++r) {
      const bool l = all.data<int32_t>()[2 * r] != 0, g = all.data<int32_t>()[2 * r + 1] != 0;
      if (l) loss.push_back(r);
      if (g) grads.push_back(r);
      if (l || g) suspects.push_back(r);
    }
    if (suspects.empty()) return;
    const auto ranks = [](const std::vector<int>& list) {
      return fmt::format("{} {}", list.size() == 1 ? "rank" : "ranks", fmt::join(list, ","));
    };
    std::vector<std::string> what;
    if (!grads.empty()) what.push_back("other gradients on " + ranks(grads));
    if (!loss.empty()) what.push_back("another loss on " + ranks(loss));
    const bool stop = cfg.train.sdc_policy == GuardPolicy::Stop;
    const std::string message = fmt::format(
        "step {}: silent data corruption suspected on {}: the step re-run from the same state gave {} "
        "(train.sdc_policy = {})",
        at_step, ranks(suspects), fmt::join(what, " and "), stop ? "stop" : "warn");
    if (!stop) {
      progress().warn("{}; training goes on with the re-run's results", message);
      return;
    }
    finish_async_save("the run stops anyway");
    logger().flush();
    throw AgreedStop("train: " + message, 3);
  }
};

Trainer::Trainer(const Config& config, MpiCommunicator& world, TrainerOptions trainer_options)
    : impl_(std::make_unique<Impl>(config, world)) {
  Impl& m = *impl_;
  const Config& c = m.cfg;
  allocator_for(m.device).reset_peak();
  // The watchdog's deadline for every blocking communication wait from here on (communicator.hpp).
  set_comm_timeout(c.train.comm_timeout_s);
  // Before anything is built: an unwritable output or checkpoint directory fails now, not at the
  // first save hours later. Every rank probes (checkpoint shards are written by every rank).
  check_output_dirs(c, "rank" + std::to_string(world.rank()));
  // And a tokenizer file that is missing, malformed or larger than the vocabulary, before the data
  // is opened (which reads it for the end-of-document id).
  check_tokenizer(c);
  // The memory plan, before anything is allocated: a run that cannot fit ends now with one line
  // naming the total, the limit, the biggest term and its keys (memory_plan.hpp).
  // Host memory: MemAvailable and the cgroup's room, shared by the ranks on the node; on a GPU the
  // device terms against its free memory, the host ones (the schedule) against the host's.
  if (trainer_options.check_memory) {
    const MemoryPlan plan = plan_memory(c, world.size());
    const MemoryLimit host =
        agreed_memory_limit(m.world, host_memory_limit(discover_launch_from_environment().local_size));
    if (m.device.is_cuda()) {
      check_memory_plan(plan, agreed_memory_limit(m.world, device_memory_limit(m.device)),
                        MemoryScope::Device);
      check_memory_plan(plan, host, MemoryScope::Host);
    } else {
      check_memory_plan(plan, host);
    }
  }
  const auto grid = RankGrid::from_world(world.size(), c.parallel.tensor, c.parallel.pipeline,
                                         c.parallel.context, c.parallel.expert, c.parallel.expert_tensor);
  check_nodes(c, world, grid);
  // The groups, this rank's model chunks, DDP, the optimizer and the executors: the step, composed
  // once for the trainer and the planner (train_step.hpp).
  m.train_step = std::make_unique<TrainStep>(c, m.world, m.device);
  m.state = &m.train_step->state();
  if (DataParallel* experts = m.train_step->expert_ddp())
    progress().info(
        "experts: {} per MoE layer, top-{}, {} dispatch; expert parallel {} ({} experts per rank), "
        "expert tensor parallel {}, expert data parallel {}, sharding {} over {} ranks, {} buckets",
        c.model.num_experts, c.model.moe_router_topk,
        c.model.moe_token_dispatcher == MoeDispatcher::AllToAll ? "alltoall" : "allgather",
        m.state->ep().size(), c.model.num_experts / m.state->ep().size(), m.state->etp().size(),
        m.state->edp().size(), sharding_name(*experts), experts->shard_group().size(),
        experts->buffer().buckets().size());
  DataParallel& ddp = m.train_step->ddp();
  progress().info("data parallel: {} ranks, sharding {} over {} ranks, {} buckets", ddp.dp().size(),
                  sharding_name(ddp), ddp.shard_group().size(), ddp.buffer().buckets().size());
  // docs/optimizer.md#the-overlapped-update: said once, with the reason when it is off.
  progress().info("optimizer: overlapped update {}", m.train_step->overlapped_update_description());
  if (m.train_step->optimizer().uses_muon())
    progress().info(
        "optimizer: muon for the 2-D hidden weights ({} momentum elements here), adamw for the "
        "rest ({} elements here)",
        m.train_step->optimizer().momentum().numel(), m.train_step->optimizer().exp_avg().numel());
  m.lr.emplace(c.optimizer, c.train.steps);

  // Every rank builds the same blend index (or reads it from the cache); rank 0 alone writes the file.
  m.train_data.emplace(make_blended_dataset(c, DataSplit::Train, world.rank() == 0));
  if (c.train.eval_interval > 0)
    m.valid_data.emplace(make_blended_dataset(c, DataSplit::Valid, world.rank() == 0));
  for (const BlendedDataset* data : {&*m.train_data, m.valid_data ? &*m.valid_data : nullptr}) {
    if (!data || data->num_datasets() == 1) continue;
    std::string parts;
    for (int64_t d = 0; d < data->num_datasets(); ++d)
      parts +=
          fmt::format("{}{:.4g} {}", d ? ", " : "", data->weight(d), data->dataset(d).source().describe());
    progress().info("data: {} blend of {} datasets ({}); index of {} samples {}{}",
                    data_split_name(data->split()), data->num_datasets(), parts, data->options().num_samples,
                    data->cache_status(), data->cache_file().empty() ? "" : ": " + data->cache_file());
    if (!data->cache_warning().empty()) progress().warn("data: {}", data->cache_warning());
  }
  if (m.train_data->options().dataset.sft)
    for (int64_t d = 0; d < m.train_data->num_datasets(); ++d) {
      const GPTDataset& set = m.train_data->dataset(d);
      progress().info("data: sft: {} train samples of {} packed into {} sequences of {} tokens; {} truncated",
                      set.packed_samples(), set.source().describe(), set.samples_per_epoch(),
                      c.model.seq_length + 1, set.truncated_samples());
    }

  const int dp = m.state->grid().sizes().data;
  m.flops_per_token = model_flops_per_token(c.model);
  if (world.rank() == 0) {
    std::filesystem::create_directories(c.train.output_dir);
    std::ofstream(std::filesystem::path(c.train.output_dir) / "config.yaml") << config_to_yaml(c);
    m.metrics = std::make_unique<MetricsWriter>(
        (std::filesystem::path(c.train.output_dir) / "metrics.jsonl").string());
    if (!c.train.tensorboard_dir.empty())
      m.tensorboard = std::make_unique<TensorBoardWriter>(c.train.tensorboard_dir);
  }

  progress().info(
      "GPT: {:.2f}M parameters, {} layers, hidden {}, {} heads; tensor {} x context {} x pipeline {} (x{} "
      "virtual) x data {}; {} micro-batches of {} per rank and step",
      static_cast<double>(m.train_step->parameter_count()) / 1e6, c.model.num_layers, c.model.hidden_size,
      c.model.num_attention_heads, c.parallel.tensor, c.parallel.context, c.parallel.pipeline,
      c.parallel.virtual_stages, dp, m.train_step->micro_batches(), c.train.micro_batch_size);
  if (c.parallel.pipeline > 1) {
    // What the executor runs: the configured schedule, resolved (auto) and counted on this rank.
    int weight_steps = 0;
    for (const pipeline::Action& a : m.train_step->executor().schedule())
      weight_steps += a.op == pipeline::Op::BackwardWeight;
    const pipeline::Schedule& s = m.train_step->executor().schedule();
    const bool interleaved = c.parallel.virtual_stages > 1;
    const char* name = c.parallel.pipeline_schedule != PipelineSchedule::Auto
                           ? pipeline::schedule_name(c.parallel.pipeline_schedule)
                           : (interleaved ? "interleaved (auto)" : "1f1b (auto)");
    progress().info(
        "pipeline schedule: {}, {} actions and {} weight steps per step on rank 0 of the pipeline", name,
        s.size(), weight_steps);
  }

  // MFU's denominator, said once so that a figure in metrics.jsonl can be checked against it.
  const RankPeak peak = peak_flops_per_rank(c.train, m.device);
  m.peak_flops = peak.flops;
  const char* precision = c.train.precision == Precision::FP32   ? "fp32"
                          : c.train.precision == Precision::BF16 ? "bf16"
                                                                 : "fp16";
  progress().info("MFU peak: {:.1f} GFLOP/s per rank ({} from {})", peak.flops / 1e9, precision, peak.source);
  if (!m.device.is_cuda() && c.train.peak_tflops <= 0 && !cpu_peak_overridden())
    progress().info("CPU peak: {}", describe(measured_cpu_peak()));
  if (!m.device.is_cuda()) {
    progress().info("CPU GEMM: {}", ops::gemm_implementation(compute_dtype(c.train.precision)));
    const GemmProbe g = probe_cpu_gemm(c.model, c.train.micro_batch_size, c.train.precision);
    progress().info("CPU GEMM [{}x{}] @ [{}x{}]^T {}: {:.1f} GFLOP/s, {:.1f}% of the rank's {} peak", g.m,
                    g.k, g.n, g.k, precision, g.flops / 1e9,
                    peak.flops > 0 ? 100.0 * g.flops / peak.flops : 0.0, precision);
  }

  // `latest` with no checkpoint yet is a first run, as in Megatron: a warning, then step 0. The
  // ranks agree (any rank seeing a checkpoint makes all load) so that none skips a collective load.
  bool load = !c.checkpoint.load.empty();
  if (load && c.checkpoint.load == "latest" && !c.checkpoint.dir.empty()) {
    Tensor found =
        Tensor::full({1}, checkpoint::list_steps(c.checkpoint.dir).empty() ? 0.0 : 1.0, DType::F32);
    m.world.all_reduce(found, ReduceOp::Max);
    if (found.to_float_vector()[0] == 0.0) {
      progress().warn("checkpoint.load = latest: no checkpoint under {} yet; starting from scratch",
                      c.checkpoint.dir);
      load = false;
    }
  }
  if (load) {
    const LoadResult loaded = load_train_state(c.checkpoint.load, c.checkpoint.dir, m.parameters(),
                                               &m.train_step->optimizer(), *m.state, m.train_step->buffers());
    m.step = loaded.progress.step;
    progress().info(
        "loaded {} ({}): resuming at step {}", loaded.path,
        loaded.had_optimizer_state ? "weights and optimizer state" : "weights only, fresh optimizer", m.step);
  }
  m.guard.emplace(c.train);
  m.fault = FaultInjection::from_environment();
  m.bitflip = BitFlipInjection::from_environment();
  if (c.train.sdc_check_interval > 0)
    progress().info(
        "silent data corruption check: every {} steps the forward and backward run twice from the same state "
        "and each rank compares its loss and gradients bitwise (train.sdc_policy = {})",
        c.train.sdc_check_interval, c.train.sdc_policy == GuardPolicy::Stop ? "stop" : "warn");
  m.stop.emplace();
}

Trainer::~Trainer() = default;

int64_t Trainer::step() const { return impl_->step; }
int64_t Trainer::measured_peak_bytes() const {
  impl_->train_step->sample_peak();
  return impl_->measured_peak();
}
const std::vector<StepMetrics>& Trainer::history() const { return impl_->history; }

double Trainer::evaluate() {
  Impl& m = *impl_;
  PARALLEL_CHECK(m.valid_data.has_value(),
                 "evaluate: train.eval_interval is 0, so no validation data was opened");
  double total = 0;
  for (int i = 0; i < m.cfg.train.eval_steps; ++i) {
    const double tokens = m.valid_data->options().dataset.masks_loss()
                              ? m.loss_tokens(*m.valid_data, i, m.train_step->micro_batches())
                              : 0.0;
    m.train_step->model().start_forward_only(m.data_of(*m.valid_data, i));
    m.train_step->sample_peak();  // the executor resets the allocator's peak
    m.train_step->eval_executor().run(m.train_step->model());
    total += m.train_step->global_mean_loss(1.0, tokens);
  }
  return total / m.cfg.train.eval_steps;
}

int64_t Trainer::train() {
  Impl& m = *impl_;
  const Config& c = m.cfg;
  const int64_t batches_per_step =
      c.train.global_batch_size / c.train.micro_batch_size;  // global micro-batches
  const auto run_start = Clock::now();
  const int64_t first_step = m.step;

  // Straggler detection: each rank's time outside communication waits, summed between log lines.
  double busy_since_log = 0;
  int64_t steps_since_log = 0;
  // PARALLEL_OP_TIMES=1 (op_times.hpp): the ops' wall time over the steps after the warm-up.
  OpTimesReport op_report;

  while (m.step < c.train.steps) {
    if (ops::op_times_enabled() && m.step - first_step == OpTimesReport::warmup_steps) op_report.start();
    const auto start = Clock::now();
    const double waited_before = comm_wait_seconds();
    const int64_t reads_before = host_reads();
    const int64_t converted_before = conversion_passes().bytes;
    const long faults_before = minor_faults();
    const int64_t t = m.step;  // 0-based index of this step's global batch
    const double lr = m.lr->lr(static_cast<int>(t));
    const double injected = m.fault.factor_at(t + 1, m.world.rank());
    // Every sdc_check_interval steps the step's forward and backward run twice and each rank
    // compares its own results (TrainStep::run; docs/configuration.md#training-guards).
    RerunCheck rerun;
    rerun.enabled = c.train.sdc_check_interval > 0 && (t + 1) % c.train.sdc_check_interval == 0;
    rerun.flip_first = m.bitflip.step == t + 1 && m.bitflip.rank == m.world.rank();
    rerun.compare = [&](const RunFingerprint& first, const RunFingerprint& second) {
      m.compare_runs(t + 1, first, second);
    };
    const double step_tokens = m.train_data->options().dataset.masks_loss()
                                   ? m.loss_tokens(*m.train_data, t, m.train_step->micro_batches())
                                   : 0.0;
    GuardVerdict verdict;
    const StepOutcome outcome = m.train_step->run(
        t, m.data_of(*m.train_data, t), lr, injected,
        [&](double loss, double grad_norm) {
          verdict = m.guard->check(loss, grad_norm, true);
          return verdict.action != GuardVerdict::Action::Update;
        },
        rerun, step_tokens);
    const double loss = outcome.loss;
    const StepResult& result = outcome.update;
    // An fp16 overflow skipped the update before the guard saw the norm: the loss is still checked.
    if (result.overflow) verdict = m.guard->check(loss, 0.0, false);
    const std::string too_many = m.guard->record(verdict, !result.skipped, loss, result.grad_norm);
    // Host reads of this step and the allocator's peak so far, each the largest over the ranks.
    Tensor maxima = Tensor::zeros({5}, DType::I64);
    maxima.data<int64_t>()[0] = host_reads() - reads_before;
    maxima.data<int64_t>()[1] = m.measured_peak();
    maxima.data<int64_t>()[2] = conversion_passes().bytes - converted_before;
    maxima.data<int64_t>()[3] = minor_faults() - faults_before;
    maxima.data<int64_t>()[4] = std::llround((comm_wait_seconds() - waited_before) * 1e6);  // microseconds
    m.world.all_reduce(maxima, ReduceOp::Max);
    const int64_t reads = maxima.data<int64_t>()[0];
    ++m.step;

    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    busy_since_log += std::max(0.0, seconds - (comm_wait_seconds() - waited_before));
    op_report.add_step(seconds, comm_wait_seconds() - waited_before);
    ++steps_since_log;
    StepMetrics s;
    s.step = m.step;
    s.loss = loss;
    s.lr = lr;
    s.grad_norm = result.grad_norm;
    s.step_time_ms = seconds * 1e3;
    s.tokens_per_sec = static_cast<double>(m.tokens_per_batch()) / seconds;
    s.peak_flops_per_rank = m.peak_flops;
    s.mfu = m.peak_flops > 0 ? m.flops_per_token * s.tokens_per_sec / (m.peak_flops * m.world.size()) : 0.0;
    s.skipped = result.skipped;
    s.skip_reason = !result.skipped     ? ""
                    : result.overflow   ? "overflow"
                    : verdict.nonfinite ? "nonfinite"
                                        : "spike";
    s.skipped_steps = m.guard->skipped_steps();
    s.spikes = m.guard->spikes();
    s.nonfinite_steps = m.guard->nonfinite_steps();
    s.host_reads = reads;
    s.mem_peak_bytes = maxima.data<int64_t>()[1];
    s.conversion_bytes = maxima.data<int64_t>()[2];
    s.minor_faults = maxima.data<int64_t>()[3];
    s.comm_wait_ms = static_cast<double>(maxima.data<int64_t>()[4]) * 1e-3;
    s.loss_scale = m.train_step->optimizer().loss_scaler() ? result.loss_scale : 0.0;
    if (c.model.num_experts > 0) m.moe_metrics(s, batches_per_step);
    if (c.model.mtp_num_layers > 0) m.mtp_metrics(s);
    m.history.push_back(s);

    const bool stop = verdict.action == GuardVerdict::Action::Stop || !too_many.empty();
    const bool log = m.step == first_step + 1 || m.step % c.train.log_interval == 0 ||
                     m.step == c.train.steps || stop || !verdict.what.empty();
    if (m.metrics && log) m.metrics->write_train(s);
    if (m.tensorboard && log) m.tensorboard->write_train(s);
    if (verdict.action == GuardVerdict::Action::Stop)
      m.stop_run(m.step, fmt::format("{}: stopping ({})", verdict.what, verdict.rule));
    if (!verdict.what.empty())
      progress().warn("step {}: {}: {} ({})", m.step, verdict.what,
                      verdict.action == GuardVerdict::Action::Skip ? "update skipped" : "updated anyway",
                      verdict.rule);
    if (!too_many.empty()) m.stop_run(m.step, "stopping: " + too_many);
    if (log) {
      const double per_step = std::chrono::duration<double>(Clock::now() - run_start).count() /
                              static_cast<double>(m.step - first_step);
      progress().info(
          "{}", progress_line(s, c.train.steps, per_step * static_cast<double>(c.train.steps - m.step)));
      m.warn_stragglers(busy_since_log / static_cast<double>(steps_since_log));
      busy_since_log = 0;
      steps_since_log = 0;
    }
    if (c.train.eval_interval > 0 && (m.step % c.train.eval_interval == 0 || m.step == c.train.steps)) {
      const double eval_loss = evaluate();
      if (m.metrics) m.metrics->write_eval(m.step, eval_loss);
      if (m.tensorboard) m.tensorboard->write_eval(m.step, eval_loss);
      progress().info("step {} | eval loss {:.4f} (ppl {:.2f})", m.step, eval_loss, std::exp(eval_loss));
    }
    m.poll_async_save();
    const int stop_signal = agreed_stop_signal(*m.stop, m.world);
    const bool stopping = stop_signal != 0;
    const bool periodic = c.checkpoint.save_interval > 0 && m.step % c.checkpoint.save_interval == 0;
    if (!c.checkpoint.dir.empty() && (periodic || stopping || m.step == c.train.steps)) m.save(m.step);
    if (stopping) {
      progress().info("stopping at step {} on {}", m.step, signal_name(stop_signal));
      break;
    }
  }
  op_report.print(m.world.rank());
  // The end of training (or a stop) waits for the last asynchronous save and publishes it.
  m.finish_async_save(nullptr);
  return m.step;
}

}  // namespace parallel
