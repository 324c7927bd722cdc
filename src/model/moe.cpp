// A mixture-of-experts layer (moe_layer.hpp, MoELayer; docs/model.md "Mixture of experts").
//
//   logits = x R^T (fp32)           (choice, w) = route(logits)     (router.hpp: scores, top-k, weights)
//   y[t]   = sum_j w[t, j] * expert_{e_j}(x[t])  (+ shared_expert(x)[t])
//   aux, seq_aux, z: the router's balance and z losses (router.hpp)
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
// same way.
//
// Devices: the router GEMM runs where the activations are; its [T, E] fp32 logits (small) are read
// back to the host, where routing (softmax, top-k, capacity, the losses, the permutation and the
// counts) is host code on every device, as Megatron-Core also syncs the counts to the host. What
// touches activation rows runs on their device as ops (ops.hpp, "rows by index"), driven by int64
// index tensors built on the host: the permutation and the dispatch buffers are gathers, the
// weighted combine a gather-sum in fp32 written once in the activation dtype, and its backward a
// scaled gather (d expert output) and a row dot (d combine weight, read back for the router's
// softmax backward). So a layer forward and its backward each read one small tensor to the host.
//
// Tensor parallelism inside experts (etp, Megatron-Core's expert-tensor group): each rank holds
// rows [r F_l, (r+1) F_l) of fc1 (of gate and of up under SwiGLU, so the activation stays local)
// and the same columns of fc2. After the ep dispatch the etp ranks all-gather their rows (counts
// first, padded to the longest block), each computes its slice of the experts for all of them,
// and fc2's partial products are reduce-scattered back to the ranks the rows came from before the
// return dispatch: the column-/row-parallel pair of the dense MLP, with the gather and the reduce-
// scatter over etp instead of tp. The backward runs the same two collectives: dy gathered, the
// input gradient (a partial sum over fc1's slices) reduce-scattered. The allgather dispatcher
// composes the same way (ep gather, then etp gather), where Megatron gathers over etp x ep at once.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "moe_layer.hpp"
#include "parallel/layout_rules.hpp"
#include "parallel/ops.hpp"

