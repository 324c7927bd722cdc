// signal_storm: GEMMs forward and backward while a storm of signals hits this process (issue 24,
// item 5; oneDNN issue 4845: oneDNN's JIT sgemm points the stack pointer into a heap buffer, so a
// signal handler that runs on a GEMM thread writes its frame into the heap).
//
//   signal_storm [--signals N] [--gap-us U] [--signal TERM|USR1|USR2] [--handler stopflag|external]
//                [--bare] [--hidden H] [--seq S] [--batch B]
//
// A child process forked before anything else sends N process-directed signals (kill) at this
// one, U microseconds apart (plus jitter), while the steps run; the steps go on until the child has
// sent them all, then two more. A step is ColumnParallelLinear (h -> 4h) then RowParallelLinear
// (4h -> h) on one rank, forward and backward: the GEMM shapes and the dnnl_sgemm path of the
// reported abort (free() <- dnnl_sgemm <- ColumnParallelLinear::backward). Every step repeats the
// first step on the same inputs, and its output, input gradient and weight gradients must equal
// the first step's (a silent overwrite shows there even where free() does not notice).
// OMP_NUM_THREADS sets the GEMM threads.
//
// --handler stopflag: the library's StopFlag handles the signal (the trainer's setting; the
//   default signal is SIGTERM). --handler external: an empty counting handler installed with plain
//   sigaction (no SA_ONSTACK) before the library starts, as a profiler or a host program would
//   (default signal SIGUSR2). --bare: no Runtime and no MPI, the GEMMs through ops::gemm directly
//   (a program that uses the ops alone).
//
// Exit 0 when the process survived and every step matched; 1 on a mismatch; a crash (SIGABRT from
// glibc's heap checks, SIGSEGV) is the failure this program exists to provoke.
#include <omp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "parallel/init.hpp"
#include "parallel/ops.hpp"
#include "parallel/runtime.hpp"
#include "parallel/signal_handler.hpp"
#include "parallel/tensor_parallel.hpp"

namespace {

using namespace parallel;

struct Options {
  int signals = 150;
  int gap_us = 200;
  int sig = 0;  // 0: the handler's default
  std::string handler = "stopflag";
  bool bare = false;
  int64_t hidden = 256, seq = 128, batch = 2;
};

std::atomic<int> g_external_count{0};
extern "C" void external_handler(int) { g_external_count.fetch_add(1, std::memory_order_relaxed); }

int parse_signal(const std::string& name) {
  if (name == "TERM") return SIGTERM;
  if (name == "INT") return SIGINT;
  if (name == "USR1") return SIGUSR1;
  if (name == "USR2") return SIGUSR2;
  std::fprintf(stderr, "signal_storm: unknown signal %s\n", name.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "signal_storm: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--signals")
      o.signals = std::stoi(next());
    else if (a == "--gap-us")
      o.gap_us = std::stoi(next());
    else if (a == "--signal")
      o.sig = parse_signal(next());
    else if (a == "--handler")
      o.handler = next();
    else if (a == "--bare")
      o.bare = true;
    else if (a == "--hidden")
      o.hidden = std::stoll(next());
    else if (a == "--seq")
      o.seq = std::stoll(next());
    else if (a == "--batch")
      o.batch = std::stoll(next());
    else {
      std::fprintf(stderr, "signal_storm: unknown argument %s\n", a.c_str());
      std::exit(2);
    }
  }
  if (o.handler != "stopflag" && o.handler != "external") {
    std::fprintf(stderr, "signal_storm: --handler is stopflag or external\n");
    std::exit(2);
  }
  if (o.sig == 0) o.sig = o.handler == "stopflag" ? SIGTERM : SIGUSR2;
  return o;
}

// The sender: a child forked while this process has one thread. It waits for the go byte on `go`,
// sends the storm and exits. Only async-signal-safe calls and nanosleep after the fork.
pid_t fork_sender(const Options& o, int& go_write) {
  int fds[2];
  if (::pipe(fds) != 0) std::abort();
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) std::abort();
  if (pid == 0) {
    ::close(fds[1]);
    char c;
    if (::read(fds[0], &c, 1) != 1) ::_exit(0);  // the parent ended before the steps started
    std::minstd_rand rng(12345);
    for (int i = 0; i < o.signals; ++i) {
      if (::kill(parent, o.sig) != 0) ::_exit(3);
      const long us = o.gap_us / 2 + static_cast<long>(rng() % static_cast<unsigned>(o.gap_us + 1));
      timespec ts{us / 1000000, (us % 1000000) * 1000};
      ::nanosleep(&ts, nullptr);
    }
    ::_exit(0);
  }
  ::close(fds[0]);
  go_write = fds[1];
  return pid;
}

Tensor random_tensor(const Shape& shape, uint64_t stream) {
  Tensor t = Tensor::empty(shape, DType::F32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = philox_normal(7, stream, static_cast<uint64_t>(i));
  return t;
}

double max_rel_diff(const Tensor& a, const Tensor& b) {
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  double worst = 0, scale = 1e-30;
  for (int64_t i = 0; i < a.numel(); ++i) scale = std::max(scale, std::fabs(static_cast<double>(y[i])));
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = std::fabs(static_cast<double>(x[i]) - y[i]);
    if (!(d <= worst)) worst = std::isnan(d) ? INFINITY : d;
  }
  return worst / scale;
}

