// The discrete-event replay of the representatives' timelines (step_cost.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <set>
#include <sstream>
#include <tuple>

#include "parallel/error.hpp"
#include "parallel/step_cost.hpp"

namespace parallel::plan {
namespace {

constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();

struct Call {
  double end = kUnknown;  // completion; NaN until every partner has issued its side
  int pending = 0;        // point-to-point ops not yet matched
  double max_end = 0;
  double transfer = 0;  // the longest point-to-point transfer of the call (its own time on the wire)
  std::string dim;
  bool p2p = false;
  int group_ranks = 2;  // the ranks that meet in it (a point-to-point call: 2)
};

struct RankSim {
  int rank = 0;
  const std::vector<SimEntry>* timeline = nullptr;
  std::size_t pc = 0;
  bool issued = false;
  double clock = 0;
  std::map<int64_t, Call> calls;
  std::map<std::string, double> stream_free;  // per group
  RankTime out;
};

struct Arrival {
  std::size_t sim;
  int64_t call;
  double time;
};

// "send 65536,recv 65536" -> (is_send, bytes) per op.
std::vector<std::pair<bool, int64_t>> batch_ops(const std::string& detail) {
  std::vector<std::pair<bool, int64_t>> out;
  std::stringstream ss(detail);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto space = item.find(' ');
    out.emplace_back(item.substr(0, space) == "send", std::stoll(item.substr(space + 1)));
  }
  return out;
}

// Rank `rank`'s timeline with every asynchronous call that does not progress during compute
// (CostModel::progresses_async) moved to just before its first wait: MPI without a progress thread
// advances a nonblocking call only inside MPI calls, so the call runs when its rank waits for it.
// A call never waited for (a send the pipeline polls) stays where it was issued.
std::vector<SimEntry> defer_to_waits(const std::vector<SimEntry>& tl, int rank, const CostModel& cost) {
  std::set<int64_t> waited;
  for (const SimEntry& e : tl)
    if (e.kind == TimelineEntry::Kind::Wait) waited.insert(e.call);
  std::vector<SimEntry> out;
  out.reserve(tl.size());
  std::map<int64_t, SimEntry> held;
  for (const SimEntry& e : tl) {
    if (e.kind == TimelineEntry::Kind::Comm && e.comm.async && waited.count(e.call) &&
        !cost.progresses_async(e.comm, rank)) {
      held.emplace(e.call, e);
      continue;
    }
    if (e.kind == TimelineEntry::Kind::Wait)
      if (const auto it = held.find(e.call); it != held.end()) {
        out.push_back(std::move(it->second));
        held.erase(it);
      }
    out.push_back(e);
  }
  return out;
}

class Simulator {
 public:
  Simulator(const std::map<int, std::vector<SimEntry>>& timelines, const CostModel& cost) : cost_(cost) {
    for (const auto& [rank, tl] : timelines) {
      index_[rank] = sims_.size();
      RankSim s;
      s.rank = rank;
      // Copied only where a link defers calls (a large job's timelines hold millions of entries).
      const HardwareDescription& hw = cost.hardware();
      s.timeline = hw.node_link.async_progress && hw.cluster_link.async_progress
                       ? &tl
                       : &(deferred_[rank] = defer_to_waits(tl, rank, cost));
      s.out.rank = rank;
      for (const char* d : kDimensions) s.out.exposed_s[d] = 0;
      sims_.push_back(std::move(s));
    }
  }

  SimulationResult run() {
    if (cost_.oversubscribed())
      run_shared();
    else
      run_dedicated();
    return result();
  }

 private:
  // Each rank on its own device: every rank runs as far as it can, in any order.
  void run_dedicated() {
    for (;;) {
      bool progress = false, done = true;
      for (std::size_t i = 0; i < sims_.size(); ++i) {
        RankSim& s = sims_[i];
        while (s.pc < s.timeline->size() && step(i)) progress = true;
        if (s.pc < s.timeline->size()) done = false;
      }
      if (done) break;
      if (!progress) {
        PARALLEL_FAIL("step simulation: the timelines deadlock: {}", blocked_ranks());
      }
    }
  }

