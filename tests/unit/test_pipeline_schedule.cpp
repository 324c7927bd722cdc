// Pipeline schedules: every schedule of every rank is run together in a simulator that implements
// the communication semantics of pipeline_schedule.hpp (non-blocking sends, blocking receives,
// messages keyed by (kind, micro-batch, destination stage)). The simulator proves the schedules
// deadlock-free and consistent, measures micro-batches in flight, and, with forward cost 1 and
// backward cost 2, measures the pipeline bubble against the published theory.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/error.hpp"
#include "parallel/pipeline_schedule.hpp"

namespace {

using parallel::pipeline::Action;
using parallel::pipeline::global_stage;
using parallel::pipeline::Op;
using parallel::pipeline::Schedule;
using parallel::pipeline::ScheduleParams;
using ScheduleFn = std::function<Schedule(const ScheduleParams&)>;

constexpr int kForwardCost = 1;
constexpr int kBackwardCost = 2;

bool is_compute(Op op) { return op == Op::Forward || op == Op::Backward; }

std::string describe(const Schedule& s) {
  std::string out;
  for (const Action& a : s) out += parallel::pipeline::to_string(a) + ", ";
  return out;
}

Schedule compute_only(const Schedule& s) {
  Schedule out;
  for (const Action& a : s)
    if (is_compute(a.op)) out.push_back(a);
  return out;
}

// The communication every compute action must carry, written independently of the library so that
// the test catches a schedule that forgets a send or receives on the wrong side.
Schedule with_communication(const Schedule& compute, int p, int r, int v) {
  const int last = p * v - 1;
  Schedule out;
  for (const Action& a : compute) {
    const int g = global_stage(p, r, a.chunk);
    if (a.op == Op::Forward) {
      if (g != 0) out.push_back({Op::RecvForward, a.chunk, a.micro_batch});
      out.push_back(a);
      if (g != last) out.push_back({Op::SendForward, a.chunk, a.micro_batch});
    } else {
      if (g != last) out.push_back({Op::RecvBackward, a.chunk, a.micro_batch});
      out.push_back(a);
      if (g != 0) out.push_back({Op::SendBackward, a.chunk, a.micro_batch});
    }
  }
  return out;
}

std::vector<Schedule> all_ranks(const ScheduleFn& fn, int p, int m, int v) {
  std::vector<Schedule> out;
  for (int r = 0; r < p; ++r)
    out.push_back(fn({.pipeline_size = p, .rank = r, .micro_batches = m, .virtual_stages = v}));
  return out;
}

enum class Kind { Activation, Gradient };
using MessageKey = std::tuple<Kind, int, int>;  // kind, micro-batch, destination global stage

struct Message {
  int sent = 0;
  int received = 0;
  long time = 0;  // simulated clock of the sender when it posted the message
};

struct SimulationResult {
  bool ok = false;                 // finished without deadlock or inconsistency
  std::vector<int> max_in_flight;  // per rank: forwards done whose backward is not, over all chunks
  std::vector<long> busy;          // per rank: simulated compute time
  long makespan = 0;               // simulated time at which the last rank finishes
};

// Runs the schedules of all ranks together. Each round advances every rank that can advance by one
// action; a rank blocks only on a receive whose message has not been sent. The round-robin order
// does not affect the timing: an action's simulated start is the later of its rank's clock and the
// arrival of the message it waits for, so timing follows the dependency graph alone.
// forward_only: the schedules have no backward (evaluation); activations are the only messages.
SimulationResult simulate(const std::vector<Schedule>& ranks, int p, int m, int v,
                          bool forward_only = false) {
  SimulationResult res;
  res.max_in_flight.assign(p, 0);
  res.busy.assign(p, 0);
  const int last = p * v - 1;
  std::map<MessageKey, Message> messages;
  // (global stage, micro-batch) -> global event number of its forward / backward.
  std::map<std::pair<int, int>, long> forward_at, backward_at;
  std::vector<size_t> pc(p, 0);
  std::vector<long> clock(p, 0);
  std::vector<int> in_flight(p, 0);
  long event = 0;

  while (true) {
    bool all_done = true;
    bool progressed = false;
    for (int r = 0; r < p; ++r) {
      if (pc[r] == ranks[r].size()) continue;
      all_done = false;
      const Action& a = ranks[r][pc[r]];
      if (a.chunk < 0 || a.chunk >= v || a.micro_batch < 0 || a.micro_batch >= m) {
        ADD_FAILURE() << "rank " << r << " action out of range: " << parallel::pipeline::to_string(a);
        return res;
      }
      const int g = global_stage(p, r, a.chunk);
      const std::pair<int, int> key{g, a.micro_batch};
      switch (a.op) {
        case Op::RecvForward:
        case Op::RecvBackward: {
          const Kind kind = a.op == Op::RecvForward ? Kind::Activation : Kind::Gradient;
          auto it = messages.find({kind, a.micro_batch, g});
          if (it == messages.end() || it->second.received >= it->second.sent) continue;  // blocked
          ++it->second.received;
          clock[r] = std::max(clock[r], it->second.time);
          break;
        }
        case Op::SendForward:
        case Op::SendBackward: {
          const bool fwd = a.op == Op::SendForward;
          const int dest = fwd ? g + 1 : g - 1;
          if (dest < 0 || dest > last) {
            ADD_FAILURE() << "rank " << r
                          << " sends past the pipeline end: " << parallel::pipeline::to_string(a);
            return res;
          }
          Message& msg = messages[{fwd ? Kind::Activation : Kind::Gradient, a.micro_batch, dest}];
          ++msg.sent;
          msg.time = clock[r];
          break;
        }
        case Op::Forward: {
          if (forward_at.count(key)) {
            ADD_FAILURE() << "second forward of stage " << g << " micro-batch " << a.micro_batch;
            return res;
          }
          if (g > 0 && !forward_at.count({g - 1, a.micro_batch})) {
            ADD_FAILURE() << "forward of stage " << g << " micro-batch " << a.micro_batch
                          << " before the forward of stage " << g - 1;
            return res;
          }
          forward_at[key] = event;
          clock[r] += kForwardCost;
          res.busy[r] += kForwardCost;
          res.max_in_flight[r] = std::max(res.max_in_flight[r], ++in_flight[r]);
          break;
        }
        case Op::Backward: {
          // The stage determines the rank, so "forward done on this stage" is "on this rank".
          auto fwd = forward_at.find(key);
          if (fwd == forward_at.end()) {
            ADD_FAILURE() << "backward of stage " << g << " micro-batch " << a.micro_batch
                          << " before its forward";
            return res;
          }
          if (backward_at.count(key)) {
            ADD_FAILURE() << "second backward of stage " << g << " micro-batch " << a.micro_batch;
            return res;
          }
          if (g < last) {
            auto next = backward_at.find({g + 1, a.micro_batch});
            if (next == backward_at.end() || next->second >= event) {
              ADD_FAILURE() << "backward of stage " << g << " micro-batch " << a.micro_batch
                            << " before the backward of stage " << g + 1;
              return res;
            }
          }
          backward_at[key] = event;
          clock[r] += kBackwardCost;
          res.busy[r] += kBackwardCost;
          --in_flight[r];
          break;
        }
      }
      ++pc[r];
      ++event;
      progressed = true;
    }
    if (all_done) break;
    if (!progressed) {
      std::string blocked;
      for (int r = 0; r < p; ++r)
        if (pc[r] < ranks[r].size())
          blocked += " rank " + std::to_string(r) + " at #" + std::to_string(pc[r]) + " (" +
                     parallel::pipeline::to_string(ranks[r][pc[r]]) + ")";
      ADD_FAILURE() << "deadlock:" << blocked;
      return res;
    }
  }

  bool ok = true;
  for (const auto& [k, msg] : messages) {
    if (msg.sent != 1 || msg.received != 1) {
      ADD_FAILURE() << "message (kind " << static_cast<int>(std::get<0>(k)) << ", micro-batch "
                    << std::get<1>(k) << ", stage " << std::get<2>(k) << ") sent " << msg.sent << " received "
                    << msg.received;
      ok = false;
    }
  }
  for (int g = 0; g <= last; ++g) {
    for (int mb = 0; mb < m; ++mb) {
      if (!forward_at.count({g, mb}) || forward_only == backward_at.count({g, mb}) > 0) {
        ADD_FAILURE() << "stage " << g << " micro-batch " << mb << " misses its forward or backward";
        ok = false;
      }
    }
  }
  // Every activation crosses each of the p*v - 1 stage boundaries once, and so does every gradient.
  EXPECT_EQ(messages.size(), static_cast<size_t>((forward_only ? 1 : 2) * last * m));
  for (int r = 0; r < p; ++r) EXPECT_EQ(in_flight[r], forward_only ? m * v : 0) << "rank " << r;
  res.makespan = *std::max_element(clock.begin(), clock.end());
  res.ok = ok;
  return res;
}

int forwards_before_first_backward(const Schedule& s) {
  int n = 0;
  for (const Action& a : s) {
    if (a.op == Op::Backward) break;
    if (a.op == Op::Forward) ++n;
  }
  return n;
}

// With forward 1, backward 2 and free communication, a rank's ideal time is busy; the bubble is
// what the slowest rank adds on top. Theory: idle / busy = (p - 1) / (v * m), i.e. an idle time of
// (p - 1) * (forward + backward) of one chunk; compared in integers so the check is exact.
void expect_bubble(const SimulationResult& res, int p, int m, int v) {
  for (int r = 0; r < p; ++r) {
    const long idle = res.makespan - res.busy[r];
    EXPECT_EQ(res.busy[r], static_cast<long>(m) * v * (kForwardCost + kBackwardCost)) << "rank " << r;
    EXPECT_EQ(idle * m * v, static_cast<long>(p - 1) * res.busy[r])
        << "rank " << r << ": idle " << idle << " busy " << res.busy[r] << ", theory (p-1)/(v*m) = " << p - 1
        << "/" << v * m;
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const parallel::Error& e) {
    return e.what();
  }
  return "<no error>";
}

void expect_error(const std::function<void()>& f, const std::string& expected) {
  const std::string msg = error_of(f);
  EXPECT_NE(msg.find(expected), std::string::npos) << "message: " << msg << "\nexpected: " << expected;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;
}

TEST(PipelineSchedule, OneFOneBSimulatesForAllShapes) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      SCOPED_TRACE("1F1B p=" + std::to_string(p) + " m=" + std::to_string(m));
      const auto ranks = all_ranks(parallel::pipeline::one_f_one_b, p, m, 1);
      const SimulationResult res = simulate(ranks, p, m, 1);
      ASSERT_TRUE(res.ok);
      for (int r = 0; r < p; ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        EXPECT_EQ(ranks[r], with_communication(compute_only(ranks[r]), p, r, 1)) << describe(ranks[r]);
        // Megatron's memory bound for 1F1B: stage r keeps at most p - r activations alive.
        EXPECT_EQ(res.max_in_flight[r], std::min(p - r, m));
      }
      expect_bubble(res, p, m, 1);
    }
  }
}

