// Element-wise dtype conversion (F32 <-> BF16 <-> F16), fill, and the in-place rounding of fp32
// values to bf16 / fp16 precision (kernels::round_to_precision, mixed-precision emulation).
//
// Both are pure bandwidth: each thread moves 16 or 32 bytes per load so the memory system sees
// full 128-bit transactions, in a grid-stride loop so one launch covers any n. Unaligned pointers
// (a narrowed view into a storage) take the same kernel with one element per thread.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/convert.hpp"
#include "cuda/kernels.hpp"

namespace parallel::kernels {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill an H100 (132 SMs x 8 resident blocks) a few times over; more only adds
// scheduling work, since the loop strides over the rest.
constexpr int64_t kMaxBlocks = 4096;

// N elements moved as one aligned unit: the compiler emits 128-bit loads and stores for it.
template <typename T, int N>
struct alignas(sizeof(T) * N) Packed {
  T v[N];
};

__device__ __forceinline__ float to_float(float x) { return x; }
// bf16 is the top half of an fp32: widening is a shift, exact.
__device__ __forceinline__ float to_float(bf16 x) {
  return __uint_as_float(static_cast<uint32_t>(x.bits) << 16);
}
__device__ __forceinline__ float to_float(f16 x) { return __half2float(__ushort_as_half(x.bits)); }

template <typename D>
__device__ __forceinline__ D from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) {
  return bf16{__bfloat16_as_ushort(__float2bfloat16_rn(x))};
}
template <>
__device__ __forceinline__ f16 from_float<f16>(float x) {
  return f16{__half_as_ushort(__float2half_rn(x))};
}

// Every 16-bit value is exact in fp32, so going through fp32 rounds exactly once: bf16 <-> f16
// gives the same bits as a direct correctly rounded conversion.
template <typename D, typename S>
__device__ __forceinline__ D convert_one(S x) {
  return from_float<D>(to_float(x));
}

template <typename D, typename S, int N>
__global__ void __launch_bounds__(kThreads)
    convert_kernel(D* __restrict__ dst, const S* __restrict__ src, int64_t n_packs, int64_t n) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const auto* in = reinterpret_cast<const Packed<S, N>*>(src);
  auto* out = reinterpret_cast<Packed<D, N>*>(dst);
  for (int64_t i = first; i < n_packs; i += stride) {
    const Packed<S, N> a = in[i];
    Packed<D, N> b;
#pragma unroll
    for (int k = 0; k < N; ++k) b.v[k] = convert_one<D>(a.v[k]);
    out[i] = b;
  }
  // The last n % N elements: fewer than N, so the first threads of the grid take one each.
  const int64_t tail = n_packs * N + first;
  if (tail < n) dst[tail] = convert_one<D>(src[tail]);
}

template <typename T, int N>
__global__ void __launch_bounds__(kThreads)
    fill_kernel(T* __restrict__ dst, T value, int64_t n_packs, int64_t n) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  Packed<T, N> p;
#pragma unroll
  for (int k = 0; k < N; ++k) p.v[k] = value;
  auto* out = reinterpret_cast<Packed<T, N>*>(dst);
  for (int64_t i = first; i < n_packs; i += stride) out[i] = p;
  const int64_t tail = n_packs * N + first;
  if (tail < n) dst[tail] = value;
}

