// The encoder classifier's forward and backward, layer by layer, from the library's tensor-parallel
// layers and ops (parallel/tensor_parallel.hpp, parallel/ops.hpp). encoder.hpp says what it computes.
#include "encoder.hpp"

#include <fmt/format.h>

#include <cmath>
#include <parallel/error.hpp>
#include <parallel/init.hpp>
#include <parallel/ops.hpp>
#include <string>

namespace encoder {

using parallel::DType;
using parallel::Parameter;
using parallel::Tensor;
namespace ops = parallel::ops;
namespace tp = parallel::tp;

namespace {

constexpr float kNormEps = 1e-5f;

// A parameter every tp rank holds whole. Under sequence parallelism each rank sees only its
// sequence shard's gradient: finalize_grads sums it over tp (sequence_parallel_grad).
Parameter replicated(const std::string& name, const parallel::Shape& shape, bool sequence_parallel_grad) {
  Parameter p;
  p.name = name;
  p.value = Tensor::zeros(shape, DType::F32);
  p.grad = Tensor::zeros(shape, DType::F32);
  p.global_shape = shape;
  p.sequence_parallel_grad = sequence_parallel_grad;
  return p;
}

Tensor ones(int64_t n) { return Tensor::full({n, 1}, 1.0, DType::F32); }

// LayerNorm over the last dimension; mean and rstd are kept for the backward.
Tensor layer_norm(const Tensor& x, const Parameter& w, const Parameter& b, Tensor& mean, Tensor& rstd) {
  const int64_t h = x.size(-1), rows = x.numel() / h;
  Tensor y = Tensor::empty(x.shape(), DType::F32);
  mean = Tensor::empty({rows}, DType::F32);
  rstd = Tensor::empty({rows}, DType::F32);
  Tensor y2 = y.view({rows, h});
  ops::layernorm_forward(x.view({rows, h}), w.value, b.value, y2, mean, rstd, kNormEps);
  return y;
}
// Returns dx; accumulates the weight and bias gradients.
Tensor layer_norm_backward(const Tensor& dy, const Tensor& x, Parameter& w, Parameter& b, const Tensor& mean,
                           const Tensor& rstd) {
  const int64_t h = x.size(-1), rows = x.numel() / h;
  Tensor dx = Tensor::empty(x.shape(), DType::F32);
  Tensor dx2 = dx.view({rows, h});
  ops::layernorm_backward(dy.contiguous().view({rows, h}), x.view({rows, h}), w.value, mean, rstd, dx2,
                          w.grad, b.grad);
  return dx;
}

Tensor sum(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape(), DType::F32);
  ops::add(a, b, out);
  return out;
}

}  // namespace

struct EncoderChunk::Layer {
  Parameter norm1_weight, norm1_bias, norm2_weight, norm2_bias;
  tp::ColumnParallelLinear qkv, fc1;  // query|key|value parts; MLP in
  tp::RowParallelLinear proj, fc2;    // attention out; MLP out
  std::vector<Parameter*> params;     // the unit, in forward order

  Layer(const EncoderConfig& c, int index, parallel::Communicator& tp_group)
      : qkv({{name(index, "attention.query"), c.hidden},
             {name(index, "attention.key"), c.hidden},
             {name(index, "attention.value"), c.hidden}},
            c.hidden, {.bias = true, .sequence_parallel = c.sequence_parallel}, tp_group),
        fc1({{name(index, "mlp.fc1"), c.ffn}}, c.hidden,
            {.bias = true, .sequence_parallel = c.sequence_parallel}, tp_group),
        proj(name(index, "attention.proj"), c.hidden, c.hidden,
             {.bias = true, .sequence_parallel = c.sequence_parallel}, tp_group),
        fc2(name(index, "mlp.fc2"), c.ffn, c.hidden, {.bias = true, .sequence_parallel = c.sequence_parallel},
            tp_group) {
    const bool spg = c.sequence_parallel && tp_group.size() > 1;
    norm1_weight = replicated(name(index, "norm1.weight"), {c.hidden}, spg);
    norm1_bias = replicated(name(index, "norm1.bias"), {c.hidden}, spg);
    norm2_weight = replicated(name(index, "norm2.weight"), {c.hidden}, spg);
    norm2_bias = replicated(name(index, "norm2.bias"), {c.hidden}, spg);
    params = {&norm1_weight, &norm1_bias};
    for (Parameter* p : qkv.parameters()) params.push_back(p);
    for (Parameter* p : proj.parameters()) params.push_back(p);
    params.insert(params.end(), {&norm2_weight, &norm2_bias});
    for (Parameter* p : fc1.parameters()) params.push_back(p);
    for (Parameter* p : fc2.parameters()) params.push_back(p);
  }
  static std::string name(int index, const char* what) { return fmt::format("layers.{}.{}", index, what); }
};

