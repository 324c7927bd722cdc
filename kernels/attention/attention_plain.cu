// The plain attention path: batched cuBLAS products around a row-softmax kernel. Contract and
// algorithm in attention_plain.hpp. Written to be checked by reading: every GEMM below states the
// row-major product it computes and how it maps onto cuBLAS's column-major one.
//
// Column-major view of our layouts: a row-major [rows, cols] matrix whose rows are `ld` elements apart
// is, for cuBLAS, a column-major [cols, rows] matrix with leading dimension ld. Head (bi, h) of
// q [s, b, hq, d] is therefore the column-major d x s matrix at q + (bi * hq + h) * d with
// ld = b * hq * d (= Q^T); likewise k with hkv, v with hkv and dv, out / dout with hq and dv, and the
// [s, s] workspaces at ld = s (S^T). Batching over bk = bi * hkv + kv head: k advances by d per bk
// (v by dv), and query head h = kv * g + r (g = hq / hkv, r the head's rank in its group) sits at
// (bk * g + r) * d in q (* dv in out), so for a fixed r the query heads advance by g * d (g * dv)
// per bk. One strided-batched call per r covers every (bi, kv head).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "attention/attention_plain.hpp"
#include "attention/attention_tiles.hpp"
#include "cuda/common.cuh"

namespace parallel::kernels {

// ---- path selection -----------------------------------------------------------------------------

AttentionPath parse_attention_path(const char* value) {
  const std::string v = value ? value : "";
  if (v.empty() || v == "flash") return AttentionPath::Flash;
  if (v == "plain") return AttentionPath::Plain;
  throw_error(__FILE__, __LINE__,
              "PARALLEL_ATTENTION='" + v + "' is not a valid attention path: allowed values are flash, plain");
}

namespace {
// -1: not overridden; otherwise the AttentionPath set by set_attention_path.
std::atomic<int> g_override{-1};
}  // namespace

AttentionPath attention_path() {
  const int o = g_override.load(std::memory_order_relaxed);
  if (o >= 0) return static_cast<AttentionPath>(o);
  static const AttentionPath from_env = parse_attention_path(std::getenv("PARALLEL_ATTENTION"));
  return from_env;
}

void set_attention_path(AttentionPath path) { g_override.store(static_cast<int>(path)); }

const char* attention_path_name(AttentionPath path) { return path == AttentionPath::Plain ? "plain" : "flash"; }

namespace {

// ---- cuBLAS --------------------------------------------------------------------------------------

[[noreturn]] void throw_cublas(const char* file, int line, const char* call, cublasStatus_t st) {
  throw_error(file, line,
              std::string(call) + " failed: " + cublasGetStatusName(st) + " (" + cublasGetStatusString(st) + ")");
}
#define PLAIN_CUBLAS_CHECK(call)                                                                   \
  do {                                                                                             \
    const cublasStatus_t plain_st_ = (call);                                                       \
    if (plain_st_ != CUBLAS_STATUS_SUCCESS) throw_cublas(__FILE__, __LINE__, #call, plain_st_); \
  } while (0)

// One handle per device, created on first use and leaked on purpose (usable until exit). A handle
// carries its stream, so each op holds the mutex from cublasSetStream to its last GEMM.
std::mutex g_cublas_mutex;
cublasHandle_t handle_for(int device) {
  static std::vector<cublasHandle_t> handles;
  if (static_cast<int>(handles.size()) <= device) handles.resize(device + 1, nullptr);
  if (!handles[device]) {
    PLAIN_CUBLAS_CHECK(cublasCreate(&handles[device]));
    // Strict fp32: no TF32 (CUBLAS_COMPUTE_32F below asks for it as well).
    PLAIN_CUBLAS_CHECK(cublasSetMathMode(handles[device], CUBLAS_DEFAULT_MATH));
  }
  return handles[device];
}

cudaDataType cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: break;
  }
  throw_error(__FILE__, __LINE__, "plain attention: inputs must be fp32, bf16 or fp16");
}

std::size_t type_size(DType t) { return t == DType::F32 ? 4 : 2; }

// Pointer `elems` elements of a `dtype` array past p.
const void* at(const void* p, int64_t elems, DType t) {
  return static_cast<const char*>(p) + elems * static_cast<int64_t>(type_size(t));
}

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw_error(__FILE__, __LINE__, std::string("plain attention: ") + what + " exceeds INT_MAX for cuBLAS");
  return static_cast<int>(v);
}

