// Parameter + gradient + optimizer-state bytes per parameter, measured from the allocator, against
// Megatron's table (docs/optimizer.md), for d = world = 1, 2, 4 data-parallel ranks:
//   fp32:                           16 plain AdamW,   8 + 8/d distributed optimizer
//   bf16 params + fp32 grads/main:  18 plain AdamW,   6 + 12/d distributed optimizer
// Under bf16 the model computes on the buffer's 16-bit parameters themselves (precision.hpp): there
// is no fp32 copy of the weights beyond the optimizer's main weights, so the table holds exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "mpi_test.hpp"
#include "parallel/allocator.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/optimizer.hpp"

namespace parallel {
namespace {

using testing::world;

ModelConfig config() {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 256;  // ~1.9M parameters: bucket padding is far below 5 %
  c.num_attention_heads = 4;
  c.vocab_size = 1000;
  c.seq_length = 8;
  return c;
}

struct Case {
  const char* label;
  Precision precision;
  bool distributed;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }

double megatron_bytes_per_param(const Case& c, int d) {
  if (c.precision == Precision::FP32) return c.distributed ? 8.0 + 8.0 / d : 16.0;
  return c.distributed ? 6.0 + 12.0 / d : 18.0;
}

// A position-weighted sum of every parameter: equal on two ranks only if the values are.
double ops_checksum(GPTModel& model) {
  double sum = 0;
  for (Parameter* p : model.parameters()) {
    const auto v = p->value.to_float_vector();
    for (std::size_t i = 0; i < v.size(); ++i) sum += v[i] * static_cast<double>(i % 7 + 1);
  }
  return sum;
}

class OptimizerMemory : public ::testing::TestWithParam<Case> {};

TEST_P(OptimizerMemory, MatchesMegatronsTable) {
  const Case tc = GetParam();
  const int d = world().size();
  auto solo = world().split(world().rank(), 0);
  const ModelConfig c = config();
  const std::size_t base = memory_stats(Device::cpu()).allocated;
  {
    GPTModel model(c, {0, c.num_layers, true, true}, {.seed = 1, .precision = tc.precision}, *solo);
    OptimizerConfig oc;
    oc.distributed = tc.distributed;
    DataParallel ddp({&model}, world(), DataParallelOptions::from(oc, tc.precision));
    std::unique_ptr<Optimizer> opt;
    if (tc.distributed)
      opt = std::make_unique<DistributedOptimizer>(ddp, oc, OptimizerGroups{nullptr, &world()});
    else
      opt = std::make_unique<AdamW>(ddp, oc, OptimizerGroups{nullptr, &world()});
    const ParamAndGradBuffer& buf = ddp.buffer();
    const double n = static_cast<double>(buf.numel_unpadded());
    auto measured = [&] {
      const std::size_t now = memory_stats(Device::cpu()).allocated;
      return static_cast<double>(now - base) / n;
    };
    const double expected = megatron_bytes_per_param(tc, d);
    const double before_step = measured();
    EXPECT_NEAR(before_step, expected, 0.05 * expected) << "d = " << d;
    // The same from the pieces' own accounting: the allocator saw nothing else.
    const double pieces = static_cast<double>(ddp.buffer().numel()) *
                              (dtype_size(tc.precision == Precision::FP32 ? DType::F32 : DType::BF16) + 4) +
                          static_cast<double>(opt->state_bytes());
    EXPECT_NEAR(before_step * n, pieces, 1.0) << "unexplained allocations";

    // A whole step allocates nothing that stays.
    ddp.zero_grad();
    std::vector<int32_t> ids(static_cast<std::size_t>(c.seq_length));
    for (std::size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<int32_t>((i * 37 + world().rank()) % 1000);
    {
      const Tensor tokens = Tensor::from_vector(ids, {1, c.seq_length});
      auto act = model.new_activations();
      model.forward(tokens, tokens, *act);
      model.backward(Tensor::full({1}, 1.0 / c.seq_length, DType::F32), *act);
    }
    ddp.finish_grad_sync();
    const StepResult r = opt->step(1e-3);
    EXPECT_FALSE(r.skipped);
    EXPECT_GT(r.grad_norm, 0.0);
    ddp.finish_param_gather();
    EXPECT_EQ(measured(), before_step);
    // Low precision: what the model computes with is exactly the bf16 parameters.
    if (tc.precision != Precision::FP32)
      for (Parameter* p : model.parameters())
        for (float x : p->value.to_float_vector()) ASSERT_EQ(x, bf16_to_float(float_to_bf16(x))) << p->name;
    // Every dp rank ends with the same parameters (the all-gather / all-reduce worked).
    Tensor check = Tensor::full({1}, ops_checksum(model), DType::F32);
    Tensor max = check.clone(), min = check.clone();
    world().all_reduce(max, ReduceOp::Max, false);
    world().all_reduce(min, ReduceOp::Min, false);
    EXPECT_EQ(max.to_float_vector()[0], min.to_float_vector()[0]);
    if (world().rank() == 0)
      std::printf("[memory] %s d=%d: %.3f bytes/param (Megatron %.3f), state %.3f\n", tc.label, d,
                  before_step, expected, static_cast<double>(opt->state_bytes()) / n);
  }
  EXPECT_EQ(memory_stats(Device::cpu()).allocated, base) << "everything is returned";
}

INSTANTIATE_TEST_SUITE_P(Precisions, OptimizerMemory,
                         ::testing::Values(Case{"Fp32AdamW", Precision::FP32, false},
                                           Case{"Fp32Distributed", Precision::FP32, true},
                                           Case{"Bf16AdamW", Precision::BF16, false},
                                           Case{"Bf16Distributed", Precision::BF16, true}),
                         [](const auto& info) { return std::string(info.param.label); });

}  // namespace
}  // namespace parallel
