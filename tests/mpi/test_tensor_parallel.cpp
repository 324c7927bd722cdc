// The tensor-parallel layers and mappings under real ranks (tp = the world) against the same layer
// computed by a real one-rank communicator in-process (world().split(rank, 0)): outputs, input
// gradients and every parameter gradient (this rank's slice of the reference's) must agree.
//
// Relative error of a against reference b: max|a - b| / max(max|b|, 1e-30); must be <= 1e-5.
// Inputs come from the layout-independent generator, so every rank builds the same global tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "compare.hpp"
#include "mpi_test.hpp"
#include "parallel/init.hpp"
#include "parallel/tensor_parallel.hpp"

namespace parallel {
namespace {

using testing::world;
constexpr double kTol = 1e-5;

using testing::rel_err;

void expect_close(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  EXPECT_LE(rel_err(a, b), kTol) << what << " (rank " << world().rank() << ")";
}

// A global tensor of N(0, 1) values, the same on every rank.
Tensor random_tensor(const Shape& shape, uint64_t stream) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = philox_normal(99, stream, i);
  return Tensor::from_vector(v, shape);
}

Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t len) {
  return t.narrow(dim, start, len).contiguous();
}

// This rank's s-shard of a [s, ...] tensor.
Tensor seq_shard(const Tensor& t, int tp, int rank) {
  const int64_t n = t.size(0) / tp;
  return slice(t, 0, rank * n, n);
}

// The reference gradient's piece that `p` holds.
Tensor ref_slice(const Parameter& p, const Tensor& ref) {
  if (p.partition_dim < 0) return ref;
  return slice(ref, p.partition_dim, p.partition_offset, p.value.size(p.partition_dim));
}

void init_all(const std::vector<Parameter*>& params) {
  for (Parameter* p : params) init_normal(*p, 5, 0.5f);  // biases too, so that they matter
}

void expect_grads_match(const std::vector<Parameter*>& mine, const std::vector<Parameter*>& ref) {
  ASSERT_EQ(mine.size(), ref.size());
  for (std::size_t i = 0; i < mine.size(); ++i) {
    ASSERT_EQ(mine[i]->name, ref[i]->name);
    EXPECT_EQ(mine[i]->global_shape, ref[i]->global_shape) << mine[i]->name;
    expect_close(mine[i]->value, ref_slice(*mine[i], ref[i]->value), mine[i]->name + " value");
    expect_close(mine[i]->grad, ref_slice(*mine[i], ref[i]->grad), mine[i]->name + " grad");
  }
}

struct Group {
  Communicator& tp = world();
  std::unique_ptr<Communicator> solo = world().split(world().rank(), 0);
  int p = world().size(), r = world().rank();
};

// ---- mappings ---------------------------------------------------------------------------------

TEST(Mappings, SequenceAndLastDim) {
  Group g;
  const Tensor x = random_tensor({8, 2, 4 * g.p}, 1);
  const Tensor shard = seq_shard(x, g.p, g.r);
  EXPECT_EQ(rel_err(tp::gather_sequence(g.tp, shard), x), 0.0);
  EXPECT_EQ(rel_err(tp::split_sequence(g.tp, x), shard), 0.0);
  const Tensor cols = slice(x, 2, g.r * 4, 4);
  EXPECT_EQ(rel_err(tp::split_last_dim(g.tp, x), cols), 0.0);
  EXPECT_EQ(rel_err(tp::gather_last_dim(g.tp, cols), x), 0.0);

  // Rank r contributes (r + 1) x: the sum is x * p (p + 1) / 2.
  Tensor mine = x.clone();
  for (float *d = mine.data<float>(), *e = d + mine.numel(); d < e; ++d) *d *= static_cast<float>(g.r + 1);
  Tensor expected = x.clone();
  for (float *d = expected.data<float>(), *e = d + expected.numel(); d < e; ++d)
    *d *= static_cast<float>(g.p * (g.p + 1) / 2);
  expect_close(tp::all_reduce(g.tp, mine), expected, "all_reduce");
  expect_close(tp::reduce_scatter_sequence(g.tp, mine), seq_shard(expected, g.p, g.r),
               "reduce_scatter_sequence");
}

