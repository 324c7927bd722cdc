// The learning-rate schedule against Megatron-Core's OptimizerParamScheduler.get_lr formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "parallel/error.hpp"
#include "parallel/lr_schedule.hpp"

namespace parallel {
namespace {

TEST(LrSchedule, WarmsUpLinearlyFromZero) {
  LrSchedule s(1e-3, 1e-5, 10, 100, LrDecay::Cosine);
  EXPECT_EQ(s.lr(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr(1), 1e-4);
  EXPECT_DOUBLE_EQ(s.lr(5), 5e-4);
  EXPECT_DOUBLE_EQ(s.lr(10), 1e-3);
}

TEST(LrSchedule, CosineDecaysToMinLr) {
  LrSchedule s(1e-3, 1e-5, 10, 110, LrDecay::Cosine);
  for (int step : {11, 35, 60, 85, 110}) {
    const double r = (step - 10) / 100.0;
    EXPECT_NEAR(s.lr(step), 1e-5 + (1e-3 - 1e-5) * 0.5 * (1 + std::cos(std::numbers::pi * r)), 1e-15) << step;
  }
  EXPECT_NEAR(s.lr(60), (1e-3 + 1e-5) / 2, 1e-15);  // half way
  EXPECT_DOUBLE_EQ(s.lr(110), 1e-5);
  EXPECT_DOUBLE_EQ(s.lr(111), 1e-5);
  EXPECT_DOUBLE_EQ(s.lr(10'000), 1e-5);
}

TEST(LrSchedule, LinearDecay) {
  LrSchedule s(2.0, 0.5, 0, 30, LrDecay::Linear);
  EXPECT_DOUBLE_EQ(s.lr(0), 2.0);  // no warm-up: starts at the peak
  EXPECT_DOUBLE_EQ(s.lr(10), 1.5);
  EXPECT_DOUBLE_EQ(s.lr(20), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(30), 0.5);
  EXPECT_DOUBLE_EQ(s.lr(31), 0.5);
}

TEST(LrSchedule, ConstantAfterWarmup) {
  LrSchedule s(3e-4, 0.0, 4, 100, LrDecay::Constant);
  EXPECT_DOUBLE_EQ(s.lr(2), 1.5e-4);
  for (int step : {4, 5, 99, 100, 1000}) EXPECT_DOUBLE_EQ(s.lr(step), 3e-4);
}

TEST(LrSchedule, FromConfigDecaysOverTheRun) {
  OptimizerConfig c;
  c.lr = 1.0;
  c.min_lr = 0.0;
  c.warmup_steps = 2;
  c.lr_decay = LrDecay::Linear;
  LrSchedule s(c, 12);
  EXPECT_DOUBLE_EQ(s.lr(1), 0.5);
  EXPECT_DOUBLE_EQ(s.lr(7), 0.5);
  EXPECT_DOUBLE_EQ(s.lr(12), 0.0);
}

TEST(LrSchedule, RejectsMinAbovePeak) { EXPECT_THROW(LrSchedule(1e-4, 1e-3, 0, 10, LrDecay::Linear), Error); }

}  // namespace
}  // namespace parallel
