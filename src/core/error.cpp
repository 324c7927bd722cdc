#include "parallel/error.hpp"

#include <mpi.h>

#include <mutex>

namespace parallel {
namespace {
std::mutex g_context_mutex;
int g_rank = -1;
std::string g_host = "?";
}  // namespace

void set_error_context(int rank, const std::string& host) {
  std::lock_guard lock(g_context_mutex);
  g_rank = rank;
  g_host = host;
}

std::string error_location(const char* file, int line) {
  std::lock_guard lock(g_context_mutex);
  std::string rank = g_rank < 0 ? "?" : std::to_string(g_rank);
  return fmt::format("{}:{} [rank {} on {}]", file, line, rank, g_host);
}

void throw_error(const char* file, int line, const std::string& message) {
  throw Error(error_location(file, line) + ": " + message);
}

namespace detail {
void throw_mpi_error(const char* file, int line, const char* call, int rc) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof text, "error %d", rc);
  throw_error(file, line, fmt::format("{} failed: {}", call, text));
}
}  // namespace detail

}  // namespace parallel