// Column-major C[m, n] (fp32, ldc, stride sc) = alpha op(A) op(B) + beta C over `batch` matrices;
// A, B of type `ab`. op(A) is m x k, op(B) is k x n.
struct Gemm {
  cublasHandle_t h;
  DType ab;
  void operator()(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
                  int64_t sa, const void* b, int64_t ldb, int64_t sb, float beta, float* c, int64_t ldc,
                  int64_t sc, int64_t batch) const {
    if (m == 0 || n == 0 || batch == 0) return;
    PLAIN_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, to_int(m, "m"), to_int(n, "n"),
        to_int(k, "k"), &alpha, a, cuda_type(ab), to_int(lda, "lda"), sa, b, cuda_type(ab), to_int(ldb, "ldb"),
        sb, &beta, c, CUDA_R_32F, to_int(ldc, "ldc"), sc, to_int(batch, "batch"), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
  }
};

// ---- kernels -------------------------------------------------------------------------------------

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }

constexpr int kRowThreads = 256;

// Local row `row` of a chunk's [rows, s] workspace is query i = row % s of head
// bh = (bk0 + row / s) * g + r (the chunk covers (b, kv head) pairs bk0 .. and query rank r), batch
// element bh / hq. The row sees keys [first(row), end(row)) (attention_tiles.hpp).
struct Rows {
  int64_t s, bk0, g, r, hq;
  AttentionBounds mask;
  __device__ int64_t bh(int64_t row) const { return (bk0 + row / s) * g + r; }
  __device__ int64_t i(int64_t row) const { return row % s; }
  __device__ int64_t first(int64_t row) const { return first_key(mask, bh(row) / hq, i(row)); }
  __device__ int64_t end(int64_t row) const { return end_key(mask, i(row), s); }
};

// One block per row of the [rows, s] fp32 scores x (already scaled). In place:
//   x_j <- exp(x_j - max) / sum for the visible keys, 0 for the masked ones;
//   p16_j <- the same rounded to T (when p16 is not null: 16-bit inputs);
//   lse[bh * s + i] <- max + log(sum) (when lse is not null: the forward).
// With lse_in (the backward) the row is normalised by the given log-sum-exp instead,
// x_j <- exp(x_j - lse_in[bh * s + i]): the saved statistic, which under ring attention is that of
// the whole row across every block of keys, not of this block alone (ops.hpp, attention_merge).
template <typename T>
__global__ void softmax_rows(float* x, T* p16, float* lse, const float* lse_in, Rows rows) {
  __shared__ float shared[32];
  using cuda::detail::block_reduce;
  const int64_t row = blockIdx.x, s = rows.s, j0 = rows.first(row), n = rows.end(row);
  float* xr = x + row * s;
  if (lse_in) {
    const float l = lse_in[rows.bh(row) * s + rows.i(row)];
    for (int64_t j = threadIdx.x; j < s; j += blockDim.x) {
      const float p = j >= j0 && j < n ? expf(xr[j] - l) : 0.0f;
      xr[j] = p;
      if (p16) store(p16, row * s + j, p);
    }
    return;
  }
  float mx = -INFINITY;
  for (int64_t j = j0 + threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, xr[j]);
  mx = block_reduce(mx, shared, cuda::detail::MaxOp{}, -INFINITY);
  float sum = 0.0f;
  for (int64_t j = j0 + threadIdx.x; j < n; j += blockDim.x) sum += expf(xr[j] - mx);
  sum = block_reduce(sum, shared, cuda::detail::SumOp{}, 0.0f);
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // a row that sees no key: P = 0, lse = -inf
  for (int64_t j = threadIdx.x; j < s; j += blockDim.x) {
    const float p = j >= j0 && j < n ? expf(xr[j] - mx) * inv : 0.0f;
    xr[j] = p;
    if (p16) store(p16, row * s + j, p);
  }
  if (lse && threadIdx.x == 0)
    lse[rows.bh(row) * s + rows.i(row)] = sum > 0.0f ? mx + logf(sum) : -INFINITY;
}

