// checkpoint::AsyncSave: the save protocol of save.cpp with the write of each rank's file moved to a
// background thread (docs/checkpoints.md, "Asynchronous saves"). The main thread keeps every
// communicator call: start() (prepare), all_written() and finish() (agree, publish).
#include <fmt/ranges.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "checkpoint/internal.hpp"
#include "parallel/log.hpp"

namespace parallel::checkpoint {
namespace {

namespace fs = std::filesystem;

// PARALLEL_INJECT_CHECKPOINT_FAIL=STEP[:RANK] and PARALLEL_INJECT_CHECKPOINT_DELAY_MS=MS, for the
// tests of a failed background write and of a kill while one is running.
struct Injection {
  bool fail = false;
  int delay_ms = 0;

  static Injection from_environment(int64_t step, int rank) {
    Injection inj;
    if (const char* text = std::getenv("PARALLEL_INJECT_CHECKPOINT_FAIL"); text != nullptr && *text != '\0') {
      char* end = nullptr;
      const long long at = std::strtoll(text, &end, 10);
      long long who = -1;
      bool ok = end != text && at >= 0;
      if (ok && *end == ':') {
        const char* p = end + 1;
        who = std::strtoll(p, &end, 10);
        ok = end != p && who >= 0;
      }
      ok = ok && *end == '\0';
      PARALLEL_CHECK(ok, "PARALLEL_INJECT_CHECKPOINT_FAIL = \"{}\": expected STEP[:RANK]", text);
      inj.fail = at == step && (who < 0 || who == rank);
    }
    if (const char* text = std::getenv("PARALLEL_INJECT_CHECKPOINT_DELAY_MS");
        text != nullptr && *text != '\0') {
      char* end = nullptr;
      const long ms = std::strtol(text, &end, 10);
      PARALLEL_CHECK(end != text && *end == '\0' && ms >= 0 && ms <= 600000,
                     "PARALLEL_INJECT_CHECKPOINT_DELAY_MS = \"{}\": expected milliseconds in [0, 600000]",
                     text);
      inj.delay_ms = static_cast<int>(ms);
    }
    return inj;
  }
};

// A host copy of a box, contiguous. A GPU box is copied on its storage's stream, so the copy is
// ordered after the kernels that wrote it (the optimizer step); cuda_backend::memcpy returns once
// a copy into host memory has landed.
Tensor host_copy(const Tensor& t) {
  Tensor host = Tensor::empty(t.shape(), t.dtype(), Device::cpu());
  host.copy_(t, t.storage() ? t.storage()->stream() : Stream{});
  return host;
}

}  // namespace

struct AsyncSave::State {
  std::string root, staging, final_name;
  int64_t step = 0;
  int keep_last = 0;
  std::string extras_json, layout_json;
  detail::RankPieces pieces;  // the written boxes are host copies
  Injection injection;
  int rank = 0;
  std::thread thread;
  std::atomic<bool> done{false};
  // Written by the thread before `done` is set, read by the main thread after it is.
  std::string manifest_json, error;