int blocks_for(int64_t work_items) {
  return static_cast<int>(std::clamp<int64_t>((work_items + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

bool aligned(const void* p, std::size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <typename D, typename S>
cudaError_t launch_convert(void* dst, const void* src, int64_t n, cudaStream_t stream) {
  // 8 elements: 16 bytes of a 16-bit type, 32 bytes (two 128-bit accesses) of fp32.
  constexpr int N = 8;
  auto* d = static_cast<D*>(dst);
  const auto* s = static_cast<const S*>(src);
  if (aligned(dst, sizeof(D) * N) && aligned(src, sizeof(S) * N)) {
    const int64_t packs = n / N;
    convert_kernel<D, S, N><<<blocks_for(packs), kThreads, 0, stream>>>(d, s, packs, n);
  } else {
    convert_kernel<D, S, 1><<<blocks_for(n), kThreads, 0, stream>>>(d, s, n, n);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_fill(void* dst, T value, int64_t n, cudaStream_t stream) {
  constexpr int N = 16 / sizeof(T);
  auto* d = static_cast<T*>(dst);
  if (aligned(dst, 16)) {
    const int64_t packs = n / N;
    fill_kernel<T, N><<<blocks_for(packs), kThreads, 0, stream>>>(d, value, packs, n);
  } else {
    fill_kernel<T, 1><<<blocks_for(n), kThreads, 0, stream>>>(d, value, n, n);
  }
  return cudaGetLastError();
}

bool is_float16or32(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// ---- rounding fp32 to bf16 / fp16 precision, in place ----------------------------------------
// The CPU kernel's integer formulas (kernels/cpu/elementwise.cpp), operation for operation, so the
// results are bit-identical, NaN payloads included. The hardware conversions (__float2bfloat16_rn)
// would round the same finite values but return a canonical NaN instead of the input's top bits.

// bf16 keeps the top 16 bits: add 0x7fff plus the lowest kept bit (ties to even), clear the rest.
// NaN: keep the top bits and set the quiet bit.
__device__ __forceinline__ float round_bf16(float x) {
  const uint32_t u = __float_as_uint(x);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const uint32_t nan = (u & 0xffff0000u) | 0x00400000u;
  return __uint_as_float((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// fp16 by magnitude: NaN -> quiet NaN; >= 65520 -> inf; normal range [2^-14, 65520): keep 10
// mantissa bits; below 2^-14 the fp16 grid is multiples of 2^-24, and (|x| + 0.5) - 0.5 rounds
// there because the fp32 ulp of 0.5 is 2^-24. __fadd_rn: two separate round-to-nearest additions
// that the compiler may neither fuse nor reassociate (the CPU does exactly these two).
__device__ __forceinline__ float round_f16(float x) {
  const uint32_t u = __float_as_uint(x);
  const uint32_t sign = u & 0x80000000u, abs = u & 0x7fffffffu;
  const uint32_t normal = (abs + 0x0fffu + ((abs >> 13) & 1u)) & 0xffffe000u;
  const float tiny = __fadd_rn(__fadd_rn(__uint_as_float(abs), 0.5f), -0.5f);
  uint32_t r = abs < 0x38800000u ? __float_as_uint(tiny) : normal;
  r = abs >= 0x477ff000u ? 0x7f800000u : r;
  r = abs > 0x7f800000u ? 0x7fc00000u : r;
  return __uint_as_float(sign | r);
}

template <bool kBF16>
__device__ __forceinline__ float round_one(float x) {
  if constexpr (kBF16)
    return round_bf16(x);
  else
    return round_f16(x);
}

// Same layout as convert_kernel: N = 4 floats (one 128-bit access) per step when x is 16-byte
// aligned, else N = 1; the last n % N elements go one per thread.
template <bool kBF16, int N>
__global__ void __launch_bounds__(kThreads) round_kernel(float* __restrict__ x, int64_t n_packs, int64_t n) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  auto* packs = reinterpret_cast<Packed<float, N>*>(x);
  for (int64_t i = first; i < n_packs; i += stride) {
    Packed<float, N> p = packs[i];
#pragma unroll
    for (int k = 0; k < N; ++k) p.v[k] = round_one<kBF16>(p.v[k]);
    packs[i] = p;
  }
  const int64_t tail = n_packs * N + first;
  if (tail < n) x[tail] = round_one<kBF16>(x[tail]);
}

template <bool kBF16>
void launch_round(float* x, int64_t n, cudaStream_t stream) {
  constexpr int N = 4;
  if (aligned(x, sizeof(float) * N)) {
    const int64_t packs = n / N;
    round_kernel<kBF16, N><<<blocks_for(packs), kThreads, 0, stream>>>(x, packs, n);
  } else {
    round_kernel<kBF16, 1><<<blocks_for(n), kThreads, 0, stream>>>(x, n, n);
  }
}

}  // namespace

bool convert_supported(DType dst, DType src) {
  return dst == src || (is_float16or32(dst) && is_float16or32(src));
}

cudaError_t convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n,
                    cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (dst_type == src_type) {
    if (dst == src) return cudaSuccess;
    return cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * dtype_size(dst_type),
                           cudaMemcpyDeviceToDevice, stream);
  }
  using T = DType;
  if (dst_type == T::BF16 && src_type == T::F32) return launch_convert<bf16, float>(dst, src, n, stream);
  if (dst_type == T::F16 && src_type == T::F32) return launch_convert<f16, float>(dst, src, n, stream);
  if (dst_type == T::F32 && src_type == T::BF16) return launch_convert<float, bf16>(dst, src, n, stream);
  if (dst_type == T::F32 && src_type == T::F16) return launch_convert<float, f16>(dst, src, n, stream);
  if (dst_type == T::F16 && src_type == T::BF16) return launch_convert<f16, bf16>(dst, src, n, stream);
  if (dst_type == T::BF16 && src_type == T::F16) return launch_convert<bf16, f16>(dst, src, n, stream);
  return cudaErrorInvalidValue;
}

cudaError_t fill(void* dst, int elem_size, uint64_t bits, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  // All-zero patterns (zero_(), the common case) and single bytes are what memset does natively.
  if (bits == 0 || elem_size == 1)
    return cudaMemsetAsync(dst, static_cast<int>(bits & 0xff), static_cast<std::size_t>(n) * elem_size,
                           stream);
  switch (elem_size) {
    case 2:
      return launch_fill<uint16_t>(dst, static_cast<uint16_t>(bits), n, stream);
    case 4:
      return launch_fill<uint32_t>(dst, static_cast<uint32_t>(bits), n, stream);
    case 8:
      return launch_fill<uint64_t>(dst, bits, n, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

void round_to_precision(float* x, int64_t n, DType precision, stream_t stream) {
  CUDA_OPS_REQUIRE(precision == DType::F32 || precision == DType::BF16 || precision == DType::F16,
                   "round_to_precision: precision must be F32, BF16 or F16");
  if (n <= 0 || precision == DType::F32) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (precision == DType::BF16)
    launch_round<true>(x, n, s);
  else
    launch_round<false>(x, n, s);
  CUDA_OPS_LAUNCHED();
}

}  // namespace parallel::kernels
