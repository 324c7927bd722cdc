#pragma once
// A machine for the planner's cost model (plan/cost_model.hpp): one description per machine, read
// from YAML under configs/hardware/, with no per-model or per-layout constants.
//
//   name: dgx_a100_80gb
//   device:                          # one accelerator (a CPU: one core, see below)
//     matmul_tflops: {bf16: 312, fp16: 312, fp32: 156}   # dense peak per dtype
//     matmul_efficiency: [[128, 0.2], [1024, 0.6], [8192, 0.8]]
//         # fraction of that peak a GEMM reaches, by its size: the geometric mean (m n k)^(1/3)
//         # of the GEMM (attention: of its per-head products); log-linear between the points,
//         # constant beyond the ends. One list serves every dtype; or one curve per dtype, each a
//         # fraction of that dtype's peak (fp32 required: the fallback):
//         #   matmul_efficiency: {fp32: [[32, 0.24], [192, 1]], bf16: [[32, 0.2], [768, 1]]}
//     vector_tflops: 19.5            # everything that is not a matmul (element-wise, norms)
//     op_tflops: {gelu_forward: 0.001, adamw_update_: 0.01}
//         # optional, per op kind: the rate of the op's counted FLOPs (ops.cpp's record_op), measured
//         # by running that kernel (calibrate_machine); it replaces vector_tflops (or, for
//         # attention, matmul peak x curve) for that op. Element-wise kernels differ by an order of
//         # magnitude per counted FLOP (a tanh against an add), which one vector rate cannot say.
//         # One map serves every dtype; or one map per dtype (a 16-bit kernel widens and narrows
//         # its blocks, and runs at its own rate):
//         #   op_tflops: {fp32: {gelu_forward: 0.006}, bf16: {gelu_forward: 0.004}}
//
// An op's dtype (plan::op_dtype, step_cost.hpp) is the first 16-bit or 8-bit floating dtype among its
// operands, read then written, else fp32: the kernel runs its 16-bit variant when any operand is 16-bit
// (AdamW writing the model's bf16 copy, cross-entropy on bf16 logits). Its curve is that dtype's, else
// fp32's; its kernel rate that dtype's entry for the op, else fp32's entry, else the matmul peak of
// the dtype x its curve (matmul ops) or vector_tflops (the rest).
//     memory_bandwidth_GBps: 1600    # achievable, one direction summed over read + write
//     op_overhead_us: 4              # per op: launch / dispatch (a CPU: also the output's allocation)
//     op_fixed_us: {attention_forward: 5, attention_backward: 7}
//         # optional, per op kind: a kernel's own fixed cost beyond op_overhead_us, in microseconds per
//         # call, and for attention per (batch x head) pair, the unit its work is split into; measured
//         # by calibrate_machine on a small operand (the kernel's time there less its work at its
//         # op_tflops rate). One map for every dtype. Absent: 0
//     host_us_per_op: 1.5
//         # optional: the caller's host code per op issued, outside the op (a layer's views, the
//         # bookkeeping of its saved tensors, the freeing of what it no longer needs); measured by
//         # calibrate_machine as a small GPT chunk's forward and backward less its ops' own time,
//         # over its op count. Time-shared as the op overhead is. Absent (the GPU descriptions,
//         # whose host code runs ahead of the device's kernels): 0
//     memory_GiB: 80
//   node:
//     devices: 8                     # devices per node (a CPU: its cores)
//   links:
//     node:    {bandwidth_GBps: 240, latency_us: 3, shared_by: 1}    # between devices of a node
//     cluster: {bandwidth_GBps: 23, latency_us: 6, shared_by: 1}     # across nodes
//
// Optional, measured terms (calibrate_machine; absent in the GPU descriptions, whose collectives
// follow the ring / tree formulas from latency_us):
//
//   links:
//     node: {bandwidth_GBps: 7.8, latency_us: 0.5, shared_by: 1,
//            collective_us: {all_reduce: [[2, 3.1], [4, 12], [8, 35]], all_gather: [...], reduce_scatter:
//            [...]}}
//         # the median time of one small collective (a few bytes per rank) by group size: replaces
//         # the formula's latency part (2 (n-1) latency_us for a ring all-reduce) for that kind;
//         # linear between the sizes, proportional to n - 1 beyond the largest
//     node: {..., bus_GBps: {all_reduce: [[65536, 1.2], [67108864, 0.7]], reduce_scatter: [...],
//                            all_gather: [...], send: [...]}}
//         # the bus bandwidth (nccl-tests' busbw: the formula's B / bw term is factor x B / busbw,
//         # factor 2 (n-1)/n for all_reduce, (n-1)/n for reduce_scatter and all_gather, 1 for a
//         # send) that a call of that kind reaches by message size (the whole tensor's bytes, as
//         # in the formulas): measured as the step issues calls (asynchronous, then waited),
//         # beyond the small call's time. Replaces bandwidth_GBps for that kind; linear in
//         # log(bytes) between the sizes, flat beyond the ends. A CPU's large collectives are
//         # bound by memory (the reduction, the library's temporary buffers and their page
//         # faults), not by the link: 0.7-1.3 GB/s for a 56 MB all-reduce where a cache-resident
//         # 4 MiB ping-pong reaches 10. A kind's table serves every group size and dtype; or per
//         # group size it was measured on (ranks sharing cores and memory run slower per byte):
//         #   bus_GBps: {all_reduce: {2: [[65536, 3.2], ...], 4: [...], 8: [...]}, send: [...]}
//         # linear in the group size between measured sizes, the nearest measured size's table
//         # below and beyond them (a plain list is the table of size 2, so of every size); and per
//         # dtype of the tensor (a 16-bit reduction runs MPI's user-defined op; fp32 required, the
//         # fallback of a kind a dtype has no table for):
//         #   bus_GBps: {fp32: {all_reduce: ..., send: ...}, bf16: {all_reduce: ..., reduce_scatter: ...}}
//     node: {..., async_progress: false}
//         # whether an asynchronous call makes progress while its rank computes (default true:
//         # NCCL's streams). MPI without a progress thread advances a nonblocking call only inside
//         # MPI calls, so a call issued before compute runs when its rank waits for it.
//   node:
//     devices: 2
//     oversubscribed_wait_us: [[2, 40], [4, 120]]
//         # ranks per device -> the extra time each blocking wait costs when ranks time-share the
//         # devices (the blocked rank spins 50 us, then sleeps, and resumes only when the scheduler
//         # gives it a core back); linear between the points, flat beyond the ends; 0 when not
//         # oversubscribed
//     subgroup_wait_us: [[2, 500], [4, 50]]
//         # ranks per device -> the extra time each blocking wait on a group smaller than the
//         # node's ranks costs (a tp / pp / dp pair inside a larger job) when ranks time-share the
//         # devices: the waiter sleeps (the communicator's pacer), and its partner shares a core
//         # with ranks outside the pair, so the wait lasts until the partner has had its turn.
//         # Measured (calibrate_machine): all ranks in pairs, each pair computing then all-reducing
//         # at once; the step (the slowest rank's time over the calls, per call) beyond the compute
//         # at the shared rate and the two-rank call measured with a core each. oversubscribed_wait_us is then the figure of the waits on
//         # groups of all the node's ranks (whose measured call already holds the others' turns).
//         # Linear between the points, flat beyond the ends; absent: oversubscribed_wait_us for
//         # every group; 0 when not oversubscribed (a device per rank, as on a DGX node: nobody
//         # else holds the partner's device, whatever the file says)
//     shared_core_slowdown: [[2, 1.1], [4, 1.25]]
//         # ranks per device -> how much longer each op runs (in the rank's own CPU time) when
//         # that many ranks time-share a device: their data evicts each other's from the core's
//         # caches; linear between the points from (1, 1), flat beyond the ends; each >= 1;
//         # applied only when oversubscribed. That list serves every op; or per working set
//         # (the op's bytes read + written, > 0), as calibrate_machine measures it:
//         #   shared_core_slowdown: {262144: [[2, 1.3], [4, 1.3]], 4194304: [[2, 1.05], [4, 1.05]]}
//         # an op small enough to live in the core's caches loses them at every switch, a large
//         # one streams from memory either way; linear in log(bytes) between the sizes, the
//         # nearest size's curve beyond them
//
// A link's bandwidth is one direction, per link; `shared_by` devices share one link, so each gets
// bandwidth / shared_by when all send at once (a collective's ranks all do).
//
// Ranks and devices: a job places ranks_per_node ranks on each node, one device each. When that
// exceeds node.devices, the devices are time-shared: a rank gets devices / ranks_per_node of one
// device's compute and memory bandwidth (the cost model's share). A CPU's device is one core, and
// its ranks run one OpenMP thread each (calibrate_machine): four ranks on two cores get half a core
// each.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "parallel/dtype.hpp"

