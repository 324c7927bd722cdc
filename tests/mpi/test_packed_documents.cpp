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

#include <cmath>
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
  ASSERT_EQ(w.size(), 2);
  auto solo = w.split(w.rank(), 0);
  const ModelConfig c = make_config(rope, window);
  const GPTChunkSpec whole{0, c.num_layers, true, true};
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

}  // namespace
}  // namespace parallel
