#include "parallel/mpi_communicator.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <exception>
#include <mutex>
#include <numeric>
#include <utility>

#include "comm/in_order_queue.hpp"
#include "comm/mpi_group_label.hpp"
#include "comm/pair_reduce.hpp"
#include "comm/ring_reduce.hpp"
#include "comm/watchdog.hpp"
#include "parallel/error.hpp"

namespace parallel {

namespace {

bool mpi_usable() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// ---- bf16 / fp16 reductions -------------------------------------------------------------------
// MPI has no 16-bit float types, so the data travels as opaque 2-byte elements and user-defined ops
// do the arithmetic (pair_reduce: widen to fp32, combine, round back once per pairwise step, as
// NCCL does). MPI calls the op with (in, inout) and wants inout = in op inout.

template <DType D, ReduceOp Op>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  detail::pair_reduce(D, Op, in, inout, inout, *len);
}

struct HalfTypes {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op bf16_ops[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};  // indexed by ReduceOp
  MPI_Op f16_ops[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

HalfTypes g_half;
std::once_flag g_half_once;

// Runs at the start of MPI_Finalize (attributes on MPI_COMM_SELF are deleted first), while MPI
// still works, so the handles are released instead of being reported as leaks.
int free_half_types(MPI_Comm, int, void*, void*) {
  for (MPI_Op& op : g_half.bf16_ops)
    if (op != MPI_OP_NULL) MPI_Op_free(&op);
  for (MPI_Op& op : g_half.f16_ops)
    if (op != MPI_OP_NULL) MPI_Op_free(&op);
  if (g_half.type != MPI_DATATYPE_NULL) MPI_Type_free(&g_half.type);
  return MPI_SUCCESS;
}

const HalfTypes& half_types() {
  std::call_once(g_half_once, [] {
    PARALLEL_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &g_half.type));
    PARALLEL_MPI_CHECK(MPI_Type_commit(&g_half.type));
    const bool commute = true;
    PARALLEL_MPI_CHECK(MPI_Op_create(&half_reduce<DType::BF16, ReduceOp::Sum>, commute, &g_half.bf16_ops[0]));
    PARALLEL_MPI_CHECK(MPI_Op_create(&half_reduce<DType::BF16, ReduceOp::Max>, commute, &g_half.bf16_ops[1]));
    PARALLEL_MPI_CHECK(MPI_Op_create(&half_reduce<DType::BF16, ReduceOp::Min>, commute, &g_half.bf16_ops[2]));
    PARALLEL_MPI_CHECK(MPI_Op_create(&half_reduce<DType::F16, ReduceOp::Sum>, commute, &g_half.f16_ops[0]));
    PARALLEL_MPI_CHECK(MPI_Op_create(&half_reduce<DType::F16, ReduceOp::Max>, commute, &g_half.f16_ops[1]));
    PARALLEL_MPI_CHECK(MPI_Op_create(&half_reduce<DType::F16, ReduceOp::Min>, commute, &g_half.f16_ops[2]));
    int keyval = MPI_KEYVAL_INVALID;
    PARALLEL_MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_half_types, &keyval, nullptr));
    PARALLEL_MPI_CHECK(MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr));
  });
  return g_half;
}

static_assert(static_cast<int>(ReduceOp::Sum) == 0 && static_cast<int>(ReduceOp::Max) == 1 &&
              static_cast<int>(ReduceOp::Min) == 2);

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::I32:
      return MPI_INT32_T;
    case DType::I64:
      return MPI_INT64_T;
    case DType::U8:
    case DType::F8E4M3:  // moved as bytes; reductions are rejected in mpi_op
      return MPI_UINT8_T;
    case DType::BF16:
    case DType::F16:
      return half_types().type;
  }
  PARALLEL_FAIL("MpiCommunicator: unsupported dtype {}", static_cast<int>(t));
}

MPI_Op mpi_op(ReduceOp op, DType t) {
  const int i = static_cast<int>(op);
  PARALLEL_CHECK(i >= 0 && i < 3, "MpiCommunicator: unknown reduce op {}", i);
  switch (t) {
    case DType::BF16:
      return half_types().bf16_ops[i];
    case DType::F16:
      return half_types().f16_ops[i];
    case DType::F8E4M3:
      PARALLEL_FAIL("MpiCommunicator: reduction ({}) of {} tensors is not supported", reduce_op_name(op),
                    dtype_name(t));
    default:
      break;
  }
  // A switch, not a constexpr table: Open MPI's MPI_SUM casts the address of a global object, which
  // is no constant expression (GCC let it pass, Clang does not); this suits pointer handles and the
  // MPICH family's integer handles alike.
  switch (op) {
    case ReduceOp::Sum:
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
  }
  PARALLEL_FAIL("MpiCommunicator: unknown reduce op {}", i);
}

