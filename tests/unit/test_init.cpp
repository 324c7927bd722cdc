// Layout-independent initialisation: a tensor-parallel slice holds exactly the values of the same
// slice of the unsplit tensor, for row and column splits; names give different streams; the values
// are deterministic and look like N(0, std).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "parallel/init.hpp"

namespace parallel {
namespace {

Parameter make_param(const std::string& name, const Shape& global, int partition_dim, int tp, int rank) {
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
  p.grad = Tensor::zeros(local, DType::F32);
  return p;
}

// Every element of each TP=4 slice equals the element of the full tensor at its global position.
void expect_slices_match(const Shape& global, int partition_dim) {
  constexpr int kTp = 4;
  Parameter full = make_param("layers.0.attention.query.weight", global, -1, 1, 0);
  init_normal(full, 42, 0.02f);
  const std::vector<float> f = full.value.to_float_vector();
  // Strides of the global tensor, to locate each local element.
  int64_t inner = 1;
  for (std::size_t d = static_cast<std::size_t>(partition_dim) + 1; d < global.size(); ++d)
    inner *= global[d];
  const int64_t global_len = global[static_cast<std::size_t>(partition_dim)];
  for (int r = 0; r < kTp; ++r) {
    Parameter part = make_param(full.name, global, partition_dim, kTp, r);
    init_normal(part, 42, 0.02f);
    const std::vector<float> v = part.value.to_float_vector();
    const int64_t local_len = global_len / kTp;
    for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
      const int64_t k = i % inner, j = (i / inner) % local_len, outer = i / inner / local_len;
      const int64_t g = (outer * global_len + part.partition_offset + j) * inner + k;
      ASSERT_EQ(v[static_cast<std::size_t>(i)], f[static_cast<std::size_t>(g)])
          << "rank " << r << " local " << i << " global " << g;
    }
  }
}

TEST(Init, RowSlicesOfTp4EqualTheFullTensor) { expect_slices_match({16, 12}, 0); }
TEST(Init, ColumnSlicesOfTp4EqualTheFullTensor) { expect_slices_match({12, 16}, 1); }
TEST(Init, MiddleDimensionSlices) { expect_slices_match({3, 8, 5}, 1); }

TEST(Init, ViewIntoFusedStorageGetsItsOwnSlice) {
  // The column-parallel layer's parts are row views of one buffer: init must write through them.
  Tensor fused = Tensor::zeros({6, 4}, DType::F32);
  Parameter a = make_param("a.weight", {8, 4}, 0, 4, 1);  // rows [2, 4) of [8, 4]
  a.value = fused.narrow(0, 2, 2);
  init_normal(a, 7, 1.0f);
  Parameter ref = make_param("a.weight", {8, 4}, -1, 1, 0);
  init_normal(ref, 7, 1.0f);
  const auto f = fused.to_float_vector(), r = ref.value.to_float_vector();
  for (int i = 0; i < 8; ++i)
    EXPECT_EQ(f[static_cast<std::size_t>(8 + i)], r[static_cast<std::size_t>(8 + i)]);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(f[static_cast<std::size_t>(i)], 0.0f);  // rows outside untouched
}

TEST(Init, DifferentNamesAndSeedsDiffer) {
  Parameter a = make_param("layers.0.mlp.fc1.weight", {32, 8}, -1, 1, 0);
  Parameter b = make_param("layers.1.mlp.fc1.weight", {32, 8}, -1, 1, 0);
  Parameter c = make_param("layers.0.mlp.fc1.weight", {32, 8}, -1, 1, 0);
  init_normal(a, 1, 1.0f);
  init_normal(b, 1, 1.0f);
  init_normal(c, 2, 1.0f);
  const auto va = a.value.to_float_vector(), vb = b.value.to_float_vector(), vc = c.value.to_float_vector();
  int same_ab = 0, same_ac = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    same_ab += va[i] == vb[i];
    same_ac += va[i] == vc[i];
  }
  EXPECT_EQ(same_ab, 0);
  EXPECT_EQ(same_ac, 0);
  EXPECT_NE(name_hash("a"), name_hash("b"));
  EXPECT_EQ(name_hash(""), 0xcbf29ce484222325ull);  // FNV-1a offset basis
}

TEST(Init, DeterministicAndNormal) {
  Parameter a = make_param("embedding.word.weight", {256, 64}, -1, 1, 0);
  Parameter b = make_param("embedding.word.weight", {256, 64}, -1, 1, 0);
  init_normal(a, 1234, 0.5f);
  init_normal(b, 1234, 0.5f);
  const auto va = a.value.to_float_vector(), vb = b.value.to_float_vector();
  EXPECT_EQ(va, vb);
  double sum = 0, sq = 0;
  for (float x : va) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    sq += static_cast<double>(x) * x;
  }
  const double n = static_cast<double>(va.size()), mean = sum / n, stddev = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.02);  // 16384 samples: standard error of the mean 0.004
  EXPECT_NEAR(stddev, 0.5, 0.02);
  // Uniform values lie in [0, 1) and the same counter gives the same value.
  for (uint64_t i = 0; i < 1000; ++i) {
    const float u = philox_uniform(3, 4, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    ASSERT_EQ(u, philox_uniform(3, 4, i));
  }
}

TEST(Init, Constant) {
  Parameter p = make_param("final_norm.weight", {64}, -1, 1, 0);
  init_constant(p, 1.0f);
  for (float x : p.value.to_float_vector()) EXPECT_EQ(x, 1.0f);
}

}  // namespace
}  // namespace parallel