TEST(PipelineSchedule, InterleavedSimulatesForAllShapes) {
  for (int p = 2; p <= 8; ++p) {
    for (int v = 2; v <= 4; ++v) {
      for (int groups = 1; groups <= 4; ++groups) {
        const int m = p * groups;
        SCOPED_TRACE("interleaved p=" + std::to_string(p) + " v=" + std::to_string(v) +
                     " m=" + std::to_string(m));
        const auto ranks = all_ranks(parallel::pipeline::interleaved_one_f_one_b, p, m, v);
        const SimulationResult res = simulate(ranks, p, m, v);
        ASSERT_TRUE(res.ok);
        for (int r = 0; r < p; ++r) {
          SCOPED_TRACE("rank " + std::to_string(r));
          EXPECT_EQ(ranks[r], with_communication(compute_only(ranks[r]), p, r, v)) << describe(ranks[r]);
          const int warmup = parallel::pipeline::warmup_steps({p, r, m, v});
          EXPECT_LE(res.max_in_flight[r], warmup + 1);
          EXPECT_EQ(res.max_in_flight[r], std::min(warmup + 1, m * v));
        }
        expect_bubble(res, p, m, v);
      }
    }
  }
}

TEST(PipelineSchedule, GPipeSimulatesForAllShapes) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      SCOPED_TRACE("GPipe p=" + std::to_string(p) + " m=" + std::to_string(m));
      const auto ranks = all_ranks(parallel::pipeline::gpipe, p, m, 1);
      const SimulationResult res = simulate(ranks, p, m, 1);
      ASSERT_TRUE(res.ok);
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(ranks[r], with_communication(compute_only(ranks[r]), p, r, 1));
        // GPipe's cost: every micro-batch's activations are alive at once.
        EXPECT_EQ(res.max_in_flight[r], m);
      }
      expect_bubble(res, p, m, 1);
    }
  }
}

