// The NCCL communicator in one process (a world of one, bootstrapped over MPI_COMM_WORLD): every
// collective, send/recv to self, split, barrier, argument checks, and the stream contract of the
// async handle (the communication waits for the compute stream; wait() orders the compute stream
// after it without blocking the host). Multi-rank behaviour (uneven chunks across ranks) needs
// several GPUs and is not covered here. Every test skips on a machine without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "gpu.hpp"
#include "parallel/communicator.hpp"
#include "parallel/device.hpp"
#include "parallel/mpi_communicator.hpp"
#include "parallel/nccl_communicator.hpp"
#include "parallel/tensor.hpp"

namespace parallel {
namespace {

// gtest_main owns main(), so MPI comes up and goes down around all tests in an environment.
class MpiEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      ASSERT_EQ(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), MPI_SUCCESS);
      owns_ = true;
    }
  }
  void TearDown() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_ && !finalized) MPI_Finalize();
  }

 private:
  bool owns_ = false;
};
[[maybe_unused]] ::testing::Environment* const g_mpi_env =
    ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

// One communicator for the whole suite (NCCL initialisation costs far more than the tests), on a
// non-blocking compute stream so that nothing is ordered by the legacy default stream by accident.
class Nccl : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (cuda_device_count() == 0) return;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), cudaSuccess);
    bootstrap_ = new MpiCommunicator(MPI_COMM_WORLD);
    comm_ = make_nccl_communicator(*bootstrap_, Device::cuda(0), {.compute_stream = stream()}).release();
  }
  static void TearDownTestSuite() {
    delete comm_;  // before MPI_Finalize (the environment's tear-down runs after the suites)
    comm_ = nullptr;
    delete bootstrap_;
    bootstrap_ = nullptr;
    if (compute_) cudaStreamDestroy(compute_);
    compute_ = nullptr;
  }
  void SetUp() override { REQUIRE_GPU(); }

  static Stream stream() { return Stream{static_cast<void*>(compute_)}; }
  static Communicator& comm() { return *comm_; }

  // Device tensor with the given host values (as `dtype`), uploaded on the compute stream.
  static Tensor device_tensor(const std::vector<float>& values, DType dtype) {
    Tensor host = Tensor::from_floats(values, {static_cast<int64_t>(values.size())}, dtype);
    return host.to(Device::cuda(0), stream());
  }
  // Host copy, ordered on the compute stream (so after whatever wait() ordered there).
  static std::vector<float> host_values(const Tensor& t) {
    return t.to(Device::cpu(), stream()).to_float_vector();
  }

  static std::vector<float> iota(int64_t n, float start = 1.0f) {
    std::vector<float> v(static_cast<std::size_t>(n));
    // Small integers: exact in every dtype under test, uint8 included.
    for (int64_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i % 100);
    return v;
  }

  static inline cudaStream_t compute_ = nullptr;
  static inline MpiCommunicator* bootstrap_ = nullptr;
  static inline Communicator* comm_ = nullptr;
};

constexpr DType kAllTypes[] = {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8};

TEST_F(Nccl, Identity) {
  EXPECT_EQ(comm().rank(), 0);
  EXPECT_EQ(comm().size(), 1);
  EXPECT_EQ(comm().backend(), "nccl");
}

TEST_F(Nccl, AllReduceEveryDtypeAndOp) {
  for (DType t : kAllTypes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
      for (bool async : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::string(reduce_op_name(op)));
        const auto v = iota(1001);
        Tensor x = device_tensor(v, t);
        WorkHandle w = comm().all_reduce(x, op, async);
        ASSERT_NE(w, nullptr);
        w->wait();
        w->wait();  // idempotent
        const std::vector<float> want = Tensor::from_floats(v, {1001}, t).to_float_vector();
        EXPECT_EQ(host_values(x), want);  // one rank: the reduction is the input
        ASSERT_EQ(cudaStreamSynchronize(compute_), cudaSuccess);
        EXPECT_TRUE(w->is_completed());
      }
    }
  }
}