struct EncoderChunk::Saved final : Activations {
  struct LayerSaved {
    Tensor x, mean1, rstd1, q, k, v, attn, lse, x2, mean2, rstd2, f1;
    tp::LinearContext qkv, proj, fc1, fc2;
  };
  tp::VocabParallelEmbedding::Context embedding;
  std::vector<LayerSaved> layers;
  Tensor final_in, mean, rstd;
  tp::LinearContext head;
  tp::CrossEntropyContext loss;
  int64_t batch = 0;
};

EncoderChunk::EncoderChunk(const EncoderConfig& c, parallel::ChunkSpec spec, parallel::Communicator& tp_group)
    : config_(c), spec_(spec), tp_(tp_group) {
  const int t = tp_group.size();
  PARALLEL_CHECK(c.vocab % t == 0 && c.heads % t == 0 && c.ffn % t == 0 && c.classes % t == 0,
                 "encoder: vocab {}, heads {}, ffn {} and classes {} must be divisible by tp = {}", c.vocab,
                 c.heads, c.ffn, c.classes, t);
  PARALLEL_CHECK(c.hidden % c.heads == 0, "encoder: hidden {} not divisible by heads {}", c.hidden, c.heads);
  PARALLEL_CHECK(!c.sequence_parallel || c.seq % t == 0, "encoder: seq {} not divisible by tp = {}", c.seq,
                 t);
  seq_local_ = c.sequence_parallel ? c.seq / t : c.seq;
  const bool spg = c.sequence_parallel && t > 1;
  if (spec.pre_process) {
    embedding_ = std::make_unique<tp::VocabParallelEmbedding>("embedding.word", c.vocab, c.hidden,
                                                              c.sequence_parallel, tp_group);
    position_ = replicated("embedding.position", {c.seq, c.hidden}, spg);
    parallel::init_normal(embedding_->weight, c.seed, c.init_std);
    parallel::init_normal(position_, c.seed, c.init_std);
    units_.push_back({&embedding_->weight, &position_});
  }
  for (int l = spec.first_layer; l < spec.first_layer + spec.num_layers; ++l) {
    auto layer = std::make_unique<Layer>(c, l, tp_group);
    for (Parameter* p : layer->params) {
      // Norm weights start at 1, everything else as normal(0, init_std) draws: a function of
      // (seed, name, global index), so every layout starts from the same model.
      if (p->name.ends_with("norm1.weight") || p->name.ends_with("norm2.weight"))
        parallel::init_constant(*p, 1.0f);
      else
        parallel::init_normal(*p, c.seed, c.init_std);
    }
    units_.push_back(layer->params);
    layers_.push_back(std::move(layer));
  }
  if (spec.post_process) {
    final_norm_weight_ = replicated("final_norm.weight", {c.hidden}, spg);
    final_norm_bias_ = replicated("final_norm.bias", {c.hidden}, spg);
    parallel::init_constant(final_norm_weight_, 1.0f);
    head_ = std::make_unique<tp::ColumnParallelLinear>(
        std::vector<tp::ColumnParallelLinear::Part>{{"head", c.classes}}, c.hidden,
        tp::ColumnParallelLinear::Options{}, tp_group);
    std::vector<Parameter*> unit = {&final_norm_weight_, &final_norm_bias_};
    for (Parameter* p : head_->parameters()) {
      parallel::init_normal(*p, c.seed, c.init_std);
      unit.push_back(p);
    }
    units_.push_back(unit);
  }
}

EncoderChunk::~EncoderChunk() = default;

parallel::ModelChunk::ActivationsPtr EncoderChunk::new_activations() const {
  return std::make_unique<Saved>();
}

std::vector<Parameter*> EncoderChunk::parameters() {
  std::vector<Parameter*> out;
  for (const auto& unit : units_) out.insert(out.end(), unit.begin(), unit.end());
  return out;
}

std::vector<std::vector<Parameter*>> EncoderChunk::units() { return units_; }

