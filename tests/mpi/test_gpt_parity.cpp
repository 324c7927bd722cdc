// A small GPT under tensor parallelism (tp = the world: 1, 2, 4), with and without sequence
// parallelism, against the same model on a real one-rank communicator in-process: the loss and
// every parameter gradient (this rank's slice of the reference's) agree. Also: padded vocabulary
// rows are inert, a tp rank holds exactly its share of the weights (measured by the allocator),
// and the recompute policies give the same gradients as keeping everything.
//
// Relative error of a against reference b: max|a - b| / max(max|b|, 1e-30); must be <= 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "mpi_test.hpp"
#include "parallel/allocator.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/tensor_parallel.hpp"
#include "parity.hpp"

namespace parallel {
namespace {

using testing::world;
constexpr double kTol = 1e-5;
constexpr int64_t kBatch = 2;

using testing::is_vocab_param;
using testing::max_abs;
using testing::rel_err;

struct Variant {
  const char* label;
  bool gqa_swiglu_rope;  // else MHA + GeLU + LayerNorm + learned positions
  bool tied, bias;
  double dropout = 0.0;
  bool qk_norm_head_dim = false;  // Qwen3's attention: qk-norm, head_dim 12 != 64 / 8
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.label; }

ModelConfig make_config(const Variant& v) {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.vocab_size = 300;  // not a multiple of 128: padding differs between tp = 1 (384) and tp > 1 (512)
  c.seq_length = 16;
  c.add_bias = v.bias;
  c.tie_embeddings = v.tied;
  c.dropout = v.dropout;
  c.init_std = 0.1;  // larger than GPT-2's so that every gradient is well above rounding noise
  if (v.gqa_swiglu_rope) {
    c.num_attention_heads = 8;
    c.num_query_groups = 4;
    c.normalization = Normalization::RMSNorm;
    c.activation = Activation::SwiGLU;
    c.position_embedding = PositionEmbedding::Rope;
  } else {
    c.num_attention_heads = 4;
  }
  if (v.qk_norm_head_dim) {
    c.qk_norm = true;
    c.head_dim = 12;
  }
  return c;
}

Tensor make_ids(const ModelConfig& c, int shift) {
  std::vector<int32_t> ids(static_cast<std::size_t>(kBatch * c.seq_length));
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int32_t>((i * 97 + 13 * shift + 7) % c.vocab_size);
  ids[1] = c.vocab_size - 1;  // the last real id
  return Tensor::from_vector(ids, {kBatch, c.seq_length});
}

// Forward + backward of one micro-batch with d(objective)/d(loss sum) = 1 / (b s); returns the loss sum.
float step(GPTModel& model, const ModelConfig& c, Communicator& tp) {
  auto act = model.new_activations();
  const Tensor loss = model.forward(make_ids(c, 0), make_ids(c, 1), *act);
  const Tensor grad = Tensor::full({1}, 1.0 / static_cast<double>(kBatch * c.seq_length), DType::F32);
  const Tensor none = model.backward(grad, *act);
  EXPECT_FALSE(none.defined() && none.numel() > 0);
  tp::reduce_sequence_parallel_grads(model.parameters(), tp);
  return loss.to_float_vector()[0];
}

void expect_grad_matches(const Parameter& p, const Parameter& ref, int64_t vocab, bool key_bias_is_inert) {
  testing::expect_grad_matches(p, ref, vocab, key_bias_is_inert,
                               p.name + " (rank " + std::to_string(world().rank()) + ")", kTol);
}

void run_parity(const Variant& v, bool sp) {
  Communicator& tp = world();
  auto solo = world().split(world().rank(), 0);
  const ModelConfig c = make_config(v);
  const ChunkSpec whole{0, c.num_layers, true, true};
  GPTModel mine(c, whole, {.sequence_parallel = sp, .recompute = Recompute::None, .seed = 7}, tp);
  GPTModel ref(c, whole, {.sequence_parallel = false, .recompute = Recompute::None, .seed = 7}, *solo);
  const float loss = step(mine, c, tp), loss_ref = step(ref, c, *solo);
  EXPECT_LE(std::fabs(loss - loss_ref) / std::fabs(loss_ref), kTol) << "loss " << loss << " vs " << loss_ref;

  std::map<std::string, Parameter*> by_name;
  for (Parameter* p : ref.parameters()) by_name[p->name] = p;
  const auto params = mine.parameters();
  EXPECT_EQ(params.size(), by_name.size());
  for (Parameter* p : params) {
    ASSERT_TRUE(by_name.count(p->name)) << p->name;
    const bool inert =
        c.position_embedding != PositionEmbedding::Rope && p->name.ends_with("attention.key.bias");
    expect_grad_matches(*p, *by_name[p->name], c.vocab_size, inert);
  }
}

class GPTParity : public ::testing::TestWithParam<Variant> {};

TEST_P(GPTParity, TensorParallel) { run_parity(GetParam(), false); }
TEST_P(GPTParity, SequenceParallel) {
  if (world().size() == 1) GTEST_SKIP() << "sequence parallelism needs tp > 1";
  run_parity(GetParam(), true);
}

INSTANTIATE_TEST_SUITE_P(Variants, GPTParity,
                         ::testing::Values(Variant{"MhaGeluLayerNormLearnedTiedBias", false, true, true},
                                           Variant{"MhaGeluLayerNormLearnedUntiedNoBias", false, false,
                                                   false},
                                           Variant{"GqaSwigluRmsRopeUntiedBias", true, false, true},
                                           Variant{"GqaSwigluRmsRopeTiedNoBias", true, true, false},
                                           // Dropout masks are keyed by global positions: tp-independent.
                                           Variant{"MhaGeluDropout", false, true, true, 0.1},
                                           Variant{"GqaSwigluDropout", true, false, true, 0.1},
                                           // Qwen3: per-head norms of q and k (weights summed over tp).
                                           Variant{"QkNormHeadDim12", true, true, false, 0.0, true}),
                         [](const auto& info) { return std::string(info.param.label); });

// ---- padded vocabulary --------------------------------------------------------------------------

TEST(GPTPadding, PaddedRowsGetNoGradientAndDoNotChangeTheLoss) {
  Communicator& tp = world();
  for (bool tied : {true, false}) {
    const ModelConfig c = make_config({"", false, tied, true});
    GPTModel model(c, {0, c.num_layers, true, true}, {.sequence_parallel = tp.size() > 1}, tp);
    ASSERT_EQ(model.vocab_padded(), padded_vocab_size(300, tp.size()));
    ASSERT_EQ(model.vocab_padded() % (128 * tp.size()), 0);
    const float before = step(model, c, tp);
    for (Parameter* p : model.parameters()) {
      if (!is_vocab_param(p->name)) continue;
      const int64_t start = p->partition_offset, rows = p->value.size(0), h = p->value.size(1);
      const int64_t real = std::clamp<int64_t>(c.vocab_size - start, 0, rows);
      const auto g = p->grad.to_float_vector();
      for (int64_t i = real * h; i < rows * h; ++i)
        ASSERT_EQ(g[static_cast<std::size_t>(i)], 0.0f) << p->name;
      // Garbage in the padded rows: large logits there would swamp the softmax if they leaked in.
      float* w = p->value.data<float>();
      for (int64_t i = real * h; i < rows * h; ++i) w[i] = 50.0f + static_cast<float>(i % 7);
    }
    auto act = model.new_activations();
    const float after = model.forward(make_ids(c, 0), make_ids(c, 1), *act).to_float_vector()[0];
    EXPECT_EQ(before, after) << "tied " << tied;
  }
}

// ---- memory: each rank holds exactly its share --------------------------------------------------

// Bytes of value + grad (fp32) that a rank at tensor-parallel size `tp` holds for these parameters,
// from their global shapes: split parameters 1/tp, replicated ones whole.
std::size_t expected_bytes(const std::vector<Parameter*>& params, int tp) {
  std::size_t bytes = 0;
  for (const Parameter* p : params) {
    const int64_t n = shape_numel(p->global_shape);
    bytes += 2 * sizeof(float) * static_cast<std::size_t>(p->is_replicated_over_tp() ? n : n / tp);
  }
  return bytes;
}

TEST(GPTMemory, RankHoldsItsShareOfTheWeights) {
  Communicator& tp = world();
  auto solo = world().split(world().rank(), 0);
  for (const Variant& v : {Variant{"", false, true, true}, Variant{"", true, false, false}}) {
    const ModelConfig c = make_config(v);
    const ChunkSpec whole{0, c.num_layers, true, true};
    const std::size_t base = memory_stats(Device::cpu()).allocated;
    auto ref = std::make_unique<GPTModel>(c, whole, GPTModel::Options{}, *solo);
    const std::size_t ref_bytes = memory_stats(Device::cpu()).allocated - base;
    auto mine =
        std::make_unique<GPTModel>(c, whole, GPTModel::Options{.sequence_parallel = tp.size() > 1}, tp);
    const std::size_t my_bytes = memory_stats(Device::cpu()).allocated - base - ref_bytes;
    EXPECT_EQ(ref_bytes, expected_bytes(ref->parameters(), 1));
    EXPECT_EQ(my_bytes, expected_bytes(mine->parameters(), tp.size()));
    // Every split weight is exactly 1/tp of its global tensor.
    for (Parameter* p : mine->parameters())
      if (!p->is_replicated_over_tp())
        EXPECT_EQ(p->numel() * tp.size(), shape_numel(p->global_shape)) << p->name;
    mine.reset();
    ref.reset();
    EXPECT_EQ(memory_stats(Device::cpu()).allocated, base);
  }
}

// ---- recompute ----------------------------------------------------------------------------------

TEST(GPTRecompute, SelectiveAndFullMatchNone) {
  Communicator& tp = world();
  for (const Variant& v : {Variant{"", false, true, true, 0.1}, Variant{"", true, false, false, 0.1},
                           Variant{"", true, true, false, 0.1, true}}) {
    const ModelConfig c = make_config(v);
    std::vector<std::vector<std::vector<float>>> grads;
    std::vector<float> losses;
    for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
      GPTModel model(c, {0, c.num_layers, true, true}, {.sequence_parallel = tp.size() > 1, .recompute = r},
                     tp);
      losses.push_back(step(model, c, tp));
      grads.emplace_back();
      for (Parameter* p : model.parameters()) grads.back().push_back(p->grad.to_float_vector());
    }
    for (std::size_t k = 1; k < grads.size(); ++k) {
      EXPECT_EQ(losses[k], losses[0]);
      ASSERT_EQ(grads[k].size(), grads[0].size());
      for (std::size_t i = 0; i < grads[0].size(); ++i) EXPECT_EQ(grads[k][i], grads[0][i]) << "param " << i;
    }
  }
}

// Selective recompute keeps less than none, full keeps less than selective (live bytes after the
// forward of one micro-batch, measured by the allocator).
TEST(GPTRecompute, SavesMemory) {
  Communicator& tp = world();
  const ModelConfig c = make_config({"", true, false, true});
  std::vector<std::size_t> live;
  for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    GPTModel model(c, {0, c.num_layers, true, true}, {.sequence_parallel = tp.size() > 1, .recompute = r},
                   tp);
    const std::size_t base = memory_stats(Device::cpu()).allocated;
    auto act = model.new_activations();
    model.forward(make_ids(c, 0), make_ids(c, 1), *act);
    live.push_back(memory_stats(Device::cpu()).allocated - base);
    model.backward(Tensor::full({1}, 1.0, DType::F32), *act);
    EXPECT_EQ(memory_stats(Device::cpu()).allocated, base) << "backward must free the activations";
  }
  EXPECT_LT(live[1], live[0]);
  EXPECT_LT(live[2], live[1]);
}