namespace parallel::model {
namespace {

// A host index (or weight) vector as a tensor of `shape` on `device`, where the op that reads it runs.
template <typename T>
Tensor on_device(const std::vector<T>& v, Shape shape, Device device) {
  return Tensor::from_vector(v, shape).to(device);
}

// rows [R, h] -> out[i] = rows[index[i]] (a zero row where index[i] < 0), on rows' device.
Tensor gather_rows(const Tensor& rows, const std::vector<int64_t>& index, int64_t h) {
  const auto n = static_cast<int64_t>(index.size());
  Tensor out = Tensor::empty({n, h}, rows.dtype(), rows.device());
  ops::gather_rows(rows, on_device(index, {n}, rows.device()), out);
  return out;
}

// The gather that undoes `index` into `size` rows: out[index[i]] = rows[i], zero rows elsewhere
// (index holds distinct rows).
Tensor scatter_rows(const Tensor& rows, const std::vector<int64_t>& index, int64_t size, int64_t h) {
  std::vector<int64_t> from(static_cast<std::size_t>(size), -1);
  for (std::size_t i = 0; i < index.size(); ++i)
    from[static_cast<std::size_t>(index[i])] = static_cast<int64_t>(i);
  return gather_rows(rows, from, h);
}

// A device tensor's values for host code: one read (tensor.hpp, host_reads), counted on every device.
Tensor read_to_host(const Tensor& t) {
  count_host_read();
  return t.to(Device::cpu());
}

int ep_size(const LayerEnv& env) { return env.ep != nullptr ? env.ep->size() : 1; }
int ep_rank(const LayerEnv& env) { return env.ep != nullptr ? env.ep->rank() : 0; }
int etp_size(const LayerEnv& env) { return env.etp != nullptr ? env.etp->size() : 1; }
int etp_rank(const LayerEnv& env) { return env.etp != nullptr ? env.etp->rank() : 0; }

// This etp rank's slice of a [global_shape] expert weight, split along `dim` into etp parts.
Parameter expert_weight(const std::string& name, Shape global_shape, int dim, const LayerEnv& env,
                        const Tensor& value, const Tensor& grad) {
  Parameter p;
  p.name = name;
  p.value = value;
  p.grad = grad;
  p.global_shape = std::move(global_shape);
  p.partition_dim = dim;
  p.partition_offset = etp_rank(env) * value.size(dim);
  p.expert = true;
  return p;
}

}  // namespace

MoELayer::MoELayer(const LayerEnv& env, int layer) : gate(*env.config, layer), env_(env) {
  const ModelConfig& c = *env.config;
  experts_ = c.num_experts;
  topk_ = c.moe_router_topk;
  ffn_ = c.moe_ffn_hidden_size > 0 ? c.moe_ffn_hidden_size : env.ffn;
  const int p = ep_size(env);
  PARALLEL_CHECK(experts_ > 0, "MoELayer: a layer of {} experts", experts_);
  // Experts over ep, their width over etp, top-k, tp with sp (layout_rules.hpp).
  check_layout(c, env.layout());
  local_ = experts_ / p;
  ffn_local_ = ffn_ / etp_size(env);
  const std::string prefix = fmt::format("layers.{}.mlp", layer);
  router.name = prefix + ".router.weight";
  router.value = Tensor::zeros({experts_, env.hidden}, DType::F32, parameter_device());
  router.grad = parameter_grad({experts_, env.hidden});  // none when frozen (LoRA)
  router.global_shape = {experts_, env.hidden};
  router.sequence_parallel_grad = env.sequence_parallel;  // each tp rank routes its own s-shard
  // SwiGLU's gate and up are separate parameters split alike (as the dense MLP's under tp), so a
  // rank's slice of each is whole rows and the activation pairs them locally.
  const std::vector<const char*> parts = c.activation == Activation::SwiGLU
                                             ? std::vector<const char*>{"gate", "up"}
                                             : std::vector<const char*>{"fc1"};
  const int64_t h = env.hidden, fl = ffn_local_, np = static_cast<int64_t>(parts.size());
  for (int64_t i = 0; i < local_; ++i) {
    const int64_t global = ep_rank(env) * local_ + i;
    // Frozen (LoRA's base): no gradient tensors.
    Tensor w1 = Tensor::zeros({np * fl, h}, DType::F32, parameter_device()),
           g1 = parameter_grad({np * fl, h});
    std::vector<Parameter>& f1 = fc1.emplace_back();
    for (int64_t j = 0; j < np; ++j)
      f1.push_back(expert_weight(fmt::format("{}.experts.{}.{}.weight", prefix, global, parts[j]), {ffn_, h},
                                 0, env, w1.narrow(0, j * fl, fl),
                                 g1.defined() ? g1.narrow(0, j * fl, fl) : Tensor()));
    fc2.push_back(expert_weight(fmt::format("{}.experts.{}.fc2.weight", prefix, global), {h, ffn_}, 1, env,
                                Tensor::zeros({h, fl}, DType::F32, parameter_device()),
                                parameter_grad({h, fl})));
  }
  if (c.lora.enabled()) {
    // LoRA adapters on the experts (docs/lora.md, "Experts"), sharded over etp as the base weights.
    lora_rank_ = c.lora.rank;
    lora_scale_ = static_cast<float>(c.lora.scale());
    for (int64_t j = 0; j < np; ++j)
      if (c.lora_targets(parts[j])) lora_rows_.push_back(j * fl);
    lora_fc2_ = c.lora_targets("fc2");
    const int64_t r = lora_rank_, pairs = static_cast<int64_t>(lora_rows_.size());
    const int64_t offset = etp_rank(env) * fl;
    for (int64_t i = 0; i < local_; ++i) {
      const std::string expert = fmt::format("{}.experts.{}", prefix, ep_rank(env) * local_ + i);
      std::vector<Parameter>& a1 = lora_a1.emplace_back();
      std::vector<Parameter>& b1 = lora_b1.emplace_back();
      if (pairs > 0) {
        Tensor a_value = Tensor::zeros({pairs * r, h}, DType::F32, parameter_device()),
               a_grad = Tensor::zeros({pairs * r, h}, DType::F32, parameter_device());
        for (int64_t jj = 0; jj < pairs; ++jj) {
          const std::string part = expert + "." + parts[lora_rows_[static_cast<std::size_t>(jj)] / fl];
          Parameter a;
          a.name = part + ".lora_A.weight";
          a.value = a_value.narrow(0, jj * r, r);
          a.grad = a_grad.narrow(0, jj * r, r);
          a.global_shape = {r, h};
          a.expert = true;
          a1.push_back(std::move(a));
          Parameter b = tp::lora::make_b(part, fl, ffn_, offset, r);
          b.expert = true;
          b1.push_back(std::move(b));
        }
      }
      if (lora_fc2_) {
        Parameter a = tp::lora::make_a(expert + ".fc2", r, fl, ffn_, offset);
        Parameter b = tp::lora::make_b(expert + ".fc2", h, h, 0, r);
        a.expert = b.expert = true;
        lora_a2.push_back(std::move(a));
        lora_b2.push_back(std::move(b));
      }
    }
  }
  // An expert's gradient here sums the tokens of this rank's etp x ep block only (under sequence
  // parallelism each rank routes just its shard): the expert-dp reduction adds the others'.
  if (c.moe_shared_expert_ffn_hidden_size > 0)
    shared = std::make_unique<MLP>(env, prefix + ".shared_expert", c.moe_shared_expert_ffn_hidden_size);
  stats_.tokens_per_expert.assign(static_cast<std::size_t>(experts_), 0);
}

std::vector<Parameter*> MoELayer::parameters() {
  std::vector<Parameter*> out{&router};
  if (shared)
    for (Parameter* p : shared->parameters()) out.push_back(p);
  for (int64_t i = 0; i < local_; ++i) {
    const auto e = static_cast<std::size_t>(i);
    for (Parameter& part : fc1[e]) out.push_back(&part);
    out.push_back(&fc2[e]);
    if (!lora_a1.empty())
      for (std::size_t j = 0; j < lora_a1[e].size(); ++j) {
        out.push_back(&lora_a1[e][j]);
        out.push_back(&lora_b1[e][j]);
      }
    if (lora_fc2_) {
      out.push_back(&lora_a2[e]);
      out.push_back(&lora_b2[e]);
    }
  }
  return out;
}

Tensor MoELayer::lora_blocks(std::size_t e) const {
  const int64_t r = lora_rank_, pairs = static_cast<int64_t>(lora_rows_.size());
  const Tensor& first = lora_b1[e].front().value;
  const int64_t rows = static_cast<int64_t>(fc1[e].size()) * ffn_local_;
  Tensor blocks = Tensor::zeros({rows, pairs * r}, first.dtype(), first.device());
  for (int64_t j = 0; j < pairs; ++j) {
    Tensor slot = blocks.narrow(0, lora_rows_[static_cast<std::size_t>(j)], ffn_local_).narrow(1, j * r, r);
    slot.copy_(lora_b1[e][static_cast<std::size_t>(j)].value);
  }
  return blocks;
}

// dA1 = dh1ᵀ x and dB2 = scale dyᵀ h2 are partial sums over etp (dh1 and h2 cover this rank's slice
// of the inner width only): they go through one buffer and one all-reduce over etp per layer. dB1
// and dA2 are exact (this rank's rows / columns).
void MoELayer::lora_backward_weight(Context& ctx) {
  const int64_t r = lora_rank_, h = env_.hidden, pairs = static_cast<int64_t>(lora_rows_.size());
  const int64_t a1_size = pairs * r * h, per = a1_size + (lora_fc2_ ? h * r : 0);
  if (per == 0) return;
  const Device dev = ctx.expert_in.device();
  Tensor partial = Tensor::zeros({local_ * per}, DType::F32, dev);
  for (std::size_t e = 0; e < static_cast<std::size_t>(local_); ++e) {
    const int64_t off = ctx.local_offsets[e], n = ctx.local_offsets[e + 1] - off;
    if (n == 0) continue;
    const int64_t at = static_cast<int64_t>(e) * per;
    if (pairs > 0) {
      Tensor da1 = partial.narrow(0, at, a1_size).view({pairs * r, h});
      ops::gemm(ctx.lora_dh1.narrow(0, off, n), true, ctx.expert_in.narrow(0, off, n), false, da1);
      Tensor db = Tensor::empty({ctx.d_pre.size(1), pairs * r}, DType::F32, dev);
      ops::gemm(ctx.d_pre.narrow(0, off, n), true, ctx.lora_h1.narrow(0, off, n), false, db, lora_scale_,
                0.0f);
      for (std::size_t j = 0; j < lora_rows_.size(); ++j) {
        Parameter& b = lora_b1[e][j];
        ops::add_(
            b.grad,
            db.narrow(0, lora_rows_[j], ffn_local_).narrow(1, static_cast<int64_t>(j) * r, r).contiguous());
      }
    }
    if (lora_fc2_) {
      Tensor db2 = partial.narrow(0, at + a1_size, h * r).view({h, r});
      ops::gemm(ctx.d_expert_out.narrow(0, off, n), true, ctx.lora_h2.narrow(0, off, n), false, db2,
                lora_scale_, 0.0f);
      ops::gemm(ctx.lora_dh2.narrow(0, off, n), true, ctx.act.narrow(0, off, n), false, lora_a2[e].grad, 1.0f,
                1.0f);
    }
  }
  if (etp_size(env_) > 1) env_.etp->all_reduce(partial);
  for (std::size_t e = 0; e < static_cast<std::size_t>(local_); ++e) {
    const int64_t at = static_cast<int64_t>(e) * per;
    if (pairs > 0) {
      Tensor a_grad = fused_rows(lora_a1[e], &Parameter::grad, "MoELayer");
      ops::add_(a_grad, partial.narrow(0, at, a1_size).view({pairs * r, h}));
    }
    if (lora_fc2_) ops::add_(lora_b2[e].grad, partial.narrow(0, at + a1_size, h * r).view({h, r}));
  }
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
  Tensor all = scatter_rows(rows, index, width * p, h).to(DType::F32);
  Tensor mine = Tensor::empty({width, h}, DType::F32, rows.device());
  env_.ep->reduce_scatter(all, mine);
  return mine.narrow(0, 0, block[me]).to(rows.dtype());
}

Tensor MoELayer::gather_over_etp(const Tensor& rows, const Context& ctx) const {
  if (etp_size(env_) == 1) return rows;
  const int64_t h = env_.hidden, t = etp_size(env_);
  Tensor mine = Tensor::zeros({ctx.etp_width, h}, rows.dtype(), rows.device());
  if (rows.size(0) > 0) mine.narrow(0, 0, rows.size(0)).copy_(rows);
  Tensor all = Tensor::empty({ctx.etp_width * t, h}, rows.dtype(), rows.device());
  env_.etp->all_gather(mine, all);
  return gather_rows(all, ctx.etp_index, h);
}

Tensor MoELayer::reduce_scatter_over_etp(const Tensor& rows, const Context& ctx) const {
  if (etp_size(env_) == 1) return rows;
  const int64_t h = env_.hidden, t = etp_size(env_);
  // Each gathered row back at its padded place; the padding stays zero.
  Tensor all = scatter_rows(rows, ctx.etp_index, ctx.etp_width * t, h);
  Tensor mine = Tensor::empty({ctx.etp_width, h}, rows.dtype(), rows.device());
  env_.etp->reduce_scatter(all, mine);
  const auto L = static_cast<std::size_t>(local_), me = static_cast<std::size_t>(etp_rank(env_));
  int64_t n = 0;
  for (std::size_t e = 0; e < L; ++e) n += ctx.etp_counts[me * L + e];
  return mine.narrow(0, 0, n);
}

Tensor MoELayer::forward(const Tensor& x_in, Context& ctx, bool record_stats) {
  const int64_t h = env_.hidden, E = experts_, k = topk_;
  const auto Es = static_cast<std::size_t>(E);
  Tensor x = x_in.contiguous();
  const int64_t T = x.numel() / h;
  Tensor xr = x.view({T, h});
  ctx = Context{};
  ctx.tokens = T;
  ctx.x = xr;

  // Router: fp32 logits read back, routed on the host (router.hpp). A meta run (meta.hpp) has no
  // logits: its stated assumption is balanced routing, token t's j-th choice expert (t k + j) mod E,
  // so each expert receives T k / E of this rank's assignments and, as every rank of a layer sees
  // the same number of tokens, every rank routes alike: what a rank receives from a peer is what it
  // sends it.
  Tensor logits = Tensor::empty({T, E}, DType::F32, x.device());
  ops::gemm(xr, false, router.value, true, logits);
  const bool meta = x.device().is_meta();
  const int64_t sequences = x.dim() == 3 ? x.size(1) : 1;  // [s, b, h]: token t is in sequence t % b
  if (meta)
    gate.route_balanced(T, sequences, ctx.routing);
  else
    gate.route(read_to_host(logits).data<float>(), T, sequences, ctx.routing);
  const std::vector<int32_t>& choice = ctx.routing.choice;

  // Capacity (local tokens, first come first kept in token order) and the permutation by expert.
  std::vector<int64_t> assigned(Es, 0);
  for (int32_t e : choice) ++assigned[static_cast<std::size_t>(e)];
  const double cf = env_.config->moe_capacity_factor;
  const int64_t capacity =
      cf > 0 ? static_cast<int64_t>(std::ceil(cf * static_cast<double>(T * k) / static_cast<double>(E)))
             : T * k;
  ctx.counts.assign(Es, 0);
  std::vector<char> kept(static_cast<std::size_t>(T * k), 0);
  int64_t dropped = 0;
  for (std::size_t a = 0; a < kept.size(); ++a) {
    auto& c = ctx.counts[static_cast<std::size_t>(choice[a])];
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
        ctx.perm[static_cast<std::size_t>(fill[static_cast<std::size_t>(choice[a])]++)] =
            static_cast<int64_t>(a);
  }

  // The losses' statistics, over the sequences' other shards: the tp ranks under sequence
  // parallelism, and the cp ranks.
  ctx.routing_stats = gate.statistics(ctx.routing);
  for (Communicator* group : {env_.sequence_parallel ? env_.tp : nullptr, env_.cp}) {
    if (group == nullptr || group->size() == 1) continue;
    Tensor s = Tensor::from_vector(ctx.routing_stats, {static_cast<int64_t>(ctx.routing_stats.size())});
    group->all_reduce(s);
    ctx.routing_stats = s.to_float_vector();
  }
  if (record_stats && env_.training) {
    const Router::Losses l = gate.losses(ctx.routing_stats, sequences);
    stats_.aux_loss += l.aux;
    stats_.seq_aux_loss += l.seq_aux;
    stats_.z_loss += l.z;
    for (std::size_t e = 0; e < Es; ++e) stats_.tokens_per_expert[e] += assigned[e];
    stats_.dropped += dropped;
    ++stats_.calls;
    gate.count_load(ctx.routing);
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
    if (meta)  // every rank routes alike: rank i sends this rank what this rank sends i
      for (std::size_t i = 0; i < P; ++i)
        for (std::size_t e = 0; e < L; ++e)
          ctx.recv_counts[i * L + e] = ctx.counts[static_cast<std::size_t>(ep_rank(env_)) * L + e];
  } else {
    Tensor send = Tensor::from_vector(std::vector<int64_t>(ctx.counts), {E});
    Tensor all = Tensor::empty({E * p}, DType::I64);
    env_.ep->all_gather(send, all);
    const int64_t* a = all.data<int64_t>();
    ctx.all_counts.assign(a, a + E * p);
    if (meta)  // every rank routes alike
      for (std::size_t r = 0; r < P; ++r)
        std::copy(ctx.counts.begin(), ctx.counts.end(),
                  ctx.all_counts.begin() + static_cast<std::ptrdiff_t>(r * Es));
    ctx.recv_counts.assign(P * L, 0);
    const std::size_t me = static_cast<std::size_t>(ep_rank(env_));
    for (std::size_t r = 0; r < P; ++r)
      for (std::size_t e = 0; e < L; ++e) ctx.recv_counts[r * L + e] = ctx.all_counts[r * P * L + me * L + e];
  }
  // Rows per local expert after the ep dispatch; under etp, every etp rank's, which the experts'
  // slices all compute on: gathered row (expert e, etp rank q, i) comes from row i of q's block e.
  std::vector<int64_t> mine(L, 0);
  for (std::size_t e = 0; e < L; ++e)
    for (std::size_t r = 0; r < P; ++r) mine[e] += ctx.recv_counts[r * L + e];
  const auto Tp = static_cast<std::size_t>(etp_size(env_));
  if (Tp == 1) {
    ctx.etp_counts = mine;
  } else {
    Tensor send = Tensor::from_vector(mine, {local_});
    Tensor all = Tensor::empty({local_ * static_cast<int64_t>(Tp)}, DType::I64);
    env_.etp->all_gather(send, all);
    const int64_t* a = all.data<int64_t>();
    ctx.etp_counts.assign(a, a + local_ * static_cast<int64_t>(Tp));
    if (meta)  // every rank routes alike
      for (std::size_t q = 0; q < Tp; ++q)
        std::copy(mine.begin(), mine.end(), ctx.etp_counts.begin() + static_cast<std::ptrdiff_t>(q * L));
  }
  ctx.local_offsets.assign(L + 1, 0);
  for (std::size_t e = 0; e < L; ++e) {
    int64_t n = 0;
    for (std::size_t q = 0; q < Tp; ++q) n += ctx.etp_counts[q * L + e];
    ctx.local_offsets[e + 1] = ctx.local_offsets[e] + n;
  }
  if (Tp > 1) {
    std::vector<int64_t> block(Tp, 0);
    for (std::size_t q = 0; q < Tp; ++q)
      for (std::size_t e = 0; e < L; ++e) block[q] += ctx.etp_counts[q * L + e];
    ctx.etp_width = *std::max_element(block.begin(), block.end());
    ctx.etp_index.assign(static_cast<std::size_t>(ctx.local_offsets[L]), 0);
    std::vector<int64_t> fill(ctx.local_offsets.begin(), ctx.local_offsets.end() - 1);
    for (std::size_t q = 0; q < Tp; ++q) {
      int64_t at = static_cast<int64_t>(q) * ctx.etp_width;
      for (std::size_t e = 0; e < L; ++e)
        for (int64_t i = 0; i < ctx.etp_counts[q * L + e]; ++i)
          ctx.etp_index[static_cast<std::size_t>(fill[e]++)] = at++;
    }
  }
  ctx.expert_in = gather_over_etp(dispatch(x_perm, ctx, ctx.counts, /*back=*/false), ctx);

  // The local experts: one GEMM pair per expert over its contiguous rows.
  const int64_t n_local = ctx.local_offsets[L];
  const bool swiglu = env_.config->activation == Activation::SwiGLU;
  const DType dt = x.dtype();
  ctx.pre = Tensor::empty({n_local, swiglu ? 2 * ffn_local_ : ffn_local_}, dt, x.device());
  ctx.act = Tensor::empty({n_local, ffn_local_}, dt, x.device());
  Tensor expert_out = Tensor::empty({n_local, h}, dt, x.device());
  const int64_t lora_pairs = static_cast<int64_t>(lora_rows_.size());
  if (lora_pairs > 0) ctx.lora_h1 = Tensor::empty({n_local, lora_pairs * lora_rank_}, dt, x.device());
  if (lora_fc2_) ctx.lora_h2 = Tensor::empty({n_local, lora_rank_}, dt, x.device());
  for (std::size_t e = 0; e < L; ++e) {
    const int64_t off = ctx.local_offsets[e], n = ctx.local_offsets[e + 1] - off;
    if (n == 0) continue;
    Tensor pre = ctx.pre.narrow(0, off, n), act = ctx.act.narrow(0, off, n),
           out = expert_out.narrow(0, off, n);
    ops::gemm(ctx.expert_in.narrow(0, off, n), false, fused_rows(fc1[e], &Parameter::value, "MoELayer"), true,
              pre);
    if (lora_pairs > 0) {  // pre += scale (x A1ᵀ) B1ᵀ, B1 block-diagonal over the adapted parts
      Tensor h1 = ctx.lora_h1.narrow(0, off, n);
      ops::gemm(ctx.expert_in.narrow(0, off, n), false, fused_rows(lora_a1[e], &Parameter::value, "MoELayer"),
                true, h1);
      ops::gemm(h1, false, lora_blocks(e), true, pre, lora_scale_, 1.0f);
    }
    if (swiglu)
      ops::swiglu_forward(pre, act);
    else
      ops::gelu_forward(pre, act);
    ops::gemm(act, false, fc2[e].value, true, out);
    if (lora_fc2_) {  // out += scale (act A2ᵀ) B2ᵀ: a partial sum over etp, reduced with the base's
      Tensor h2 = ctx.lora_h2.narrow(0, off, n);
      ops::gemm(act, false, lora_a2[e].value, true, h2);
      ops::gemm(h2, false, lora_b2[e].value, true, out, lora_scale_, 1.0f);
    }
  }
  ctx.out_perm = dispatch(reduce_scatter_over_etp(expert_out, ctx), ctx, ctx.counts, /*back=*/true);

  // Combine, weighted by the router probabilities, in fp32; written once in the activation dtype.
  // Each token sums its kept assignments' rows in permuted order.
  ctx.token_rows.assign(static_cast<std::size_t>(T * k), -1);
  std::vector<float> weight(static_cast<std::size_t>(T * k), 0.0f);
  {
    std::vector<int64_t> used(static_cast<std::size_t>(T), 0);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t a = ctx.perm[static_cast<std::size_t>(i)], t = a / k;
      const auto slot = static_cast<std::size_t>(t * k + used[static_cast<std::size_t>(t)]++);
      ctx.token_rows[slot] = i;
      weight[slot] = ctx.routing.weight[static_cast<std::size_t>(a)];
    }
  }
  Tensor y = Tensor::empty({T, h}, dt, x.device());
  ops::gather_sum_rows(ctx.out_perm, on_device(ctx.token_rows, {T, k}, x.device()),
                       on_device(weight, {T, k}, x.device()), y);
  y = y.view(x.shape());
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
  const Device dev = dy.device();
  Tensor dyr = dy.view({T, h});
  const int64_t N = static_cast<int64_t>(ctx.perm.size());