// One block per row. p: the row's probabilities (fp32), dp: dO V^T for the row, in place:
//   dp_j <- p_j * (dp_j - D), D = sum_e dout_e * out_e over the row's dv values (dout and out of T);
//   ds16_j <- the same rounded to T (when not null).
// dout, out: [s, b, hq, dv]; query i of head bh is at (i * b * hq + bh) * dv.
template <typename T>
__global__ void softmax_grad_rows(const float* p, float* dp, T* ds16, const T* dout, const T* out, int64_t bhq,
                                  int64_t d, Rows rows) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x, s = rows.s;
  const int64_t base = (rows.i(row) * bhq + rows.bh(row)) * d;
  float dsum = 0.0f;
  for (int64_t e = threadIdx.x; e < d; e += blockDim.x) dsum += load(dout, base + e) * load(out, base + e);
  dsum = cuda::detail::block_reduce(dsum, shared, cuda::detail::SumOp{}, 0.0f);
  const float* pr = p + row * s;
  float* dr = dp + row * s;
  for (int64_t j = threadIdx.x; j < s; j += blockDim.x) {
    const float g = pr[j] * (dr[j] - dsum);  // masked keys: p = 0, so 0
    dr[j] = g;
    if (ds16) store(ds16, row * s + j, g);
  }
}

// The device type of a 16-bit DType (float for fp32: then no 16-bit copies are made).
template <typename F>
void with_type(DType t, F&& f) {
  if (t == DType::BF16)
    f(static_cast<__nv_bfloat16*>(nullptr));
  else if (t == DType::F16)
    f(static_cast<__half*>(nullptr));
  else
    f(static_cast<float*>(nullptr));
}

constexpr std::size_t kChunkBytes = std::size_t{512} << 20;

// (b, kv head) pairs per chunk: workspace bytes_per_score * s^2 each, at most kChunkBytes in all,
// at least one.
int64_t chunk_pairs(int64_t pairs, int64_t s, std::size_t bytes_per_score) {
  const double per = static_cast<double>(bytes_per_score) * static_cast<double>(s) * static_cast<double>(s);
  const int64_t fit = static_cast<int64_t>(static_cast<double>(kChunkBytes) / std::max(per, 1.0));
  return std::clamp<int64_t>(fit, 1, std::max<int64_t>(pairs, 1));
}

void check_shape(const AttentionShape& sh, const AttentionBounds& mask) {
  CUDA_OPS_REQUIRE(
      sh.s >= 0 && sh.b >= 0 && sh.d >= 0 && sh.dv >= 0 && sh.hq > 0 && sh.hkv > 0 && sh.hq % sh.hkv == 0,
      "plain attention: need hq % hkv == 0 and non-negative sizes");
  const char* why = attention_bounds_error(mask);
  if (why != nullptr) throw_error(__FILE__, __LINE__, why);
}

}  // namespace

