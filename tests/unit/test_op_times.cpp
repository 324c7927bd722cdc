// The opt-in op timer (op_times.hpp): with PARALLEL_OP_TIMES=1 every outermost ops:: call on the
// CPU is counted once under its own name, nested calls in their caller, Tensor::copy_ / fill_ as
// the meta step names them, and a call that fails its checks still closes its span.
#include <gtest/gtest.h>

#include <cstdlib>

#include "parallel/error.hpp"
#include "parallel/meta.hpp"
#include "parallel/op_times.hpp"
#include "parallel/ops.hpp"
#include "parallel/tensor.hpp"

namespace parallel {
namespace {

// The flag is read once, at the first op: set it before any test runs.
const bool set_before_any_op = [] { return setenv("PARALLEL_OP_TIMES", "1", 1) == 0; }();

TEST(OpTimes, EachOuterCallCountsOnceUnderItsName) {
  ASSERT_TRUE(set_before_any_op);
  ASSERT_TRUE(ops::op_times_enabled());
  Tensor a = Tensor::full({4, 8}, 1.0f, DType::F32), b = Tensor::full({4, 8}, 2.0f, DType::F32);
  Tensor c = Tensor::empty({4, 8}, DType::F32);
  ops::reset_op_times();
  for (int i = 0; i < 3; ++i) ops::add(a, b, c);
  ops::gelu_forward(a, c);
  c.fill_(0.0);
  c.copy_(a);
  const auto t = ops::op_times();
  ASSERT_EQ(t.count("add"), 1u);
  EXPECT_EQ(t.at("add").calls, 3);
  EXPECT_GT(t.at("add").seconds, 0.0);
  EXPECT_EQ(t.at("gelu_forward").calls, 1);
  EXPECT_EQ(t.at("fill_").calls, 1);
  EXPECT_EQ(t.at("copy_").calls, 1);
  EXPECT_EQ(t.size(), 4u);  // nothing else: no nested op counted on its own
  EXPECT_EQ(c.to_float_vector(), a.to_float_vector());
  ops::reset_op_times();
  EXPECT_TRUE(ops::op_times().empty());
}

TEST(OpTimes, AnOpThatFailsItsChecksStillClosesItsSpan) {
  Tensor a = Tensor::full({4}, 1.0f, DType::F32), b = Tensor::full({5}, 1.0f, DType::F32);
  Tensor c = Tensor::empty({4}, DType::F32);
  ops::reset_op_times();
  EXPECT_THROW(ops::add(a, b, c), Error);
  ops::add(a, a, c);  // the failed call left no open span: this one is outermost and counted
  EXPECT_EQ(ops::op_times().at("add").calls, 2);
}

}  // namespace
}  // namespace parallel
