// Muon (optimizer.type muon; docs/optimizer.md#muon) against its PyTorch reference
// (tests/reference/make_muon_fixture.py: torch.optim.Muon's update with Newton-Schulz in fp32, AdamW
// for the embedding, output layer and norms) on the tiny GPT "b"'s parameters over 5 steps, on real
// ranks: one rank (AdamW over the Parameters, and over a DDP), and tp2 x dp2 under every
// optimizer.sharding mode plus HSDP. The gradients are the reference's own (a replay chunk adds
// them, so the optimizer alone is under test: gradient norm and clipping, the shards' momentum, the
// assembly of each matrix over dp shards and tp slices, the orthogonalisation, the write-back).
// Every parameter after every step matches the reference within 1e-5 relative (max |diff| over
// max |reference|), in fp32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "compare.hpp"
#include "mpi_test.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/error.hpp"
#include "parallel/model_chunk.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/safetensors.hpp"
#include "paths.hpp"

namespace parallel {
namespace {

using testing::world;
constexpr int kSteps = 5;
constexpr double kTol = 1e-5;

struct Fixture {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> meta;
  const Tensor& at(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end()) PARALLEL_FAIL("muon fixture has no tensor '{}'", name);
    return it->second;
  }
  double number(const std::string& key) const { return std::stod(meta.at(key)); }
  std::vector<double> lrs() const {
    std::vector<double> out;
    std::stringstream ss(meta.at("lrs"));
    for (std::string x; std::getline(ss, x, ',');) out.push_back(std::stod(x));
    return out;
  }
};

const Fixture& fixture() {
  static const Fixture f = [] {
    const std::string path = testing::fixtures_dir() + "/muon.safetensors";
    return Fixture{safetensors::load(path), safetensors::load_metadata(path)};
  }();
  return f;
}

// The GPT's tensor-parallel split (docs/model.md): rows for query/key/value, gate/up, the vocabulary
// matrices; columns for proj and fc2; norms replicated.
int partition_dim_of(const std::string& name) {
  if (name.ends_with("proj.weight") || name.ends_with("fc2.weight")) return 1;
  if (name.find("norm") != std::string::npos) return -1;
  return 0;
}

// A model chunk that holds the fixture's parameters (this tp rank's slices) and whose backward adds
// the reference's gradients of the current step: the trainer's hooks and units, no compute.
class ReplayChunk final : public ModelChunk {
 public:
  ReplayChunk(int tp_size, int tp_rank) : tp_size_(tp_size), tp_rank_(tp_rank) {
    std::map<std::string, std::vector<Parameter*>> by_unit;
    for (const auto& [key, value] : fixture().tensors) {
      if (!key.starts_with("init.")) continue;
      const std::string name = key.substr(5);
      auto p = std::make_unique<Parameter>();
      p->name = name;
      p->global_shape = value.shape();
      p->partition_dim = partition_dim_of(name);
      if (p->partition_dim >= 0) p->partition_offset = value.size(p->partition_dim) / tp_size * tp_rank;
      p->value = slice(value, *p).clone();
      p->grad = Tensor::zeros(p->value.shape(), DType::F32);
      // Units as the GPT's: the embedding, each layer, the final norm with the output layer.
      const std::string unit =
          name.starts_with("layers.") ? name.substr(0, name.find('.', 7)) : name.substr(0, 1);
      by_unit[unit].push_back(p.get());
      params_.push_back(std::move(p));
    }
    for (auto& [unit, list] : by_unit) units_.push_back(list);
  }

  // This rank's slice of a global tensor laid out like `p`.
  Tensor slice(const Tensor& global, const Parameter& p) const {
    if (p.partition_dim < 0) return global;
    const int64_t extent = global.size(p.partition_dim) / tp_size_;
    return global.narrow(p.partition_dim, p.partition_offset, extent).contiguous();
  }

  void set_step(int step) { step_ = step; }
  bool pre_process() const override { return true; }
  bool post_process() const override { return true; }
  struct None final : Activations {};
  ActivationsPtr new_activations() const override { return std::make_unique<None>(); }
  Tensor forward(const Tensor&, const Tensor&, Activations&, uint64_t) override {
    for (auto& unit : units_) {
      if (unit_) unit_(UnitPhase::BeforeForward, unit);
      if (unit_) unit_(UnitPhase::AfterForward, unit);
    }
    return Tensor::zeros({1}, DType::F32);
  }
  Tensor backward(const Tensor&, Activations&) override {
    for (auto it = units_.rbegin(); it != units_.rend(); ++it) {
      if (unit_) unit_(UnitPhase::BeforeBackward, *it);
      for (Parameter* p : *it) {
        const Tensor g = slice(fixture().at("grad" + std::to_string(step_ + 1) + "." + p->name), *p);
        p->grad.copy_(g);  // every dp rank the same: DDP's average is the reference's gradient
        if (ready_) ready_(*p);
      }
      if (unit_) unit_(UnitPhase::AfterBackward, *it);
    }
    return Tensor();
  }
  std::vector<Parameter*> parameters() override {
    std::vector<Parameter*> out;
    for (auto& p : params_) out.push_back(p.get());
    return out;
  }
  std::vector<std::vector<Parameter*>> units() override { return units_; }
  void set_grad_ready_hook(std::function<void(Parameter&)> hook) override { ready_ = std::move(hook); }
  void set_param_use_hook(std::function<void(Parameter&)>) override {}
  void set_unit_hook(std::function<void(UnitPhase, const std::vector<Parameter*>&)> hook) override {
    unit_ = std::move(hook);
  }
  void set_training(bool) override {}
  Device device() const override { return Device::cpu(); }

