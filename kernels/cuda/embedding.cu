// Vocab-parallel token embedding: forward gather and a deterministic backward scatter-add.
//
// tokens are [b, s], activations [s, b, h]: activation row r = si * b + bi holds token
// tokens[bi * s + si].
//
// Backward, deterministic and sort-based (no float atomics):
//   1. keys[r] = local id of row r (or `rows`, a sentinel past every id, for ids another rank owns),
//      values[r] = r;
//   2. cub's stable radix sort of (key, value): the rows of one id become a contiguous segment, in
//      increasing r;
//   3. one block per segment head: for each column (threads stride over h) it adds the segment's
//      dout rows in order into dweight[id]. The summation order is the CPU kernel's (tokens in row
//      order, each added into dweight directly), so results are bit-identical to the CPU's.
//   dout may be fp32, bf16 or fp16 (widened exactly as the rows are added); dweight is fp32.
//   A very frequent id serialises on one block; at GPT scales (~1e4 tokens per micro-batch) that is
//   a few hundred rows of h floats, far below the cost of the surrounding GEMMs.
#include <cub/device/device_radix_sort.cuh>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/kernels.hpp"

namespace parallel::kernels {
namespace {

using cuda::detail::blocks_for;
using cuda::detail::kThreads;
using cuda::detail::to_f32;
using cuda::detail::to_storage;

// T: the output's storage type; W: the table's (float or T). Equal types copy the stored bits (the
// CPU's memcpy); an fp32 table is rounded to T to nearest even (the CPU's narrow_from_f32).
template <typename T, typename W>
__global__ void embedding_fwd_kernel(const int32_t* tokens, const W* w, int64_t vocab_start, int64_t rows,
                                     T* out, int64_t b, int64_t s, int64_t h) {
  const int64_t n = s * b * h;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < n;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = t / h, c = t % h;  // r = si * b + bi
    const int64_t si = r / b, bi = r % b;
    const int64_t local = static_cast<int64_t>(tokens[bi * s + si]) - vocab_start;
    if (local < 0 || local >= rows)
      out[t] = T{};  // all-zero bits: +0 in every type
    else if constexpr (std::is_same_v<T, W>)
      out[t] = w[local * h + c];
    else
      out[t] = to_storage<T>(to_f32(w[local * h + c]));
  }
}

__global__ void make_keys_kernel(const int32_t* tokens, int64_t vocab_start, int64_t rows, uint32_t* keys,
                                 uint32_t* values, int64_t b, int64_t s) {
  const int64_t n = s * b;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < n;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t si = r / b, bi = r % b;
    const int64_t local = static_cast<int64_t>(tokens[bi * s + si]) - vocab_start;
    keys[r] = static_cast<uint32_t>(local >= 0 && local < rows ? local : rows);
    values[r] = static_cast<uint32_t>(r);
  }
}

// One block per sorted position; only segment heads work.
template <typename T>
__global__ void segment_sum_kernel(const uint32_t* keys, const uint32_t* values, const T* dout, float* dw,
                                   int64_t n, int64_t rows, int64_t h) {
  const int64_t p = blockIdx.x;
  const uint32_t id = keys[p];
  if (id >= rows || (p > 0 && keys[p - 1] == id)) return;
  int64_t end = p + 1;
  while (end < n && keys[end] == id) end++;
  float* w = dw + static_cast<int64_t>(id) * h;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    float acc = w[c];
    for (int64_t q = p; q < end; q++) acc += to_f32(dout[static_cast<int64_t>(values[q]) * h + c]);
    w[c] = acc;
  }
}

}  // namespace

void embedding_forward(const int32_t* tokens, const void* weight, DType w_dtype, int64_t vocab_start,
                       int64_t rows, void* out, DType dtype, int64_t b, int64_t s, int64_t h,
                       stream_t stream) {
  const int64_t n = s * b * h;
  if (n == 0) return;
  PARALLEL_CUDA_DISPATCH_ACT_PARAM(dtype, w_dtype, T, W, {
    embedding_fwd_kernel<T, W><<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        tokens, static_cast<const W*>(weight), vocab_start, rows, static_cast<T*>(out), b, s, h);
  });
  CUDA_OPS_LAUNCHED();
}

void embedding_backward(const int32_t* tokens, const void* dout, DType dtype, int64_t vocab_start,
                        float* dweight, int64_t rows, int64_t b, int64_t s, int64_t h, stream_t stream) {
  const int64_t n = s * b;
  if (n == 0 || h == 0 || rows == 0) return;
  CUDA_OPS_REQUIRE(n < (int64_t{1} << 31) && rows < (int64_t{1} << 31),
                   "embedding_backward: too many tokens");
  const auto cs = static_cast<cudaStream_t>(stream);
  const std::size_t nb = static_cast<std::size_t>(n) * sizeof(uint32_t);
  cuda::detail::Scratch kv(4 * nb, cs);  // keys in, values in, keys out, values out
  uint32_t* keys_in = kv.as<uint32_t>();
  uint32_t* values_in = keys_in + n;
  uint32_t* keys_out = values_in + n;
  uint32_t* values_out = keys_out + n;
  make_keys_kernel<<<blocks_for(n), kThreads, 0, cs>>>(tokens, vocab_start, rows, keys_in, values_in, b, s);
  CUDA_OPS_LAUNCHED();

  int end_bit = 1;  // bits that hold every key, sentinel `rows` included
  while (end_bit < 32 && (uint64_t{1} << end_bit) <= static_cast<uint64_t>(rows)) end_bit++;
  std::size_t temp_bytes = 0;
  CUDA_OPS_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, values_in,
                                                 values_out, static_cast<int>(n), 0, end_bit, cs));
  cuda::detail::Scratch temp(temp_bytes, cs);
  CUDA_OPS_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys_in, keys_out, values_in,
                                                 values_out, static_cast<int>(n), 0, end_bit, cs));
  PARALLEL_CUDA_DISPATCH_FLOAT(dtype, T, {
    segment_sum_kernel<T><<<static_cast<unsigned>(n), 128, 0, cs>>>(
        keys_out, values_out, static_cast<const T*>(dout), dweight, n, rows, h);
  });
  CUDA_OPS_LAUNCHED();
}

}  // namespace parallel::kernels
