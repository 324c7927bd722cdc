// ring_sum: the ring of ring_reduce.hpp, one step at a time. A step posts one receive from the left
// and one send to the right, waits for both (paced by a WaitPacer, under the watchdog's deadline),
// then reduces what arrived. Piece k of the message is rank c's elements
// [k * sub, (k + 1) * sub) of its chunk, so a reduce-scatter's result lands straight in `out` and
// chunks of unequal length (numpy's array_split) need nothing special: a short chunk's late pieces
// are empty messages.
#include "comm/ring_reduce.hpp"

#include <algorithm>
#include <climits>
#include <exception>

#include "comm/mpi_group_label.hpp"
#include "comm/pair_reduce.hpp"
#include "comm/watchdog.hpp"
#include "parallel/error.hpp"

namespace parallel::detail {

std::byte* RingState::buffers_of(int64_t bytes) {
  if (bytes > buffer_bytes) {
    buffers = std::make_unique_for_overwrite<std::byte[]>(static_cast<std::size_t>(bytes));
    buffer_bytes = bytes;
  }
  return buffers.get();
}

namespace {

constexpr int kTag = 1;

bool mpi_usable() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

}  // namespace

class RingWork final : public Work {
 public:
  RingWork(std::shared_ptr<RingState> state, const char* operation, Tensor tensor, Tensor out)
      : state_(std::move(state)), operation_(operation), tensor_(std::move(tensor)), out_(std::move(out)) {
    const int p = state_->size;
    PARALLEL_CHECK(p >= 3, "ring_sum: a ring needs three ranks or more, the group has {}", p);
    es_ = static_cast<int64_t>(dtype_size(tensor_.dtype()));
    const int64_t widest = chunk_of(tensor_.numel(), p, 0).count;  // the first chunks are the longest
    sub_ = std::clamp<int64_t>(state_->piece_bytes / 4 / es_, 1, INT_MAX / es_);
    sub_ = std::max<int64_t>(1, std::min(sub_, widest));
    pieces_ = (widest + sub_ - 1) / sub_;
    steps_ = out_.defined() ? p - 1 : 2 * (p - 1);
    stages_ = pieces_ * steps_;
    state_->queue.push(this);
  }

  ~RingWork() override {
    if (!done_ && std::uncaught_exceptions() == 0 && mpi_usable()) {
      wait();
      return;
    }
    if (!done_) {
      // Unwinding towards MPI_Abort: MPI may still write into the tensors and buffers, so leak them.
      new Tensor(std::move(tensor_));
      new Tensor(std::move(out_));
      new std::shared_ptr<RingState>(state_);
    }
    state_->queue.remove(this);
  }

  // Earlier operations first: the other ranks work through the same queue in the same order.
  void wait() override {
    state_->queue.run_until([this] { return done_; }, /*block=*/true);
  }
  bool is_completed() override {
    return state_->queue.run_until([this] { return done_; }, /*block=*/false);
  }

 private:
  friend class InOrderQueue<RingWork>;

  struct Block {
    int64_t offset, count;  // elements of the whole tensor
  };

  // Rank c's part of piece k.
  Block block(int64_t k, int c) const {
    const Chunk chunk = chunk_of(tensor_.numel(), state_->size, c);
    return {chunk.offset + k * sub_, std::clamp<int64_t>(chunk.count - k * sub_, 0, sub_)};
  }

  int ring(int r) const { return ((r % state_->size) + state_->size) % state_->size; }
  std::byte* buffer(int64_t step) const { return state_->buffers.get() + (step % 2) * sub_ * es_; }
  std::byte* at(const Tensor& t, int64_t element) const {
    return static_cast<std::byte*>(t.data_ptr()) + element * es_;
  }

  // Runs the stages that can run; true once this operation is complete (it then leaves the queue).
  bool advance(bool block) {
    while (!done_) {
      if (!posted_) post(next_stage_);
      if (!test(block)) return false;
      reduce(next_stage_);
      if (++next_stage_ == stages_) finish();
    }
    return true;
  }

