// Rows by index (ops.hpp, "rows by index"): the MoE layer's permutation, dispatch buffers and
// combine. Every output row belongs to one OpenMP iteration, which reads the rows its index names
// in index order: no write is shared, and each sum's order is the index's on any thread count.
#include <cstring>

#include "cpu/cpu_ops.hpp"
#include "cpu/widen.hpp"

namespace parallel::cpu {
namespace {
// Rows move in parallel once the work is worth a fork.
constexpr int64_t kParallelElems = 1 << 15;
}  // namespace

void gather_rows(const Tensor& src, const Tensor& index, Tensor& out) {
  const int64_t n = out.size(0), h = out.size(1);
  const std::size_t row_bytes = static_cast<std::size_t>(h) * dtype_size(out.dtype());
  const int64_t* idx = index.data<int64_t>();
  const auto* s = static_cast<const char*>(src.data_ptr());
  auto* o = static_cast<char*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (n * h > kParallelElems)
  for (int64_t i = 0; i < n; i++) {
    char* dst = o + static_cast<std::size_t>(i) * row_bytes;
    if (idx[i] < 0)
      std::memset(dst, 0, row_bytes);
    else
      std::memcpy(dst, s + static_cast<std::size_t>(idx[i]) * row_bytes, row_bytes);
  }
}

void gather_rows_scaled(const Tensor& src, const Tensor& index, const Tensor& scale, Tensor& out) {
  const int64_t n = out.size(0), h = out.size(1);
  const DType dt = out.dtype();
  const int64_t* idx = index.data<int64_t>();
  const float* sc = scale.data<float>();
#pragma omp parallel for schedule(static) if (n * h > kParallelElems)
  for (int64_t i = 0; i < n; i++) {
    void* dst = offset_ptr(out.data_ptr(), dt, i * h);
    float* y = write_f32(dst, dt, h, 0);
    if (idx[i] < 0) {
      std::memset(y, 0, static_cast<std::size_t>(h) * sizeof(float));
    } else {
      const float* x = read_f32(offset_ptr(src.data_ptr(), dt, idx[i] * h), dt, h, 1);
      const float w = sc[i];
#pragma omp simd
      for (int64_t c = 0; c < h; c++) y[c] = w * x[c];
    }
    write_back(y, dt, dst, h);
  }
}

void gather_sum_rows(const Tensor& src, const Tensor& index, const Tensor& weight, Tensor& out) {
  const int64_t T = out.size(0), h = out.size(1), k = index.size(1);
  const DType st = src.dtype(), ot = out.dtype();
  const int64_t* idx = index.data<int64_t>();
  const float* wt = weight.defined() ? weight.data<float>() : nullptr;
#pragma omp parallel for schedule(static) if (T * k * h > kParallelElems)
  for (int64_t t = 0; t < T; t++) {
    void* dst = offset_ptr(out.data_ptr(), ot, t * h);
    float* y = write_f32(dst, ot, h, 0);
    std::memset(y, 0, static_cast<std::size_t>(h) * sizeof(float));
    for (int64_t j = 0; j < k; j++) {
      const int64_t r = idx[t * k + j];
      if (r < 0) continue;
      const float* x = read_f32(offset_ptr(src.data_ptr(), st, r * h), st, h, 1);
      if (wt == nullptr) {
#pragma omp simd
        for (int64_t c = 0; c < h; c++) y[c] += x[c];
      } else {
        const float w = wt[t * k + j];
#pragma omp simd
        for (int64_t c = 0; c < h; c++) y[c] += w * x[c];
      }
    }
    write_back(y, ot, dst, h);
  }
}

void row_dot(const Tensor& a, const Tensor& b, const Tensor& index, Tensor& out) {
  const int64_t n = a.size(0), h = a.size(1);
  const DType dt = a.dtype();
  const int64_t* idx = index.data<int64_t>();
  float* o = out.data<float>();
#pragma omp parallel for schedule(static) if (n * h > kParallelElems)
  for (int64_t i = 0; i < n; i++) {
    const float* x = read_f32(offset_ptr(a.data_ptr(), dt, i * h), dt, h, 0);
    const float* y = read_f32(offset_ptr(b.data_ptr(), dt, idx[i] * h), dt, h, 1);
    double dot = 0;
    for (int64_t c = 0; c < h; c++) dot += static_cast<double>(x[c]) * y[c];
    o[i] = static_cast<float>(dot);
  }
}

}  // namespace parallel::cpu
