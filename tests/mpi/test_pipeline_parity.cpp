// Pipeline parallelism (1F1B and interleaved, with tensor and sequence parallelism, tied and untied
// embeddings) against the whole model on one rank, over several SGD steps: the loss of every step
// and every gradient slice agree to fp32 relative 1e-5. Also: 1F1B keeps at most p - r micro-batches
// of activations alive on rank r (counted and measured by the allocator), and the per-rank stats
// add up.
//
// Each case runs only when the world has exactly tp * pp ranks (ctest registers NP 2, 4 and 8), so
// no rank idles or duplicates work. The reference is built in-process on a size-1 communicator.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "parallel/allocator.hpp"
#include "parallel/finalize_grads.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/pipeline.hpp"
#include "parity.hpp"

namespace parallel {
namespace {

using pipeline::ChunkPipelineModel;
using pipeline::MicroBatch;
using pipeline::PipelineExecutor;
using testing::world;

constexpr double kTol = 1e-5;
constexpr int64_t kMicroBatchSize = 2;
constexpr int kSteps = 3;
constexpr float kLr = 0.1f;

using testing::max_abs;
using testing::rel_err;

struct Case {
  const char* label;
  int tp, pp, v, micro_batches;
  bool tied, sequence_parallel;
  bool llama;  // GQA + SwiGLU + RMSNorm + rope, else MHA + GeLU + LayerNorm + learned positions
  PipelineSchedule schedule = PipelineSchedule::Auto;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }

ModelConfig make_config(const Case& k, int num_layers) {
  ModelConfig c;
  c.num_layers = num_layers;
  c.hidden_size = 32;
  c.vocab_size = 300;  // padded to 384 on one rank and 512 at tp = 2: only real rows are compared
  c.seq_length = 8;
  c.tie_embeddings = k.tied;
  c.init_std = 0.1;  // larger than GPT-2's so that every gradient is well above rounding noise
  c.num_attention_heads = 4;
  if (k.llama) {
    c.num_query_groups = 2;
    c.normalization = Normalization::RMSNorm;
    c.activation = Activation::SwiGLU;
    c.position_embedding = PositionEmbedding::Rope;
  }
  return c;
}

// Tokens of (step, micro-batch): different every time, so each step sees new data.
Tensor make_ids(const ModelConfig& c, int step, int micro_batch, int shift) {
  std::vector<int32_t> ids(static_cast<std::size_t>(kMicroBatchSize * c.seq_length));
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int32_t>((i * 97 + 31 * micro_batch + 57 * step + 13 * shift + 7) % c.vocab_size);
  return Tensor::from_vector(ids, {kMicroBatchSize, c.seq_length});
}

MicroBatch batch_of(const ModelConfig& c, int step, int micro_batch) {
  return {make_ids(c, step, micro_batch, 0), make_ids(c, step, micro_batch, 1)};
}

// With rope the key bias's gradient is what is left of a nearly cancelling sum (the part that
// shifts every score of a query alike cancels in the softmax; only the rotated remainder
// survives), so its rounding error relative to its size is larger than other gradients': 1.6e-5 on
// a Zen 3 (AVX2; oneDNN's AVX2 sgemm sums in another order than its AVX-512 one).
constexpr double kKeyBiasTol = 5e-5;

void expect_grad_matches(const Parameter& p, const Parameter& ref, int64_t vocab, bool inert, int step) {
  const double tol = p.name.ends_with("attention.key.bias") ? kKeyBiasTol : kTol;
  testing::expect_grad_matches(
      p, ref, vocab, inert,
      p.name + " (rank " + std::to_string(world().rank()) + ", step " + std::to_string(step) + ")", tol);
}

// Plain SGD, identical on both sides (the real optimizer is tested elsewhere): w -= lr * g.
void sgd(const std::vector<Parameter*>& params) {
  for (Parameter* p : params) {
    std::vector<float> w = p->value.contiguous().to_float_vector();
    const std::vector<float> g = p->grad.contiguous().to_float_vector();
    for (std::size_t i = 0; i < w.size(); ++i) w[i] -= kLr * g[i];
    p->value.copy_(Tensor::from_vector(w, p->value.shape()));
  }
}

ParallelSizes sizes_of(int tp, int pp) {
  ParallelSizes s;
  s.tensor = tp;
  s.pipeline = pp;
  return s;
}

bool model_computes_loss(const std::vector<GPTModel*>& chunks) {
  return std::any_of(chunks.begin(), chunks.end(), [](const GPTModel* c) { return c->spec().post_process; });
}

class PipelineParity : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineParity, LossAndGradientsOverSgdSteps) {
  const Case k = GetParam();
  if (world().size() != k.tp * k.pp) GTEST_SKIP() << "needs exactly " << k.tp * k.pp << " ranks";
  ParallelState state(world(), RankGrid(sizes_of(k.tp, k.pp)));
  ASSERT_EQ(state.pp().rank(), state.coord().pp);
  // Two layers per chunk exercise the order inside a chunk; from 8 layers on (4 with tp, whose
  // reductions round too) the fp32 rounding alone approaches the tolerance (Pp2Tp2ZbVUntied: 1.7e-5
  // at 8 layers once the learned positions' gradient summed in another order), so long pipelines
  // get one layer per chunk.
  const int num_layers = k.pp * k.v * (k.pp * k.v >= (k.tp > 1 ? 4 : 8) ? 1 : 2);
  const ModelConfig c = make_config(k, num_layers);
  const GPTModel::Options options{
      .sequence_parallel = k.sequence_parallel, .recompute = Recompute::None, .seed = 11};