// ---- ColumnParallelLinear -----------------------------------------------------------------------

struct ColumnCase {
  bool sp, gather_output, bias;
};

void run_column(ColumnCase c) {
  Group g;
  const int64_t s = 8, b = 2, in = 12;
  // gather_output concatenates whole ranks' outputs, which matches the reference's layout only for
  // one part; without it test two parts of different widths (fused q | kv, as attention uses).
  std::vector<tp::ColumnParallelLinear::Part> parts =
      c.gather_output ? std::vector<tp::ColumnParallelLinear::Part>{{"lin.q", 16}}
                      : std::vector<tp::ColumnParallelLinear::Part>{{"lin.q", 16}, {"lin.kv", 8}};
  const tp::ColumnParallelLinear::Options opt{
      .bias = c.bias, .gather_output = c.gather_output, .sequence_parallel = c.sp};
  tp::ColumnParallelLinear mine(parts, in, opt, g.tp), ref(parts, in, opt, *g.solo);
  init_all(mine.parameters());
  init_all(ref.parameters());

  int64_t out_global = 0;
  for (auto& part : parts) out_global += part.out_global;
  const Tensor x = random_tensor({s, b, in}, 10), dy = random_tensor({s, b, out_global}, 11);
  tp::LinearContext mc, rc;
  Tensor y = mine.forward(c.sp ? seq_shard(x, g.p, g.r) : x, mc);
  Tensor y_ref = ref.forward(x, rc);

  // This rank's columns of a reference-layout [.., out_global] tensor, in the local fused layout.
  auto local_columns = [&](const Tensor& t) {
    if (c.gather_output) return t;
    Tensor out = Tensor::empty({s, b, mine.out_local()}, DType::F32);
    int64_t global_off = 0, local_off = 0;
    for (auto& part : parts) {
      const int64_t local = part.out_global / g.p;
      Tensor dst = out.narrow(2, local_off, local);
      dst.copy_(t.narrow(2, global_off + g.r * local, local));
      global_off += part.out_global;
      local_off += local;
    }
    return out;
  };
  expect_close(y, local_columns(y_ref), "column output");

  Tensor dx = mine.backward(local_columns(dy), mc);
  Tensor dx_ref = ref.backward(dy, rc);
  expect_close(dx, c.sp ? seq_shard(dx_ref, g.p, g.r) : dx_ref, "column dx");
  tp::reduce_sequence_parallel_grads(mine.parameters(), g.tp);
  expect_grads_match(mine.parameters(), ref.parameters());
}

TEST(ColumnParallelLinear, Plain) { run_column({false, false, true}); }
TEST(ColumnParallelLinear, NoBias) { run_column({false, false, false}); }
TEST(ColumnParallelLinear, SequenceParallel) { run_column({true, false, true}); }
TEST(ColumnParallelLinear, GatherOutput) { run_column({false, true, true}); }
TEST(ColumnParallelLinear, GatherOutputSequenceParallel) { run_column({true, true, true}); }

// ---- RowParallelLinear --------------------------------------------------------------------------

void run_row(bool sp, bool bias) {
  Group g;
  const int64_t s = 8, b = 2, in = 16, out = 12, in_local = in / g.p;
  const tp::RowParallelLinear::Options opt{.bias = bias, .sequence_parallel = sp};
  tp::RowParallelLinear mine("lin.proj", in, out, opt, g.tp), ref("lin.proj", in, out, opt, *g.solo);
  init_all(mine.parameters());
  init_all(ref.parameters());
  EXPECT_EQ(mine.bias.sequence_parallel_grad, bias && sp && g.p > 1);

  const Tensor x = random_tensor({s, b, in}, 20), dy = random_tensor({s, b, out}, 21);
  tp::LinearContext mc, rc;
  Tensor y = mine.forward(slice(x, 2, g.r * in_local, in_local), mc);
  Tensor y_ref = ref.forward(x, rc);
  expect_close(y, sp ? seq_shard(y_ref, g.p, g.r) : y_ref, "row output");

  Tensor dx = mine.backward(sp ? seq_shard(dy, g.p, g.r) : dy, mc);
  Tensor dx_ref = ref.backward(dy, rc);
  expect_close(dx, slice(dx_ref, 2, g.r * in_local, in_local), "row dx");
  tp::reduce_sequence_parallel_grads(mine.parameters(), g.tp);
  expect_grads_match(mine.parameters(), ref.parameters());
}

