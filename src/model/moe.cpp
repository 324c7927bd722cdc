// A mixture-of-experts layer (layers.hpp, MoELayer; docs/model.md "Mixture of experts").
//
//   logits = x R^T (fp32)           p = softmax(logits)          top-k of p, ties to the lower index
//   y[t]   = sum_j p[t, e_j] * expert_{e_j}(x[t])  (+ shared_expert(x)[t])
//   aux    = coeff * E / (k T^2) * sum_i count_i * sum_t p[t, i]     (Switch / GShard balancing)
//   z      = z_coeff / T * sum_t logsumexp(logits[t])^2
// with count_i the top-k assignments to expert i and T the tokens of the micro-batch (over the tp
// group under sequence parallelism and over the cp group, so the losses do not depend on tp or cp). The
// losses enter the objective with env.moe_loss_scale; their gradients are added to the router's in the
// backward.
//
// Dispatch: the kept assignments are sorted by expert (stable in token order), so each ep rank's
// experts own one contiguous block of rows. alltoall sends each block to its owner (per-expert
// counts first, then the rows with all_to_allv) and regroups what arrives by local expert;
// allgather gathers every rank's rows and counts and picks its own experts' rows. The experts run
// as one grouped GEMM (a loop over the local experts' contiguous rows), and the outputs go back the
// same way. Routing, permutation and the weighted combine are host loops computing in fp32 and
// writing the activation dtype once.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "layers.hpp"
#include "parallel/layout_rules.hpp"
#include "parallel/ops.hpp"