// ---- argument checks (all before any communication, so a bad call throws on its rank alone and
// never leaves a half-posted collective behind) -----------------------------------------------

void check_tensor(const Tensor& t, const char* what, const char* op) {
  PARALLEL_CHECK(t.defined(), "MpiCommunicator::{}: {} is an undefined tensor", op, what);
  PARALLEL_CHECK(t.device().is_cpu(), "MpiCommunicator::{}: {} is on {}, the MPI backend needs CPU tensors",
                 op, what, t.device().str());
  PARALLEL_CHECK(t.is_contiguous(), "MpiCommunicator::{}: {} ({}, strides {}) must be contiguous", op, what,
                 shape_str(t.shape()), shape_str(t.strides()));
}

int mpi_count(int64_t n, const char* op) {
  PARALLEL_CHECK(n <= INT_MAX, "MpiCommunicator::{}: {} elements exceed MPI's int count limit ({})", op, n,
                 INT_MAX);
  return static_cast<int>(n);
}

void check_same_dtype(const Tensor& in, const Tensor& out, const char* op) {
  PARALLEL_CHECK(in.dtype() == out.dtype(), "MpiCommunicator::{}: in is {} but out is {}", op,
                 dtype_name(in.dtype()), dtype_name(out.dtype()));
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto* a0 = static_cast<const char*>(a.data_ptr());
  const auto* b0 = static_cast<const char*>(b.data_ptr());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// ---- the handle ------------------------------------------------------------------------------

// What a pending operation is, for the watchdog's message: a collective's name, or its messages.
struct PeerMessage {
  bool send;
  int peer;  // in the group
  int tag;
};

class MpiWork final : public Work {
 public:
  MpiWork(const char* operation, std::shared_ptr<const detail::MpiGroupLabel> group)
      : operation_(operation), group_(std::move(group)) {}

  ~MpiWork() override {
    if (done_ || requests_.empty()) return;
    if (std::uncaught_exceptions() > 0 || !mpi_usable()) {
      // Unwinding towards MPI_Abort: waiting could hang on peers that will never arrive, and
      // freeing the buffers would let MPI write into freed memory. Leak both instead.
      new std::vector<Tensor>(std::move(tensors_));
      new std::vector<int>(std::move(counts_));
      new std::vector<int>(std::move(displs_));
      return;
    }
    // The buffers must outlive the transfer, so a dropped handle still completes its operation
    // (under the same deadline as wait()).
    (void)poll(MPI_STATUSES_IGNORE);
  }

  void wait() override {
    if (done_) return;
    std::vector<MPI_Status> statuses(requests_.size());
    int rc = poll(statuses.data());
    // MPI_ERR_IN_STATUS only says "look at the statuses"; report the failure itself.
    if (rc == MPI_ERR_IN_STATUS)
      for (const MPI_Status& s : statuses)
        if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING) {
          rc = s.MPI_ERROR;
          break;
        }
    PARALLEL_MPI_CHECK(rc);
    finish();
  }

  bool is_completed() override {
    if (done_) return true;
    int flag = 0;
    PARALLEL_MPI_CHECK(
        MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag, MPI_STATUSES_IGNORE));
    if (flag) finish();
    return done_;
  }

  MPI_Request* add_request() { return &requests_.emplace_back(MPI_REQUEST_NULL); }
  void keep(const Tensor& t) { tensors_.push_back(t); }
  void note_message(bool send, int peer, int tag) { messages_.push_back({send, peer, tag}); }
  std::vector<int>& counts() { return counts_; }
  std::vector<int>& displs() { return displs_; }

 private:
  // MPI_Testall until every request is done or fails (returns its code), paced by a WaitPacer;
  // past comm_timeout() the watchdog ends the job.
  int poll(MPI_Status* statuses) {
    const int n = static_cast<int>(requests_.size());
    int flag = 0;
    int rc = MPI_Testall(n, requests_.data(), &flag, statuses);
    if (rc != MPI_SUCCESS || flag) return rc;
    detail::WaitPacer pacer;
    for (;;) {
      if (!pacer.pause())
        detail::watchdog_expired(describe(), detail::describe_group(group_->name, group_->world_ranks),
                                 pacer.elapsed_s());
      rc = MPI_Testall(n, requests_.data(), &flag, statuses);
      if (rc != MPI_SUCCESS || flag) return rc;
    }
  }

  // "all_reduce", "recv from world rank 3 (tag 0)", "batch_p2p of 2 (send to world rank 1 tag 0,
  // recv from world rank 1 tag 0)".
  std::string describe() const {
    if (messages_.empty()) return operation_;
    auto message = [this](const PeerMessage& m, const char* tag_sep) {
      const auto& w = group_->world_ranks;
      const int peer = m.peer >= 0 && m.peer < static_cast<int>(w.size()) ? w[m.peer] : m.peer;
      return fmt::format("{} world rank {}{}tag {}", m.send ? "send to" : "recv from", peer, tag_sep, m.tag);
    };
    if (messages_.size() == 1) return message(messages_[0], " (") + ")";
    std::string out = fmt::format("{} of {} (", operation_, messages_.size());
    for (std::size_t i = 0; i < messages_.size(); ++i) out += (i ? ", " : "") + message(messages_[i], " ");
    return out + ")";
  }

  void finish() {
    done_ = true;
    tensors_.clear();
    counts_.clear();
    displs_.clear();
  }

  const char* operation_;
  std::shared_ptr<const detail::MpiGroupLabel> group_;
  std::vector<PeerMessage> messages_;  // point-to-point only
  std::vector<MPI_Request> requests_;
  std::vector<Tensor> tensors_;  // copies share the storage, so it lives until the transfer ends
  std::vector<int> counts_;      // MPI reads these arrays until the collective completes
  std::vector<int> displs_;
  bool done_ = false;
};