  // Combine backward: d(expert output) = w * dy, d(w) = <dy, expert output>, per permuted row.
  std::vector<int64_t> row_token(static_cast<std::size_t>(N));
  std::vector<float> row_weight(static_cast<std::size_t>(N));
  for (std::size_t i = 0; i < row_token.size(); ++i) {
    const int64_t a = ctx.perm[i], t = a / k;
    row_token[i] = t;
    row_weight[i] = ctx.routing.weight[static_cast<std::size_t>(a)];
  }
  Tensor token = on_device(row_token, {N}, dev);
  Tensor d_out = Tensor::empty({N, h}, dt, dev);
  ops::gather_rows_scaled(dyr, token, on_device(row_weight, {N}, dev), d_out);
  Tensor dots = Tensor::empty({N}, DType::F32, dev);
  ops::row_dot(ctx.out_perm, dyr, token, dots);
  // Meta: no values; the router's gradient is shapes only (its values are never read).
  dots = dev.is_meta() ? Tensor::zeros({N}, DType::F32) : read_to_host(dots);
  std::vector<float> dweight(static_cast<std::size_t>(T * k), 0.0f);  // dropped assignments: 0
  for (std::size_t i = 0; i < row_token.size(); ++i)
    dweight[static_cast<std::size_t>(ctx.perm[i])] = dots.data<float>()[i];
  ctx.out_perm = Tensor();
  ctx.d_expert_out = gather_over_etp(dispatch(d_out, ctx, ctx.counts, /*back=*/false), ctx);
  d_out = Tensor();  // freed here unless it is d_expert_out itself (ep = etp = 1)

