#pragma once
// Pipeline schedules as data.
//
// A schedule is a pure function of (pipeline size p, rank r, micro-batches m, virtual stages v)
// returning the ordered actions of one rank. The executor (pipeline_executor.hpp) runs the list;
// tests simulate the lists of all ranks together to prove them deadlock-free. A new schedule
// (zero-bubble, DualPipe) is a new function here, nothing else.
//
// Model chunks: with v virtual stages, rank r holds chunks c = 0..v-1, chunk c of rank r being
// global stage c*p + r (Megatron's interleaved assignment: rank r holds layers of stages r, r+p,
// r+2p, ...). Activations flow global stage g -> g+1, gradients g+1 -> g.
//
// Communication semantics the executor implements and the simulator checks: sends never block
// (they are posted asynchronously and completed later); a receive blocks until its message has been
// sent. Messages are identified by (kind, micro-batch, global stage), never by arrival order.
//
// Backward comes fused (Backward: input and weight gradients together) or split, for zero-bubble
// schedules: BackwardInput (B, the input gradient, on the critical path: it carries the receive
// and send of a backward) then BackwardWeight (W, the weight gradients, no communication) of the
// same (chunk, micro-batch), later on the same rank.
#include <cstdint>
#include <string>
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

// Forwards only, micro-batch by micro-batch through every chunk (evaluation).
Schedule forward_only(const ScheduleParams& s);

// The schedule s.kind names; Auto: p == 1 -> no_pipelining, v == 1 -> 1F1B, else interleaved.
Schedule make_schedule(const ScheduleParams& s);
// "auto", "gpipe", "1f1b", "interleaved", "zb-h1": the config's spelling.
const char* schedule_name(PipelineSchedule kind);

// Megatron's warm-up counts: 1F1B min(p - r - 1, m); interleaved min((p - r - 1) * 2 + (v - 1) * p,
// m * v), and all m * v when m == p.
int warmup_steps(const ScheduleParams& s);

// Global stage of (rank, chunk) and its inverse.
inline int global_stage(int pipeline_size, int rank, int chunk) { return chunk * pipeline_size + rank; }

std::string to_string(const Action& a);  // "F c1 m3", "RB c0 m2", "BI c0 m1", "W c0 m1", ...

}  // namespace parallel::pipeline
