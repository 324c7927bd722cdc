// Packed documents (data.reset_position_ids + data.reset_attention_mask; docs/data.md): a sequence
// A|B|C of three documents, each ending with its end-of-document token, run packed with reset
// positions and document masks, gives for each document the loss and every parameter gradient of
// that document run alone on a real one-rank communicator in-process. Each document is selected in
// the packed run by a loss mask that is 1 on its tokens (so both the per-document loss and its
// gradients are compared, not only their sums). Layouts over the world of 2 ranks: context
// parallelism (cp = 2) for each exchange (p2p ring, a2a, allgather) and tensor parallelism with
// sequence parallelism (tp = 2); a sliding window also composes with cp. Rotary and learned positions.
//
// fp32; relative error max|a - b| / max|b| <= 1e-5 for gradients, 1e-6 for the loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <vector>

#include "mpi_test.hpp"
#include "parallel/context_parallel.hpp"
#include "parallel/gpt_dataset.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/tensor_parallel.hpp"
#include "parity.hpp"

namespace parallel {
namespace {

using testing::world;
constexpr double kGradTol = 1e-5;
constexpr double kLossTol = 1e-6;
constexpr int32_t kEod = 299;
// Document lengths (each ends with kEod); the sequence is their concatenation.
const std::vector<int64_t> kDocs = {12, 8, 12};
constexpr int64_t kSeq = 32;

struct Layout {
  const char* label;
  bool cp;  // else tp = 2 with sequence parallelism
  ContextComm comm = ContextComm::P2P;
};

ModelConfig make_config(bool rope, int64_t window) {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.vocab_size = 300;
  c.seq_length = static_cast<int>(kSeq);
  c.init_std = 0.1;
  c.sliding_window = static_cast<int>(window);
  if (rope) {
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

// kSeq + 1 tokens: the packed documents and one more token (the last target).
std::vector<int32_t> packed_tokens() {
  std::vector<int32_t> t;
  for (std::size_t d = 0; d < kDocs.size(); ++d)
    for (int64_t i = 0; i < kDocs[d]; ++i)
      t.push_back(i + 1 == kDocs[d] ? kEod : static_cast<int32_t>((t.size() * 37 + 11 * d + 5) % 290));
  t.push_back(17);
  return t;
}

int64_t doc_begin(std::size_t d) {
  int64_t b = 0;
  for (std::size_t i = 0; i < d; ++i) b += kDocs[i];
  return b;
}

struct Result {
  float loss = 0;
  std::map<std::string, Tensor> grads;
};

Result collect(GPTModel& model, float loss) {
  Result r;
  r.loss = loss;
  for (Parameter* p : model.parameters()) {
    r.grads[p->name] = p->grad.clone();
    p->grad.zero_();
  }
  return r;
}

// Document d alone: its tokens and their targets (the target of its eod is the packed sequence's
// next token, as in the packed run), one-rank model.
Result alone(GPTModel& ref, std::size_t d) {
  const std::vector<int32_t> all = packed_tokens();
  const int64_t b0 = doc_begin(d), n = kDocs[d];
  std::vector<int32_t> tokens(all.begin() + b0, all.begin() + b0 + n),
      targets(all.begin() + b0 + 1, all.begin() + b0 + n + 1);
  auto act = ref.new_activations();
  const Tensor loss =
      ref.forward(Tensor::from_vector(tokens, {1, n}), Tensor::from_vector(targets, {1, n}), *act);
  ref.backward(Tensor::full({1}, 1.0, DType::F32), *act);
  return collect(ref, loss.to_float_vector()[0]);
}

// The packed sequence on this rank's layout, the loss masked to document d.
Result packed(GPTModel& model, std::size_t d, int cp_rank, int cp_size) {
  const std::vector<int32_t> all = packed_tokens();
  MicroBatch mb{Tensor::from_vector(std::vector<int32_t>(all.begin(), all.end() - 1), {1, kSeq}),
                Tensor::from_vector(std::vector<int32_t>(all.begin() + 1, all.end()), {1, kSeq})};
  GPTDatasetOptions o;
  o.eod = kEod;
  o.reset_position_ids = o.reset_attention_mask = true;
  document_masks(o, mb);
  std::vector<float> mask(static_cast<std::size_t>(kSeq), 0.0f);
  for (int64_t i = doc_begin(d); i < doc_begin(d) + kDocs[d]; ++i) mask[static_cast<std::size_t>(i)] = 1.0f;
  PackedSequence packed;
  packed.positions = cp::slice_sequence(mb.positions, cp_rank, cp_size);
  packed.doc_start = mb.doc_start;
  packed.loss_mask = cp::slice_sequence(Tensor::from_vector(mask, {1, kSeq}), cp_rank, cp_size);
  auto act = model.new_activations();
  const Tensor loss = model.forward(cp::slice_sequence(mb.tokens, cp_rank, cp_size),
                                    cp::slice_sequence(mb.targets, cp_rank, cp_size), *act, 0, packed);
  model.backward(Tensor::full({1}, 1.0, DType::F32), *act);
  return collect(model, loss.to_float_vector()[0]);
}

void run(const Layout& layout, bool rope, int64_t window) {
  Communicator& w = world();
  if (w.size() != 2) GTEST_SKIP() << "2 ranks";
  auto solo = w.split(w.rank(), 0);
  const ModelConfig c = make_config(rope, window);
  const ChunkSpec whole{0, c.num_layers, true, true};
  GPTModel ref(c, whole, {.seed = 7}, *solo);
  std::unique_ptr<GPTModel> mine =
      layout.cp
          ? std::make_unique<GPTModel>(
                c, whole, GPTModel::Options{.seed = 7, .cp = &w, .context_comm = layout.comm}, *solo)
          : std::make_unique<GPTModel>(c, whole, GPTModel::Options{.sequence_parallel = true, .seed = 7}, w);
  for (std::size_t d = 0; d < kDocs.size(); ++d) {
    const Result want = alone(ref, d);
    Result got = packed(*mine, d, layout.cp ? w.rank() : 0, layout.cp ? w.size() : 1);
    if (layout.cp) {  // the cp ranks hold parts of the sequence: their losses and gradients add
      Tensor l = Tensor::full({1}, got.loss, DType::F32);
      w.all_reduce(l);
      got.loss = l.to_float_vector()[0];
      for (auto& [name, g] : got.grads) w.all_reduce(g);
    } else {
      for (Parameter* p : mine->parameters()) p->grad.copy_(got.grads[p->name]);
      tp::reduce_sequence_parallel_grads(mine->parameters(), w);
      for (Parameter* p : mine->parameters()) got.grads[p->name] = p->grad.clone();
    }
    EXPECT_LE(std::fabs(got.loss - want.loss) / std::fabs(want.loss), kLossTol)
        << "document " << d << ": loss " << got.loss << " vs " << want.loss;
    std::map<std::string, Parameter*> ref_params;
    for (Parameter* p : ref.parameters()) ref_params[p->name] = p;
    for (Parameter* p : mine->parameters()) {
      ASSERT_TRUE(ref_params.count(p->name)) << p->name;
      Parameter* r = ref_params[p->name];
      p->grad.copy_(got.grads[p->name]);
      r->grad.copy_(want.grads.at(p->name));
      const bool inert = !rope && p->name.ends_with("attention.key.bias");
      testing::expect_grad_matches(*p, *r, c.vocab_size, inert,
                                   fmt::format("document {}: {} (rank {})", d, p->name, w.rank()), kGradTol);
      p->grad.zero_();
      r->grad.zero_();
    }
  }
}

struct Case {
  Layout layout;
  bool rope;
  int64_t window;
};
std::string case_str(const Case& c) {
  return fmt::format("{}_{}{}", c.layout.label, c.rope ? "Rope" : "Learned",
                     c.window > 0 ? fmt::format("_Window{}", c.window) : "");
}
std::string case_name(const ::testing::TestParamInfo<Case>& info) { return case_str(info.param); }
void PrintTo(const Case& c, std::ostream* os) { *os << case_str(c); }

class PackedDocuments : public ::testing::TestWithParam<Case> {};

TEST_P(PackedDocuments, EachDocumentAsIfAlone) { run(GetParam().layout, GetParam().rope, GetParam().window); }

const Layout kP2P{"Cp2P2p", true, ContextComm::P2P};
const Layout kA2A{"Cp2A2a", true, ContextComm::A2A};
const Layout kAllGather{"Cp2AllGather", true, ContextComm::AllGather};
const Layout kTpSp{"Tp2Sp", false};

INSTANTIATE_TEST_SUITE_P(Layouts, PackedDocuments,
                         ::testing::Values(Case{kP2P, true, 0}, Case{kA2A, true, 0},
                                           Case{kAllGather, true, 0}, Case{kTpSp, true, 0},
                                           Case{kP2P, false, 0}, Case{kTpSp, false, 0},
                                           // A window shorter than the documents, under cp.
                                           Case{kP2P, true, 5}, Case{kA2A, true, 5}),
                         case_name);

// ---- The balanced layout (parallel.context_layout: balanced) ----------------------------------
// One long document among short ones, 256 tokens: on the zigzag one cp rank's attention work is far
// above the mean; the balanced layout (granules of at least 8 tokens here) brings every rank within
// 5 % of it, and the packed run on that layout gives one rank's loss and every gradient of the
// whole packed sequence (relative 1e-6 and 1e-5), for each exchange, with rope or learned positions
// at reset or global positions, a window, dropout (keyed by global position), and on 4 ranks at
// cp 4 (p2p) and at tp 2 with sequence parallelism x cp 2.
constexpr int64_t kMixSeq = 256;
const std::vector<int64_t> kMixDocs = {9, 5, 13, 3, 7, 150, 4, 11, 6, 2, 8, 10, 12, 16};

struct MixCase {
  const char* label;
  int tp, cp;
  ContextComm comm;
  bool rope, reset_positions;
  int64_t window;
  double dropout;
};

MicroBatch mix_batch(bool reset_positions) {
  std::vector<int32_t> t;
  for (std::size_t d = 0; d < kMixDocs.size(); ++d)
    for (int64_t i = 0; i < kMixDocs[d]; ++i)
      t.push_back(i + 1 == kMixDocs[d] ? kEod : static_cast<int32_t>((t.size() * 53 + 7 * d + 3) % 290));
  t.push_back(23);
  MicroBatch mb{Tensor::from_vector(std::vector<int32_t>(t.begin(), t.end() - 1), {1, kMixSeq}),
                Tensor::from_vector(std::vector<int32_t>(t.begin() + 1, t.end()), {1, kMixSeq})};
  GPTDatasetOptions o;
  o.eod = kEod;
  o.reset_position_ids = reset_positions;
  o.reset_attention_mask = true;
  document_masks(o, mb);
  return mb;
}

Result mix_step(GPTModel& model, const MicroBatch& mb, bool reset_positions,
                const std::shared_ptr<const cp::Layout>& layout, int cp_rank) {
  const auto slice = [&](const Tensor& t) { return layout ? layout->slice(t, cp_rank) : t; };
  PackedSequence packed;
  if (reset_positions) packed.positions = slice(mb.positions);
  packed.doc_start = mb.doc_start;
  packed.layout = layout;
  auto act = model.new_activations();
  const Tensor loss = model.forward(slice(mb.tokens), slice(mb.targets), *act, 5, packed);
  model.backward(Tensor::full({1}, 1.0, DType::F32), *act);
  return collect(model, loss.to_float_vector()[0]);
}

class BalancedLayout : public ::testing::TestWithParam<MixCase> {};

TEST_P(BalancedLayout, BalancedAndEqualToOneRank) {
  const MixCase& p = GetParam();
  Communicator& w = world();
  if (w.size() != p.tp * p.cp) GTEST_SKIP() << p.tp * p.cp << " ranks";
  auto solo = w.split(w.rank(), 0);
  // tp groups of consecutive ranks, cp groups across them.
  auto tp = w.split(w.rank() / p.tp, w.rank());
  auto cpg = w.split(w.rank() % p.tp, w.rank());
  ModelConfig c = make_config(p.rope, p.window);
  c.seq_length = static_cast<int>(kMixSeq);
  c.dropout = p.dropout;
  const std::vector<cp::LayerMix> mix = cp::layer_mix(c);
  const MicroBatch mb = mix_batch(p.reset_positions);

  // The load: the zigzag's worst rank far above the mean, the balanced layout's within 5 %.
  const auto ratio = [&](const cp::Layout& l) {
    const std::vector<double> load = cp::rank_load(l, mb.doc_start, mix);
    double sum = 0, top = 0;
    for (double x : load) sum += x, top = std::max(top, x);
    return top / (sum / static_cast<double>(load.size()));
  };
  auto layout = std::make_shared<const cp::Layout>(cp::balanced_layout(mb.doc_start, kMixSeq, p.cp, mix, 8));
  ASSERT_FALSE(layout->is_zigzag());
  const double zigzag = ratio(cp::Layout::zigzag(kMixSeq, p.cp)), balanced = ratio(*layout);
  EXPECT_GT(zigzag, 1.3) << "the mix must unbalance the zigzag for the test to mean anything";
  EXPECT_LE(balanced, 1.05) << "zigzag " << zigzag;
  if (w.rank() == 0)
    std::printf("%s: max / mean load zigzag %.3f, balanced %.3f (granule %lld)\n", p.label, zigzag, balanced,
                static_cast<long long>(layout->granule()));

  const ChunkSpec whole{0, c.num_layers, true, true};
  GPTModel ref(c, whole, {.seed = 7}, *solo);
  GPTModel mine(
      c, whole,
      GPTModel::Options{.sequence_parallel = p.tp > 1, .seed = 7, .cp = cpg.get(), .context_comm = p.comm},
      *tp);
  const Result want = mix_step(ref, mb, p.reset_positions, nullptr, 0);
  Result got = mix_step(mine, mb, p.reset_positions, layout, cpg->rank());
  Tensor l = Tensor::full({1}, got.loss, DType::F32);
  cpg->all_reduce(l);
  got.loss = l.to_float_vector()[0];
  for (Parameter* q : mine.parameters()) {
    Tensor& g = got.grads[q->name];
    cpg->all_reduce(g);
    q->grad.copy_(g);
  }
  if (p.tp > 1) tp::reduce_sequence_parallel_grads(mine.parameters(), *tp);
  EXPECT_LE(std::fabs(got.loss - want.loss) / std::fabs(want.loss), kLossTol)
      << "loss " << got.loss << " vs " << want.loss;
  std::map<std::string, Parameter*> ref_params;
  for (Parameter* q : ref.parameters()) ref_params[q->name] = q;
  for (Parameter* q : mine.parameters()) {
    ASSERT_TRUE(ref_params.count(q->name)) << q->name;
    Parameter* r = ref_params[q->name];
    r->grad.copy_(want.grads.at(q->name));
    const bool inert = !p.rope && q->name.ends_with("attention.key.bias");
    testing::expect_grad_matches(*q, *r, c.vocab_size, inert, fmt::format("{} (rank {})", q->name, w.rank()),
                                 kGradTol);
  }
}

std::string mix_name(const ::testing::TestParamInfo<MixCase>& info) { return info.param.label; }
void PrintTo(const MixCase& c, std::ostream* os) { *os << c.label; }

INSTANTIATE_TEST_SUITE_P(
    Mix, BalancedLayout,
    ::testing::Values(
        MixCase{"Cp2P2pRope", 1, 2, ContextComm::P2P, true, true, 0, 0.0},
        MixCase{"Cp2A2aRope", 1, 2, ContextComm::A2A, true, true, 0, 0.0},
        MixCase{"Cp2AllGatherRope", 1, 2, ContextComm::AllGather, true, true, 0, 0.0},
        MixCase{"Cp2P2pLearnedGlobalPositionsDropout", 1, 2, ContextComm::P2P, false, false, 0, 0.1},
        MixCase{"Cp2AllGatherRopeGlobalPositionsWindow", 1, 2, ContextComm::AllGather, true, false, 24, 0.0},
        MixCase{"Cp2A2aLearnedDropout", 1, 2, ContextComm::A2A, false, true, 0, 0.1},
        MixCase{"Cp4P2pRope", 1, 4, ContextComm::P2P, true, true, 0, 0.0},
        MixCase{"Tp2SpCp2P2pRopeDropout", 2, 2, ContextComm::P2P, true, false, 0, 0.1}),
    mix_name);

}  // namespace
}  // namespace parallel