TEST_F(Nccl, ReduceScatterAndAllGather) {
  for (DType t : {DType::F32, DType::BF16, DType::I64}) {
    for (int64_t n : {1, 8, 1000, 4099}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " n=" + std::to_string(n));
      const auto v = iota(n);
      Tensor in = device_tensor(v, t);
      Tensor out = Tensor::zeros({n}, t, Device::cuda(0), stream());
      comm().reduce_scatter(in, out, ReduceOp::Sum, false);
      const auto want = Tensor::from_floats(v, {n}, t).to_float_vector();
      EXPECT_EQ(host_values(out), want);

      Tensor gathered = Tensor::zeros({n}, t, Device::cuda(0), stream());
      comm().all_gather(out, gathered, true)->wait();
      EXPECT_EQ(host_values(gathered), want);
    }
  }
}

TEST_F(Nccl, BroadcastAndAllToAll) {
  const auto v = iota(4096, -50.0f);
  Tensor x = device_tensor(v, DType::F32);
  comm().broadcast(x, 0, false);
  EXPECT_EQ(host_values(x), v);

  Tensor in = device_tensor(v, DType::BF16);
  Tensor out = Tensor::zeros({4096}, DType::BF16, Device::cuda(0), stream());
  comm().all_to_all(in, out, true)->wait();
  EXPECT_EQ(host_values(out), Tensor::from_floats(v, {4096}, DType::BF16).to_float_vector());
  EXPECT_THROW(comm().all_to_all(in, in, false), Error);  // in place is refused, not corrupted
}

TEST_F(Nccl, SendRecvToSelfInOneBatch) {
  for (DType t : kAllTypes) {
    SCOPED_TRACE(dtype_name(t));
    const auto v = iota(777);
    Tensor src = device_tensor(v, t);
    Tensor dst = Tensor::zeros({777}, t, Device::cuda(0), stream());
    Tensor src2 = device_tensor(iota(5, 50.0f), t);
    Tensor dst2 = Tensor::zeros({5}, t, Device::cuda(0), stream());
    // Two messages to the same peer arrive in posting order.
    const std::vector<P2POp> ops = {{P2POp::Kind::Send, src, 0},
                                    {P2POp::Kind::Send, src2, 0},
                                    {P2POp::Kind::Recv, dst, 0},
                                    {P2POp::Kind::Recv, dst2, 0}};
    WorkHandle w = comm().batch_p2p(ops);
    w->wait();
    EXPECT_EQ(host_values(dst), Tensor::from_floats(v, {777}, t).to_float_vector());
    EXPECT_EQ(host_values(dst2), Tensor::from_floats(iota(5, 50.0f), {5}, t).to_float_vector());
  }
  WorkHandle empty = comm().batch_p2p({});
  EXPECT_TRUE(empty->is_completed());
}

