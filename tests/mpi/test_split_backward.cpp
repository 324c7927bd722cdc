// Split backward (zero-bubble schedules): every layer's backward_input then backward_weight must
// give bit for bit the input gradient and the parameter gradients of its fused backward(), under
// tensor parallelism (tp = the world: 1 or 2 ranks) with and without sequence parallelism. Also the
// whole GPTModel, with the weight steps of several micro-batches delayed past the others' input
// steps, and the grad-ready hook: it fires from the weight step only, once per parameter and
// micro-batch, after the parameter's gradient is final. (The norms compute their weight gradients
// in the input step: one kernel pass gives both.)
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "../../src/model/latent_attention.hpp"
#include "../../src/model/output_layer.hpp"
#include "../../src/model/transformer_layer.hpp"
#include "mpi_test.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/init.hpp"
#include "parallel/tensor_parallel.hpp"

namespace parallel {
namespace {

using testing::world;

Tensor random_tensor(const Shape& shape, uint64_t stream) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = philox_normal(31, stream, i);
  return Tensor::from_vector(v, shape);
}

// The same bytes (and so the same bits) in both tensors.
void expect_bitwise(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (!a.defined()) return;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  EXPECT_EQ(std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()), 0)
      << what << " differs (rank " << world().rank() << ")";
}

void expect_grads_bitwise(const std::vector<Parameter*>& a, const std::vector<Parameter*>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i]->name, b[i]->name);
    expect_bitwise(a[i]->grad, b[i]->grad, a[i]->name + " grad");
  }
}

void init_all(const std::vector<Parameter*>& params) {
  for (Parameter* p : params) init_normal(*p, 5, 0.5f);  // biases and norms too, so that they matter
}

// Two identical layers; two forwards on each, then the fused backward of each micro-batch on the
// first and, on the second, every input step before any weight step (the most delayed W).
// Gradients accumulate over the micro-batches in the same order on both.
template <typename Layer, typename Ctx>
void run_layer(Layer& fused, Layer& split, const std::function<Tensor(Layer&, const Tensor&, Ctx&)>& forward,
               const Shape& in_shape, bool grads_in_input_step = false) {
  const int micro_batches = 2;
  init_all(fused.parameters());
  init_all(split.parameters());
  std::vector<Ctx> cf(static_cast<std::size_t>(micro_batches)), cs(static_cast<std::size_t>(micro_batches));
  std::vector<Tensor> dys;
  for (int mb = 0; mb < micro_batches; ++mb) {
    const Tensor x = random_tensor(in_shape, 10 + static_cast<uint64_t>(mb));
    const Tensor yf = forward(fused, x, cf[static_cast<std::size_t>(mb)]);
    const Tensor ys = forward(split, x, cs[static_cast<std::size_t>(mb)]);
    expect_bitwise(yf, ys, "forward output");
    dys.push_back(random_tensor(yf.shape(), 20 + static_cast<uint64_t>(mb)));
  }
  std::vector<Tensor> dx_split;
  for (int mb = 0; mb < micro_batches; ++mb) {
    const auto i = static_cast<std::size_t>(mb);
    const Tensor dxf = fused.backward(dys[i], cf[i]);
    dx_split.push_back(split.backward_input(dys[i], cs[i]));
    expect_bitwise(dxf, dx_split.back(), "input gradient");
  }
  if (grads_in_input_step) {
    // The norms: their weight gradients come out of the input step's kernel pass.
    expect_grads_bitwise(fused.parameters(), split.parameters());
  } else {
    for (Parameter* p : split.parameters()) {
      // Nothing written to the gradients before the weight steps (init left them zero), but for
      // the norms inside a transformer layer.
      if (p->name.find("norm") != std::string::npos) continue;
      const Tensor zero = Tensor::zeros(p->grad.shape(), p->grad.dtype());
      expect_bitwise(p->grad, zero, p->name + " grad after the input steps");
    }
  }
  for (int mb = 0; mb < micro_batches; ++mb) split.backward_weight(cs[static_cast<std::size_t>(mb)]);
  expect_grads_bitwise(fused.parameters(), split.parameters());
}

struct TpCase {
  bool sequence_parallel;
  bool bias;
  bool gather_output;
};

std::vector<TpCase> tp_cases() {
  std::vector<TpCase> out{{false, true, false}, {false, false, false}, {false, true, true}};
  if (world().size() > 1) out.push_back({true, true, false});
  return out;
}

