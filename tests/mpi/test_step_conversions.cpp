// What a training step after the first costs besides its arithmetic (issue 28, items 2 and 5):
//   - conversion passes (conversion_passes.hpp): a bf16 / fp16 step widens and narrows 16-bit
//     values inside the kernels that read and write them, never as a whole-tensor pass of its own.
//     The bound is exact, 0 in every step, so that a pass that comes back fails here instead of
//     costing time unnoticed (before issue 28 a tiny bf16 step made 416, 20.8 MB);
//   - minor page faults (getrusage): after the first steps every buffer a step needs is in the
//     allocator's cache or glibc's heaps with every page touched, so later steps take (almost) none.
// Each layout also prints its losses and a hash of the final weights, bit for bit, for comparing
// builds.
// One rank (the tiny GPT, 4 micro-batches), and at 2 ranks pipeline 2 and tensor 2 (sequence
// parallel): the same step with the pipeline's transfers and the tensor-parallel collectives.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "parallel/config.hpp"
#include "parallel/context_parallel.hpp"
#include "parallel/conversion_passes.hpp"
#include "parallel/gpt_dataset.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/pipeline.hpp"
#include "parallel/tensor.hpp"
#include "parallel/train_step.hpp"

namespace parallel {
namespace {

using testing::world;

constexpr const char* kModel = R"(
model:
  num_layers: 2
  hidden_size: 64
  num_attention_heads: 4
  vocab_size: 512
  seq_length: 32
train:
  micro_batch_size: 2
  global_batch_size: 8
  steps: 12
optimizer:
  warmup_steps: 0
data:
  path: synthetic
)";

constexpr int kSteps = 12;

// Minor page faults allowed on one rank over steps 3..12, all together. Steps 1 and 2 touch every
// buffer for the first time. After them nothing should be new: glibc keeps what is freed (Runtime
// sets M_MMAP_THRESHOLD / M_TRIM_THRESHOLD, src/comm/runtime.cpp), the CPU allocator caches blocks
// from 4 KiB, and the kernels size their thread-local scratch on every thread of the team before a
// dynamic schedule hands out work. Measured 2026-11-27 on the loaded 2-core Zen 3 VM, 10 runs over
// the layouts: 0 to 7 (first touches by MPI's transports among them); before these, 145 on one
// rank in bf16 (glibc trimming), and up to 71 with trimming off alone.
constexpr long kFaultBound = 16;

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

struct StepCosts {
  std::vector<int64_t> passes, bytes;  // conversion passes and their bytes, per step
  std::vector<long> faults;            // minor page faults of the process, per step
  std::vector<double> losses;
  uint64_t weights_hash = 0;  // FNV-1a over the bits of every parameter value after the last step
};

StepCosts run_steps(const std::vector<std::string>& overrides) {
  Communicator& w = world();
  const Config c = parse_config(kModel, overrides, w.size());
  TrainStep step(c, w, Device::cpu());
  const GPTDataset data = make_gpt_dataset(c, DataSplit::Train);
  const int dp_size = step.state().grid().sizes().data, dp_rank = step.state().coord().dp;
  StepCosts costs;
  // Sized up front: a vector growing between steps would itself move the heap's layout.
  for (auto* v : {&costs.passes, &costs.bytes}) v->reserve(kSteps);
  costs.faults.reserve(kSteps);
  costs.losses.reserve(kSteps);
  for (int s = 0; s < kSteps; ++s) {
    auto micro_batch = [&data, s, dp_rank, dp_size](int mb) {
      MicroBatch m = data.micro_batch(s, dp_rank, dp_size, mb);
      return pipeline::MicroBatch{m.tokens, m.targets};
    };
    const ConversionPasses before = conversion_passes();
    const long faults_before = minor_faults();
    const StepOutcome out = step.run(s, micro_batch, 1e-3);
    const long faults_after = minor_faults();
    const ConversionPasses after = conversion_passes();
    costs.passes.push_back(after.passes - before.passes);
    costs.bytes.push_back(after.bytes - before.bytes);
    costs.faults.push_back(faults_after - faults_before);
    costs.losses.push_back(out.loss);
  }
  uint64_t h = 1469598103934665603ull;
  for (Parameter* p : step.parameters())
    for (float v : p->value.to_float_vector()) {
      h ^= std::bit_cast<uint32_t>(v);
      h *= 1099511628211ull;
    }
  costs.weights_hash = h;
  return costs;
}

void print(const char* label, const StepCosts& c) {
  std::string line = std::string(label) + " rank " + std::to_string(world().rank()) + ":";
  for (int s = 0; s < kSteps; ++s)
    line += " [" + std::to_string(c.passes[s]) + " passes " + std::to_string(c.bytes[s]) + " B, " +
            std::to_string(c.faults[s]) + " faults]";
  std::printf("%s\n", line.c_str());
  std::string losses = std::string(label) + " rank " + std::to_string(world().rank()) + " losses:";
  char buf[64];
  for (double l : c.losses) {
    std::snprintf(buf, sizeof buf, " %a", l);
    losses += buf;
  }
  std::snprintf(buf, sizeof buf, " weights %016llx", static_cast<unsigned long long>(c.weights_hash));
  std::printf("%s%s\n", losses.c_str(), buf);
}

struct Layout {
  const char* label;
  int world_size;
  std::vector<std::string> overrides;
};
void PrintTo(const Layout& l, std::ostream* os) { *os << l.label; }

class StepConversions : public ::testing::TestWithParam<Layout> {};

TEST_P(StepConversions, NoConversionPassesAndFewPageFaultsAfterWarmUp) {
  if (world().size() != GetParam().world_size) GTEST_SKIP() << "needs " << GetParam().world_size << " ranks";
  const StepCosts c = run_steps(GetParam().overrides);
  print(GetParam().label, c);
  // No pass at all, the first step included: the only conversions of a run are the model's cast to
  // 16-bit and the optimizer's fp32 copy of it, at construction.
  for (int s = 0; s < kSteps; ++s) EXPECT_EQ(c.passes[s], 0) << GetParam().label << " step " << s + 1;
  long later_faults = 0;
  for (int s = 2; s < kSteps; ++s) later_faults += c.faults[s];
  EXPECT_LE(later_faults, kFaultBound)
      << GetParam().label << " rank " << world().rank() << ": minor page faults over steps 3.." << kSteps;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, StepConversions,
    ::testing::Values(Layout{"bf16", 1, {"train.precision=bf16"}},
                      Layout{"fp16", 1, {"train.precision=fp16"}}, Layout{"fp32", 1, {}},
                      Layout{"bf16_pp2", 2, {"train.precision=bf16", "parallel.pipeline=2"}},
                      Layout{
                          "bf16_tp2_sp",
                          2,
                          {"train.precision=bf16", "parallel.tensor=2", "parallel.sequence_parallel=true"}}),
    [](const ::testing::TestParamInfo<Layout>& i) { return std::string(i.param.label); });

}  // namespace
}  // namespace parallel
