#pragma once
// Conversion passes: how often a whole tensor was converted between dtypes as a pass of its own -
// Tensor::to(DType) and Tensor::copy_ between dtypes, on any real device - process-wide, with the
// elements and the bytes (read plus written) they moved.
//
// A 16-bit step widens and narrows inside the kernels that read and write (kernels/cpu/widen.hpp:
// blocks that stay in cache, not counted here), never as such a pass: test_step_conversions holds
// the count per step of a bf16 / fp16 step, and the trainer logs the bytes per step
// (metrics.jsonl "conversion_bytes"). Always on: three relaxed atomic adds per conversion, nothing
// per same-dtype copy.
#include <cstdint>

namespace parallel {

struct ConversionPasses {
  int64_t passes = 0;
  int64_t elements = 0;
  int64_t bytes = 0;
};

ConversionPasses conversion_passes();

}  // namespace parallel
