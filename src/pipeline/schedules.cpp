// Pipeline schedules as data: see include/parallel/pipeline_schedule.hpp and docs/pipeline.md.
//
// The compute order of every schedule follows Megatron-Core's megatron/core/pipeline_parallel/
// schedules.py; the communication around each compute action is derived from the global stage
// alone, so that every schedule obeys the same rule and the executor needs no schedule-specific
// knowledge.
#include <algorithm>
#include <map>
#include <set>
#include <tuple>

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
  // The placement follows s.kind unless the schedule names its own (the V schedules, which may be
  // called directly).
  explicit Builder(const ScheduleParams& s) : Builder(s, placement_of(s.kind)) {}
  Builder(const ScheduleParams& s, Placement placement)
      : p_(s.pipeline_size),
        rank_(s.rank),
        last_stage_(s.pipeline_size * s.virtual_stages - 1),
        placement_(placement) {}

  void forward(int chunk, int micro_batch) {
    const int g = global_stage(p_, rank_, chunk, placement_);
    if (g != 0) out_.push_back({Op::RecvForward, chunk, micro_batch});
    out_.push_back({Op::Forward, chunk, micro_batch});
    if (g != last_stage_) out_.push_back({Op::SendForward, chunk, micro_batch});
  }

  void backward(int chunk, int micro_batch) {
    const int g = global_stage(p_, rank_, chunk, placement_);
    if (g != last_stage_) out_.push_back({Op::RecvBackward, chunk, micro_batch});
    out_.push_back({Op::Backward, chunk, micro_batch});
    if (g != 0) out_.push_back({Op::SendBackward, chunk, micro_batch});
  }

  // Split backward: B carries the backward's communication, W has none.
  void backward_input(int chunk, int micro_batch) {
    const int g = global_stage(p_, rank_, chunk, placement_);
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
  Placement placement_;
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

namespace {
void check_v(const ScheduleParams& s, const char* schedule, int min_micro_batches) {
  check_common(s, schedule);
  if (s.virtual_stages != 2)
    PARALLEL_FAIL("{} schedule needs virtual stages 2 (got {}): two chunks per rank in a V", schedule,
                  s.virtual_stages);
  if (s.micro_batches < min_micro_batches)
    PARALLEL_FAIL("{} schedule needs micro-batches ({}) >= {} for pipeline size {}", schedule,
                  s.micro_batches, min_micro_batches, s.pipeline_size);
}
}  // namespace

Schedule zero_bubble_v(const ScheduleParams& s) {
  check_v(s, "ZB-V", 2 * s.pipeline_size);
  const int p = s.pipeline_size, r = s.rank, m = s.micro_batches;
  Builder b(s, Placement::V);
  int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  // Warm-up: chunk 0 forwards until the first micro-batch can have turned at rank p - 1 and come
  // back up to this rank's chunk 1; from then on each chunk-1 forward is followed by its B and W.
  for (int i = 0; i < 2 * (p - r) - 1; ++i) b.forward(0, f0++);
  for (int i = 0; i < r; ++i) {
    b.forward(1, f1++);
    b.forward(0, f0++);
  }
  for (int i = 0; i < p - r; ++i) {
    b.forward(1, f1);
    b.backward_input(1, b1);
    b.backward_weight(1, b1++);
    ++f1;
  }
  // Steady: one micro-batch in and one out of each chunk per round.
  while (f1 < f0 || f0 < m) {
    if (f0 < m) b.forward(0, f0++);
    b.backward_input(0, b0);
    b.backward_weight(0, b0++);
    b.forward(1, f1++);
    b.backward_input(1, b1);
    b.backward_weight(1, b1++);
  }
  // Cool-down: the input steps first (they feed the ranks above), weight steps in the gaps and at
  // the end, each chunk's in micro-batch order.
  int w0 = b0, w1 = b1;
  for (int i = 0; i < r; ++i) {
    b.backward_input(0, b0++);
    b.backward_input(1, b1++);
  }
  for (int i = 0; i < p - r; ++i) {
    b.backward_input(0, b0++);
    b.backward_weight(0, w0++);
  }
  while (w1 < b1) b.backward_weight(1, w1++);
  while (w0 < b0) b.backward_weight(0, w0++);
  PARALLEL_CHECK(f0 == m && f1 == m && b0 == m && b1 == m && w0 == m && w1 == m,
                 "ZB-V: rank {} of {} with {} micro-batches ran F {} {}, B {} {}, W {} {}", r, p, m, f0, f1,
                 b0, b1, w0, w1);
  return b.take();
}

Schedule dualpipe_v(const ScheduleParams& s) {
  check_v(s, "DualPipe-V", 2 * s.pipeline_size);
  const int p = s.pipeline_size, r = s.rank, m = s.micro_batches;
  Builder b(s, Placement::V);
  int next_f[2] = {0, 0}, next_b[2] = {0, 0};
  // Split backwards leave their weight step in a queue that the W phases drain oldest first
  // (DualPipe's WeightGradStore).
  std::vector<std::pair<int, int>> deferred;
  std::size_t next_w = 0;
  auto f = [&](int chunk) { b.forward(chunk, next_f[chunk]++); };
  auto bw = [&](int chunk, bool split) {
    if (split) {
      b.backward_input(chunk, next_b[chunk]);
      deferred.push_back({chunk, next_b[chunk]});
    } else {
      b.backward(chunk, next_b[chunk]);
    }
    ++next_b[chunk];
  };
  auto w = [&] {
    PARALLEL_CHECK(next_w < deferred.size(), "DualPipe-V: rank {} has no deferred weight step", r);
    b.backward_weight(deferred[next_w].first, deferred[next_w].second);
    ++next_w;
  };
  // 1: chunk 0 forwards until the V turns at rank p - 1.
  for (int i = 0; i < 2 * (p - r - 1); ++i) f(0);
  // 2: forwards of both chunks.
  for (int i = 0; i < r + 1; ++i) {
    f(0);
    f(1);
  }
  // 3: chunk 1 backward (split, its W right after) and forward.
  for (int i = 0; i < p - r - 1; ++i) {
    bw(1, true);
    w();
    f(1);
  }
  // 4, the main phase: forward of one chunk paired with the backward of the other.
  for (int i = 0; i < m - 2 * p + r + 1; ++i) {
    f(0);
    bw(1, false);
    f(1);
    bw(0, false);
  }
  // 5: chunk 1's last backwards, each with the remaining chunk-1 forwards and chunk-0 backwards.
  for (int i = 0; i < p - r - 1; ++i) {
    bw(1, false);
    f(1);
    bw(0, false);
  }
  // 6: both chunks' last backwards; the second half splits (its weight steps fill the drain).
  bool split = false;
  for (int i = 0; i < r + 1; ++i) {
    if (i == (r + 1) / 2 && r % 2 == 1) split = true;
    bw(1, split);
    if (i == (r + 1) / 2 && r % 2 == 0) split = true;
    bw(0, split);
  }
  // 7: weight steps interleaved with chunk 0's last input steps.
  for (int i = 0; i < p - r - 1; ++i) {
    w();
    bw(0, true);
  }
  // 8: the remaining weight steps.
  for (int i = 0; i < r + 1; ++i) w();
  PARALLEL_CHECK(
      next_f[0] == m && next_f[1] == m && next_b[0] == m && next_b[1] == m && next_w == deferred.size(),
      "DualPipe-V: rank {} of {} with {} micro-batches left work undone", r, p, m);
  return b.take();
}

Placement placement_of(PipelineSchedule kind) {
  return kind == PipelineSchedule::ZeroBubbleV || kind == PipelineSchedule::DualPipeV ? Placement::V
                                                                                      : Placement::Loop;
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
    case PipelineSchedule::ZeroBubbleV:
      return zero_bubble_v(s);
    case PipelineSchedule::DualPipeV:
      return dualpipe_v(s);
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
    case PipelineSchedule::ZeroBubbleV:
      return "zb-v";
    case PipelineSchedule::DualPipeV:
      return "dualpipe-v";
  }
  return "?";
}

