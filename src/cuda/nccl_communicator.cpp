// The NCCL backend of Communicator (see nccl_communicator.hpp for the stream contract).
//
// Every operation follows ProcessGroupNCCL's pattern: an event recorded on the caller's compute
// stream makes the communicator's own stream wait, the NCCL call is enqueued there, and a "done"
// event recorded after it is what Work::wait() makes the compute stream wait on. The host never
// blocks, so compute queued after the call overlaps the transfer until the caller asks for its
// result.
//
// Watchdog (communicator.hpp): the only host wait inside this communicator is barrier(), which polls
// its event with cudaEventQuery against comm_timeout() and on expiry aborts the NCCL communicators
// (ncclCommAbort) and then the job. Work::wait() never blocks the host, so a stalled peer shows up
// where the host next waits: in a host-fallback (MPI) operation, which has the MPI deadline, or in a
// device synchronisation outside the communicator (reading a tensor back), which has none.
#include "parallel/nccl_communicator.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <utility>
#include <vector>

#include "comm/watchdog.hpp"
#include "core/cuda_backend.hpp"
#include "cuda/cuda_check.hpp"
#include "nccl_check.hpp"
#include "parallel/device.hpp"
#include "parallel/log.hpp"

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

// One "done" event per stream the operation ran on (a batch over several p2p links runs on
// several); they are never joined on a communication stream, which would couple the links again.
class NcclWork final : public Work {
 public:
  NcclWork(cudaStream_t compute, std::vector<cudaEvent_t> done, std::vector<Tensor> keep)
      : compute_(compute), done_(std::move(done)), keep_(std::move(keep)) {}

  ~NcclWork() override {
    // A handle dropped without wait() must still order the caller's stream after the operation:
    // the storages released below return to that stream's cache and may be reused by its very
    // next allocation while NCCL is still reading or writing them.
    for (cudaEvent_t e : done_) {
      if (!waited_) (void)cudaStreamWaitEvent(compute_, e, 0);
      (void)cudaEventDestroy(e);  // released by the runtime once the event has completed
    }
  }

  void wait() override {
    if (waited_) return;
    for (cudaEvent_t e : done_) PARALLEL_CUDA_CHECK(cudaStreamWaitEvent(compute_, e, 0));
    waited_ = true;
  }

  bool is_completed() override {
    for (cudaEvent_t e : done_) {
      const cudaError_t err = cudaEventQuery(e);
      if (err == cudaErrorNotReady) return false;
      PARALLEL_CUDA_CHECK(err);
    }
    return true;
  }

 private:
  cudaStream_t compute_;
  std::vector<cudaEvent_t> done_;
  std::vector<Tensor> keep_;  // keeps the storages alive until the operation is ordered
  bool waited_ = false;
};

// A high-priority non-blocking stream: when compute fills the GPU, communication kernels are
// scheduled first as SMs free up, which is what lets gradient reduction hide behind the backward.
cudaStream_t make_comm_stream() {
  int least = 0, greatest = 0;
  PARALLEL_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t s = nullptr;
  PARALLEL_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
  return s;
}

// One direction between two neighbours: a two-rank communicator (sender rank 0, receiver rank 1)
// and the stream its messages run on.
struct Link {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int peer_in_link = 0;  // the other end's rank in `comm`
};

