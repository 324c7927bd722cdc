// plan_memory_on_meta (memory_plan.hpp) shortens its runs, and this test holds each shortcut to the
// full run, in one process with no MPI (the meta ranks talk to no one); test_memory_plan holds the
// plan to the real allocator.
//  - At most 4 * pipeline micro-batches per step: past the warm-up the in-flight pattern repeats,
//    so the capped run must plan every rank's allocator peak exactly as the run of all the
//    configured micro-batches does, for every schedule.
//  - Many identical layers per chunk: two short runs, extrapolated.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "meta_step.hpp"
#include "parallel/config.hpp"
#include "parallel/memory_plan.hpp"

namespace parallel {
namespace {

using testing::kMetaModel;
using testing::MetaLayout;

class MetaPlanCapTest : public ::testing::TestWithParam<MetaLayout> {};

TEST_P(MetaPlanCapTest, CappedMicroBatchesPlanTheSamePeak) {
  const Config config = parse_config(kMetaModel, GetParam().overrides, GetParam().world_size);
  const MemoryPlan capped = plan_memory_on_meta(config, GetParam().world_size);
  const MemoryPlan full = plan_memory_on_meta(config, GetParam().world_size, {.max_micro_batches = 1 << 20});
  ASSERT_EQ(capped.ranks.size(), full.ranks.size());
  for (std::size_t r = 0; r < full.ranks.size(); ++r) {
    EXPECT_EQ(capped.ranks[r].allocator_bytes, full.ranks[r].allocator_bytes)
        << GetParam().label << " rank " << r;
    EXPECT_EQ(capped.ranks[r].peak_bytes, full.ranks[r].peak_bytes) << GetParam().label << " rank " << r;
  }
  std::printf("%s: rank 0 plans %lld bytes; largest rank %d\n", GetParam().label,
              static_cast<long long>(full.ranks[0].allocator_bytes), full.largest().rank);
}

// Micro-batches of 4 samples, 32 per data-parallel rank and step: the cap (4 * pipeline) cuts
// every one of these runs.
INSTANTIATE_TEST_SUITE_P(
    Schedules, MetaPlanCapTest,
    ::testing::Values(MetaLayout{"dp1", 1, {"train.global_batch_size=128"}},
                      MetaLayout{"pp2_1f1b", 2, {"parallel.pipeline=2", "train.global_batch_size=128"}},
                      MetaLayout{"pp2_interleaved",
                                 2,
                                 {"parallel.pipeline=2", "parallel.virtual_stages=2",
                                  "train.global_batch_size=128"}},
                      MetaLayout{"pp4_zb_h1",
                                 4,
                                 {"parallel.pipeline=4", "parallel.pipeline_schedule=zb-h1",
                                  "train.global_batch_size=128"}},
                      MetaLayout{"pp2_zb_v",
                                 2,
                                 {"parallel.pipeline=2", "parallel.virtual_stages=2",
                                  "parallel.pipeline_schedule=zb-v", "train.global_batch_size=128"}},
                      MetaLayout{"pp2_dualpipe_v_dp2",
                                 4,
                                 {"parallel.pipeline=2", "parallel.virtual_stages=2",
                                  "parallel.pipeline_schedule=dualpipe-v", "train.global_batch_size=256"}}),
    [](const ::testing::TestParamInfo<MetaLayout>& info) { return std::string(info.param.label); });

// Chunks of many identical layers: two short runs extrapolated to the configured layers (the
// default above 16 layers per chunk) against the run of every layer. Every figure is affine in the
// layers (padding included, on these layouts): equal to the byte on every rank.
class MetaPlanLayersTest : public ::testing::TestWithParam<MetaLayout> {};

TEST_P(MetaPlanLayersTest, ExtrapolatedLayersPlanAsEveryLayerRun) {
  const Config config = parse_config(kMetaModel, GetParam().overrides, GetParam().world_size);
  const MemoryPlan line = plan_memory_on_meta(config, GetParam().world_size);
  const MemoryPlan full = plan_memory_on_meta(config, GetParam().world_size, {.max_layers = 0});
  ASSERT_EQ(line.ranks.size(), full.ranks.size());
  for (std::size_t r = 0; r < full.ranks.size(); ++r) {
    const double a = static_cast<double>(line.ranks[r].allocator_bytes);
    const double b = static_cast<double>(full.ranks[r].allocator_bytes);
    std::printf("%s rank %zu: extrapolated %.0f bytes, every layer run %.0f bytes (%+.3f %%)\n",
                GetParam().label, r, a, b, 100.0 * (a / b - 1.0));
    EXPECT_EQ(line.ranks[r].allocator_bytes, full.ranks[r].allocator_bytes)
        << GetParam().label << " rank " << r;
  }
}

// 20 to 40 layers per chunk (the run of every layer takes a second or two).
INSTANTIATE_TEST_SUITE_P(
    Layers, MetaPlanLayersTest,
    ::testing::Values(MetaLayout{"dp1_40_layers", 1, {"model.num_layers=40", "train.global_batch_size=8"}},
                      MetaLayout{
                          "pp2_1f1b_80_layers",
                          2,
                          {"parallel.pipeline=2", "model.num_layers=80", "train.global_batch_size=16"}},
                      MetaLayout{"pp2_interleaved_full_recompute_80_layers",
                                 2,
                                 {"parallel.pipeline=2", "parallel.virtual_stages=2", "model.num_layers=80",
                                  "train.recompute=full", "train.global_batch_size=16"}},
                      MetaLayout{"dp2_zero3_moe_freq2_40_layers",
                                 2,
                                 {"model.num_layers=40", "model.num_experts=4", "model.moe_router_topk=2",
                                  "parallel.expert=2", "model.moe_layer_freq=2",
                                  "optimizer.sharding=optim_grads_params", "train.global_batch_size=16"}}),
    [](const ::testing::TestParamInfo<MetaLayout>& info) { return std::string(info.param.label); });

}  // namespace
}  // namespace parallel