  // Ranks time-share the node's devices (processor sharing). An op span is costed at the static
  // share (every rank of the node computing); its work on a whole device is seconds x share. At
  // any moment the ranks that compute split the devices evenly: each progresses at min(1, devices
  // / computing ranks on the node), while a rank blocked in a wait - a pipeline bubble, a
  // collective waiting for its partners - leaves its core to the others (Open MPI yields the
  // processor when idle under --oversubscribe). A representative stands for its stage's width of
  // ranks, all computing or all blocked together (they are symmetric). With every rank computing
  // this is the static share; it differs where stages idle in turn (fill, drain, bubbles).
  void run_shared() {
    const double share = cost_.share();
    const int world = cost_.world_size();
    const double width = static_cast<double>(world) / static_cast<double>(sims_.size());
    const double nodes = std::max(1.0, static_cast<double>(world) / cost_.ranks_per_node());
    const double devices = static_cast<double>(cost_.hardware().devices_per_node);
    std::vector<double> left(sims_.size(), -1);  // work left of the op span being run; < 0: none
    double now = 0;
    for (;;) {
      // Every rank that is not computing and not asleep (clock > now: blocked until a known end)
      // runs its non-op entries; issuing may complete others' calls, so repeat until nothing moves.
      bool moved = true;
      while (moved) {
        moved = false;
        for (std::size_t i = 0; i < sims_.size(); ++i) {
          RankSim& s = sims_[i];
          while (left[i] < 0 && s.clock <= now && s.pc < s.timeline->size()) {
            const SimEntry& e = (*s.timeline)[s.pc];
            if (e.kind == TimelineEntry::Kind::Op) {
              left[i] = e.seconds * share;
              moved = true;
              break;
            }
            if (!step(i)) break;
            moved = true;
          }
        }
      }
      double computing = 0;
      bool done = true;
      for (std::size_t i = 0; i < sims_.size(); ++i) {
        if (left[i] >= 0) computing += width;
        if (sims_[i].pc < sims_[i].timeline->size()) done = false;
      }
      if (done) break;
      const double rate = computing > 0 ? std::min(1.0, devices * nodes / computing) : 1.0;
      double next = std::numeric_limits<double>::infinity();
      for (std::size_t i = 0; i < sims_.size(); ++i) {
        if (left[i] >= 0) next = std::min(next, now + left[i] / rate);
        if (left[i] < 0 && sims_[i].clock > now) next = std::min(next, sims_[i].clock);
      }
      if (!std::isfinite(next)) {
        PARALLEL_FAIL("step simulation: the timelines deadlock: {}", blocked_ranks());
      }
      for (std::size_t i = 0; i < sims_.size(); ++i) {
        if (left[i] < 0) continue;
        RankSim& s = sims_[i];
        const double ran = next - now;
        s.out.compute_s += ran;
        left[i] -= ran * rate;
        if (left[i] <= 1e-12) {  // rounding: the rank whose end was `next`
          left[i] = -1;
          s.clock = next;
          ++s.pc;
        }
      }
      now = next;
    }
  }

  SimulationResult result() {
    SimulationResult r;
    for (RankSim& s : sims_) {
      double end = s.clock;
      for (const auto& [id, c] : s.calls)
        if (!std::isnan(c.end)) end = std::max(end, c.end);
      s.out.end_s = end;
      r.step_time_s = std::max(r.step_time_s, end);
    }
    for (const char* d : kDimensions) r.exposed_s[d] = 0;
    for (RankSim& s : sims_) {
      r.ranks.push_back(s.out);
      for (const auto& [d, t] : s.out.exposed_s) r.exposed_s[d] += t / static_cast<double>(sims_.size());
      r.oversubscribed_wait_s += s.out.oversubscribed_wait_s / static_cast<double>(sims_.size());
      if (r.step_time_s > 0)
        r.bubble_fraction += s.out.bubble_s / r.step_time_s / static_cast<double>(sims_.size());
    }
    return r;
  }

  // Advances rank i by one entry; false when it must wait for another rank.
  // Each rank still short of its timeline's end, and the entry it is stuck at.
  std::string blocked_ranks() const {
    std::string where;
    for (const RankSim& s : sims_)
      if (s.pc < s.timeline->size()) {
        const SimEntry& e = (*s.timeline)[s.pc];
        where += fmt::format(
            "{}rank {} at entry {} ({})", where.empty() ? "" : "; ", s.rank, s.pc,
            e.kind == TimelineEntry::Kind::Wait ? fmt::format("wait for call {}", e.call) : e.comm.str());
      }
    return where;
  }

  bool step(std::size_t i) {
    RankSim& s = sims_[i];
    const SimEntry& e = (*s.timeline)[s.pc];
    switch (e.kind) {
      case TimelineEntry::Kind::Op: {
        s.clock += e.seconds;
        s.out.compute_s += e.seconds;
        ++s.pc;
        return true;
      }
      case TimelineEntry::Kind::Comm: {
        if (!s.issued) {
          issue(i, e);
          s.issued = true;
        }
        if (e.comm.async) {
          s.issued = false;
          ++s.pc;
          return true;
        }
        if (!block_on(s, e.call)) return false;
        s.issued = false;
        ++s.pc;
        return true;
      }
      case TimelineEntry::Kind::Wait:
        if (!block_on(s, e.call)) return false;
        ++s.pc;
        return true;
      case TimelineEntry::Kind::Replay:
        // cost_timeline expands every replay into the entries it repeats; one left here is a
        // caller's mistake, named as such rather than reported as a deadlock.
        PARALLEL_FAIL(
            "step simulation: rank {} at entry {} is an unexpanded replay (cost the timeline "
            "with cost_timeline first)",
            s.rank, s.pc);
    }
    return false;
  }

