// Parameter + gradient + optimizer-state bytes per parameter, measured from the allocator, against
// ZeRO's formulas (sharding.hpp, docs/optimizer.md), for d = world = 1, 2, 4, 8 data-parallel ranks:
//   sharding             fp32       bf16 params + fp32 grads/main
//   none                 16         18
//   optim                8 + 8/d    6 + 12/d
//   optim_grads          4 + 12/d   2 + 16/d
//   optim_grads_params   16/d       18/d
// Under bf16 the model computes on the buffer's 16-bit parameters themselves (precision.hpp): there
// is no fp32 copy of the weights beyond the optimizer's main weights, so the table holds exactly.
// With optim_grads_params the step's peak of gathered parameters is at most the prefetch window:
// the largest (prefetch_units + 1) units plus the embedding a tied output layer reads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "mpi_test.hpp"
#include "parallel/allocator.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/sharding.hpp"

namespace parallel {
namespace {

using testing::world;

ModelConfig config() {
  ModelConfig c;
  // ~2.9M parameters: bucket padding is far below 5 %; 6 layers, so that ZeRO-3's prefetch window
  // (the embedding, a layer and the next) is well below the whole model.
  c.num_layers = 6;
  c.hidden_size = 192;
  c.num_attention_heads = 4;
  c.vocab_size = 1000;
  c.seq_length = 8;
  return c;
}

struct Case {
  const char* label;
  Precision precision;
  Sharding sharding;
  OptimizerType type = OptimizerType::AdamW;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }

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
    oc.sharding = tc.sharding;
    oc.distributed = tc.sharding != Sharding::None;
    oc.type = tc.type;
    DataParallel ddp({&model}, world(), DataParallelOptions::from(oc, tc.precision));
    const std::unique_ptr<Optimizer> opt = make_optimizer(ddp, oc, OptimizerGroups{nullptr, &world()});
    const ParamAndGradBuffer& buf = ddp.buffer();
    const double n = static_cast<double>(buf.numel_unpadded());
    auto measured = [&] {
      const std::size_t now = memory_stats(Device::cpu()).allocated;
      return static_cast<double>(now - base) / n;
    };
    // Muon: its matrices keep one moment, not two.
    double muon = 0;
    for (const Parameter* p : buf.params())
      if (tc.type == OptimizerType::Muon && muon_parameter(*p)) muon += static_cast<double>(buf.numel_of(p));
    if (tc.type == OptimizerType::Muon) EXPECT_GT(muon / n, 0.5) << "the hidden matrices hold most elements";
    const double expected = zero_bytes_per_parameter(tc.sharding, tc.precision, d, muon / n);
    const double before_step = measured();
    EXPECT_NEAR(before_step, expected, 0.05 * expected) << "d = " << d;
    // The same from the pieces' own accounting: the allocator saw nothing else.
    const double buffer = static_cast<double>(ddp.buffer().numel());
    const double param_bytes = dtype_size(tc.precision == Precision::FP32 ? DType::F32 : DType::BF16);
    const double pieces = buffer * param_bytes / (ddp.buffer().params_sharded() ? d : 1) +
                          buffer * 4.0 / (ddp.buffer().grads_sharded() ? d : 1) +
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
    if (ddp.buffer().params_sharded()) {
      // The peak of gathered parameters: the unit computing plus the prefetched ones (and the
      // embedding, which the tied output layer reads), never the whole model.
      std::vector<int64_t> unit_bytes;
      for (const auto& buckets : ddp.unit_buckets()) {
        int64_t bytes = 0;
        for (int b : buckets)
          bytes +=
              ddp.buffer().buckets()[static_cast<std::size_t>(b)].numel * static_cast<int64_t>(param_bytes);
        unit_bytes.push_back(bytes);
      }
      const int64_t embedding = unit_bytes.front();
      std::sort(unit_bytes.rbegin(), unit_bytes.rend());
      const int window = oc.prefetch_units + 1;
      int64_t bound = embedding;
      for (int i = 0; i < window && i < static_cast<int>(unit_bytes.size()); ++i)
        bound += unit_bytes[static_cast<std::size_t>(i)];
      int64_t all = 0;
      for (int64_t b : unit_bytes) all += b;
      EXPECT_GT(ddp.peak_gathered_param_bytes(), 0);
      EXPECT_LE(ddp.peak_gathered_param_bytes(), bound);
      EXPECT_LT(bound, all) << "the model is too small for the bound to mean anything";
      if (world().rank() == 0)
        std::printf("[memory] %s d=%d: peak gathered %.3f MB, window bound %.3f MB, whole model %.3f MB\n",
                    tc.label, d, ddp.peak_gathered_param_bytes() / 1e6, bound / 1e6, all / 1e6);
      ddp.unshard();  // to read the values below
    }
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
    ddp.reshard();
  }
  EXPECT_EQ(memory_stats(Device::cpu()).allocated, base) << "everything is returned";
}

INSTANTIATE_TEST_SUITE_P(
    Precisions, OptimizerMemory,
    ::testing::Values(Case{"Fp32Muon", Precision::FP32, Sharding::None, OptimizerType::Muon},
                      Case{"Bf16MuonOptimGradsParams", Precision::BF16, Sharding::OptimGradsParams,
                           OptimizerType::Muon},
                      Case{"Fp32AdamW", Precision::FP32, Sharding::None},
                      Case{"Fp32Distributed", Precision::FP32, Sharding::Optim},
                      Case{"Fp32OptimGrads", Precision::FP32, Sharding::OptimGrads},
                      Case{"Fp32OptimGradsParams", Precision::FP32, Sharding::OptimGradsParams},
                      Case{"Bf16AdamW", Precision::BF16, Sharding::None},
                      Case{"Bf16Distributed", Precision::BF16, Sharding::Optim},
                      Case{"Bf16OptimGrads", Precision::BF16, Sharding::OptimGrads},
                      Case{"Bf16OptimGradsParams", Precision::BF16, Sharding::OptimGradsParams}),
    [](const auto& info) { return std::string(info.param.label); });

}  // namespace
}  // namespace parallel