// Under ZeRO-3 the unit hook gathers the unit's parameters before it computes and frees them after.
void EncoderChunk::before(UnitPhase phase, const std::vector<Parameter*>& unit) {
  if (unit_) unit_(phase, unit);
  if (phase == UnitPhase::BeforeForward && use_)
    for (Parameter* p : unit) use_(*p);
}
void EncoderChunk::after(UnitPhase phase, const std::vector<Parameter*>& unit) {
  if (phase == UnitPhase::AfterBackward && ready_)
    for (Parameter* p : unit) ready_(*p);
  if (unit_) unit_(phase, unit);
}

Tensor EncoderChunk::forward(const Tensor& input, const Tensor& targets, Activations& base, uint64_t) {
  auto& act = dynamic_cast<Saved&>(base);
  const EncoderConfig& c = config_;
  const int t = tp_.size();
  const int64_t s = c.seq, sl = seq_local_, hl = c.heads / t, d = c.hidden / c.heads;
  std::size_t unit = 0;
  Tensor x;
  if (spec_.pre_process) {
    PARALLEL_CHECK(input.dim() == 2 && input.size(1) == s && input.dtype() == DType::I32,
                   "encoder: tokens {} must be [b, {}] int32", input.str(), s);
    act.batch = input.size(0);
    before(UnitPhase::BeforeForward, units_[unit]);
    x = embedding_->forward(input, act.embedding);  // [s(/tp), b, h]
    const int64_t first = c.sequence_parallel ? tp_.rank() * sl : 0;
    for (int64_t i = 0; i < sl; ++i) {
      Tensor row = x.select(i);
      ops::add_bias(row, position_.value.select(first + i));
    }
    after(UnitPhase::AfterForward, units_[unit++]);
  } else {
    x = input.contiguous();
    act.batch = x.size(1);
  }
  const int64_t b = act.batch;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (auto& layer : layers_) {
    before(UnitPhase::BeforeForward, units_[unit]);
    Saved::LayerSaved& ls = act.layers.emplace_back();
    ls.x = x;
    Tensor n1 = layer_norm(x, layer->norm1_weight, layer->norm1_bias, ls.mean1, ls.rstd1);
    Tensor qkv = layer->qkv.forward(n1, ls.qkv);  // [s, b, q_r | k_r | v_r]
    auto head_view = [&](int part) {
      return qkv.narrow(2, part * hl * d, hl * d).contiguous().view({s, b, hl, d});
    };
    ls.q = head_view(0), ls.k = head_view(1), ls.v = head_view(2);
    ls.attn = Tensor::empty({s, b, hl, d}, DType::F32);
    ls.lse = Tensor::empty({b, hl, s}, DType::F32);
    ops::attention_forward(ls.q, ls.k, ls.v, ls.attn, ls.lse, /*causal=*/false, scale);
    ls.x2 = sum(x, layer->proj.forward(ls.attn.view({s, b, hl * d}), ls.proj));
    Tensor n2 = layer_norm(ls.x2, layer->norm2_weight, layer->norm2_bias, ls.mean2, ls.rstd2);
    ls.f1 = layer->fc1.forward(n2, ls.fc1);
    Tensor g = Tensor::empty(ls.f1.shape(), DType::F32);
    ops::gelu_forward(ls.f1, g);
    x = sum(ls.x2, layer->fc2.forward(g, ls.fc2));
    after(UnitPhase::AfterForward, units_[unit++]);
  }
  if (!spec_.post_process) return x;

  PARALLEL_CHECK(targets.dim() == 1 && targets.size(0) == b && targets.dtype() == DType::I32,
                 "encoder: targets {} must be [{}] int32", targets.str(), b);
  before(UnitPhase::BeforeForward, units_[unit]);
  act.final_in = x;
  Tensor normed = layer_norm(x, final_norm_weight_, final_norm_bias_, act.mean, act.rstd);
  // Mean over the sequence as a GEMM with a ones vector: pooled[b*h] = normed[s, b*h]^T 1 / s; under
  // sequence parallelism each rank sums its shard and tp adds them up (the dual is the identity).
  Tensor pooled = Tensor::empty({b * c.hidden, 1}, DType::F32);
  ops::gemm(normed.view({sl, b * c.hidden}), true, ones(sl), false, pooled, 1.0f / static_cast<float>(s));
  if (c.sequence_parallel) pooled = tp::all_reduce(tp_, pooled);
  Tensor logits = head_->forward(pooled.view({1, b, c.hidden}), act.head);  // [1, b, classes / tp]
  Tensor losses = tp::vocab_parallel_cross_entropy(tp_, logits.view({b, head_->out_local()}), targets,
                                                   head_->weights[0].partition_offset, c.classes, act.loss);
  Tensor loss_sum = Tensor::empty({1, 1}, DType::F32);
  ops::gemm(losses.view({1, b}), false, ones(b), false, loss_sum);
  after(UnitPhase::AfterForward, units_[unit]);
  return loss_sum.view({1});
}