  // Experts' input step; the weight step needs d_expert_out and d_pre.
  const bool swiglu = env_.config->activation == Activation::SwiGLU;
  const int64_t n_local = ctx.local_offsets[L];
  ctx.d_pre = Tensor::empty(ctx.pre.shape(), dt, dev);
  Tensor dx_local = Tensor::empty({n_local, h}, dt, dev);
  const int64_t lora_pairs = static_cast<int64_t>(lora_rows_.size());
  if (lora_pairs > 0) ctx.lora_dh1 = Tensor::empty({n_local, lora_pairs * lora_rank_}, dt, dev);
  if (lora_fc2_) ctx.lora_dh2 = Tensor::empty({n_local, lora_rank_}, dt, dev);
  for (std::size_t e = 0; e < L; ++e) {
    const int64_t off = ctx.local_offsets[e], n = ctx.local_offsets[e + 1] - off;
    if (n == 0) continue;
    Tensor du = Tensor::empty({n, ffn_local_}, dt, dev);
    ops::gemm(ctx.d_expert_out.narrow(0, off, n), false, fc2[e].value, false, du);
    if (lora_fc2_) {  // du += (scale dy B2) A2; dh2 is whole on every etp rank
      Tensor dh2 = ctx.lora_dh2.narrow(0, off, n);
      ops::gemm(ctx.d_expert_out.narrow(0, off, n), false, lora_b2[e].value, false, dh2, lora_scale_, 0.0f);
      ops::gemm(dh2, false, lora_a2[e].value, false, du, 1.0f, 1.0f);
    }
    Tensor dpre = ctx.d_pre.narrow(0, off, n);
    if (swiglu)
      ops::swiglu_backward(du, ctx.pre.narrow(0, off, n), dpre);
    else
      ops::gelu_backward(du, ctx.pre.narrow(0, off, n), dpre);
    Tensor dxe = dx_local.narrow(0, off, n);
    ops::gemm(dpre, false, fused_rows(fc1[e], &Parameter::value, "MoELayer"), false, dxe);
    if (lora_pairs > 0) {  // dx += (scale dpre B1) A1: partial over etp, as dx is (reduce-scattered below)
      Tensor dh1 = ctx.lora_dh1.narrow(0, off, n);
      ops::gemm(dpre, false, lora_blocks(e), false, dh1, lora_scale_, 0.0f);
      ops::gemm(dh1, false, fused_rows(lora_a1[e], &Parameter::value, "MoELayer"), false, dxe, 1.0f, 1.0f);
    }
  }
  ctx.pre = Tensor();
  Tensor dx_perm = dispatch(reduce_scatter_over_etp(dx_local, ctx), ctx, ctx.counts, /*back=*/true);