void attention_plain_forward(const void* q, const void* k, const void* v, DType dtype, float* out, float* lse,
                             const AttentionShape& sh, const AttentionBounds& mask, float scale,
                             void* stream_ptr) {
  check_shape(sh, mask);
  const int64_t s = sh.s, d = sh.d, dv = sh.value_dim(), g = sh.hq / sh.hkv, pairs = sh.b * sh.hkv;
  const int64_t ldq = sh.b * sh.hq * d, ldk = sh.b * sh.hkv * d, ldv = sh.b * sh.hkv * dv,
                ldo = sh.b * sh.hq * dv;
  if (s == 0 || pairs == 0) return;
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  const bool is16 = dtype != DType::F32;
  const int device = cuda::detail::current_device();
  std::lock_guard<std::mutex> lock(g_cublas_mutex);
  cublasHandle_t h = handle_for(device);
  PLAIN_CUBLAS_CHECK(cublasSetStream(h, stream));
  const Gemm gemm{h, dtype};

  const int64_t chunk = chunk_pairs(pairs, s, 4 + (is16 ? 2 : 0));
  cuda::detail::Scratch scores(static_cast<std::size_t>(chunk * s * s) * 4, stream);
  cuda::detail::Scratch probs16(is16 ? static_cast<std::size_t>(chunk * s * s) * 2 : 0, stream);
  float* S = scores.as<float>();
  for (int64_t bk0 = 0; bk0 < pairs; bk0 += chunk) {
    const int64_t nb = std::min(chunk, pairs - bk0);
    for (int64_t r = 0; r < g; r++) {
      const int64_t qoff = (bk0 * g + r) * d, koff = bk0 * d, voff = bk0 * dv, ooff = (bk0 * g + r) * dv;
      // S [s_q, s_k] (row-major, per pair) = scale Q K^T. Column-major: S^T (s_k x s_q, ld s) =
      // (K^T)^T Q^T with K^T = k as d x s_k (ld ldk), Q^T = q as d x s_q (ld ldq).
      if (d == 0)
        CUDA_OPS_CHECK(cudaMemsetAsync(S, 0, static_cast<std::size_t>(nb * s * s) * 4, stream));
      else
        gemm(true, false, s, s, d, scale, at(k, koff, dtype), ldk, d, at(q, qoff, dtype), ldq, g * d, 0.0f, S, s,
             s * s, nb);
      const Rows rows{s, bk0, g, r, sh.hq, mask};
      const void* p_operand = S;
      with_type(dtype, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        T* p16 = is16 ? probs16.as<T>() : nullptr;
        softmax_rows<T>
            <<<static_cast<unsigned>(nb * s), kRowThreads, 0, stream>>>(S, p16, lse, nullptr, rows);
        if (is16) p_operand = p16;
      });
      CUDA_OPS_LAUNCHED();
      // O [s_q, dv] = P V. Column-major: O^T (dv x s_q, ld ldo) = V^T P^T with V^T = v as dv x s_k
      // (ld ldv) and P^T = the workspace as s_k x s_q (ld s).
      gemm(false, false, dv, s, s, 1.0f, at(v, voff, dtype), ldv, dv, p_operand, s, s * s, 0.0f, out + ooff,
           ldo, g * dv, nb);
    }
  }
}

