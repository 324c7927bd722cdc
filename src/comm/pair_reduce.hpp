#pragma once
// The element-wise combine of two ranks' contributions that the CPU collectives run (internal):
// MPI's user-defined ops for bf16 / fp16 and the MPI backend's two-rank reductions
// (mpi_communicator.cpp).
//
// out[i] = op(a[i], b[i]); `out` may alias `a` or `b`. fp32 is plain fp32 arithmetic. bf16 and
// fp16 widen both operands to fp32, combine once and round back to nearest even, as NCCL does per
// pairwise step. The result is bitwise that of pair_reduce_reference (the scalar definition) for
// every input, NaN, inf and subnormals included. Where both operands are NaN the result is `a`'s
// NaN for every op; otherwise sums commute, and Max / Min let any NaN win (torch.max).
#include <cstdint>

#include "parallel/communicator.hpp"
#include "parallel/dtype.hpp"

namespace parallel::detail {

// F32, BF16 or F16. Vectorised (AVX2 / AVX-512 where the CPU has them, portable code otherwise).
void pair_reduce(DType dtype, ReduceOp op, const void* a, const void* b, void* out, int64_t n);

// The scalar definition, one element at a time through float_to_bf16 / float_to_f16: the
// reference pair_reduce is tested against.
void pair_reduce_reference(DType dtype, ReduceOp op, const void* a, const void* b, void* out, int64_t n);

}  // namespace parallel::detail