TEST(PipelineSchedule, NoPipeliningIsForwardBackwardPerMicroBatch) {
  const Schedule s = parallel::pipeline::no_pipelining({.pipeline_size = 1, .rank = 0, .micro_batches = 3});
  const Schedule expected = {{Op::Forward, 0, 0},  {Op::Backward, 0, 0}, {Op::Forward, 0, 1},
                             {Op::Backward, 0, 1}, {Op::Forward, 0, 2},  {Op::Backward, 0, 2}};
  EXPECT_EQ(s, expected) << describe(s);
  const SimulationResult res = simulate({s}, 1, 3, 1);
  EXPECT_TRUE(res.ok);
  EXPECT_EQ(res.max_in_flight[0], 1);
}

TEST(PipelineSchedule, MakeScheduleDispatches) {
  for (int p = 1; p <= 4; ++p) {
    for (int v = 1; v <= 3; ++v) {
      if (p == 1 && v > 1) continue;
      const int m = 2 * p;
      for (int r = 0; r < p; ++r) {
        const ScheduleParams s{p, r, m, v};
        const Schedule expected = p == 1   ? parallel::pipeline::no_pipelining(s)
                                  : v == 1 ? parallel::pipeline::one_f_one_b(s)
                                           : parallel::pipeline::interleaved_one_f_one_b(s);
        EXPECT_EQ(parallel::pipeline::make_schedule(s), expected) << "p=" << p << " v=" << v << " r=" << r;
      }
      EXPECT_TRUE(simulate(all_ranks(parallel::pipeline::make_schedule, p, m, v), p, m, v).ok);
    }
  }
}

