// The attention kernels' launch rules (kernels/attention/attention_launch.hpp) on the CPU: which
// problems the tensor-core kernels take, and how the fp32 kernels split batch x heads over launches
// of at most 65535 grid rows (past which one launch failed with a bare launch error).
#include <gtest/gtest.h>

#include "../../kernels/attention/attention_launch.hpp"

namespace parallel::kernels {
namespace {

TEST(AttentionLaunch, TensorCoreKernelsTakeWhatTheyImplement) {
  const AttentionShape ok{1024, 8, 16, 16, 64};
  EXPECT_TRUE(attention_mma_can_implement(ok, DType::BF16, true));
  EXPECT_TRUE(attention_mma_can_implement(ok, DType::F16, true));
  EXPECT_FALSE(attention_mma_can_implement(ok, DType::F32, true));
  EXPECT_FALSE(attention_mma_can_implement(ok, DType::BF16, false));  // a misaligned view
  EXPECT_TRUE(attention_mma_can_implement({1024, 8, 16, 4, 128}, DType::BF16, true));
  EXPECT_FALSE(attention_mma_can_implement({1024, 8, 16, 16, 40}, DType::BF16, true));  // head dim
  EXPECT_FALSE(attention_mma_can_implement({1024, 8, 16, 3, 64}, DType::BF16, true));   // hq % hkv
  // A value head size other than the query/key one (MLA) goes to the fp32 kernels; dv 0 means d.
  EXPECT_FALSE(attention_mma_can_implement({1024, 8, 16, 16, 128, 64}, DType::BF16, true));
  EXPECT_FALSE(attention_mma_can_implement({1024, 8, 16, 16, 64, 128}, DType::BF16, true));
  EXPECT_TRUE(attention_mma_can_implement({1024, 8, 16, 16, 128, 128}, DType::BF16, true));
  EXPECT_EQ((AttentionShape{1, 1, 1, 1, 192}.value_dim()), 192);
  EXPECT_EQ((AttentionShape{1, 1, 1, 1, 192, 128}.value_dim()), 128);
  // b * hq at the grid.y limit and one past it.
  EXPECT_TRUE(attention_mma_can_implement({4, 65535, 1, 1, 64}, DType::BF16, true));
  EXPECT_FALSE(attention_mma_can_implement({4, 65536, 1, 1, 64}, DType::BF16, true));
  EXPECT_FALSE(attention_mma_can_implement({4, 4096, 17, 1, 64}, DType::BF16, true));
  EXPECT_FALSE(attention_mma_can_implement({int64_t{1} << 30, 1, 1, 1, 64}, DType::BF16, true));
}

void expect_cover(int64_t n, int64_t limit) {
  SCOPED_TRACE(::testing::Message() << "n " << n << " limit " << limit);
  const auto chunks = grid_y_chunks(n, limit);
  int64_t next = 0;
  for (const GridChunk& c : chunks) {
    EXPECT_EQ(c.first, next);  // in order, no gap, no overlap
    EXPECT_GT(c.count, 0);
    EXPECT_LE(c.count, limit);
    next += c.count;
  }
  EXPECT_EQ(next, n);
  EXPECT_EQ(static_cast<int64_t>(chunks.size()), (n + limit - 1) / limit);
}

TEST(AttentionLaunch, Fp32KernelsCoverAnyBatchTimesHeads) {
  EXPECT_TRUE(grid_y_chunks(0).empty());
  ASSERT_EQ(grid_y_chunks(1).size(), 1u);
  ASSERT_EQ(grid_y_chunks(kMaxGridY).size(), 1u);
  EXPECT_EQ(grid_y_chunks(kMaxGridY)[0].count, kMaxGridY);
  const auto two = grid_y_chunks(66000);  // the GPU test's b * hq
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[1].first, kMaxGridY);
  EXPECT_EQ(two[1].count, 66000 - kMaxGridY);
  for (int64_t n : {int64_t{1}, kMaxGridY - 1, kMaxGridY, kMaxGridY + 1, 3 * kMaxGridY, int64_t{1} << 24})
    expect_cover(n, kMaxGridY);
  for (int64_t n = 0; n < 40; n++) expect_cover(n, 7);
}

}  // namespace
}  // namespace parallel::kernels