  std::vector<std::unique_ptr<GPTModel>> chunks;
  std::vector<GPTModel*> chunk_ptrs;
  const pipeline::Placement placement = pipeline::placement_of(k.schedule);
  for (const ChunkSpec& spec :
       pipeline::stage_layout({num_layers, k.pp, k.v, 0, 0, placement}, state.coord().pp)) {
    chunks.push_back(std::make_unique<GPTModel>(c, spec, options, state.tp()));
    chunk_ptrs.push_back(chunks.back().get());
  }
  // The V placement puts the embedding and the loss on pipeline rank 0.
  EXPECT_EQ(model_computes_loss(chunk_ptrs),
            placement == pipeline::Placement::V ? state.coord().pp == 0 : state.coord().pp == k.pp - 1);
  ChunkPipelineModel model(chunk_ptrs);
  const int64_t s_local = k.sequence_parallel ? c.seq_length / k.tp : c.seq_length;
  PipelineExecutor executor(state.pp(), {.micro_batches = k.micro_batches,
                                         .virtual_stages = k.v,
                                         .activation_shape = {s_local, kMicroBatchSize, c.hidden_size},
                                         .kind = k.schedule});
  int weight_steps = 0;
  for (const pipeline::Action& a : executor.schedule()) weight_steps += a.op == pipeline::Op::BackwardWeight;
  // Mirrored send/receive pairs with a neighbour go as one batch_p2p each.
  std::set<std::size_t> paired;
  if (k.pp > 1)
    for (const pipeline::PairedExchange& e : pipeline::paired_exchanges(
             {k.pp, state.coord().pp, k.micro_batches, k.v, k.schedule}, pipeline::make_schedule))
      paired.insert(e.begin);
  const int paired_runs = static_cast<int>(paired.size());

  auto solo = world().split(world().rank(), 0);
  GPTModel ref(c, {0, num_layers, true, true}, {.sequence_parallel = false, .seed = 11}, *solo);
  std::map<std::string, Parameter*> ref_by_name;
  for (Parameter* p : ref.parameters()) ref_by_name[p->name] = p;

  // The mean over all tokens of the global batch.
  const double tokens = static_cast<double>(k.micro_batches * kMicroBatchSize * c.seq_length);
  const Tensor loss_scale = Tensor::full({1}, 1.0 / tokens, DType::F32);
  const auto params = model.parameters();
  std::size_t compared = 0;

