#pragma once
// The planner's cost model and step simulation (issue 26, docs/planner.md "Time").
//
// Input: the timelines (meta_timeline.hpp) of one rank per symmetry class, recorded by running the
// real training step on meta (trace_step), and a machine (hardware.hpp).
//
// Symmetry rule: ranks that differ only in their tp, cp, dp (and so ep, etp, edp) coordinates run
// the same program on the same shapes - tensor, context and data parallelism split every shape
// evenly, and MoE routing is assumed balanced - so one rank per pipeline stage stands for all:
// the rank with tp = cp = dp = 0 at stage s. A group whose members all lie in one stage is then
// symmetric: its members issue each call at the same time, so a collective starts when this rank
// issues it. A group that spans stages (embedding, model, expert_model) has a representative on
// each stage it touches; its k-th call starts when the last of them issues it. Pipeline messages go
// between representatives (a stage's neighbour with the same tp, cp, dp is the next stage's
// representative); the k-th send from a to b meets the k-th receive at b from a. A message to a peer
// of the same stage (context parallelism's ring) is symmetric: the peer posts its side at once.
//
// Streams: each rank has one compute stream (ops, one after another) and one communication stream
// per group (calls on one group run in order; calls on different groups overlap). A synchronous
// collective blocks the compute stream until it is done; an asynchronous one runs beside the ops
// until the timeline's wait for it. Point-to-point messages start when both sides have posted them.
// Time the compute stream spends blocked is "exposed": per dimension (group name -> dimension:
// tp, etp -> tp; cp -> cp; dp, dp_cp, edp, dp_shard, dp_replica (HSDP) -> dp; pp, embedding, model,
// expert_model -> pp; ep -> ep). A pipeline receive's blocked time beyond its own transfer time is the bubble
// (waiting for the neighbour to compute), not exposed communication.
//
// Cost of one op at a rank's share of its device (hardware.hpp: ranks per node vs devices):
//   matmul ops (gemm, gemm_bias, attention_*):
//       overhead + max(flops / (peak(dtype) * efficiency(size, dtype) * share), bytes / (bandwidth * share))
//       size = (m n k)^(1/3) of a GEMM, (s s_k d)^(1/3) of attention's per-head products
//   everything else: overhead + max(flops / (vector rate * share), bytes / (bandwidth * share))
//   where device.op_tflops has the op (in its dtype, else in fp32), that rate replaces both;
//   dtype = op_dtype(e), the curve is the dtype's (else fp32's)
// Collectives on n ranks over the slowest link level the group spans (NCCL's formulas; B the full
// tensor's bytes, bw = link bandwidth / shared_by, a = latency):
//   all_reduce      min(ring 2(n-1)/n B/bw + 2(n-1) a,  tree 2 B/bw + 2 log2(n) a)
//   reduce_scatter, all_gather, all_to_all(v):  (n-1)/n B/bw + (n-1) a
//   broadcast       B/bw + (n-1) a;   barrier  2 log2(n) a;   one rank  0
//   send / recv     a + B/bw over the link between the two ranks
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "parallel/comm_log.hpp"
#include "parallel/config.hpp"
#include "parallel/hardware.hpp"
#include "parallel/meta.hpp"
#include "parallel/meta_timeline.hpp"
#include "parallel/pipeline.hpp"

