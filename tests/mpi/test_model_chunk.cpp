// The model interface (model_chunk.hpp) is all that data parallelism and the pipeline need: a toy
// chunk that is not a GPT (a stack of tanh(x Wᵀ + b) layers under a squared-error loss, written
// here with host loops) trains through DataParallel (ZeRO-3, ZeRO-2, and unsharded with overlapped
// reduction) and the pipeline executor (1F1B and ZB-H1's split backward) on real ranks, pp x dp,
// and its losses, gradient norms and final parameters equal the same toy trained on one rank
// (fp32, relative 1e-5).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/error.hpp"
#include "parallel/init.hpp"
#include "parallel/model_chunk.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/pipeline.hpp"

namespace parallel {
namespace {

using testing::world;
constexpr int kLayers = 4, kHidden = 8, kRows = 3;  // rows per micro-batch
constexpr int kMicroBatches = 8;                    // per step, over all dp ranks
constexpr int kSteps = 4;
constexpr double kTol = 1e-5;

// Layers [first, first + count) of the toy; the first chunk reads x [rows, h], the last returns
// 0.5 * sum((y - t)^2).
class ToyChunk final : public ModelChunk {
 public:
  ToyChunk(int first, int count) : first_(first), count_(count) {
    for (int l = first; l < first + count; ++l) {
      weights_.push_back(param(fmt::format("toy.{}.weight", l), {kHidden, kHidden}));
      biases_.push_back(param(fmt::format("toy.{}.bias", l), {kHidden}));
    }
  }

  bool pre_process() const override { return first_ == 0; }
  bool post_process() const override { return first_ + count_ == kLayers; }

  struct Saved final : Activations {
    std::vector<Tensor> inputs, outputs, dz;  // per layer; dz between B and W
    Tensor targets;
  };
  ActivationsPtr new_activations() const override { return std::make_unique<Saved>(); }

  Tensor forward(const Tensor& input, const Tensor& targets, Activations& base, uint64_t) override {
    auto& act = dynamic_cast<Saved&>(base);
    Tensor x = input.contiguous();
    for (int l = 0; l < count_; ++l) {
      hook(ModelChunk::UnitPhase::BeforeForward, l);
      if (use_) use_(*weights_[l]), use_(*biases_[l]);
      Tensor y = Tensor::zeros({kRows, kHidden}, DType::F32);
      const float *w = weights_[l]->value.data<float>(), *b = biases_[l]->value.data<float>(),
                  *xi = x.data<float>();
      float* yo = y.data<float>();
      for (int r = 0; r < kRows; ++r)
        for (int o = 0; o < kHidden; ++o) {
          float z = b[o];
          for (int i = 0; i < kHidden; ++i) z += xi[r * kHidden + i] * w[o * kHidden + i];
          yo[r * kHidden + o] = std::tanh(z);
        }
      hook(ModelChunk::UnitPhase::AfterForward, l);
      act.inputs.push_back(x);
      act.outputs.push_back(y);
      x = y;
    }
    if (!post_process()) return x;
    act.targets = targets.contiguous();
    const float *y = x.data<float>(), *t = act.targets.data<float>();
    float loss = 0;
    for (int e = 0; e < kRows * kHidden; ++e) loss += 0.5f * (y[e] - t[e]) * (y[e] - t[e]);
    return Tensor::full({1}, loss, DType::F32);
  }

  Tensor backward(const Tensor& grad, Activations& base) override {
    Tensor dx = backward_input(grad, base);
    backward_weight(base);
    return dx;
  }

  Tensor backward_input(const Tensor& grad, Activations& base) override {
    auto& act = dynamic_cast<Saved&>(base);
    Tensor dy;
    if (post_process()) {
      const float g = grad.to_float_vector()[0];
      dy = Tensor::zeros({kRows, kHidden}, DType::F32);
      const float *y = act.outputs.back().data<float>(), *t = act.targets.data<float>();
      for (int e = 0; e < kRows * kHidden; ++e) dy.data<float>()[e] = g * (y[e] - t[e]);
    } else {
      dy = grad.contiguous();
    }
    act.dz.assign(static_cast<std::size_t>(count_), Tensor());
    for (int l = count_ - 1; l >= 0; --l) {
      hook(ModelChunk::UnitPhase::BeforeBackward, l);
      Tensor dz = Tensor::zeros({kRows, kHidden}, DType::F32),
             dx = Tensor::zeros({kRows, kHidden}, DType::F32);
      const float *y = act.outputs[l].data<float>(), *w = weights_[l]->value.data<float>();
      for (int e = 0; e < kRows * kHidden; ++e) dz.data<float>()[e] = dy.data<float>()[e] * (1 - y[e] * y[e]);
      for (int r = 0; r < kRows; ++r)
        for (int i = 0; i < kHidden; ++i) {
          float s = 0;
          for (int o = 0; o < kHidden; ++o) s += dz.data<float>()[r * kHidden + o] * w[o * kHidden + i];
          dx.data<float>()[r * kHidden + i] = s;
        }
      hook(ModelChunk::UnitPhase::AfterBackward, l);
      act.dz[l] = dz;
      dy = dx;
    }
    act.outputs.clear();
    return pre_process() ? Tensor() : dy;
  }