namespace parallel::model {
namespace {

// rows [R, h] -> out[i] = rows[index[i]], any dtype (bytes copied).
Tensor gather_rows(const Tensor& rows, const std::vector<int64_t>& index, int64_t h) {
  Tensor out = Tensor::empty({static_cast<int64_t>(index.size()), h}, rows.dtype(), rows.device());
  const std::size_t row_bytes = static_cast<std::size_t>(h) * dtype_size(rows.dtype());
  const auto* src = static_cast<const char*>(rows.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  for (std::size_t i = 0; i < index.size(); ++i)
    std::memcpy(dst + i * row_bytes, src + static_cast<std::size_t>(index[i]) * row_bytes, row_bytes);
  return out;
}

int ep_size(const LayerEnv& env) { return env.ep != nullptr ? env.ep->size() : 1; }
int ep_rank(const LayerEnv& env) { return env.ep != nullptr ? env.ep->rank() : 0; }

Parameter expert_weight(const std::string& name, int64_t rows, int64_t cols) {
  Parameter p;
  p.name = name;
  p.value = Tensor::zeros({rows, cols}, DType::F32);
  p.grad = Tensor::zeros({rows, cols}, DType::F32);
  p.global_shape = {rows, cols};
  p.expert = true;
  return p;
}

}  // namespace

MoELayer::MoELayer(const LayerEnv& env, int layer) : env_(env) {
  const ModelConfig& c = *env.config;
  experts_ = c.num_experts;
  topk_ = c.moe_router_topk;
  ffn_ = c.moe_ffn_hidden_size > 0 ? c.moe_ffn_hidden_size : env.ffn;
  const int p = ep_size(env);
  PARALLEL_CHECK(experts_ > 0, "MoELayer: a layer of {} experts", experts_);
  check_layout(c, env.layout());  // experts over ep, top-k, tp with sp (layout_rules.hpp)
  local_ = experts_ / p;
  const std::string prefix = fmt::format("layers.{}.mlp", layer);
  router.name = prefix + ".router.weight";
  router.value = Tensor::zeros({experts_, env.hidden}, DType::F32);
  router.grad = Tensor::zeros({experts_, env.hidden}, DType::F32);
  router.global_shape = {experts_, env.hidden};
  router.sequence_parallel_grad = env.sequence_parallel;  // each tp rank routes its own s-shard
  const int64_t fc1_rows = c.activation == Activation::SwiGLU ? 2 * ffn_ : ffn_;
  for (int64_t i = 0; i < local_; ++i) {
    const int64_t global = ep_rank(env) * local_ + i;
    fc1.push_back(
        expert_weight(fmt::format("{}.experts.{}.fc1.weight", prefix, global), fc1_rows, env.hidden));
    fc2.push_back(expert_weight(fmt::format("{}.experts.{}.fc2.weight", prefix, global), env.hidden, ffn_));
  }
  // Under sequence parallelism each tp rank's experts see only its shard's tokens: their gradients
  // are partial sums over tp, which the expert-dp reduction (it spans tp) completes.
  if (c.moe_shared_expert_ffn_hidden_size > 0)
    shared = std::make_unique<MLP>(env, prefix + ".shared_expert", c.moe_shared_expert_ffn_hidden_size);
  stats_.tokens_per_expert.assign(static_cast<std::size_t>(experts_), 0);
}

std::vector<Parameter*> MoELayer::parameters() {
  std::vector<Parameter*> out{&router};
  if (shared)
    for (Parameter* p : shared->parameters()) out.push_back(p);
  for (int64_t i = 0; i < local_; ++i) {
    out.push_back(&fc1[static_cast<std::size_t>(i)]);
    out.push_back(&fc2[static_cast<std::size_t>(i)]);
  }
  return out;
}

// send_counts: rows this rank's permuted block holds per expert (all E; forward) - the same
// counts serve the way back. Forward: [N, h] in expert order -> [N_local, h] grouped by local
// expert; back: the inverse.
Tensor MoELayer::dispatch(const Tensor& rows, Context& ctx, const std::vector<int64_t>& send_counts,
                          bool back) {
  const int p = ep_size(env_);
  const int64_t h = env_.hidden;
  if (p == 1) return rows;
  const auto P = static_cast<std::size_t>(p);
  const auto L = static_cast<std::size_t>(local_);
  // Where each (source rank, local expert) block sits in the received order [rank][expert] and in
  // the experts' order [expert][rank].
  std::vector<int64_t> by_rank(P * L + 1, 0), by_expert(P * L, 0);
  for (std::size_t i = 0; i < P * L; ++i) by_rank[i + 1] = by_rank[i] + ctx.recv_counts[i];
  {
    int64_t at = 0;
    for (std::size_t e = 0; e < L; ++e)
      for (std::size_t r = 0; r < P; ++r) {
        by_expert[r * L + e] = at;
        at += ctx.recv_counts[r * L + e];
      }
  }
  const int64_t n_local = by_rank[P * L];
  if (env_.config->moe_token_dispatcher == MoeDispatcher::AllToAll) {
    std::vector<int64_t> send(P, 0), recv(P, 0);
    for (std::size_t r = 0; r < P; ++r) {
      for (std::size_t e = 0; e < L; ++e) {
        send[r] += send_counts[r * L + e] * h;
        recv[r] += ctx.recv_counts[r * L + e] * h;
      }
    }
    if (!back) {
      Tensor received = Tensor::empty({n_local, h}, rows.dtype(), rows.device());
      env_.ep->all_to_allv(rows, send, received, recv);
      std::vector<int64_t> index(static_cast<std::size_t>(n_local));
      for (std::size_t r = 0; r < P; ++r)
        for (std::size_t e = 0; e < L; ++e)
          for (int64_t i = 0; i < ctx.recv_counts[r * L + e]; ++i)
            index[static_cast<std::size_t>(by_expert[r * L + e] + i)] = by_rank[r * L + e] + i;
      return gather_rows(received, index, h);
    }
    std::vector<int64_t> index(static_cast<std::size_t>(n_local));
    for (std::size_t r = 0; r < P; ++r)
      for (std::size_t e = 0; e < L; ++e)
        for (int64_t i = 0; i < ctx.recv_counts[r * L + e]; ++i)
          index[static_cast<std::size_t>(by_rank[r * L + e] + i)] = by_expert[r * L + e] + i;
    Tensor ordered = gather_rows(rows, index, h);
    int64_t n = 0;
    for (int64_t c : send_counts) n += c;
    Tensor out = Tensor::empty({n, h}, rows.dtype(), rows.device());
    env_.ep->all_to_allv(ordered, recv, out, send);
    return out;
  }
  // AllGather: every rank's permuted rows, padded to the longest block so the gather is even.
  // The counts of all ranks are known (exchanged in forward), so each rank picks its experts'
  // rows; on the way back each rank's results are scattered into a zero buffer at the positions
  // they came from and summed over ep (a reduce-scatter), since exactly one rank computed each row.
  std::vector<int64_t> block(P, 0);  // rows each rank holds in its permuted order
  for (std::size_t r = 0; r < P; ++r)
    for (std::size_t e = 0; e < P * L; ++e) block[r] += ctx.all_counts[r * P * L + e];
  const int64_t width = *std::max_element(block.begin(), block.end());
  // Row (rank r, expert g, i) sits at r * width + (offset of expert g in r's order) + i.
  std::vector<int64_t> index(static_cast<std::size_t>(n_local));
  const std::size_t me = static_cast<std::size_t>(ep_rank(env_));
  for (std::size_t r = 0; r < P; ++r) {
    int64_t at = static_cast<int64_t>(r) * width;
    for (std::size_t g = 0; g < P * L; ++g) {
      const int64_t c = ctx.all_counts[r * P * L + g];
      if (g / L == me) {
        const std::size_t e = g % L;
        for (int64_t i = 0; i < c; ++i) index[static_cast<std::size_t>(by_expert[r * L + e] + i)] = at + i;
      }
      at += c;
    }
  }
  if (!back) {
    Tensor mine = Tensor::zeros({width, h}, rows.dtype(), rows.device());
    if (rows.size(0) > 0) mine.narrow(0, 0, rows.size(0)).copy_(rows);
    Tensor all = Tensor::empty({width * p, h}, rows.dtype(), rows.device());
    env_.ep->all_gather(mine, all);
    return gather_rows(all, index, h);
  }
  Tensor all = Tensor::zeros({width * p, h}, DType::F32, rows.device());
  {
    Tensor rows32 = rows.to(DType::F32);
    const float* src = rows32.data<float>();
    float* dst = all.data<float>();
    for (std::size_t i = 0; i < index.size(); ++i)
      std::memcpy(dst + index[i] * h, src + static_cast<int64_t>(i) * h, static_cast<std::size_t>(h) * 4);
  }
  Tensor mine = Tensor::empty({width, h}, DType::F32, rows.device());
  env_.ep->reduce_scatter(all, mine);
  return mine.narrow(0, 0, block[me]).to(rows.dtype());
}

Tensor MoELayer::forward(const Tensor& x_in, Context& ctx, bool record_stats) {
  PARALLEL_CHECK(x_in.device().is_cpu(), "MoELayer: runs on the CPU only (routing is host code), got {}",
                 x_in.str());
  const int64_t h = env_.hidden, E = experts_, k = topk_;
  const auto Es = static_cast<std::size_t>(E);
  Tensor x = x_in.contiguous();
  const int64_t T = x.numel() / h;
  Tensor xr = x.view({T, h});
  ctx = Context{};
  ctx.tokens = T;
  ctx.x = xr;

  // Router: fp32 logits, softmax, top-k (lower index first among equals), log-sum-exp for z.
  Tensor logits = Tensor::empty({T, E}, DType::F32, x.device());
  ops::gemm(xr, false, router.value, true, logits);
  ctx.probs = Tensor::empty({T, E}, DType::F32, x.device());
  float* probs = ctx.probs.data<float>();
  const float* lg = logits.data<float>();
  ctx.lse.resize(static_cast<std::size_t>(T));
  ctx.choice.resize(static_cast<std::size_t>(T * k));
  std::vector<int32_t> order(Es);
  for (int64_t t = 0; t < T; ++t) {
    const float* l = lg + t * E;
    float* pr = probs + t * E;
    float mx = l[0];
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, l[e]);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e] - mx));
    for (int64_t e = 0; e < E; ++e)
      pr[e] = static_cast<float>(std::exp(static_cast<double>(l[e] - mx)) / sum);
    ctx.lse[static_cast<std::size_t>(t)] = static_cast<float>(std::log(sum) + mx);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [pr](int32_t a, int32_t b) { return pr[a] > pr[b] || (pr[a] == pr[b] && a < b); });
    for (int64_t j = 0; j < k; ++j)
      ctx.choice[static_cast<std::size_t>(t * k + j)] = order[static_cast<std::size_t>(j)];
  }

  // Capacity (local tokens, first come first kept in token order) and the permutation by expert.
  std::vector<int64_t> assigned(Es, 0);
  for (int32_t e : ctx.choice) ++assigned[static_cast<std::size_t>(e)];
  const double cf = env_.config->moe_capacity_factor;
  const int64_t capacity =
      cf > 0 ? static_cast<int64_t>(std::ceil(cf * static_cast<double>(T * k) / static_cast<double>(E)))
             : T * k;
  ctx.counts.assign(Es, 0);
  std::vector<char> kept(static_cast<std::size_t>(T * k), 0);
  int64_t dropped = 0;
  for (std::size_t a = 0; a < kept.size(); ++a) {
    auto& c = ctx.counts[static_cast<std::size_t>(ctx.choice[a])];
    if (c < capacity) {
      ++c;
      kept[a] = 1;
    } else {
      ++dropped;
    }
  }
  std::vector<int64_t> start(Es + 1, 0);
  for (std::size_t e = 0; e < Es; ++e) start[e + 1] = start[e] + ctx.counts[e];
  const int64_t N = start[Es];
  ctx.perm.assign(static_cast<std::size_t>(N), 0);
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (std::size_t a = 0; a < kept.size(); ++a)
      if (kept[a])
        ctx.perm[static_cast<std::size_t>(fill[static_cast<std::size_t>(ctx.choice[a])]++)] =
            static_cast<int64_t>(a);
  }

  // The losses' statistics, over the tp group's shards under sequence parallelism.
  {
    std::vector<float> stat(2 * Es + 2, 0.0f);
    for (std::size_t e = 0; e < Es; ++e) stat[e] = static_cast<float>(assigned[e]);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) stat[Es + static_cast<std::size_t>(e)] += probs[t * E + e];
    for (float l : ctx.lse) stat[2 * Es] += l * l;
    stat[2 * Es + 1] = static_cast<float>(T);
    // The sequence's other shards: tp ranks under sequence parallelism, and the cp ranks.
    for (Communicator* group : {env_.sequence_parallel ? env_.tp : nullptr, env_.cp}) {
      if (group == nullptr || group->size() == 1) continue;
      Tensor s = Tensor::from_vector(stat, {static_cast<int64_t>(stat.size())});
      group->all_reduce(s);
      stat = s.to_float_vector();
    }
    ctx.aux_counts.assign(stat.begin(), stat.begin() + E);
    ctx.aux_tokens = stat[2 * Es + 1];
    if (record_stats && env_.training) {
      const ModelConfig& c = *env_.config;
      double dot = 0;
      for (std::size_t e = 0; e < Es; ++e) dot += static_cast<double>(stat[e]) * stat[Es + e];
      const double tt = ctx.aux_tokens;
      stats_.aux_loss +=
          c.moe_aux_loss_coeff * static_cast<double>(E) / (static_cast<double>(k) * tt * tt) * dot;
      stats_.z_loss += c.moe_z_loss_coeff * stat[2 * Es] / tt;
      for (std::size_t e = 0; e < Es; ++e) stats_.tokens_per_expert[e] += assigned[e];
      stats_.dropped += dropped;
      ++stats_.calls;
    }
  }

  // Dispatch: rows in expert order, counts per (ep rank, local expert) exchanged first.
  std::vector<int64_t> rows_index(static_cast<std::size_t>(N));
  for (std::size_t i = 0; i < rows_index.size(); ++i) rows_index[i] = ctx.perm[i] / k;
  Tensor x_perm = gather_rows(xr, rows_index, h);
  const int p = ep_size(env_);
  const auto P = static_cast<std::size_t>(p), L = static_cast<std::size_t>(local_);
  if (p == 1) {
    ctx.recv_counts = ctx.counts;
  } else if (env_.config->moe_token_dispatcher == MoeDispatcher::AllToAll) {
    Tensor send = Tensor::from_vector(std::vector<int64_t>(ctx.counts), {E});
    Tensor recv = Tensor::empty({E}, DType::I64);
    env_.ep->all_to_all(send, recv);
    const int64_t* r = recv.data<int64_t>();
    ctx.recv_counts.assign(r, r + E);
  } else {
    Tensor send = Tensor::from_vector(std::vector<int64_t>(ctx.counts), {E});
    Tensor all = Tensor::empty({E * p}, DType::I64);
    env_.ep->all_gather(send, all);
    const int64_t* a = all.data<int64_t>();
    ctx.all_counts.assign(a, a + E * p);
    ctx.recv_counts.assign(P * L, 0);
    const std::size_t me = static_cast<std::size_t>(ep_rank(env_));
    for (std::size_t r = 0; r < P; ++r)
      for (std::size_t e = 0; e < L; ++e) ctx.recv_counts[r * L + e] = ctx.all_counts[r * P * L + me * L + e];
  }
  ctx.local_offsets.assign(L + 1, 0);
  for (std::size_t e = 0; e < L; ++e) {
    int64_t n = 0;
    for (std::size_t r = 0; r < P; ++r) n += ctx.recv_counts[r * L + e];
    ctx.local_offsets[e + 1] = ctx.local_offsets[e] + n;
  }
  ctx.expert_in = dispatch(x_perm, ctx, ctx.counts, /*back=*/false);

  // The local experts: one GEMM pair per expert over its contiguous rows.
  const int64_t n_local = ctx.local_offsets[L];
  const bool swiglu = env_.config->activation == Activation::SwiGLU;
  const DType dt = x.dtype();
  ctx.pre = Tensor::empty({n_local, swiglu ? 2 * ffn_ : ffn_}, dt, x.device());
  ctx.act = Tensor::empty({n_local, ffn_}, dt, x.device());
  Tensor expert_out = Tensor::empty({n_local, h}, dt, x.device());
  for (std::size_t e = 0; e < L; ++e) {
    const int64_t off = ctx.local_offsets[e], n = ctx.local_offsets[e + 1] - off;
    if (n == 0) continue;
    Tensor pre = ctx.pre.narrow(0, off, n), act = ctx.act.narrow(0, off, n),
           out = expert_out.narrow(0, off, n);
    ops::gemm(ctx.expert_in.narrow(0, off, n), false, fc1[e].value, true, pre);
    if (swiglu)
      ops::swiglu_forward(pre, act);
    else
      ops::gelu_forward(pre, act);
    ops::gemm(act, false, fc2[e].value, true, out);
  }
  ctx.out_perm = dispatch(expert_out, ctx, ctx.counts, /*back=*/true);

  // Combine, weighted by the router probabilities, in fp32; written once in the activation dtype.
  Tensor y32 = Tensor::zeros({T, h}, DType::F32, x.device());
  {
    Tensor out32 = ctx.out_perm.to(DType::F32);
    const float* o = out32.data<float>();
    float* y = y32.data<float>();
    for (int64_t i = 0; i < N; ++i) {
      const int64_t a = ctx.perm[static_cast<std::size_t>(i)], t = a / k;
      const float w = probs[t * E + ctx.choice[static_cast<std::size_t>(a)]];
      for (int64_t c = 0; c < h; ++c) y[t * h + c] += w * o[i * h + c];
    }
  }
  Tensor y = y32.to(dt).view(x.shape());
  if (shared) {
    Tensor ys = shared->forward(x, ctx.shared);
    ops::add(y, ys, y);
  }
  return y;
}