  // The compute stream waits for call `id`; false while its completion is unknown.
  bool block_on(RankSim& s, int64_t id) {
    const auto it = s.calls.find(id);
    PARALLEL_CHECK(it != s.calls.end(), "step simulation: rank {} waits for call {}, never issued", s.rank,
                   id);
    const Call& c = it->second;
    if (std::isnan(c.end)) return false;
    const double blocked = std::max(0.0, c.end - s.clock);
    if (blocked > 0) {
      // A rank that blocks on an oversubscribed node resumes only when the scheduler gives it a
      // core back: the measured wait, for a group smaller than the node's ranks the one measured
      // on pairs inside the job (0 on a node with a device per rank).
      const double wake = cost_.oversubscribed_wait_s(c.group_ranks);
      ++s.out.blocking_waits;
      s.out.oversubscribed_wait_s += wake;
      s.out.exposed_s[c.dim] += wake;
    }
    if (c.p2p && c.dim == "pp") {
      const double wire = std::min(blocked, c.transfer);
      s.out.exposed_s["pp"] += wire;
      s.out.bubble_s += blocked - wire;
    } else {
      s.out.exposed_s[c.dim] += blocked;
    }
    s.clock = std::max(s.clock, c.end + (blocked > 0 ? cost_.oversubscribed_wait_s(c.group_ranks) : 0.0));
    return true;
  }

  void issue(std::size_t i, const SimEntry& e) {
    RankSim& s = sims_[i];
    Call& call = s.calls[e.call];
    call.dim = dimension_of(e.comm.group);
    const std::string& kind = e.comm.kind;
    if (kind == "send" || kind == "recv" || kind == "batch_p2p") {
      call.p2p = true;
      std::vector<std::pair<bool, int64_t>> ops;
      if (kind == "batch_p2p")
        ops = batch_ops(e.comm.detail);
      else
        ops = {{kind == "send", e.comm.bytes}};
      PARALLEL_CHECK(ops.size() == e.comm.peers.size(), "step simulation: malformed {}", e.comm.str());
      call.pending = static_cast<int>(ops.size());
      if (ops.empty()) call.end = s.clock;
      for (std::size_t k = 0; k < ops.size(); ++k) {
        const int peer = e.comm.peers[k];
        if (!index_.count(peer)) {
          // A peer in this rank's own stage (context parallelism's ring): it is symmetric with this
          // rank, so it posts the matching op now, and the transfer starts at once.
          PARALLEL_CHECK(
              call.dim != "pp",
              "step simulation: rank {} exchanges with rank {} over {}, which represents no symmetry "
              "class (the rule: one rank per pipeline stage, tp = cp = dp = 0)",
              s.rank, peer, e.comm.group);
          const double wire = cost_.p2p_seconds(ops[k].second, s.rank, peer);
          call.max_end = std::max(call.max_end, s.clock + wire);
          call.transfer = std::max(call.transfer, wire);
          if (--call.pending == 0) call.end = call.max_end;
          continue;
        }
        const bool send = ops[k].first;
        const std::pair<int, int> key = send ? std::pair{s.rank, peer} : std::pair{peer, s.rank};
        (send ? sends_ : recvs_)[key].push_back({i, e.call, s.clock, ops[k].second});
        match(key);
      }
      return;
    }
    // A collective: its members among the representatives must all issue it.
    call.group_ranks = static_cast<int>(e.comm.ranks.size());
    int reps = 0;
    for (int r : e.comm.ranks) reps += static_cast<int>(index_.count(r));
    const double cost = cost_.collective_seconds(e.comm);
    if (reps <= 1) {
      const double start = std::max(s.clock, s.stream_free[e.comm.group]);
      call.end = start + cost;
      s.stream_free[e.comm.group] = call.end;
      return;
    }
    auto& seq = sequence_[{s.rank, e.comm.group, e.comm.ranks}];
    auto& arrivals = arrivals_[{e.comm.group, e.comm.ranks, seq++}];
    arrivals.push_back({i, e.call, s.clock});
    if (static_cast<int>(arrivals.size()) < reps) return;
    double start = 0;
    for (const Arrival& a : arrivals)
      start = std::max({start, a.time, sims_[a.sim].stream_free[e.comm.group]});
    for (const Arrival& a : arrivals) {
      sims_[a.sim].calls[a.call].end = start + cost;
      sims_[a.sim].stream_free[e.comm.group] = start + cost;
    }
  }