// Megatron's warm-up counts. The steady state starts with a forward, so the number of forwards a rank
// runs before its first backward is warm-up + 1, unless warm-up already covers every micro-batch.
TEST(PipelineSchedule, WarmupMatchesMegatronFormulas) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      for (int r = 0; r < p; ++r) {
        const ScheduleParams s{p, r, m, 1};
        const int warmup = std::min(p - r - 1, m);
        EXPECT_EQ(parallel::pipeline::warmup_steps(s), warmup) << "p=" << p << " m=" << m << " r=" << r;
        EXPECT_EQ(forwards_before_first_backward(parallel::pipeline::one_f_one_b(s)), std::min(warmup + 1, m))
            << "p=" << p << " m=" << m << " r=" << r;
      }
    }
  }
  for (int p = 2; p <= 8; ++p) {
    for (int v = 2; v <= 4; ++v) {
      for (int m = p; m <= 4 * p; m += p) {
        for (int r = 0; r < p; ++r) {
          const ScheduleParams s{p, r, m, v};
          const int total = m * v;
          const int warmup = m == p ? total : std::min((p - r - 1) * 2 + (v - 1) * p, total);
          EXPECT_EQ(parallel::pipeline::warmup_steps(s), warmup) << "p=" << p << " v=" << v << " m=" << m;
          EXPECT_EQ(forwards_before_first_backward(parallel::pipeline::interleaved_one_f_one_b(s)),
                    std::min(warmup + 1, total))
              << "p=" << p << " v=" << v << " m=" << m << " r=" << r;
        }
      }
    }
  }
}

Schedule seq(std::initializer_list<Action> actions) { return Schedule(actions); }