WorkHandle finish(std::shared_ptr<MpiWork> work, bool async) {
  if (async) return work;
  work->wait();
  return completed_work();
}

// ---- two-rank reductions over a persistent buffer ---------------------------------------------
// Open MPI's in-place MPI_Iallreduce (libnbc's binomial tree, whatever the size) mallocs a
// temporary of the whole message at every call and copies the message into it; above glibc's
// 32 MiB mmap threshold that memory is mapped afresh each time, so a 56 MB gradient all-reduce
// page-faulted 13,567 times a step, and rank 1's half then waited while rank 0 reduced everything.
// Between two ranks a sum is done here instead, in pieces: each rank sends the half of a piece the
// other reduces, receives the other's contribution to its own half into a buffer kept by the
// communicator, reduces it and sends the result back. Nothing is allocated after the first call,
// both ranks reduce at once, and each element is a0 + a1 in fp32 arithmetic (rounded once for
// 16-bit types), bitwise the binomial tree's two-rank result (sums commute; a NaN present on both
// ranks keeps rank 0's). Reduce-scatter is one exchange with no buffer: the peer's contribution is
// received straight into `out`.
//
// The work runs in wait() / is_completed(), one operation at a time in the order the calls were
// made (the same on both ranks), on a duplicate of the group's communicator, so its messages never
// match the caller's point-to-point traffic and a later call never touches the buffer an earlier
// one is using.

class PairWork;

}  // namespace

namespace detail {
struct MpiPairState {
  MPI_Comm comm = MPI_COMM_NULL;  // duplicate of the group's, for these messages alone
  std::shared_ptr<const MpiGroupLabel> label;
  int rank = 0;
  int64_t piece_bytes = MpiCommunicator::kDefaultReducePieceBytes;
  std::unique_ptr<std::byte[]> buffer;  // the peer's half of a piece
  int64_t buffer_bytes = 0;
  InOrderQueue<PairWork> queue;  // pending operations

  std::byte* buffer_of(int64_t bytes) {
    if (bytes > buffer_bytes) {
      buffer = std::make_unique_for_overwrite<std::byte[]>(static_cast<std::size_t>(bytes));
      buffer_bytes = bytes;
    }
    return buffer.get();
  }
};
}  // namespace detail