  void backward_weight(Activations& base) override {
    auto& act = dynamic_cast<Saved&>(base);
    for (int l = count_ - 1; l >= 0; --l) {
      hook(ModelChunk::UnitPhase::BeforeBackward, l);
      float *dw = weights_[l]->grad.data<float>(), *db = biases_[l]->grad.data<float>();
      const float *dz = act.dz[l].data<float>(), *x = act.inputs[l].data<float>();
      for (int r = 0; r < kRows; ++r)
        for (int o = 0; o < kHidden; ++o) {
          db[o] += dz[r * kHidden + o];
          for (int i = 0; i < kHidden; ++i) dw[o * kHidden + i] += dz[r * kHidden + o] * x[r * kHidden + i];
        }
      if (ready_) ready_(*biases_[l]), ready_(*weights_[l]);
      hook(ModelChunk::UnitPhase::AfterBackward, l);
    }
    act.inputs.clear();
    act.dz.clear();
  }

  std::vector<Parameter*> parameters() override {
    std::vector<Parameter*> out;
    for (int l = 0; l < count_; ++l) out.insert(out.end(), {weights_[l].get(), biases_[l].get()});
    return out;
  }
  std::vector<std::vector<Parameter*>> units() override {
    std::vector<std::vector<Parameter*>> out;
    for (int l = 0; l < count_; ++l) out.push_back({weights_[l].get(), biases_[l].get()});
    return out;
  }
  void set_grad_ready_hook(std::function<void(Parameter&)> hook) override { ready_ = std::move(hook); }
  void set_param_use_hook(std::function<void(Parameter&)> hook) override { use_ = std::move(hook); }
  void set_unit_hook(std::function<void(UnitPhase, const std::vector<Parameter*>&)> hook) override {
    unit_ = std::move(hook);
  }
  void set_training(bool) override {}
  Device device() const override { return Device::cpu(); }

 private:
  static std::unique_ptr<Parameter> param(const std::string& name, const Shape& shape) {
    auto p = std::make_unique<Parameter>();
    p->name = name;
    p->value = Tensor::zeros(shape, DType::F32);
    p->grad = Tensor::zeros(shape, DType::F32);
    p->global_shape = shape;
    init_normal(*p, 5, 0.5f);  // by name and global index: the same on every layout
    return p;
  }
  void hook(UnitPhase phase, int l) {
    if (unit_) unit_(phase, {weights_[l].get(), biases_[l].get()});
  }

  int first_, count_;
  std::vector<std::unique_ptr<Parameter>> weights_, biases_;
  std::function<void(Parameter&)> ready_, use_;
  std::function<void(UnitPhase, const std::vector<Parameter*>&)> unit_;
};

// Global micro-batch i of step s: inputs and targets, [rows, h].
pipeline::MicroBatch data(int step, int i) {
  std::vector<float> x(kRows * kHidden), t(kRows * kHidden);
  for (int e = 0; e < kRows * kHidden; ++e) {
    x[e] = std::sin(0.37f * static_cast<float>(e + 31 * i + 101 * step));
    t[e] = 0.8f * std::cos(0.23f * static_cast<float>(3 * e + 17 * i + 7 * step));
  }
  return {Tensor::from_vector(x, {kRows, kHidden}), Tensor::from_vector(t, {kRows, kHidden})};
}

OptimizerConfig optimizer_config() {
  OptimizerConfig oc;
  oc.lr = 2e-2;
  oc.lr_decay = LrDecay::Constant;
  oc.clip_grad = 0.5;
  oc.bucket_size = 40;  // several buckets
  return oc;
}

struct Trained {
  std::vector<double> losses, grad_norms;  // per step: mean loss per row, global grad norm
};

// The same toy on this rank alone, every micro-batch of every step.
Trained train_one_rank(ToyChunk& toy) {
  const OptimizerConfig oc = optimizer_config();
  AdamW opt(toy.parameters(), oc, Precision::FP32);
  const Tensor seed = Tensor::full({1}, 1.0 / (kMicroBatches * kRows), DType::F32);
  Trained out;
  for (int step = 0; step < kSteps; ++step) {
    zero_grads(toy.parameters());
    double loss = 0;
    for (int i = 0; i < kMicroBatches; ++i) {
      const pipeline::MicroBatch b = data(step, i);
      auto act = toy.new_activations();
      loss += toy.forward(b.tokens, b.targets, *act, 0).to_float_vector()[0];
      toy.backward(seed, *act);
    }
    out.losses.push_back(loss / (kMicroBatches * kRows));
    out.grad_norms.push_back(opt.step(oc.lr).grad_norm);
  }
  return out;
}

struct Layout {
  const char* label;
  int pipeline;
  Sharding sharding;
  bool overlap_grad_reduce;
  PipelineSchedule schedule;
};
void PrintTo(const Layout& l, std::ostream* os) { *os << l.label; }

// Unsharded DDP with overlap starts a bucket's reduction on the grad-ready hook of the last
// micro-batch only (the trainer's DataParallelAwareModel does the same).
class LastMicroBatchMarks final : public pipeline::PipelineModel {
 public:
  LastMicroBatchMarks(pipeline::ChunkPipelineModel& inner, DataParallel& ddp, int m)
      : inner_(inner), ddp_(ddp), m_(m) {}
  Tensor forward(int c, int mb, const Tensor& x) override { return inner_.forward(c, mb, x); }
  Tensor backward(int c, int mb, const Tensor& g) override {
    ddp_.set_is_last_microbatch(mb == m_ - 1);
    return inner_.backward(c, mb, g);
  }
  Tensor backward_input(int c, int mb, const Tensor& g) override { return inner_.backward_input(c, mb, g); }
  void backward_weight(int c, int mb) override {
    ddp_.set_is_last_microbatch(mb == m_ - 1);
    inner_.backward_weight(c, mb);
  }

