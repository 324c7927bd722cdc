// Pipeline schedules as data: see include/parallel/pipeline_schedule.hpp and docs/pipeline.md.
//
// The compute order of every schedule follows Megatron-Core's megatron/core/pipeline_parallel/
// schedules.py; the communication around each compute action is derived from the global stage
// alone, so that every schedule obeys the same rule and the executor needs no schedule-specific
// knowledge.
#include <algorithm>

#include "parallel/error.hpp"
#include "parallel/pipeline_schedule.hpp"

namespace parallel::pipeline {
namespace {

// Rules that hold for every schedule; checked first so that the schedule-specific messages can
// assume sane numbers.
void check_common(const ScheduleParams& s, const char* schedule) {
  if (s.pipeline_size < 1)
    PARALLEL_FAIL("{} schedule needs pipeline size >= 1 (got {})", schedule, s.pipeline_size);
  if (s.rank < 0 || s.rank >= s.pipeline_size)
    PARALLEL_FAIL("{} schedule needs rank in [0, pipeline size {}) (got {})", schedule, s.pipeline_size,
                  s.rank);
  if (s.micro_batches < 1)
    PARALLEL_FAIL("{} schedule needs micro-batches >= 1 (got {})", schedule, s.micro_batches);
  if (s.virtual_stages < 1)
    PARALLEL_FAIL("{} schedule needs virtual stages >= 1 (got {})", schedule, s.virtual_stages);
}

void check_interleaved(const ScheduleParams& s) {
  check_common(s, "interleaved");
  if (s.virtual_stages < 2)
    PARALLEL_FAIL("interleaved schedule needs virtual stages > 1 (got {}); use 1F1B for 1", s.virtual_stages);
  if (s.pipeline_size < 2)
    PARALLEL_FAIL("interleaved schedule needs pipeline size > 1 (got {}) for virtual stages ({})",
                  s.pipeline_size, s.virtual_stages);
  // Megatron's classic interleaved schedule walks micro-batches in groups of p per chunk; a partial
  // last group would make a rank wait on a chunk its neighbour has not reached (dependency bubble).
  if (s.micro_batches % s.pipeline_size != 0)
    PARALLEL_FAIL("interleaved schedule needs micro-batches ({}) divisible by pipeline size ({})",
                  s.micro_batches, s.pipeline_size);
}

// Appends compute actions together with the point-to-point traffic they imply. The first global
// stage reads its input from the data loader and the last computes the loss itself, which is why
// those two skip the receive/send on the corresponding side.
class Builder {
 public:
  explicit Builder(const ScheduleParams& s)
      : p_(s.pipeline_size), rank_(s.rank), last_stage_(s.pipeline_size * s.virtual_stages - 1) {}

  void forward(int chunk, int micro_batch) {
    const int g = global_stage(p_, rank_, chunk);
    if (g != 0) out_.push_back({Op::RecvForward, chunk, micro_batch});
    out_.push_back({Op::Forward, chunk, micro_batch});
    if (g != last_stage_) out_.push_back({Op::SendForward, chunk, micro_batch});
  }

  void backward(int chunk, int micro_batch) {
    const int g = global_stage(p_, rank_, chunk);
    if (g != last_stage_) out_.push_back({Op::RecvBackward, chunk, micro_batch});
    out_.push_back({Op::Backward, chunk, micro_batch});
    if (g != 0) out_.push_back({Op::SendBackward, chunk, micro_batch});
  }

  // Split backward: B carries the backward's communication, W has none.
  void backward_input(int chunk, int micro_batch) {
    const int g = global_stage(p_, rank_, chunk);
    if (g != last_stage_) out_.push_back({Op::RecvBackward, chunk, micro_batch});
    out_.push_back({Op::BackwardInput, chunk, micro_batch});
    if (g != 0) out_.push_back({Op::SendBackward, chunk, micro_batch});
  }
  void backward_weight(int chunk, int micro_batch) {
    out_.push_back({Op::BackwardWeight, chunk, micro_batch});
  }

