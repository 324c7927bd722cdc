#pragma once
// GPU tests are built wherever the CUDA backend is, and skip with a clear message on machines
// without a device (the build machines and CI).
#include <gtest/gtest.h>

#include "parallel/device.hpp"

#define REQUIRE_GPU()                                                                                  \
  do {                                                                                                 \
    if (::parallel::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: this test needs a GPU"; \
  } while (0)
