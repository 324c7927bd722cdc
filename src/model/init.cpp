// Layout-independent initialisation: Philox-4x32-10 keyed by the seed, counter (index, stream).
#include "parallel/init.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace parallel {
namespace {

struct Words {
  uint32_t w[4];
};

// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
Words philox4x32_10(uint64_t seed, uint64_t stream, uint64_t index) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(index), c1 = static_cast<uint32_t>(index >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return {{c0, c1, c2, c3}};
}

// Box-Muller in double so every platform's libm gives the same float after rounding (well within
// one ulp of float). u1 is in (0, 1] so the log is finite.
float normal_from(const Words& r) {
  const double u1 = (static_cast<double>(r.w[0]) + 1.0) * 0x1p-32;
  const double u2 = static_cast<double>(r.w[1]) * 0x1p-32;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

}  // namespace

float philox_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  return normal_from(philox4x32_10(seed, stream, index));
}

float philox_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  // 24 bits: every value is an exact float strictly below 1.
  return static_cast<float>(philox4x32_10(seed, stream, index).w[0] >> 8) * 0x1p-24f;
}

uint64_t name_hash(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

void init_normal(Parameter& param, uint64_t seed, float std) {
  const Shape& local = param.value.shape();
  const int64_t n = param.value.numel();
  // A meta parameter has no values to draw (parameter.hpp: meta models are born on meta).
  if (n == 0 || param.value.device().is_meta()) return;
  const Shape global = param.global_shape.empty() ? local : param.global_shape;
  PARALLEL_CHECK(global.size() == local.size(), "init_normal({}): local {} and global {} differ in rank",
                 param.name, shape_str(local), shape_str(global));
  // A local element at (outer, j, inner) sits at (outer, offset + j, inner) in the global tensor:
  // that global row-major index is the generator's counter, so every layout draws the same value.
  const int pd = param.partition_dim;
  int64_t inner = 1, local_len = 1, global_len = 1, offset = 0;
  if (pd >= 0) {
    PARALLEL_CHECK(pd < static_cast<int>(local.size()), "init_normal({}): partition_dim {} out of range",
                   param.name, pd);
    for (std::size_t d = static_cast<std::size_t>(pd) + 1; d < local.size(); ++d) inner *= local[d];
    local_len = local[static_cast<std::size_t>(pd)];
    global_len = global[static_cast<std::size_t>(pd)];
    offset = param.partition_offset;
    PARALLEL_CHECK(offset >= 0 && offset + local_len <= global_len,
                   "init_normal({}): slice [{}, {}) outside {}", param.name, offset, offset + local_len,
                   global_len);
  } else {
    PARALLEL_CHECK(global == local, "init_normal({}): replicated parameter with local {} != global {}",
                   param.name, shape_str(local), shape_str(global));
  }
  const uint64_t stream = name_hash(param.name);
  // Generate on the host in fp32, then copy (converts dtype, crosses devices, handles strides).
  const bool direct =
      param.value.device().is_cpu() && param.value.dtype() == DType::F32 && param.value.is_contiguous();
  Tensor host = direct ? param.value : Tensor::empty(local, DType::F32);
  float* out = host.data<float>();
  // For each outer index the local elements (j, k) sit at consecutive global indices
  // (outer * global_len + offset) * inner + j * inner + k: runs of local_len * inner elements (the
  // whole tensor when replicated), each filled by the vectorised generator. Chunks of the flat
  // range go to the OpenMP threads.
  const int64_t run = pd >= 0 ? local_len * inner : n;
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < end;) {
      const int64_t outer = i / run, rem = i % run;
      const int64_t len = std::min(end - i, run - rem);
      const int64_t g = pd >= 0 ? (outer * global_len + offset) * inner + rem : i;
      philox_normals(seed, stream, static_cast<uint64_t>(g), std, out + i, len);
      i += len;
    }
  }
  if (!direct) param.value.copy_(host);
}

void init_uniform(Parameter& param, uint64_t seed, float low, float high) {
  const Shape& local = param.value.shape();
  const int64_t n = param.value.numel();
  if (n == 0 || param.value.device().is_meta()) return;
  const Shape global = param.global_shape.empty() ? local : param.global_shape;
  PARALLEL_CHECK(global.size() == local.size(), "init_uniform({}): local {} and global {} differ in rank",
                 param.name, shape_str(local), shape_str(global));
  const int pd = param.partition_dim;
  int64_t inner = 1, local_len = n, global_len = n, offset = 0;
  if (pd >= 0) {
    for (std::size_t d = static_cast<std::size_t>(pd) + 1; d < local.size(); ++d) inner *= local[d];
    local_len = local[static_cast<std::size_t>(pd)];
    global_len = global[static_cast<std::size_t>(pd)];
    offset = param.partition_offset;
  }
  const uint64_t stream = name_hash(param.name);
  Tensor host = Tensor::empty(local, DType::F32);
  float* out = host.data<float>();
  const int64_t run = pd >= 0 ? local_len * inner : n;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t outer = i / run, rem = i % run;
    const int64_t g = pd >= 0 ? (outer * global_len + offset) * inner + rem : i;
    out[i] = low + (high - low) * philox_uniform(seed, stream, static_cast<uint64_t>(g));
  }
  param.value.copy_(host);
}

void init_constant(Parameter& param, float value) {
  if (param.value.numel() > 0 && !param.value.device().is_meta()) param.value.fill_(value);
}

}  // namespace parallel
