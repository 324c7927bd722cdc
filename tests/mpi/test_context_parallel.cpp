// Context parallelism over the whole world (cp = 2, 4) against the same GPT on a real one-rank
// communicator in-process: each cp rank runs its two chunks of every sample (cp::slice_sequence),
// and the loss sums and every parameter gradient, summed over the cp ranks, equal the one-rank
// model's (fp32, relative 1e-5), for ring attention (p2p), Ulysses (a2a) and the K/V all-gather;
// learned and rotary positions, dropout, GQA, and selective recompute (the core rebuilt in the
// backward). Also: ring attention and the all-gather alone against PyTorch on 1024 tokens
// (tests/reference/make_ring_attention_fixture.py), the chunk layout, and the activation memory of a
// long sequence at cp = 4.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "mpi_test.hpp"
#include "parallel/allocator.hpp"
#include "parallel/context_parallel.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/safetensors.hpp"
#include "parity.hpp"
#include "paths.hpp"
#include "zigzag_chunks.hpp"

namespace parallel {
namespace {

using testing::rel_err;
using testing::world;
using testing::zigzag_chunks;
constexpr double kTol = 1e-5;
constexpr int64_t kBatch = 2;

struct Variant {
  const char* label;
  bool gqa_swiglu_rope;  // else MHA + GeLU + LayerNorm + learned positions
  double dropout;
  Recompute recompute;
  bool qk_norm_head_dim = false;  // Qwen3's attention: qk-norm, head_dim 12 != 64 / 8
};

ModelConfig make_config(const Variant& v, int64_t seq) {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.vocab_size = 300;
  c.seq_length = static_cast<int>(seq);
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
    ids[i] = static_cast<int32_t>((i * 97 + 13 * shift + 7 + i * i % 31) % c.vocab_size);
  return Tensor::from_vector(ids, {kBatch, c.seq_length});
}

// One micro-batch, d(objective)/d(loss sum) = 1 / (b s) on every rank: summed over the cp ranks,
// the gradients are those of the mean over the whole sequence. Returns the loss sum.
float step(GPTModel& model, const ModelConfig& c, int cp_rank, int cp_size, uint64_t micro_batch) {
  auto act = model.new_activations();
  const Tensor tokens = cp::slice_sequence(make_ids(c, 0), cp_rank, cp_size);
  const Tensor targets = cp::slice_sequence(make_ids(c, 1), cp_rank, cp_size);
  const Tensor loss = model.forward(tokens, targets, *act, micro_batch);
  const Tensor grad = Tensor::full({1}, 1.0 / static_cast<double>(kBatch * c.seq_length), DType::F32);
  model.backward(grad, *act);
  return loss.to_float_vector()[0];
}

void run_parity(const Variant& v, ContextComm comm) {
  Communicator& cp = world();
  auto solo = world().split(world().rank(), 0);
  const ModelConfig c = make_config(v, 8 * cp.size());
  const ChunkSpec whole{0, c.num_layers, true, true};
  GPTModel mine(c, whole, {.recompute = v.recompute, .seed = 7, .cp = &cp, .context_comm = comm}, *solo);
  GPTModel ref(c, whole, {.recompute = v.recompute, .seed = 7}, *solo);
  // Two micro-batches accumulate (dropout masks differ between them).
  float loss = 0, loss_ref = 0;
  for (uint64_t mb = 0; mb < 2; ++mb) {
    loss += step(mine, c, cp.rank(), cp.size(), mb);
    loss_ref += step(ref, c, 0, 1, mb);
  }
  Tensor total = Tensor::full({1}, loss, DType::F32);
  cp.all_reduce(total);
  const float summed = total.to_float_vector()[0];
  EXPECT_LE(std::fabs(summed - loss_ref) / std::fabs(loss_ref), kTol)
      << "loss " << summed << " vs " << loss_ref;

  std::map<std::string, Parameter*> by_name;
  for (Parameter* p : ref.parameters()) by_name[p->name] = p;
  const auto params = mine.parameters();
  ASSERT_EQ(params.size(), by_name.size());
  for (Parameter* p : params) {
    ASSERT_TRUE(by_name.count(p->name)) << p->name;
    Tensor g = p->grad.clone();
    cp.all_reduce(g);  // what the dp x cp reduction sums
    const std::vector<float> a = g.to_float_vector(), b = by_name[p->name]->grad.to_float_vector();
    ASSERT_EQ(a.size(), b.size()) << p->name;
    double worst = 0, scale = 1e-30;
    for (std::size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
    }
    // A key bias shifts every score of a row equally: softmax ignores it, its gradient is noise.
    if (p->name.ends_with("attention.key.bias")) continue;
    EXPECT_GT(scale, 1e-12) << p->name << ": a zero reference gradient checks nothing";
    EXPECT_LE(worst / scale, kTol) << p->name << " (rank " << cp.rank() << ")";
  }
}

struct Case {
  Variant variant;
  ContextComm comm;
};
std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  static const char* names[] = {"p2p", "a2a", "allgather"};
  return std::string(info.param.variant.label) + "_" + names[static_cast<int>(info.param.comm)];
}

class ContextParallel : public ::testing::TestWithParam<Case> {};

TEST_P(ContextParallel, LossAndGradientsMatchOneRank) { run_parity(GetParam().variant, GetParam().comm); }

const Variant kLearned{"MhaLearnedDropout", false, 0.1, Recompute::None};
const Variant kRope{"GqaRopeSwiglu", true, 0.0, Recompute::None};
const Variant kRopeSelective{"GqaRopeSelectiveDropout", true, 0.1, Recompute::Selective};
const Variant kQkNorm{"QkNormHeadDim12Selective", true, 0.0, Recompute::Selective, true};

INSTANTIATE_TEST_SUITE_P(
    Comms, ContextParallel,
    ::testing::Values(Case{kLearned, ContextComm::P2P}, Case{kRope, ContextComm::P2P},
                      Case{kRopeSelective, ContextComm::P2P}, Case{kLearned, ContextComm::A2A},
                      Case{kRope, ContextComm::A2A}, Case{kRopeSelective, ContextComm::A2A},
                      Case{kLearned, ContextComm::AllGather}, Case{kRope, ContextComm::AllGather},
                      Case{kRopeSelective, ContextComm::AllGather}, Case{kQkNorm, ContextComm::P2P},
                      Case{kQkNorm, ContextComm::A2A}, Case{kQkNorm, ContextComm::AllGather}),
    case_name);

// ---- the attention alone against PyTorch on a long sequence -----------------------------------

// tests/reference/make_ring_attention_fixture.py: 1024 tokens, causal GQA in float64. Each rank's rows
// of out, lse and the gradients: the blocks' log-sum-exp merge and the dK/dV returned around the ring
// equal one softmax over the whole row.
TEST(ContextAttentionPyTorch, LongSequenceMergeAndGradients) {
  Communicator& cp = world();
  const std::string path = testing::fixtures_dir() + "/ring_attention.safetensors";
  auto f = safetensors::load(path);
  const float scale = std::stof(safetensors::load_metadata(path).at("scale"));
  const int c = cp.size(), r = cp.rank();
  // p2p with its transfers overlapped and waited for (the benchmark's two modes), and allgather.
  for (const auto& [comm, overlap] : {std::pair{ContextComm::P2P, true}, std::pair{ContextComm::P2P, false},
                                      std::pair{ContextComm::AllGather, true}}) {
    SCOPED_TRACE(comm == ContextComm::AllGather ? "allgather" : overlap ? "p2p" : "p2p without overlap");
    cp::Attention attention(&cp, comm, scale);
    attention.set_overlap(overlap);
    cp::Attention::Saved saved;
    const Tensor q = zigzag_chunks(f.at("q"), 0, r, c), k = zigzag_chunks(f.at("k"), 0, r, c),
                 v = zigzag_chunks(f.at("v"), 0, r, c);
    const Tensor out = attention.forward(q, k, v, saved);
    EXPECT_LE(rel_err(out, zigzag_chunks(f.at("out"), 0, r, c)), kTol) << "out";
    EXPECT_LE(rel_err(saved.lse, zigzag_chunks(f.at("lse"), 2, r, c)), kTol) << "lse";
    Tensor dq = Tensor::empty(q.shape(), DType::F32), dk = Tensor::empty(k.shape(), DType::F32),
           dv = Tensor::empty(v.shape(), DType::F32);
    attention.backward(zigzag_chunks(f.at("dout"), 0, r, c), saved, dq, dk, dv);
    EXPECT_LE(rel_err(dq, zigzag_chunks(f.at("dq"), 0, r, c)), kTol) << "dq";
    EXPECT_LE(rel_err(dk, zigzag_chunks(f.at("dk"), 0, r, c)), kTol) << "dk";
    EXPECT_LE(rel_err(dv, zigzag_chunks(f.at("dv"), 0, r, c)), kTol) << "dv";
    EXPECT_FALSE(saved.defined());
  }
}

// Rank i holds chunks i and 2c-1-i; positions follow them, split where the chunks meet.
TEST(ContextLayout, ChunksAndPositions) {
  const int c = 4;
  Tensor seq = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
                                   {1, 16});
  EXPECT_EQ(cp::slice_sequence(seq, 0, c).to_float_vector(), (std::vector<float>{0, 1, 14, 15}));
  EXPECT_EQ(cp::slice_sequence(seq, 1, c).to_float_vector(), (std::vector<float>{2, 3, 12, 13}));
  EXPECT_EQ(cp::slice_sequence(seq, 3, c).to_float_vector(), (std::vector<float>{6, 7, 8, 9}));
  // Rank 1's local rows 1..2 (a tp shard straddling its chunks): position 3, then 12.
  const auto segs = cp::segments(4, 1, c, 1, 2);
  ASSERT_EQ(segs.size(), 2u);
  EXPECT_EQ(segs[0].row, 0);
  EXPECT_EQ(segs[0].rows, 1);
  EXPECT_EQ(segs[0].position, 3);
  EXPECT_EQ(segs[1].row, 1);
  EXPECT_EQ(segs[1].rows, 1);
  EXPECT_EQ(segs[1].position, 12);
  EXPECT_EQ(cp::segments(16, 0, 1, 4, 8).size(), 1u);
  EXPECT_THROW(cp::chunk_length(18, 2), Error);
}