PipelineSchedule schedule_from_name(std::string_view name) {
  constexpr PipelineSchedule kAll[] = {PipelineSchedule::Auto,         PipelineSchedule::GPipe,
                                       PipelineSchedule::OneFOneB,     PipelineSchedule::Interleaved,
                                       PipelineSchedule::ZeroBubbleH1, PipelineSchedule::ZeroBubbleV,
                                       PipelineSchedule::DualPipeV};
  std::string names;
  for (PipelineSchedule kind : kAll) {
    if (name == schedule_name(kind)) return kind;
    names += names.empty() ? "" : ", ";
    names += schedule_name(kind);
  }
  throw ConfigError(fmt::format("unknown pipeline schedule '{}' (expected one of {})", name, names));
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

namespace {
// A message as sender and receiver both name it: (gradient, micro-batch, destination stage).
using MessageId = std::tuple<bool, int, int>;

bool is_communication(Op op) {
  return op == Op::RecvForward || op == Op::SendForward || op == Op::RecvBackward || op == Op::SendBackward;
}

// The message of a communication action of `rank`, and the other rank it goes to or comes from.
std::pair<MessageId, int> message_of(int p, int rank, Placement placement, const Action& a) {
  const int g = global_stage(p, rank, a.chunk, placement);
  const bool gradient = a.op == Op::SendBackward || a.op == Op::RecvBackward;
  const bool send = a.op == Op::SendForward || a.op == Op::SendBackward;
  const int other = g + ((send != gradient) ? 1 : -1);  // the stage at the other end
  const int dest = send ? other : g;
  return {{gradient, a.micro_batch, dest}, stage_owner(p, other, placement).rank};
}

// Per run of communication actions: its bounds and, per peer, the messages exchanged with it.
struct Run {
  std::size_t begin, end;
  std::map<int, std::set<MessageId>> with;
  std::map<int, std::pair<bool, bool>> directions;  // peer -> (sends to it, receives from it)
};

std::vector<Run> runs_of(int p, int rank, Placement placement, const Schedule& s) {
  std::vector<Run> out;
  for (std::size_t i = 0; i < s.size();) {
    if (!is_communication(s[i].op)) {
      ++i;
      continue;
    }
    Run run{i, i, {}, {}};
    for (; run.end < s.size() && is_communication(s[run.end].op); ++run.end) {
      const Action& a = s[run.end];
      const auto [id, peer] = message_of(p, rank, placement, a);
      if (peer == rank) continue;  // stays on the rank
      run.with[peer].insert(id);
      auto& [sends, receives] = run.directions[peer];
      (a.op == Op::SendForward || a.op == Op::SendBackward ? sends : receives) = true;
    }
    i = run.end;
    out.push_back(std::move(run));
  }
  return out;
}
}  // namespace

std::vector<PairedExchange> paired_exchanges(const ScheduleParams& s,
                                             const std::function<Schedule(const ScheduleParams&)>& schedule) {
  const int p = s.pipeline_size;
  const Placement placement = placement_of(s.kind);
  // Per peer, the message sets its runs exchange with this rank (a run mirrors one of ours when
  // the sets are equal): looked up, not scanned - a step of many micro-batches has hundreds of
  // runs, and the planner builds an executor per traced rank of every layout it plans.
  std::map<int, std::set<std::set<MessageId>>> theirs;
  std::vector<PairedExchange> out;
  for (const Run& run : runs_of(p, s.rank, placement, schedule(s))) {
    for (const auto& [peer, ids] : run.with) {
      const auto [sends, receives] = run.directions.at(peer);
      if (!sends || !receives) continue;
      auto mirrors = theirs.find(peer);
      if (mirrors == theirs.end()) {
        ScheduleParams other = s;
        other.rank = peer;
        mirrors = theirs.emplace(peer, std::set<std::set<MessageId>>{}).first;
        for (Run& mirror : runs_of(p, peer, placement, schedule(other))) {
          auto it = mirror.with.find(s.rank);
          if (it != mirror.with.end()) mirrors->second.insert(std::move(it->second));
        }
      }
      if (mirrors->second.count(ids)) out.push_back({run.begin, run.end, peer});
    }
  }
  return out;
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
