#pragma once
// Pipeline schedules as data.
//
// A schedule is a pure function of (pipeline size p, rank r, micro-batches m, virtual stages v)
// returning the ordered actions of one rank. The executor (pipeline.hpp) runs the list;
// tests simulate the lists of all ranks together to prove them deadlock-free. A new schedule
// (zero-bubble, DualPipe) is a new function here, nothing else.
//
// Model chunks: with v virtual stages, rank r holds chunks c = 0..v-1. In the loop placement (every
// schedule but the V ones) chunk c of rank r is global stage c*p + r (Megatron's interleaved
// assignment: rank r holds layers of stages r, r+p, r+2p, ...). In the V placement (zb-v,
// dualpipe-v; v == 2) chunk 0 of rank r is stage r and chunk 1 is stage 2p - 1 - r: the model goes
// down the ranks and back up, so rank 0 holds the first and the last stage and rank p - 1 the two
// middle ones, whose messages stay on the rank. Activations flow global stage g -> g+1, gradients
// g+1 -> g.
//
// Communication semantics the executor implements and the simulator checks: sends never block
// (they are posted asynchronously and completed later); a receive blocks until its message has been
// sent. Messages are identified by (kind, micro-batch, global stage), never by arrival order.
//
// Backward comes fused (Backward: input and weight gradients together) or split, for zero-bubble
// schedules: BackwardInput (B, the input gradient, on the critical path: it carries the receive
// and send of a backward) then BackwardWeight (W, the weight gradients, no communication) of the
// same (chunk, micro-batch), later on the same rank.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/config.hpp"  // PipelineSchedule

