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

DType op_dtype(const OpEvent& e) {
  for (DType t : e.dtypes)
    if (is_floating(t) && t != DType::F32) return t;
  return DType::F32;
}

CostModel::CostModel(HardwareDescription hw, int world_size, int ranks_per_node, CostOptions options)
    : hw_(std::move(hw)), options_(options), world_size_(world_size) {
  PARALLEL_CHECK(options_.attention_dropout >= 0 && options_.attention_dropout < 1,
                 "CostModel: attention_dropout = {} must be in [0, 1)", options_.attention_dropout);
  PARALLEL_CHECK(world_size >= 1, "CostModel: world size {} must be >= 1", world_size);
  ranks_per_node_ = ranks_per_node > 0 ? ranks_per_node : std::min(world_size, hw_.devices_per_node);
  share_ = std::min(1.0, static_cast<double>(hw_.devices_per_node) / ranks_per_node_);
}

bool CostModel::is_matmul(const OpEvent& e) const {
  return e.op == "gemm" || e.op == "gemm_bias" || e.op == "attention_forward" || e.op == "attention_backward";
}

double CostModel::kernel_seconds(double flops, double bytes, DType dtype, double matmul_size) const {
  const double bw = hw_.memory_bandwidth_GBps * 1e9 * share_;
  const double rate = matmul_size > 0
                          ? hw_.matmul_flops(dtype) * hw_.matmul_efficiency_at(matmul_size, dtype) * share_
                          : hw_.vector_tflops * 1e12 * share_;
  return ((hw_.op_overhead_us + hw_.host_us_per_op) * 1e-6 / share_ +
          std::max(rate > 0 ? flops / rate : 0.0, bytes / bw)) *
         shared_core_slowdown(bytes);
}

double fixed_cost_units(const OpEvent& e) {
  // Attention's first operand is q (forward) or dout (backward), both [s, b, heads, d]: the kernel
  // splits its work per (batch, head) pair, and each pair pays its setup.
  if ((e.op == "attention_forward" || e.op == "attention_backward") && !e.shapes.empty() &&
      e.shapes[0].size() == 4)
    return static_cast<double>(e.shapes[0][1] * e.shapes[0][2]);
  return 1.0;
}

double CostModel::unfused_attention_seconds(const OpEvent& e) const {
  const bool forward = e.op == "attention_forward";
  // forward reads q, k, v; backward reads dout, q, k, v, out, lse (ops.cpp's record order)
  const Shape& q = e.shapes[forward ? 0 : 1];
  const Shape& k = e.shapes[forward ? 1 : 2];
  const Shape& v = e.shapes[forward ? 2 : 3];
  const DType dtype = e.dtypes[forward ? 0 : 1];
  const double es = static_cast<double>(dtype_size(dtype));
  const double s = static_cast<double>(q[0]), b = static_cast<double>(q[1]),
               heads = static_cast<double>(q[2]);
  const double d = static_cast<double>(q[3]), sk = static_cast<double>(k[0]), dv = static_cast<double>(v[3]);
  const double n = b * heads * s * sk;  // scores
  const double q_bytes = s * b * heads * d * es,
               k_bytes = static_cast<double>(k[0] * k[1] * k[2] * k[3]) * es;
  const double v_bytes = static_cast<double>(v[0] * v[1] * v[2] * v[3]) * es,
               o_bytes = s * b * heads * dv * es;
  const double size = std::cbrt(s * sk * d), size_v = std::cbrt(s * sk * dv);
  const bool dropout = options_.attention_dropout > 0;
  double t = 0;
  if (forward) {
    t += kernel_seconds(2 * n * d, q_bytes + k_bytes + n * es, dtype, size);     // Q K^T
    t += kernel_seconds(5 * n, 2 * n * es, dtype, 0);                            // scale, mask, softmax
    if (dropout) t += kernel_seconds(2 * n, 2 * n * es + n, dtype, 0);           // dropout, its mask
    t += kernel_seconds(2 * n * dv, n * es + v_bytes + o_bytes, dtype, size_v);  // P V
    t += kernel_seconds(0, 2 * o_bytes, dtype, 0);                               // permute to [s, b, h]
    return t;
  }
  t += kernel_seconds(0, 2 * o_bytes, dtype, 0);                               // the gradient's permute
  t += kernel_seconds(2 * n * dv, o_bytes + v_bytes + n * es, dtype, size_v);  // dP = dO V^T
  if (dropout) t += kernel_seconds(n, 2 * n * es + n, dtype, 0);               // dropout backward
  t += kernel_seconds(2 * n * dv, n * es + o_bytes + v_bytes, dtype, size_v);  // dV = P^T dO
  t += kernel_seconds(4 * n, 3 * n * es, dtype, 0);                            // softmax backward
  t += kernel_seconds(2 * n * d, n * es + k_bytes + q_bytes, dtype, size);     // dQ = dS K
  t += kernel_seconds(2 * n * d, n * es + q_bytes + k_bytes, dtype, size);     // dK = dS^T Q
  return t;
}

