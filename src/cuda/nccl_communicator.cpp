// The NCCL backend of Communicator (see nccl_communicator.hpp for the stream contract).
//
// Every operation follows ProcessGroupNCCL's pattern: an event recorded on the caller's compute
// stream makes the communicator's own stream wait, the NCCL call is enqueued there, and a "done"
// event recorded after it is what Work::wait() makes the compute stream wait on. The host never
// blocks, so compute queued after the call overlaps the transfer until the caller asks for its
// result.
#include "parallel/nccl_communicator.hpp"

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdlib>
#include <vector>

#include "cuda_check.hpp"
#include "parallel/device.hpp"

namespace parallel {
namespace {

static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0), "ncclCommSplit needs NCCL 2.18 or newer");

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F16:
      return ncclFloat16;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::U8:
      return ncclUint8;
    default:
      PARALLEL_FAIL("nccl: dtype {} is not supported (fp32, bf16, fp16, int32, int64, uint8 are)",
                    dtype_name(t));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  PARALLEL_FAIL("nccl: unknown reduce op {}", static_cast<int>(op));
}

// Byte address of element `offset` of a contiguous tensor.
char* at(const Tensor& t, int64_t offset) {
  return static_cast<char*>(t.data_ptr()) + offset * static_cast<int64_t>(dtype_size(t.dtype()));
}

class NcclWork final : public Work {
 public:
  NcclWork(cudaStream_t compute, cudaEvent_t done, std::vector<Tensor> keep)
      : compute_(compute), done_(done), keep_(std::move(keep)) {}

  ~NcclWork() override {
    // A handle dropped without wait() must still order the caller's stream after the operation:
    // the storages released below return to that stream's cache and may be reused by its very
    // next allocation while NCCL is still reading or writing them.
    if (!waited_) (void)cudaStreamWaitEvent(compute_, done_, 0);
    (void)cudaEventDestroy(done_);  // released by the runtime once the event has completed
  }

  void wait() override {
    if (waited_) return;
    PARALLEL_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
    waited_ = true;
  }

  bool is_completed() override {
    const cudaError_t err = cudaEventQuery(done_);
    if (err == cudaErrorNotReady) return false;
    PARALLEL_CUDA_CHECK(err);
    return true;
  }

