#pragma once
// GPU tests are built wherever the CUDA backend is, and skip with a clear message on machines
// without a device (the build machines and CI).
//
// A skipped gtest exits 0, so on a GPU machine whose GPU is not visible (a bad CUDA_VISIBLE_DEVICES,
// a driver that does not load) every GPU test would look green. Where the environment says a GPU is
// expected, PARALLEL_REQUIRE_GPU=1 (the GPU check sets it), REQUIRE_GPU() fails instead of skipping.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "parallel/device.hpp"

namespace parallel::testing {
// True when PARALLEL_REQUIRE_GPU is exactly "1".
inline bool gpu_required() {
  const char* v = std::getenv("PARALLEL_REQUIRE_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}
}  // namespace parallel::testing

#define REQUIRE_GPU()                                                                              \
  do {                                                                                             \
    if (::parallel::cuda_device_count() == 0) {                                                    \
      if (::parallel::testing::gpu_required())                                                     \
        GTEST_FAIL() << "no CUDA device visible, but PARALLEL_REQUIRE_GPU=1 says one is expected " \
                        "(check nvidia-smi, CUDA_VISIBLE_DEVICES and the driver)";                 \
      GTEST_SKIP() << "no CUDA device: this test needs a GPU";                                     \
    }                                                                                              \
  } while (0)
