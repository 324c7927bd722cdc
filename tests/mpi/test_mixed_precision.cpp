// Mixed precision (GPTModel::Options::precision, precision.hpp): every tensor that flows between
// ops, forward and backward, is a real bf16 / fp16 tensor; the ops compute in fp32 inside. Checks:
//   - what a chunk hands to the next pipeline chunk (and the gradient handed back) is a bf16
//     tensor, and parameter gradients are fp32;
//   - bf16 / fp16 losses stay within 2e-2 (relative) of fp32 and are not bitwise equal to it;
//   - tp = world (1 or 2) in bf16, with and without sequence parallelism, matches one rank in bf16.
// The fp32 path is covered, bitwise as before, by test_gpt_parity and the other parity tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "compare.hpp"
#include "mpi_test.hpp"
#include "parallel/allocator.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/ops.hpp"
#include "parallel/tensor_parallel.hpp"

namespace parallel {
namespace {

using testing::rel_err;
using testing::world;
constexpr int64_t kBatch = 2;

struct Variant {
  const char* label;
  bool llama;  // GQA + SwiGLU + RMSNorm + rope; else MHA + GeLU + LayerNorm + learned positions
  double dropout = 0.0;
};
void PrintTo(const Variant& v, std::ostream* os) { *os << v.label; }

ModelConfig make_config(const Variant& v) {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.vocab_size = 256;  // a multiple of 128 * 2: no padding at tp = 1 or 2, so vocab slices line up
  c.seq_length = 16;
  c.add_bias = true;
  c.tie_embeddings = !v.llama;
  c.dropout = v.dropout;
  c.init_std = 0.1;
  if (v.llama) {
    c.num_attention_heads = 8;
    c.num_query_groups = 4;
    c.normalization = Normalization::RMSNorm;
    c.activation = Activation::SwiGLU;
    c.position_embedding = PositionEmbedding::Rope;
  } else {
    c.num_attention_heads = 4;
  }
  return c;
}

Tensor make_ids(const ModelConfig& c, int shift) {
  std::vector<int32_t> ids(static_cast<std::size_t>(kBatch * c.seq_length));
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int32_t>((i * 97 + 13 * shift + 7) % c.vocab_size);
  return Tensor::from_vector(ids, {kBatch, c.seq_length});
}

// Every precision computes on the same bf16-representable parameter values (a bf16 model holds
// them already), so that only the activations' precision differs between runs.
void round_parameters_to_bf16(GPTModel& model) {
  for (Parameter* p : model.parameters()) {
    Tensor wide = p->value.to(DType::F32);
    ops::round_to_precision_(wide, DType::BF16);
    p->value.copy_(wide);
  }
}

bool is_bf16(float x) {
  return std::bit_cast<uint32_t>(bf16_to_float(float_to_bf16(x))) == std::bit_cast<uint32_t>(x);
}

void expect_all_bf16(const Tensor& t, const std::string& what) {
  int64_t bad = 0;
  for (float x : t.contiguous().to_float_vector()) bad += is_bf16(x) ? 0 : 1;
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << t.numel() << " elements are not bf16 values";
}

// Forward + backward of one micro-batch (d objective / d loss sum = 1 / (b s)); returns the loss sum.
float step(GPTModel& model, const ModelConfig& c, Communicator& tp) {
  auto act = model.new_activations();
  const Tensor loss = model.forward(make_ids(c, 0), make_ids(c, 1), *act);
  const Tensor grad = Tensor::full({1}, 1.0 / static_cast<double>(kBatch * c.seq_length), DType::F32);
  model.backward(grad, *act);
  tp::reduce_sequence_parallel_grads(model.parameters(), tp);
  return loss.to_float_vector()[0];
}

class MixedPrecision : public ::testing::TestWithParam<Variant> {};

// (a) Two pipeline chunks on one rank: the hidden state chunk 0 hands over and the gradient chunk 1
// hands back are bf16 tensors (as they are on the wire of a GPU run).
TEST_P(MixedPrecision, ChunkBoundariesAreBf16) {
  auto solo = world().split(world().rank(), 0);
  const ModelConfig c = make_config(GetParam());
  const GPTModel::Options o{.seed = 5, .precision = Precision::BF16};
  GPTModel first(c, {0, 1, true, false}, o, *solo), last(c, {1, 1, false, true}, o, *solo);
  round_parameters_to_bf16(first);
  round_parameters_to_bf16(last);
  auto a0 = first.new_activations(), a1 = last.new_activations();
  const Tensor hidden = first.forward(make_ids(c, 0), Tensor(), *a0);
  EXPECT_EQ(hidden.dtype(), DType::BF16);
  expect_all_bf16(hidden, "chunk 0 output");
  const Tensor loss = last.forward(hidden, make_ids(c, 1), *a1);
  EXPECT_TRUE(std::isfinite(loss.to_float_vector()[0]));
  const Tensor dhidden =
      last.backward(Tensor::full({1}, 1.0 / static_cast<double>(kBatch * c.seq_length), DType::F32), *a1);
  EXPECT_EQ(dhidden.dtype(), DType::BF16);
  expect_all_bf16(dhidden, "chunk 1 input gradient");
  first.backward(dhidden, *a0);
  // Parameter gradients accumulate in fp32: at least some are not bf16 values.
  int64_t not_bf16 = 0;
  for (Parameter* p : first.parameters()) {
    EXPECT_EQ(p->value.dtype(), DType::BF16) << p->name;
    EXPECT_EQ(p->grad.dtype(), DType::F32) << p->name;
  }
  for (Parameter* p : first.parameters())
    for (float g : p->grad.to_float_vector()) not_bf16 += is_bf16(g) ? 0 : 1;
  EXPECT_GT(not_bf16, 0) << "parameter gradients must stay fp32";
}

// (b) bf16 / fp16 against fp32 on the same (bf16-representable) parameters.
TEST_P(MixedPrecision, LossCloseToFp32ButRounded) {
  auto solo = world().split(world().rank(), 0);
  const ModelConfig c = make_config(GetParam());
  std::map<Precision, float> loss;
  for (Precision precision : {Precision::FP32, Precision::BF16, Precision::FP16}) {
    GPTModel model(c, {0, c.num_layers, true, true}, {.seed = 5, .precision = precision}, *solo);
    round_parameters_to_bf16(model);
    loss[precision] = step(model, c, *solo);
  }
  const float ref = loss[Precision::FP32];
  for (Precision precision : {Precision::BF16, Precision::FP16}) {
    const char* name = precision == Precision::BF16 ? "bf16" : "fp16";
    EXPECT_LE(std::fabs(loss[precision] - ref) / std::fabs(ref), 2e-2)
        << name << " " << loss[precision] << " vs fp32 " << ref;
    EXPECT_NE(std::bit_cast<uint32_t>(loss[precision]), std::bit_cast<uint32_t>(ref))
        << name << ": bitwise equal to fp32, so no rounding happened";
  }
}

// (c) tp = world in bf16 against one rank in bf16. Not bitwise: the partial sums of a row-parallel
// linear (and of the vocab-parallel pieces) are added in a different order and the sum is rounded
// to bf16 (8 significant bits, relative step 2^-8 = 3.9e-3) afterwards, so a rounding boundary may
// fall differently and an element moves by one bf16 step; such one-ulp differences propagate
// through the layers. Bounds: the loss sum within 1e-2 relative, each gradient within 5e-2 of its
// largest reference value (a few bf16 steps; a real bug, e.g. a missing reduction, is O(1)).
void run_tp(const Variant& v, bool sp) {
  Communicator& tp = world();
  auto solo = world().split(world().rank(), 0);
  const ModelConfig c = make_config(v);
  const ChunkSpec whole{0, c.num_layers, true, true};
  GPTModel mine(c, whole, {.sequence_parallel = sp, .seed = 7, .precision = Precision::BF16}, tp);
  GPTModel ref(c, whole, {.seed = 7, .precision = Precision::BF16}, *solo);
  round_parameters_to_bf16(mine);
  round_parameters_to_bf16(ref);
  const float loss = step(mine, c, tp), loss_ref = step(ref, c, *solo);
  EXPECT_LE(std::fabs(loss - loss_ref) / std::fabs(loss_ref), 1e-2) << "loss " << loss << " vs " << loss_ref;
  if (tp.size() == 1) EXPECT_EQ(loss, loss_ref) << "the same layout must be bitwise reproducible";

  std::map<std::string, Parameter*> by_name;
  for (Parameter* p : ref.parameters()) by_name[p->name] = p;
  double worst = 0.0;
  for (Parameter* p : mine.parameters()) {
    ASSERT_TRUE(by_name.count(p->name)) << p->name;
    // Without rope the key bias gets an exact gradient of 0 (softmax ignores a per-row shift);
    // both sides hold only rounding noise there, nothing to compare.
    if (!v.llama && p->name.ends_with("attention.key.bias")) continue;
    const Parameter& r = *by_name[p->name];
    const Tensor expected = p->partition_dim < 0 ? r.grad
                                                 : r.grad.narrow(p->partition_dim, p->partition_offset,
                                                                 p->value.size(p->partition_dim));
    ASSERT_EQ(p->grad.shape(), expected.shape()) << p->name;
    double err = rel_err(p->grad, expected);
    if (p->name.ends_with("attention.key.bias")) {
      // With rope the key bias gradient is a small remainder of terms that nearly cancel (softmax
      // ignores a per-row shift; only the rotation breaks that), so bf16 noise in them is large
      // relative to its own size: measure it against the layer's query-bias gradient scale.
      double kmax = 0, qmax = 0;
      for (float g : expected.contiguous().to_float_vector()) kmax = std::max(kmax, std::fabs(double{g}));
      const std::string q = p->name.substr(0, p->name.size() - std::string("key.bias").size()) + "query.bias";
      for (float g : by_name.at(q)->grad.to_float_vector()) qmax = std::max(qmax, std::fabs(double{g}));
      if (qmax > kmax) err *= kmax / qmax;
    }
    EXPECT_LE(err, 5e-2) << p->name << " (rank " << tp.rank() << ")";
    worst = std::max(worst, err);
  }
  if (tp.rank() == 0)
    std::printf("%s tp=%d sp=%d bf16: loss rel diff %.3g, worst gradient rel error %.3g\n", v.label,
                tp.size(), sp ? 1 : 0, std::fabs(loss - loss_ref) / std::fabs(loss_ref), worst);
}

TEST_P(MixedPrecision, TensorParallelMatchesOneRank) { run_tp(GetParam(), false); }
TEST_P(MixedPrecision, SequenceParallelMatchesOneRank) {
  if (world().size() == 1) GTEST_SKIP() << "sequence parallelism needs tp > 1";
  run_tp(GetParam(), true);
}

// Full recompute reruns the forward with the same rounding: bitwise the same gradients.
TEST_P(MixedPrecision, RecomputeIsBitwiseInBf16) {
  auto solo = world().split(world().rank(), 0);
  const ModelConfig c = make_config(GetParam());
  std::vector<std::vector<float>> grads[3];
  float losses[3] = {};
  const Recompute policies[3] = {Recompute::None, Recompute::Selective, Recompute::Full};
  for (int i = 0; i < 3; ++i) {
    GPTModel model(c, {0, c.num_layers, true, true},
                   {.recompute = policies[i], .seed = 5, .precision = Precision::BF16}, *solo);
    round_parameters_to_bf16(model);
    losses[i] = step(model, c, *solo);
    for (Parameter* p : model.parameters()) grads[i].push_back(p->grad.to_float_vector());
  }
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(losses[i], losses[0]);
    EXPECT_EQ(grads[i], grads[0]) << "recompute policy " << i;
  }
}

// Memory: the activations a micro-batch keeps for its backward, from the allocator, in bf16 are at
// most 55 % of fp32's (half, plus the fp32 statistics: norm mean/rstd, attention lse, the
// cross-entropy's per-token pieces, and the int32 targets).
TEST_P(MixedPrecision, Bf16KeepsAtMost55PercentOfFp32ActivationBytes) {
  auto solo = world().split(world().rank(), 0);
  ModelConfig c = make_config(GetParam());
  c.seq_length = 64;
  std::map<Precision, double> kept;
  for (Precision precision : {Precision::FP32, Precision::BF16}) {
    GPTModel model(c, {0, c.num_layers, true, true}, {.seed = 5, .precision = precision}, *solo);
    const Tensor tokens = make_ids(c, 0), targets = make_ids(c, 1);
    const std::size_t before = memory_stats(Device::cpu()).allocated;
    auto act = model.new_activations();
    const Tensor loss = model.forward(tokens, targets, *act);
    kept[precision] = static_cast<double>(memory_stats(Device::cpu()).allocated - before);
    model.backward(Tensor::full({1}, 1.0, DType::F32), *act);
  }
  const double ratio = kept[Precision::BF16] / kept[Precision::FP32];
  if (world().rank() == 0)
    std::printf("%s: activations kept per micro-batch: fp32 %.0f bytes, bf16 %.0f bytes (%.1f %%)\n",
                GetParam().label, kept[Precision::FP32], kept[Precision::BF16], 100.0 * ratio);
  EXPECT_GT(kept[Precision::FP32], 0.0);
  EXPECT_LE(ratio, 0.55);
}

INSTANTIATE_TEST_SUITE_P(Variants, MixedPrecision,
                         ::testing::Values(Variant{"MhaGeluLayerNormLearned", false},
                                           Variant{"GqaSwigluRmsRope", true},
                                           Variant{"MhaGeluDropout", false, 0.1}),
                         [](const auto& info) { return std::string(info.param.label); });

}  // namespace
}  // namespace parallel