  struct P2P {
    std::size_t sim;
    int64_t call;
    double time;
    int64_t bytes;
  };

  void match(const std::pair<int, int>& key) {
    auto& sq = sends_[key];
    auto& rq = recvs_[key];
    while (!sq.empty() && !rq.empty()) {
      const P2P snd = sq.front(), rcv = rq.front();
      sq.pop_front();
      rq.pop_front();
      PARALLEL_CHECK(snd.bytes == rcv.bytes,
                     "step simulation: rank {} sends {} bytes to rank {}, which receives {}", key.first,
                     snd.bytes, key.second, rcv.bytes);
      const double wire = cost_.p2p_seconds(snd.bytes, key.first, key.second);
      const double end = std::max(snd.time, rcv.time) + wire;
      for (const P2P& side : {snd, rcv}) {
        Call& c = sims_[side.sim].calls[side.call];
        c.max_end = std::max(c.max_end, end);
        c.transfer = std::max(c.transfer, wire);
        if (--c.pending == 0) c.end = c.max_end;
      }
    }
  }

  const CostModel& cost_;
  std::map<int, std::vector<SimEntry>> deferred_;  // the timelines as run (defer_to_waits)
  std::vector<RankSim> sims_;
  std::map<int, std::size_t> index_;
  std::map<std::pair<int, int>, std::deque<P2P>> sends_, recvs_;
  std::map<std::tuple<int, std::string, std::vector<int>>, int64_t> sequence_;
  std::map<std::tuple<std::string, std::vector<int>, int64_t>, std::vector<Arrival>> arrivals_;
};

}  // namespace

namespace {

void append_op(std::vector<SimEntry>& out, double seconds) {
  if (!out.empty() && out.back().kind == TimelineEntry::Kind::Op)
    out.back().seconds += seconds;
  else
    out.push_back(SimEntry{.kind = TimelineEntry::Kind::Op, .seconds = seconds, .comm = {}, .call = -1});
}

std::vector<SimEntry> cost_range(const std::vector<TimelineEntry>& timeline, std::size_t begin,
                                 std::size_t end, const CostModel& cost) {
  std::vector<SimEntry> out;
  for (std::size_t i = begin; i < end; ++i) {
    const TimelineEntry& e = timeline[i];
    PARALLEL_CHECK(e.kind != TimelineEntry::Kind::Replay, "cost_timeline: a replay of a replay (entry {})",
                   i);
    if (e.kind == TimelineEntry::Kind::Op)
      append_op(out, cost.op_seconds(e.op));
    else
      out.push_back(SimEntry{.kind = e.kind, .seconds = 0, .comm = e.comm, .call = e.call});
  }
  return out;
}

}  // namespace

std::vector<SimEntry> cost_timeline(const std::vector<TimelineEntry>& timeline, const CostModel& cost) {
  std::vector<SimEntry> out;
  std::map<std::pair<int64_t, int64_t>, std::vector<SimEntry>> ranges;  // costed once each
  for (const TimelineEntry& e : timeline) {
    if (e.kind == TimelineEntry::Kind::Op) {
      append_op(out, cost.op_seconds(e.op));
      continue;
    }
    if (e.kind != TimelineEntry::Kind::Replay) {
      out.push_back(SimEntry{.kind = e.kind, .seconds = 0, .comm = e.comm, .call = e.call});
      continue;
    }
    auto it = ranges.find({e.replay_begin, e.replay_end});
    if (it == ranges.end())
      it = ranges
               .emplace(std::pair{e.replay_begin, e.replay_end},
                        cost_range(timeline, static_cast<std::size_t>(e.replay_begin),
                                   static_cast<std::size_t>(e.replay_end), cost))
               .first;
    int64_t first = -1;
    for (const SimEntry& r : it->second) {
      if (r.kind == TimelineEntry::Kind::Op) {
        append_op(out, r.seconds);
        continue;
      }
      if (r.kind == TimelineEntry::Kind::Comm && first < 0) first = r.call;
      SimEntry copy = r;
      copy.call = replayed_call(e, first, r.call);
      out.push_back(std::move(copy));
    }
  }
  return out;
}

SimulationResult simulate(const std::map<int, std::vector<SimEntry>>& timelines, const CostModel& cost) {
  return Simulator(timelines, cost).run();
}

SimulationResult simulate(const std::map<int, std::vector<TimelineEntry>>& timelines, const CostModel& cost) {
  std::map<int, std::vector<SimEntry>> costed;
  for (const auto& [rank, tl] : timelines) costed[rank] = cost_timeline(tl, cost);
  return simulate(costed, cost);
}

}  // namespace parallel::plan
