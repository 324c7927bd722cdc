#pragma once
// Opt-in wall time of the real ops, to hold a measured step against the planner's priced one
// (`pretrain_gpt --plan --breakdown`; docs/planner.md, "Where the tiny step's time goes").
//
// With PARALLEL_OP_TIMES=1 in the environment, every call of an `ops::` function (and of
// Tensor::copy_ / fill_, which the meta step records as ops) adds its wall time, from the start of
// its argument checks to its return, to its op's entry on the calling thread (an op called inside
// another op counts in the outer one; a meta call counts the time of its recording). Off (the
// default), an op pays one branch on a flag read once. CUDA ops are timed as issued, not as run.
// The trainer resets the counts after its warm-up steps and prints, at the end, the ops' share of
// the step beside the communication waits and the rest (docs/planner.md).
#include <cstdint>
#include <map>
#include <string>

namespace parallel::ops {

struct OpTime {
  int64_t calls = 0;
  double seconds = 0;
};

// Whether PARALLEL_OP_TIMES is set to something other than "0" (read once, at the first call), or
// what set_op_times_enabled last said.
bool op_times_enabled();
// Turns the timing on or off for the ops called from now on, whatever the environment says
// (calibrate_machine times a layer's host code between its ops this way). Call it between ops,
// not while one runs.
void set_op_times_enabled(bool enabled);
// This thread's totals since the last reset, per op name.
std::map<std::string, OpTime> op_times();
void reset_op_times();

// The RAII span an op opens first (ops.cpp): records on destruction when enabled and outermost.
class OpTimeSpan {
 public:
  explicit OpTimeSpan(const char* op);
  ~OpTimeSpan();
  OpTimeSpan(const OpTimeSpan&) = delete;
  OpTimeSpan& operator=(const OpTimeSpan&) = delete;

 private:
  const char* op_ = nullptr;  // null: not recording (off, or nested)
  int64_t start_ns_ = 0;
};

}  // namespace parallel::ops
