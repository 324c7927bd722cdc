// The trainer's guard (include/parallel/training_guard.hpp): non-finite steps stop or skip, spikes
// over the running median are seen once the window is full, and too many skips in a row stop.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "parallel/training_guard.hpp"

using namespace parallel;
using ::testing::HasSubstr;
using Action = GuardVerdict::Action;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(TrainingGuard, NonFiniteStopsByDefault) {
  TrainConfig t;
  TrainingGuard guard(t);
  GuardVerdict v = guard.check(kNaN, 1.0, true);
  EXPECT_EQ(v.action, Action::Stop);
  EXPECT_TRUE(v.nonfinite);
  EXPECT_EQ(v.what, "the loss is nan");
  EXPECT_EQ(v.rule, "train.nonfinite_policy = stop");
  v = guard.check(2.5, kInf, true);
  EXPECT_EQ(v.action, Action::Stop);
  EXPECT_EQ(v.what, "the gradient norm is inf (the loss is 2.5000)");
  // Under fp16 an overflow is the loss scaler's: the norm is not looked at, the loss is.
  EXPECT_EQ(guard.check(2.5, kInf, false).action, Action::Update);
  EXPECT_EQ(guard.check(kInf, 0.0, false).action, Action::Stop);
}

TEST(TrainingGuard, NonFiniteSkipsWhenAskedAndCountsIt) {
  TrainConfig t;
  t.nonfinite_policy = GuardPolicy::Skip;
  TrainingGuard guard(t);
  const GuardVerdict v = guard.check(kNaN, kNaN, true);
  EXPECT_EQ(v.action, Action::Skip);
  EXPECT_EQ(v.what, "the loss is nan and the gradient norm nan");
  EXPECT_EQ(guard.record(v, false, kNaN, kNaN), "");
  EXPECT_EQ(guard.skipped_steps(), 1);
  EXPECT_EQ(guard.nonfinite_steps(), 1);
  EXPECT_EQ(guard.spikes(), 0);
}

TEST(TrainingGuard, SpikesOverTheRunningMedian) {
  TrainConfig t;
  t.spike_factor = 5;
  t.spike_window = 3;
  TrainingGuard guard(t);
  // Not checked until the window is full.
  for (double loss : {10.0, 9.0}) {
    const GuardVerdict v = guard.check(loss * 100, 1.0, true);
    EXPECT_EQ(v.action, Action::Update);
    guard.record(v, true, loss, 1.0);
  }
  guard.record(guard.check(8.0, 1.0, true), true, 8.0, 1.0);
  // Median loss 9, median norm 1.
  EXPECT_EQ(guard.check(44.0, 4.9, true).action, Action::Update);
  GuardVerdict v = guard.check(46.0, 1.0, true);
  EXPECT_EQ(v.action, Action::Skip);
  EXPECT_TRUE(v.spike);
  EXPECT_THAT(v.what,
              HasSubstr("the loss 46 is 5.1x the median 9 of the last 3 steps (train.spike_factor = 5)"));
  EXPECT_EQ(v.rule, "train.spike_policy = skip");
  guard.record(v, false, 46.0, 1.0);
  v = guard.check(9.0, 60.0, true);
  EXPECT_THAT(v.what, HasSubstr("the gradient norm 60 is 60.0x the median 1"));
  guard.record(v, false, 9.0, 60.0);
  EXPECT_EQ(guard.spikes(), 2);
  EXPECT_EQ(guard.skipped_steps(), 2);
  // Skipped steps stay out of the window: the median is still 9.
  EXPECT_EQ(guard.check(46.0, 1.0, true).action, Action::Skip);

  t.spike_policy = GuardPolicy::Warn;
  TrainingGuard warn(t);
  for (int i = 0; i < 3; ++i) warn.record(warn.check(1.0, 1.0, true), true, 1.0, 1.0);
  v = warn.check(100.0, 1.0, true);
  EXPECT_TRUE(v.spike);
  EXPECT_EQ(v.action, Action::Update);
  EXPECT_EQ(v.rule, "train.spike_policy = warn");

  t.spike_policy = GuardPolicy::Stop;
  TrainingGuard stop(t);
  for (int i = 0; i < 3; ++i) stop.record(stop.check(1.0, 1.0, true), true, 1.0, 1.0);
  EXPECT_EQ(stop.check(100.0, 1.0, true).action, Action::Stop);
}

TEST(TrainingGuard, TooManySkipsInARowStop) {
  TrainConfig t;
  t.nonfinite_policy = GuardPolicy::Skip;
  t.max_consecutive_skips = 3;
  TrainingGuard guard(t);
  const GuardVerdict bad = guard.check(kNaN, kNaN, true);
  EXPECT_EQ(guard.record(bad, false, kNaN, kNaN), "");
  EXPECT_EQ(guard.record(bad, false, kNaN, kNaN), "");
  guard.record(guard.check(1.0, 1.0, true), true, 1.0, 1.0);  // an update resets the count
  EXPECT_EQ(guard.record(bad, false, kNaN, kNaN), "");
  EXPECT_EQ(guard.record(GuardVerdict{}, false, 1.0, 0.0), "");  // an fp16 overflow counts too
  EXPECT_EQ(guard.record(bad, false, kNaN, kNaN),
            "3 updates in a row were skipped (train.max_consecutive_skips = 3)");
  EXPECT_EQ(guard.skipped_steps(), 5);
}

}  // namespace