TEST(RowParallelLinear, Plain) { run_row(false, true); }
TEST(RowParallelLinear, NoBias) { run_row(false, false); }
TEST(RowParallelLinear, SequenceParallel) { run_row(true, true); }

// ---- VocabParallelEmbedding ---------------------------------------------------------------------

void run_embedding(bool sp) {
  Group g;
  const int64_t s = 8, b = 2, vocab = 64, h = 8;
  tp::VocabParallelEmbedding mine("emb.weight", vocab, h, sp, g.tp), ref("emb.weight", vocab, h, sp, *g.solo);
  init_all(mine.parameters());
  init_all(ref.parameters());
  std::vector<int32_t> ids(static_cast<std::size_t>(b * s));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 5) % vocab);
  ids[3] = ids[7];  // a repeated id accumulates two rows of dy
  const Tensor tokens = Tensor::from_vector(ids, {b, s});
  const Tensor dy = random_tensor({s, b, h}, 30);

  tp::VocabParallelEmbedding::Context mc, rc;
  Tensor y = mine.forward(tokens, mc), y_ref = ref.forward(tokens, rc);
  expect_close(y, sp ? seq_shard(y_ref, g.p, g.r) : y_ref, "embedding output");
  mine.backward(sp ? seq_shard(dy, g.p, g.r) : dy, mc);
  ref.backward(dy, rc);
  expect_grads_match(mine.parameters(), ref.parameters());
}

TEST(VocabParallelEmbedding, Plain) { run_embedding(false); }
TEST(VocabParallelEmbedding, SequenceParallel) { run_embedding(true); }

// ---- cross entropy ------------------------------------------------------------------------------

TEST(VocabParallelCrossEntropy, MatchesOneRankAndIgnoresPadding) {
  Group g;
  const int64_t n = 16, vp = 64, vocab = 50, v_local = vp / g.p;  // columns >= 50 are padding
  Tensor logits = random_tensor({n, vp}, 40);
  // Large padding logits would dominate the softmax if they were not masked out.
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = vocab; j < vp; ++j) logits.data<float>()[i * vp + j] = 100.0f;
  std::vector<int32_t> t(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>((i * 13 + 2) % vocab);
  t[0] = vocab - 1;  // the last valid id
  const Tensor targets = Tensor::from_vector(t, {n});
  const Tensor grad_loss = random_tensor({n}, 41);

  tp::CrossEntropyContext mc, rc;
  Tensor loss = tp::vocab_parallel_cross_entropy(g.tp, slice(logits, 1, g.r * v_local, v_local), targets,
                                                 g.r * v_local, vocab, mc);
  Tensor loss_ref = tp::vocab_parallel_cross_entropy(*g.solo, logits, targets, 0, vocab, rc);
  expect_close(loss, loss_ref, "loss");
  // Independent check of the reference: log-sum-exp over the valid columns only.
  const auto lv = loss_ref.to_float_vector();
  for (int64_t i = 0; i < n; ++i) {
    double m = -1e30, z = 0;
    const float* row = logits.data<float>() + i * vp;
    for (int64_t j = 0; j < vocab; ++j) m = std::max(m, static_cast<double>(row[j]));
    for (int64_t j = 0; j < vocab; ++j) z += std::exp(row[j] - m);
    EXPECT_NEAR(lv[static_cast<std::size_t>(i)], std::log(z) + m - row[t[static_cast<std::size_t>(i)]], 1e-4);
  }

  Tensor dl = tp::vocab_parallel_cross_entropy_backward(grad_loss, mc);
  Tensor dl_ref = tp::vocab_parallel_cross_entropy_backward(grad_loss, rc);
  expect_close(dl, slice(dl_ref, 1, g.r * v_local, v_local), "dlogits");
  const auto dv = dl_ref.to_float_vector();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = vocab; j < vp; ++j) EXPECT_EQ(dv[static_cast<std::size_t>(i * vp + j)], 0.0f);
}

}  // namespace
}  // namespace parallel