TEST(SplitBackward, ColumnParallelLinear) {
  const int p = world().size();
  for (const TpCase& c : tp_cases()) {
    SCOPED_TRACE(::testing::Message()
                 << "sp " << c.sequence_parallel << " bias " << c.bias << " gather " << c.gather_output);
    auto make = [&] {
      return std::make_unique<tp::ColumnParallelLinear>(
          std::vector<tp::ColumnParallelLinear::Part>{{"q", 8 * p}, {"kv", 4 * p}}, 12,
          tp::ColumnParallelLinear::Options{c.bias, c.gather_output, c.sequence_parallel}, world());
    };
    auto a = make(), b = make();
    const int64_t s_local = c.sequence_parallel ? 8 / p : 8;
    run_layer<tp::ColumnParallelLinear, tp::LinearContext>(
        *a, *b,
        [](tp::ColumnParallelLinear& l, const Tensor& x, tp::LinearContext& ctx) {
          return l.forward(x, ctx);
        },
        {s_local, 2, 12});
  }
}

TEST(SplitBackward, RowParallelLinear) {
  const int p = world().size();
  for (const TpCase& c : tp_cases()) {
    if (c.gather_output) continue;
    SCOPED_TRACE(::testing::Message() << "sp " << c.sequence_parallel << " bias " << c.bias);
    auto make = [&] {
      return std::make_unique<tp::RowParallelLinear>(
          "proj", 8 * p, 12, tp::RowParallelLinear::Options{c.bias, c.sequence_parallel}, world());
    };
    auto a = make(), b = make();
    run_layer<tp::RowParallelLinear, tp::LinearContext>(
        *a, *b,
        [](tp::RowParallelLinear& l, const Tensor& x, tp::LinearContext& ctx) { return l.forward(x, ctx); },
        {8, 2, 8});
  }
}

// ---- the model's layers (src/model/*.hpp) -----------------------------------------------------

struct ModelLayerCase {
  const char* label;
  bool llama;  // RMSNorm, SwiGLU, rope, GQA; else LayerNorm, GeLU, MHA with biases
  bool sequence_parallel;
};

std::vector<ModelLayerCase> model_layer_cases() {
  std::vector<ModelLayerCase> out{{"gpt", false, false}, {"llama", true, false}};
  if (world().size() > 1) {
    out.push_back({"gpt sp", false, true});
    out.push_back({"llama sp", true, true});
  }
  return out;
}

ModelConfig layer_config(bool llama, double dropout = 0.0) {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 300;
  c.seq_length = 8;
  c.dropout = dropout;
  c.add_bias = !llama;
  if (llama) {
    c.num_query_groups = 2;
    c.normalization = Normalization::RMSNorm;
    c.activation = Activation::SwiGLU;
    c.position_embedding = PositionEmbedding::Rope;
  }
  return c;
}

model::LayerEnv layer_env(const ModelConfig& c, bool sp) {
  model::LayerEnv env;
  env.config = &c;
  env.tp = &world();
  env.sequence_parallel = sp && world().size() > 1;
  env.seed = 3;
  env.hidden = c.hidden_size;
  env.heads = c.num_attention_heads;
  env.groups = c.num_query_groups > 0 ? c.num_query_groups : c.num_attention_heads;
  env.head_dim = c.attention_head_dim();
  env.ffn = 4 * c.hidden_size;
  return env;
}

Shape hidden_shape(const model::LayerEnv& env, int64_t s) {
  return {env.sequence_parallel ? s / world().size() : s, 2, env.hidden};
}

TEST(SplitBackward, Norm) {
  for (const ModelLayerCase& c : model_layer_cases()) {
    SCOPED_TRACE(c.label);
    const ModelConfig cfg = layer_config(c.llama);
    const model::LayerEnv env = layer_env(cfg, c.sequence_parallel);
    model::Norm a(env, "n"), b(env, "n");
    run_layer<model::Norm, model::Norm::Context>(
        a, b, [](model::Norm& l, const Tensor& x, model::Norm::Context& ctx) { return l.forward(x, ctx); },
        hidden_shape(env, cfg.seq_length), /*grads_in_input_step=*/true);
  }
}