Tensor EncoderChunk::backward(const Tensor& grad, Activations& base) {
  auto& act = dynamic_cast<Saved&>(base);
  const EncoderConfig& c = config_;
  const int t = tp_.size();
  const int64_t s = c.seq, sl = seq_local_, hl = c.heads / t, d = c.hidden / c.heads, b = act.batch;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::size_t unit = units_.size();
  Tensor dx;
  if (spec_.post_process) {
    before(UnitPhase::BeforeBackward, units_[--unit]);
    // d(objective)/d(loss_i) is the same for every sample: the [1] seed broadcast to [b].
    Tensor grad_loss = Tensor::empty({b, 1}, DType::F32);
    ops::gemm(ones(b), false, grad.contiguous().view({1, 1}), false, grad_loss);
    Tensor dlogits = tp::vocab_parallel_cross_entropy_backward(grad_loss.view({b}), act.loss);
    Tensor dpooled = head_->backward(dlogits.view({1, b, head_->out_local()}), act.head);  // summed over tp
    Tensor dnormed = Tensor::empty({sl, b, c.hidden}, DType::F32);
    Tensor dnormed2 = dnormed.view({sl, b * c.hidden});
    ops::gemm(ones(sl), false, dpooled.contiguous().view({b * c.hidden, 1}), true, dnormed2,
              1.0f / static_cast<float>(s));
    dx = layer_norm_backward(dnormed, act.final_in, final_norm_weight_, final_norm_bias_, act.mean, act.rstd);
    act.final_in = act.mean = act.rstd = Tensor();
    after(UnitPhase::AfterBackward, units_[unit]);
  } else {
    dx = grad.contiguous();
  }
  for (std::size_t l = layers_.size(); l-- > 0;) {
    Layer& layer = *layers_[l];
    Saved::LayerSaved& ls = act.layers[l];
    before(UnitPhase::BeforeBackward, units_[--unit]);
    // out = x2 + fc2(gelu(fc1(norm2(x2))))
    Tensor dg = layer.fc2.backward(dx, ls.fc2);
    Tensor df1 = Tensor::empty(ls.f1.shape(), DType::F32);
    ops::gelu_backward(dg, ls.f1, df1);
    Tensor dn2 = layer.fc1.backward(df1, ls.fc1);
    Tensor dx2 =
        sum(dx, layer_norm_backward(dn2, ls.x2, layer.norm2_weight, layer.norm2_bias, ls.mean2, ls.rstd2));
    // x2 = x + proj(attention(qkv(norm1(x))))
    Tensor dattn = layer.proj.backward(dx2, ls.proj).contiguous();
    Tensor dq = Tensor::empty({s, b, hl, d}, DType::F32), dk = Tensor::empty({s, b, hl, d}, DType::F32),
           dv = Tensor::empty({s, b, hl, d}, DType::F32);
    ops::attention_backward(dattn.view({s, b, hl, d}), ls.q, ls.k, ls.v, ls.attn, ls.lse, dq, dk, dv,
                            /*causal=*/false, scale);
    Tensor dqkv = Tensor::empty({s, b, 3 * hl * d}, DType::F32);
    const Tensor* parts[] = {&dq, &dk, &dv};
    for (int p = 0; p < 3; ++p) dqkv.narrow(2, p * hl * d, hl * d).copy_(parts[p]->view({s, b, hl * d}));
    Tensor dn1 = layer.qkv.backward(dqkv, ls.qkv);
    dx = sum(dx2, layer_norm_backward(dn1, ls.x, layer.norm1_weight, layer.norm1_bias, ls.mean1, ls.rstd1));
    ls = {};
    after(UnitPhase::AfterBackward, units_[unit]);
  }
  act.layers.clear();
  if (!spec_.pre_process) return dx;
  before(UnitPhase::BeforeBackward, units_[--unit]);
  const int64_t first = c.sequence_parallel ? tp_.rank() * sl : 0;
  for (int64_t i = 0; i < sl; ++i) {
    Tensor row_grad = position_.grad.select(first + i);
    ops::bias_backward(dx.select(i), row_grad);
  }
  embedding_->backward(dx, act.embedding);
  after(UnitPhase::AfterBackward, units_[unit]);
  return Tensor();
}

}  // namespace encoder
