#pragma once
// Launchers of kernels/cuda/loss.cu (host-callable, no CUDA types): raw fp32 device pointers,
// stream as an opaque cudaStream_t. Each returns nullptr, or the CUDA error string of a failed launch.
#include <cstdint>

namespace parallel::kernels {

// loss[i] = log(sum_exp[i]) + row_max[i] - target_logit[i], i < n.
const char* cross_entropy_loss(const float* row_max, const float* sum_exp, const float* target_logit,
                               float* loss, int64_t n, void* stream);
// acc[0] += sum of x[i]^2 (double inside); partial: sum_of_squares_blocks(n) doubles of device scratch.
const char* sum_of_squares_accumulate(const float* x, int64_t n, float* acc, double* partial, void* stream);
int sum_of_squares_blocks(int64_t n);

}  // namespace parallel::kernels