namespace {

constexpr int kTagHalf = 1;     // a piece's half, to be reduced by the receiver
constexpr int kTagResult = 2;   // a reduced half, back to the other rank
constexpr int kTagScatter = 3;  // reduce-scatter: the receiver's chunk

class PairWork final : public Work {
 public:
  // All-reduce of `tensor` in place (out undefined), or reduce-scatter of `in` into `out`.
  PairWork(std::shared_ptr<detail::MpiPairState> state, const char* operation, ReduceOp op, Tensor tensor,
           Tensor out)
      : state_(std::move(state)),
        operation_(operation),
        op_(op),
        tensor_(std::move(tensor)),
        out_(std::move(out)) {
    const DType dt = tensor_.dtype();
    es_ = static_cast<int64_t>(dtype_size(dt));
    if (out_.defined()) {
      stages_ = 1;
    } else {
      piece_ = std::max<int64_t>(2, state_->piece_bytes / es_);
      pieces_ = (tensor_.numel() + piece_ - 1) / piece_;
      stages_ = pieces_ + 1;
    }
    state_->queue.push(this);
  }

  ~PairWork() override {
    if (!done_ && std::uncaught_exceptions() == 0 && mpi_usable()) {
      wait();
      return;
    }
    if (!done_) {
      // Unwinding towards MPI_Abort: leave the buffers to MPI (as MpiWork does).
      new Tensor(std::move(tensor_));
      new Tensor(std::move(out_));
      new std::shared_ptr<MpiWork>(std::move(stage_));
    }
    state_->queue.remove(this);
  }

  // Earlier operations first: the peer works through the same queue in the same order.
  void wait() override {
    state_->queue.run_until([this] { return done_; }, /*block=*/true);
  }
  bool is_completed() override {
    return state_->queue.run_until([this] { return done_; }, /*block=*/false);
  }

 private:
  friend class detail::InOrderQueue<PairWork>;

  // Runs the stages that can run; true once this operation is complete (it then leaves the queue).
  bool advance(bool block) {
    while (!done_) {
      if (stage_ == nullptr) post(next_stage_);
      if (block)
        stage_->wait();
      else if (!stage_->is_completed())
        return false;
      stage_ = nullptr;
      reduce(next_stage_);
      if (++next_stage_ == stages_) finish();
    }
    return true;
  }

  // An all-reduce piece's range and the half each rank reduces (rank 0 the first).
  struct Piece {
    int64_t offset, count, mine_offset, mine_count, theirs_offset, theirs_count;
  };
  Piece piece(int64_t k) const {
    Piece p{};
    p.offset = k * piece_;
    p.count = std::min(piece_, tensor_.numel() - p.offset);
    const int64_t first = p.count / 2;
    const bool zero = state_->rank == 0;
    p.mine_offset = p.offset + (zero ? 0 : first);
    p.mine_count = zero ? first : p.count - first;
    p.theirs_offset = p.offset + (zero ? first : 0);
    p.theirs_count = p.count - p.mine_count;
    return p;
  }

  char* at(const Tensor& t, int64_t element) const {
    return static_cast<char*>(t.data_ptr()) + element * es_;
  }

  void post(int64_t s) {
    const int peer = 1 - state_->rank;
    const MPI_Datatype type = mpi_type(tensor_.dtype());
    stage_ = std::make_shared<MpiWork>(operation_, state_->label);
    if (out_.defined()) {
      const Chunk mine = chunk_of(tensor_.numel(), 2, state_->rank);
      const Chunk theirs = chunk_of(tensor_.numel(), 2, peer);
      PARALLEL_MPI_CHECK(MPI_Irecv(out_.data_ptr(), static_cast<int>(mine.count), type, peer, kTagScatter,
                                   state_->comm, stage_->add_request()));
      PARALLEL_MPI_CHECK(MPI_Isend(at(tensor_, theirs.offset), static_cast<int>(theirs.count), type, peer,
                                   kTagScatter, state_->comm, stage_->add_request()));
      return;
    }
    // Stage s returns piece s-1's reduced halves and exchanges piece s's halves to reduce.
    if (s > 0) {
      const Piece p = piece(s - 1);
      PARALLEL_MPI_CHECK(MPI_Irecv(at(tensor_, p.theirs_offset), static_cast<int>(p.theirs_count), type, peer,
                                   kTagResult, state_->comm, stage_->add_request()));
      PARALLEL_MPI_CHECK(MPI_Isend(at(tensor_, p.mine_offset), static_cast<int>(p.mine_count), type, peer,
                                   kTagResult, state_->comm, stage_->add_request()));
    }
    if (s < pieces_) {
      const Piece p = piece(s);
      std::byte* buffer = state_->buffer_of((piece_ / 2 + 1) * es_);
      PARALLEL_MPI_CHECK(MPI_Irecv(buffer, static_cast<int>(p.mine_count), type, peer, kTagHalf, state_->comm,
                                   stage_->add_request()));
      PARALLEL_MPI_CHECK(MPI_Isend(at(tensor_, p.theirs_offset), static_cast<int>(p.theirs_count), type, peer,
                                   kTagHalf, state_->comm, stage_->add_request()));
    }
  }

