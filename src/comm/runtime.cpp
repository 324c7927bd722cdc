#include "parallel/runtime.hpp"

#include <malloc.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <optional>
#include <thread>

#include "parallel/log.hpp"
#include "parallel/signal_handler.hpp"

namespace parallel {
namespace {

bool mpi_is_live() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// How long ranks that all failed the same way wait for each other before concluding that only
// some failed (and aborting the job instead).
constexpr auto kAgreementTimeout = std::chrono::seconds(10);

// True when every rank reached this point within the timeout: the error was the same everywhere
// (a bad config is read identically by all ranks), so the job can end cleanly. A rank that did not
// fail never arrives, and then the caller must abort rather than leave it waiting.
bool all_ranks_failed_alike() {
  MPI_Request request;
  if (MPI_Ibarrier(MPI_COMM_WORLD, &request) != MPI_SUCCESS) return false;
  const auto deadline = std::chrono::steady_clock::now() + kAgreementTimeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int done = 0;
    if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (done) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

void terminate_handler() {
  std::string what = "std::terminate called";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what += std::string(": ") + ex.what();
    } catch (...) {
      what += ": unknown exception";
    }
  }
  fatal(what);
}

// glibc hands freed memory back to the kernel: a block above the mmap threshold is unmapped when
// freed, and the top of a heap (the main one, and each thread's arena) is trimmed once more than
// the trim threshold lies free there. The next step allocates the same sizes again and the kernel
// maps fresh zeroed pages: minor page faults inside every step (issue 28, item 5; measured by
// test_step_conversions and metrics.jsonl "minor_faults"). Tensors of 64 KiB and more are cached by
// the CPU allocator anyway; this covers the rest - small tensors, kernels' std::vectors, oneDNN's
// primitives and scratch. Blocks up to 32 MiB (the largest mmap threshold glibc accepts on 64-bit)
// come from the heaps, and the heaps are never trimmed, so a process keeps its high-water mark of
// malloc'ed memory, as the CPU allocator keeps its cache. Setting either value also turns off
// glibc's dynamic threshold, which would otherwise start at 128 KiB again after this call.
void keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

}  // namespace

Runtime::Runtime(int* argc, char*** argv) {
  keep_freed_memory();
  // First, so that every thread started from here on (MPI's, OpenMP's) inherits the blocked mask
  // and SIGTERM / SIGINT / SIGUSR1 / SIGUSR2 reach the process only on its signal thread (oneDNN
  // issue 4845: never on a thread inside a GEMM). include/parallel/signal_handler.hpp.
  guard_signals();
  launch_ = discover_launch_from_environment();
  // CUDA loads a kernel's module on its first launch by default (lazy loading, CUDA 12.2 on), and
  // that load waits for the GPU's queue to drain while it holds the context. In a job of several
  // ranks the queue can hold an NCCL kernel spinning on a peer whose host is itself blocked the same
  // way: a deadlock (NVIDIA's lazy-loading guide; test_nccl's gated stream blocked this way on the
  // first GPU run). Eager loading has to be chosen before CUDA initialises, hence here; it costs
  // start-up time and some device memory for every kernel of every library. A value the user set
  // is kept, and a single rank keeps lazy loading (nothing remote to wait on).
  // make_nccl_communicator warns when the mode it finds is lazy.
  if (launch_.world_size > 1) setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    launch_.source = "mpi (already initialised)";
  } else {
    // Open MPI yields the core inside every idle progress call when the node is oversubscribed
    // (mpi_yield_when_idle defaults to 1 there); the communicator's waits poll with MPI_Testall,
    // so each poll would yield, which under EEVDF sends the waiter behind every runnable task of
    // its core (src/comm/watchdog.hpp). The communicator's WaitPacer sleeps instead. A value the
    // user set (environment or mpirun --mca) is kept.
    setenv("OMPI_MCA_mpi_yield_when_idle", "0", /*overwrite=*/0);
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      std::fprintf(stderr, "libparallel: MPI_Init_thread failed\n");
      std::exit(1);
    }
    owns_mpi_ = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);

  // MPI's view is authoritative; the launcher's variables must agree with it, or the job was
  // started in a way MPI cannot see (e.g. torchrun without an MPI launcher) and would deadlock.
  int mpi_rank = 0, mpi_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
  set_error_context(mpi_rank, launch_.host);
  if (mpi_size != launch_.world_size || mpi_rank != launch_.rank) {
    if (launch_.source == "mpi (already initialised)" || launch_.source == "single process") {
      launch_.rank = mpi_rank;
      launch_.world_size = mpi_size;
    } else {
      std::fprintf(stderr,
                   "libparallel: the %s environment says rank %d of %d, but MPI sees rank %d of %d; "
                   "launch with mpirun or srun so that every rank joins one MPI job\n",
                   launch_.source.c_str(), launch_.rank, launch_.world_size, mpi_rank, mpi_size);
      if (owns_mpi_) MPI_Abort(MPI_COMM_WORLD, 1);
      std::exit(1);
    }
  }
  init_logging(launch_.rank, launch_.world_size, launch_.host);
  std::set_terminate(terminate_handler);
  world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
  progress().info("launch: {} rank(s) from {} (local rank {} of {})", launch_.world_size, launch_.source,
                  launch_.local_rank, launch_.local_size);
}

Runtime::~Runtime() {
  world_.reset();
  if (owns_mpi_ && mpi_is_live()) MPI_Finalize();
}

int run_main(int argc, char** argv, const std::function<int(Runtime&)>& body) {
  std::optional<Runtime> runtime;
  try {
    runtime.emplace(&argc, &argv);
  } catch (const std::exception& e) {
    fatal(std::string("start-up failed: ") + e.what());
  }
  try {
    return body(*runtime);
  } catch (const ConfigError& e) {
    if (all_ranks_failed_alike()) {
      if (runtime->rank() == 0) std::fprintf(stderr, "%s\n", e.what());
      return 2;
    }
    fatal(e.what());
  } catch (const AgreedStop& e) {
    if (all_ranks_failed_alike()) {
      logger().flush();
      if (runtime->rank() == 0) std::fprintf(stderr, "%s\n", e.what());
      return e.exit_code();
    }
    fatal(e.what());
  } catch (const std::exception& e) {
    fatal(e.what());
  }
}

void fatal(const std::string& message) {
  logger().critical("fatal: {}", message);
  logger().flush();
  std::fflush(stdout);
  std::fflush(stderr);
  if (mpi_is_live()) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

}  // namespace parallel
