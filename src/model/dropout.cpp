// Dropout sites of the GPT model. The mask of element (s, b, h) depends only on the run's seed, the
// site, the micro-batch and that element's GLOBAL position, so tp and sequence-parallel layouts, and
// recomputation in the backward, all draw the same mask.
#include "dropout.hpp"

#include "parallel/ops.hpp"

namespace parallel::model {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// One generator key per (seed, layer, site, micro-batch); the counter is the global element index.
uint64_t site_seed(const LayerEnv& env, DropoutSite where, uint64_t micro_batch) {
  uint64_t k = splitmix64(env.seed ^ 0x64726F706F7574ull);  // "dropout"
  k = splitmix64(k ^ static_cast<uint64_t>(static_cast<int64_t>(where.layer) + 1));
  k = splitmix64(k ^ static_cast<uint64_t>(where.site));
  return splitmix64(k ^ micro_batch);
}

// Applies `op(in_rows, out_rows, first_global_element)` to each run of rows of x [s_local, ...]
// whose global positions are consecutive (one run, or two under context parallelism).
template <typename Op>
void by_position(const LayerEnv& env, const cp::Layout* layout, const Tensor& in, Tensor& out, Op op) {
  const int64_t s_local = in.size(0);
  const int64_t row_elems = in.numel() / std::max<int64_t>(s_local, 1);
  for (const cp::Segment& seg : env.positions(s_local, layout)) {
    Tensor o = out.narrow(0, seg.row, seg.rows);
    op(in.narrow(0, seg.row, seg.rows), o, static_cast<uint64_t>(seg.position * row_elems));
  }
}

}  // namespace

Tensor dropout_forward(const LayerEnv& env, const Tensor& x, DropoutSite where, uint64_t micro_batch,
                       const cp::Layout* layout) {
  const float p = env.training ? static_cast<float>(env.config->dropout) : 0.0f;
  if (p == 0.0f) return x;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  const uint64_t seed = site_seed(env, where, micro_batch);
  by_position(env, layout, x, y, [&](const Tensor& in, Tensor& out, uint64_t offset) {
    ops::dropout_forward(in, out, p, seed, offset);
  });
  return y;
}

Tensor dropout_backward(const LayerEnv& env, const Tensor& dy, DropoutSite where, uint64_t micro_batch,
                        const cp::Layout* layout) {
  const float p = env.training ? static_cast<float>(env.config->dropout) : 0.0f;
  if (p == 0.0f) return dy;
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
  const uint64_t seed = site_seed(env, where, micro_batch);
  by_position(env, layout, dy, dx, [&](const Tensor& in, Tensor& out, uint64_t offset) {
    ops::dropout_backward(in, out, p, seed, offset);
  });
  return dx;
}

tp::LoraDropout lora_dropout(const LayerEnv& env, DropoutSite where, uint64_t micro_batch, int64_t s_local,
                             const cp::Layout* layout) {
  tp::LoraDropout drop;
  const double p = env.config->lora.dropout;
  if (!env.training || p == 0.0 || !env.config->lora.enabled()) return drop;
  drop.p = static_cast<float>(p);
  drop.seed = site_seed(env, where, micro_batch);
  // The linears see the whole local sequence (gathered along s under sequence parallelism).
  const bool sharded = env.sequence_parallel && env.tp->size() > 1;
  const int64_t rows = sharded ? s_local * env.tp->size() : s_local;
  const std::vector<cp::Segment> segs = layout != nullptr
                                            ? layout->segments(env.cp_rank(), 0, rows)
                                            : cp::segments(rows, env.cp_rank(), env.cp_size(), 0, rows);
  for (const cp::Segment& seg : segs) drop.runs.push_back({seg.row, seg.rows, seg.position});
  return drop;
}

std::vector<DropoutRun> dropout_runs(const LayerEnv& env, const Tensor& x, DropoutSite where,
                                     uint64_t micro_batch, const cp::Layout* layout) {
  const float p = env.training ? static_cast<float>(env.config->dropout) : 0.0f;
  const int64_t s_local = x.size(0);
  if (p == 0.0f) return {DropoutRun{0, s_local, {}}};
  const int64_t row_elems = x.numel() / std::max<int64_t>(s_local, 1);
  const uint64_t seed = site_seed(env, where, micro_batch);
  std::vector<DropoutRun> runs;
  for (const cp::Segment& seg : env.positions(s_local, layout))
    runs.push_back({seg.row, seg.rows, {p, seed, static_cast<uint64_t>(seg.position * row_elems)}});
  return runs;
}

void dropout_add(const LayerEnv& env, const Tensor& branch, const Tensor& residual, Tensor& out,
                 DropoutSite where, uint64_t micro_batch, const cp::Layout* layout) {
  for (const DropoutRun& run : dropout_runs(env, branch, where, micro_batch, layout)) {
    Tensor o = out.narrow(0, run.row, run.rows);
    ops::dropout_add(branch.narrow(0, run.row, run.rows), residual.narrow(0, run.row, run.rows), o, run.spec);
  }
}

}  // namespace parallel::model
