// Parity with PyTorch: every op of parallel::ops, the tensor-parallel layers (tp size 1) and the
// whole GPT model (config A: GPT-2 style; config B: GQA, SwiGLU, RMSNorm, RoPE, untied) against the
// float64 PyTorch reference in tests/reference/fixtures/ (written by tests/reference/make_fixtures.py;
// tensor names and shapes are documented there).
//
// Error measure: max |actual - expected| / max(max |expected|, floor), i.e. the worst element's
// error relative to the tensor's scale. The fixtures' inputs are exactly representable in fp32 and
// their outputs are float64 results rounded once, so this measures our fp32 arithmetic alone.
// Tolerances (fp32 unit roundoff is 6e-8):
//   gemm / linear (K = 32 or 12)   2e-6  (a K-term fp32 dot product: ~sqrt(K) ulp)
//   layernorm, rmsnorm             1e-5  (reductions over h = 32, then a rescale)
//   gelu, swiglu                   1e-5  (tanh / sigmoid: a few ulp each)
//   rope                           1e-5  (angles in double, rotation in fp32)
//   attention                      1e-5  (online softmax over up to 70 keys, 2 tiles)
//   embedding                      1e-6  (copies; the backward sums <= 3 rows)
//   cross entropy                  1e-5  (log-sum-exp over 20 logits)
//   whole GPT                      loss 1e-5; gradients 5e-5 (two layers of the above, forward
//                                   and backward, each step adding its fp32 error;
//                                   measured: <= 4e-6)
//   whole GPT in bf16 against PyTorch's bf16 autocast (gpt_a_bf16): loss 1e-2, gradients 0.15
//                                  each and 0.06 on average (see ConfigA_Bf16MatchesTorchAutocast)
// PARALLEL_PARITY_VERBOSE=1 prints every comparison's error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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
#include "parallel/ops.hpp"
#include "parallel/tensor_parallel.hpp"
#include "parity.hpp"
#include "pytorch_fixture.hpp"