// p = 2, m = 3.
// Rank 0: warm-up min(2 - 0 - 1, 3) = 1 -> F0; steady 3 - 1 = 2 iterations (F1 B0), (F2 B1);
//         cool-down 1 -> B2.
// Rank 1: warm-up 0; steady 3 iterations (F0 B0), (F1 B1), (F2 B2).
TEST(PipelineSchedule, OneFOneBByHand) {
  const auto f = [](int mb) { return Action{Op::Forward, 0, mb}; };
  const auto b = [](int mb) { return Action{Op::Backward, 0, mb}; };
  const Schedule r0 = parallel::pipeline::one_f_one_b({.pipeline_size = 2, .rank = 0, .micro_batches = 3});
  const Schedule r1 = parallel::pipeline::one_f_one_b({.pipeline_size = 2, .rank = 1, .micro_batches = 3});
  EXPECT_EQ(compute_only(r0), seq({f(0), f(1), b(0), f(2), b(1), b(2)})) << describe(r0);
  EXPECT_EQ(compute_only(r1), seq({f(0), b(0), f(1), b(1), f(2), b(2)})) << describe(r1);

  // Rank 0 is stage 0 of 2: it never receives activations nor sends gradients.
  const Schedule r0_full = {{Op::Forward, 0, 0},     {Op::SendForward, 0, 0},  {Op::Forward, 0, 1},
                            {Op::SendForward, 0, 1}, {Op::RecvBackward, 0, 0}, {Op::Backward, 0, 0},
                            {Op::Forward, 0, 2},     {Op::SendForward, 0, 2},  {Op::RecvBackward, 0, 1},
                            {Op::Backward, 0, 1},    {Op::RecvBackward, 0, 2}, {Op::Backward, 0, 2}};
  EXPECT_EQ(r0, r0_full) << describe(r0);
  // Rank 1 is the last stage: it never sends activations nor receives gradients.
  const Schedule r1_full = {{Op::RecvForward, 0, 0},  {Op::Forward, 0, 0},      {Op::Backward, 0, 0},
                            {Op::SendBackward, 0, 0}, {Op::RecvForward, 0, 1},  {Op::Forward, 0, 1},
                            {Op::Backward, 0, 1},     {Op::SendBackward, 0, 1}, {Op::RecvForward, 0, 2},
                            {Op::Forward, 0, 2},      {Op::Backward, 0, 2},     {Op::SendBackward, 0, 2}};
  EXPECT_EQ(r1, r1_full) << describe(r1);
}

// Interleaved, p = 2, v = 2: virtual micro-batch k has chunk (k % 4) / 2 forward (1 - that
// backward) and micro-batch (k / 4) * 2 + k % 2.
//   k:              0 1 2 3 4 5 6 7
//   forward chunk:  0 0 1 1 0 0 1 1
//   backward chunk: 1 1 0 0 1 1 0 0
//   micro-batch:    0 1 0 1 2 3 2 3
// m = 2, rank 0: m == p, so all 4 virtual micro-batches are warm-up (the formula gives
//   2 * (2 - 0 - 1) + (2 - 1) * 2 = 4 as well): F c0m0, F c0m1, F c1m0, F c1m1, then the cool-down
//   B c1m0, B c1m1, B c0m0, B c0m1.
// m = 4, rank 1: warm-up 2 * 0 + 1 * 2 = 2 -> F c0m0, F c0m1; steady k = 0..5 pairs forward k + 2 with
//   backward k: (F c1m0, B c1m0), (F c1m1, B c1m1), (F c0m2, B c0m0), (F c0m3, B c0m1),
//   (F c1m2, B c1m2), (F c1m3, B c1m3); cool-down backwards k = 6, 7: B c0m2, B c0m3.
TEST(PipelineSchedule, InterleavedByHand) {
  const auto f = [](int c, int mb) { return Action{Op::Forward, c, mb}; };
  const auto b = [](int c, int mb) { return Action{Op::Backward, c, mb}; };
  const Schedule small = parallel::pipeline::interleaved_one_f_one_b({2, 0, 2, 2});
  EXPECT_EQ(compute_only(small),
            seq({f(0, 0), f(0, 1), f(1, 0), f(1, 1), b(1, 0), b(1, 1), b(0, 0), b(0, 1)}))
      << describe(small);
  const Schedule steady = parallel::pipeline::interleaved_one_f_one_b({2, 1, 4, 2});
  EXPECT_EQ(compute_only(steady),
            seq({f(0, 0), f(0, 1), f(1, 0), b(1, 0), f(1, 1), b(1, 1), f(0, 2), b(0, 0), f(0, 3), b(0, 1),
                 f(1, 2), b(1, 2), f(1, 3), b(1, 3), b(0, 2), b(0, 3)}))
      << describe(steady);
  // Rank 1 chunk 1 is global stage 3, the last: its forwards send nothing, its backwards receive
  // nothing; chunk 0 is stage 1, which does both.
  EXPECT_EQ(steady, with_communication(compute_only(steady), 2, 1, 2));
}

