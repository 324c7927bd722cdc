#include "parallel/log.hpp"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/null_sink.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "parallel/whole_line.hpp"

namespace parallel {
namespace {

// stderr, one write() per formatted line (write_whole_line): when stderr is a log file on a full
// disk, a line is either whole or absent, and the failure never reaches training. The lines lost
// are counted and reported with the next line that gets through.
class WholeLineStderrSink final : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    if (lost_ > 0) {
      const std::string note = fmt::format("[log] {} line(s) could not be written to stderr: {}\n", lost_,
                                           std::strerror(lost_errno_));
      if (write_whole_line(STDERR_FILENO, note) != 0) {
        ++lost_;
        return;
      }
      lost_ = 0;
    }
    const int err = write_whole_line(STDERR_FILENO, std::string_view(formatted.data(), formatted.size()));
    if (err != 0) {
      ++lost_;
      lost_errno_ = err;
    }
  }
  void flush_() override {}  // nothing is buffered

 private:
  int64_t lost_ = 0;
  int lost_errno_ = 0;
};

std::shared_ptr<spdlog::logger> g_all;
std::shared_ptr<spdlog::logger> g_progress;

std::shared_ptr<spdlog::logger> make_stderr_logger(const std::string& name) {
  return std::make_shared<spdlog::logger>(name, std::make_shared<WholeLineStderrSink>());
}

void ensure_default() {
  if (!g_all) init_logging(0, 1, "localhost");
}
}  // namespace

void init_logging(int rank, int world_size, const std::string& host) {
  auto level = spdlog::level::info;
  if (const char* env = std::getenv("PARALLEL_LOG_LEVEL")) level = spdlog::level::from_str(env);
  bool all_ranks = false;
  if (const char* env = std::getenv("PARALLEL_LOG_ALL_RANKS")) all_ranks = std::string(env) == "1";

  // Logs go to stderr, unbuffered per line, so lines of a rank that aborts are not lost.
  const std::string pattern =
      fmt::format("[%H:%M:%S.%e] [rank {}/{} {}] [%^%l%$] %v", rank, world_size, host);
  g_all = make_stderr_logger("parallel");
  g_all->set_pattern(pattern);
  g_all->set_level(level);
  g_all->flush_on(spdlog::level::warn);
  if (rank == 0 || all_ranks) {
    g_progress = make_stderr_logger("progress");
    g_progress->set_pattern(pattern);
    g_progress->set_level(level);
  } else {
    g_progress =
        std::make_shared<spdlog::logger>("progress", std::make_shared<spdlog::sinks::null_sink_mt>());
  }
}

spdlog::logger& logger() {
  ensure_default();
  return *g_all;
}

spdlog::logger& progress() {
  ensure_default();
  return *g_progress;
}

}  // namespace parallel
