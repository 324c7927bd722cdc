// The vectorised Philox normals (src/model/philox_normals.cpp) against the scalar reference
// philox_normal, bit for bit: long runs from several streams and seeds, counters beyond 2^32 (the
// high counter word in use), short runs and tails, and init_normal on GPT-2 124M-shaped weights,
// whole and as tensor-parallel slices, element by element against std * philox_normal at the global
// index. About one element in 40,000 is settled by the scalar fallback, so these samples run that
// path too, on whichever clone (AVX-512, AVX2, baseline) the CPU selects.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "parallel/init.hpp"

namespace parallel {
namespace {

int64_t count_differences(uint64_t seed, uint64_t stream, uint64_t first, float std_dev, int64_t n) {
  std::vector<float> got(static_cast<std::size_t>(n));
  philox_normals(seed, stream, first, std_dev, got.data(), n);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float want = std_dev * philox_normal(seed, stream, first + static_cast<uint64_t>(i));
    bad += std::memcmp(&want, &got[static_cast<std::size_t>(i)], sizeof(float)) != 0;
  }
  return bad;
}

TEST(InitVectorised, LongRunsEqualTheScalarReferenceBitForBit) {
  EXPECT_EQ(count_differences(1234, name_hash("layers.0.mlp.fc1.weight"), 0, 1.0f, 1 << 21), 0);
  EXPECT_EQ(count_differences(42, name_hash("embedding.word_embeddings.weight"), 5'000'000, 0.02f, 1 << 20),
            0);
  // Counters past 2^32: the counter's high word feeds the generator.
  EXPECT_EQ(count_differences(7, 99, (uint64_t{1} << 32) - 1000, 0.5f, 1 << 19), 0);
  EXPECT_EQ(count_differences(~uint64_t{0}, ~uint64_t{0}, uint64_t{3} << 40, 1.0f, 1 << 19), 0);
}

TEST(InitVectorised, ShortRunsAndTails) {
  for (int64_t n : {1, 2, 3, 7, 255, 256, 257, 1000})
    EXPECT_EQ(count_differences(11, 13, static_cast<uint64_t>(n) * 977, 0.02f, n), 0) << n;
}

// init_normal fills whole and sliced GPT-2 124M weights (12 x 768, vocab 50257) exactly as the
// element-wise reference at the global index would.
void expect_init_matches(const std::string& name, const Shape& global, int partition_dim, int tp, int rank) {
  Parameter p;
  p.name = name;
  p.global_shape = global;
  Shape local = global;
  if (partition_dim >= 0) {
    local[static_cast<std::size_t>(partition_dim)] /= tp;
    p.partition_dim = partition_dim;
    p.partition_offset = rank * local[static_cast<std::size_t>(partition_dim)];
  }
  p.value = Tensor::zeros(local, DType::F32);
  init_normal(p, 1234, 0.02f);
  const float* v = p.value.data<float>();
  int64_t inner = 1, local_len = 1, global_len = 1;
  if (partition_dim >= 0) {
    for (std::size_t d = static_cast<std::size_t>(partition_dim) + 1; d < global.size(); ++d)
      inner *= global[d];
    local_len = local[static_cast<std::size_t>(partition_dim)];
    global_len = global[static_cast<std::size_t>(partition_dim)];
  }
  const uint64_t stream = name_hash(name);
  int64_t bad = 0;
  for (int64_t i = 0; i < p.value.numel(); ++i) {
    int64_t g = i;
    if (partition_dim >= 0) {
      const int64_t k = i % inner, j = (i / inner) % local_len, outer = i / inner / local_len;
      g = (outer * global_len + p.partition_offset + j) * inner + k;
    }
    const float want = 0.02f * philox_normal(1234, stream, static_cast<uint64_t>(g));
    bad += std::memcmp(&want, &v[i], sizeof(float)) != 0;
  }
  EXPECT_EQ(bad, 0) << name << " partition_dim " << partition_dim << " rank " << rank;
}

TEST(InitVectorised, Gpt2ShapedInitEqualsTheScalarReference) {
  expect_init_matches("layers.0.attention.query_key_value.weight", {2304, 768}, -1, 1, 0);
  expect_init_matches("layers.0.mlp.fc1.weight", {3072, 768}, 0, 4, 3);   // column-parallel slice
  expect_init_matches("layers.0.mlp.fc2.weight", {768, 3072}, 1, 4, 1);   // row-parallel slice
  expect_init_matches("layers.0.attention.dense.bias", {768}, -1, 1, 0);  // one short run
}

}  // namespace
}  // namespace parallel