namespace parallel::plan {

// Collective formulas (seconds), for bytes B over n ranks at bandwidth bw (bytes/s), latency a (s).
double ring_all_reduce_seconds(double bytes, int n, double bw, double latency);
double tree_all_reduce_seconds(double bytes, int n, double bw, double latency);
double all_reduce_seconds(double bytes, int n, double bw, double latency);   // min of the two
double ring_gather_seconds(double bytes, int n, double bw, double latency);  // reduce_scatter, all_gather

// How the software being planned runs what the trace records, where it is not this library's
// kernels: a property of the system (its framework and version), not of the machine (hardware.hpp)
// and not of the model (config.hpp), stated per plan.
enum class AttentionKernel {
  // One fused kernel (flash attention, this library's attention_forward / attention_backward):
  // the FLOPs as recorded (a causal mask halves them), q, k, v, out and lse through memory.
  Fused,
  // The score matrix materialised, as Megatron-LM ran attention in 2021 (Narayanan et al., SC21,
  // section 4.2): per call, with N = b * heads * s * s_k scores in the compute dtype (e bytes),
  //   forward:  batched GEMM Q K^T (2 N d FLOPs, writes N e; the whole matrix, a causal mask
  //             computes every score and masks it), a fused scale-mask-softmax (reads and writes
  //             N e), dropout on the probabilities when attention_dropout > 0 (reads N e, writes
  //             N e and a one-byte mask per score), batched GEMM P V (2 N dv, reads N e), and the
  //             context's permute to [s, b, h] (reads and writes the output);
  //   backward: dP = dO V^T (writes N e), the dropout's backward (reads N e and the mask, writes
  //             N e), dV = P^T dO (reads N e), the softmax's backward (reads the probabilities and
  //             their gradient, writes N e), dQ = dS K and dK = dS^T Q (each reads N e), and the
  //             gradient's permute.
  // Each kernel costs as an op does (overhead + max(compute, bytes / bandwidth)), the GEMMs at
  // the shape curve's efficiency for (s s_k d)^(1/3), the rest at the vector rate.
  Unfused,
};
struct CostOptions {
  AttentionKernel attention = AttentionKernel::Fused;
  double attention_dropout = 0;  // Unfused: dropout probability on the attention probabilities
};

// The dtype an op's kernel runs in, whose curve and kernel rate price it (hardware.hpp): the first
// floating dtype other than fp32 among its operands (read, then written), else fp32. The CPU
// kernels run their 16-bit variant when any operand is 16-bit (ops.hpp, "Precision"): AdamW
// writing the model's bf16 copy, cross-entropy on bf16 logits, a GEMM on bf16 operands.
DType op_dtype(const OpEvent& e);
// How many times an op pays its kernel's fixed cost (HardwareDescription::op_fixed_us): the
// (batch, head) pairs of an attention call, else 1.
double fixed_cost_units(const OpEvent& e);

class CostModel {
 public:
  // ranks_per_node <= 0: nodes filled with min(world_size, devices per node) ranks each.
  CostModel(HardwareDescription hw, int world_size, int ranks_per_node = 0, CostOptions options = {});
  const CostOptions& options() const { return options_; }
  const HardwareDescription& hardware() const { return hw_; }
  int ranks_per_node() const { return ranks_per_node_; }
  int world_size() const { return world_size_; }
  // The fraction of one device's compute and memory bandwidth a rank gets: min(1, devices /
  // ranks_per_node) (hardware.hpp: more ranks than devices time-share them).
  double share() const { return share_; }
  bool oversubscribed() const { return ranks_per_node_ > hw_.devices_per_node; }

  double op_seconds(const OpEvent& e) const;
  bool is_matmul(const OpEvent& e) const;
  // The link level a set of world ranks spans (cluster when they sit on more than one node).
  const LinkLevel& level(const std::vector<int>& ranks) const;
  double collective_seconds(const CommEvent& e) const;
  double p2p_seconds(int64_t bytes, int a, int b) const;
  // Whether asynchronous call `e`, issued by world rank `rank`, progresses while the rank computes
  // (its link level's async_progress; a point-to-point call's level spans the rank and its peers).
  bool progresses_async(const CommEvent& e, int rank) const;
  // The extra seconds each blocking wait costs a rank of an oversubscribed node
  // (hardware.hpp's node.oversubscribed_wait_us at this job's ranks per device); 0 otherwise.
  double oversubscribed_wait_s() const;
  // The same for a wait on a group of `group_ranks` ranks: node.subgroup_wait_us where the group is
  // smaller than the node's ranks (its partners share their cores with ranks outside it), else
  // oversubscribed_wait_s(); 0 on a node with a device per rank.
  double oversubscribed_wait_s(int group_ranks) const;
  // The factor on the time of an op reading and writing `bytes` when ranks time-share the devices
  // (hardware.hpp's node.shared_core_slowdown at this job's ranks per device and that working set;
  // 0 bytes: the smallest measured working set's, the largest factor); 1 otherwise.
  double shared_core_slowdown(double bytes = 0) const;