 private:
  int tp_size_, tp_rank_, step_ = 0;
  std::vector<std::unique_ptr<Parameter>> params_;
  std::vector<std::vector<Parameter*>> units_;
  std::function<void(Parameter&)> ready_;
  std::function<void(UnitPhase, const std::vector<Parameter*>&)> unit_;
};

OptimizerConfig muon_config() {
  const Fixture& f = fixture();
  OptimizerConfig oc;
  oc.type = OptimizerType::Muon;
  oc.muon_momentum = f.number("momentum");
  oc.muon_nesterov = f.meta.at("nesterov") == "true";
  oc.muon_ns_steps = static_cast<int>(f.number("ns_steps"));
  oc.muon_scale = MuonScale::MatchRmsAdamW;
  oc.beta1 = f.number("beta1");
  oc.beta2 = f.number("beta2");
  oc.eps = f.number("eps");
  oc.weight_decay = f.number("weight_decay");
  oc.clip_grad = f.number("clip_grad");
  oc.bucket_size = 3000;  // several buckets; matrices straddle the dp shards
  return oc;
}

// Returns the largest error (for the log).
double expect_step(ReplayChunk& chunk, int step) {
  double worst = 0.0;
  for (Parameter* p : chunk.parameters()) {
    const Tensor want = chunk.slice(fixture().at("step" + std::to_string(step + 1) + "." + p->name), *p);
    const double err = testing::rel_err(p->value, want);
    worst = std::max(worst, err);
    EXPECT_LE(err, kTol) << p->name << " after step " << step + 1
                         << (muon_parameter(*p) ? " (Muon)" : " (AdamW)");
  }
  return worst;
}

// One rank, no DDP: AdamW's constructor over the Parameters.
TEST(Muon, OneRankOverParametersMatchesPyTorch) {
  ReplayChunk chunk(1, 0);
  const OptimizerConfig oc = muon_config();
  AdamW opt(chunk.parameters(), oc, Precision::FP32);
  int muon = 0;
  for (Parameter* p : chunk.parameters()) muon += muon_parameter(*p);
  EXPECT_EQ(muon, 14);  // 2 layers x (query, key, value, proj, gate, up, fc2)
  EXPECT_GT(opt.momentum().numel(), 0);
  const std::vector<double> lrs = fixture().lrs();
  double worst = 0.0;
  for (int step = 0; step < kSteps; ++step) {
    zero_grads(chunk.parameters());
    chunk.set_step(step);
    auto act = chunk.new_activations();
    chunk.backward(Tensor(), *act);
    opt.step(lrs[static_cast<std::size_t>(step)]);
    worst = std::max(worst, expect_step(chunk, step));
  }
  std::printf("largest relative error over %d steps: %.2e\n", kSteps, worst);
}

struct Layout {
  const char* label;
  int tp;
  Sharding sharding;
  int sharding_group_size = 0;
};
void PrintTo(const Layout& l, std::ostream* os) { *os << l.label; }

class MuonLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(MuonLayouts, MatchesPyTorch) {
  const Layout k = GetParam();
  if (world().size() % (k.tp * std::max(1, k.sharding_group_size)) != 0 ||
      (k.sharding_group_size > 0 && world().size() / k.tp == k.sharding_group_size))
    GTEST_SKIP() << "layout does not fit " << world().size() << " ranks";
  ParallelState state(world(), RankGrid::from_world(world().size(), k.tp, 1));
  ReplayChunk chunk(k.tp, state.coord().tp);
  OptimizerConfig oc = muon_config();
  oc.sharding = k.sharding;
  oc.sharding_group_size = k.sharding_group_size;
  DataParallel ddp(std::vector<ModelChunk*>{&chunk}, state.dp(),
                   DataParallelOptions::from(oc, Precision::FP32));
  ASSERT_GT(ddp.buffer().buckets().size(), 1u);
  const std::unique_ptr<Optimizer> opt = make_optimizer(ddp, oc, OptimizerGroups::from(state));
  const std::vector<double> lrs = fixture().lrs();
  double worst = 0.0;
  for (int step = 0; step < kSteps; ++step) {
    ddp.zero_grad();
    chunk.set_step(step);
    auto act = chunk.new_activations();
    chunk.forward(Tensor(), Tensor(), *act, 0);
    chunk.backward(Tensor(), *act);
    ddp.finish_grad_sync();
    opt->step(lrs[static_cast<std::size_t>(step)]);
    ddp.unshard();  // ZeRO-3: gathers the shards; else finishes the all-gather
    worst = std::max(worst, expect_step(chunk, step));
    ddp.reshard();
  }
  if (world().rank() == 0) std::printf("largest relative error over %d steps: %.2e\n", kSteps, worst);
}

INSTANTIATE_TEST_SUITE_P(
    Sharding, MuonLayouts,
    ::testing::Values(Layout{"Tp1_None", 1, Sharding::None}, Layout{"Tp1_Optim", 1, Sharding::Optim},
                      Layout{"Tp2Dp2_None", 2, Sharding::None}, Layout{"Tp2Dp2_Optim", 2, Sharding::Optim},
                      Layout{"Tp2Dp2_OptimGrads", 2, Sharding::OptimGrads},
                      Layout{"Tp2Dp2_OptimGradsParams", 2, Sharding::OptimGradsParams},
                      Layout{"Dp4_Hsdp2_OptimGradsParams", 1, Sharding::OptimGradsParams, 2},
                      Layout{"Dp4_Hsdp2_Optim", 1, Sharding::Optim, 2}),
    [](const auto& info) { return std::string(info.param.label); });

}  // namespace
}  // namespace parallel
