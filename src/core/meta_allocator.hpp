#pragma once
// The meta device's allocator (meta.hpp): counts bytes, holds none.
#include "parallel/allocator.hpp"

namespace parallel {
Allocator& meta_allocator();
}  // namespace parallel