 private:
  // One kernel: overhead + max(flops at the rate, bytes at the bandwidth); `matmul_size` > 0 takes
  // the matmul peak of `dtype` at that size's efficiency, else the vector rate.
  double kernel_seconds(double flops, double bytes, DType dtype, double matmul_size) const;
  double unfused_attention_seconds(const OpEvent& e) const;

  HardwareDescription hw_;
  CostOptions options_;
  int world_size_;
  int ranks_per_node_;
  double share_;
};

// The parallel dimensions exposed communication is reported in.
inline constexpr std::array<const char*, 5> kDimensions{"tp", "cp", "dp", "pp", "ep"};
// A group name's dimension (the mapping above); throws for an unknown name.
std::string dimension_of(const std::string& group);

struct RankTime {
  int rank = 0;
  double end_s = 0;      // when its compute stream finished the step
  double compute_s = 0;  // busy with ops
  double bubble_s = 0;
  std::map<std::string, double> exposed_s;  // per dimension
  // Of the exposed time: what its blocking waits cost beyond the calls' own completion because
  // the node is oversubscribed (CostModel::oversubscribed_wait_s per wait that blocked).
  double oversubscribed_wait_s = 0;
  int blocking_waits = 0;  // waits that found their call not yet complete
};

struct SimulationResult {
  double step_time_s = 0;
  std::vector<RankTime> ranks;              // one per representative, in the order given
  double bubble_fraction = 0;               // mean bubble / step time over the representatives
  std::map<std::string, double> exposed_s;  // per dimension: mean over the representatives
  double oversubscribed_wait_s = 0;         // mean over the representatives (RankTime's)
};

// A timeline costed for the simulator: consecutive ops merged into one span of compute seconds
// (a large job's timelines hold millions of ops; their shapes are not needed once costed).
struct SimEntry {
  TimelineEntry::Kind kind = TimelineEntry::Kind::Op;
  double seconds = 0;  // Kind::Op: the span's compute time
  CommEvent comm;      // Kind::Comm
  int64_t call = -1;   // as TimelineEntry::call
};
// Replay entries are costed once per range and copied, their calls renumbered.
std::vector<SimEntry> cost_timeline(const std::vector<TimelineEntry>& timeline, const CostModel& cost);

// Replays the representatives' timelines together (rank -> timeline). Throws when a message has
// no partner among them or the timelines deadlock. An asynchronous call over a link that does not
// progress calls during compute (LinkLevel::async_progress false) is issued where its rank first
// waits for it; a call never waited for (a polled send) stays where it was issued.
SimulationResult simulate(const std::map<int, std::vector<SimEntry>>& timelines, const CostModel& cost);
SimulationResult simulate(const std::map<int, std::vector<TimelineEntry>>& timelines, const CostModel& cost);

// ---- The step of a layout ----------------------------------------------------------------------

// The representatives of the symmetry classes: the rank with tp = cp = dp = 0 on each stage.
std::vector<int> representative_ranks(const Config& c, int world_size);

// Micro-batch replay: between the pipeline executor and the model, runs micro-batches 0, 1 and the
// last for real and records every other one's forward / backward as a replay of micro-batch 1's
// timeline entries of the same chunk and action (meta_timeline.hpp), returning an empty meta tensor
// of the shape micro-batch 1's returned. Valid because a step's micro-batches do the same work on the
// same shapes (synthetic data, balanced MoE routing): the ops, their order and the calls they issue
// do not depend on the micro-batch's index, except on the first (first-use work) and the last (its
// backward starts the data-parallel reductions), which run. The executor (the schedule, pipeline
// messages) runs for real. test_step_cost holds the expanded replayed timeline equal, entry by entry,
// to the timeline of running every micro-batch. The allocator sees no replayed allocation, so a
// replayed run's peak is not the step's: memory comes from the memory plan (memory_plan.hpp).
class MicroBatchReplay final : public pipeline::PipelineModel {
 public:
  MicroBatchReplay(pipeline::PipelineModel& inner, int micro_batches);
  Tensor forward(int chunk, int micro_batch, const Tensor& input) override;
  Tensor backward(int chunk, int micro_batch, const Tensor& grad) override;
  Tensor backward_input(int chunk, int micro_batch, const Tensor& grad) override;
  void backward_weight(int chunk, int micro_batch) override;
  int replays() const { return replays_; }

