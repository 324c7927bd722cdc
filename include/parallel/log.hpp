#pragma once
// Logging through spdlog, with the rank and host in every line.
//
// logger() prints on every rank (warnings, errors, per-rank facts); progress() prints on rank 0
// only, unless PARALLEL_LOG_ALL_RANKS=1. PARALLEL_LOG_LEVEL=trace|debug|info|warn|error sets the
// level (default info).
#include <spdlog/spdlog.h>

#include <string>

namespace parallel {

void init_logging(int rank, int world_size, const std::string& host);
spdlog::logger& logger();
spdlog::logger& progress();

}  // namespace parallel
