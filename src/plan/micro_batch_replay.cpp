// MicroBatchReplay (step_cost.hpp): the planner runs a step's identical micro-batches once and
// records the rest as replays of the first one's timeline entries.
#include <algorithm>
#include <utility>

#include "parallel/error.hpp"
#include "parallel/meta_timeline.hpp"
#include "parallel/step_cost.hpp"

namespace parallel::plan {

MicroBatchReplay::MicroBatchReplay(pipeline::PipelineModel& inner, int micro_batches)
    : inner_(inner), micro_batches_(micro_batches) {}

bool MicroBatchReplay::runs(int micro_batch) const {
  // Micro-batch 0 may do first-time work (buffers made on first use); the last one's backward
  // starts the data-parallel reductions. Micro-batch 1 is the one recorded for the others.
  return micro_batches_ < 4 || micro_batch <= 1 || micro_batch == micro_batches_ - 1 ||
         meta::live_timeline() == nullptr;
}

namespace {

// The calls entries [begin, end) issue, in order.
std::vector<int64_t> calls_of(const MetaTimeline& timeline, std::size_t begin, std::size_t end) {
  std::vector<int64_t> out;
  for (std::size_t i = begin; i < end; ++i)
    if (timeline.entries()[i].kind == TimelineEntry::Kind::Comm) out.push_back(timeline.entries()[i].call);
  return out;
}

}  // namespace

template <typename Run>
Tensor MicroBatchReplay::run_or_replay(Action action, int chunk, int micro_batch, Run run) {
  MetaTimeline* timeline = meta::live_timeline();
  const std::pair<int, int> key{static_cast<int>(action), chunk};
  std::vector<int64_t>& previous = last_calls_[key];  // the calls of this action's last micro-batch
  if (runs(micro_batch)) {
    const std::size_t begin = timeline ? timeline->size() : 0;
    Tensor out = run();
    if (!timeline) return out;
    const std::size_t end = timeline->size();
    const std::vector<int64_t> calls = calls_of(*timeline, begin, end);
    // After replays: a wait for the last real run's k-th call (the handle the model kept; replays
    // renew no handles) is a wait for the predecessor's k-th call.
    std::vector<int64_t>& real = real_calls_[key];
    if (previous != real)
      for (std::size_t i = begin; i < end; ++i) {
        const TimelineEntry& e = timeline->entries()[i];
        if (e.kind != TimelineEntry::Kind::Wait) continue;
        const auto at = std::find(real.begin(), real.end(), e.call);
        if (at == real.end()) continue;
        const auto k = static_cast<std::size_t>(at - real.begin());
        PARALLEL_CHECK(k < previous.size(),
                       "MicroBatchReplay: chunk {} micro-batch {} waits for call {} of an "
                       "earlier micro-batch that its replayed predecessor does not issue",
                       chunk, micro_batch, e.call);
        timeline->retarget_wait(i, previous[k]);
      }
    real = calls;
    if (micro_batch == 1) {
      Segment& s = segments_[key];
      s = {begin, end, out.defined(), {}, DType::F32, {}};
      if (out.defined()) {
        s.shape = out.shape();
        s.dtype = out.dtype();
      }
      // Waits for calls of an earlier micro-batch (ZeRO-2 waiting for the previous reduction): the
      // k-th call of that micro-batch's same action; a repetition waits for its predecessor's k-th.
      const int64_t first = calls.empty() ? -1 : calls.front();
      for (std::size_t i = begin; i < end; ++i) {
        const TimelineEntry& e = timeline->entries()[i];
        if (e.kind != TimelineEntry::Kind::Wait || (first >= 0 && e.call >= first)) continue;
        const auto at = std::find(previous.begin(), previous.end(), e.call);
        PARALLEL_CHECK(at != previous.end(),
                       "MicroBatchReplay: chunk {} micro-batch 1 waits for call {}, which is not one of "
                       "micro-batch 0's same action: its repetitions cannot be replayed",
                       chunk, e.call);
        s.earlier_waits.emplace_back(e.call, at - previous.begin());
      }
    }
    previous = calls;
    return out;
  }
  const auto it = segments_.find(key);
  PARALLEL_CHECK(
      it != segments_.end(),
      "MicroBatchReplay: micro-batch {} of chunk {} comes before micro-batch 1's, which it replays",
      micro_batch, chunk);
  const Segment& s = it->second;
  std::vector<std::pair<int64_t, int64_t>> waits;
  for (const auto& [call, k] : s.earlier_waits) {
    PARALLEL_CHECK(k < static_cast<std::ptrdiff_t>(previous.size()),
                   "MicroBatchReplay: chunk {} micro-batch {} has no predecessor call {} to wait for", chunk,
                   micro_batch, k);
    waits.emplace_back(call, previous[static_cast<std::size_t>(k)]);
  }
  const int64_t first = timeline->replay(s.begin, s.end, std::move(waits));
  const std::size_t count = calls_of(*timeline, s.begin, s.end).size();
  previous.resize(count);
  for (std::size_t k = 0; k < count; ++k) previous[k] = first + static_cast<int64_t>(k);
  ++replays_;
  return s.defined ? Tensor::empty(s.shape, s.dtype, Device::meta()) : Tensor();
}

Tensor MicroBatchReplay::forward(int chunk, int micro_batch, const Tensor& input) {
  return run_or_replay(Action::Forward, chunk, micro_batch,
                       [&] { return inner_.forward(chunk, micro_batch, input); });
}

Tensor MicroBatchReplay::backward(int chunk, int micro_batch, const Tensor& grad) {
  return run_or_replay(Action::Backward, chunk, micro_batch,
                       [&] { return inner_.backward(chunk, micro_batch, grad); });
}

Tensor MicroBatchReplay::backward_input(int chunk, int micro_batch, const Tensor& grad) {
  return run_or_replay(Action::BackwardInput, chunk, micro_batch,
                       [&] { return inner_.backward_input(chunk, micro_batch, grad); });
}

void MicroBatchReplay::backward_weight(int chunk, int micro_batch) {
  run_or_replay(Action::BackwardWeight, chunk, micro_batch, [&] {
    inner_.backward_weight(chunk, micro_batch);
    return Tensor();
  });
}

}  // namespace parallel::plan