Tensor MoELayer::backward_input(const Tensor& dy_in, Context& ctx) {
  const int64_t h = env_.hidden, E = experts_, k = topk_, T = ctx.tokens;
  const auto L = static_cast<std::size_t>(local_);
  Tensor dy = dy_in.contiguous();
  const DType dt = dy.dtype();
  Tensor dy32 = dy.view({T, h}).to(DType::F32);
  const float* g = dy32.data<float>();
  const float* probs = ctx.probs.data<float>();
  const int64_t N = static_cast<int64_t>(ctx.perm.size());

  // Combine backward: d(expert output) = w * dy, d(w) = <dy, expert output>.
  Tensor dprobs = Tensor::zeros({T, E}, DType::F32);
  float* dp = dprobs.data<float>();
  Tensor d_out32 = Tensor::empty({N, h}, DType::F32);
  {
    Tensor out32 = ctx.out_perm.to(DType::F32);
    const float* o = out32.data<float>();
    float* d = d_out32.data<float>();
    for (int64_t i = 0; i < N; ++i) {
      const int64_t a = ctx.perm[static_cast<std::size_t>(i)], t = a / k;
      const int32_t e = ctx.choice[static_cast<std::size_t>(a)];
      const float w = probs[t * E + e];
      double dot = 0;
      for (int64_t c = 0; c < h; ++c) {
        dot += static_cast<double>(g[t * h + c]) * o[i * h + c];
        d[i * h + c] = w * g[t * h + c];
      }
      dp[t * E + e] += static_cast<float>(dot);
    }
  }
  ctx.out_perm = Tensor();
  ctx.d_expert_out = dispatch(d_out32.to(dt), ctx, ctx.counts, /*back=*/false);

  // Experts' input step; the weight step needs d_expert_out and d_pre.
  const bool swiglu = env_.config->activation == Activation::SwiGLU;
  const int64_t n_local = ctx.local_offsets[L];
  ctx.d_pre = Tensor::empty(ctx.pre.shape(), dt);
  Tensor dx_local = Tensor::empty({n_local, h}, dt);
  for (std::size_t e = 0; e < L; ++e) {
    const int64_t off = ctx.local_offsets[e], n = ctx.local_offsets[e + 1] - off;
    if (n == 0) continue;
    Tensor du = Tensor::empty({n, ffn_}, dt);
    ops::gemm(ctx.d_expert_out.narrow(0, off, n), false, fc2[e].value, false, du);
    Tensor dpre = ctx.d_pre.narrow(0, off, n);
    if (swiglu)
      ops::swiglu_backward(du, ctx.pre.narrow(0, off, n), dpre);
    else
      ops::gelu_backward(du, ctx.pre.narrow(0, off, n), dpre);
    Tensor dxe = dx_local.narrow(0, off, n);
    ops::gemm(dpre, false, fc1[e].value, false, dxe);
  }
  ctx.pre = Tensor();
  Tensor dx_perm = dispatch(dx_local, ctx, ctx.counts, /*back=*/true).to(DType::F32);

  // Unpermute: each token sums its assignments' input gradients.
  Tensor dx32 = Tensor::zeros({T, h}, DType::F32);
  float* dx = dx32.data<float>();
  {
    const float* d = dx_perm.data<float>();
    for (int64_t i = 0; i < N; ++i) {
      const int64_t t = ctx.perm[static_cast<std::size_t>(i)] / k;
      for (int64_t c = 0; c < h; ++c) dx[t * h + c] += d[i * h + c];
    }
  }

  // Router: the losses' gradients, then the softmax backward, then through the logits' GEMM.
  const ModelConfig& c = *env_.config;
  const double tt = ctx.aux_tokens, scale = env_.moe_loss_scale;
  const double aux_g =
      c.moe_aux_loss_coeff * static_cast<double>(E) / (static_cast<double>(k) * tt * tt) * scale;
  const double z_g = c.moe_z_loss_coeff * 2.0 / tt * scale;
  Tensor dlogits = Tensor::empty({T, E}, DType::F32);
  float* dl = dlogits.data<float>();
  for (int64_t t = 0; t < T; ++t) {
    const float* pr = probs + t * E;
    float* dpr = dp + t * E;
    double inner = 0;
    for (int64_t e = 0; e < E; ++e) {
      dpr[e] += static_cast<float>(aux_g * ctx.aux_counts[static_cast<std::size_t>(e)]);
      inner += static_cast<double>(pr[e]) * dpr[e];
    }
    const double zt = z_g * ctx.lse[static_cast<std::size_t>(t)];
    for (int64_t e = 0; e < E; ++e) dl[t * E + e] = static_cast<float>(pr[e] * (dpr[e] - inner) + zt * pr[e]);
  }
  ctx.d_logits = dlogits.to(dt);
  Tensor dx_router = Tensor::empty({T, h}, dt);
  ops::gemm(ctx.d_logits, false, router.value, false, dx_router);
  Tensor dxr32 = dx_router.to(DType::F32);
  ops::add_(dx32, dxr32);
  Tensor dxo = dt == DType::F32 ? dx32 : dx32.to(dt);
  dxo = dxo.view(dy.shape());
  if (shared) {
    Tensor dxs = shared->backward_input(dy, ctx.shared);
    ops::add_(dxo, dxs);
  }
  return dxo;
}

void MoELayer::backward_weight(Context& ctx) {
  ops::gemm(ctx.d_logits, true, ctx.x, false, router.grad, 1.0f, 1.0f);
  for (std::size_t e = 0; e < static_cast<std::size_t>(local_); ++e) {
    const int64_t off = ctx.local_offsets[e], n = ctx.local_offsets[e + 1] - off;
    if (n == 0) continue;
    ops::gemm(ctx.d_expert_out.narrow(0, off, n), true, ctx.act.narrow(0, off, n), false, fc2[e].grad, 1.0f,
              1.0f);
    ops::gemm(ctx.d_pre.narrow(0, off, n), true, ctx.expert_in.narrow(0, off, n), false, fc1[e].grad, 1.0f,
              1.0f);
  }
  if (shared) shared->backward_weight(ctx.shared);
  ctx = Context{};
}

Tensor MoELayer::backward(const Tensor& dy, Context& ctx) {
  Tensor dx = backward_input(dy, ctx);
  backward_weight(ctx);
  return dx;
}

}  // namespace parallel::model