// ---- pipeline chunks ----------------------------------------------------------------------------

// The model split into two chunks (as two pipeline stages would hold it) gives the whole model's
// gradients; with tied embeddings the two copies' gradients sum to the whole model's.
TEST(GPTChunks, TwoChunksMatchTheWholeModel) {
  Communicator& tp = world();
  for (bool tied : {true, false}) {
    const ModelConfig c = make_config({"", true, tied, true});
    const GPTModel::Options o{.sequence_parallel = tp.size() > 1};
    GPTModel whole(c, {0, 2, true, true}, o, tp), first(c, {0, 1, true, false}, o, tp),
        last(c, {1, 1, false, true}, o, tp);
    const float loss_whole = step(whole, c, tp);

    auto a1 = first.new_activations(), a2 = last.new_activations();
    const Tensor hidden = first.forward(make_ids(c, 0), Tensor(), *a1);
    const Tensor loss = last.forward(hidden, make_ids(c, 1), *a2);
    const Tensor dh = last.backward(Tensor::full({1}, 1.0 / (kBatch * c.seq_length), DType::F32), *a2);
    first.backward(dh, *a1);
    tp::reduce_sequence_parallel_grads(first.parameters(), tp);
    tp::reduce_sequence_parallel_grads(last.parameters(), tp);
    EXPECT_EQ(loss.to_float_vector()[0], loss_whole);

    std::map<std::string, std::vector<float>> sum;
    for (GPTModel* m : {&first, &last})
      for (Parameter* p : m->parameters()) {
        EXPECT_EQ(p->shared_across_pipeline, tied && p->name == "embedding.word.weight") << p->name;
        auto g = p->grad.to_float_vector();
        auto& s = sum[p->name];
        if (s.empty()) s.assign(g.size(), 0.0f);
        for (std::size_t i = 0; i < g.size(); ++i) s[i] += g[i];
      }
    for (Parameter* p : whole.parameters()) {
      ASSERT_TRUE(sum.count(p->name)) << p->name;
      const Tensor expected = Tensor::from_vector(sum[p->name], p->grad.shape());
      EXPECT_LE(rel_err(p->grad, expected), 1e-6) << p->name;
    }
  }
}

}  // namespace
}  // namespace parallel
