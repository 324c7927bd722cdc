// Pipeline schedules: every schedule of every rank is run together in a simulator that implements
// the communication semantics of pipeline_schedule.hpp (non-blocking sends, blocking receives,
// messages keyed by (kind, micro-batch, destination stage)). The simulator proves the schedules
// deadlock-free and consistent, measures micro-batches in flight, and, with forward cost 1 and
// backward cost 2, measures the pipeline bubble against the published theory. Split backwards
// (zero-bubble schedules) take their input step (B) and weight step (W) costs separately; a fused
// backward costs B + W.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/error.hpp"
#include "parallel/pipeline_schedule.hpp"
#include "paths.hpp"

namespace {

using parallel::pipeline::Action;
using parallel::pipeline::global_stage;
using parallel::pipeline::Op;
using parallel::pipeline::Schedule;
using parallel::pipeline::ScheduleParams;
using ScheduleFn = std::function<Schedule(const ScheduleParams&)>;

constexpr int kForwardCost = 1;
constexpr int kBackwardCost = 2;

// Simulated costs of one chunk's compute steps; a fused backward is input + weight.
struct Costs {
  long forward = kForwardCost;
  long input = kBackwardCost / 2;
  long weight = kBackwardCost / 2;
};

bool is_compute(Op op) {
  return op == Op::Forward || op == Op::Backward || op == Op::BackwardInput || op == Op::BackwardWeight;
}
bool is_backward(Op op) { return op == Op::Backward || op == Op::BackwardInput; }

std::string describe(const Schedule& s) {
  std::string out;
  for (const Action& a : s) out += parallel::pipeline::to_string(a) + ", ";
  return out;
}

Schedule seq(std::initializer_list<Action> actions) { return Schedule(actions); }

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
    } else if (a.op == Op::BackwardWeight) {
      out.push_back(a);  // local: the weight gradients go nowhere
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
  // per rank: forwards done whose weight gradients are not (the fused backward or the W step)
  std::vector<int> max_until_weight;
  std::vector<long> busy;  // per rank: simulated compute time
  long makespan = 0;       // simulated time at which the last rank finishes
  // per rank: each compute action with its simulated start and cost (for the timelines)
  struct Step {
    Action action;
    long start, cost;
  };
  std::vector<std::vector<Step>> steps;
};

// Runs the schedules of all ranks together. Each round advances every rank that can advance by one
// action; a rank blocks only on a receive whose message has not been sent. The round-robin order
// does not affect the timing: an action's simulated start is the later of its rank's clock and the
// arrival of the message it waits for, so timing follows the dependency graph alone.
// forward_only: the schedules have no backward (evaluation); activations are the only messages.
SimulationResult simulate(const std::vector<Schedule>& ranks, int p, int m, int v, bool forward_only = false,
                          Costs costs = {}) {
  SimulationResult res;
  res.max_in_flight.assign(p, 0);
  res.max_until_weight.assign(p, 0);
  res.busy.assign(p, 0);
  res.steps.assign(p, {});
  const int last = p * v - 1;
  std::map<MessageKey, Message> messages;
  // (global stage, micro-batch) -> global event number of its forward / backward.
  std::map<std::pair<int, int>, long> forward_at, backward_at;
  // Split backwards: input steps whose weight step has not run, and weight steps done.
  std::set<std::pair<int, int>> awaiting_weight, weight_done;
  std::vector<size_t> pc(p, 0);
  std::vector<long> clock(p, 0);
  std::vector<int> in_flight(p, 0), until_weight(p, 0);
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
          res.steps[r].push_back({a, clock[r], costs.forward});
          clock[r] += costs.forward;
          res.busy[r] += costs.forward;
          res.max_in_flight[r] = std::max(res.max_in_flight[r], ++in_flight[r]);
          res.max_until_weight[r] = std::max(res.max_until_weight[r], ++until_weight[r]);
          break;
        }
        case Op::BackwardWeight: {
          if (!awaiting_weight.erase(key)) {
            ADD_FAILURE() << "weight step of stage " << g << " micro-batch " << a.micro_batch
                          << " without a pending input step";
            return res;
          }
          weight_done.insert(key);
          res.steps[r].push_back({a, clock[r], costs.weight});
          clock[r] += costs.weight;
          res.busy[r] += costs.weight;
          --until_weight[r];
          break;
        }
        case Op::Backward:
        case Op::BackwardInput: {
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
          const long cost = a.op == Op::Backward ? costs.input + costs.weight : costs.input;
          res.steps[r].push_back({a, clock[r], cost});
          clock[r] += cost;
          res.busy[r] += cost;
          --in_flight[r];
          if (a.op == Op::Backward)
            --until_weight[r];
          else
            awaiting_weight.insert(key);
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
  for (const auto& [g, mb] : awaiting_weight) {
    ADD_FAILURE() << "stage " << g << " micro-batch " << mb << " never ran its weight step";
    ok = false;
  }
  // Every activation crosses each of the p*v - 1 stage boundaries once, and so does every gradient.
  EXPECT_EQ(messages.size(), static_cast<size_t>((forward_only ? 1 : 2) * last * m));
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(in_flight[r], forward_only ? m * v : 0) << "rank " << r;
    EXPECT_EQ(until_weight[r], forward_only ? m * v : 0) << "rank " << r;
  }
  res.makespan = *std::max_element(clock.begin(), clock.end());
  res.ok = ok;
  return res;
}