namespace parallel {

struct LinkLevel {
  double bandwidth_GBps = 0;  // one direction, one link (10^9 bytes / s)
  double latency_us = 0;      // per message (per ring / tree step)
  int shared_by = 1;          // devices sharing one such link
  // Measured seconds of one small collective by group size, per kind (all_reduce, all_gather,
  // reduce_scatter): (group size, microseconds), increasing size. Empty: the formula's latency.
  std::map<std::string, std::vector<std::pair<double, double>>> collective_us;
  // Measured bus bandwidth by message size: (bytes, GB/s), increasing bytes; per dtype, per kind
  // (all_reduce, reduce_scatter, all_gather, send) and per group size (> 1) it was measured on.
  // The YAML's single forms are fp32's entry (the dtype fallback) and group size 2's (a table at
  // one size serves every size). Empty: bandwidth_GBps for every kind.
  using BusTable = std::vector<std::pair<double, double>>;
  using BusTables = std::map<std::string, std::map<int, BusTable>>;  // kind -> group size -> table
  std::map<DType, BusTables> bus_GBps;
  // Whether an asynchronous call progresses while its rank computes (false: it runs at its wait).
  bool async_progress = true;

  // The table's time for `kind` on `n` ranks in seconds, or < 0 when the table has no such kind.
  double collective_latency_s(const std::string& kind, int n) const;
  // The bus bandwidth (bytes / s) of a `kind` call of `bytes` in `dtype` on `ranks` ranks
  // (all_to_all(v) and broadcast use all_gather's tables, recv and batch_p2p send's): the dtype's
  // table for the kind, else fp32's, else bandwidth_GBps / shared_by. Of that kind's tables by
  // group size: the one size's when there is one, else linear in the group size between the two
  // measured sizes around `ranks`, the nearest size's below the smallest and beyond the largest.
  double bus_bandwidth_Bps(const std::string& kind, double bytes, int ranks = 2,
                           DType dtype = DType::F32) const;
};

struct HardwareDescription {
  std::string name;
  std::string file;  // where it was read from ("" when built in code)
  using EfficiencyCurve = std::vector<std::pair<double, double>>;  // (GEMM size, fraction), increasing size
  std::map<DType, double> matmul_tflops;
  // Per dtype; the YAML's single list is fp32's entry (which every dtype without its own falls back to).
  std::map<DType, EfficiencyCurve> matmul_efficiency;
  double vector_tflops = 0;
  // Per dtype, per op kind (may be empty); the YAML's single map is fp32's entry, as above.
  std::map<DType, std::map<std::string, double>> op_tflops;
  double memory_bandwidth_GBps = 0;
  double op_overhead_us = 0;
  // Per op kind, microseconds per call (attention: per batch x head pair) beyond op_overhead_us.
  std::map<std::string, double> op_fixed_us;
  // The caller's host code per op, outside the op (device.host_us_per_op; 0: none).
  double host_us_per_op = 0;
  double memory_GiB = 0;
  int devices_per_node = 1;
  // (ranks per device, microseconds): the extra cost of a blocking wait on an oversubscribed
  // node, increasing ranks per device. Empty: none.
  std::vector<std::pair<double, double>> oversubscribed_wait_us;
  // The same for a wait on a group smaller than the node's ranks (node.subgroup_wait_us). Empty:
  // oversubscribed_wait_us.
  std::vector<std::pair<double, double>> subgroup_wait_us;
  // Working-set bytes (an op's bytes read + written) -> (ranks per device, factor >= 1): an op's
  // time when ranks time-share a device over its time alone (node.shared_core_slowdown), increasing
  // ranks per device. The YAML's single list is the entry at 0 bytes (one curve for every size).
  // Empty: 1.
  using SlowdownCurve = std::vector<std::pair<double, double>>;
  std::map<double, SlowdownCurve> shared_core_slowdown;
  LinkLevel node_link;     // within a node
  LinkLevel cluster_link;  // across nodes

