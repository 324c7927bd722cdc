#pragma once
// Layout-independent parameter initialisation.
//
// Element i (row-major index in the GLOBAL tensor) of the parameter called `name` is a function of
// (seed, name, i) alone, computed with a counter-based generator (Philox-4x32-10). A rank fills
// its slice without generating the rest, and every parallel layout starts from the same weights.
#include <cstdint>
#include <string>

#include "parallel/parameter.hpp"

namespace parallel {

// Standard normal / uniform [0, 1) value number `index` of the stream (seed, stream).
float philox_normal(uint64_t seed, uint64_t stream, uint64_t index);
float philox_uniform(uint64_t seed, uint64_t stream, uint64_t index);
uint64_t name_hash(const std::string& name);  // FNV-1a, stable across runs and platforms

// out[i] = std_dev * philox_normal(seed, stream, first + i) for i < n, bit for bit, vectorised
// (src/model/philox_normals.cpp): init_normal fills each run of consecutive global indices with it.
void philox_normals(uint64_t seed, uint64_t stream, uint64_t first, float std_dev, float* out, int64_t n);

// Fills param.value (this rank's slice, located by global_shape / partition_dim /
// partition_offset) with normal(0, std) values of the global tensor.
void init_normal(Parameter& param, uint64_t seed, float std);
void init_constant(Parameter& param, float value);
// Fills param.value with uniform [low, high) values of the global tensor, element i of the global
// tensor drawn from philox_uniform(seed, name_hash(name), i): the same values on every layout.
void init_uniform(Parameter& param, uint64_t seed, float low, float high);

}  // namespace parallel
