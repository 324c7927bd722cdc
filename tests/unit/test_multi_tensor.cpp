// The multi-tensor optimizer ops (one OpenMP region for every parameter instead of one per
// parameter) against the per-tensor calls they replace in the optimizer:
// - ops::adamw_update_multi_: every bit of param, exp_avg, exp_avg_sq and the 16-bit model copy
//   equals adamw_update_'s, for fp32, bf16 and fp16 copies, mixed weight decays, with and without a
//   clip coefficient, on 1 to 3 threads.
// - ops::sum_of_squares_accumulate_multi: the accumulated fp32 sum equals the sequence of
//   sum_of_squares_accumulate calls bit for bit, and each tensor's double sum the loop the library
//   has always used (copied below), on 1 and 2 threads. With 3 threads that loop adds the threads'
//   partials in the order they arrive, which varies from run to run: there only closeness is asked.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "parallel/ops.hpp"

namespace parallel {
namespace {

// kernels/cpu/reduce.cpp's sum_of_squares loop, verbatim.
double old_sum_of_squares(const float* X, int64_t n) {
  double total = 0.0;
#pragma omp parallel for simd reduction(+ : total) schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; i++) total += static_cast<double>(X[i]) * static_cast<double>(X[i]);
  return total;
}

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Gradients of these sizes cut from one buffer at odd offsets (unaligned starts), some large values.
TEST(MultiTensor, GradNormSumBitwise) {
  const int64_t sizes[] = {1, 7, 384, 1536, 4097, 65536, 65537, 70001, 147456, 589824, 1000003};
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> data(2200000);
  for (float& x : data) x = normal(rng) * (rng() % 7 == 0 ? 1e3f : 1e-2f);
  std::vector<Tensor> all;
  int64_t off = 1;
  for (int64_t n : sizes) {
    all.push_back(Tensor::from_blob(data.data() + off, {n}, DType::F32));
    off += n + 2;
  }
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    // The whole list, reversed, and small tensors only (no region at all).
    const std::vector<std::vector<Tensor>> lists = {
        all, {all.rbegin(), all.rend()}, {all[0], all[2], all[4]}};
    for (const std::vector<Tensor>& xs : lists) {
      SCOPED_TRACE(::testing::Message() << threads << " threads, " << xs.size() << " tensors");
      Tensor multi = Tensor::from_floats({0.25f}, {1}, DType::F32);
      Tensor single = Tensor::from_floats({0.25f}, {1}, DType::F32);
      float old = 0.25f;
      ops::sum_of_squares_accumulate_multi(xs, multi);
      for (const Tensor& x : xs) {
        ops::sum_of_squares_accumulate(x, single);
        const double before = old_sum_of_squares(x.data<float>(), x.numel());
        old = static_cast<float>(static_cast<double>(old) + before);
        if (threads <= 2) EXPECT_EQ(ops::sum_of_squares(x), before) << "n " << x.numel();
      }
      if (threads <= 2) {
        EXPECT_EQ(bits(multi.data<float>()[0]), bits(single.data<float>()[0]));
        EXPECT_EQ(bits(multi.data<float>()[0]), bits(old));
      } else {
        EXPECT_NEAR(multi.data<float>()[0], old, 1e-6 * old);
      }
    }
  }
  omp_set_num_threads(1);
}

TEST(MultiTensor, GradNormEmptyListAndNonFinite) {
  Tensor acc = Tensor::from_floats({3.0f}, {1}, DType::F32);
  ops::sum_of_squares_accumulate_multi({}, acc);
  EXPECT_EQ(acc.data<float>()[0], 3.0f);
  Tensor big = Tensor::zeros({100000}, DType::F32);
  big.data<float>()[77777] = INFINITY;
  ops::sum_of_squares_accumulate_multi({Tensor::zeros({5}, DType::F32), big}, acc);
  EXPECT_TRUE(std::isinf(acc.data<float>()[0]));
}

// Tensors of these sizes: below a vector, odd tails, a kernel block (4096) and its neighbours, at
// and around the 65536 threshold above which the update is split over threads.
const int64_t kSizes[] = {1, 7, 384, 4097, 65536, 70001};

struct AdamWSet {
  std::vector<Tensor> param, grad, m, v, copy;
  std::vector<double> wd;
};

// Tensors of kSizes with a model copy of `copy_dt` (F32: none); weight decay on every other one.
AdamWSet make_adamw(DType copy_dt, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  AdamWSet s;
  for (int64_t n : kSizes) {
    std::vector<float> p(static_cast<size_t>(n)), g(p.size()), m(p.size()), v(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] = normal(rng) * 0.02f;
      g[i] = rng() % 50 == 0 ? 0.0f : normal(rng) * (rng() % 9 == 0 ? 1e3f : 1.0f);
      m[i] = normal(rng) * 0.01f;
      v[i] = std::fabs(normal(rng)) * 1e-4f;
    }
    s.param.push_back(Tensor::from_floats(p, {n}, DType::F32));
    s.grad.push_back(Tensor::from_floats(g, {n}, DType::F32));
    s.m.push_back(Tensor::from_floats(m, {n}, DType::F32));
    s.v.push_back(Tensor::from_floats(v, {n}, DType::F32));
    s.copy.push_back(copy_dt == DType::F32 ? Tensor() : Tensor::zeros({n}, copy_dt));
    s.wd.push_back(s.param.size() % 2 == 0 ? 0.1 : 0.0);
  }
  return s;
}

void expect_same(const Tensor& a, const Tensor& b, const char* what, size_t index) {
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0) << what << " of tensor " << index;
}

TEST(MultiTensor, AdamWBitwiseEqualsPerTensor) {
  for (DType copy_dt : {DType::F32, DType::BF16, DType::F16})
    for (float clip : {1.0f, 0.37f})
      for (int threads : {1, 2, 3}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(copy_dt) << " clip " << clip << " " << threads << " threads");
        omp_set_num_threads(threads);
        AdamWSet a = make_adamw(copy_dt, 11), b = make_adamw(copy_dt, 11);
        for (int64_t step = 1; step <= 2; ++step) {
          ops::AdamWStep h;
          h.lr = 3e-4;
          h.beta1 = 0.9;
          h.beta2 = 0.95;
          h.step = step;
          h.grad_scale = clip;
          h.weight_decay = 0.5;  // not used by the multi op: each entry has its own
          std::vector<ops::AdamWTensors> list;
          for (size_t i = 0; i < a.param.size(); ++i) {
            list.push_back({a.param[i], a.grad[i], a.m[i], a.v[i], a.copy[i], a.wd[i]});
            ops::AdamWStep hi = h;
            hi.weight_decay = b.wd[i];
            if (b.copy[i].defined())
              ops::adamw_update_(b.param[i], b.grad[i], b.m[i], b.v[i], b.copy[i], hi);
            else
              ops::adamw_update_(b.param[i], b.grad[i], b.m[i], b.v[i], hi);
          }
          ops::adamw_update_multi_(list, h);
          for (size_t i = 0; i < a.param.size(); ++i) {
            expect_same(a.param[i], b.param[i], "param", i);
            expect_same(a.m[i], b.m[i], "exp_avg", i);
            expect_same(a.v[i], b.v[i], "exp_avg_sq", i);
            if (a.copy[i].defined()) expect_same(a.copy[i], b.copy[i], "model copy", i);
          }
        }
      }
  omp_set_num_threads(1);
}

}  // namespace
}  // namespace parallel
