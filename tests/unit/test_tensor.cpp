#include <gtest/gtest.h>

#include <numeric>

#include "parallel/allocator.hpp"
#include "parallel/tensor.hpp"

using namespace parallel;

namespace {
std::vector<float> iota(int64_t n, float start = 0.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}
}  // namespace

TEST(Tensor, EmptyHasShapeStridesAndBytes) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::BF16);
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_THROW(t.size(3), Error);
  EXPECT_THROW(Tensor::empty({2, -1}, DType::F32), Error);
  EXPECT_FALSE(Tensor().defined());
}

TEST(Tensor, AllocatorCountsLiveBytes) {
  const auto before = memory_stats(Device::cpu()).allocated;
  {
    Tensor a = Tensor::empty({1000}, DType::F32);
    Tensor view = a.narrow(0, 10, 20);  // shares storage: no new bytes
    EXPECT_EQ(memory_stats(Device::cpu()).allocated, before + 4000);
    a = Tensor();
    EXPECT_EQ(memory_stats(Device::cpu()).allocated, before + 4000);  // the view keeps it alive
  }
  EXPECT_EQ(memory_stats(Device::cpu()).allocated, before);
}

TEST(Tensor, ViewSharesStorageAndInfersOneDimension) {
  Tensor t = Tensor::from_vector(iota(12), {3, 4});
  Tensor v = t.view({2, -1});
  EXPECT_EQ(v.shape(), (Shape{2, 6}));
  EXPECT_EQ(v.data_ptr(), t.data_ptr());
  v.data<float>()[7] = 100.0f;
  EXPECT_EQ(t.data<float>()[7], 100.0f);
  EXPECT_THROW(t.view({5, -1}), Error);
  EXPECT_THROW(t.view({-1, -1}), Error);
  EXPECT_THROW(t.data<int32_t>(), Error);
}

TEST(Tensor, NarrowAlongEachDimension) {
  Tensor t = Tensor::from_vector(iota(24), {2, 3, 4});
  Tensor rows = t.narrow(1, 1, 2);  // [2, 2, 4], strided
  EXPECT_FALSE(rows.is_contiguous());
  EXPECT_EQ(rows.to_float_vector(),
            (std::vector<float>{4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23}));
  Tensor cols = t.narrow(2, 3, 1);
  EXPECT_EQ(cols.to_float_vector(), (std::vector<float>{3, 7, 11, 15, 19, 23}));
  Tensor first = t.narrow(0, 1, 1);
  EXPECT_TRUE(first.is_contiguous());
  EXPECT_EQ(first.to_float_vector(), iota(12, 12));
  Tensor sel = t.select(1);
  EXPECT_EQ(sel.shape(), (Shape{3, 4}));
  EXPECT_THROW(rows.view({16}), Error);  // not contiguous
  Tensor packed = rows.contiguous();
  EXPECT_TRUE(packed.is_contiguous());
  EXPECT_EQ(packed.to_float_vector(), rows.to_float_vector());
  EXPECT_THROW(t.narrow(1, 2, 2), Error);
  EXPECT_THROW(t.narrow(3, 0, 1), Error);
}

// A view of a strided tensor splits or merges only dimensions whose elements are adjacent (as
// attention's [s, b, heads, d] views into the fused [s, b, 3 h] qkv output do).
TEST(Tensor, ViewOfStridedTensorKeepsItsStrides) {
  Tensor t = Tensor::from_vector(iota(2 * 3 * 12), {2, 3, 12});
  Tensor k = t.narrow(2, 4, 4);  // [2, 3, 4], strides [36, 12, 1]
  Tensor heads = k.view({2, 3, 2, 2});
  EXPECT_EQ(heads.strides(), (Shape{36, 12, 2, 1}));
  EXPECT_EQ(heads.data_ptr(), k.data_ptr());
  EXPECT_EQ(heads.to_float_vector(), k.to_float_vector());
  Tensor rows = k.view({6, 4});  // positions and batch merge: 36 = 3 * 12
  EXPECT_EQ(rows.strides(), (Shape{12, 1}));
  EXPECT_EQ(rows.to_float_vector(), k.to_float_vector());
  EXPECT_EQ(heads.view({2, 3, 4}).strides(), k.strides());
  EXPECT_EQ(k.view({1, 2, 3, 1, 4}).to_float_vector(), k.to_float_vector());
  EXPECT_THROW(k.view({2, 12}), Error);  // would merge a row's 4 elements with the next row's
  EXPECT_THROW(k.view({24}), Error);
}