 private:
  enum class Action { Forward, Backward, BackwardInput, BackwardWeight };
  struct Segment {
    std::size_t begin = 0, end = 0;  // micro-batch 1's entries
    bool defined = false;            // its result
    Shape shape;
    DType dtype = DType::F32;
    std::vector<std::pair<int64_t, std::ptrdiff_t>> earlier_waits;  // call -> index in the predecessor's
  };
  bool runs(int micro_batch) const;
  template <typename Run>
  Tensor run_or_replay(Action action, int chunk, int micro_batch, Run run);

  pipeline::PipelineModel& inner_;
  int micro_batches_;
  std::map<std::pair<int, int>, Segment> segments_;                 // (action, chunk)
  std::map<std::pair<int, int>, std::vector<int64_t>> last_calls_;  // the last micro-batch's calls
  std::map<std::pair<int, int>, std::vector<int64_t>> real_calls_;  // the last real run's
  int replays_ = 0;
};

// One rank's training step on meta: its timeline and its allocator peak.
struct RankTrace {
  int rank = 0;
  // With replay, Replay entries stand for repeated micro-batches (expand_timeline gives them all).
  std::vector<TimelineEntry> timeline;  // plan_step keeps it costed (SimEntry) and empties this
  int64_t peak_bytes = 0;  // meta allocator's peak, model construction included (without replay only)
  double flops = 0;        // all ops' FLOPs (recompute included: hardware FLOPs), replays included
};
// THE ONE PLACE the planner composes the step: rank `rank` of a `world_size`-rank job running one
// training step of `c` (the trainer's TrainStep) on Device::meta() over a MetaCommunicator.
// `replay`: identical micro-batches are replayed (MicroBatchReplay), which makes a step of many
// micro-batches cost a few of them to trace.
RankTrace trace_step(const Config& c, int world_size, int rank, bool replay = true);

// Model FLOPs of one step (the whole job), counted from the config: 2 x each matmul weight's
// elements per token forward (attention projections, MLP or the top-k experts and the router, the
// output layer) plus causal attention's 2 s h per token per layer, times 3 for forward and
// backward. Recompute is not model work: it appears in the hardware FLOPs (the trace) only.
double model_flops_per_step(const Config& c);

struct StepPlan {
  int world_size = 0;
  std::size_t timeline_entries = 0;  // ops, calls and waits traced over the representatives
  SimulationResult sim;
  std::vector<RankTrace> traces;  // the representatives'
  double tokens_per_step = 0;
  double tokens_per_s = 0;
  double model_flops = 0;     // per step, whole job
  double hardware_flops = 0;  // per step, whole job: the traced ops' FLOPs, recompute included
  double model_tflops_per_device = 0;
  double mfu = 0;  // model FLOP/s per device / the device's matmul peak for the compute dtype
  bool oversubscribed = false;
  int ranks_per_node = 0;
  double share = 1;
  double shared_core_slowdown = 1;  // CostModel::shared_core_slowdown(): the smallest ops' factor
  // Per representative (in `traces` order): each op kind's predicted seconds and count over the
  // step, replays included (pretrain_gpt --plan --breakdown prints it).
  struct OpTotal {
    double seconds = 0;
    double flops = 0;
    int64_t count = 0;
  };
  std::vector<std::map<std::string, OpTotal>> op_breakdown;
};
StepPlan plan_step(const Config& c, int world_size, const HardwareDescription& hw, int ranks_per_node = 0,
                   const CostOptions& options = {});
// plan.json's time fields as one JSON object (step_time_s, tokens_per_s, mfu, ...).
std::string step_plan_json(const StepPlan& p);
std::string step_plan_table(const StepPlan& p);
// The predicted compute per op kind of each representative, largest first.
std::string step_plan_breakdown(const StepPlan& p);

}  // namespace parallel::plan
