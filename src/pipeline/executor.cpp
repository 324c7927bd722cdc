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
      last_stage_(pp.size() * options_.virtual_stages - 1) {
  PARALLEL_CHECK(options_.schedule != nullptr, "PipelineExecutor: no schedule function");
  const ScheduleParams mine{p_, rank_, options_.micro_batches, options_.virtual_stages, options_.kind};
  schedule_ = options_.schedule(mine);
  if (p_ > 1)
    PARALLEL_CHECK(!options_.activation_shape.empty(), "PipelineExecutor: activation_shape is not set");

  // The neighbours' posting order of the messages addressed to this rank.
  for (int source : {(rank_ + p_ - 1) % p_, (rank_ + 1) % p_}) {
    if (source == rank_ || incoming_.count(source)) continue;
    std::vector<Key>& order = incoming_[source];
    ScheduleParams theirs = mine;
    theirs.rank = source;
    for (const Action& a : options_.schedule(theirs)) {
      if (a.op != Op::SendForward && a.op != Op::SendBackward) continue;
      const bool gradient = a.op == Op::SendBackward;
      const int dest = global_stage(p_, source, a.chunk) + (gradient ? -1 : 1);
      if (dest % p_ == rank_) order.push_back({gradient, dest / p_, a.micro_batch});
    }
  }
}

Tensor PipelineExecutor::receive(const Key& key, int source, StepStats& stats) {
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
  auto post_send = [&](const Tensor& t, int dest, const Action& a) {
    PARALLEL_CHECK(t.defined() && t.shape() == options_.activation_shape && t.dtype() == options_.dtype,
                   "pipeline rank {}: {} produced {}, but stages exchange {} {}", rank_, to_string(a),
                   t.str(), shape_str(options_.activation_shape), dtype_name(options_.dtype));
    Tensor buffer = t.contiguous();
    sends.push_back({pp_.send(buffer, dest, 0), buffer});
    ++stats.messages_sent;
  };

  for (const Action& a : schedule_) {
    const int g = global_stage(p_, rank_, a.chunk);
    const std::pair<int, int> key{a.chunk, a.micro_batch};
    switch (a.op) {
      case Op::RecvForward:
        inputs[key] = receive({false, a.chunk, a.micro_batch}, (g - 1) % p_, stats);
        break;
      case Op::RecvBackward:
        output_grads[key] = receive({true, a.chunk, a.micro_batch}, (g + 1) % p_, stats);
        break;
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
        post_send(take(to_send, key), (g + 1) % p_, a);
        break;
      case Op::SendBackward:
        post_send(take(to_send, key), (g - 1) % p_, a);
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
