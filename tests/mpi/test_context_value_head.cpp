// Context-parallel attention with a value head size dv other than the query/key one d (multi-head
// latent attention), over the whole world (cp = 2, 4): every exchange type (p2p ring, a2a/Ulysses,
// allgather) carries K [.., d] and V [.., dv] at their own sizes. Each rank's rows of out, lse and
// the gradients equal
//   - PyTorch's float64 attention (tests/reference/make_ring_attention_fixture.py,
//     attention_dv.safetensors: causal GQA, d 24, dv 16, a scale other than 1/sqrt(d)), and
//   - the one-rank op (ops::attention_* on the whole sequence, in-process) under a sliding window
//     and packed documents, whose PyTorch counterpart the op table's fp64 reference covers,
// to fp32 rounding (relative 1e-5 of the largest element).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "compare.hpp"
#include "mpi_test.hpp"
#include "parallel/context_parallel.hpp"
#include "parallel/ops.hpp"
#include "parallel/safetensors.hpp"
#include "paths.hpp"
#include "zigzag_chunks.hpp"

namespace parallel {
namespace {

using testing::world;
using testing::zigzag_chunks;
constexpr double kTol = 1e-5;

// max |a - b| / max |b| over the tensor, for tensors of one shape.
double rel_to_max(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  return testing::rel_err(a, b);
}

struct Result {
  Tensor out, lse, dq, dk, dv;
};

// The one-rank op on the whole sequence.
Result one_rank(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                const ops::AttentionMask& mask, float scale) {
  Result r;
  r.out = Tensor::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, DType::F32);
  r.lse = Tensor::empty({q.size(1), q.size(2), q.size(0)}, DType::F32);
  ops::attention_forward(q, k, v, r.out, r.lse, mask, scale);
  r.dq = Tensor::empty(q.shape(), DType::F32);
  r.dk = Tensor::empty(k.shape(), DType::F32);
  r.dv = Tensor::empty(v.shape(), DType::F32);
  ops::attention_backward(dout, q, k, v, r.out, r.lse, r.dq, r.dk, r.dv, mask, scale);
  return r;
}

// Documents of 11, 13 and 8 tokens (shifted by 3 in the second sample) as doc_start [b, s].
Tensor doc_starts(int64_t b, int64_t s) {
  const std::vector<int64_t> lengths = {11, 13, 8};
  std::vector<int32_t> out;
  for (int64_t e = 0; e < b; ++e) {
    int64_t start = 0, next = lengths[0] - 3 * e, k = 0;
    for (int64_t p = 0; p < s; ++p) {
      if (p == next) {
        start = p;
        k = (k + 1) % static_cast<int64_t>(lengths.size());
        next = p + lengths[static_cast<std::size_t>(k)];
      }
      out.push_back(static_cast<int32_t>(start));
    }
  }
  return Tensor::from_vector(out, {b, s});
}

TEST(ContextAttentionValueHead, EveryExchangeMatchesPyTorchAndOneRank) {
  Communicator& cp = world();
  const std::string path = testing::fixtures_dir() + "/attention_dv.safetensors";
  auto f = safetensors::load(path);
  const float scale = std::stof(safetensors::load_metadata(path).at("scale"));
  const Tensor &q = f.at("q"), &k = f.at("k"), &v = f.at("v"), &dout = f.at("dout");
  ASSERT_NE(q.size(3), v.size(3)) << "the fixture must have dv != d";
  const int c = cp.size(), r = cp.rank();

  // The one-rank op against PyTorch.
  const Result causal = one_rank(q, k, v, dout, ops::AttentionMask::plain(true), scale);
  EXPECT_LE(rel_to_max(causal.out, f.at("out")), kTol) << "one rank: out";
  EXPECT_LE(rel_to_max(causal.lse, f.at("lse")), kTol) << "one rank: lse";
  EXPECT_LE(rel_to_max(causal.dq, f.at("dq")), kTol) << "one rank: dq";
  EXPECT_LE(rel_to_max(causal.dk, f.at("dk")), kTol) << "one rank: dk";
  EXPECT_LE(rel_to_max(causal.dv, f.at("dv")), kTol) << "one rank: dv";

  ops::AttentionMask window_docs = ops::AttentionMask::plain(true);
  window_docs.window = 9;
  window_docs.doc_start = doc_starts(q.size(1), q.size(0));
  const Result masked = one_rank(q, k, v, dout, window_docs, scale);

  struct Case {
    const char* name;
    ops::AttentionMask mask;
    const Result* want;
  };
  const Case cases[] = {{"causal (PyTorch)", ops::AttentionMask::plain(true), nullptr},
                        {"window + documents (one rank)", window_docs, &masked}};
  for (ContextComm comm : {ContextComm::P2P, ContextComm::A2A, ContextComm::AllGather}) {
    const char* comm_name = comm == ContextComm::P2P ? "p2p" : comm == ContextComm::A2A ? "a2a" : "allgather";
    if (comm == ContextComm::A2A && k.size(2) % c != 0) continue;  // a2a splits the kv heads
    for (const Case& cs : cases) {
      SCOPED_TRACE(std::string(comm_name) + ", " + cs.name);
      cp::Attention attention(&cp, comm, scale);
      cp::Attention::Saved saved;
      const Tensor out = attention.forward(zigzag_chunks(q, 0, r, c), zigzag_chunks(k, 0, r, c),
                                           zigzag_chunks(v, 0, r, c), saved, cs.mask);
      const Tensor want_out = cs.want ? cs.want->out : f.at("out");
      EXPECT_LE(rel_to_max(out, zigzag_chunks(want_out, 0, r, c)), kTol) << "out";
      if (comm != ContextComm::A2A) {  // a2a keeps the head-sharded whole sequence's lse
        const Tensor want_lse = cs.want ? cs.want->lse : f.at("lse");
        EXPECT_LE(rel_to_max(saved.lse, zigzag_chunks(want_lse, 2, r, c)), kTol) << "lse";
      }
      Tensor dq = Tensor::empty(zigzag_chunks(q, 0, r, c).shape(), DType::F32),
             dk = Tensor::empty(zigzag_chunks(k, 0, r, c).shape(), DType::F32),
             dv = Tensor::empty(zigzag_chunks(v, 0, r, c).shape(), DType::F32);
      attention.backward(zigzag_chunks(dout, 0, r, c), saved, dq, dk, dv);
      EXPECT_LE(rel_to_max(dq, zigzag_chunks(cs.want ? cs.want->dq : f.at("dq"), 0, r, c)), kTol) << "dq";
      EXPECT_LE(rel_to_max(dk, zigzag_chunks(cs.want ? cs.want->dk : f.at("dk"), 0, r, c)), kTol) << "dk";
      EXPECT_LE(rel_to_max(dv, zigzag_chunks(cs.want ? cs.want->dv : f.at("dv"), 0, r, c)), kTol) << "dv";
    }
  }
}

}  // namespace
}  // namespace parallel