  void write() {
    // The writer yields the CPU to training: on a CPU machine both compete for the same cores.
    // Linux gives every thread its own nice value.
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
    try {
      if (injection.delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(injection.delay_ms));
      if (injection.fail)
        throw Error(
            fmt::format("checkpoint: write to {}/rank_{:05d}.safetensors failed: No space left on "
                        "device (injected: PARALLEL_INJECT_CHECKPOINT_FAIL)",
                        staging, rank));
      manifest_json = detail::manifest_to_json(detail::write_rank_file(staging, rank, pieces));
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "unknown error";
    }
    done.store(true, std::memory_order_release);
  }
};

AsyncSave::AsyncSave() = default;

AsyncSave::~AsyncSave() { abandon(); }

bool AsyncSave::pending() const { return state_ != nullptr; }

int64_t AsyncSave::step() const {
  PARALLEL_CHECK(pending(), "AsyncSave::step: no save is pending");
  return state_->step;
}

bool AsyncSave::written() const { return state_ != nullptr && state_->done.load(std::memory_order_acquire); }

void AsyncSave::start(const std::string& root, int64_t step, const std::vector<ShardedTensor>& tensors,
                      const std::string& extras_json, Communicator& world, const SaveOptions& options) {
  PARALLEL_CHECK(!pending(),
                 "checkpoint: the asynchronous save of step {} is still pending (finish it first)",
                 state_->step);
  auto state = std::make_unique<State>();
  state->root = root;
  state->step = step;
  state->final_name = step_dir_name(step);
  state->staging = (fs::path(root) / (".tmp_" + state->final_name)).string();
  state->keep_last = options.keep_last;
  state->rank = world.rank();
  const bool leader = world.rank() == 0;
  try {
    detail::run_collectively(world, "checkpoint save (prepare " + state->staging + ")", [&] {
      PARALLEL_CHECK(!root.empty(), "checkpoint save: empty checkpoint root");
      // What publish() would refuse later, refused now, while every rank can still be told.
      state->extras_json = detail::normalize_json_object(extras_json, "the extras");
      state->layout_json = detail::normalize_json_object(options.layout_json, "SaveOptions::layout_json");
      state->injection = Injection::from_environment(step, world.rank());
      state->pieces = detail::rank_pieces(tensors, world.rank());
      for (ShardedTensor& t : state->pieces.written) t.local = host_copy(t.local);
      if (leader) detail::prepare_root(root, state->staging);
      return std::string();
    });
  } catch (...) {
    if (leader) {
      std::error_code ec;
      fs::remove_all(state->staging, ec);
    }
    throw;
  }
  State* s = state.get();
  // The thread inherits this thread's signal mask: the guarded signals stay blocked in it
  // (signal_handler.hpp).
  s->thread = std::thread([s] { s->write(); });
  state_ = std::move(state);
}

bool AsyncSave::all_written(Communicator& world) {
  PARALLEL_CHECK(pending(), "AsyncSave::all_written: no save is pending");
  Tensor done = Tensor::from_vector<int32_t>({written() ? 1 : 0}, {1});
  world.all_reduce(done, ReduceOp::Min);
  return done.data<int32_t>()[0] == 1;
}

std::string AsyncSave::finish(Communicator& world) {
  PARALLEL_CHECK(pending(), "AsyncSave::finish: no save is pending");
  std::unique_ptr<State> s = std::move(state_);
  if (s->thread.joinable()) s->thread.join();
  s->pieces = {};  // the host buffers go as soon as the file is on disk
  const bool leader = world.rank() == 0;
  const fs::path final_dir = fs::path(s->root) / s->final_name;
  try {
    // Every rank's manifest, or its error, marked by a first byte; the same message on every rank.
    std::vector<std::string> manifests =
        detail::run_collectively(world, "checkpoint save (write " + s->staging + ")",
                                 [&] { return s->error.empty() ? "+" + s->manifest_json : "-" + s->error; });
    std::vector<int> failed;
    for (int r = 0; r < world.size(); ++r)
      if (manifests[static_cast<std::size_t>(r)].starts_with("-")) failed.push_back(r);
    if (!failed.empty())
      // A plain Error: the message is logged, and names the rank itself (no source location).
      throw Error(fmt::format("checkpoint: the background write of step {} failed on {} {}: {}", s->step,
                              failed.size() == 1 ? "rank" : "ranks", fmt::join(failed, ","),
                              manifests[static_cast<std::size_t>(failed.front())].substr(1)));
    for (std::string& m : manifests) m.erase(0, 1);
    detail::run_collectively(world, "checkpoint save (publish " + final_dir.string() + ")", [&] {
      if (leader)
        detail::publish(s->root, s->staging, s->final_name, s->step, world.size(), manifests, s->extras_json,
                        s->layout_json);
      return std::string();
    });
  } catch (...) {
    if (leader) {
      std::error_code ec;
      fs::remove_all(s->staging, ec);
    }
    throw;
  }
  if (leader) detail::prune(s->root, s->step, s->keep_last);
  logger().debug("checkpoint: saved step {} to {} (asynchronously)", s->step, final_dir.string());
  return final_dir.string();
}

void AsyncSave::abandon() {
  if (!state_) return;
  if (state_->thread.joinable()) state_->thread.join();
  state_.reset();
}

}  // namespace parallel::checkpoint