  // The fraction of `dtype`'s matmul peak for a GEMM of geometric-mean size `size`: the dtype's
  // curve, else fp32's; 1 without a curve.
  double matmul_efficiency_at(double size, DType dtype = DType::F32) const;
  // Peak matmul FLOP/s for `dtype`: its entry, else fp32's (integer and fp8 fall back to it).
  double matmul_flops(DType dtype) const;
  // The measured TFLOP/s of kernel `op` in `dtype`: its entry, else fp32's entry; 0 when neither.
  double op_tflops_for(const std::string& op, DType dtype) const;
  // The fixed seconds of one call of `op` beyond op_overhead_us: op_fixed_us[op] x `units` (1, or the
  // batch x head pairs of an attention call); 0 when the description has no entry.
  double op_fixed_s(const std::string& op, double units = 1) const;
  // The extra seconds of one blocking wait at `ranks_per_device` (> 1: oversubscribed), else 0.
  double oversubscribed_wait_s(double ranks_per_device) const;
  // The extra seconds of one blocking wait on a group smaller than the node's ranks at
  // `ranks_per_device` (> 1), else 0: subgroup_wait_us, else oversubscribed_wait_s.
  double subgroup_wait_s(double ranks_per_device) const;
  // The factor on the time of an op that reads and writes `bytes` at `ranks_per_device` (> 1:
  // oversubscribed), else 1: each working set's curve at ranks_per_device, linear in log(bytes)
  // between the measured sizes, the nearest size's beyond them.
  double shared_core_slowdown_at(double ranks_per_device, double bytes = 0) const;
};

// Parses and validates a description; errors name the file, the key and the rule
// ("dgx.yaml: device.memory_bandwidth_GBps must be a number > 0, got -3").
HardwareDescription parse_hardware(const std::string& yaml_text, const std::string& file_name);
HardwareDescription load_hardware(const std::string& path);
// The description's YAML (what the calibration tool writes; parse_hardware reads it back).
std::string hardware_yaml(const HardwareDescription& hw, const std::string& comment = {});

}  // namespace parallel