void attention_plain_backward(const void* dout, const void* q, const void* k, const void* v, const void* out,
                              const float* lse, DType dtype, float* dq, float* dk, float* dv,
                              const AttentionShape& sh, const AttentionBounds& mask, float scale,
                              void* stream_ptr) {
  check_shape(sh, mask);
  const int64_t s = sh.s, d = sh.d, dv_ = sh.value_dim(), g = sh.hq / sh.hkv, pairs = sh.b * sh.hkv;
  const int64_t ldq = sh.b * sh.hq * d, ldk = sh.b * sh.hkv * d, ldv = sh.b * sh.hkv * dv_,
                ldo = sh.b * sh.hq * dv_;
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  if (pairs == 0 || d == 0 || dv_ == 0) return;
  if (s == 0) return;
  const bool is16 = dtype != DType::F32;
  const int device = cuda::detail::current_device();
  std::lock_guard<std::mutex> lock(g_cublas_mutex);
  cublasHandle_t h = handle_for(device);
  PLAIN_CUBLAS_CHECK(cublasSetStream(h, stream));
  const Gemm gemm{h, dtype};

  const int64_t chunk = chunk_pairs(pairs, s, 8 + (is16 ? 4 : 0));
  const std::size_t n = static_cast<std::size_t>(chunk * s * s);
  cuda::detail::Scratch p_buf(n * 4, stream), ds_buf(n * 4, stream);
  cuda::detail::Scratch p16_buf(is16 ? n * 2 : 0, stream), ds16_buf(is16 ? n * 2 : 0, stream);
  float* P = p_buf.as<float>();
  float* dS = ds_buf.as<float>();
  for (int64_t bk0 = 0; bk0 < pairs; bk0 += chunk) {
    const int64_t nb = std::min(chunk, pairs - bk0);
    for (int64_t r = 0; r < g; r++) {
      const int64_t qoff = (bk0 * g + r) * d, koff = bk0 * d, voff = bk0 * dv_, ooff = (bk0 * g + r) * dv_;
      const float beta_kv = r == 0 ? 0.0f : 1.0f;  // dk, dv: the group's first head writes, the rest add
      const Rows rows{s, bk0, g, r, sh.hq, mask};
      // P = exp(scale Q K^T - lse), recomputed from the saved lse.
      gemm(true, false, s, s, d, scale, at(k, koff, dtype), ldk, d, at(q, qoff, dtype), ldq, g * d, 0.0f, P,
           s, s * s, nb);
      // dP [s_q, s_k] = dO V^T: the same mapping as S with (V, dO) for (K, Q), over dv.
      gemm(true, false, s, s, dv_, 1.0f, at(v, voff, dtype), ldv, dv_, at(dout, ooff, dtype), ldo, g * dv_,
           0.0f, dS, s, s * s, nb);
      const void* p_operand = P;
      const void* ds_operand = dS;
      with_type(dtype, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        T* p16 = is16 ? p16_buf.as<T>() : nullptr;
        T* ds16 = is16 ? ds16_buf.as<T>() : nullptr;
        softmax_rows<T>
            <<<static_cast<unsigned>(nb * s), kRowThreads, 0, stream>>>(P, p16, nullptr, lse, rows);
        CUDA_OPS_LAUNCHED();
        softmax_grad_rows<T><<<static_cast<unsigned>(nb * s), kRowThreads, 0, stream>>>(
            P, dS, ds16, static_cast<const T*>(dout), static_cast<const T*>(out), sh.b * sh.hq, dv_, rows);
        CUDA_OPS_LAUNCHED();
        if (is16) {
          p_operand = p16;
          ds_operand = ds16;
        }
      });
      // dV [s_k, dv] += P^T dO. Column-major: dV^T (dv x s_k, ld ldv) = dO^T P with dO^T = dout as
      // dv x s_q (ld ldo) and P = (workspace s_k x s_q, ld s)^T.
      gemm(false, true, dv_, s, s, 1.0f, at(dout, ooff, dtype), ldo, g * dv_, p_operand, s, s * s, beta_kv,
           dv + voff, ldv, dv_, nb);
      // dQ [s_q, d] = scale dS K. Column-major: dQ^T (d x s_q, ld ldq) = K^T dS^T with K^T = k as
      // d x s_k (ld ldk) and dS^T = the workspace (s_k x s_q, ld s).
      gemm(false, false, d, s, s, scale, at(k, koff, dtype), ldk, d, ds_operand, s, s * s, 0.0f, dq + qoff,
           ldq, g * d, nb);
      // dK [s_k, d] += scale dS^T Q. Column-major: dK^T (d x s_k, ld ldk) = Q^T dS with Q^T = q as
      // d x s_q (ld ldq) and dS = (workspace)^T.
      gemm(false, true, d, s, s, scale, at(q, qoff, dtype), ldq, g * d, ds_operand, s, s * s, beta_kv,
           dk + koff, ldk, d, nb);
    }
  }
}

}  // namespace parallel::kernels