namespace parallel {
namespace {

using testing::Fixture;
using testing::get;
using testing::is_vocab_param;
using testing::load_fixture;

float scalar(const Fixture& f, const std::string& name) { return get(f, name).to_float_vector().at(0); }

Tensor zeros_like(const Tensor& t) { return Tensor::zeros(t.shape(), DType::F32); }

::testing::AssertionResult close(const std::string& what, const Tensor& actual, const Tensor& expected,
                                 double tol, double floor = 1e-6) {
  if (actual.numel() != expected.numel())
    return ::testing::AssertionFailure() << what << ": " << actual.str() << " vs expected " << expected.str();
  const double err = testing::rel_err(actual, expected, floor);
  static const bool verbose = std::getenv("PARALLEL_PARITY_VERBOSE") != nullptr;
  if (verbose) std::printf("  %-45s rel error %.3g (tolerance %.0e)\n", what.c_str(), err, tol);
  if (!(err <= tol))
    return ::testing::AssertionFailure() << what << ": relative error " << err << " > " << tol;
  return ::testing::AssertionSuccess();
}

Communicator& tp1() {
  Communicator& w = testing::world();
  EXPECT_EQ(w.size(), 1) << "the parity tests run on one rank";
  return w;
}

// ---- ops ---------------------------------------------------------------------------------------

TEST(OpsParity, GemmLinear) {
  const Fixture f = load_fixture("linear");
  const Tensor x = get(f, "x").view({-1, 32}), W = get(f, "W"), b = get(f, "b");
  const Tensor dy = get(f, "dy").view({-1, 48});
  Tensor y = Tensor::empty({x.size(0), 48}, DType::F32);
  ops::gemm(x, false, W, true, y);
  ops::add_bias(y, b);
  EXPECT_TRUE(close("y", y, get(f, "y"), 2e-6));
  Tensor dx = Tensor::empty(x.shape(), DType::F32);
  ops::gemm(dy, false, W, false, dx);
  EXPECT_TRUE(close("dx", dx, get(f, "dx"), 2e-6));
  Tensor dW = zeros_like(W), db = zeros_like(b);
  ops::gemm(dy, true, x, false, dW, 1.0f, 1.0f);
  ops::bias_backward(dy, db);
  EXPECT_TRUE(close("dW", dW, get(f, "dW"), 2e-6));
  EXPECT_TRUE(close("db", db, get(f, "db"), 2e-6));
  // Parameter gradients accumulate.
  ops::gemm(dy, true, x, false, dW, 1.0f, 1.0f);
  ops::bias_backward(dy, db);
  ops::scale_(dW, 0.5f);
  ops::scale_(db, 0.5f);
  EXPECT_TRUE(close("dW accumulated twice / 2", dW, get(f, "dW"), 2e-6));
  EXPECT_TRUE(close("db accumulated twice / 2", db, get(f, "db"), 2e-6));
  // (y - b)^T = W x^T: the other operand order.
  Tensor yt = Tensor::empty({48, x.size(0)}, DType::F32);
  ops::gemm(W, false, x, true, yt);
  Tensor expect_yt = Tensor::empty({48, x.size(0)}, DType::F32);
  {
    // expected (y - b)^T from the fixture, transposed on the host.
    const std::vector<float> yv = get(f, "y").to_float_vector(), bv = b.to_float_vector();
    float* p = expect_yt.data<float>();
    for (int64_t r = 0; r < x.size(0); ++r)
      for (int64_t c = 0; c < 48; ++c) p[c * x.size(0) + r] = yv[r * 48 + c] - bv[c];
  }
  EXPECT_TRUE(close("W x^T", yt, expect_yt, 2e-6, 1.0));
}

TEST(OpsParity, LayerNorm) {
  const Fixture f = load_fixture("layernorm");
  const Tensor x = get(f, "x").view({-1, 32}), w = get(f, "w"), b = get(f, "b"),
               dy = get(f, "dy").view({-1, 32});
  const int64_t rows = x.size(0);
  Tensor y = Tensor::empty(x.shape(), DType::F32), mean = Tensor::empty({rows}, DType::F32),
         rstd = Tensor::empty({rows}, DType::F32);
  ops::layernorm_forward(x, w, b, y, mean, rstd, scalar(f, "eps"));
  EXPECT_TRUE(close("y", y, get(f, "y"), 1e-5));
  Tensor dx = Tensor::empty(x.shape(), DType::F32), dw = zeros_like(w), db = zeros_like(b);
  ops::layernorm_backward(dy, x, w, mean, rstd, dx, dw, db);
  EXPECT_TRUE(close("dx", dx, get(f, "dx"), 1e-5));
  EXPECT_TRUE(close("dw", dw, get(f, "dw"), 1e-5));
  EXPECT_TRUE(close("db", db, get(f, "db"), 1e-5));
}

TEST(OpsParity, RmsNorm) {
  const Fixture f = load_fixture("rmsnorm");
  const Tensor x = get(f, "x").view({-1, 32}), w = get(f, "w"), dy = get(f, "dy").view({-1, 32});
  Tensor y = Tensor::empty(x.shape(), DType::F32), rstd = Tensor::empty({x.size(0)}, DType::F32);
  ops::rmsnorm_forward(x, w, y, rstd, scalar(f, "eps"));
  EXPECT_TRUE(close("y", y, get(f, "y"), 1e-5));
  Tensor dx = Tensor::empty(x.shape(), DType::F32), dw = zeros_like(w);
  ops::rmsnorm_backward(dy, x, w, rstd, dx, dw);
  EXPECT_TRUE(close("dx", dx, get(f, "dx"), 1e-5));
  EXPECT_TRUE(close("dw", dw, get(f, "dw"), 1e-5));
}

TEST(OpsParity, Gelu) {
  const Fixture f = load_fixture("gelu");
  const Tensor& x = get(f, "x");
  Tensor y = zeros_like(x), dx = zeros_like(x);
  ops::gelu_forward(x, y);
  ops::gelu_backward(get(f, "dy"), x, dx);
  EXPECT_TRUE(close("y", y, get(f, "y"), 1e-5));
  EXPECT_TRUE(close("dx", dx, get(f, "dx"), 1e-5));
}

TEST(OpsParity, SwiGlu) {
  const Fixture f = load_fixture("swiglu");
  const Tensor& x = get(f, "x");
  Tensor y = zeros_like(get(f, "y")), dx = zeros_like(x);
  ops::swiglu_forward(x, y);
  ops::swiglu_backward(get(f, "dy"), x, dx);
  EXPECT_TRUE(close("y", y, get(f, "y"), 1e-5));
  EXPECT_TRUE(close("dx", dx, get(f, "dx"), 1e-5));
}

TEST(OpsParity, Rope) {
  const Fixture f = load_fixture("rope");
  const float theta = scalar(f, "theta");
  const int64_t offset = static_cast<int64_t>(scalar(f, "position_offset"));
  Tensor y = get(f, "x").clone(), dx = get(f, "dy").clone();
  ops::rope_forward(y, 0, theta);
  ops::rope_backward(dx, 0, theta);
  EXPECT_TRUE(close("y", y, get(f, "y"), 1e-5));
  EXPECT_TRUE(close("dx", dx, get(f, "dx"), 1e-5));
  Tensor y_off = get(f, "x").clone(), dx_off = get(f, "dy").clone();
  ops::rope_forward(y_off, offset, theta);
  ops::rope_backward(dx_off, offset, theta);
  EXPECT_TRUE(close("y at offset", y_off, get(f, "y_offset"), 1e-5));
  EXPECT_TRUE(close("dx at offset", dx_off, get(f, "dx_offset"), 1e-5));
}

void check_attention(const std::string& name, bool causal) {
  SCOPED_TRACE(name);
  const Fixture f = load_fixture(name);
  const Tensor &q = get(f, "q"), &k = get(f, "k"), &v = get(f, "v");
  const float scale = scalar(f, "softmax_scale");
  Tensor out = zeros_like(q), lse = zeros_like(get(f, "lse"));
  ops::attention_forward(q, k, v, out, lse, causal, scale);
  EXPECT_TRUE(close("out", out, get(f, "out"), 1e-5));
  EXPECT_TRUE(close("lse", lse, get(f, "lse"), 1e-5));
  Tensor dq = zeros_like(q), dk = zeros_like(k), dv = zeros_like(v);
  ops::attention_backward(get(f, "dout"), q, k, v, out, lse, dq, dk, dv, causal, scale);
  EXPECT_TRUE(close("dq", dq, get(f, "dq"), 1e-5));
  EXPECT_TRUE(close("dk", dk, get(f, "dk"), 1e-5));
  EXPECT_TRUE(close("dv", dv, get(f, "dv"), 1e-5));
}

TEST(OpsParity, AttentionCausalGqa) { check_attention("attention_gqa_causal", true); }
TEST(OpsParity, AttentionMha) { check_attention("attention_mha", false); }

TEST(OpsParity, Embedding) {
  const Fixture f = load_fixture("embedding");
  const Tensor &tokens = get(f, "tokens"), &weight = get(f, "weight");
  Tensor out = zeros_like(get(f, "out"));
  ops::embedding_forward(tokens, weight, 0, out);
  EXPECT_TRUE(close("out", out, get(f, "out"), 1e-6));
  Tensor dweight = zeros_like(weight);
  ops::embedding_backward(tokens, get(f, "dout"), 0, dweight);
  EXPECT_TRUE(close("dweight", dweight, get(f, "dweight"), 1e-6));

  // A vocab-parallel slice: rows [10, 20) at vocab_start 10; other ids give zero rows / no grad.
  const Tensor slice = weight.narrow(0, 10, 10).contiguous();
  Tensor part = zeros_like(out);
  ops::embedding_forward(tokens, slice, 10, part);
  Tensor dslice = Tensor::zeros({10, 8}, DType::F32);
  ops::embedding_backward(tokens, get(f, "dout"), 10, dslice);
  EXPECT_TRUE(close("dweight rows [10, 20)", dslice, get(f, "dweight").narrow(0, 10, 10).contiguous(), 1e-6));
  const std::vector<int32_t> ids(tokens.data<int32_t>(), tokens.data<int32_t>() + tokens.numel());
  const std::vector<float> got = part.to_float_vector(), ref = get(f, "out").to_float_vector();
  const int64_t b = tokens.size(0), s = tokens.size(1);
  for (int64_t i = 0; i < s; ++i)
    for (int64_t j = 0; j < b; ++j) {
      const bool owned = ids[j * s + i] >= 10;
      for (int64_t c = 0; c < 8; ++c) {
        const int64_t at = (i * b + j) * 8 + c;
        EXPECT_FLOAT_EQ(got[at], owned ? ref[at] : 0.0f) << "s " << i << " b " << j;
      }
    }
}

// The loss from the three local pieces, as vocab_parallel_cross_entropy assembles it.
Tensor ce_loss(const Tensor& logits, const Tensor& targets, int64_t vocab_size, Tensor& row_max,
               Tensor& sum_exp) {
  const int64_t n = logits.size(0);
  row_max = Tensor::empty({n}, DType::F32);
  sum_exp = Tensor::empty({n}, DType::F32);
  Tensor target_logit = Tensor::empty({n}, DType::F32);
  ops::cross_entropy_local_stats(logits, targets, 0, vocab_size, row_max, target_logit);
  ops::cross_entropy_sum_exp(logits, row_max, 0, vocab_size, sum_exp);
  Tensor loss = Tensor::empty({n}, DType::F32);
  for (int64_t i = 0; i < n; ++i)
    loss.data<float>()[i] =
        std::log(sum_exp.data<float>()[i]) + row_max.data<float>()[i] - target_logit.data<float>()[i];
  return loss;
}

TEST(OpsParity, CrossEntropy) {
  const Fixture f = load_fixture("cross_entropy");
  const Tensor &logits = get(f, "logits"), &targets = get(f, "targets");
  const int64_t n = logits.size(0), V = logits.size(1);
  Tensor grad_scale = Tensor::full({n}, 1.0 / static_cast<double>(n), DType::F32);
  {
    Tensor row_max, sum_exp;
    const Tensor loss = ce_loss(logits, targets, V, row_max, sum_exp);
    EXPECT_TRUE(close("loss", loss, get(f, "loss"), 1e-5));
    Tensor dlogits = zeros_like(logits);
    ops::cross_entropy_backward(logits, targets, row_max, sum_exp, grad_scale, 0, V, dlogits);
    EXPECT_TRUE(close("dlogits", dlogits, get(f, "dlogits"), 1e-5));
  }
  // Padded to 32 columns holding huge values: padding never enters the loss and gets zero grad.
  const int64_t Vp = 32;
  Tensor padded = Tensor::full({n, Vp}, 100.0, DType::F32);
  padded.narrow(1, 0, V).copy_(logits);
  Tensor row_max, sum_exp;
  const Tensor loss = ce_loss(padded, targets, V, row_max, sum_exp);
  EXPECT_TRUE(close("loss (padded vocabulary)", loss, get(f, "loss"), 1e-5));
  Tensor dlogits = Tensor::full({n, Vp}, 7.0, DType::F32);
  ops::cross_entropy_backward(padded, targets, row_max, sum_exp, grad_scale, 0, V, dlogits);
  EXPECT_TRUE(
      close("dlogits (padded vocabulary)", dlogits.narrow(1, 0, V).contiguous(), get(f, "dlogits"), 1e-5));
  for (float g : dlogits.narrow(1, V, Vp - V).to_float_vector()) EXPECT_EQ(g, 0.0f);
}

// ---- tensor-parallel layers at tp size 1 -------------------------------------------------------

TEST(TpParity, ColumnParallelLinear) {
  const Fixture f = load_fixture("linear");
  const Tensor &W = get(f, "W"), &b = get(f, "b");
  // One part, and the same weight as two parts (rows [0, 16) and [16, 48)): the fused output is
  // [part0 | part1], i.e. the same y.
  for (int parts : {1, 2}) {
    SCOPED_TRACE("parts " + std::to_string(parts));
    std::vector<tp::ColumnParallelLinear::Part> spec;
    if (parts == 1)
      spec = {{"lin", 48}};
    else
      spec = {{"lin_a", 16}, {"lin_b", 32}};
    tp::ColumnParallelLinear layer(spec, 32, {.bias = true}, tp1());
    ASSERT_EQ(layer.out_local(), 48);
    int64_t row = 0;
    for (std::size_t i = 0; i < layer.weights.size(); ++i) {
      const int64_t n = layer.weights[i].value.size(0);
      layer.weights[i].value.copy_(W.narrow(0, row, n));
      layer.biases[i].value.copy_(b.narrow(0, row, n));
      row += n;
    }
    tp::LinearContext ctx;
    const Tensor y = layer.forward(get(f, "x"), ctx);
    EXPECT_EQ(y.shape(), get(f, "y").shape());
    EXPECT_TRUE(close("y", y, get(f, "y"), 2e-6));
    const Tensor dx = layer.backward(get(f, "dy"), ctx);
    EXPECT_TRUE(close("dx", dx, get(f, "dx"), 2e-6));
    row = 0;
    for (std::size_t i = 0; i < layer.weights.size(); ++i) {
      const int64_t n = layer.weights[i].value.size(0);
      EXPECT_TRUE(close(layer.weights[i].name + " grad", layer.weights[i].grad.contiguous(),
                        get(f, "dW").narrow(0, row, n).contiguous(), 2e-6));
      EXPECT_TRUE(close(layer.biases[i].name + " grad", layer.biases[i].grad.contiguous(),
                        get(f, "db").narrow(0, row, n).contiguous(), 2e-6));
      row += n;
    }
  }
}

TEST(TpParity, RowParallelLinear) {
  const Fixture f = load_fixture("linear");
  tp::RowParallelLinear layer("lin", 32, 48, {.bias = true}, tp1());
  layer.weight.value.copy_(get(f, "W"));
  layer.bias.value.copy_(get(f, "b"));
  tp::LinearContext ctx;
  const Tensor y = layer.forward(get(f, "x"), ctx);
  EXPECT_EQ(y.shape(), get(f, "y").shape());
  EXPECT_TRUE(close("y", y, get(f, "y"), 2e-6));
  const Tensor dx = layer.backward(get(f, "dy"), ctx);
  EXPECT_TRUE(close("dx", dx, get(f, "dx"), 2e-6));
  EXPECT_TRUE(close("weight grad", layer.weight.grad, get(f, "dW"), 2e-6));
  EXPECT_TRUE(close("bias grad", layer.bias.grad, get(f, "db"), 2e-6));
}

TEST(TpParity, VocabParallelEmbedding) {
  const Fixture f = load_fixture("embedding");
  const Tensor& weight = get(f, "weight");
  tp::VocabParallelEmbedding layer("emb.weight", weight.size(0), weight.size(1), false, tp1());
  EXPECT_EQ(layer.vocab_start(), 0);
  layer.weight.value.copy_(weight);
  tp::VocabParallelEmbedding::Context ctx;
  const Tensor out = layer.forward(get(f, "tokens"), ctx);
  EXPECT_EQ(out.shape(), get(f, "out").shape());
  EXPECT_TRUE(close("out", out, get(f, "out"), 1e-6));
  layer.backward(get(f, "dout"), ctx);
  EXPECT_TRUE(close("weight grad", layer.weight.grad, get(f, "dweight"), 1e-6));
}

TEST(TpParity, VocabParallelCrossEntropy) {
  const Fixture f = load_fixture("cross_entropy");
  const Tensor &logits = get(f, "logits"), &targets = get(f, "targets");
  const int64_t n = logits.size(0);
  tp::CrossEntropyContext ctx;
  const Tensor loss = tp::vocab_parallel_cross_entropy(tp1(), logits, targets, 0, logits.size(1), ctx);
  EXPECT_TRUE(close("loss", loss, get(f, "loss"), 1e-5));
  const Tensor dlogits = tp::vocab_parallel_cross_entropy_backward(
      Tensor::full({n}, 1.0 / static_cast<double>(n), DType::F32), ctx);
  EXPECT_TRUE(close("dlogits", dlogits, get(f, "dlogits"), 1e-5));
}

// ---- the whole GPT -----------------------------------------------------------------------------

constexpr double kGptGradTol = 5e-5;  // see the file comment

// Tolerances of a whole-GPT comparison: fp32 against float64 (the file comment), or bf16 against
// PyTorch's bf16 autocast (below).
struct GptTolerance {
  Precision precision = Precision::FP32;
  double loss = 1e-5;
  double grad = kGptGradTol;       // every gradient
  double mean_grad = kGptGradTol;  // the mean of the gradients' errors
};

void check_gpt(const std::string& fixture_name, const GptTolerance& tol = {}) {
  SCOPED_TRACE(fixture_name);
  const Fixture f = load_fixture(fixture_name);
  const ModelConfig cfg = testing::gpt_config_of(testing::fixture_metadata(fixture_name));
  const int64_t V = cfg.vocab_size;
  GPTModel model(cfg, ChunkSpec{0, cfg.num_layers, true, true}, GPTModel::Options{.precision = tol.precision},
                 tp1());
  const int64_t Vp = model.vocab_padded();
  EXPECT_EQ(Vp, 128);

  // The model's parameters are exactly the fixture's, by global name.
  std::set<std::string> fixture_params, model_params;
  for (const auto& [name, t] : f)
    if (name.starts_with("grad.")) fixture_params.insert(name.substr(5));
  std::vector<Parameter*> params = model.parameters();
  for (Parameter* p : params) model_params.insert(p->name);
  EXPECT_EQ(model_params, fixture_params) << "parameter names differ from docs/model.md's";
  EXPECT_EQ(model_params.size(), params.size()) << "a parameter name appears twice";

  for (Parameter* p : params) {
    if (!f.count(p->name)) continue;
    const Tensor& w = get(f, p->name);
    if (is_vocab_param(p->name)) {
      ASSERT_EQ(p->value.shape(), (Shape{Vp, cfg.hidden_size})) << p->name;
      EXPECT_EQ(p->global_shape, (Shape{Vp, cfg.hidden_size})) << p->name;
      p->value.narrow(0, 0, V).copy_(w);  // the padded rows keep their init
    } else {
      ASSERT_EQ(p->value.shape(), w.shape()) << p->name;
      EXPECT_EQ(p->global_shape, w.shape()) << p->name;
      p->value.copy_(w);
    }
  }
  zero_grads(params);

  const Tensor &tokens = get(f, "tokens"), &targets = get(f, "targets");
  const int64_t n = tokens.numel();
  auto act = model.new_activations();
  const Tensor loss_sum = model.forward(tokens, targets, *act);
  ASSERT_EQ(loss_sum.numel(), 1);
  const Tensor loss_mean =
      Tensor::full({}, loss_sum.to_float_vector()[0] / static_cast<double>(n), DType::F32);
  EXPECT_TRUE(close("loss", loss_mean, get(f, "loss"), tol.loss));

  model.backward(Tensor::full({1}, 1.0 / static_cast<double>(n), DType::F32), *act);
  double err_sum = 0.0;
  int err_count = 0;
  auto check_grad = [&](const std::string& what, const Tensor& actual, const Tensor& expected, double floor) {
    EXPECT_TRUE(close(what, actual, expected, tol.grad, floor));
    err_sum += testing::rel_err(actual, expected, floor);
    ++err_count;
  };
  for (Parameter* p : params) {
    if (!f.count("grad." + p->name)) continue;
    const Tensor& g = get(f, "grad." + p->name);
    if (is_vocab_param(p->name)) {
      check_grad("grad." + p->name, p->grad.narrow(0, 0, V).contiguous(), g, 1e-6);
      const std::vector<float> pad = p->grad.narrow(0, V, Vp - V).to_float_vector();
      EXPECT_TRUE(std::all_of(pad.begin(), pad.end(), [](float x) { return x == 0.0f; }))
          << p->name << ": the padded vocabulary rows got a non-zero gradient";
    } else if (p->name.ends_with("attention.key.bias")) {
      // Its exact gradient is 0 (softmax ignores a shift of a query's scores by q·bk), so what we
      // compute is rounding noise: measure it against the scale of the key weight's gradient.
      const std::vector<float> gw =
          get(f, "grad." + p->name.substr(0, p->name.size() - 4) + "weight").to_float_vector();
      double scale = 0.0;
      for (float x : gw) scale = std::max(scale, std::fabs(static_cast<double>(x)));
      check_grad("grad." + p->name, p->grad.contiguous(), g, scale);
    } else {
      check_grad("grad." + p->name, p->grad.contiguous(), g, 1e-6);
    }
  }
  ASSERT_GT(err_count, 0);
  EXPECT_LE(err_sum / err_count, tol.mean_grad) << "mean gradient error over " << err_count << " parameters";
}

TEST(GptParity, ConfigA_Gpt2Style) { check_gpt("gpt_a"); }
TEST(GptParity, ConfigB_GqaSwigluRmsnormRope) { check_gpt("gpt_b"); }

// Model A in bf16 against PyTorch's bf16 autocast on the same bf16 weights (gpt_a_bf16, written by
// make_fixtures.py, which describes what autocast rounds). Both sides run the GEMMs on bf16 operands with
// fp32 accumulation, but they round in different places, each rounding 2^-9 relative: autocast keeps the
// residual stream, the norms and the residual adds in fp32 and hands bf16 probabilities to p·v; we keep
// every tensor between ops in bf16 (the residual stream, and in the backward every op's input gradient
// before the residual sums) and keep the probabilities fp32. Both add a linear's bias inside its GEMM
// (ops::gemm_bias: one rounding). We round more often, so our gradients are further from the float64 result
// than autocast's. A float64 emulation of exactly our rounding sites (run while writing this test, not
// committed) reproduced our figures to three digits before the bias moved into the GEMM (then worst 0.106,
// mean 0.0415 against float64; the emulation put the bias-in-GEMM variant at half that mean, 0.021), so the
// gap is the policy's, not a bug. Measured ours against autocast (2026-11-24, bias in the GEMM): gradients,
// max|error| / max|reference| per tensor, worst 0.065 (layers.0.attention.query.weight, the end of the
// longest backward chain through softmax), mean 0.023; before the fusion 0.115 / 0.039. Tolerances: the
// loss within 1e-2 relative, every gradient within 0.1 of its largest element, their mean within 0.04. A
// real error in the bf16 path (a dropped term, an unscaled, unreduced or wrongly rounded gradient) is O(1)
// on the worst or moves the mean well past 0.04.
TEST(GptParity, ConfigA_Bf16MatchesTorchAutocast) {
  check_gpt("gpt_a_bf16", {.precision = Precision::BF16, .loss = 1e-2, .grad = 0.1, .mean_grad = 0.04});
}

}  // namespace
}  // namespace parallel