  // Unpermute: each token sums its assignments' input gradients, in fp32, in permuted order.
  Tensor dx32 = Tensor::empty({T, h}, DType::F32, dev);
  ops::gather_sum_rows(dx_perm, on_device(ctx.token_rows, {T, k}, dev), Tensor(), dx32);
  dx_perm = Tensor();

  // Router: the combine weights' and the losses' gradients through the routing (router.hpp), then
  // through the logits' GEMM.
  Tensor dlogits = Tensor::from_vector(
      gate.backward(ctx.routing, dweight, ctx.routing_stats, env_.moe_loss_scale), {T, E});
  ctx.d_logits = dlogits.to(dt).to(dev);
  Tensor dx_router = Tensor::empty({T, h}, dt, dev);
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
  if (!router.frozen) ops::gemm(ctx.d_logits, true, ctx.x, false, router.grad, 1.0f, 1.0f);
  for (std::size_t e = 0; e < static_cast<std::size_t>(local_); ++e) {
    const int64_t off = ctx.local_offsets[e], n = ctx.local_offsets[e + 1] - off;
    if (n == 0 || fc2[e].frozen) continue;  // LoRA: the base experts are frozen
    ops::gemm(ctx.d_expert_out.narrow(0, off, n), true, ctx.act.narrow(0, off, n), false, fc2[e].grad, 1.0f,
              1.0f);
    Tensor g1 = fused_rows(fc1[e], &Parameter::grad, "MoELayer");
    ops::gemm(ctx.d_pre.narrow(0, off, n), true, ctx.expert_in.narrow(0, off, n), false, g1, 1.0f, 1.0f);
  }
  lora_backward_weight(ctx);
  if (shared) shared->backward_weight(ctx.shared);
  ctx = Context{};
}

Tensor MoELayer::backward(const Tensor& dy, Context& ctx) {
  Tensor dx = backward_input(dy, ctx);
  backward_weight(ctx);
  return dx;
}

}  // namespace parallel::model