  // Reduce-scatter step s (< p - 1) of a piece: rank r passes on the partial sum of rank
  // (r - s - 1)'s block (at s = 0 its own contribution) and receives that of rank (r - s - 2)'s,
  // which it extends with its own; at s = p - 2 that is its own block, complete. All-gather step
  // g = s - (p - 1): rank r passes on the complete block of rank (r - g) and receives rank
  // (r - g - 1)'s, straight into the tensor.
  void post(int64_t stage) {
    const int64_t k = stage / steps_, s = stage % steps_;
    const int p = state_->size, r = state_->rank;
    void* into = nullptr;
    const void* from = nullptr;
    Block send{}, recv{};
    if (s < p - 1) {
      send = block(k, ring(r - static_cast<int>(s) - 1));
      recv = block(k, ring(r - static_cast<int>(s) - 2));
      state_->buffers_of(2 * sub_ * es_);
      into = buffer(s);
      from = s == 0 ? at(tensor_, send.offset) : buffer(s - 1);
    } else {
      const int g = static_cast<int>(s) - (p - 1);
      send = block(k, ring(r - g));
      recv = block(k, ring(r - g - 1));
      into = at(tensor_, recv.offset);
      from = at(tensor_, send.offset);
    }
    PARALLEL_MPI_CHECK(MPI_Irecv(into, static_cast<int>(recv.count * es_), MPI_BYTE, ring(r - 1), kTag,
                                 state_->comm, &requests_[0]));
    PARALLEL_MPI_CHECK(MPI_Isend(from, static_cast<int>(send.count * es_), MPI_BYTE, ring(r + 1), kTag,
                                 state_->comm, &requests_[1]));
    posted_ = true;
  }

  // True once the posted step's two messages are done; with `block`, waits for them.
  bool test(bool block) {
    int flag = 0;
    PARALLEL_MPI_CHECK(MPI_Testall(2, requests_, &flag, MPI_STATUSES_IGNORE));
    if (!flag && block) {
      WaitPacer pacer;
      while (!flag) {
        if (!pacer.pause())
          watchdog_expired(operation_, describe_group(state_->label->name, state_->label->world_ranks),
                           pacer.elapsed_s());
        PARALLEL_MPI_CHECK(MPI_Testall(2, requests_, &flag, MPI_STATUSES_IGNORE));
      }
    }
    if (flag) posted_ = false;
    return flag != 0;
  }

  // partial (received) + local, into the next partial, or at the last step into the result.
  void reduce(int64_t stage) {
    const int64_t k = stage / steps_, s = stage % steps_;
    const int p = state_->size;
    if (s >= p - 1) return;
    const Block recv = block(k, ring(state_->rank - static_cast<int>(s) - 2));
    void* result = s < p - 2 ? buffer(s) : out_.defined() ? at(out_, k * sub_) : at(tensor_, recv.offset);
    pair_reduce(tensor_.dtype(), ReduceOp::Sum, buffer(s), at(tensor_, recv.offset), result, recv.count);
  }

  void finish() {
    done_ = true;
    tensor_ = Tensor();
    out_ = Tensor();
    state_->queue.remove(this);
  }

  std::shared_ptr<RingState> state_;
  const char* operation_;
  Tensor tensor_;  // all-reduce: the tensor; reduce-scatter: `in`
  Tensor out_;     // reduce-scatter only
  int64_t es_ = 0;
  int64_t sub_ = 0;     // elements of a rank's chunk per piece
  int64_t pieces_ = 0;  // pieces of the longest chunk
  int64_t steps_ = 0;   // per piece
  int64_t stages_ = 0, next_stage_ = 0;
  MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  bool posted_ = false;
  bool done_ = false;
};

std::shared_ptr<Work> ring_sum(std::shared_ptr<RingState> state, const char* operation, Tensor tensor,
                               Tensor out) {
  return std::make_shared<RingWork>(std::move(state), operation, std::move(tensor), std::move(out));
}

}  // namespace parallel::detail
