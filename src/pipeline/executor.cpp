// Runs one rank's pipeline schedule with real point-to-point messages.
//
// Message matching: all messages go with tag 0, so they match in posting order between a pair of
// ranks, exactly as on NCCL (which has no tags). The schedules guarantee that every message is sent
// and received once, not that a rank receives in the order its neighbour sends: with p == 2 the same
// pair of ranks carries activations and gradients of several chunks. So the receiver derives the
// sender's posting order from the sender's schedule (a pure function) and always receives the
// sender's next message; one that arrives before it is needed is kept until its action comes.
// That never blocks on anything the needed message does not already wait for: the sender posts
// the earlier messages before the needed one, and sends never block.
#include <algorithm>
#include <chrono>

#include "parallel/allocator.hpp"
#include "parallel/error.hpp"
#include "parallel/pipeline.hpp"

namespace parallel::pipeline {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A send whose buffer must live until the transfer completes.
struct PendingSend {
  WorkHandle work;
  Tensor buffer;
};

}  // namespace

Tensor PipelineModel::backward_input(int chunk, int micro_batch, const Tensor&) {
  PARALLEL_FAIL(
      "pipeline: this model cannot split its backward (chunk {} micro-batch {}); use a schedule "
      "with fused backwards",
      chunk, micro_batch);
}

void PipelineModel::backward_weight(int chunk, int micro_batch) {
  PARALLEL_FAIL(
      "pipeline: this model cannot split its backward (chunk {} micro-batch {}); use a schedule "
      "with fused backwards",
      chunk, micro_batch);
}

PipelineExecutor::PipelineExecutor(Communicator& pp, ExecutorOptions options)
    : pp_(pp),
      options_(std::move(options)),
      p_(pp.size()),
      rank_(pp.rank()),
      last_stage_(pp.size() * options_.virtual_stages - 1),
      placement_(placement_of(options_.kind)) {
  PARALLEL_CHECK(options_.schedule != nullptr, "PipelineExecutor: no schedule function");
  const ScheduleParams mine{p_, rank_, options_.micro_batches, options_.virtual_stages, options_.kind};
  schedule_ = options_.schedule(mine);
  if (p_ > 1)
    PARALLEL_CHECK(!options_.activation_shape.empty(), "PipelineExecutor: activation_shape is not set");

  // Mirrored send/receive pairs with a neighbour: one batch each (pipeline_schedule.hpp).
  if (p_ > 1)
    for (const PairedExchange& e : paired_exchanges(mine, options_.schedule)) {
      Batch& b = batched_runs_[e.begin];
      b.end = e.end;
      b.peers.push_back(e.peer);
    }

  // The neighbours' posting order of the messages addressed to this rank. Stages next to each other
  // sit on neighbouring ranks (the loop placement wraps from rank p - 1 to 0, the V one turns on
  // rank p - 1, whose messages between its two chunks stay on the rank: no order to derive).
  for (int source : {(rank_ + p_ - 1) % p_, (rank_ + 1) % p_}) {
    if (source == rank_ || incoming_.count(source)) continue;
    std::vector<Key>& order = incoming_[source];
    ScheduleParams theirs = mine;
    theirs.rank = source;
    for (const Action& a : options_.schedule(theirs)) {
      if (a.op != Op::SendForward && a.op != Op::SendBackward) continue;
      const Key key = destination(source, a);
      if (key.rank == rank_) order.push_back(key);
    }
  }
}

std::pair<PipelineExecutor::Key, int> PipelineExecutor::receive_key(const Action& recv) const {
  const bool gradient = recv.op == Op::RecvBackward;
  const int g = global_stage(p_, rank_, recv.chunk, placement_);
  return {{gradient, recv.chunk, recv.micro_batch, rank_},
          stage_owner(p_, g + (gradient ? 1 : -1), placement_).rank};
}

PipelineExecutor::Key PipelineExecutor::destination(int source, const Action& send) const {
  const bool gradient = send.op == Op::SendBackward;
  const int dest = global_stage(p_, source, send.chunk, placement_) + (gradient ? -1 : 1);
  const StageOwner owner = stage_owner(p_, dest, placement_);
  return {gradient, owner.chunk, send.micro_batch, owner.rank};
}

