#pragma once
// What the trainer reports: model FLOPs (for MFU), one JSON object per line in metrics.jsonl, and
// the readable progress line rank 0 prints.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "parallel/config.hpp"
#include "parallel/line_file.hpp"

namespace parallel {

// Model FLOPs of one token's forward + backward (3x the forward), counted as PaLM's MFU does: every
// matmul with a weight (2 FLOPs per multiply-add), plus attention's q·kᵀ and p·v over the whole
// sequence (causal masking is not discounted, so figures compare with published MFU). Recompute is
// not counted: MFU measures useful work. A MoE layer counts its router, the top-k experts a token
// visits and the shared expert (not the experts it skips).
double model_flops_per_token(const ModelConfig& model);

struct StepMetrics {
  int64_t step = 0;
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  double tokens_per_sec = 0.0;
  double step_time_ms = 0.0;
  double mfu = 0.0;                  // fraction of the peak, 0..1
  double peak_flops_per_rank = 0.0;  // the peak MFU is measured against (FLOP/s); 0: unknown
  double loss_scale = 0.0;           // fp16 only; 0 otherwise
  int64_t host_reads = 0;            // host reads of tensor values this step, max over ranks (tensor.hpp)
  // Bytes moved by whole-tensor dtype conversions this step (conversion_passes.hpp), and the
  // process's minor page faults during the step (getrusage), each the largest over the ranks: after
  // the first steps both should be 0 (test_step_conversions).
  int64_t conversion_bytes = 0;
  int64_t minor_faults = 0;
  // The step's time blocked in communication waits (comm_wait_seconds: a wait that polls beyond
  // its first test), the largest over the ranks: what the planner's exposed communication predicts.
  double comm_wait_ms = 0.0;
  int64_t mem_peak_bytes = 0;  // allocator high-water mark since start, max over ranks (memory_plan.hpp)
  bool skipped = false;        // the update was skipped (skip_reason says why)
  std::string skip_reason;     // "overflow" (fp16), "nonfinite" or "spike" (training_guard.hpp)
  // The training guard's counts so far (training_guard.hpp): updates skipped for any reason, spikes
  // seen, steps whose loss or gradient norm was not finite.
  int64_t skipped_steps = 0, spikes = 0, nonfinite_steps = 0;
  // MoE only (empty tokens_per_expert: a dense model, none of the three is written). The aux and z
  // loss terms as they enter the objective (coefficients applied), summed over the MoE layers and
  // averaged over the step's micro-batches; the top-k assignments each expert received (before
  // capacity drops), summed over the MoE layers and all of the step's tokens.
  double moe_aux_loss = 0.0, moe_z_loss = 0.0;
  std::vector<int64_t> moe_tokens_per_expert;
  // model.moe_router_expert_bias: each MoE layer's expert bias after the step ([MoE layers][E], in
  // layer order), and the largest difference of one entry between the ranks that hold its layer
  // (0: every rank moved it alike).
  std::vector<std::vector<float>> moe_expert_bias;
  double moe_expert_bias_spread = 0.0;
  // model.mtp_num_layers > 0 only (empty: not written): each depth's multi-token prediction loss,
  // the mean over the global batch's targets inside the sequence (before mtp_loss_scaling_factor),
  // and their mean, mtp_loss.
  std::vector<double> mtp_losses;
  double mtp_loss = 0.0;
};

// Appends one JSON object per line, each in one write() so a killed run keeps its history and a
// full disk leaves only whole lines. A failed write is a warning (LineFile), never the end of a run.
class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path);  // creates parent directories; appends
  bool write_train(const StepMetrics& m);           // false: the line was dropped (see LineFile)
  bool write_eval(int64_t step, double eval_loss);
  int64_t dropped_lines() const { return out_.dropped_lines(); }

 private:
  LineFile out_;
};

// "step   120/2000 | loss 4.1234 | lr 2.95e-04 | grad 0.812 | 12.3k tok/s | MFU 41.2% | ETA 3m12s"
std::string progress_line(const StepMetrics& m, int64_t total_steps, double seconds_left);
std::string format_duration(double seconds);  // "3m12s", "1h02m", "45s"

// Straggler detection. `busy_s[r]` is rank r's time per step spent outside communication waits
// (step time minus comm_wait_seconds(): the ranks waiting for a slow one all show the same step
// time, but not the same busy time). A straggler is a rank more than `factor` times the median (the
// lower one for an even count) and at least `min_excess_s` above it; the floor keeps scheduler
// noise on millisecond steps from naming ranks. Returns the ranks, ascending.
std::vector<int> find_stragglers(std::span<const double> busy_s, double factor = 2.0,
                                 double min_excess_s = 0.1);
// "straggler: rank 3 busy 812 ms per step, 4.1x the median 198 ms over 4 ranks (...)" for the
// ranks find_stragglers named; empty when there are none.
std::string straggler_warning(std::span<const double> busy_s, const std::vector<int>& stragglers);

}  // namespace parallel
