// guard_signals() (include/parallel/signal_handler.hpp): SIGTERM, SIGINT, SIGUSR1 and SIGUSR2 are
// blocked in every thread that computes (the caller, its OpenMP workers, threads created later)
// and delivered on the library's signal thread, whoever installed the handler; default actions
// and a fork()ed child's mask are unchanged. The storm itself: tests/scripts/signal_storm.sh.
#include <gtest/gtest.h>
#include <omp.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "parallel/ops.hpp"
#include "parallel/signal_handler.hpp"

namespace parallel {
namespace {

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The guarded signals this thread (a /proc/self/task entry) blocks: "SigBlk:" as a mask.
bool blocks_all_guarded(const std::string& task) {
  std::ifstream in(task + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("SigBlk:", 0) != 0) continue;
    const unsigned long long mask = std::stoull(line.substr(7), nullptr, 16);
    for (int sig : kGuardedSignals)
      if (!(mask & (1ULL << (sig - 1)))) return false;
    return true;
  }
  return false;
}

// Every thread of the process but the signal thread blocks the guarded signals; the signal thread
// does not. Returns the number of threads checked; failures name the thread.
int check_all_threads() {
  int threads = 0, delivery = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    const std::string comm = read_line(task.path().string() + "/comm");
    ++threads;
    if (comm == "parallel-signal") {
      ++delivery;
      EXPECT_FALSE(blocks_all_guarded(task.path().string())) << "the signal thread blocks them";
    } else {
      EXPECT_TRUE(blocks_all_guarded(task.path().string()))
          << "thread " << task.path() << " (" << comm << ")";
    }
  }
  EXPECT_EQ(delivery, 1);
  return threads;
}

void run_gemm() {
  Tensor a = Tensor::full({256, 256}, 0.5, DType::F32), b = Tensor::full({256, 256}, 0.25, DType::F32);
  Tensor c = Tensor::empty({256, 256}, DType::F32);
  ops::gemm(a, false, b, false, c);
  EXPECT_FLOAT_EQ(c.data<float>()[0], 256 * 0.125f);
}

std::atomic<long> g_handler_tid{0};
extern "C" void record_tid(int) { g_handler_tid.store(::syscall(SYS_gettid)); }

bool wait_until(const std::function<bool()>& done) {
  for (int i = 0; i < 10000; ++i) {
    if (done()) return true;
    ::usleep(1000);
  }
  return false;
}

// One test, in order: the first GEMM installs the guard (no Runtime, no StopFlag).
TEST(SignalGuard, EveryComputingThreadBlocksAndTheSignalThreadDelivers) {
  omp_set_num_threads(2);
  run_gemm();  // the first GEMM of this thread guards it and its team
  EXPECT_TRUE(signals_guarded());
  EXPECT_GE(check_all_threads(), 3);  // main, one OpenMP worker, the signal thread

  // OpenMP grows its pool from the guarded main thread: the new workers inherit the mask.
  omp_set_num_threads(4);
  run_gemm();
  EXPECT_GE(check_all_threads(), 5);
  std::atomic<bool> checked{false};
  std::thread later([&] {
    EXPECT_TRUE(blocks_all_guarded("/proc/thread-self"));
    checked = true;
  });
  later.join();
  EXPECT_TRUE(checked);
  omp_set_num_threads(1);

  // A handler installed from outside the library (plain sigaction, no SA_ONSTACK) runs on the
  // signal thread, never on this one or a worker.
  struct sigaction a {
  }, old{};
  a.sa_handler = record_tid;
  sigemptyset(&a.sa_mask);
  ASSERT_EQ(::sigaction(SIGUSR2, &a, &old), 0);
  ASSERT_EQ(::kill(::getpid(), SIGUSR2), 0);
  ASSERT_TRUE(wait_until([] { return g_handler_tid.load() != 0; }));
  const long tid = g_handler_tid.load();
  EXPECT_NE(tid, ::syscall(SYS_gettid));
  EXPECT_EQ(read_line("/proc/self/task/" + std::to_string(tid) + "/comm"), "parallel-signal");
  ::sigaction(SIGUSR2, &old, nullptr);
}

// A fork()ed child gets back the mask it had before the guard: a program it execs can be
// stopped with SIGTERM.
TEST(SignalGuard, AForkedChildHasItsMaskBack) {
  guard_signals();
  ASSERT_TRUE(blocks_all_guarded("/proc/thread-self"));
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    sigset_t now;
    pthread_sigmask(SIG_BLOCK, nullptr, &now);
    bool any = false;
    for (int sig : kGuardedSignals) any = any || sigismember(&now, sig);
    ::_exit(any ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child still blocks them";
}

// Nobody handles SIGUSR2: its default action still ends the process, from the signal thread.
TEST(SignalGuardDeathTest, DefaultActionsStillEndTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        guard_signals();
        ::kill(::getpid(), SIGUSR2);
        wait_until([] { return false; });
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGUSR2), "");
}

// A program that blocked SIGUSR2 itself to take it with sigwait() keeps it: the signal thread
// does not unblock what its creator had blocked (else SIGUSR2's default action would end it).
TEST(SignalGuardDeathTest, SignalsTheProgramBlockedStayItsOwn) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        sigset_t usr2;
        sigemptyset(&usr2);
        sigaddset(&usr2, SIGUSR2);
        pthread_sigmask(SIG_BLOCK, &usr2, nullptr);
        guard_signals();
        ::kill(::getpid(), SIGUSR2);
        timespec wait = {};
        wait.tv_sec = 10;
        std::exit(::sigtimedwait(&usr2, nullptr, &wait) == SIGUSR2 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace parallel