// A long sequence (8192 tokens, hidden 64): the activations a cp = 4 rank keeps after the forward
// of one micro-batch, measured by the allocator, against the one-rank model's.
TEST(ContextMemory, LongSequenceActivationsShrink) {
  Communicator& cp = world();
  if (cp.size() != 4) GTEST_SKIP() << "measured at cp = 4";
  auto solo = world().split(world().rank(), 0);
  ModelConfig c = make_config(kRope, 8192);
  c.hidden_size = 32;
  c.num_attention_heads = 2;
  c.num_query_groups = 2;
  c.vocab_size = 128;
  const ChunkSpec whole{0, c.num_layers, true, true};
  std::vector<int32_t> ids(static_cast<std::size_t>(c.seq_length));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i * 7 % c.vocab_size);
  const Tensor tokens = Tensor::from_vector(ids, {1, c.seq_length});
  auto kept = [&](Communicator* group, int rank, int size) {
    GPTModel model(c, whole, {.seed = 7, .cp = group}, *solo);
    auto act = model.new_activations();
    const Tensor mine = cp::slice_sequence(tokens, rank, size);
    const std::size_t before = memory_stats(Device::cpu()).allocated;
    const Tensor loss = model.forward(mine, mine, *act);
    return static_cast<double>(memory_stats(Device::cpu()).allocated - before);
  };
  const double sharded = kept(&cp, cp.rank(), cp.size());
  // The one-rank model keeps the same bytes anywhere: measured on rank 0, sent to the others.
  Tensor one_rank = Tensor::zeros({1}, DType::I64);
  if (cp.rank() == 0) one_rank.data<int64_t>()[0] = static_cast<int64_t>(kept(nullptr, 0, 1));
  cp.broadcast(one_rank, 0);
  const double whole_bytes = static_cast<double>(one_rank.data<int64_t>()[0]);
  EXPECT_LE(sharded, 0.30 * whole_bytes)
      << "cp rank " << cp.rank() << " keeps " << sharded << " bytes, one rank " << whole_bytes;
  EXPECT_GT(sharded, 0.0);
  if (cp.rank() == 0)
    std::printf(
        "[ context memory ] 8192 tokens: one rank keeps %.1f MiB of activations, a cp = 4 rank %.1f MiB "
        "(%.1f %%)\n",
        whole_bytes / (1 << 20), sharded / (1 << 20), 100.0 * sharded / whole_bytes);
}

}  // namespace
}  // namespace parallel