int forwards_before_first_backward(const Schedule& s) {
  int n = 0;
  for (const Action& a : s) {
    if (is_backward(a.op)) break;
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

// The text timeline of docs/pipeline.md: one row per rank and kind of step (and chunk when v > 1:
// forwards in chunk order, backwards in reverse, as they run), one character per time unit, the
// micro-batch's digit while a step of that kind runs, '.' otherwise.
std::string timeline(const SimulationResult& res, int p, int v) {
  const bool split = std::any_of(res.steps.begin(), res.steps.end(), [](const auto& steps) {
    return std::any_of(steps.begin(), steps.end(),
                       [](const auto& s) { return s.action.op == Op::BackwardWeight; });
  });
  std::string out;
  for (int r = 0; r < p; ++r) {
    std::vector<std::pair<std::string, std::function<bool(const Action&)>>> rows;
    for (int c = 0; c < v; ++c)
      rows.push_back({"F" + (v > 1 ? " c" + std::to_string(c) : std::string()),
                      [c](const Action& a) { return a.op == Op::Forward && a.chunk == c; }});
    for (int c = v - 1; c >= 0; --c)
      rows.push_back({"B" + (v > 1 ? " c" + std::to_string(c) : std::string()), [c](const Action& a) {
                        return (a.op == Op::Backward || a.op == Op::BackwardInput) && a.chunk == c;
                      }});
    if (split)
      for (int c = v - 1; c >= 0; --c)
        rows.push_back({"W" + (v > 1 ? " c" + std::to_string(c) : std::string()),
                        [c](const Action& a) { return a.op == Op::BackwardWeight && a.chunk == c; }});
    for (const auto& [name, wanted] : rows) {
      std::string line(static_cast<std::size_t>(res.makespan), '.');
      for (const auto& s : res.steps[r])
        if (wanted(s.action))
          for (long t = s.start; t < s.start + s.cost; ++t)
            line[static_cast<std::size_t>(t)] = static_cast<char>('0' + s.action.micro_batch % 10);
      out += "rank " + std::to_string(r) + " " + name + " | " + line + "\n";
    }
  }
  return out;
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

// ZB-H1 on every shape: deadlock-free, 1F1B's forwards and input steps in 1F1B's order, every
// weight step after its input step in micro-batch order, the stated in-flight bounds exactly, and
// the bubble from the F, B, W costs against the paper (Qi et al., ICLR 2024, section 3.1):
// (p - 1)(F + B - W) when W <= F and W <= B, in general (p - 1) max(F, B, F + B - W) (once
// the W's no longer fit in the gaps, the F or B chain sets the pace), for m >= p.
TEST(PipelineSchedule, ZeroBubbleH1SimulatesForAllShapes) {
  using parallel::pipeline::zero_bubble_h1;
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      SCOPED_TRACE("ZB-H1 p=" + std::to_string(p) + " m=" + std::to_string(m));
      const auto ranks = all_ranks(zero_bubble_h1, p, m, 1);
      const SimulationResult res = simulate(ranks, p, m, 1);
      ASSERT_TRUE(res.ok);
      const auto reference = all_ranks(parallel::pipeline::one_f_one_b, p, m, 1);
      for (int r = 0; r < p; ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        EXPECT_EQ(ranks[r], with_communication(compute_only(ranks[r]), p, r, 1)) << describe(ranks[r]);
        // Forwards and input steps are 1F1B's, in 1F1B's order.
        Schedule fb, reference_fb;
        std::vector<int> weights;
        for (const Action& a : compute_only(ranks[r])) {
          if (a.op == Op::BackwardWeight)
            weights.push_back(a.micro_batch);
          else
            fb.push_back({a.op == Op::BackwardInput ? Op::Backward : a.op, a.chunk, a.micro_batch});
          EXPECT_NE(a.op, Op::Backward) << "ZB-H1 has no fused backward";
        }
        for (const Action& a : compute_only(reference[r])) reference_fb.push_back(a);
        EXPECT_EQ(fb, reference_fb);
        EXPECT_TRUE(std::is_sorted(weights.begin(), weights.end()));  // gradients accumulate in order
        EXPECT_EQ(res.max_in_flight[r], std::min(p - r, m));
        EXPECT_EQ(res.max_until_weight[r], std::min(p, m));
      }
      for (const Costs c : {Costs{1, 1, 1}, Costs{2, 2, 1}, Costs{3, 2, 2}, Costs{2, 3, 1}, Costs{1, 2, 1},
                            Costs{2, 1, 2}, Costs{1, 1, 2}, Costs{1, 3, 3}, Costs{4, 4, 3}}) {
        const SimulationResult zb = simulate(ranks, p, m, 1, false, c);
        const SimulationResult fused = simulate(reference, p, m, 1, false, c);
        for (int r = 0; r < p; ++r) {
          const long idle = zb.makespan - zb.busy[r];
          const long idle_1f1b = fused.makespan - fused.busy[r];
          EXPECT_EQ(zb.busy[r], m * (c.forward + c.input + c.weight));
          // Never worse than 1F1B: (p - 1)(F + B + W).
          EXPECT_LE(idle, idle_1f1b) << "F " << c.forward << " B " << c.input << " W " << c.weight;
          if (m < p) continue;  // too few W's to fill the cool-down
          const long theory = (p - 1) * std::max({c.forward, c.input, c.forward + c.input - c.weight});
          EXPECT_EQ(idle, theory) << "rank " << r << " F " << c.forward << " B " << c.input << " W "
                                  << c.weight;
          if (c.weight <= c.forward && c.weight <= c.input)
            EXPECT_EQ(idle, (p - 1) * (c.forward + c.input - c.weight)) << "the paper's formula";
          EXPECT_EQ(idle_1f1b, (p - 1) * (c.forward + c.input + c.weight));
        }
      }
      // Equal costs: a third of 1F1B's bubble.
      if (m >= p) {
        const SimulationResult zb = simulate(ranks, p, m, 1, false, Costs{1, 1, 1});
        const SimulationResult fused = simulate(reference, p, m, 1, false, Costs{1, 1, 1});
        EXPECT_EQ(3 * (zb.makespan - zb.busy[0]), fused.makespan - fused.busy[0]);
      }
    }
  }
}

// p = 3, m = 4. Rank r runs 1F1B's order (warm-up 2 - r forwards) and lets r W's wait:
// rank 0 runs each W right after its B, rank 1 one B later, rank 2 (the last) two B's later, and
// the W's still pending after the last B close the list.
TEST(PipelineSchedule, ZeroBubbleH1ByHand) {
  const auto f = [](int mb) { return Action{Op::Forward, 0, mb}; };
  const auto b = [](int mb) { return Action{Op::BackwardInput, 0, mb}; };
  const auto w = [](int mb) { return Action{Op::BackwardWeight, 0, mb}; };
  const Schedule r0 = parallel::pipeline::zero_bubble_h1({3, 0, 4, 1});
  EXPECT_EQ(compute_only(r0), seq({f(0), f(1), f(2), b(0), w(0), f(3), b(1), w(1), b(2), w(2), b(3), w(3)}))
      << describe(r0);
  const Schedule r1 = parallel::pipeline::zero_bubble_h1({3, 1, 4, 1});
  EXPECT_EQ(compute_only(r1), seq({f(0), f(1), b(0), f(2), b(1), w(0), f(3), b(2), w(1), b(3), w(2), w(3)}))
      << describe(r1);
  const Schedule r2 = parallel::pipeline::zero_bubble_h1({3, 2, 4, 1});
  EXPECT_EQ(compute_only(r2), seq({f(0), b(0), f(1), b(1), f(2), b(2), w(0), f(3), b(3), w(1), w(2), w(3)}))
      << describe(r2);
  const ScheduleParams kind{3, 1, 4, 1, parallel::PipelineSchedule::ZeroBubbleH1};
  EXPECT_EQ(parallel::pipeline::make_schedule(kind), r1);
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
  EXPECT_EQ(parallel::pipeline::to_string({Op::BackwardInput, 0, 4}), "BI c0 m4");
  EXPECT_EQ(parallel::pipeline::to_string({Op::BackwardWeight, 0, 4}), "W c0 m4");
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
  expect_error([] { zero_bubble_h1({4, 0, 8, 2}); }, "ZB-H1 schedule needs virtual stages 1 (got 2)");
  expect_error(
      [] {
        make_schedule({4, 0, 8, 2, parallel::PipelineSchedule::ZeroBubbleH1});
      },
      "ZB-H1 schedule needs virtual stages 1 (got 2)");
  expect_error(
      [] {
        make_schedule({4, 0, 8, 1, parallel::PipelineSchedule::Interleaved});
      },
      "interleaved schedule needs virtual stages > 1 (got 1)");
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

namespace {
// docs/pipeline.md draws the schedules with the timelines and compute orders above: they must be
// what the schedules produce now. PIPELINE_TIMELINE_PRINT=1 prints them (to regenerate the docs).
TEST(PipelineSchedule, DocsShowTheSchedules) {
  using namespace parallel::pipeline;
  std::ifstream in(parallel::testing::source_dir() / "docs" / "pipeline.md");
  ASSERT_TRUE(in) << "docs/pipeline.md not found";
  const std::string docs((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const int p = 4, m = 8;
  struct Drawn {
    const char* name;
    ScheduleFn fn;
    int v;
    Costs costs;
  };
  const Drawn drawn[] = {{"1F1B", one_f_one_b, 1, {}},
                         {"interleaved, v=2", interleaved_one_f_one_b, 2, {}},
                         {"ZB-H1", zero_bubble_h1, 1, {1, 1, 1}}};
  for (const Drawn& d : drawn) {
    const auto ranks = all_ranks(d.fn, p, m, d.v);
    const SimulationResult res = simulate(ranks, p, m, d.v, false, d.costs);
    ASSERT_TRUE(res.ok);
    const std::string text = timeline(res, p, d.v);
    if (std::getenv("PIPELINE_TIMELINE_PRINT"))
      std::printf("%s: makespan %ld = busy %ld + idle %ld\n%s\n", d.name, res.makespan, res.busy[0],
                  res.makespan - res.busy[0], text.c_str());
    EXPECT_NE(docs.find(text), std::string::npos) << d.name << " timeline not in docs/pipeline.md:\n" << text;
  }
  // ZB-H1's compute order, as listed.
  std::string order;
  for (int r = 0; r < p; ++r) {
    order += "rank " + std::to_string(r) + ":";
    for (const Action& a : compute_only(zero_bubble_h1({p, r, m, 1})))
      order += std::string(" ") +
               (a.op == Op::Forward         ? "F"
                : a.op == Op::BackwardInput ? "B"
                                            : "W") +
               std::to_string(a.micro_batch);
    order += "\n";
  }
  if (std::getenv("PIPELINE_TIMELINE_PRINT")) std::printf("%s", order.c_str());
  EXPECT_NE(docs.find(order), std::string::npos) << "ZB-H1 order not in docs/pipeline.md:\n" << order;
}
}  // namespace
