// CostModel and the collective formulas (step_cost.hpp).
#include <algorithm>
#include <cmath>

#include "parallel/error.hpp"
#include "parallel/step_cost.hpp"

namespace parallel::plan {

double ring_all_reduce_seconds(double bytes, int n, double bw, double latency) {
  if (n <= 1) return 0.0;
  return 2.0 * (n - 1) / n * bytes / bw + 2.0 * (n - 1) * latency;
}

double tree_all_reduce_seconds(double bytes, int n, double bw, double latency) {
  if (n <= 1) return 0.0;
  return 2.0 * bytes / bw + 2.0 * std::ceil(std::log2(static_cast<double>(n))) * latency;
}

double all_reduce_seconds(double bytes, int n, double bw, double latency) {
  return std::min(ring_all_reduce_seconds(bytes, n, bw, latency),
                  tree_all_reduce_seconds(bytes, n, bw, latency));
}

double ring_gather_seconds(double bytes, int n, double bw, double latency) {
  if (n <= 1) return 0.0;
  return static_cast<double>(n - 1) / n * bytes / bw + (n - 1) * latency;
}

CostModel::CostModel(HardwareDescription hw, int world_size, int ranks_per_node)
    : hw_(std::move(hw)), world_size_(world_size) {
  PARALLEL_CHECK(world_size >= 1, "CostModel: world size {} must be >= 1", world_size);
  ranks_per_node_ = ranks_per_node > 0 ? ranks_per_node : std::min(world_size, hw_.devices_per_node);
  share_ = std::min(1.0, static_cast<double>(hw_.devices_per_node) / ranks_per_node_);
}

bool CostModel::is_matmul(const OpEvent& e) const {
  return e.op == "gemm" || e.op == "gemm_bias" || e.op == "attention_forward" || e.op == "attention_backward";
}

double CostModel::op_seconds(const OpEvent& e) const {
  const double bytes = static_cast<double>(e.bytes_read + e.bytes_written);
  const double bw = hw_.memory_bandwidth_GBps * 1e9 * share_;
  double rate = hw_.vector_tflops * 1e12 * share_;
  if (is_matmul(e) && !e.dtypes.empty()) {
    double size = std::cbrt(std::max(1.0, e.flops / 2.0));
    if (e.op != "gemm" && e.op != "gemm_bias" && !e.shapes.empty() && e.shapes[0].size() == 4) {
      // q [s, b, heads, d]: per-head products of s x s_k x d
      const double s = static_cast<double>(e.shapes[0][0]), d = static_cast<double>(e.shapes[0][3]);
      size = std::cbrt(s * s * d);
    }
    rate = hw_.matmul_flops(e.dtypes[0]) * hw_.matmul_efficiency_at(size) * share_;
  }
  const double compute = rate > 0 ? e.flops / rate : 0.0;
  return hw_.op_overhead_us * 1e-6 + std::max(compute, bytes / bw);
}

const LinkLevel& CostModel::level(const std::vector<int>& ranks) const {
  if (ranks.empty()) return hw_.node_link;
  const int node = ranks.front() / ranks_per_node_;
  for (int r : ranks)
    if (r / ranks_per_node_ != node) return hw_.cluster_link;
  return hw_.node_link;
}

double CostModel::collective_seconds(const CommEvent& e) const {
  const int n = static_cast<int>(e.ranks.size());
  if (n <= 1) return 0.0;
  const LinkLevel& l = level(e.ranks);
  const double bw = l.bandwidth_GBps * 1e9 / l.shared_by, a = l.latency_us * 1e-6;
  const double b = static_cast<double>(e.bytes);
  if (e.kind == "all_reduce") return all_reduce_seconds(b, n, bw, a);
  if (e.kind == "reduce_scatter" || e.kind == "all_gather" || e.kind == "all_to_all" ||
      e.kind == "all_to_allv")
    return ring_gather_seconds(b, n, bw, a);
  if (e.kind == "broadcast") return b / bw + (n - 1) * a;
  if (e.kind == "barrier") return 2.0 * std::ceil(std::log2(static_cast<double>(n))) * a;
  PARALLEL_FAIL("CostModel: no cost formula for a collective of kind '{}'", e.kind);
}

double CostModel::p2p_seconds(int64_t bytes, int a, int b) const {
  const LinkLevel& l = level({a, b});
  return l.latency_us * 1e-6 + static_cast<double>(bytes) / (l.bandwidth_GBps * 1e9 / l.shared_by);
}

std::string dimension_of(const std::string& group) {
  if (group == "tp" || group == "etp") return "tp";
  if (group == "cp") return "cp";
  if (group == "dp" || group == "dp_cp" || group == "edp") return "dp";
  if (group == "pp" || group == "embedding" || group == "model" || group == "expert_model" ||
      group == "world")
    return "pp";
  if (group == "ep") return "ep";
  PARALLEL_FAIL("step simulation: group '{}' has no parallel dimension (tp, cp, dp, pp, ep)", group);
}

}  // namespace parallel::plan