double CostModel::op_seconds(const OpEvent& e) const {
  if (options_.attention == AttentionKernel::Unfused &&
      (e.op == "attention_forward" || e.op == "attention_backward"))
    return unfused_attention_seconds(e);
  const double bytes = static_cast<double>(e.bytes_read + e.bytes_written);
  const double bw = hw_.memory_bandwidth_GBps * 1e9 * share_;
  double rate = hw_.vector_tflops * 1e12 * share_;
  const DType dtype = op_dtype(e);
  if (is_matmul(e) && !e.dtypes.empty()) {
    double size = std::cbrt(std::max(1.0, e.flops / 2.0));
    if (e.op != "gemm" && e.op != "gemm_bias" && !e.shapes.empty() && e.shapes[0].size() == 4) {
      // q [s, b, heads, d]: per-head products of s x s_k x d
      const double s = static_cast<double>(e.shapes[0][0]), d = static_cast<double>(e.shapes[0][3]);
      size = std::cbrt(s * s * d);
    }
    rate = hw_.matmul_flops(dtype) * hw_.matmul_efficiency_at(size, dtype) * share_;
  }
  // The machine's measured rate of this very kernel in its dtype (else fp32's), where the
  // description has one.
  if (const double measured = hw_.op_tflops_for(e.op, dtype); measured > 0) rate = measured * 1e12 * share_;
  const double compute = rate > 0 ? e.flops / rate : 0.0;
  // The overhead, the caller's host code around the op and the fixed cost are the rank's own work
  // (on a CPU: its core's), so they are time-shared as its kernels are; and ranks that time-share
  // a core also evict each other's data from its caches, so the whole op runs slower, the more
  // so the more of its working set the caches held (shared_core_slowdown by the op's bytes, 1
  // where each rank has its device).
  return (((hw_.op_overhead_us + hw_.host_us_per_op) * 1e-6 + hw_.op_fixed_s(e.op, fixed_cost_units(e))) /
              share_ +
          std::max(compute, bytes / bw)) *
         shared_core_slowdown(bytes);
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
  const double b = static_cast<double>(e.bytes);
  // The measured bus bandwidth of this kind at this size, group size and dtype where the link has
  // one (calibrate_machine), else the link's bandwidth.
  const double bw = l.bus_bandwidth_Bps(e.kind, b, n, e.dtype), a = l.latency_us * 1e-6;
  // A measured small-collective time for this kind and group size (calibrate_machine) replaces the
  // formula's latency part; the bandwidth part stays the formula's.
  if (const double measured = l.collective_latency_s(e.kind, n); measured >= 0) {
    if (e.kind == "all_reduce") return measured + all_reduce_seconds(b, n, bw, 0);
    return measured + ring_gather_seconds(b, n, bw, 0);
  }
  if (e.kind == "all_reduce") return all_reduce_seconds(b, n, bw, a);
  if (e.kind == "reduce_scatter" || e.kind == "all_gather" || e.kind == "all_to_all" ||
      e.kind == "all_to_allv")
    return ring_gather_seconds(b, n, bw, a);
  if (e.kind == "broadcast") return b / bw + (n - 1) * a;
  if (e.kind == "barrier") return 2.0 * std::ceil(std::log2(static_cast<double>(n))) * a;
  PARALLEL_FAIL("CostModel: no cost formula for a collective of kind '{}'", e.kind);
}

double CostModel::oversubscribed_wait_s() const {
  if (!oversubscribed()) return 0;
  return hw_.oversubscribed_wait_s(static_cast<double>(ranks_per_node_) / hw_.devices_per_node);
}

double CostModel::oversubscribed_wait_s(int group_ranks) const {
  if (!oversubscribed()) return 0;
  if (group_ranks >= ranks_per_node_) return oversubscribed_wait_s();
  return hw_.subgroup_wait_s(static_cast<double>(ranks_per_node_) / hw_.devices_per_node);
}

double CostModel::shared_core_slowdown(double bytes) const {
  if (!oversubscribed()) return 1;
  return hw_.shared_core_slowdown_at(static_cast<double>(ranks_per_node_) / hw_.devices_per_node, bytes);
}

double CostModel::p2p_seconds(int64_t bytes, int a, int b) const {
  const LinkLevel& l = level({a, b});
  const double size = static_cast<double>(bytes);
  return l.latency_us * 1e-6 + size / l.bus_bandwidth_Bps("send", size);
}

bool CostModel::progresses_async(const CommEvent& e, int rank) const {
  if (e.kind == "send" || e.kind == "recv" || e.kind == "batch_p2p") {
    std::vector<int> ranks{rank};
    ranks.insert(ranks.end(), e.peers.begin(), e.peers.end());
    return level(ranks).async_progress;
  }
  return e.ranks.empty() ? true : level(e.ranks).async_progress;
}

std::string dimension_of(const std::string& group) {
  if (group == "tp" || group == "etp") return "tp";
  if (group == "cp") return "cp";
  if (group == "dp" || group == "dp_cp" || group == "edp" || group == "dp_shard" || group == "dp_replica")
    return "dp";
  if (group == "pp" || group == "embedding" || group == "model" || group == "expert_model" ||
      group == "world")
    return "pp";
  if (group == "ep") return "ep";
  PARALLEL_FAIL("step simulation: group '{}' has no parallel dimension (tp, cp, dp, pp, ep)", group);
}

}  // namespace parallel::plan
