// The opt-in GEMM time record (gemm_times.hpp).
#include "cpu/gemm_times.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace parallel::cpu {
namespace {

using Key = std::tuple<std::string, int64_t, int64_t, int64_t, bool, bool, bool>;

struct Table {
  std::mutex mutex;
  std::map<Key, std::vector<double>> seconds, cpu_seconds;
  ~Table() {  // at exit: one line per route and shape
    if (seconds.empty()) return;
    std::fprintf(stderr,
                 "gemm times: route m n k trans_a trans_b bias calls median_ms total_ms gflops_median "
                 "cpu_gflops_median\n");
    double total = 0;
    for (auto& [key, v] : seconds) {
      std::sort(v.begin(), v.end());
      double sum = 0;
      for (double s : v) sum += s;
      total += sum;
      const double med = v[v.size() / 2];
      std::vector<double>& cpu = cpu_seconds[key];
      std::sort(cpu.begin(), cpu.end());
      const double cpu_med = cpu[cpu.size() / 2] / omp_get_max_threads();
      const auto& [route, m, n, k, ta, tb, bias] = key;
      std::fprintf(stderr, "gemm times: %s %lld %lld %lld %d %d %d %zu %.3f %.1f %.1f %.1f\n", route.c_str(),
                   static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k), ta, tb,
                   bias, v.size(), med * 1e3, sum * 1e3, 2.0 * m * n * k / med * 1e-9,
                   2.0 * m * n * k / cpu_med * 1e-9);
    }
    std::fprintf(stderr, "gemm times: total %.1f ms\n", total * 1e3);
  }
};

Table& table() {
  static Table t;
  return t;
}

}  // namespace

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

bool gemm_times_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("PARALLEL_GEMM_TIMES");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

void gemm_times_add(const char* route, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, bool bias,
                    double seconds, double cpu_seconds) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  const Key key{route, m, n, k, trans_a, trans_b, bias};
  t.seconds[key].push_back(seconds);
  t.cpu_seconds[key].push_back(cpu_seconds);
}

}  // namespace parallel::cpu