  Schedule take() { return std::move(out_); }

 private:
  int p_;
  int rank_;
  int last_stage_;
  Schedule out_;
};

}  // namespace

Schedule no_pipelining(const ScheduleParams& s) {
  check_common(s, "no-pipelining");
  if (s.pipeline_size != 1)
    PARALLEL_FAIL("no-pipelining schedule needs pipeline size 1 (got {})", s.pipeline_size);
  if (s.virtual_stages != 1)
    PARALLEL_FAIL("no-pipelining schedule needs virtual stages 1 (got {})", s.virtual_stages);
  Builder b(s);
  for (int mb = 0; mb < s.micro_batches; ++mb) {
    b.forward(0, mb);
    b.backward(0, mb);
  }
  return b.take();
}

Schedule gpipe(const ScheduleParams& s) {
  check_common(s, "GPipe");
  // Chunked GPipe would need its own chunk order and proof; nothing asks for it, so refuse it
  // rather than ship an unverified order.
  if (s.virtual_stages != 1)
    PARALLEL_FAIL("GPipe schedule needs virtual stages 1 (got {}); use the interleaved schedule",
                  s.virtual_stages);
  Builder b(s);
  for (int mb = 0; mb < s.micro_batches; ++mb) b.forward(0, mb);
  for (int mb = 0; mb < s.micro_batches; ++mb) b.backward(0, mb);
  return b.take();
}

Schedule forward_only(const ScheduleParams& s) {
  check_common(s, "forward-only");
  // Micro-batch by micro-batch through this rank's chunks in stage order. Deadlock-free by induction
  // on (micro-batch, global stage): everything a rank does before a forward has a smaller pair, and
  // a forward waits only for the same micro-batch's previous stage.
  Builder b(s);
  for (int mb = 0; mb < s.micro_batches; ++mb)
    for (int c = 0; c < s.virtual_stages; ++c) b.forward(c, mb);
  return b.take();
}

Schedule one_f_one_b(const ScheduleParams& s) {
  check_common(s, "1F1B");
  if (s.virtual_stages != 1)
    PARALLEL_FAIL("1F1B schedule needs virtual stages 1 (got {}); use the interleaved schedule",
                  s.virtual_stages);
  const int m = s.micro_batches;
  const int warmup = warmup_steps(s);
  Builder b(s);
  for (int i = 0; i < warmup; ++i) b.forward(0, i);
  for (int i = 0; i < m - warmup; ++i) {
    b.forward(0, warmup + i);
    b.backward(0, i);
  }
  for (int i = m - warmup; i < m; ++i) b.backward(0, i);
  return b.take();
}

Schedule interleaved_one_f_one_b(const ScheduleParams& s) {
  check_interleaved(s);
  const int p = s.pipeline_size;
  const int v = s.virtual_stages;
  const int total = s.micro_batches * v;
  const int warmup = warmup_steps(s);

  // Virtual micro-batch k walks groups of p micro-batches through chunk 0, then chunk 1, ...;
  // backwards walk the chunks in reverse because gradients enter at the last chunk.
  auto forward_chunk = [&](int k) { return (k % (p * v)) / p; };
  auto backward_chunk = [&](int k) { return v - 1 - forward_chunk(k); };
  auto micro_batch = [&](int k) { return (k / (p * v)) * p + k % p; };

  Builder b(s);
  for (int k = 0; k < warmup; ++k) b.forward(forward_chunk(k), micro_batch(k));
  for (int i = 0; i < total - warmup; ++i) {
    const int f = warmup + i;
    b.forward(forward_chunk(f), micro_batch(f));
    b.backward(backward_chunk(i), micro_batch(i));
  }
  for (int k = total - warmup; k < total; ++k) b.backward(backward_chunk(k), micro_batch(k));
  return b.take();
}

Schedule zero_bubble_h1(const ScheduleParams& s) {
  check_common(s, "ZB-H1");
  if (s.virtual_stages != 1)
    PARALLEL_FAIL("ZB-H1 schedule needs virtual stages 1 (got {})", s.virtual_stages);
  const int m = s.micro_batches;
  const int warmup = std::min(s.pipeline_size - s.rank - 1, m);
  // Rank r keeps up to r weight steps pending: the later a rank, the earlier its gradients arrive
  // in the cool-down, and the pending W's fill exactly the gaps 1F1B leaves there (the last rank,
  // r = p - 1, keeps p - 1 but meets no gap until the end). With this delay the W-pending
  // micro-batches of rank r plus its 1F1B in-flight ones never exceed p: rank 0's 1F1B peak.
  const std::size_t delay = static_cast<std::size_t>(s.rank);
  Builder b(s);
  std::vector<int> pending;  // micro-batches whose B ran and W did not, oldest first
  auto input_step = [&](int mb) {
    b.backward_input(0, mb);
    pending.push_back(mb);
    if (pending.size() > delay) {
      b.backward_weight(0, pending.front());
      pending.erase(pending.begin());
    }
  };
  for (int i = 0; i < warmup; ++i) b.forward(0, i);
  for (int i = 0; i < m - warmup; ++i) {
    b.forward(0, warmup + i);
    input_step(i);
  }
  for (int i = m - warmup; i < m; ++i) input_step(i);
  for (int mb : pending) b.backward_weight(0, mb);
  return b.take();
}

Schedule make_schedule(const ScheduleParams& s) {
  switch (s.kind) {
    case PipelineSchedule::GPipe:
      return gpipe(s);
    case PipelineSchedule::OneFOneB:
      return one_f_one_b(s);
    case PipelineSchedule::Interleaved:
      return interleaved_one_f_one_b(s);
    case PipelineSchedule::ZeroBubbleH1:
      return zero_bubble_h1(s);
    case PipelineSchedule::Auto:
      break;
  }
  // v > 1 goes to the interleaved schedule even for p == 1 so that the user hears the interleaving
  // rule that was broken, not a no-pipelining one.
  if (s.virtual_stages > 1) return interleaved_one_f_one_b(s);
  if (s.pipeline_size == 1) return no_pipelining(s);
  return one_f_one_b(s);
}

const char* schedule_name(PipelineSchedule kind) {
  switch (kind) {
    case PipelineSchedule::Auto:
      return "auto";
    case PipelineSchedule::GPipe:
      return "gpipe";
    case PipelineSchedule::OneFOneB:
      return "1f1b";
    case PipelineSchedule::Interleaved:
      return "interleaved";
    case PipelineSchedule::ZeroBubbleH1:
      return "zb-h1";
  }
  return "?";
}

int warmup_steps(const ScheduleParams& s) {
  if (s.virtual_stages > 1) {
    check_interleaved(s);
    const int p = s.pipeline_size;
    const int total = s.micro_batches * s.virtual_stages;
    // Megatron's classic rule: with exactly one group of micro-batches there is no steady state
    // worth having, every forward runs before the first backward.
    if (s.micro_batches == p) return total;
    const int warmup = (p - s.rank - 1) * 2 + (s.virtual_stages - 1) * p;
    return std::min(warmup, total);
  }
  check_common(s, "1F1B");
  return std::min(s.pipeline_size - s.rank - 1, s.micro_batches);
}

std::string to_string(const Action& a) {
  const char* name = "?";
  switch (a.op) {
    case Op::RecvForward:
      name = "RF";
      break;
    case Op::Forward:
      name = "F";
      break;
    case Op::SendForward:
      name = "SF";
      break;
    case Op::RecvBackward:
      name = "RB";
      break;
    case Op::Backward:
      name = "B";
      break;
    case Op::SendBackward:
      name = "SB";
      break;
    case Op::BackwardInput:
      name = "BI";
      break;
    case Op::BackwardWeight:
      name = "W";
      break;
  }
  return fmt::format("{} c{} m{}", name, a.chunk, a.micro_batch);
}

}  // namespace parallel::pipeline