// Blocks the compute stream until released, so the test can observe what is ordered after it.
struct StreamGate {
  std::atomic<bool> open{false};
  static void CUDART_CB hold(void* self) {
    auto* gate = static_cast<StreamGate*>(self);
    while (!gate->open.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
};

// Opens the gate after 10 s unless disarmed first: a call that blocks the host behind the gate
// (which the test exists to catch) fails the test naming the step it blocked in, instead of hanging
// it (the first GPU run, 2026-11-28, hung here; this says where).
class GateTimer {
 public:
  explicit GateTimer(StreamGate& gate)
      : thread_([this, &gate] {
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          while (!disarmed_.load() && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          if (!disarmed_.load()) {
            blocked_in_ = step_.load();
            gate.open = true;
          }
        }) {}
  ~GateTimer() { disarm(); }
  void at(const char* step) { step_ = step; }
  // The step the host was blocked in when the timer opened the gate, or nullptr.
  const char* disarm() {
    disarmed_ = true;
    if (thread_.joinable()) thread_.join();
    return blocked_in_;
  }

 private:
  std::atomic<bool> disarmed_{false};
  std::atomic<const char*> step_{"start"};
  const char* blocked_in_ = nullptr;
  std::thread thread_;
};

TEST_F(Nccl, AsyncHandleFollowsTheComputeStream) {
  const int64_t n = 1 << 20;
  Tensor x = Tensor::zeros({n}, DType::F32, Device::cuda(0), stream());
  // Warm up this size and the fill kernel first: anything that synchronises would otherwise block
  // behind the gate below: a lazy cudaMalloc inside NCCL, and the first launch of a kernel, which
  // CUDA's lazy module loading (the default since CUDA 12.2) loads with a context-wide wait (the
  // first GPU run, 2026-11-28, blocked in fill_ here).
  comm().all_reduce(x, ReduceOp::Sum, false);
  x.fill_(1.0, stream());
  ASSERT_EQ(cudaStreamSynchronize(compute_), cudaSuccess);

  StreamGate gate;
  GateTimer timer(gate);
  ASSERT_EQ(cudaLaunchHostFunc(compute_, &StreamGate::hold, &gate), cudaSuccess);
  timer.at("fill_ behind the gate");
  x.fill_(3.0, stream());  // queued behind the gate
  timer.at("all_reduce (async)");
  WorkHandle w = comm().all_reduce(x, ReduceOp::Sum, true);
  // The all-reduce must wait for the fill, which waits for the gate: nothing can have finished,
  // and the call itself did not block the host.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  timer.at("is_completed before wait");
  const bool done_early = w->is_completed();
  timer.at("wait");
  w->wait();  // must not block the host either: it only orders the compute stream
  timer.at("is_completed after wait");
  const bool done_after_wait = w->is_completed();
  const char* blocked = timer.disarm();
  ASSERT_EQ(blocked, nullptr) << "the host blocked behind the gated compute stream in: " << blocked;
  EXPECT_FALSE(done_early);
  EXPECT_FALSE(done_after_wait);
  gate.open = true;
  const auto got = host_values(x);  // ordered after the all-reduce by wait()
  EXPECT_TRUE(w->is_completed());
  for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(got[i], 3.0f) << i;
}

TEST_F(Nccl, DroppedHandleStillOrdersTheComputeStream) {
  Tensor x = device_tensor(iota(1 << 16), DType::F32);
  { comm().all_reduce(x, ReduceOp::Max, true); }  // handle dropped without wait()
  EXPECT_EQ(host_values(x), iota(1 << 16));
}

TEST_F(Nccl, EmptyTensorsCompleteImmediately) {
  Tensor x = Tensor::empty({0}, DType::F32, Device::cuda(0));
  EXPECT_TRUE(comm().all_reduce(x, ReduceOp::Sum, true)->is_completed());
}

TEST_F(Nccl, SplitAndBarrier) {
  EXPECT_NO_THROW(comm().barrier());
  std::unique_ptr<Communicator> sub = comm().split(7, 0);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->backend(), "nccl");
  Tensor x = device_tensor(iota(100), DType::F16);
  sub->all_reduce(x, ReduceOp::Sum, false);
  EXPECT_EQ(host_values(x), Tensor::from_floats(iota(100), {100}, DType::F16).to_float_vector());
  sub->barrier();
  EXPECT_EQ(comm().split(-1, 0), nullptr);
}

// CPU tensors (a trainer's scalars) go over the MPI communicator NCCL was bootstrapped from.
TEST_F(Nccl, HostTensorsGoOverTheBootstrapCommunicator) {
  Tensor cpu = Tensor::from_vector(std::vector<float>{1.5f, -2.0f}, {2});
  comm().all_reduce(cpu, ReduceOp::Sum, false);
  EXPECT_EQ(cpu.to_float_vector(), (std::vector<float>{1.5f, -2.0f}));  // a world of one
  Tensor in = Tensor::from_vector(std::vector<float>{3.0f}, {1}), out = Tensor::zeros({1}, DType::F32);
  comm().all_gather(in, out, false);
  EXPECT_EQ(out.to_float_vector(), (std::vector<float>{3.0f}));
  std::unique_ptr<Communicator> sub = comm().split(3, 0);  // the child keeps the fallback
  ASSERT_NE(sub, nullptr);
  sub->broadcast(cpu, 0, false);
  // Mixed CPU and CUDA tensors in one p2p batch are refused rather than half-posted.
  Tensor dev = Tensor::zeros({2}, DType::F32, Device::cuda(0));
  std::vector<P2POp> mixed{{P2POp::Kind::Send, cpu, 0}, {P2POp::Kind::Recv, dev, 0}};
  EXPECT_THROW(comm().batch_p2p(mixed), Error);
}

TEST_F(Nccl, WithoutHostFallbackCpuTensorsAreRejected) {
  MpiCommunicator bootstrap(MPI_COMM_WORLD);
  auto strict = make_nccl_communicator(bootstrap, Device::cuda(0), {.host_fallback = false});
  Tensor cpu = Tensor::zeros({8}, DType::F32);
  try {
    strict->all_reduce(cpu, ReduceOp::Sum, false);
    ADD_FAILURE() << "a CPU tensor was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
}

// A world of one has no neighbours: asking for links is harmless and send/recv to self still work.
TEST_F(Nccl, P2pLinksOnAWorldOfOne) {
  MpiCommunicator bootstrap(MPI_COMM_WORLD);
  auto linked = make_nccl_communicator(bootstrap, Device::cuda(0), {.p2p_links = true});
  Tensor a = device_tensor(iota(16), DType::F32), b = Tensor::zeros({16}, DType::F32, Device::cuda(0));
  std::vector<P2POp> ops{{P2POp::Kind::Send, a, 0}, {P2POp::Kind::Recv, b, 0}};
  linked->batch_p2p(ops)->wait();
  EXPECT_EQ(host_values(b), iota(16));
}

TEST_F(Nccl, RejectsBadArguments) {
  Tensor m = Tensor::zeros({4, 6}, DType::F32, Device::cuda(0));
  Tensor strided = m.narrow(1, 0, 3);
  ASSERT_FALSE(strided.is_contiguous());
  EXPECT_THROW(comm().all_reduce(strided, ReduceOp::Sum, false), Error);
  Tensor fp8 = Tensor::zeros({8}, DType::F8E4M3, Device::cuda(0));
  EXPECT_THROW(comm().all_reduce(fp8, ReduceOp::Sum, false), Error);
  Tensor in = Tensor::zeros({8}, DType::F32, Device::cuda(0));
  Tensor wrong = Tensor::zeros({7}, DType::F32, Device::cuda(0));
  EXPECT_THROW(comm().reduce_scatter(in, wrong, ReduceOp::Sum, false), Error);
  EXPECT_THROW(comm().all_gather(wrong, in, false), Error);
  Tensor other = Tensor::zeros({8}, DType::BF16, Device::cuda(0));
  EXPECT_THROW(comm().reduce_scatter(in, other, ReduceOp::Sum, false), Error);
  EXPECT_THROW(comm().broadcast(in, 1, false), Error);
  EXPECT_THROW(comm().send(in, 3, 0), Error);
}

TEST(NcclWithoutGpu, CreationFailsClearly) {
  // Passes (not skips) with a GPU: on a GPU machine every skip counts as a failure.
  if (cuda_device_count() > 0) return;  // the no-GPU error path is not reachable
  MpiCommunicator bootstrap(MPI_COMM_WORLD);
  EXPECT_THROW(make_nccl_communicator(bootstrap, Device::cuda(0)), Error);
  EXPECT_THROW(make_nccl_communicator(bootstrap, Device::cpu()), Error);
}

}  // namespace
}  // namespace parallel