  for (int step = 0; step < kSteps; ++step) {
    zero_grads(params);
    zero_grads(ref.parameters());
    model.start_step([&](int mb) { return batch_of(c, step, mb); }, loss_scale);
    const pipeline::StepStats stats = executor.run(model);
    finalize_grads(params, state);
    EXPECT_EQ(stats.forwards, k.micro_batches * k.v);
    EXPECT_EQ(stats.backwards, k.micro_batches * k.v);
    EXPECT_EQ(stats.weight_steps, weight_steps);
    EXPECT_EQ(stats.batches, paired_runs);
    // The loop placement's schedules receive in their senders' order; the V ones need not (with
    // p = 2, ZB-V's rank 1 wants a chunk-1 gradient before a chunk-0 activation rank 0 posted
    // first): the executor keeps the early one, which the parity below covers.
    if (placement == pipeline::Placement::Loop) EXPECT_EQ(stats.received_early, 0);
    // The stated bounds (pipeline_schedule.hpp), on real ranks.
    switch (k.schedule) {
      case PipelineSchedule::ZeroBubbleH1:
        EXPECT_EQ(weight_steps, k.micro_batches);
        EXPECT_EQ(stats.peak_in_flight, std::min(k.pp - state.coord().pp, k.micro_batches));
        EXPECT_EQ(stats.peak_until_weight, std::min(k.pp, k.micro_batches));
        break;
      case PipelineSchedule::ZeroBubbleV:
        EXPECT_EQ(weight_steps, 2 * k.micro_batches);
        EXPECT_EQ(stats.peak_until_weight, 2 * k.pp);
        break;
      case PipelineSchedule::DualPipeV:
        EXPECT_GT(weight_steps, 0);
        EXPECT_EQ(stats.peak_until_weight, 2 * k.pp + 1);
        break;
      default:
        EXPECT_EQ(weight_steps, 0);
    }
    EXPECT_EQ(model.live_activations(), 0);

    double ref_loss = 0;
    for (int mb = 0; mb < k.micro_batches; ++mb) {
      const MicroBatch b = batch_of(c, step, mb);
      auto act = ref.new_activations();
      ref_loss += ref.forward(b.tokens, b.targets, *act, static_cast<uint64_t>(mb)).to_float_vector()[0];
      ref.backward(loss_scale, *act);
    }
    // Only the last stage has the loss; the others contribute 0.
    Tensor loss = model.loss_sum().clone();
    state.pp().all_reduce(loss);
    const double mine = loss.to_float_vector()[0] / tokens, expected = ref_loss / tokens;
    EXPECT_LE(std::fabs(mine - expected) / std::fabs(expected), kTol)
        << "step " << step << ": loss " << mine << " vs " << expected;

    for (Parameter* p : params) {
      ASSERT_TRUE(ref_by_name.count(p->name)) << p->name;
      const bool inert = !k.llama && p->name.ends_with("attention.key.bias");
      expect_grad_matches(*p, *ref_by_name[p->name], c.vocab_size, inert, step);
      ++compared;
    }
    sgd(params);
    sgd(ref.parameters());
  }

