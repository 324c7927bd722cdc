// What memory a rank may use (memory_plan.hpp): the host's MemAvailable and the cgroup's room,
// shared by the ranks on the node.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "parallel/allocator.hpp"
#include "parallel/memory_plan.hpp"

namespace parallel {
namespace {

// A whole number from a one-value file (cgroup), or -1 (missing, "max", unreadable).
int64_t read_number(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return -1;
  try {
    std::size_t used = 0;
    const unsigned long long v = std::stoull(word, &used);
    if (used != word.size()) return -1;
    return v > static_cast<unsigned long long>(std::numeric_limits<int64_t>::max()) ? -1
                                                                                    : static_cast<int64_t>(v);
  } catch (const std::exception&) {
    return -1;
  }
}

int64_t mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

// The process's cgroup directory under the v2 mount, or "" (v1 or none).
std::string cgroup_v2_dir() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("0::", 0) == 0)
      return "/sys/fs/cgroup" + (line.size() > 3 ? line.substr(3) : std::string());
  return "";
}

// Room left under the cgroup's limit, or -1 when there is no limit. A limit above the machine's
// memory (v1's "unlimited" is 2^63 rounded down to a page) is no limit.
int64_t cgroup_room(std::string* where) {
  auto room = [](int64_t limit, int64_t usage) -> int64_t {
    if (limit <= 0 || limit >= (int64_t{1} << 60)) return -1;
    return usage >= 0 ? std::max<int64_t>(0, limit - usage) : limit;
  };
  // v2: the process's own group (inside a container namespace that is the root of the mount).
  for (const std::string& dir : {cgroup_v2_dir(), std::string("/sys/fs/cgroup")}) {
    if (dir.empty()) continue;
    const int64_t r = room(read_number(dir + "/memory.max"), read_number(dir + "/memory.current"));
    if (r >= 0) {
      *where = dir + "/memory.max";
      return r;
    }
  }
  const std::string v1 = "/sys/fs/cgroup/memory";
  const int64_t r =
      room(read_number(v1 + "/memory.limit_in_bytes"), read_number(v1 + "/memory.usage_in_bytes"));
  if (r >= 0) *where = v1 + "/memory.limit_in_bytes";
  return r;
}

std::string gib(int64_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1 << 30)); }

}  // namespace

MemoryLimit host_memory_limit(int ranks_on_node) {
  const int ranks = std::max(1, ranks_on_node);
  const int64_t available = mem_available();
  std::string cgroup_file;
  const int64_t cgroup = cgroup_room(&cgroup_file);
  MemoryLimit limit;
  int64_t total = -1;
  if (available >= 0 && (cgroup < 0 || available <= cgroup)) {
    total = available;
    limit.source = gib(available) + " MemAvailable";
  } else if (cgroup >= 0) {
    total = cgroup;
    limit.source = gib(cgroup) + " left under the cgroup limit " + cgroup_file;
  }
  if (total < 0) return {};
  limit.bytes = total / ranks;
  if (ranks > 1) limit.source += fmt::format(" shared by {} ranks on this node", ranks);
  return limit;
}

MemoryLimit device_memory_limit(Device device) {
  const DeviceMemoryInfo info = device_memory_info(device);
  const MemoryStats held = memory_stats(device);
  const int64_t cached = static_cast<int64_t>(held.reserved) - static_cast<int64_t>(held.allocated);
  MemoryLimit limit;
  limit.bytes = static_cast<int64_t>(info.free) + std::max<int64_t>(0, cached);
  limit.source = fmt::format("{} free on {} of {}", gib(limit.bytes), device.str(),
                             gib(static_cast<int64_t>(info.total)));
  return limit;
}

}  // namespace parallel
