#pragma once
// Shared by the multi-rank gtest binaries: the process's runtime and world communicator.
#include "parallel/runtime.hpp"

namespace parallel::testing {
Runtime& runtime();
MpiCommunicator& world();
}  // namespace parallel::testing