 private:
  pipeline::ChunkPipelineModel& inner_;
  DataParallel& ddp_;
  int m_;
};

class ModelChunkTraining : public ::testing::TestWithParam<Layout> {};

TEST_P(ModelChunkTraining, ToyMatchesOneRank) {
  const Layout k = GetParam();
  if (world().size() % k.pipeline != 0 || kMicroBatches % (world().size() / k.pipeline) != 0)
    GTEST_SKIP() << "layout does not fit " << world().size() << " ranks";
  ParallelState state(world(), RankGrid::from_world(world().size(), 1, k.pipeline));
  const int dp = state.dp().size(), d = state.coord().dp, stage = state.coord().pp;
  const int m = kMicroBatches / dp, per_stage = kLayers / k.pipeline;

  ToyChunk whole(0, kLayers);
  const Trained ref = train_one_rank(whole);

  ToyChunk chunk(stage * per_stage, per_stage);
  OptimizerConfig oc = optimizer_config();
  oc.sharding = k.sharding;
  oc.overlap_grad_reduce = k.overlap_grad_reduce;
  DataParallel ddp(std::vector<ModelChunk*>{&chunk}, state.dp(),
                   DataParallelOptions::from(oc, Precision::FP32));
  ASSERT_GT(ddp.buffer().buckets().size(), 1u);
  const std::unique_ptr<Optimizer> opt = make_optimizer(ddp, oc, OptimizerGroups::from(state));

  pipeline::ChunkPipelineModel model(std::vector<ModelChunk*>{&chunk});
  LastMicroBatchMarks driver(model, ddp, m);
  pipeline::PipelineExecutor executor(
      state.pp(), {.micro_batches = m, .activation_shape = {kRows, kHidden}, .kind = k.schedule});
  // d(objective)/d(loss sum) with the objective the mean over all rows: DDP averages over dp.
  const Tensor seed = Tensor::full({1}, 1.0 / (m * kRows), DType::F32);
  for (int step = 0; step < kSteps; ++step) {
    ddp.zero_grad();
    model.start_step([&](int mb) { return data(step, d * m + mb); }, seed);
    executor.run(driver);
    ddp.finish_grad_sync();
    const StepResult r = opt->step(oc.lr);
    EXPECT_NEAR(r.grad_norm, ref.grad_norms[step], kTol * ref.grad_norms[step]) << "step " << step;
    if (model.computes_loss()) {
      Tensor loss = model.loss_sum().clone();
      state.dp().all_reduce(loss);
      const double mean = loss.to_float_vector()[0] / (kMicroBatches * kRows);
      EXPECT_NEAR(mean, ref.losses[step], kTol * ref.losses[step]) << "step " << step;
    }
    if (ddp.buffer().params_sharded())
      for (Parameter* p : chunk.parameters()) EXPECT_FALSE(p->value.defined()) << p->name;
  }
  ASSERT_LT(ref.losses.back(), ref.losses.front()) << "the toy must learn";
  ddp.unshard();
  std::map<std::string, Parameter*> by_name;
  for (Parameter* p : whole.parameters()) by_name[p->name] = p;
  for (Parameter* p : chunk.parameters()) {
    const std::vector<float> got = p->value.to_float_vector(),
                             want = by_name.at(p->name)->value.to_float_vector();
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t e = 0; e < got.size(); ++e)
      ASSERT_NEAR(got[e], want[e], kTol * std::max(1.0f, std::abs(want[e]))) << p->name << "[" << e << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ModelChunkTraining,
    ::testing::Values(
        Layout{"Dp_Zero3", 1, Sharding::OptimGradsParams, false, PipelineSchedule::Auto},
        Layout{"Pp2_Zero3_1F1B", 2, Sharding::OptimGradsParams, false, PipelineSchedule::OneFOneB},
        Layout{"Pp2_Zero3_ZbH1", 2, Sharding::OptimGradsParams, false, PipelineSchedule::ZeroBubbleH1},
        Layout{"Pp2_Zero2_ZbH1", 2, Sharding::OptimGrads, false, PipelineSchedule::ZeroBubbleH1},
        Layout{"Pp2_OverlappedReduce", 2, Sharding::None, true, PipelineSchedule::OneFOneB}),
    [](const auto& info) { return std::string(info.param.label); });

}  // namespace
}  // namespace parallel
