// pair_reduce (the CPU collectives' element-wise combine, src/comm/pair_reduce.hpp) against its
// scalar definition, bit for bit: every bf16 / fp16 bit pattern against a set of partners that
// holds NaNs of both signs and payloads, infinities, subnormals, zeros of both signs and sums that
// round on a tie; fp32 likewise on random and special values; `out` aliasing either operand.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "../../src/comm/pair_reduce.hpp"
#include "parallel/error.hpp"

namespace parallel {
namespace {

const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min};

// 16-bit partners: specials of the format (bf16 and fp16 alike have sign at bit 15) and random bits.
std::vector<uint16_t> partners16(DType dt) {
  std::vector<uint16_t> v = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x3c00, 0xbc00, 0x3f80,
                             0xbf80, 0x7f7f, 0xff7f, 0x7bff, 0xfbff, 0x0080, 0x8080, 0x007f};
  if (dt == DType::BF16) {
    // +-inf, quiet and signalling NaNs with payloads, of both signs.
    for (uint16_t b : {0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0xff81, 0x7fc1, 0x7fbf}) v.push_back(b);
  } else {
    for (uint16_t b : {0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0xfc01, 0x7e01, 0x7dff}) v.push_back(b);
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200; i++) v.push_back(static_cast<uint16_t>(rng()));
  return v;
}

// Compares pair_reduce with the reference for every a in `as` against every b, with `out` fresh,
// aliasing a and aliasing b. Returns the number of mismatches (reporting the first few).
template <typename T>
int compare(DType dt, ReduceOp op, const std::vector<T>& as, const std::vector<T>& bs) {
  const int64_t n = static_cast<int64_t>(as.size());
  std::vector<T> b(as.size()), want(as.size()), got(as.size()), alias(as.size());
  int bad = 0;
  for (T partner : bs) {
    std::fill(b.begin(), b.end(), partner);
    detail::pair_reduce_reference(dt, op, as.data(), b.data(), want.data(), n);
    detail::pair_reduce(dt, op, as.data(), b.data(), got.data(), n);
    alias = as;
    detail::pair_reduce(dt, op, alias.data(), b.data(), alias.data(), n);
    std::vector<T> alias_b = b;
    detail::pair_reduce(dt, op, as.data(), alias_b.data(), alias_b.data(), n);
    for (int64_t i = 0; i < n; i++) {
      const auto k = static_cast<std::size_t>(i);
      if (std::memcmp(&got[k], &want[k], sizeof(T)) != 0 ||
          std::memcmp(&alias[k], &want[k], sizeof(T)) != 0 ||
          std::memcmp(&alias_b[k], &want[k], sizeof(T)) != 0) {
        if (++bad <= 5)
          ADD_FAILURE() << dtype_name(dt) << " " << reduce_op_name(op) << " a=0x" << std::hex
                        << +std::bit_cast<std::conditional_t<sizeof(T) == 2, uint16_t, uint32_t>>(as[k])
                        << " b=0x"
                        << +std::bit_cast<std::conditional_t<sizeof(T) == 2, uint16_t, uint32_t>>(b[k])
                        << ": got 0x"
                        << +std::bit_cast<std::conditional_t<sizeof(T) == 2, uint16_t, uint32_t>>(got[k])
                        << ", want 0x"
                        << +std::bit_cast<std::conditional_t<sizeof(T) == 2, uint16_t, uint32_t>>(want[k]);
      }
    }
  }
  return bad;
}

// Every 16-bit pattern of one format, against the partners.
void compare_every_pattern(DType dt) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; i++) all[i] = static_cast<uint16_t>(i);
  for (ReduceOp op : kOps) EXPECT_EQ(compare(dt, op, all, partners16(dt)), 0) << dtype_name(dt);
}