bool on_host(const Tensor& t) { return t.device().is_cpu(); }

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm`, an initialised communicator on GPU `device`. `host` (optional, not
  // owned) carries CPU tensors over the same ranks.
  NcclCommunicator(ncclComm_t comm, int device, cudaStream_t compute, Communicator* host)
      : comm_(comm), device_(device), compute_(compute), host_(host) {
    cuda::DeviceGuard guard(device_);
    PARALLEL_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    PARALLEL_NCCL_CHECK(ncclCommCount(comm_, &size_));
    PARALLEL_CHECK(host_ == nullptr || (host_->size() == size_ && host_->rank() == rank_),
                   "nccl: the host communicator (rank {} of {}) does not match NCCL's (rank {} of {})",
                   host_->rank(), host_->size(), rank_, size_);
    stream_ = make_comm_stream();
    PARALLEL_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    PARALLEL_CUDA_CHECK(cudaEventCreateWithFlags(&barrier_done_, cudaEventDisableTiming));
    PARALLEL_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)));
    PARALLEL_CUDA_CHECK(cudaMemset(barrier_buf_, 0, sizeof(float)));
  }

  ~NcclCommunicator() override {
    cuda::DeviceGuard guard(device_);
    for (auto& [key, link] : links_) {
      (void)cudaStreamSynchronize(link.stream);
      (void)ncclCommDestroy(link.comm);
      (void)cudaStreamDestroy(link.stream);
    }
    if (stream_) (void)cudaStreamSynchronize(stream_);
    if (comm_) (void)ncclCommDestroy(comm_);
    if (ready_) (void)cudaEventDestroy(ready_);
    if (barrier_done_) (void)cudaEventDestroy(barrier_done_);
    if (stream_) (void)cudaStreamDestroy(stream_);
    if (barrier_buf_) (void)cudaFree(barrier_buf_);
  }

  // Collective: builds the per-direction links to the ring neighbours (see NcclOptions). Every rank
  // makes the same sequence of ncclCommSplit calls on the main communicator, members or not.
  void create_p2p_links() {
    if (size_ < 2) return;
    cuda::DeviceGuard guard(device_);
    // Unordered neighbour pairs {r, r + 1 mod size}, each once (size 2 has a single pair).
    const int pairs = size_ == 2 ? 1 : size_;
    for (int a = 0; a < pairs; ++a) {
      const int b = (a + 1) % size_;
      for (const auto& [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
        const bool member = rank_ == from || rank_ == to;
        ncclComm_t child = nullptr;
        PARALLEL_NCCL_CHECK(
            ncclCommSplit(comm_, member ? 0 : NCCL_SPLIT_NOCOLOR, rank_ == from ? 0 : 1, &child, nullptr));
        if (!member) continue;
        PARALLEL_CHECK(child != nullptr, "nccl: the split for link {} -> {} returned no communicator", from,
                       to);
        Link link;
        link.comm = child;
        link.stream = make_comm_stream();
        link.peer_in_link = rank_ == from ? 1 : 0;
        links_[{from, to}] = link;
      }
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "nccl"; }

  void set_name(std::string name) override {
    if (owned_host_ != nullptr) owned_host_->set_name(name);
    Communicator::set_name(std::move(name));
  }
  // The host communicator's (same ranks, same order); unknown without one.
  std::vector<int> world_ranks() const override {
    return host_ != nullptr ? host_->world_ranks() : std::vector<int>{};
  }

  WorkHandle all_reduce(Tensor& tensor, ReduceOp op, bool async) override {
    if (on_host(tensor)) return host("all_reduce").all_reduce(tensor, op, async);
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
    if (on_host(in) && on_host(out)) return host("reduce_scatter").reduce_scatter(in, out, op, async);
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
    if (on_host(in) && on_host(out)) return host("all_gather").all_gather(in, out, async);
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
    if (on_host(tensor)) return host("broadcast").broadcast(tensor, root, async);
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
    if (on_host(in) && on_host(out)) return host("all_to_all").all_to_all(in, out, async);
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
    const bool any_host =
        std::any_of(ops.begin(), ops.end(), [](const P2POp& op) { return on_host(op.tensor); });
    if (any_host) {
      PARALLEL_CHECK(std::all_of(ops.begin(), ops.end(), [](const P2POp& op) { return on_host(op.tensor); }),
                     "nccl batch_p2p: mixes CPU and CUDA tensors; post them as two batches");
      return host("batch_p2p").batch_p2p(ops);
    }
    std::vector<Tensor> keep;
    keep.reserve(ops.size());
    for (const P2POp& op : ops) {
      check(op.tensor, op.kind == P2POp::Kind::Send ? "send" : "recv");
      check_peer(op.peer, "p2p peer");
      if (op.tensor.numel() > 0) keep.push_back(op.tensor);
    }
    if (keep.empty()) return completed_work();
    cuda::DeviceGuard guard(device_);
    // Each message runs on its link's stream when there is one, else on the main stream.
    struct Route {
      ncclComm_t comm;
      int peer;
      cudaStream_t stream;
    };
    std::vector<Route> routes;
    std::vector<cudaStream_t> used;
    routes.reserve(ops.size());
    for (const P2POp& op : ops) {
      const bool send = op.kind == P2POp::Kind::Send;
      auto it = links_.find(send ? std::pair{rank_, op.peer} : std::pair{op.peer, rank_});
      const Route r = it == links_.end() ? Route{comm_, op.peer, stream_}
                                         : Route{it->second.comm, it->second.peer_in_link, it->second.stream};
      if (std::find(used.begin(), used.end(), r.stream) == used.end()) used.push_back(r.stream);
      routes.push_back(r);
    }
    begin(used);
    PARALLEL_NCCL_CHECK(ncclGroupStart());
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const P2POp& op = ops[i];
      const int64_t n = op.tensor.numel();
      if (n == 0) continue;
      const Route& r = routes[i];
      const ncclDataType_t type = nccl_type(op.tensor.dtype());
      if (op.kind == P2POp::Kind::Send)
        PARALLEL_NCCL_CHECK(ncclSend(op.tensor.data_ptr(), n, type, r.peer, r.comm, r.stream));
      else
        PARALLEL_NCCL_CHECK(ncclRecv(op.tensor.data_ptr(), n, type, r.peer, r.comm, r.stream));
    }
    PARALLEL_NCCL_CHECK(ncclGroupEnd());
    return finish(std::move(keep), true, used);
  }

  // NCCL has no barrier: a one-element all-reduce that the host waits for is one. The wait polls
  // an event recorded after it, under the watchdog's deadline.
  void barrier() override {
    cuda::DeviceGuard guard(device_);
    PARALLEL_NCCL_CHECK(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, stream_));
    PARALLEL_CUDA_CHECK(cudaEventRecord(barrier_done_, stream_));
    cudaError_t err = cudaEventQuery(barrier_done_);
    if (err == cudaErrorNotReady) {
      detail::WaitPacer pacer;
      while ((err = cudaEventQuery(barrier_done_)) == cudaErrorNotReady)
        if (!pacer.pause())
          detail::watchdog_expired("barrier", describe_group(*this), pacer.elapsed_s(),
                                   [this] { abort_nccl(); });
    }
    PARALLEL_CUDA_CHECK(err);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    cuda::DeviceGuard guard(device_);
    ncclComm_t child = nullptr;
    PARALLEL_NCCL_CHECK(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, nullptr));
    // The host side splits too (collective on every rank, members or not), so the child keeps
    // carrying CPU tensors.
    std::unique_ptr<Communicator> host_child = host_ != nullptr ? host_->split(color, key) : nullptr;
    if (color < 0 || child == nullptr) return nullptr;
    auto out = std::make_unique<NcclCommunicator>(child, device_, compute_, host_child.get());
    out->owned_host_ = std::move(host_child);
    return out;
  }

  [[noreturn]] void abort(int code) override {
    // Abort NCCL first: peers blocked in a collective with us are released instead of hanging
    // until a timeout, then MPI ends every process of the job.
    abort_nccl();
    MPI_Abort(MPI_COMM_WORLD, code);
    std::abort();
  }

 private:
  Communicator& host(const char* op) {
    PARALLEL_CHECK(
        host_ != nullptr,
        "nccl {}: CPU tensors need the host fallback (NcclOptions::host_fallback); move the tensor to "
        "cuda:{}",
        op, device_);
    return *host_;
  }

  void abort_nccl() {
    for (auto& [key, link] : links_) (void)ncclCommAbort(link.comm);
    links_.clear();
    if (comm_) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }

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
  void begin() { begin({stream_}); }
  void begin(const std::vector<cudaStream_t>& streams) {
    PARALLEL_CUDA_CHECK(cudaEventRecord(ready_, compute_));
    for (cudaStream_t s : streams) PARALLEL_CUDA_CHECK(cudaStreamWaitEvent(s, ready_, 0));
  }

  WorkHandle finish(std::vector<Tensor> keep, bool async) {
    return finish(std::move(keep), async, {stream_});
  }
  WorkHandle finish(std::vector<Tensor> keep, bool async, const std::vector<cudaStream_t>& streams) {
    // The tensors were used on our streams, not (only) on the ones they were allocated on: tell the
    // caching allocator, so that a storage freed before our work is done is not handed out again
    // on its own stream meanwhile (whatever the caller does with the Work handle).
    for (const Tensor& t : keep)
      if (t.storage() != nullptr)
        for (cudaStream_t s : streams)
          cuda_backend::record_stream(t.storage()->data(), t.device(), Stream{s});
    std::vector<cudaEvent_t> done;
    auto release = [&done] {
      for (cudaEvent_t e : done) (void)cudaEventDestroy(e);
    };
    for (cudaStream_t s : streams) {
      cudaEvent_t e = nullptr;
      cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
      if (err == cudaSuccess) {
        done.push_back(e);
        err = cudaEventRecord(e, s);
      }
      if (err != cudaSuccess) {
        release();
        PARALLEL_CUDA_CHECK(err);
      }
    }
    auto work = std::make_shared<NcclWork>(compute_, std::move(done), std::move(keep));
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
  cudaEvent_t barrier_done_ = nullptr;
  float* barrier_buf_ = nullptr;
  Communicator* host_ = nullptr;               // carries CPU tensors; see NcclOptions
  std::unique_ptr<Communicator> owned_host_;   // host_ when this communicator made it (split)
  std::map<std::pair<int, int>, Link> links_;  // (from, to) -> link, for the directions touching us
};

// True when the driver loads modules lazily (CUDA_MODULE_LOADING=LAZY, the default since CUDA
// 12.2). Asked through the runtime's driver entry point so that the library needs no libcuda at
// link time; false when the driver cannot say.
bool lazy_module_loading() {
  using GetLoadingMode = CUresult (*)(CUmoduleLoadingMode*);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuModuleGetLoadingMode", &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess || fn == nullptr)
    return false;
  CUmoduleLoadingMode mode{};
  return reinterpret_cast<GetLoadingMode>(fn)(&mode) == CUDA_SUCCESS && mode == CU_MODULE_LAZY_LOADING;
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MpiCommunicator& bootstrap, Device device,
                                                     NcclOptions options) {
  PARALLEL_CHECK(device.is_cuda(), "make_nccl_communicator needs a CUDA device, got {}", device.str());
  const int devices = cuda_device_count();
  PARALLEL_CHECK(device.index >= 0 && device.index < devices,
                 "make_nccl_communicator: {} does not exist ({} visible)", device.str(), devices);
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) PARALLEL_NCCL_CHECK(ncclGetUniqueId(&id));
  PARALLEL_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, bootstrap.handle()));
  // NCCL binds the communicator to the current device; a rank drives one GPU, so it stays current.
  PARALLEL_CUDA_CHECK(cudaSetDevice(device.index));
  // Runtime asks for eager loading in a job of several ranks; CUDA started before it, or a user's
  // CUDA_MODULE_LOADING=LAZY, leaves a first kernel launch able to wait for a spinning NCCL kernel.
  static const bool warned = [] {
    if (lazy_module_loading())
      logger().warn(
          "CUDA loads kernels lazily here: a kernel's first launch waits for the GPU's queue, which can "
          "hold an NCCL kernel waiting on a peer (a possible deadlock); set CUDA_MODULE_LOADING=EAGER "
          "before CUDA starts");
    return true;
  }();
  (void)warned;
  ncclComm_t comm = nullptr;
  PARALLEL_NCCL_CHECK(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()));
  std::unique_ptr<NcclCommunicator> out;
  try {
    out = std::make_unique<NcclCommunicator>(comm, device.index,
                                             static_cast<cudaStream_t>(options.compute_stream.handle),
                                             options.host_fallback ? &bootstrap : nullptr);
  } catch (...) {
    (void)ncclCommDestroy(comm);
    throw;
  }
  if (options.p2p_links) out->create_p2p_links();
  return out;
}

}  // namespace parallel