 private:
  cudaStream_t compute_;
  cudaEvent_t done_;
  std::vector<Tensor> keep_;  // keeps the storages alive until the operation is ordered
  bool waited_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm`, an initialised communicator on GPU `device`.
  NcclCommunicator(ncclComm_t comm, int device, cudaStream_t compute)
      : comm_(comm), device_(device), compute_(compute) {
    cuda::DeviceGuard guard(device_);
    PARALLEL_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    PARALLEL_NCCL_CHECK(ncclCommCount(comm_, &size_));
    // Highest priority: when compute fills the GPU, the communication kernels are scheduled first
    // as SMs free up, which is what lets gradient reduction hide behind the backward pass.
    int least = 0, greatest = 0;
    PARALLEL_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    PARALLEL_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    PARALLEL_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    PARALLEL_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)));
    PARALLEL_CUDA_CHECK(cudaMemset(barrier_buf_, 0, sizeof(float)));
  }

  ~NcclCommunicator() override {
    cuda::DeviceGuard guard(device_);
    if (stream_) (void)cudaStreamSynchronize(stream_);
    if (comm_) (void)ncclCommDestroy(comm_);
    if (ready_) (void)cudaEventDestroy(ready_);
    if (stream_) (void)cudaStreamDestroy(stream_);
    if (barrier_buf_) (void)cudaFree(barrier_buf_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "nccl"; }

  WorkHandle all_reduce(Tensor& tensor, ReduceOp op, bool async) override {
    check(tensor, "all_reduce");
    const int64_t n = tensor.numel();
    if (n == 0) return completed_work();
    cuda::DeviceGuard guard(device_);
    begin();
    PARALLEL_NCCL_CHECK(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), n, nccl_type(tensor.dtype()),
                                      nccl_op(op), comm_, stream_));
    return finish({tensor}, async);
  }

  WorkHandle reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, bool async) override {
    check(in, "reduce_scatter");
    check(out, "reduce_scatter");
    PARALLEL_CHECK(in.dtype() == out.dtype(), "nccl reduce_scatter: in is {}, out is {}",
                   dtype_name(in.dtype()), dtype_name(out.dtype()));
    const int64_t n = in.numel();
    const Chunk mine = chunk_of(n, size_, rank_);
    PARALLEL_CHECK(out.numel() == mine.count,
                   "nccl reduce_scatter: rank {} of {} owns {} of {} elements, but out has {}", rank_, size_,
                   mine.count, n, out.numel());
    if (n == 0) return completed_work();
    cuda::DeviceGuard guard(device_);
    begin();
    const ncclDataType_t type = nccl_type(in.dtype());
    if (n % size_ == 0) {
      PARALLEL_NCCL_CHECK(
          ncclReduceScatter(in.data_ptr(), out.data_ptr(), n / size_, type, nccl_op(op), comm_, stream_));
    } else {
      // Uneven chunks: one reduce per owner, grouped so NCCL runs them as a single launch.
      PARALLEL_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < size_; ++r) {
        const Chunk c = chunk_of(n, size_, r);
        if (c.count == 0) continue;
        PARALLEL_NCCL_CHECK(
            ncclReduce(at(in, c.offset), out.data_ptr(), c.count, type, nccl_op(op), r, comm_, stream_));
      }
      PARALLEL_NCCL_CHECK(ncclGroupEnd());
    }
    return finish({in, out}, async);
  }

  WorkHandle all_gather(const Tensor& in, Tensor& out, bool async) override {
    check(in, "all_gather");
    check(out, "all_gather");
    PARALLEL_CHECK(in.dtype() == out.dtype(), "nccl all_gather: in is {}, out is {}", dtype_name(in.dtype()),
                   dtype_name(out.dtype()));
    const int64_t n = out.numel();
    const Chunk mine = chunk_of(n, size_, rank_);
    PARALLEL_CHECK(in.numel() == mine.count,
                   "nccl all_gather: rank {} of {} owns {} of {} elements, but in has {}", rank_, size_,
                   mine.count, n, in.numel());
    if (n == 0) return completed_work();
    cuda::DeviceGuard guard(device_);
    begin();
    const ncclDataType_t type = nccl_type(out.dtype());
    if (n % size_ == 0) {
      PARALLEL_NCCL_CHECK(ncclAllGather(in.data_ptr(), out.data_ptr(), n / size_, type, comm_, stream_));
    } else {
      // Uneven chunks: every owner broadcasts its chunk into its place in `out`.
      PARALLEL_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < size_; ++r) {
        const Chunk c = chunk_of(n, size_, r);
        if (c.count == 0) continue;
        const void* send = r == rank_ ? in.data_ptr() : at(out, c.offset);  // read on the root only
        PARALLEL_NCCL_CHECK(ncclBroadcast(send, at(out, c.offset), c.count, type, r, comm_, stream_));
      }
      PARALLEL_NCCL_CHECK(ncclGroupEnd());
    }
    return finish({in, out}, async);
  }

  WorkHandle broadcast(Tensor& tensor, int root, bool async) override {
    check(tensor, "broadcast");
    check_peer(root, "broadcast root");
    const int64_t n = tensor.numel();
    if (n == 0) return completed_work();
    cuda::DeviceGuard guard(device_);
    begin();
    PARALLEL_NCCL_CHECK(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), n, nccl_type(tensor.dtype()),
                                      root, comm_, stream_));
    return finish({tensor}, async);
  }

  WorkHandle all_to_all(const Tensor& in, Tensor& out, bool async) override {
    check(in, "all_to_all");
    check(out, "all_to_all");
    PARALLEL_CHECK(in.dtype() == out.dtype(), "nccl all_to_all: in is {}, out is {}", dtype_name(in.dtype()),
                   dtype_name(out.dtype()));
    const int64_t n = in.numel();
    PARALLEL_CHECK(out.numel() == n && n % size_ == 0,
                   "nccl all_to_all: in and out need the same numel, a multiple of {} ranks (in {}, out {})",
                   size_, n, out.numel());
    const char* ib = at(in, 0);
    const char* ob = at(out, 0);
    const auto bytes = static_cast<int64_t>(in.nbytes());
    PARALLEL_CHECK(n == 0 || ib + bytes <= ob || ob + bytes <= ib,
                   "nccl all_to_all: in and out overlap; it cannot run in place");
    if (n == 0) return completed_work();
    cuda::DeviceGuard guard(device_);
    begin();
    const int64_t k = n / size_;
    const ncclDataType_t type = nccl_type(in.dtype());
    PARALLEL_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size_; ++r) {
      PARALLEL_NCCL_CHECK(ncclSend(at(in, r * k), k, type, r, comm_, stream_));
      PARALLEL_NCCL_CHECK(ncclRecv(at(out, r * k), k, type, r, comm_, stream_));
    }
    PARALLEL_NCCL_CHECK(ncclGroupEnd());
    return finish({in, out}, async);
  }

  // NCCL has no tags: messages between two ranks match in the order they are posted.
  WorkHandle send(const Tensor& tensor, int peer, int tag) override {
    P2POp op{P2POp::Kind::Send, tensor, peer, tag};
    return batch_p2p(std::span<const P2POp>(&op, 1));
  }

  WorkHandle recv(Tensor& tensor, int peer, int tag) override {
    P2POp op{P2POp::Kind::Recv, tensor, peer, tag};
    return batch_p2p(std::span<const P2POp>(&op, 1));
  }

  WorkHandle batch_p2p(std::span<const P2POp> ops) override {
    std::vector<Tensor> keep;
    keep.reserve(ops.size());
    for (const P2POp& op : ops) {
      check(op.tensor, op.kind == P2POp::Kind::Send ? "send" : "recv");
      check_peer(op.peer, "p2p peer");
      if (op.tensor.numel() > 0) keep.push_back(op.tensor);
    }
    if (keep.empty()) return completed_work();
    cuda::DeviceGuard guard(device_);
    begin();
    PARALLEL_NCCL_CHECK(ncclGroupStart());
    for (const P2POp& op : ops) {
      const int64_t n = op.tensor.numel();
      if (n == 0) continue;
      const ncclDataType_t type = nccl_type(op.tensor.dtype());
      if (op.kind == P2POp::Kind::Send)
        PARALLEL_NCCL_CHECK(ncclSend(op.tensor.data_ptr(), n, type, op.peer, comm_, stream_));
      else
        PARALLEL_NCCL_CHECK(ncclRecv(op.tensor.data_ptr(), n, type, op.peer, comm_, stream_));
    }
    PARALLEL_NCCL_CHECK(ncclGroupEnd());
    return finish(std::move(keep), true);
  }

  // NCCL has no barrier: a one-element all-reduce that the host waits for is one.
  void barrier() override {
    cuda::DeviceGuard guard(device_);
    PARALLEL_NCCL_CHECK(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, stream_));
    PARALLEL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    cuda::DeviceGuard guard(device_);
    ncclComm_t child = nullptr;
    PARALLEL_NCCL_CHECK(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, nullptr));
    if (color < 0 || child == nullptr) return nullptr;
    return std::make_unique<NcclCommunicator>(child, device_, compute_);
  }

  [[noreturn]] void abort(int code) override {
    // Abort NCCL first: peers blocked in a collective with us are released instead of hanging
    // until a timeout, then MPI ends every process of the job.
    if (comm_) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    MPI_Abort(MPI_COMM_WORLD, code);
    std::abort();
  }

 private:
  void check(const Tensor& t, const char* op) const {
    PARALLEL_CHECK(t.device().is_cuda() && t.device().index == device_,
                   "nccl {}: tensor {} must be on cuda:{}, the communicator's device", op, t.str(), device_);
    PARALLEL_CHECK(t.numel() == 0 || t.storage() != nullptr, "nccl {}: tensor {} is undefined", op, t.str());
    PARALLEL_CHECK(t.is_contiguous(), "nccl {}: tensor {} must be contiguous (call contiguous() first)", op,
                   t.str());
    (void)nccl_type(t.dtype());
  }

  void check_peer(int peer, const char* what) const {
    PARALLEL_CHECK(peer >= 0 && peer < size_, "nccl {} {} is not a rank of this communicator (size {})", what,
                   peer, size_);
  }

  // Orders the communication stream after everything the caller has queued so far. One event is
  // enough: cudaStreamWaitEvent captures the event's state at the time of the call.
  void begin() {
    PARALLEL_CUDA_CHECK(cudaEventRecord(ready_, compute_));
    PARALLEL_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  }

  WorkHandle finish(std::vector<Tensor> keep, bool async) {
    cudaEvent_t done = nullptr;
    PARALLEL_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    const cudaError_t err = cudaEventRecord(done, stream_);
    if (err != cudaSuccess) {
      (void)cudaEventDestroy(done);
      PARALLEL_CUDA_CHECK(err);
    }
    auto work = std::make_shared<NcclWork>(compute_, done, std::move(keep));
    if (!async) work->wait();
    return work;
  }

  ncclComm_t comm_ = nullptr;
  int device_ = 0;
  int rank_ = 0;
  int size_ = 1;
  cudaStream_t compute_ = nullptr;  // the caller's; not owned
  cudaStream_t stream_ = nullptr;   // ours: every NCCL operation runs here
  cudaEvent_t ready_ = nullptr;
  float* barrier_buf_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MpiCommunicator& bootstrap, Device device,
                                                     Stream compute_stream) {
  PARALLEL_CHECK(device.is_cuda(), "make_nccl_communicator needs a CUDA device, got {}", device.str());
  const int devices = cuda_device_count();
  PARALLEL_CHECK(device.index >= 0 && device.index < devices,
                 "make_nccl_communicator: {} does not exist ({} visible)", device.str(), devices);
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) PARALLEL_NCCL_CHECK(ncclGetUniqueId(&id));
  PARALLEL_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, bootstrap.handle()));
  // NCCL binds the communicator to the current device; a rank drives one GPU, so it stays current.
  PARALLEL_CUDA_CHECK(cudaSetDevice(device.index));
  ncclComm_t comm = nullptr;
  PARALLEL_NCCL_CHECK(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()));
  try {
    return std::make_unique<NcclCommunicator>(comm, device.index,
                                              static_cast<cudaStream_t>(compute_stream.handle));
  } catch (...) {
    (void)ncclCommDestroy(comm);
    throw;
  }
}

}  // namespace parallel