Tensor PipelineExecutor::receive(const Key& key, int source, StepStats& stats) {
  if (source == rank_) {
    // Between the two chunks of one rank (the V's turn): the send put it here already.
    auto it = early_.find(key);
    PARALLEL_CHECK(it != early_.end(), "pipeline rank {}: {} of chunk {} micro-batch {} was not produced yet",
                   rank_, key.gradient ? "the gradient" : "the activation", key.chunk, key.micro_batch);
    Tensor out = std::move(it->second);
    early_.erase(it);
    return out;
  }
  const std::vector<Key>& order = incoming_[source];
  std::size_t& next = cursor_[source];
  while (!early_.count(key)) {
    PARALLEL_CHECK(next < order.size(), "pipeline rank {}: rank {} never sends {} of chunk {} micro-batch {}",
                   rank_, source, key.gradient ? "the gradient" : "the activation", key.chunk,
                   key.micro_batch);
    Tensor buffer = Tensor::empty(options_.activation_shape, options_.dtype, options_.device);
    const auto start = Clock::now();
    pp_.recv(buffer, source, 0)->wait();
    stats.idle_seconds += seconds_since(start);
    ++stats.messages_received;
    if (order[next] != key) ++stats.received_early;
    early_.emplace(order[next++], std::move(buffer));
  }
  auto it = early_.find(key);
  Tensor out = std::move(it->second);
  early_.erase(it);
  return out;
}

