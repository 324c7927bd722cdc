// GEMM through cuBLASLt: fp32 (CUBLAS_COMPUTE_32F, never TF32) for ops::gemm, and bf16 or fp16 inputs
// with fp32 accumulation and an fp32 or 16-bit output (of the inputs' type) for mixed precision
// (kernels::gemm_bf16_auto picks between these and our own mma kernel) and benchmarks.
//
// Row-major to column-major: a row-major [r, c] matrix is a column-major [c, r] one, so
// C = op(A) op(B) (row-major, [M, N]) is computed as C^T = op(B)^T op(A)^T in column-major terms:
// cuBLAS's "A" is our b, its "B" our a, its m = N, n = M, and each operand keeps its own
// transposition flag. Layouts describe the stored matrices: b stored [K, N] row-major is
// column-major [N, K] (ld N) used as is; b stored [N, K] (trans_b) is column-major [K, N] (ld K)
// used transposed; likewise a.
//
// One cuBLASLt handle per device (a handle is not tied to a stream), created on first use. The
// algorithm for each (shape, transposes, dtype, alignments) comes from the heuristic once and is
// cached. The workspace (32 MiB) comes from the caching allocator on the call's stream.
#include <cublasLt.h>

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/kernels.hpp"

namespace parallel {
namespace {

[[noreturn]] void throw_cublas(const char* file, int line, const char* call, cublasStatus_t st) {
  throw_error(
      file, line,
      std::string(call) + " failed: " + cublasLtGetStatusName(st) + " (" + cublasLtGetStatusString(st) + ")");
}

#define CUBLAS_CHECK(call)                                                                        \
  do {                                                                                            \
    const cublasStatus_t cublas_st_ = (call);                                                     \
    if (cublas_st_ != CUBLAS_STATUS_SUCCESS) throw_cublas(__FILE__, __LINE__, #call, cublas_st_); \
  } while (0)

constexpr std::size_t kWorkspaceBytes = 32u << 20;

cublasLtHandle_t handle_for(int device) {
  static std::mutex mutex;
  static std::vector<cublasLtHandle_t> handles;  // leaked on purpose: usable until process exit
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<int>(handles.size()) <= device) handles.resize(device + 1, nullptr);
  if (!handles[device]) CUBLAS_CHECK(cublasLtCreate(&handles[device]));
  return handles[device];
}

struct Key {
  int device;
  int64_t m, n, k;
  bool ta, tb;
  int dtype;    // cudaDataType of a and b
  int c_dtype;  // cudaDataType of c
  int align_a, align_b, align_c;
  bool beta_zero;
  int bias;        // CUBLASLT_EPILOGUE_BIAS: the bias's cudaDataType + 1; 0 without a bias
  int align_bias;  // of the bias pointer (1 without a bias)
  auto tie() const {
    return std::tie(device, m, n, k, ta, tb, dtype, c_dtype, align_a, align_b, align_c, beta_zero, bias,
                    align_bias);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

int alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

// RAII for the descriptors of one call.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~Descs() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Row-major c[m, n] = alpha op(a)[m, k] op(b)[k, n] + beta c (+ bias[n]) with a, b of `in_type`, c of
// `c_type` (fp32, or in_type: cuBLASLt forms the result in fp32, the scale type, and rounds it into
// c once). bias: nullptr, or a vector of bias_type added by CUBLASLT_EPILOGUE_BIAS (cuBLAS's rows
// are our columns: one value per column n, as ours). False, with nothing run, when cuBLASLt has no
// algorithm for a call with a bias (the caller runs our kernel instead); without one that throws.
bool lt_gemm(const void* a, bool trans_a, const void* b, bool trans_b, void* c, int64_t m, int64_t n,
             int64_t k, float alpha, float beta, cudaDataType_t in_type, cudaDataType_t c_type,
             cudaStream_t stream, const void* bias = nullptr, cudaDataType_t bias_type = CUDA_R_32F) {
  if (m == 0 || n == 0) return true;
  const int device = cuda::detail::current_device();
  cublasLtHandle_t handle = handle_for(device);
  Descs d;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // cuBLAS "A" = our b, "B" = our a (column-major view, see the top of the file).
  const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  if (bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                sizeof bias_type));
  }
  // Stored shapes, column-major (rows, cols, ld).
  if (trans_b)
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, in_type, k, n, k));
  else
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, in_type, n, k, n));
  if (trans_a)
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, in_type, m, k, m));
  else
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, in_type, k, m, k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, c_type, n, m, n));

  const Key key{device,
                m,
                n,
                k,
                trans_a,
                trans_b,
                static_cast<int>(in_type),
                static_cast<int>(c_type),
                alignment(a),
                alignment(b),
                alignment(c),
                beta == 0.0f,
                bias != nullptr ? static_cast<int>(bias_type) + 1 : 0,
                bias != nullptr ? alignment(bias) : 1};
  static std::mutex mutex;
  static std::map<Key, cublasLtMatmulAlgo_t> cache;
  static std::set<Key> no_algo;  // bias calls cuBLASLt has no algorithm for (asked once)
  // Only a call with a bias may be declined: the heuristic knows nothing of the bias pointer's
  // alignment, so cuBLASLt can refuse such a call at launch (before running anything).
  auto decline = [&] {
    std::lock_guard<std::mutex> lock(mutex);
    no_algo.insert(key);
    return false;
  };
  cublasLtMatmulAlgo_t algo;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (no_algo.count(key)) return false;
    auto it = cache.find(key);
    if (it == cache.end()) {
      cublasLtMatmulPreference_t pref = nullptr;
      CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      const uint64_t ws = kWorkspaceBytes;
      const uint32_t al_a = key.align_b, al_b = key.align_a, al_c = key.align_c;  // cuBLAS A = our b
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                           sizeof al_a);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                           sizeof al_b);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                           sizeof al_c);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c,
                                           sizeof al_c);
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const cublasStatus_t st =
          cublasLtMatmulAlgoGetHeuristic(handle, d.op, d.a, d.b, d.c, d.c, pref, 1, &result, &found);
      cublasLtMatmulPreferenceDestroy(pref);
      if ((st != CUBLAS_STATUS_SUCCESS || found == 0) && bias != nullptr) {
        no_algo.insert(key);
        return false;
      }
      if (st != CUBLAS_STATUS_SUCCESS || found == 0)
        throw_error(__FILE__, __LINE__,
                    "cuBLASLt has no algorithm for gemm [" + std::to_string(m) + ", " + std::to_string(k) +
                        "] x [" + std::to_string(k) + ", " + std::to_string(n) + "]");
      it = cache.emplace(key, result.algo).first;
    }
    algo = it->second;
  }
  cuda::detail::Scratch workspace(kWorkspaceBytes, stream);
  // a = cuBLAS B, b = cuBLAS A; C and D are both c (in place: beta c read, result written).
  const cublasStatus_t st = cublasLtMatmul(handle, d.op, &alpha, b, d.a, a, d.b, &beta, c, d.c, c, d.c, &algo,
                                           workspace.as<void>(), kWorkspaceBytes, stream);
  if (bias != nullptr && (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE))
    return decline();
  if (st != CUBLAS_STATUS_SUCCESS) throw_cublas(__FILE__, __LINE__, "cublasLtMatmul", st);
  return true;
}

}  // namespace