TEST(SplitBackward, SelfAttention) {
  for (const ModelLayerCase& c : model_layer_cases())
    for (bool keep_core : {true, false})
      for (bool qwen3 : {false, true}) {  // Qwen3's qk-norm with head_dim 12 != 32 / 4
        if (qwen3 && !c.llama) continue;
        SCOPED_TRACE(::testing::Message() << c.label << (keep_core ? "" : " selective recompute")
                                          << (qwen3 ? " qk-norm head_dim 12" : ""));
        ModelConfig cfg = layer_config(c.llama);
        cfg.qk_norm = qwen3;
        cfg.head_dim = qwen3 ? 12 : 0;
        const model::LayerEnv env = layer_env(cfg, c.sequence_parallel);
        model::SelfAttention a(env, 0), b(env, 0);
        run_layer<model::SelfAttention, model::SelfAttention::Context>(
            a, b,
            [keep_core](model::SelfAttention& l, const Tensor& x, model::SelfAttention::Context& ctx) {
              return l.forward(x, ctx, keep_core);
            },
            hidden_shape(env, cfg.seq_length));
      }
}

// Multi-head latent attention: replicated down projections and norms (their gradients partial
// under sp), column-parallel up projections, the shared k_pe's gradient reduced over tp.
TEST(SplitBackward, LatentAttention) {
  for (const ModelLayerCase& c : model_layer_cases())
    for (int q_lora_rank : {0, 12})
      for (bool keep_core : {true, false}) {
        if (!c.llama) continue;  // rope, RMSNorm, no biases
        SCOPED_TRACE(::testing::Message() << c.label << " q_lora_rank " << q_lora_rank
                                          << (keep_core ? "" : " selective recompute"));
        ModelConfig cfg = layer_config(true);
        cfg.attention = AttentionType::MLA;
        cfg.num_query_groups = cfg.num_attention_heads;
        cfg.q_lora_rank = q_lora_rank;
        cfg.kv_lora_rank = 10;
        cfg.qk_nope_head_dim = 6;
        cfg.qk_rope_head_dim = 4;
        cfg.v_head_dim = 5;
        const model::LayerEnv env = layer_env(cfg, c.sequence_parallel);
        model::LatentAttention a(env, model::layer_spec(cfg, 0)), b(env, model::layer_spec(cfg, 0));
        run_layer<model::LatentAttention, model::LatentAttention::Context>(
            a, b,
            [keep_core](model::LatentAttention& l, const Tensor& x, model::LatentAttention::Context& ctx) {
              return l.forward(x, ctx, keep_core);
            },
            hidden_shape(env, cfg.seq_length));
      }
}

TEST(SplitBackward, MLP) {
  for (const ModelLayerCase& c : model_layer_cases()) {
    SCOPED_TRACE(c.label);
    const ModelConfig cfg = layer_config(c.llama);
    const model::LayerEnv env = layer_env(cfg, c.sequence_parallel);
    model::MLP a(env, 0), b(env, 0);
    run_layer<model::MLP, model::MLP::Context>(
        a, b, [](model::MLP& l, const Tensor& x, model::MLP::Context& ctx) { return l.forward(x, ctx); },
        hidden_shape(env, cfg.seq_length));
  }
}

// A MoE layer (src/model/moe.cpp): the input step runs the router backward, the dispatch both ways
// and the experts' input GEMMs; the weight step the router's, experts' and shared expert's weight
// GEMMs. Experts split over the ranks (ep = world), tokens over tp with sp, and each expert's
// width over the ranks (etp = world: alone, and with sp over the same ranks as tp).
TEST(SplitBackward, MoELayer) {
  auto solo = world().split(world().rank(), 0);
  for (const char* split : {"", "ep", "etp"}) {
    const bool expert_parallel = split == std::string("ep"), expert_tensor = split == std::string("etp");
    if ((expert_parallel || expert_tensor) && world().size() == 1) continue;
    for (const ModelLayerCase& c : model_layer_cases()) {
      if (expert_parallel && c.sequence_parallel) continue;
      if (world().size() > 1 && !expert_parallel && !expert_tensor && !c.sequence_parallel)
        continue;  // MoE with tp needs sp
      SCOPED_TRACE(::testing::Message() << c.label << " " << split);
      ModelConfig cfg = layer_config(c.llama);
      cfg.num_experts = 4;
      cfg.moe_router_topk = 2;
      cfg.moe_ffn_hidden_size = 24;
      cfg.moe_aux_loss_coeff = 0.1;
      cfg.moe_z_loss_coeff = 0.01;
      cfg.moe_shared_expert_ffn_hidden_size = 16 * world().size();
      model::LayerEnv env = layer_env(cfg, c.sequence_parallel);
      if (expert_parallel) {
        env.tp = solo.get();
        env.ep = &world();
      }
      if (expert_tensor) {
        if (!c.sequence_parallel) env.tp = solo.get();
        env.etp = &world();
      }
      model::MoELayer a(env, 0), b(env, 0);
      run_layer<model::MoELayer, model::MoELayer::Context>(
          a, b,
          [](model::MoELayer& l, const Tensor& x, model::MoELayer::Context& ctx) {
            return l.forward(x, ctx, /*record_stats=*/true);
          },
          env.tp->size() == 1 ? Shape{cfg.seq_length, 2, env.hidden} : hidden_shape(env, cfg.seq_length));
    }
  }
}