StepStats PipelineExecutor::run(PipelineModel& model) {
  StepStats stats;
  Allocator& allocator = allocator_for(options_.device);
  allocator.reset_peak();
  stats.start_allocated_bytes = allocator.stats().allocated;
  const auto step_start = Clock::now();
  cursor_.clear();
  early_.clear();

  // Tensors between their producing action and the action that consumes them, by (chunk, mb).
  std::map<std::pair<int, int>, Tensor> inputs, output_grads, to_send;
  std::vector<PendingSend> sends;
  int in_flight = 0, until_weight = 0;

  auto take = [](std::map<std::pair<int, int>, Tensor>& from, std::pair<int, int> key) {
    auto it = from.find(key);
    if (it == from.end()) return Tensor();
    Tensor t = std::move(it->second);
    from.erase(it);
    return t;
  };
  auto post_send_checks = [&](const Tensor& t, const Action& a) {
    PARALLEL_CHECK(t.defined() && t.shape() == options_.activation_shape && t.dtype() == options_.dtype,
                   "pipeline rank {}: {} produced {}, but stages exchange {} {}", rank_, to_string(a),
                   t.str(), shape_str(options_.activation_shape), dtype_name(options_.dtype));
  };
  auto post_send = [&](const Tensor& t, const Action& a) {
    post_send_checks(t, a);
    const Key to = destination(rank_, a);
    if (to.rank == rank_) {
      // The next chunk on this rank gets its own copy, as a received message would be: the producing
      // chunk may still hold (and its backward reuse) the tensor it returned.
      early_.emplace(to, t.clone());
      return;
    }
    Tensor buffer = t.contiguous();
    sends.push_back({pp_.send(buffer, to.rank, 0), buffer});
    ++stats.messages_sent;
  };

  // A mirrored pair of runs with a neighbour (paired_exchanges: 1F1B's send-forward-receive-
  // backward, DualPipe's paired chunks) posts the messages to and from that neighbour as one
  // batch_p2p, on NCCL one group, so that two neighbours exchanging in both directions cannot
  // block each other; the run's other messages go as usual (sends first, then the receives).
  auto exchange = [&](std::size_t begin, const Batch& e) {
    auto paired = [&](int rank) { return std::find(e.peers.begin(), e.peers.end(), rank) != e.peers.end(); };
    std::vector<P2POp> ops;
    std::vector<Key> arriving;  // the batch's receives, in ops order after its sends
    for (std::size_t i = begin; i < e.end; ++i) {
      const Action& a = schedule_[i];
      if (a.op != Op::SendForward && a.op != Op::SendBackward) continue;
      Tensor t = take(to_send, {a.chunk, a.micro_batch});
      const int dest = destination(rank_, a).rank;
      if (!paired(dest)) {
        post_send(t, a);
        continue;
      }
      post_send_checks(t, a);
      ops.push_back({P2POp::Kind::Send, t.contiguous(), dest, 0});
      ++stats.messages_sent;
    }
    const std::size_t sends_in_batch = ops.size();
    for (std::size_t i = begin; i < e.end; ++i) {
      const Action& a = schedule_[i];
      if (a.op != Op::RecvForward && a.op != Op::RecvBackward) continue;
      const auto [key, source] = receive_key(a);
      if (!paired(source)) continue;
      // Everything the peer posts to this rank up to the needed message, as receive() would.
      const std::vector<Key>& order = incoming_[source];
      std::size_t& next = cursor_[source];
      while (!early_.count(key) && std::find(arriving.begin(), arriving.end(), key) == arriving.end()) {
        PARALLEL_CHECK(next < order.size(), "pipeline rank {}: rank {} never sends {}", rank_, source,
                       to_string(a));
        ops.push_back({P2POp::Kind::Recv,
                       Tensor::empty(options_.activation_shape, options_.dtype, options_.device), source, 0});
        if (order[next] != key) ++stats.received_early;
        arriving.push_back(order[next++]);
      }
    }
    const auto start = Clock::now();
    pp_.batch_p2p(ops)->wait();
    stats.idle_seconds += seconds_since(start);
    ++stats.batches;
    for (std::size_t j = 0; j < arriving.size(); ++j) {
      early_.emplace(arriving[j], std::move(ops[sends_in_batch + j].tensor));
      ++stats.messages_received;
    }
    for (std::size_t i = begin; i < e.end; ++i) {
      const Action& a = schedule_[i];
      if (a.op != Op::RecvForward && a.op != Op::RecvBackward) continue;
      const auto [key, source] = receive_key(a);
      (a.op == Op::RecvForward ? inputs : output_grads)[{a.chunk, a.micro_batch}] =
          receive(key, source, stats);
    }
  };

  for (std::size_t i = 0; i < schedule_.size(); ++i) {
    const Action& a = schedule_[i];
    if (auto run = batched_runs_.find(i); run != batched_runs_.end()) {
      exchange(i, run->second);
      i = run->second.end - 1;
      std::erase_if(sends, [](PendingSend& s) { return s.work->is_completed(); });
      continue;
    }
    const int g = global_stage(p_, rank_, a.chunk, placement_);
    const std::pair<int, int> key{a.chunk, a.micro_batch};
    switch (a.op) {
      case Op::RecvForward: {
        const auto [from, source] = receive_key(a);
        inputs[key] = receive(from, source, stats);
        break;
      }
      case Op::RecvBackward: {
        const auto [from, source] = receive_key(a);
        output_grads[key] = receive(from, source, stats);
        break;
      }
      case Op::Forward: {
        const Tensor input = take(inputs, key);
        const auto start = Clock::now();
        Tensor out = model.forward(a.chunk, a.micro_batch, input);
        stats.busy_seconds += seconds_since(start);
        ++stats.forwards;
        stats.peak_in_flight = std::max(stats.peak_in_flight, ++in_flight);
        stats.peak_until_weight = std::max(stats.peak_until_weight, ++until_weight);
        if (g != last_stage_) to_send[key] = std::move(out);
        break;
      }
      case Op::Backward:
      case Op::BackwardInput: {
        const Tensor grad = take(output_grads, key);
        const auto start = Clock::now();
        Tensor dx = a.op == Op::Backward ? model.backward(a.chunk, a.micro_batch, grad)
                                         : model.backward_input(a.chunk, a.micro_batch, grad);
        stats.busy_seconds += seconds_since(start);
        ++stats.backwards;
        --in_flight;
        if (a.op == Op::Backward) --until_weight;
        if (g != 0) to_send[key] = std::move(dx);
        break;
      }
      case Op::BackwardWeight: {
        const auto start = Clock::now();
        model.backward_weight(a.chunk, a.micro_batch);
        stats.busy_seconds += seconds_since(start);
        ++stats.weight_steps;
        --until_weight;
        break;
      }
      // Forward outputs and input gradients never share a key in to_send: an action's SendForward
      // comes before its Backward, which comes before its SendBackward.
      case Op::SendForward:
      case Op::SendBackward:
        post_send(take(to_send, key), a);
        break;
    }
    // Free the buffers of completed sends as we go, so they do not pile up over the step.
    std::erase_if(sends, [](PendingSend& s) { return s.work->is_completed(); });
  }

  const auto drain_start = Clock::now();
  for (PendingSend& s : sends) s.work->wait();
  sends.clear();
  stats.drain_seconds = seconds_since(drain_start);
  PARALLEL_CHECK(inputs.empty() && output_grads.empty() && to_send.empty() && early_.empty(),
                 "pipeline rank {}: the schedule left messages unused", rank_);
  stats.total_seconds = seconds_since(step_start);
  stats.peak_allocated_bytes = allocator.stats().peak_allocated;
  return stats;
}

}  // namespace parallel::pipeline
