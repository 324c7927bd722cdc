// Ops that do in one pass what two ops did, against those two, bit for bit:
// - ops::gelu_backward_bias (the MLP's gelu backward with fc1's bias gradient summed in the same
//   pass) against gelu_backward then bias_backward: dx and dbias, for fp32, bf16 and fp16, shapes
//   with odd column counts and rows, on 1 to 3 threads; and dbias the same bits whatever the thread
//   count (bias_backward's guarantee, kept).
// - ops::cross_entropy_stats (max, target logit and sum of exponentials row by row) against
//   cross_entropy_local_stats then cross_entropy_sum_exp, with padding columns and a rank holding
//   only padding.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <random>
#include <vector>

#include "parallel/ops.hpp"

namespace parallel {
namespace {

Tensor random(const Shape& shape, DType dt, uint32_t seed, float scale) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  return Tensor::from_floats(v, shape, dt);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

TEST(GeluBackwardBias, BitwiseEqualsGeluThenBiasBackward) {
  const std::vector<Shape> shapes = {{3, 5, 67}, {7, 16}, {200, 201}, {256, 4, 1536}, {1024, 384}};
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (const Shape& shape : shapes) {
      const int64_t f = shape.back();
      const Tensor dy = random(shape, dt, 1, 1.0f), x = random(shape, dt, 2, 2.0f);
      const Tensor db0 = random({f}, DType::F32, 3, 1.0f);
      Tensor first_db;
      for (int threads : {1, 2, 3}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dt) << " " << shape_str(shape) << " " << threads << " threads");
        omp_set_num_threads(threads);
        Tensor dx_a = Tensor::empty(shape, dt), dx_b = Tensor::empty(shape, dt);
        Tensor db_a = db0.clone(), db_b = db0.clone();
        ops::gelu_backward(dy, x, dx_a);
        ops::bias_backward(dx_a, db_a);
        ops::gelu_backward_bias(dy, x, dx_b, db_b);
        EXPECT_TRUE(same_bits(dx_a, dx_b)) << "dx";
        EXPECT_TRUE(same_bits(db_a, db_b)) << "dbias";
        if (!first_db.defined())
          first_db = db_b;
        else
          EXPECT_TRUE(same_bits(first_db, db_b)) << "dbias differs from the 1-thread result";
      }
    }
  omp_set_num_threads(1);
}

TEST(CrossEntropyStats, BitwiseEqualsLocalStatsThenSumExp) {
  struct Case {
    int64_t n, v, vocab_start, vocab_size;
  };
  // One rank's whole vocabulary; padding at the end; a shard past the vocabulary (all padding).
  const Case cases[] = {{37, 8192, 0, 8192}, {5, 301, 0, 290}, {4, 64, 100, 90}, {1024, 1000, 0, 1000}};
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (const Case& c : cases)
      for (int threads : {1, 2, 3}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " n " << c.n << " v " << c.v << " start "
                                          << c.vocab_start << " " << threads << " threads");
        omp_set_num_threads(threads);
        const Tensor logits = random({c.n, c.v}, dt, 5, 3.0f);
        std::vector<int32_t> tg(static_cast<size_t>(c.n));
        for (size_t i = 0; i < tg.size(); i++)
          tg[i] = static_cast<int32_t>((i * 7919) % static_cast<size_t>(c.vocab_size));
        Tensor targets = Tensor::empty({c.n}, DType::I32);
        std::memcpy(targets.data_ptr(), tg.data(), tg.size() * sizeof(int32_t));
        Tensor m_a = Tensor::zeros({c.n}, DType::F32), tl_a = Tensor::zeros({c.n}, DType::F32),
               s_a = Tensor::zeros({c.n}, DType::F32);
        Tensor m_b = Tensor::zeros({c.n}, DType::F32), tl_b = Tensor::zeros({c.n}, DType::F32),
               s_b = Tensor::zeros({c.n}, DType::F32);
        ops::cross_entropy_local_stats(logits, targets, c.vocab_start, c.vocab_size, m_a, tl_a);
        ops::cross_entropy_sum_exp(logits, m_a, c.vocab_start, c.vocab_size, s_a);
        ops::cross_entropy_stats(logits, targets, c.vocab_start, c.vocab_size, m_b, tl_b, s_b);
        EXPECT_TRUE(same_bits(m_a, m_b)) << "row_max";
        EXPECT_TRUE(same_bits(tl_a, tl_b)) << "target_logit";
        EXPECT_TRUE(same_bits(s_a, s_b)) << "sum_exp";
      }
  omp_set_num_threads(1);
}

}  // namespace
}  // namespace parallel