namespace kernels {
void gemm_f32(const float* a, bool trans_a, const float* b, bool trans_b, float* c, int64_t m, int64_t n,
              int64_t k, float alpha, float beta, stream_t stream) {
  lt_gemm(a, trans_a, b, trans_b, c, m, n, k, alpha, beta, CUDA_R_32F, CUDA_R_32F,
          static_cast<cudaStream_t>(stream));
}
}  // namespace kernels

namespace cuda {
void gemm_cublaslt_bf16(const bf16* a, bool trans_a, const bf16* b, bool trans_b, float* c, int64_t m,
                        int64_t n, int64_t k, float alpha, float beta, void* stream) {
  lt_gemm(a, trans_a, b, trans_b, c, m, n, k, alpha, beta, CUDA_R_16BF, CUDA_R_32F,
          static_cast<cudaStream_t>(stream));
}
void gemm_cublaslt_f16(const f16* a, bool trans_a, const f16* b, bool trans_b, float* c, int64_t m, int64_t n,
                       int64_t k, float alpha, float beta, void* stream) {
  lt_gemm(a, trans_a, b, trans_b, c, m, n, k, alpha, beta, CUDA_R_16F, CUDA_R_32F,
          static_cast<cudaStream_t>(stream));
}
void gemm_cublaslt_16(DType ab_dtype, const void* a, bool trans_a, const void* b, bool trans_b, void* c,
                      DType c_dtype, int64_t m, int64_t n, int64_t k, float alpha, float beta, void* stream) {
  CUDA_OPS_REQUIRE(ab_dtype == DType::BF16 || ab_dtype == DType::F16,
                   "gemm_cublaslt_16: a and b must be bf16 or fp16");
  CUDA_OPS_REQUIRE(c_dtype == DType::F32 || c_dtype == ab_dtype,
                   "gemm_cublaslt_16: c must be fp32 or a's dtype");
  const cudaDataType_t in = ab_dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  lt_gemm(a, trans_a, b, trans_b, c, m, n, k, alpha, beta, in, c_dtype == DType::F32 ? CUDA_R_32F : in,
          static_cast<cudaStream_t>(stream));
}
bool gemm_cublaslt_16_bias(DType ab_dtype, const void* a, bool trans_a, const void* b, bool trans_b, void* c,
                           DType c_dtype, int64_t m, int64_t n, int64_t k, float alpha, float beta,
                           const void* bias, DType bias_dtype, void* stream) {
  CUDA_OPS_REQUIRE(ab_dtype == DType::BF16 || ab_dtype == DType::F16,
                   "gemm_cublaslt_16_bias: a and b must be bf16 or fp16");
  CUDA_OPS_REQUIRE(c_dtype == DType::F32 || c_dtype == ab_dtype,
                   "gemm_cublaslt_16_bias: c must be fp32 or a's dtype");
  CUDA_OPS_REQUIRE(bias != nullptr && k > 0, "gemm_cublaslt_16_bias: needs a bias and k >= 1");
  CUDA_OPS_REQUIRE(bias_dtype == DType::F32 || bias_dtype == c_dtype,
                   "gemm_cublaslt_16_bias: the bias must be fp32 or c's dtype");
  const cudaDataType_t in = ab_dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  return lt_gemm(a, trans_a, b, trans_b, c, m, n, k, alpha, beta, in, c_dtype == DType::F32 ? CUDA_R_32F : in,
                 static_cast<cudaStream_t>(stream), bias, bias_dtype == DType::F32 ? CUDA_R_32F : in);
}
}  // namespace cuda

}  // namespace parallel