// What one step produces: checked against the first step's.
struct Results {
  std::vector<Tensor> tensors;
  std::vector<std::string> names;
};

// One step through the tensor-parallel layers (one rank).
class LayerStep {
 public:
  LayerStep(const Options& o, Communicator& tp)
      : col_({{"mlp.fc1", 4 * o.hidden}}, o.hidden, {}, tp), row_("mlp.fc2", 4 * o.hidden, o.hidden, {}, tp) {
    for (Parameter* p : col_.parameters()) init_normal(*p, 1, 0.02f);
    for (Parameter* p : row_.parameters()) init_normal(*p, 1, 0.02f);
    x_ = random_tensor({o.seq, o.batch, o.hidden}, 100);
    dy_ = random_tensor({o.seq, o.batch, o.hidden}, 101);
  }
  Results run() {
    for (Parameter* p : col_.parameters()) p->grad.zero_();
    for (Parameter* p : row_.parameters()) p->grad.zero_();
    tp::LinearContext c1, c2;
    Tensor h = col_.forward(x_, c1);
    Tensor y = row_.forward(h, c2);
    Tensor dh = row_.backward(dy_, c2);
    Tensor dx = col_.backward(dh, c1);
    return {{y.clone(), dx.clone(), col_.weights[0].grad.clone(), row_.weight.grad.clone()},
            {"output", "input gradient", "fc1 weight gradient", "fc2 weight gradient"}};
  }

 private:
  tp::ColumnParallelLinear col_;
  tp::RowParallelLinear row_;
  Tensor x_, dy_;
};

// The same products through ops::gemm alone: y = x W1^T W2^T, and the backward's three orientations.
class BareStep {
 public:
  explicit BareStep(const Options& o) : rows_(o.seq * o.batch), h_(o.hidden) {
    w1_ = random_tensor({4 * h_, h_}, 1);
    w2_ = random_tensor({h_, 4 * h_}, 2);
    x_ = random_tensor({rows_, h_}, 100);
    dy_ = random_tensor({rows_, h_}, 101);
  }
  Results run() {
    Tensor h = Tensor::empty({rows_, 4 * h_}, DType::F32), y = Tensor::empty({rows_, h_}, DType::F32);
    ops::gemm(x_, false, w1_, true, h);
    ops::gemm(h, false, w2_, true, y);
    Tensor dh = Tensor::empty({rows_, 4 * h_}, DType::F32), dx = Tensor::empty({rows_, h_}, DType::F32);
    Tensor dw1 = Tensor::zeros({4 * h_, h_}, DType::F32), dw2 = Tensor::zeros({h_, 4 * h_}, DType::F32);
    ops::gemm(dy_, false, w2_, false, dh);  // no transpose: dnnl_sgemm
    ops::gemm(dy_, true, h, false, dw2, 1.0f, 1.0f);
    ops::gemm(dh, false, w1_, false, dx);
    ops::gemm(dh, true, x_, false, dw1, 1.0f, 1.0f);
    return {{y, dx, dw1, dw2}, {"output", "input gradient", "fc1 weight gradient", "fc2 weight gradient"}};
  }

 private:
  int64_t rows_, h_;
  Tensor w1_, w2_, x_, dy_;
};

template <typename Step>
int storm(const Options& o, Step& step, pid_t sender, int go_write, const StopFlag* stop) {
  const Results first = step.run();
  if (::write(go_write, "g", 1) != 1) std::abort();
  ::close(go_write);
  int steps = 0, after = -1, status = 0;
  const auto start = std::chrono::steady_clock::now();
  while (after < 2) {
    const Results r = step.run();
    ++steps;
    for (size_t i = 0; i < r.tensors.size(); ++i) {
      const double d = max_rel_diff(r.tensors[i], first.tensors[i]);
      if (!(d <= 1e-5)) {
        std::fprintf(stderr, "signal_storm: step %d: %s differs from the first step's (relative %g)\n", steps,
                     r.names[i].c_str(), d);
        return 1;
      }
    }
    if (after < 0) {
      const pid_t done = ::waitpid(sender, &status, WNOHANG);
      if (done == sender) after = 0;
    } else {
      ++after;
    }
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "signal_storm: the sender failed (status %d)\n", status);
    return 1;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int seen = stop != nullptr ? (stop->requested() ? 1 : 0) : g_external_count.load();
  // Signals of one kind coalesce while pending: N sent is at least one received, not N.
  if (seen == 0) {
    std::fprintf(stderr, "signal_storm: no signal reached the handler\n");
    return 1;
  }
  std::printf("signal_storm: %d signals (%s) during %d steps in %.2f s, %d threads, every step equal\n",
              o.signals, strsignal(o.sig), steps, secs, omp_get_max_threads());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.handler == "external") {
    struct sigaction a {};
    a.sa_handler = external_handler;
    sigemptyset(&a.sa_mask);
    a.sa_flags = SA_RESTART;
    ::sigaction(o.sig, &a, nullptr);
  }
  int go_write = -1;
  const pid_t sender = fork_sender(o, go_write);
  if (o.bare) {
    BareStep step(o);
    return storm(o, step, sender, go_write, nullptr);
  }
  return run_main(argc, argv, [&](Runtime& rt) {
    std::optional<StopFlag> stop;
    if (o.handler == "stopflag") stop.emplace();
    LayerStep step(o, rt.world());
    return storm(o, step, sender, go_write, stop ? &*stop : nullptr);
  });
}