TEST(SplitBackward, TransformerLayer) {
  for (const ModelLayerCase& c : model_layer_cases())
    for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
      SCOPED_TRACE(::testing::Message() << c.label << " recompute " << static_cast<int>(rc));
      const ModelConfig cfg = layer_config(c.llama, /*dropout=*/0.1);
      const model::LayerEnv env = layer_env(cfg, c.sequence_parallel);
      model::TransformerLayer a(env, 1, rc), b(env, 1, rc);
      uint64_t mb = 0;
      run_layer<model::TransformerLayer, model::TransformerLayer::Context>(
          a, b,
          [&mb](model::TransformerLayer& l, const Tensor& x, model::TransformerLayer::Context& ctx) {
            // Each layer sees micro-batches 0, 1, ...: a and b alternate, so two calls per id.
            return l.forward(x, ctx, mb++ / 2);
          },
          hidden_shape(env, cfg.seq_length));
    }
}

TEST(SplitBackward, OutputLayer) {
  const int p = world().size();
  for (const ModelLayerCase& c : model_layer_cases()) {
    SCOPED_TRACE(c.label);
    const ModelConfig cfg = layer_config(c.llama);
    const model::LayerEnv env = layer_env(cfg, c.sequence_parallel);
    auto make_weight = [&] {
      Parameter w;
      w.name = "output.weight";
      w.value = Tensor::zeros({384 / p, env.hidden}, DType::F32);
      w.grad = Tensor::zeros({384 / p, env.hidden}, DType::F32);
      w.global_shape = {384, env.hidden};
      w.partition_dim = 0;
      w.partition_offset = world().rank() * (384 / p);
      return w;
    };
    // OutputLayer borrows its weight: a thin owner makes it look like the other layers.
    struct Owned {
      Parameter weight;
      model::OutputLayer layer;
      Owned(const model::LayerEnv& env, Parameter w) : weight(std::move(w)), layer(env, &weight) {}
      std::vector<Parameter*> parameters() { return {&weight}; }
      Tensor backward(const Tensor& dy, tp::LinearContext& ctx) { return layer.backward(dy, ctx); }
      Tensor backward_input(const Tensor& dy, tp::LinearContext& ctx) {
        return layer.backward_input(dy, ctx);
      }
      void backward_weight(tp::LinearContext& ctx) { layer.backward_weight(ctx); }
    };
    Owned a(env, make_weight()), b(env, make_weight());
    run_layer<Owned, tp::LinearContext>(
        a, b, [](Owned& l, const Tensor& x, tp::LinearContext& ctx) { return l.layer.forward(x, ctx); },
        hidden_shape(env, cfg.seq_length));
  }
}

// ---- the whole model ---------------------------------------------------------------------------

struct ModelCase {
  const char* label;
  bool llama, tied, sequence_parallel;
  Recompute recompute = Recompute::None;
  double dropout = 0.0;
  Precision precision = Precision::FP32;
};

Tensor ids(const ModelConfig& c, int shift) {
  std::vector<int32_t> v(static_cast<std::size_t>(2 * c.seq_length));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<int32_t>((i * 89 + 17 * shift + 3) % c.vocab_size);
  return Tensor::from_vector(v, {2, c.seq_length});
}

