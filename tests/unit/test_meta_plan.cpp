// plan_memory_on_meta (memory_plan.hpp) runs at most 4 * pipeline micro-batches per step: past the
// warm-up the in-flight pattern repeats, so the capped run must plan every rank's allocator peak
// exactly as the run of all the configured micro-batches does, for every schedule. In one process
// with no MPI (the meta ranks talk to no one). test_memory_plan holds the plan to the real
// allocator; this test holds the cap to the uncapped run.
#include <gtest/gtest.h>

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
  const MemoryPlan full = plan_memory_on_meta(config, GetParam().world_size, 1 << 20);
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

}  // namespace
}  // namespace parallel