TEST(Tensor, CopyIntoStridedDestinationConverts) {
  Tensor t = Tensor::zeros({3, 4}, DType::BF16);
  Tensor src = Tensor::from_vector(std::vector<float>{1.5f, 2.5f, 3.5f}, {3, 1});
  t.narrow(1, 2, 1).copy_(src);
  EXPECT_EQ(t.to_float_vector(), (std::vector<float>{0, 0, 1.5f, 0, 0, 0, 2.5f, 0, 0, 0, 3.5f, 0}));
  EXPECT_THROW(t.copy_(src), Error);  // shape mismatch
}

TEST(Tensor, DtypeRoundTrips) {
  std::vector<float> values = {0.0f, 1.0f, -2.0f, 0.15625f, 1024.0f, -3.75f};
  Tensor f32 = Tensor::from_vector(values, {2, 3});
  for (DType t : {DType::BF16, DType::F16, DType::F32}) {
    Tensor c = f32.to(t);
    EXPECT_EQ(c.dtype(), t);
    EXPECT_EQ(c.to(DType::F32).to_float_vector(), values) << dtype_name(t);  // all exactly representable
  }
  Tensor inexact = Tensor::from_vector(std::vector<float>{0.1f}, {1}).to(DType::BF16);
  EXPECT_EQ(inexact.to_float_vector()[0], bf16_to_float(float_to_bf16(0.1f)));
  Tensor ints = Tensor::from_vector(std::vector<int32_t>{-3, 7, 123456}, {3});
  EXPECT_EQ(ints.to(DType::I64).data<int64_t>()[2], 123456);
  EXPECT_EQ(Tensor::from_floats({1.0f, 2.0f}, {2}, DType::F16).to_float_vector(), (std::vector<float>{1, 2}));
}

TEST(Tensor, FillZerosAndClone) {
  Tensor t = Tensor::full({5}, 2.5, DType::F16);
  EXPECT_EQ(t.to_float_vector(), std::vector<float>(5, 2.5f));
  Tensor c = t.clone();
  EXPECT_NE(c.data_ptr(), t.data_ptr());
  t.zero_();
  EXPECT_EQ(t.to_float_vector(), std::vector<float>(5, 0.0f));
  EXPECT_EQ(c.to_float_vector(), std::vector<float>(5, 2.5f));
  Tensor m = Tensor::zeros({2, 3}, DType::F32);
  m.narrow(1, 1, 1).fill_(9.0);
  EXPECT_EQ(m.to_float_vector(), (std::vector<float>{0, 9, 0, 0, 9, 0}));
}

TEST(Tensor, FromBlobBorrowsWithoutCounting) {
  std::vector<float> host = iota(6);
  const auto before = memory_stats(Device::cpu());
  Tensor t = Tensor::from_blob(host.data(), {2, 3}, DType::F32);
  EXPECT_EQ(memory_stats(Device::cpu()).allocated, before.allocated);
  t.data<float>()[0] = 42.0f;
  EXPECT_EQ(host[0], 42.0f);
}

TEST(Tensor, ZeroSizedTensorsAreFine) {
  Tensor t = Tensor::empty({0, 4}, DType::F32);
  EXPECT_EQ(t.numel(), 0);
  EXPECT_TRUE(t.to_float_vector().empty());
  Tensor u = Tensor::empty({0, 4}, DType::F32);
  u.copy_(t);
  EXPECT_EQ(t.to(DType::BF16).numel(), 0);
}

TEST(Tensor, CudaWithoutBackendOrDeviceIsAClearError) {
  // Passes (not skips) with a GPU, where every skip counts as a failure; tests/cuda covers device
  // tensors there.
  if (cuda_available()) return;
  EXPECT_THROW(Tensor::empty({4}, DType::F32, Device::cuda(0)), Error);
}