// One chunk of the model (`spec`) on two identical copies: three micro-batches through the fused
// backward on one, and on the other all forwards, all input steps, then the weight steps in
// micro-batch order (each W delayed past the later micro-batches' B). Chunks without the loss get
// a random output gradient; chunks without the embedding a random input.
void run_model(const ModelCase& mc, ChunkSpec spec) {
  ModelConfig c = layer_config(mc.llama, mc.dropout);
  c.tie_embeddings = mc.tied;
  c.num_layers = 4;
  const GPTModel::Options o{.sequence_parallel = mc.sequence_parallel && world().size() > 1,
                            .recompute = mc.recompute,
                            .seed = 11,
                            .precision = mc.precision};
  GPTModel fused(c, spec, o, world()), split(c, spec, o, world());
  const DType act = mc.precision == Precision::FP32 ? DType::F32 : DType::BF16;
  const Shape hidden{o.sequence_parallel ? c.seq_length / world().size() : c.seq_length, 2, c.hidden_size};
  constexpr int kMicroBatches = 3;
  const Tensor scale = Tensor::full({1}, 1.0 / 48.0, DType::F32);

  // Hook calls on the split model: (parameter, micro-batch) once each, from W only, with the
  // gradient final at that point for the micro-batch being finished.
  int current_w = -1;
  std::map<std::string, int> calls;
  std::map<std::string, Tensor> at_last_call;
  split.set_grad_ready_hook([&](Parameter& p) {
    EXPECT_GE(current_w, 0) << p.name << ": grad-ready hook outside a weight step";
    ++calls[p.name];
    if (current_w == kMicroBatches - 1) at_last_call[p.name] = p.grad.clone();
  });

  std::vector<GPTModel::ActivationsPtr> af, as;
  std::vector<Tensor> inputs, grads;
  for (int mb = 0; mb < kMicroBatches; ++mb) {
    inputs.push_back(spec.pre_process ? ids(c, mb) : random_tensor(hidden, 40 + mb).to(act));
    grads.push_back(spec.post_process ? scale : random_tensor(hidden, 50 + mb).to(act));
    af.push_back(fused.new_activations());
    as.push_back(split.new_activations());
    const Tensor yf = fused.forward(inputs.back(), ids(c, mb + 1), *af.back(), mb);
    const Tensor ys = split.forward(inputs.back(), ids(c, mb + 1), *as.back(), mb);
    expect_bitwise(yf, ys, "forward output");
  }
  for (int mb = 0; mb < kMicroBatches; ++mb) {
    const auto i = static_cast<std::size_t>(mb);
    const Tensor dxf = fused.backward(grads[i], *af[i]);
    const Tensor dxs = split.backward_input(grads[i], *as[i]);
    if (spec.pre_process) {
      EXPECT_FALSE(dxs.defined() && dxs.numel() > 0);
    } else {
      expect_bitwise(dxf, dxs, "input gradient of micro-batch " + std::to_string(mb));
    }
  }
  EXPECT_TRUE(calls.empty()) << "grad-ready hook fired during an input step";
  for (int mb = 0; mb < kMicroBatches; ++mb) {
    current_w = mb;
    split.backward_weight(*as[static_cast<std::size_t>(mb)]);
  }
  expect_grads_bitwise(fused.parameters(), split.parameters());
  for (Parameter* p : split.parameters()) {
    EXPECT_EQ(calls[p->name], kMicroBatches) << p->name;
    ASSERT_TRUE(at_last_call.count(p->name)) << p->name;
    expect_bitwise(at_last_call[p->name], p->grad, p->name + " at its grad-ready hook");
  }
  EXPECT_THROW(split.backward_weight(*as[0]), Error);  // W twice
}

class SplitModel : public ::testing::TestWithParam<ModelCase> {};
void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.label; }

TEST_P(SplitModel, WholeChunk) { run_model(GetParam(), {0, 4, true, true}); }
TEST_P(SplitModel, FirstAndLastStages) {
  run_model(GetParam(), {0, 2, true, false});
  run_model(GetParam(), {2, 2, false, true});
}
TEST_P(SplitModel, MiddleStage) { run_model(GetParam(), {1, 2, false, false}); }

INSTANTIATE_TEST_SUITE_P(
    Cases, SplitModel,
    ::testing::Values(ModelCase{"GptTied", false, true, false}, ModelCase{"GptUntiedSp", false, false, true},
                      ModelCase{"LlamaUntied", true, false, false},
                      ModelCase{"LlamaTiedSp", true, true, true},
                      ModelCase{"GptDropoutSelective", false, true, true, Recompute::Selective, 0.1},
                      ModelCase{"LlamaFullRecompute", true, false, false, Recompute::Full, 0.1},
                      ModelCase{"GptBf16", false, true, true, Recompute::None, 0.0, Precision::BF16}),
    [](const ::testing::TestParamInfo<ModelCase>& info) { return std::string(info.param.label); });

}  // namespace
}  // namespace parallel
