// Launcher discovery: where this process sits in the job, read from the launcher's environment.
#include "parallel/launch.hpp"

#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "parallel/error.hpp"

namespace parallel {
namespace {

using Env = std::function<const char*(const char*)>;

// The variables one launcher sets. Local rank and size are optional: not every launcher (or
// launcher version) exports them, and a job without them is still usable on one node per rank.
struct Launcher {
  const char* source;
  const char* rank;
  const char* size;
  const char* local_rank;  // nullptr: the launcher has none
  const char* local_size;
};

// In precedence order. Open MPI comes before Slurm because mpirun inside an allocation inherits the
// SLURM_* variables of the batch step, which describe the allocation, not this process.
constexpr Launcher kLaunchers[] = {
    {"open-mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
};

std::optional<std::string> lookup(const Env& env, const char* name) {
  const char* value = env(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

// Strict: the whole value must be a decimal integer that fits an int. "4abc", " 4" and "" are
// rejected rather than read as 4 or 0, since a silently wrong rank deadlocks the job later.
int parse_int(const char* name, const std::string& value, int min) {
  int result = 0;
  const char* first = value.data();
  const char* last = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(first, last, result);
  if (value.empty() || ec != std::errc() || ptr != last)
    PARALLEL_FAIL("launcher variable {}='{}' is not an integer", name, value);
  if (result < min) PARALLEL_FAIL("launcher variable {}='{}' must be >= {}", name, value, min);
  return result;
}

std::optional<int> read_int(const Env& env, const char* name, int min) {
  auto value = lookup(env, name);
  if (!value) return std::nullopt;
  return parse_int(name, *value, min);
}

int require_int(const Env& env, const Launcher& l, const char* name, int min) {
  auto value = read_int(env, name, min);
  if (!value)
    PARALLEL_FAIL("{} launch detected ({} or {} is set) but {} is missing", l.source, l.rank, l.size, name);
  return *value;
}

// srun always exports SLURM_TASKS_PER_NODE ("2(x3),1": two tasks on each of three nodes, then one),
// while SLURM_NTASKS_PER_NODE exists only with --ntasks-per-node; this node's entry is our local size.
std::optional<int> slurm_tasks_on_this_node(const Env& env) {
  auto spec = lookup(env, "SLURM_TASKS_PER_NODE");
  auto node = read_int(env, "SLURM_NODEID", 0);
  if (!spec || !node) return std::nullopt;
  std::string_view rest = *spec;
  int index = 0;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    std::string_view entry = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    int tasks = 0, repeat = 1;
    auto [ptr, ec] = std::from_chars(entry.data(), entry.data() + entry.size(), tasks);
    std::string_view tail(ptr, entry.data() + entry.size() - ptr);
    bool ok = ec == std::errc() && tasks >= 1;
    if (ok && !tail.empty()) {
      // "(xN)"
      ok = tail.size() > 3 && tail.substr(0, 2) == "(x" && tail.back() == ')';
      if (ok) {
        auto [p2, ec2] = std::from_chars(tail.data() + 2, tail.data() + tail.size() - 1, repeat);
        ok = ec2 == std::errc() && p2 == tail.data() + tail.size() - 1 && repeat >= 1;
      }
    }
    if (!ok) PARALLEL_FAIL("launcher variable SLURM_TASKS_PER_NODE='{}' is malformed", *spec);
    if (*node < index + repeat) return tasks;
    index += repeat;
  }
  PARALLEL_FAIL("launcher variable SLURM_NODEID='{}' is beyond SLURM_TASKS_PER_NODE='{}'", *node, *spec);
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

}  // namespace

LaunchInfo discover_launch(const Env& env) {
  LaunchInfo info;
  info.host = host_name();
  for (const Launcher& l : kLaunchers) {
    if (env(l.rank) == nullptr && env(l.size) == nullptr) continue;
    info.source = l.source;
    info.rank = require_int(env, l, l.rank, 0);
    info.world_size = require_int(env, l, l.size, 1);
    if (info.rank >= info.world_size)
      PARALLEL_FAIL("launcher variable {}={} is not below {}={}", l.rank, info.rank, l.size, info.world_size);

    info.local_rank = read_int(env, l.local_rank, 0).value_or(0);
    const char* local_size_name = l.local_size;
    auto local_size = read_int(env, l.local_size, 1);
    if (!local_size && std::string_view(l.source) == "slurm") {
      local_size = slurm_tasks_on_this_node(env);
      local_size_name = "SLURM_TASKS_PER_NODE";
    }
    info.local_size = local_size.value_or(1);
    if (info.local_rank >= info.local_size)
      PARALLEL_FAIL("launcher variable {}={} is not below the local size {} (from {})", l.local_rank,
                    info.local_rank, info.local_size, local_size ? local_size_name : "the default of 1");
    return info;
  }
  info.source = "single process";
  return info;
}

LaunchInfo discover_launch_from_environment() {
  return discover_launch([](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace parallel