TEST(PipelineSchedule, ToString) {
  EXPECT_EQ(parallel::pipeline::to_string({Op::Forward, 1, 3}), "F c1 m3");
  EXPECT_EQ(parallel::pipeline::to_string({Op::RecvBackward, 0, 2}), "RB c0 m2");
  EXPECT_EQ(parallel::pipeline::to_string({Op::RecvForward, 0, 0}), "RF c0 m0");
  EXPECT_EQ(parallel::pipeline::to_string({Op::SendForward, 2, 7}), "SF c2 m7");
  EXPECT_EQ(parallel::pipeline::to_string({Op::Backward, 0, 1}), "B c0 m1");
  EXPECT_EQ(parallel::pipeline::to_string({Op::SendBackward, 1, 0}), "SB c1 m0");
}

TEST(PipelineSchedule, BadParametersNameTheRule) {
  using namespace parallel::pipeline;
  expect_error(
      [] {
        interleaved_one_f_one_b({4, 0, 6, 2});
      },
      "interleaved schedule needs micro-batches (6) divisible by pipeline size (4)");
  expect_error(
      [] {
        make_schedule({4, 1, 6, 2});
      },
      "interleaved schedule needs micro-batches (6) divisible by pipeline size (4)");
  expect_error(
      [] {
        warmup_steps({4, 1, 6, 2});
      },
      "interleaved schedule needs micro-batches (6) divisible by pipeline size (4)");
  expect_error(
      [] {
        interleaved_one_f_one_b({1, 0, 4, 2});
      },
      "interleaved schedule needs pipeline size > 1 (got 1) for virtual stages (2)");
  expect_error(
      [] {
        make_schedule({1, 0, 4, 2});
      },
      "interleaved schedule needs pipeline size > 1 (got 1) for virtual stages (2)");
  expect_error(
      [] {
        interleaved_one_f_one_b({4, 0, 4, 1});
      },
      "interleaved schedule needs virtual stages > 1 (got 1)");
  expect_error([] { one_f_one_b({4, 0, 4, 2}); }, "1F1B schedule needs virtual stages 1 (got 2)");
  expect_error([] { gpipe({4, 0, 4, 2}); }, "GPipe schedule needs virtual stages 1 (got 2)");
  expect_error([] { no_pipelining({2, 0, 4, 1}); }, "no-pipelining schedule needs pipeline size 1 (got 2)");
  expect_error([] { no_pipelining({1, 0, 4, 2}); }, "no-pipelining schedule needs virtual stages 1 (got 2)");
  expect_error([] { one_f_one_b({4, 4, 4, 1}); }, "1F1B schedule needs rank in [0, pipeline size 4) (got 4)");
  expect_error(
      [] {
        one_f_one_b({4, -1, 4, 1});
      },
      "1F1B schedule needs rank in [0, pipeline size 4) (got -1)");
  expect_error([] { one_f_one_b({4, 0, 0, 1}); }, "1F1B schedule needs micro-batches >= 1 (got 0)");
  expect_error([] { one_f_one_b({0, 0, 1, 1}); }, "1F1B schedule needs pipeline size >= 1 (got 0)");
  expect_error([] { gpipe({2, 0, 4, 0}); }, "GPipe schedule needs virtual stages >= 1 (got 0)");
}

}  // namespace

namespace {
TEST(PipelineSchedule, ForwardOnlyRunsEveryStageOnceWithoutDeadlock) {
  for (int p = 1; p <= 6; ++p)
    for (int v = 1; v <= 3; ++v)
      for (int m = 1; m <= 9; ++m) {
        const SimulationResult res = simulate(all_ranks(parallel::pipeline::forward_only, p, m, v), p, m, v,
                                              /*forward_only=*/true);
        EXPECT_TRUE(res.ok) << "p=" << p << " m=" << m << " v=" << v;
      }
}
}  // namespace