namespace parallel::pipeline {

enum class Op : uint8_t {
  RecvForward,     // receive the input activation of (chunk, micro_batch) from the previous stage
  Forward,         // run the forward of (chunk, micro_batch)
  SendForward,     // send its output activation to the next stage
  RecvBackward,    // receive the gradient of its output from the next stage
  Backward,        // run the backward of (chunk, micro_batch)
  SendBackward,    // send the gradient of its input to the previous stage
  BackwardInput,   // split backward, B: the gradient of the input of (chunk, micro_batch)
  BackwardWeight,  // split backward, W: its weight gradients (after its BackwardInput)
};

struct Action {
  Op op;
  int chunk = 0;
  int micro_batch = 0;
  bool operator==(const Action&) const = default;
};

using Schedule = std::vector<Action>;

enum class Placement : uint8_t { Loop, V };

// The placement a schedule kind uses: V for ZeroBubbleV and DualPipeV, Loop otherwise.
Placement placement_of(PipelineSchedule kind);

struct ScheduleParams {
  int pipeline_size = 1;                           // p
  int rank = 0;                                    // r, 0 <= r < p
  int micro_batches = 1;                           // m
  int virtual_stages = 1;                          // v
  PipelineSchedule kind = PipelineSchedule::Auto;  // what make_schedule builds
};

// Each of these throws parallel::Error with one line naming the violated rule (e.g. interleaving
// needs m divisible by p) when the parameters do not fit the schedule.
Schedule no_pipelining(const ScheduleParams& s);  // p == 1: forward, backward per micro-batch
Schedule gpipe(const ScheduleParams& s);          // all forwards, then all backwards
Schedule one_f_one_b(const ScheduleParams& s);    // warm-up min(p - r - 1, m), steady 1F1B, cool-down
Schedule interleaved_one_f_one_b(const ScheduleParams& s);  // Megatron's interleaved 1F1B, v > 1
// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024), v == 1: 1F1B's order of F and
// B with split backward; rank r runs each W up to r input steps late (the last W's fill the
// cool-down). In flight on rank r: at most min(p - r, m) micro-batches between F and B (1F1B's
// bound) and min(p, m) between F and W (1F1B's peak, rank 0's). With F, B, W costs and m >= p,
// each rank idles (p - 1) * max(F, B, F + B - W): the paper's (p - 1)(F + B - W) when W <= F, B.
Schedule zero_bubble_h1(const ScheduleParams& s);
// ZB-V (Qi et al., section 6 / appendix; PyTorch's ScheduleZBVZeroBubble), v == 2 in the V
// placement, m >= 2p, every backward split. Rank r runs 2(p - r) - 1 forwards of chunk 0, then r
// pairs (chunk 1, chunk 0), then p - r rounds of (F, B, W) of chunk 1, a steady state of
// (F0, B0, W0, F1, B1, W1), and a cool-down that runs the input steps first and fills the drain with
// the weight steps. In flight on rank r: at most 2p chunk micro-batches between F and W, i.e. p
// whole micro-batches: 1F1B's peak. With per-chunk costs F = B = W every rank idles (p - 1) F,
// the ramp before the last rank's first forward that no schedule avoids (the paper's
// (p - 1)(F + B - 2W) = 0 leaves it out); in general never more than ZB-H1 on the same model
// (docs/pipeline.md, checked by the simulator).
Schedule zero_bubble_v(const ScheduleParams& s);
// DualPipe-V (DeepSeek's DualPipe, "cut in half": the DualPipe repository's DualPipeV, torchtitan's
// ScheduleDualPipeV), v == 2 in the V placement, m >= 2p. Eight phases per rank; its main phase
// pairs the forward of one chunk with the (fused) backward of the other chunk's different
// micro-batch, the pair DualPipe overlaps with each other's communication (the executor posts the
// pair's receives and sends together, batched). Input/weight splits fill the warm-up and the
// cool-down. In flight on rank r: at most 2p + 1 chunk micro-batches (DualPipe's PP + 1 with
// PP = 2p stages). Bubble with per-chunk costs: at most DeepSeek-V3's (p - 1)(F&B + (B + W) - 3W),
// F&B = F + B + W when nothing overlaps; (p - 1) F when F = B = W (checked by the simulator).
Schedule dualpipe_v(const ScheduleParams& s);

// Forwards only, micro-batch by micro-batch through every chunk (evaluation).
Schedule forward_only(const ScheduleParams& s);

// The schedule s.kind names; Auto: p == 1 -> no_pipelining, v == 1 -> 1F1B, else interleaved.
Schedule make_schedule(const ScheduleParams& s);
// "auto", "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe-v": the config's spelling.
const char* schedule_name(PipelineSchedule kind);
// The inverse, for programs that pick the schedule by name from their own flags (the trainer reads
// it from parallel.pipeline_schedule). Throws parallel::ConfigError naming the accepted spellings.
PipelineSchedule schedule_from_name(std::string_view name);

// Megatron's warm-up counts: 1F1B min(p - r - 1, m); interleaved min((p - r - 1) * 2 + (v - 1) * p,
// m * v), and all m * v when m == p.
int warmup_steps(const ScheduleParams& s);

// Global stage of (rank, chunk), and the (rank, chunk) holding global stage g, in a placement.
inline int global_stage(int pipeline_size, int rank, int chunk, Placement placement = Placement::Loop) {
  if (placement == Placement::V && chunk == 1) return 2 * pipeline_size - 1 - rank;
  return chunk * pipeline_size + rank;
}
struct StageOwner {
  int rank, chunk;
};
inline StageOwner stage_owner(int pipeline_size, int g, Placement placement = Placement::Loop) {
  if (placement == Placement::V && g >= pipeline_size) return {2 * pipeline_size - 1 - g, 1};
  return {g % pipeline_size, g / pipeline_size};
}

// A run of consecutive communication actions [begin, end) of one rank whose messages to and from
// `peer` are exactly those of a run of `peer`'s (1F1B's send-forward-receive-backward meeting the
// next stage's send-backward-receive-forward): the two ranks post them together, one batch_p2p each
// (one NCCL group), which then completes when both have posted, i.e. exactly when the receives
// alone would have. Only such mirrored pairs are batched, so that batching never waits for
// anything the schedule's own semantics does not (a send batched with an unrelated receive could:
// the schedule test shows interleaved and V schedules deadlocking under that).
struct PairedExchange {
  std::size_t begin, end;
  int peer;
};
std::vector<PairedExchange> paired_exchanges(const ScheduleParams& s,
                                             const std::function<Schedule(const ScheduleParams&)>& schedule);

std::string to_string(const Action& a);  // "F c1 m3", "RB c0 m2", "BI c0 m1", "W c0 m1", ...

}  // namespace parallel::pipeline
