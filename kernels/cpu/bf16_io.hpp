#pragma once
// Element access for kernels whose loops read and write fp32 or bf16 storage directly.
//
// A kernel body is written once as a template over its storage types (float, or uint16_t holding
// bf16 bits) and loads / stores through these helpers; the arithmetic is always fp32. For bf16 the
// widen is a zero-extend and a shift by 16 (vpmovzxwd + vpslld once vectorised) and the narrow is
// float_to_bf16's round to nearest even on the bit pattern (NaN: top bits with the quiet bit set),
// branch-free so that it vectorises in every target_clones variant. A bf16 kernel so reads and
// writes its tensors in one pass, without the fp32 scratch blocks of widen.hpp, and its results are
// bitwise those of the widen / fp32 loop / narrow sequence: each element goes through the same fp32
// operations.
//
// Loops with a reduction (a row sum) are left reading fp32: the order of a vectorised sum depends on
// the vector length GCC picks, and 16-bit loads change that choice; those kernels widen their row
// once (widen.hpp) and use these helpers for their element-wise loops and outputs only.
#include <bit>
#include <cstdint>

namespace parallel::cpu {

// Always inlined, so that each target_clones variant of a caller compiles them for its own ISA.
[[gnu::always_inline]] inline float load_elem(const float* p, int64_t i) { return p[i]; }
[[gnu::always_inline]] inline float load_elem(const uint16_t* p, int64_t i) {
  return std::bit_cast<float>(static_cast<uint32_t>(p[i]) << 16);
}

// float_to_bf16 (dtype.hpp) on the bit pattern: round to nearest even by adding 0x7fff plus the
// lowest kept bit; a NaN keeps its top bits with the quiet bit set ((u | 0x00400000) >> 16 is
// (u >> 16) | 0x40). Both candidates and the select stay in 32-bit lanes, and NaN is found with a
// float compare (x != x) rather than on the bits: GCC then vectorises it in ~10 AVX2 operations
// per 8 values plus one pack per 16, without spilling constants, where the spelling on 16-bit
// values with an integer NaN test took ~16.
[[gnu::always_inline]] inline uint16_t bf16_bits(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  const uint32_t quiet = u | 0x00400000u;
  return static_cast<uint16_t>((x != x ? quiet : rounded) >> 16);
}

[[gnu::always_inline]] inline void store_elem(float* p, int64_t i, float x) { p[i] = x; }
[[gnu::always_inline]] inline void store_elem(uint16_t* p, int64_t i, float x) { p[i] = bf16_bits(x); }

}  // namespace parallel::cpu
