#pragma once
// Which GEMM implementation runs a 16-bit problem: our mma.sync kernel (gemm_mma.cu) or cuBLASLt.
// Plain, header-only C++ (no CUDA): the rule is a pure function, unit-tested on the CPU
// (tests/unit/test_gemm_rule.cpp), and the trainer reads PARALLEL_GEMM in a build without CUDA too.
//
// Why a fixed rule and not timing: cuda_ops.hpp promises that every op is deterministic, and ranks
// of one job must compute alike. Timing each shape on first use (what PARALLEL_GEMM=auto did) lets
// two ranks, or two runs, pick different implementations whenever the timings are close, and the
// two differ in fp32 summation order. The rule below depends only on the problem and the GPU's
// compute capability, so every rank and every run choose the same. Timing is still there on request
// (PARALLEL_GEMM=timed), for measuring what the rule should be; the trainer refuses it on more than
// one rank, where per-rank timings could disagree.
#include <climits>
#include <cstdint>
#include <string>

#include "parallel/dtype.hpp"

namespace parallel {
// parallel/error.hpp's, declared without its fmt-based header: .cu files include this one.
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
}  // namespace parallel

namespace parallel::kernels {

enum class GemmMode : uint8_t { Auto, Ours, CublasLt, Timed };
enum class GemmImpl : uint8_t { Ours, CublasLt };

// "ours" / "cublaslt" / "auto" / "timed" -> the mode; null or "" -> Auto. Anything else throws
// parallel::Error naming PARALLEL_GEMM and the allowed values.
inline GemmMode parse_gemm_mode(const char* value) {
  if (value == nullptr || *value == '\0') return GemmMode::Auto;
  const std::string v(value);
  if (v == "auto") return GemmMode::Auto;
  if (v == "ours") return GemmMode::Ours;
  if (v == "cublaslt") return GemmMode::CublasLt;
  if (v == "timed") return GemmMode::Timed;
  throw_error(
      __FILE__, __LINE__,
      "PARALLEL_GEMM='" + v + "' is not a valid GEMM choice: allowed values are ours, cublaslt, auto, timed");
}

inline const char* gemm_mode_name(GemmMode mode) {
  switch (mode) {
    case GemmMode::Ours:
      return "ours";
    case GemmMode::CublasLt:
      return "cublaslt";
    case GemmMode::Timed:
      return "timed";
    case GemmMode::Auto:
      break;
  }
  return "auto";
}

// Whether a job of `ranks` processes may run with `mode`: timed lets each process choose by its own
// measurements, so ranks could compute differently; it is for one process only. The others are the
// same on every rank.
inline bool gemm_mode_allowed(GemmMode mode, int ranks) { return mode != GemmMode::Timed || ranks <= 1; }

// Our kernel takes int dimensions and at most 65535 row tiles of 128 (grid.y); see gemm_mma.cu.
inline bool gemm_ours_supports(int64_t m, int64_t n, int64_t k) {
  return m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && (m + 127) / 128 <= 65535;
}

// Everything the fixed choice may depend on: the problem and the device, never a measurement.
struct GemmProblem {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  DType dtype = DType::BF16;   // of a and b: BF16 or F16
  DType c_dtype = DType::F32;  // of c: F32 or dtype
  bool gelu = false;           // a GeLU epilogue (with or without a bias); a bias alone is no field:
                               // both candidates add it (cuBLASLt's CUBLASLT_EPILOGUE_BIAS)
  int arch = 90;               // compute capability, major * 10 + minor (sm_90: 90)
};

// Whether cuBLASLt's bias epilogue may take a bias of c's 16-bit dtype as it is (ops::gemm_bias on
// 16-bit tensors; otherwise the bias is widened to fp32 for our kernel's epilogue). Only where it was
// seen to round c once: a linear layer's forward, a @ b^T, with every dimension a multiple of 8 and
// every pointer (a, b, c, bias) 16-byte aligned (the op table's 24x64x16 row, which a double
// rounding fails, and GemmDispatch's 64x96x256; H200, cuBLAS 13.1, 2026-11-28). On the op table's
// unaligned bf16 37x29x41 a @ b it rounded the product to bf16 before adding the bias (201 ulp
// off). Widen this where measurements show more layouts rounding once.
inline bool gemm_bias16_in_cublaslt(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                    bool pointers_16_byte_aligned) {
  return !trans_a && trans_b && m % 8 == 0 && n % 8 == 0 && k % 8 == 0 && k > 0 && pointers_16_byte_aligned;
}

// The choice of PARALLEL_GEMM=auto (the default).
//   - a GeLU epilogue or k == 0: ours, the only one that implements them (cuBLASLt's GeLU epilogue
//     is not wired; it rejects k = 0). A bias alone goes where the call would go without it
//     (cuBLASLt's bias epilogue; ours when cuBLASLt has no algorithm for the call, gemm_dispatch.cu);
//   - everything else: cuBLASLt. Our kernel has never been measured against it on a GPU
//     (docs/gpu.md); cuBLASLt has Hopper wgmma kernels where ours is the portable sm_80 design, and
//     it also takes what ours cannot (below sm_80, a dimension over INT_MAX, m over 65535 tiles).
//     The vendor library is the safer default until measured figures (bench_cuda_kernels,
//     PARALLEL_GEMM=timed) show shapes and architectures where ours wins; those become rows here,
//     keyed on the fields of GemmProblem (shape, transposition, dtypes, arch) and nothing else.
// Same inputs, same answer: no state, no timing, no environment.
inline GemmImpl gemm_rule(const GemmProblem& p) {
  if (p.gelu || p.k == 0) return GemmImpl::Ours;
  return GemmImpl::CublasLt;
}

}  // namespace parallel::kernels