  // Every reference parameter lives on some rank of the pipeline (the tied word embedding twice).
  Tensor held = Tensor::full({1}, static_cast<double>(params.size()), DType::F32);
  state.pp().all_reduce(held);
  const int shared_copies = k.tied && k.pp > 1 ? 1 : 0;
  EXPECT_EQ(static_cast<std::size_t>(held.to_float_vector()[0]), ref_by_name.size() + shared_copies);
  EXPECT_EQ(compared, params.size() * kSteps);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PipelineParity,
    ::testing::Values(
        // world 2
        Case{"Pp2Tied", 1, 2, 1, 4, true, false, false}, Case{"Pp2Untied", 1, 2, 1, 8, false, false, true},
        Case{"Pp2V2Tied", 1, 2, 2, 4, true, false, true},
        Case{"Pp2V2Untied", 1, 2, 2, 8, false, false, false},
        // world 4
        Case{"Pp4Tied", 1, 4, 1, 8, true, false, true}, Case{"Pp4Untied", 1, 4, 1, 4, false, false, false},
        Case{"Pp4V2Tied", 1, 4, 2, 4, true, false, false},
        Case{"Pp4V2Untied", 1, 4, 2, 8, false, false, true},
        Case{"Pp2Tp2SpTied", 2, 2, 1, 4, true, true, true},
        Case{"Pp2Tp2SpUntied", 2, 2, 1, 4, false, true, false},
        Case{"Pp2Tp2V2SpTied", 2, 2, 2, 4, true, true, false},
        Case{"Pp2Tp2NoSpUntied", 2, 2, 1, 4, false, false, true},
        // world 8
        Case{"Pp4Tp2V2SpTied", 2, 4, 2, 4, true, true, false},
        Case{"Pp8Untied", 1, 8, 1, 8, false, false, false},
        // zero-bubble (ZB-H1): split backward, W steps in the cool-down
        Case{"Pp2ZbH1Tied", 1, 2, 1, 4, true, false, false, PipelineSchedule::ZeroBubbleH1},
        Case{"Pp2ZbH1Untied", 1, 2, 1, 8, false, false, true, PipelineSchedule::ZeroBubbleH1},
        Case{"Pp4ZbH1Tied", 1, 4, 1, 8, true, false, true, PipelineSchedule::ZeroBubbleH1},
        Case{"Pp4ZbH1Untied", 1, 4, 1, 4, false, false, false, PipelineSchedule::ZeroBubbleH1},
        Case{"Pp2Tp2SpZbH1Tied", 2, 2, 1, 4, true, true, true, PipelineSchedule::ZeroBubbleH1},
        Case{"Pp2Tp2ZbH1Untied", 2, 2, 1, 8, false, false, false, PipelineSchedule::ZeroBubbleH1},
        // V placement (rank 0 holds the embedding and the loss): ZB-V and DualPipe-V, m >= 2p
        Case{"Pp2ZbVTied", 1, 2, 2, 4, true, false, false, PipelineSchedule::ZeroBubbleV},
        Case{"Pp2ZbVUntied", 1, 2, 2, 6, false, false, true, PipelineSchedule::ZeroBubbleV},
        Case{"Pp4ZbVTied", 1, 4, 2, 8, true, false, true, PipelineSchedule::ZeroBubbleV},
        Case{"Pp4ZbVUntied", 1, 4, 2, 9, false, false, false, PipelineSchedule::ZeroBubbleV},
        Case{"Pp2Tp2SpZbVTied", 2, 2, 2, 4, true, true, true, PipelineSchedule::ZeroBubbleV},
        Case{"Pp2Tp2ZbVUntied", 2, 2, 2, 5, false, false, false, PipelineSchedule::ZeroBubbleV},
        Case{"Pp2DualPipeVTied", 1, 2, 2, 4, true, false, true, PipelineSchedule::DualPipeV},
        Case{"Pp2DualPipeVUntied", 1, 2, 2, 7, false, false, false, PipelineSchedule::DualPipeV},
        Case{"Pp4DualPipeVTied", 1, 4, 2, 8, true, false, false, PipelineSchedule::DualPipeV},
        Case{"Pp4DualPipeVUntied", 1, 4, 2, 10, false, false, true, PipelineSchedule::DualPipeV},
        Case{"Pp2Tp2SpDualPipeVTied", 2, 2, 2, 4, true, true, false, PipelineSchedule::DualPipeV},
        Case{"Pp2Tp2DualPipeVUntied", 2, 2, 2, 6, false, false, true, PipelineSchedule::DualPipeV}),
    [](const auto& info) { return std::string(info.param.label); });

// ---- memory discipline --------------------------------------------------------------------------

struct Measured {
  std::size_t live = 0;       // bytes alive after one micro-batch's forward (with its input/output)
  std::size_t transient = 0;  // high-water mark of one micro-batch's forward + backward
};

// One micro-batch through this rank's chunk alone, measured by the allocator. split: the backward
// as input step then weight step; `held` is what stays between the two.
struct MeasuredSplit : Measured {
  std::size_t held = 0;  // bytes alive after the input step (what the weight step reads)
};
MeasuredSplit measure_one(ChunkPipelineModel& model, const ChunkSpec& spec, const Shape& shape,
                          bool split = false) {
  Allocator& alloc = allocator_for(Device::cpu());
  const std::size_t base = alloc.stats().allocated;
  alloc.reset_peak();
  MeasuredSplit m;
  {
    Tensor input = spec.pre_process ? Tensor() : Tensor::full(shape, 0.1, DType::F32);
    Tensor out = model.forward(0, 0, input);
    m.live = alloc.stats().allocated - base;
    Tensor grad = spec.post_process ? Tensor() : Tensor::full(shape, 0.01, DType::F32);
    if (split) {
      Tensor dx = model.backward_input(0, 0, grad);
      m.held = alloc.stats().allocated - base;
      model.backward_weight(0, 0);
    } else {
      model.backward(0, 0, grad);
    }
  }
  m.transient = alloc.stats().peak_allocated - base;
  return m;
}

TEST(PipelineMemory, OneFOneBKeepsAtMostPMinusRMicroBatches) {
  const int p = world().size();
  if (p < 2) GTEST_SKIP() << "needs a pipeline";
  ParallelState state(world(), RankGrid(sizes_of(1, p)));
  const int r = state.coord().pp, m = 8;
  const Case k{"", 1, p, 1, m, false, false, true};
  const ModelConfig c = make_config(k, 2 * p);
  const ChunkSpec spec = pipeline::stage_layout({2 * p, p, 1}, r).front();
  GPTModel chunk(c, spec, {}, state.tp());
  ChunkPipelineModel model({&chunk});
  const Shape shape{c.seq_length, kMicroBatchSize, c.hidden_size};
  const std::size_t message = static_cast<std::size_t>(shape_numel(shape)) * sizeof(float);
  const Tensor loss_scale = Tensor::full({1}, 1e-3, DType::F32);
  model.start_step([&](int mb) { return batch_of(c, 0, mb); }, loss_scale);
  const Measured one = measure_one(model, spec, shape);
  const MeasuredSplit one_split = measure_one(model, spec, shape, /*split=*/true);

  // A micro-batch in flight holds `live`; on top, one forward or backward runs (transient - live)
  // and a few messages sit in buffers (a received gradient, a pending send).
  const std::size_t bound =
      static_cast<std::size_t>(p - r) * one.live + (one.transient - one.live) + 4 * message;
  std::map<std::string, std::size_t> peak;
  for (const char* name : {"1f1b", "gpipe", "zb-h1"}) {
    const bool gpipe = std::string(name) == "gpipe", zb = std::string(name) == "zb-h1";
    PipelineExecutor executor(state.pp(),
                              {.micro_batches = m,
                               .activation_shape = shape,
                               .schedule = gpipe ? pipeline::gpipe : pipeline::make_schedule,
                               .kind = zb ? PipelineSchedule::ZeroBubbleH1 : PipelineSchedule::Auto});
    zero_grads(model.parameters());
    model.start_step([&](int mb) { return batch_of(c, 0, mb); }, loss_scale);
    const pipeline::StepStats stats = executor.run(model);
    peak[name] = stats.peak_allocated_bytes - stats.start_allocated_bytes;
    const int expected_in_flight = gpipe ? m : std::min(p - r, m);
    EXPECT_EQ(stats.peak_in_flight, expected_in_flight) << name << " rank " << r;
    // The model keeps a micro-batch's activations until its weight step.
    const int expected_live = zb ? std::min(p, m) : expected_in_flight;
    EXPECT_EQ(stats.peak_until_weight, expected_live) << name << " rank " << r;
    EXPECT_EQ(model.peak_live_activations(), expected_live) << name << " rank " << r;
    EXPECT_EQ(model.live_activations(), 0);
  }
  EXPECT_LE(peak["1f1b"], bound) << "rank " << r << ": one micro-batch " << one.live << " B live, "
                                 << one.transient << " B peak";
  // The bound is tight enough to tell the schedules apart: GPipe keeps all m micro-batches.
  if (m - (p - r) >= 2) EXPECT_GT(peak["gpipe"], bound) << "rank " << r;
  // ZB-H1: at most p - r micro-batches between F and B, and r more between B and W (each holding
  // what its weight step reads: the layers' inputs and output gradients), plus one step running.
  const std::size_t zb_bound = static_cast<std::size_t>(p - r - 1) * one.live +
                               static_cast<std::size_t>(r) * one_split.held + one_split.transient +
                               4 * message;
  EXPECT_LE(peak["zb-h1"], zb_bound) << "rank " << r;
  if (world().rank() == 0 || std::getenv("PIPELINE_MEMORY_VERBOSE"))
    std::printf(
        "[rank %d] one micro-batch %zu B live, %zu B peak (split: %zu B between B and W, %zu B peak); step "
        "peak 1F1B %zu B (bound %zu), GPipe %zu B, ZB-H1 %zu B (bound %zu)\n",
        r, one.live, one.transient, one_split.held, one_split.transient, peak["1f1b"], bound, peak["gpipe"],
        peak["zb-h1"], zb_bound);
}

// Interleaving keeps more in flight: exactly the warm-up plus one virtual micro-batch.
TEST(PipelineMemory, InterleavedInFlightIsWarmupPlusOne) {
  const int p = world().size();
  if (p < 2) GTEST_SKIP() << "needs a pipeline";
  ParallelState state(world(), RankGrid(sizes_of(1, p)));
  const int r = state.coord().pp, v = 2;
  const Case k{"", 1, p, v, p, false, false, false};
  const ModelConfig c = make_config(k, p * v);
  for (int m : {p, 2 * p}) {
    std::vector<std::unique_ptr<GPTModel>> chunks;
    std::vector<GPTModel*> ptrs;
    for (const ChunkSpec& spec : pipeline::stage_layout({p * v, p, v}, r)) {
      chunks.push_back(std::make_unique<GPTModel>(c, spec, GPTModel::Options{}, state.tp()));
      ptrs.push_back(chunks.back().get());
    }
    ChunkPipelineModel model(ptrs);
    PipelineExecutor executor(state.pp(),
                              {.micro_batches = m,
                               .virtual_stages = v,
                               .activation_shape = {c.seq_length, kMicroBatchSize, c.hidden_size}});
    model.start_step([&](int mb) { return batch_of(c, 0, mb); }, Tensor::full({1}, 1e-3, DType::F32));
    const pipeline::StepStats stats = executor.run(model);
    const int warmup = pipeline::warmup_steps({p, r, m, v});
    EXPECT_EQ(stats.peak_in_flight, std::min(warmup + 1, m * v)) << "m " << m << " rank " << r;
    EXPECT_EQ(model.peak_live_activations(), stats.peak_in_flight);
    // Messages: every chunk but the last stage sends m activations, every chunk but stage 0 m gradients.
    int sends = 0;
    for (int chunk = 0; chunk < v; ++chunk) {
      const int g = pipeline::global_stage(p, r, chunk);
      sends += (g != p * v - 1 ? m : 0) + (g != 0 ? m : 0);
    }
    EXPECT_EQ(stats.messages_sent, sends);
    EXPECT_EQ(stats.messages_received, sends);  // stage 0 and the last stage sit on different ranks
    EXPECT_GT(stats.busy_seconds, 0.0);
    EXPECT_GE(stats.idle_seconds, 0.0);
    EXPECT_GE(stats.total_seconds, stats.busy_seconds + stats.idle_seconds);
    if (std::getenv("PIPELINE_MEMORY_VERBOSE"))
      std::printf("[rank %d] p %d v %d m %d: %d of %d messages arrived before their action\n", r, p, v, m,
                  stats.received_early, stats.messages_received);
  }
}

// Messages match in posting order (tag 0, as on NCCL). A schedule whose receiver wants micro-batch 1
// before micro-batch 0 still works: the executor receives in the sender's order and keeps the early
// message, and the result equals the plain schedule's bit for bit.
TEST(PipelineExecutorOrder, ReceivesInTheSendersOrder) {
  if (world().size() != 2) GTEST_SKIP() << "needs exactly 2 ranks";
  ParallelState state(world(), RankGrid(sizes_of(1, 2)));
  const int r = state.coord().pp, m = 2;
  const ModelConfig c = make_config({"", 1, 2, 1, m, false, false, true}, 2);
  auto swapped = [](const pipeline::ScheduleParams& s) {
    pipeline::Schedule out = pipeline::gpipe(s);
    // Rank 1 starts with RF m0, F m0, RF m1, F m1: run micro-batch 1's pair first.
    if (s.rank == 1) std::swap_ranges(out.begin(), out.begin() + 2, out.begin() + 2);
    return out;
  };
  std::vector<std::vector<float>> grads[2];
  double losses[2];
  for (int variant = 0; variant < 2; ++variant) {
    GPTModel chunk(c, pipeline::stage_layout({2, 2, 1}, r).front(), {}, state.tp());
    ChunkPipelineModel model({&chunk});
    PipelineExecutor executor(state.pp(), {.micro_batches = m,
                                           .activation_shape = {c.seq_length, kMicroBatchSize, c.hidden_size},
                                           .schedule = variant == 0 ? pipeline::gpipe : swapped});
    model.start_step([&](int mb) { return batch_of(c, 0, mb); }, Tensor::full({1}, 1e-2, DType::F32));
    const pipeline::StepStats stats = executor.run(model);
    EXPECT_EQ(stats.received_early, variant == 1 && r == 1 ? 1 : 0);
    losses[variant] = model.loss_sum().to_float_vector()[0];
    for (Parameter* p : chunk.parameters()) grads[variant].push_back(p->grad.to_float_vector());
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(grads[0], grads[1]);
}

// A layout the executor cannot run is refused with the schedule's one-line rule, on every rank.
TEST(PipelineExecutorErrors, InterleavingNeedsMicroBatchesDivisibleByPipeline) {
  const int p = world().size();
  if (p < 2) GTEST_SKIP() << "needs a pipeline";
  ParallelState state(world(), RankGrid(sizes_of(1, p)));
  try {
    PipelineExecutor executor(state.pp(),
                              {.micro_batches = p + 1, .virtual_stages = 2, .activation_shape = {8, 2, 32}});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs micro-batches (" + std::to_string(p + 1) +
                                         ") divisible by pipeline size (" + std::to_string(p) + ")"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace parallel
