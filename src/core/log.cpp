#include "parallel/log.hpp"

#include <spdlog/sinks/null_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>
#include <memory>

namespace parallel {
namespace {
std::shared_ptr<spdlog::logger> g_all;
std::shared_ptr<spdlog::logger> g_progress;

std::shared_ptr<spdlog::logger> make_stderr_logger(const std::string& name) {
  return std::make_shared<spdlog::logger>(name, std::make_shared<spdlog::sinks::stderr_sink_mt>());
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