  // a = rank 0's contribution, b = rank 1's, as MPI's (in, inout) on the binomial tree's root.
  void reduce(int64_t s) {
    const DType dt = tensor_.dtype();
    const bool zero = state_->rank == 0;
    if (out_.defined()) {
      const Chunk mine = chunk_of(tensor_.numel(), 2, state_->rank);
      const void* local = at(tensor_, mine.offset);
      detail::pair_reduce(dt, op_, zero ? local : out_.data_ptr(), zero ? out_.data_ptr() : local,
                          out_.data_ptr(), mine.count);
      return;
    }
    if (s >= pieces_) return;
    const Piece p = piece(s);
    const void* peer = state_->buffer.get();
    void* local = at(tensor_, p.mine_offset);
    detail::pair_reduce(dt, op_, zero ? local : peer, zero ? peer : local, local, p.mine_count);
  }

  void finish() {
    done_ = true;
    tensor_ = Tensor();
    out_ = Tensor();
    state_->queue.remove(this);
  }

  std::shared_ptr<detail::MpiPairState> state_;
  const char* operation_;
  ReduceOp op_;
  Tensor tensor_;  // all-reduce: the tensor; reduce-scatter: `in`
  Tensor out_;     // reduce-scatter only
  int64_t es_ = 0;
  int64_t piece_ = 0, pieces_ = 0;  // all-reduce only
  int64_t stages_ = 0, next_stage_ = 0;
  std::shared_ptr<MpiWork> stage_;  // the stage in flight
  bool done_ = false;
};

WorkHandle finish_pair(std::shared_ptr<PairWork> work, bool async) {
  if (async) return work;
  work->wait();
  return completed_work();
}

// Sums that go point to point (PairWork in groups of two, the ring of ring_reduce.hpp in larger
// ones): floating tensors of at least point_to_point_sum_min_bytes(). Smaller ones (losses, norms,
// flags) stay on MPI's collectives, whose small temporaries come from the heap again after the first.
bool point_to_point_sum(ReduceOp op, const Tensor& t, int64_t min_bytes) {
  const DType dt = t.dtype();
  return op == ReduceOp::Sum && (dt == DType::F32 || dt == DType::BF16 || dt == DType::F16) &&
         static_cast<int64_t>(t.nbytes()) >= min_bytes;
}

WorkHandle finish_ring(std::shared_ptr<Work> work, bool async) {
  if (async) return work;
  work->wait();
  return completed_work();
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm) {
  PARALLEL_CHECK(comm != MPI_COMM_NULL, "MpiCommunicator: MPI_COMM_NULL given");
  PARALLEL_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  PARALLEL_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  PARALLEL_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  PARALLEL_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  // Our members in world numbering, for the watchdog's messages (a local lookup, no communication).
  label_ = std::make_shared<detail::MpiGroupLabel>();
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  PARALLEL_MPI_CHECK(MPI_Comm_group(comm_, &group));
  PARALLEL_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> mine(static_cast<std::size_t>(size_));
  std::iota(mine.begin(), mine.end(), 0);
  label_->world_ranks.resize(mine.size());
  const int rc = MPI_Group_translate_ranks(group, size_, mine.data(), world, label_->world_ranks.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  PARALLEL_MPI_CHECK(rc);
  int world_size = 0;
  PARALLEL_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  if (size_ == world_size && label_->world_ranks == mine) label_->name = "world";
  Communicator::set_name(label_->name);
  if (size_ == 2) {
    pair_ = std::make_shared<detail::MpiPairState>();
    pair_->label = label_;
    pair_->rank = rank_;
    PARALLEL_MPI_CHECK(MPI_Comm_dup(comm_, &pair_->comm));
  } else if (size_ > 2) {
    ring_ = std::make_shared<detail::RingState>();
    ring_->label = label_;
    ring_->rank = rank_;
    ring_->size = size_;
    ring_->piece_bytes = piece_bytes_;
    PARALLEL_MPI_CHECK(MPI_Comm_dup(comm_, &ring_->comm));
  }
}

void MpiCommunicator::set_reduce_piece_bytes(int64_t bytes) {
  PARALLEL_CHECK(bytes >= 64, "MpiCommunicator::set_reduce_piece_bytes: {} bytes; a piece needs at least 64",
                 bytes);
  piece_bytes_ = bytes;
  if (pair_ != nullptr) pair_->piece_bytes = bytes;
  if (ring_ != nullptr) ring_->piece_bytes = bytes;
}

void MpiCommunicator::set_point_to_point_sum_min_bytes(int64_t bytes) {
  PARALLEL_CHECK(bytes >= 0, "MpiCommunicator::set_point_to_point_sum_min_bytes: {} bytes", bytes);
  p2p_min_bytes_ = bytes;
}

void MpiCommunicator::set_name(std::string name) {
  label_->name = name;
  Communicator::set_name(std::move(name));
}

std::vector<int> MpiCommunicator::world_ranks() const { return label_->world_ranks; }

MpiCommunicator::~MpiCommunicator() {
  if (!mpi_usable()) return;
  if (pair_ != nullptr && pair_->comm != MPI_COMM_NULL) MPI_Comm_free(&pair_->comm);
  if (ring_ != nullptr && ring_->comm != MPI_COMM_NULL) MPI_Comm_free(&ring_->comm);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

WorkHandle MpiCommunicator::all_reduce(Tensor& tensor, ReduceOp op, bool async) {
  check_tensor(tensor, "tensor", "all_reduce");
  const int n = mpi_count(tensor.numel(), "all_reduce");
  const MPI_Op mop = mpi_op(op, tensor.dtype());
  const MPI_Datatype type = mpi_type(tensor.dtype());
  if (pair_ != nullptr && point_to_point_sum(op, tensor, p2p_min_bytes_))
    return finish_pair(std::make_shared<PairWork>(pair_, "all_reduce", op, tensor, Tensor()), async);
  if (ring_ != nullptr && point_to_point_sum(op, tensor, p2p_min_bytes_))
    return finish_ring(detail::ring_sum(ring_, "all_reduce", tensor, Tensor()), async);
  auto work = std::make_shared<MpiWork>("all_reduce", label_);
  work->keep(tensor);
  PARALLEL_MPI_CHECK(
      MPI_Iallreduce(MPI_IN_PLACE, tensor.data_ptr(), n, type, mop, comm_, work->add_request()));
  return finish(std::move(work), async);
}

WorkHandle MpiCommunicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, bool async) {
  check_tensor(in, "in", "reduce_scatter");
  check_tensor(out, "out", "reduce_scatter");
  check_same_dtype(in, out, "reduce_scatter");
  mpi_count(in.numel(), "reduce_scatter");
  const Chunk mine = chunk_of(in.numel(), size_, rank_);
  PARALLEL_CHECK(
      out.numel() == mine.count,
      "MpiCommunicator::reduce_scatter: out has {} elements, rank {}'s chunk of {} over {} ranks has {}",
      out.numel(), rank_, in.numel(), size_, mine.count);
  const MPI_Op mop = mpi_op(op, in.dtype());
  const MPI_Datatype type = mpi_type(in.dtype());
  if (ring_ != nullptr && point_to_point_sum(op, in, p2p_min_bytes_)) {
    // The ring writes this rank's chunk last, so `out` may be that chunk of `in` itself.
    const auto* slot = static_cast<const char*>(in.data_ptr()) + mine.offset * dtype_size(in.dtype());
    Tensor src = (out.data_ptr() != slot && overlaps(in, out)) ? in.clone() : in;
    return finish_ring(detail::ring_sum(ring_, "reduce_scatter", src, out), async);
  }
  // MPI forbids aliased send and receive buffers (and MPI_IN_PLACE means a different layout here).
  Tensor src = overlaps(in, out) ? in.clone() : in;
  if (pair_ != nullptr && point_to_point_sum(op, in, p2p_min_bytes_))
    return finish_pair(std::make_shared<PairWork>(pair_, "reduce_scatter", op, src, out), async);
  auto work = std::make_shared<MpiWork>("reduce_scatter", label_);
  work->keep(src);
  work->keep(out);
  auto& counts = work->counts();
  for (int r = 0; r < size_; ++r) counts.push_back(static_cast<int>(chunk_of(in.numel(), size_, r).count));
  PARALLEL_MPI_CHECK(MPI_Ireduce_scatter(src.data_ptr(), out.data_ptr(), counts.data(), type, mop, comm_,
                                         work->add_request()));
  return finish(std::move(work), async);
}

WorkHandle MpiCommunicator::all_gather(const Tensor& in, Tensor& out, bool async) {
  check_tensor(in, "in", "all_gather");
  check_tensor(out, "out", "all_gather");
  check_same_dtype(in, out, "all_gather");
  mpi_count(out.numel(), "all_gather");
  const Chunk mine = chunk_of(out.numel(), size_, rank_);
  PARALLEL_CHECK(
      in.numel() == mine.count,
      "MpiCommunicator::all_gather: in has {} elements, rank {}'s chunk of {} over {} ranks has {}",
      in.numel(), rank_, out.numel(), size_, mine.count);
  const MPI_Datatype type = mpi_type(in.dtype());
  auto work = std::make_shared<MpiWork>("all_gather", label_);
  // `in` already sitting in its own slot of `out` (the usual sharded-buffer layout) is MPI_IN_PLACE;
  // any other overlap would be undefined in MPI, so that case sends from a copy.
  const auto* slot = static_cast<const char*>(out.data_ptr()) + mine.offset * dtype_size(out.dtype());
  const bool in_place = mine.count > 0 && in.data_ptr() == slot;
  Tensor src = (!in_place && overlaps(in, out)) ? in.clone() : in;
  work->keep(src);
  work->keep(out);
  auto& counts = work->counts();
  auto& displs = work->displs();
  for (int r = 0; r < size_; ++r) {
    const Chunk c = chunk_of(out.numel(), size_, r);
    counts.push_back(static_cast<int>(c.count));
    displs.push_back(static_cast<int>(c.offset));
  }
  PARALLEL_MPI_CHECK(MPI_Iallgatherv(in_place ? MPI_IN_PLACE : src.data_ptr(), mine.count, type,
                                     out.data_ptr(), counts.data(), displs.data(), type, comm_,
                                     work->add_request()));
  return finish(std::move(work), async);
}

WorkHandle MpiCommunicator::broadcast(Tensor& tensor, int root, bool async) {
  check_tensor(tensor, "tensor", "broadcast");
  PARALLEL_CHECK(root >= 0 && root < size_, "MpiCommunicator::broadcast: root {} outside [0, {})", root,
                 size_);
  const int n = mpi_count(tensor.numel(), "broadcast");
  const MPI_Datatype type = mpi_type(tensor.dtype());
  auto work = std::make_shared<MpiWork>("broadcast", label_);
  work->keep(tensor);
  PARALLEL_MPI_CHECK(MPI_Ibcast(tensor.data_ptr(), n, type, root, comm_, work->add_request()));
  return finish(std::move(work), async);
}

WorkHandle MpiCommunicator::all_to_all(const Tensor& in, Tensor& out, bool async) {
  check_tensor(in, "in", "all_to_all");
  check_tensor(out, "out", "all_to_all");
  check_same_dtype(in, out, "all_to_all");
  PARALLEL_CHECK(in.numel() == out.numel(), "MpiCommunicator::all_to_all: in has {} elements but out has {}",
                 in.numel(), out.numel());
  PARALLEL_CHECK(in.numel() % size_ == 0,
                 "MpiCommunicator::all_to_all: {} elements do not split into {} equal blocks", in.numel(),
                 size_);
  mpi_count(in.numel(), "all_to_all");
  const int block = static_cast<int>(in.numel() / size_);
  const MPI_Datatype type = mpi_type(in.dtype());
  auto work = std::make_shared<MpiWork>("all_to_all", label_);
  Tensor src = overlaps(in, out) ? in.clone() : in;
  work->keep(src);
  work->keep(out);
  PARALLEL_MPI_CHECK(
      MPI_Ialltoall(src.data_ptr(), block, type, out.data_ptr(), block, type, comm_, work->add_request()));
  return finish(std::move(work), async);
}

WorkHandle MpiCommunicator::all_to_allv(const Tensor& in, std::span<const int64_t> send_counts, Tensor& out,
                                        std::span<const int64_t> recv_counts, bool async) {
  check_all_to_allv(*this, in, send_counts, out, recv_counts);
  mpi_count(in.numel(), "all_to_allv");
  mpi_count(out.numel(), "all_to_allv");
  const MPI_Datatype type = mpi_type(in.dtype());
  auto work = std::make_shared<MpiWork>("all_to_allv", label_);
  Tensor src = overlaps(in, out) ? in.clone() : in;
  work->keep(src);
  work->keep(out);
  // counts = [send counts | recv counts], displs likewise: MPI reads them until completion.
  std::vector<int>& counts = work->counts();
  std::vector<int>& displs = work->displs();
  const auto p = static_cast<std::size_t>(size_);
  counts.assign(2 * p, 0);
  displs.assign(2 * p, 0);
  for (std::size_t r = 0; r < p; ++r) {
    counts[r] = static_cast<int>(send_counts[r]);
    counts[p + r] = static_cast<int>(recv_counts[r]);
    if (r > 0) {
      displs[r] = displs[r - 1] + counts[r - 1];
      displs[p + r] = displs[p + r - 1] + counts[p + r - 1];
    }
  }
  PARALLEL_MPI_CHECK(MPI_Ialltoallv(src.data_ptr(), counts.data(), displs.data(), type, out.data_ptr(),
                                    counts.data() + p, displs.data() + p, type, comm_, work->add_request()));
  return finish(std::move(work), async);
}

namespace {
void check_p2p(const Tensor& t, int peer, int tag, int size, const char* op) {
  check_tensor(t, "tensor", op);
  PARALLEL_CHECK(peer >= 0 && peer < size, "MpiCommunicator::{}: peer {} outside [0, {})", op, peer, size);
  PARALLEL_CHECK(tag >= 0, "MpiCommunicator::{}: negative tag {}", op, tag);
  mpi_count(t.numel(), op);
  mpi_type(t.dtype());
}
}  // namespace

WorkHandle MpiCommunicator::send(const Tensor& tensor, int peer, int tag) {
  const P2POp op{P2POp::Kind::Send, tensor, peer, tag};
  return batch_p2p({&op, 1});
}

WorkHandle MpiCommunicator::recv(Tensor& tensor, int peer, int tag) {
  const P2POp op{P2POp::Kind::Recv, tensor, peer, tag};
  return batch_p2p({&op, 1});
}

WorkHandle MpiCommunicator::batch_p2p(std::span<const P2POp> ops) {
  for (const P2POp& op : ops)
    check_p2p(op.tensor, op.peer, op.tag, size_, op.kind == P2POp::Kind::Send ? "send" : "recv");
  if (ops.empty()) return completed_work();
  auto work = std::make_shared<MpiWork>("batch_p2p", label_);
  for (const P2POp& op : ops) {
    const int n = static_cast<int>(op.tensor.numel());
    const MPI_Datatype type = mpi_type(op.tensor.dtype());
    work->keep(op.tensor);
    work->note_message(op.kind == P2POp::Kind::Send, op.peer, op.tag);
    if (op.kind == P2POp::Kind::Send) {
      PARALLEL_MPI_CHECK(
          MPI_Isend(op.tensor.data_ptr(), n, type, op.peer, op.tag, comm_, work->add_request()));
    } else {
      PARALLEL_MPI_CHECK(
          MPI_Irecv(op.tensor.data_ptr(), n, type, op.peer, op.tag, comm_, work->add_request()));
    }
  }
  return work;
}

void MpiCommunicator::barrier() {
  auto work = std::make_shared<MpiWork>("barrier", label_);
  PARALLEL_MPI_CHECK(MPI_Ibarrier(comm_, work->add_request()));
  work->wait();
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  MPI_Comm sub = MPI_COMM_NULL;
  PARALLEL_MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub));
  if (sub == MPI_COMM_NULL) return nullptr;
  // The constructor duplicates, so the intermediate communicator is released right away.
  std::unique_ptr<Communicator> result;
  try {
    result = std::make_unique<MpiCommunicator>(sub);
  } catch (...) {
    MPI_Comm_free(&sub);
    throw;
  }
  PARALLEL_MPI_CHECK(MPI_Comm_free(&sub));
  return result;
}

void MpiCommunicator::abort(int code) {
  MPI_Abort(comm_, code);
  std::abort();  // MPI_Abort does not return in practice; this keeps [[noreturn]] honest
}

}  // namespace parallel
