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
using parallel::pipeline::Placement;
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
Schedule with_communication(const Schedule& compute, int p, int r, int v,
                            Placement placement = Placement::Loop) {
  const int last = p * v - 1;
  Schedule out;
  for (const Action& a : compute) {
    const int g = global_stage(p, r, a.chunk, placement);
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
// placement: which rank holds which stage (the V schedules' or the loop of all others).
SimulationResult simulate(const std::vector<Schedule>& ranks, int p, int m, int v, bool forward_only = false,
                          Costs costs = {}, Placement placement = Placement::Loop) {
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
      const int g = global_stage(p, r, a.chunk, placement);
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
    Placement placement = Placement::Loop;
  };
  const Drawn drawn[] = {{"1F1B", one_f_one_b, 1, {}},
                         {"interleaved, v=2", interleaved_one_f_one_b, 2, {}},
                         {"ZB-H1", zero_bubble_h1, 1, {1, 1, 1}},
                         {"ZB-V", zero_bubble_v, 2, {1, 1, 1}, Placement::V},
                         {"DualPipe-V", dualpipe_v, 2, {1, 1, 1}, Placement::V}};
  for (const Drawn& d : drawn) {
    const auto ranks = all_ranks(d.fn, p, m, d.v);
    const SimulationResult res = simulate(ranks, p, m, d.v, false, d.costs, d.placement);
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

namespace {
// The V schedules (ZB-V, DualPipe-V) on every shape they accept (p = 1..8, m = 2p..2p+9):
// deadlock-free in the V placement, the communication every compute action implies, each chunk's
// weight steps in micro-batch order, the stated in-flight bounds exactly, and the bubble from F, B,
// W costs of one chunk: never below the ramp (p - 1) F that the last rank waits before its first
// forward (a lower bound for any schedule), exactly that ramp when F = B = W, never above the
// published formula (DualPipe-V) and never above the same model's bubble under ZB-H1 or 1F1B
// (whole-stage costs 2F, 2B, 2W, the same m).
enum class VKind { ZeroBubbleV, DualPipeV };

void check_v_schedule(VKind kind) {
  using namespace parallel::pipeline;
  const bool zbv = kind == VKind::ZeroBubbleV;
  const ScheduleFn fn = zbv ? ScheduleFn(zero_bubble_v) : ScheduleFn(dualpipe_v);
  const bool print = std::getenv("PIPELINE_V_PRINT") != nullptr;
  for (int p = 1; p <= 8; ++p) {
    for (int m = 2 * p; m <= 2 * p + 9; ++m) {
      SCOPED_TRACE(std::string(zbv ? "ZB-V" : "DualPipe-V") + " p=" + std::to_string(p) +
                   " m=" + std::to_string(m));
      const auto ranks = all_ranks(fn, p, m, 2);
      const SimulationResult res = simulate(ranks, p, m, 2, false, {}, Placement::V);
      ASSERT_TRUE(res.ok);
      for (int r = 0; r < p; ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        EXPECT_EQ(ranks[r], with_communication(compute_only(ranks[r]), p, r, 2, Placement::V))
            << describe(ranks[r]);
        std::vector<int> weights[2];
        int fused = 0;
        for (const Action& a : compute_only(ranks[r])) {
          if (a.op == Op::BackwardWeight) weights[a.chunk].push_back(a.micro_batch);
          fused += a.op == Op::Backward;
        }
        EXPECT_TRUE(std::is_sorted(weights[0].begin(), weights[0].end()));
        EXPECT_TRUE(std::is_sorted(weights[1].begin(), weights[1].end()));
        if (zbv) {
          EXPECT_EQ(fused, 0) << "ZB-V splits every backward";
          // 2p chunk micro-batches of half a stage each: p whole micro-batches, 1F1B's peak.
          EXPECT_EQ(res.max_in_flight[r], 2 * p);
          EXPECT_EQ(res.max_until_weight[r], 2 * p);
        } else {
          EXPECT_GT(fused, 0) << "DualPipe-V fuses the backwards of its main phase";
          // DualPipe's PP + 1 with PP = 2p stages.
          EXPECT_EQ(res.max_in_flight[r], 2 * p + 1);
          EXPECT_EQ(res.max_until_weight[r], 2 * p + 1);
        }
      }
      for (const Costs c : {Costs{1, 1, 1}, Costs{2, 2, 1}, Costs{3, 2, 2}, Costs{2, 3, 1}, Costs{1, 2, 1},
                            Costs{2, 1, 2}, Costs{1, 1, 2}, Costs{1, 3, 3}, Costs{4, 4, 3}}) {
        SCOPED_TRACE("F " + std::to_string(c.forward) + " B " + std::to_string(c.input) + " W " +
                     std::to_string(c.weight));
        const SimulationResult t = simulate(ranks, p, m, 2, false, c, Placement::V);
        const Costs stage{2 * c.forward, 2 * c.input, 2 * c.weight};
        const SimulationResult h1 = simulate(all_ranks(zero_bubble_h1, p, m, 1), p, m, 1, false, stage);
        const SimulationResult fused = simulate(all_ranks(one_f_one_b, p, m, 1), p, m, 1, false, stage);
        for (int r = 0; r < p; ++r) {
          const long idle = t.makespan - t.busy[r];
          if (print)
            std::printf("%s p=%d m=%d r=%d F%ld B%ld W%ld idle %ld\n", zbv ? "ZB-V" : "DualPipe-V", p, m, r,
                        c.forward, c.input, c.weight, idle);
          EXPECT_EQ(t.busy[r], 2L * m * (c.forward + c.input + c.weight));
          EXPECT_GE(idle, (p - 1) * c.forward);
          if (c.forward == c.input && c.input == c.weight) EXPECT_EQ(idle, (p - 1) * c.forward);
          EXPECT_LE(idle, fused.makespan - fused.busy[r]);
          if (zbv) {
            EXPECT_LE(idle, h1.makespan - h1.busy[r]);
          } else {
            // DeepSeek-V3, table 2: (PP/2 - 1)(F&B + B - 3W) with PP = 2p stages, B the full
            // backward (input + weight) and F&B a forward and a backward run together; here they
            // run one after the other, F&B = F + B + W.
            EXPECT_LE(idle, (p - 1) * (c.forward + c.input + c.weight + c.input + c.weight - 3 * c.weight));
          }
        }
      }
    }
  }
}

TEST(PipelineSchedule, ZeroBubbleVSimulatesForAllShapes) { check_v_schedule(VKind::ZeroBubbleV); }
TEST(PipelineSchedule, DualPipeVSimulatesForAllShapes) { check_v_schedule(VKind::DualPipeV); }

// The V placement: rank r holds stages r and 2p - 1 - r, so rank 0 holds the first and the last.
TEST(PipelineSchedule, VPlacement) {
  using namespace parallel::pipeline;
  for (int p = 1; p <= 8; ++p) {
    std::set<int> stages;
    for (int r = 0; r < p; ++r)
      for (int c = 0; c < 2; ++c) {
        const int g = global_stage(p, r, c, Placement::V);
        stages.insert(g);
        EXPECT_EQ(stage_owner(p, g, Placement::V).rank, r);
        EXPECT_EQ(stage_owner(p, g, Placement::V).chunk, c);
      }
    EXPECT_EQ(stages.size(), static_cast<size_t>(2 * p));
    EXPECT_EQ(global_stage(p, 0, 1, Placement::V), 2 * p - 1);
    EXPECT_EQ(global_stage(p, p - 1, 1, Placement::V), p);
  }
  EXPECT_EQ(placement_of(parallel::PipelineSchedule::ZeroBubbleV), Placement::V);
  EXPECT_EQ(placement_of(parallel::PipelineSchedule::DualPipeV), Placement::V);
  EXPECT_EQ(placement_of(parallel::PipelineSchedule::Interleaved), Placement::Loop);
  // make_schedule dispatches, and forward-only evaluation follows the V placement too.
  for (int p = 1; p <= 4; ++p) {
    const int m = 2 * p;
    for (auto kind : {parallel::PipelineSchedule::ZeroBubbleV, parallel::PipelineSchedule::DualPipeV}) {
      std::vector<Schedule> ranks, eval;
      for (int r = 0; r < p; ++r) {
        const ScheduleParams s{p, r, m, 2, kind};
        ranks.push_back(make_schedule(s));
        EXPECT_EQ(ranks.back(),
                  kind == parallel::PipelineSchedule::ZeroBubbleV ? zero_bubble_v(s) : dualpipe_v(s));
        eval.push_back(forward_only(s));
      }
      EXPECT_TRUE(simulate(ranks, p, m, 2, false, {}, Placement::V).ok);
      EXPECT_TRUE(simulate(eval, p, m, 2, true, {}, Placement::V).ok);
    }
  }
}

TEST(PipelineSchedule, VSchedulesNameTheirRules) {
  using namespace parallel::pipeline;
  expect_error([] { zero_bubble_v({4, 0, 8, 1}); }, "ZB-V schedule needs virtual stages 2 (got 1)");
  expect_error(
      [] {
        zero_bubble_v({4, 0, 7, 2});
      },
      "ZB-V schedule needs micro-batches (7) >= 8 for pipeline size 4");
  expect_error([] { dualpipe_v({2, 0, 4, 3}); }, "DualPipe-V schedule needs virtual stages 2 (got 3)");
  expect_error(
      [] {
        dualpipe_v({2, 1, 3, 2});
      },
      "DualPipe-V schedule needs micro-batches (3) >= 4 for pipeline size 2");
}
}  // namespace

namespace {
// The executor posts the mirrored send/receive pairs with a neighbour (paired_exchanges) as one
// batch_p2p and waits for all of it: a batched send then completes only once its receiver has
// posted the matching receive (NCCL's group semantics). This simulates exactly that (a run's other
// sends are posted and never block, its other receives wait for their message) and proves every
// schedule deadlock-free under it; messages a rank sends to itself (the V's turn) stay on the rank.
bool deadlock_free_batched(const std::vector<Schedule>& ranks, int p, int m, int v,
                           parallel::PipelineSchedule kind, std::string& why, int& batches) {
  using namespace parallel::pipeline;
  const Placement placement = placement_of(kind);
  using Key = std::tuple<bool, int, int>;  // gradient, micro-batch, destination stage
  std::set<Key> sent, posted;
  // Per rank: first action of a batched run -> the paired peers.
  std::vector<std::map<size_t, std::set<int>>> paired(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r)
    for (const PairedExchange& e : paired_exchanges({p, r, m, v, kind}, make_schedule)) {
      paired[static_cast<size_t>(r)][e.begin].insert(e.peer);
      ++batches;
    }
  std::vector<size_t> pc(static_cast<size_t>(p), 0);
  std::vector<bool> run_posted(static_cast<size_t>(p), false);
  auto message = [&](int r, const Action& a) {
    const int g = global_stage(p, r, a.chunk, placement);
    const bool gradient = a.op == Op::SendBackward || a.op == Op::RecvBackward;
    const bool send = a.op == Op::SendForward || a.op == Op::SendBackward;
    const int other = send ? g + (gradient ? -1 : 1) : g + (gradient ? 1 : -1);
    return std::tuple{Key{gradient, a.micro_batch, send ? other : g}, send,
                      stage_owner(p, other, placement).rank};
  };
  while (true) {
    bool progressed = false, done = true;
    for (int r = 0; r < p; ++r) {
      const Schedule& s = ranks[static_cast<size_t>(r)];
      size_t& i = pc[static_cast<size_t>(r)];
      if (i == s.size()) continue;
      done = false;
      if (is_compute(s[i].op)) {
        ++i;
        progressed = true;
        continue;
      }
      size_t end = i;
      while (end < s.size() && !is_compute(s[end].op)) ++end;
      const auto batch = paired[static_cast<size_t>(r)].find(i);
      const std::set<int> peers =
          batch == paired[static_cast<size_t>(r)].end() ? std::set<int>() : batch->second;
      if (!run_posted[static_cast<size_t>(r)]) {
        for (size_t j = i; j < end; ++j) {
          const auto [key, send, peer] = message(r, s[j]);
          (send ? sent : posted).insert(key);
        }
        run_posted[static_cast<size_t>(r)] = true;
        progressed = true;
      }
      bool complete = true;
      for (size_t j = i; j < end; ++j) {
        const auto [key, send, peer] = message(r, s[j]);
        if (!send && !sent.count(key)) complete = false;
        if (send && peers.count(peer) && !posted.count(key)) complete = false;
      }
      if (!complete) continue;
      i = end;
      run_posted[static_cast<size_t>(r)] = false;
      progressed = true;
    }
    if (done) return true;
    if (!progressed) {
      why = "deadlock:";
      for (int r = 0; r < p; ++r)
        if (pc[static_cast<size_t>(r)] < ranks[static_cast<size_t>(r)].size())
          why += " rank " + std::to_string(r) + " at " +
                 to_string(ranks[static_cast<size_t>(r)][pc[static_cast<size_t>(r)]]);
      return false;
    }
  }
}

TEST(PipelineSchedule, DeadlockFreeWithBatchedSendReceivePairs) {
  using namespace parallel::pipeline;
  using parallel::PipelineSchedule;
  std::map<std::string, int> batches_of;
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 3 * p + 2; ++m)
      for (PipelineSchedule kind :
           {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB, PipelineSchedule::Interleaved,
            PipelineSchedule::ZeroBubbleH1, PipelineSchedule::ZeroBubbleV, PipelineSchedule::DualPipeV})
        for (int v = 1; v <= 3; ++v) {
          std::vector<Schedule> ranks;
          try {
            for (int r = 0; r < p; ++r) ranks.push_back(make_schedule({p, r, m, v, kind}));
          } catch (const parallel::Error&) {
            continue;  // a shape this schedule refuses
          }
          std::string why;
          int batches = 0;
          EXPECT_TRUE(deadlock_free_batched(ranks, p, m, v, kind, why, batches))
              << schedule_name(kind) << " p=" << p << " m=" << m << " v=" << v << ": " << why;
          batches_of[schedule_name(kind)] += batches;
        }
  // Each schedule but GPipe (whose only meeting of the two directions is not mirrored) does post
  // pairs together, else the test above would prove nothing.
  for (const char* name : {"1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe-v"})
    EXPECT_GT(batches_of[name], 0) << name;
  // 1F1B, p = 2, m = 3: rank 0's steady (SF m1, RB m0), (SF m2, RB m1) meet rank 1's (SB m0, RF m1),
  // (SB m1, RF m2).
  const auto e0 = paired_exchanges({2, 0, 3, 1, PipelineSchedule::OneFOneB}, make_schedule);
  const auto e1 = paired_exchanges({2, 1, 3, 1, PipelineSchedule::OneFOneB}, make_schedule);
  ASSERT_EQ(e0.size(), 2u);
  ASSERT_EQ(e1.size(), 2u);
  const Schedule r0 = one_f_one_b({2, 0, 3, 1});
  EXPECT_EQ(r0[e0[0].begin], (Action{Op::SendForward, 0, 1}));
  EXPECT_EQ(r0[e0[0].begin + 1], (Action{Op::RecvBackward, 0, 0}));
  EXPECT_EQ(e0[0].end, e0[0].begin + 2);
  EXPECT_EQ(e0[0].peer, 1);
}
}  // namespace