// One test per format: fp16 goes through F16C, which an emulator may round differently from the
// hardware (scripts/avx512_emulated.sh leaves the fp16 one out there).
TEST(PairReduce, Bf16MatchesTheScalarDefinitionOnEveryPattern) { compare_every_pattern(DType::BF16); }
TEST(PairReduce, Fp16MatchesTheScalarDefinitionOnEveryPattern) { compare_every_pattern(DType::F16); }

TEST(PairReduce, Bf16SumsRoundTiesToEven) {
  // The inputs above reach exact ties (fp32 sums whose dropped half is 0x8000): the comparison
  // covers round-half-to-even, not only the easy cases. Two hand-picked ones, checked by value:
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7 and rounds to the even 1; 1 + 3 * 2^-8 rounds up.
  const uint16_t one = float_to_bf16(1.0f).bits;
  const uint16_t tie_down = float_to_bf16(std::ldexp(1.0f, -8)).bits;
  const uint16_t tie_up = float_to_bf16(3 * std::ldexp(1.0f, -8)).bits;
  uint16_t a[2] = {one, one}, b[2] = {tie_down, tie_up}, out[2];
  detail::pair_reduce(DType::BF16, ReduceOp::Sum, a, b, out, 2);
  EXPECT_EQ(bf16_to_float(bf16{out[0]}), 1.0f);
  EXPECT_EQ(bf16_to_float(bf16{out[1]}), 1.0f + std::ldexp(1.0f, -6));
  int ties = 0;
  for (uint32_t x = 0; x < 65536; x++)
    for (uint16_t y : partners16(DType::BF16)) {
      const float s = bf16_to_float(bf16{static_cast<uint16_t>(x)}) + bf16_to_float(bf16{y});
      ties += (std::bit_cast<uint32_t>(s) & 0xffffu) == 0x8000u && s == s;
    }
  EXPECT_GT(ties, 1000);
}

TEST(PairReduce, Fp32MatchesTheScalarDefinition) {
  std::vector<float> as = {0.0f,
                           -0.0f,
                           1.0f,
                           -1.0f,
                           std::numeric_limits<float>::denorm_min(),
                           -std::numeric_limits<float>::denorm_min(),
                           std::numeric_limits<float>::min(),
                           std::numeric_limits<float>::max(),
                           -std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           -std::numeric_limits<float>::quiet_NaN(),
                           std::bit_cast<float>(0x7fa00001u)};
  std::mt19937 rng(11);
  for (int i = 0; i < 3000; i++) as.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  const std::vector<float> bs(as.begin(), as.begin() + 200);
  for (ReduceOp op : kOps) EXPECT_EQ(compare(DType::F32, op, as, bs), 0);
}

TEST(PairReduce, LengthsAroundTheBlock) {
  // Blocks of 512 and the tail: every length up to two blocks and a bit.
  std::mt19937 rng(3);
  std::vector<uint16_t> a(1100), b(1100), want(1100), got(1100);
  for (auto& x : a) x = static_cast<uint16_t>(rng());
  for (auto& x : b) x = static_cast<uint16_t>(rng());
  for (int64_t n : {0, 1, 7, 511, 512, 513, 1024, 1025, 1100}) {
    std::fill(got.begin(), got.end(), 0xabcd);
    detail::pair_reduce_reference(DType::BF16, ReduceOp::Sum, a.data(), b.data(), want.data(), n);
    detail::pair_reduce(DType::BF16, ReduceOp::Sum, a.data(), b.data(), got.data(), n);
    EXPECT_TRUE(std::equal(want.begin(), want.begin() + n, got.begin())) << n;
    EXPECT_TRUE(std::all_of(got.begin() + n, got.end(), [](uint16_t x) { return x == 0xabcd; })) << n;
  }
}

TEST(PairReduce, RejectsTypesWithoutCpuArithmetic) {
  int32_t a = 1, b = 2, out = 0;
  EXPECT_THROW(detail::pair_reduce(DType::I32, ReduceOp::Sum, &a, &b, &out, 1), Error);
}

}  // namespace
}  // namespace parallel
