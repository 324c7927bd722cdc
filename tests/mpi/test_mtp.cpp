// Multi-token prediction (docs/model.md, "Multi-token prediction") against its float64 PyTorch
// reference (tests/reference/make_mtp_fixture.py): a whole 2-layer GPT with D MTP depths, untied
// with two depths (RMSNorm, SwiGLU, GQA) and tied with one (LayerNorm, GELU, biases). One rank, fp32:
// the main loss and each depth's loss within 1e-5 relative, every gradient of the objective
// (loss + factor / D * sum of the depths' losses) within 1e-5 of its largest element (measured
// 2026-11-27: losses <= 1.2e-7, gradients <= 3.1e-6). The split backward (B then W) gives the fused
// backward's gradients bit for bit. PARALLEL_PARITY_VERBOSE=1 prints every comparison.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "compare.hpp"
#include "mpi_test.hpp"
#include "parallel/config.hpp"
#include "parallel/gpt_model.hpp"
#include "parity.hpp"
#include "pytorch_fixture.hpp"

namespace parallel {
namespace {

using testing::Fixture;
using testing::get;
using testing::is_vocab_param;

double scalar(const Fixture& f, const std::string& name) { return get(f, name).to_float_vector().at(0); }

// The GPT of the fixture's metadata with its multi-token prediction depths.
ModelConfig config_of(const std::string& name) {
  const testing::FixtureMetadata meta = testing::fixture_metadata(name);
  ModelConfig c = testing::gpt_config_of(meta);
  c.mtp_num_layers = std::stoi(testing::metadata_at(meta, "mtp_num_layers"));
  c.mtp_loss_scaling_factor = std::stod(testing::metadata_at(meta, "mtp_loss_scaling_factor"));
  return c;
}

struct MtpModel {
  Fixture f;
  ModelConfig cfg;
  std::unique_ptr<GPTModel> model;
};

// The model of `name` with the fixture's weights (padded vocabulary rows keep their init).
MtpModel build(const std::string& name) {
  MtpModel s;
  s.f = testing::load_fixture(name);
  s.cfg = config_of(name);
  Communicator& w = testing::world();
  EXPECT_EQ(w.size(), 1);
  s.model =
      std::make_unique<GPTModel>(s.cfg, ChunkSpec{0, s.cfg.num_layers, true, true}, GPTModel::Options{}, w);
  std::set<std::string> fixture_params, model_params;
  for (const auto& [n, t] : s.f)
    if (n.starts_with("grad.")) fixture_params.insert(n.substr(5));
  for (Parameter* p : s.model->parameters()) {
    model_params.insert(p->name);
    const Tensor& v = get(s.f, p->name);
    if (is_vocab_param(p->name))
      p->value.narrow(0, 0, s.cfg.vocab_size).copy_(v);
    else
      p->value.copy_(v);
    p->grad.zero_();
  }
  EXPECT_EQ(model_params, fixture_params) << "parameter names differ from docs/model.md's";
  return s;
}

Tensor seed_of(const MtpModel& s) {
  const double n = static_cast<double>(get(s.f, "tokens").numel());
  return Tensor::full({1}, 1.0 / n, DType::F32);
}

void check_fixture(const std::string& name) {
  SCOPED_TRACE(name);
  MtpModel s = build(name);
  const Tensor &tokens = get(s.f, "tokens"), &targets = get(s.f, "targets");
  const int64_t b = tokens.size(0), S = tokens.size(1);
  auto act = s.model->new_activations();
  const double loss =
      s.model->forward(tokens, targets, *act).to_float_vector()[0] / static_cast<double>(b * S);
  const auto rel = [](double a, double e) { return std::abs(a - e) / std::abs(e); };
  const bool verbose = std::getenv("PARALLEL_PARITY_VERBOSE") != nullptr;
  EXPECT_LE(rel(loss, scalar(s.f, "loss")), 1e-5) << "main loss " << loss << " vs " << scalar(s.f, "loss");
  const std::vector<float> sums = s.model->mtp_loss_sums().to_float_vector();
  ASSERT_EQ(static_cast<int>(sums.size()), s.cfg.mtp_num_layers);
  for (int k = 1; k <= s.cfg.mtp_num_layers; ++k) {
    const double mine = sums[static_cast<std::size_t>(k - 1)] / static_cast<double>(b * (S - k));
    const double ref = scalar(s.f, "mtp_loss_" + std::to_string(k));
    if (verbose) std::printf("  mtp_loss_%d %.8f vs %.8f: rel %.3g\n", k, mine, ref, rel(mine, ref));
    EXPECT_LE(rel(mine, ref), 1e-5) << "depth " << k << ": " << mine << " vs " << ref;
  }
  s.model->backward(seed_of(s), *act);
  double worst = 0.0;
  for (Parameter* p : s.model->parameters()) {
    const Tensor& g = get(s.f, "grad." + p->name);
    const Tensor mine =
        is_vocab_param(p->name) ? p->grad.narrow(0, 0, s.cfg.vocab_size).contiguous() : p->grad.contiguous();
    const double err = testing::rel_err(mine, g, 1e-6);
    worst = std::max(worst, err);
    if (verbose) std::printf("  grad.%-40s rel error %.3g\n", p->name.c_str(), err);
    EXPECT_LE(err, 1e-5) << "grad." << p->name;
  }
  std::printf("%s: worst gradient error %.3g\n", name.c_str(), worst);
}

TEST(MtpParity, UntiedTwoDepths) { check_fixture("mtp_untied_d2"); }
TEST(MtpParity, TiedOneDepth) { check_fixture("mtp_tied_d1"); }

// backward_input then backward_weight accumulates exactly what backward() does, with the MTP
// layers' embedding and output-head contributions in the same order.
TEST(MtpParity, SplitBackwardIsFused) {
  for (const char* name : {"mtp_untied_d2", "mtp_tied_d1"}) {
    SCOPED_TRACE(name);
    MtpModel fused = build(name), split = build(name);
    const Tensor &tokens = get(fused.f, "tokens"), &targets = get(fused.f, "targets");
    auto a = fused.model->new_activations();
    fused.model->forward(tokens, targets, *a);
    fused.model->backward(seed_of(fused), *a);
    auto b = split.model->new_activations();
    split.model->forward(tokens, targets, *b);
    split.model->backward_input(seed_of(split), *b);
    split.model->backward_weight(*b);
    const std::vector<Parameter*> pf = fused.model->parameters(), ps = split.model->parameters();
    ASSERT_EQ(pf.size(), ps.size());
    for (std::size_t i = 0; i < pf.size(); ++i)
      EXPECT_EQ(pf[i]->grad.to_float_vector(), ps[i]->grad.to_float_vector()) << pf[i]->name;
  }
}

// Evaluation forwards report the main loss and leave the MTP sums alone.
TEST(MtpParity, EvaluationSkipsMtp) {
  MtpModel s = build("mtp_untied_d2");
  s.model->set_training(false);
  auto act = s.model->new_activations();
  s.model->forward(get(s.f, "tokens"), get(s.f, "targets"), *act);
  EXPECT_FALSE(s.model->mtp_loss_sums().defined());
}

}  // namespace
}  // namespace parallel
