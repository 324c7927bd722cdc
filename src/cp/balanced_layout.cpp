// The balanced cp layout and the load it balances (context_parallel.hpp: Layout, rank_load,
// balanced_layout). Host code: it reads the micro-batch's document starts, which the trainer has on
// the host before it slices the sequence.
#include <algorithm>
#include <numeric>

#include "parallel/context_parallel.hpp"
#include "parallel/error.hpp"

namespace parallel::cp {
namespace {

// The work of each query position: its visible keys (attention_mask.hpp), summed over the samples
// and the mix's layers.
std::vector<double> position_work(const Tensor& doc_start, int64_t seq, const std::vector<LayerMix>& mix) {
  const int32_t* ds = nullptr;
  int64_t b = 1;
  Tensor host;
  if (doc_start.defined()) {
    PARALLEL_CHECK(doc_start.dim() == 2 && doc_start.size(1) == seq && doc_start.dtype() == DType::I32 &&
                       doc_start.device().is_cpu(),
                   "context parallel layout: doc_start {} must be int32 [b, {}] on the host", doc_start.str(),
                   seq);
    host = doc_start.contiguous();
    ds = host.data<int32_t>();
    b = doc_start.size(0);
  }
  std::vector<double> work(static_cast<std::size_t>(seq), 0.0);
  for (const LayerMix& layer : mix) {
    AttentionBounds bounds;
    bounds.window = layer.window;
    bounds.doc_start = ds;
    bounds.doc_stride = seq;
    for (int64_t e = 0; e < b; ++e)
      for (int64_t p = 0; p < seq; ++p)
        work[static_cast<std::size_t>(p)] += layer.layers * static_cast<double>(p - bounds.lo(e, p) + 1);
  }
  return work;
}

// A layout whose largest load is within this factor of the mean counts as balanced; the zigzag is
// kept within the looser one (its few large calls against the many of fine granules).
constexpr double kBalanceTolerance = 1.02;
constexpr double kZigzagTolerance = 1.05;

std::vector<double> loads_of(const Layout& layout, const std::vector<double>& work) {
  std::vector<double> load(static_cast<std::size_t>(layout.cp_size()), 0.0);
  for (int r = 0; r < layout.cp_size(); ++r)
    for (const Segment& run : layout.runs(r))
      for (int64_t p = run.position; p < run.position + run.rows; ++p)
        load[static_cast<std::size_t>(r)] += work[static_cast<std::size_t>(p)];
  return load;
}

}  // namespace

std::vector<LayerMix> layer_mix(const ModelConfig& model) {
  std::vector<LayerMix> mix;
  for (int l = 0; l < model.num_layers; ++l) {
    const int64_t window = model.layer_window(l);
    auto it = std::find_if(mix.begin(), mix.end(), [&](const LayerMix& m) { return m.window == window; });
    if (it == mix.end())
      mix.push_back({window, 1.0});
    else
      it->layers += 1.0;
  }
  return mix;
}

bool uses_balanced_layout(const ParallelConfig& parallel, const ModelConfig& model, bool documents) {
  if (parallel.context <= 1) return false;
  switch (parallel.context_layout) {
    case ContextLayout::Zigzag:
      return false;
    case ContextLayout::Balanced:
      return true;
    case ContextLayout::Auto:
      break;
  }
  return parallel.context_comm != ContextComm::A2A && (documents || model.sliding_window > 0);
}

std::vector<double> rank_load(const Layout& layout, const Tensor& doc_start,
                              const std::vector<LayerMix>& mix) {
  return loads_of(layout, position_work(doc_start, layout.seq(), mix));
}

namespace {

// Granules of `granule` tokens over the ranks by their work: snake order of decreasing work (ties:
// the later granule first, which makes plain causal attention the zigzag of every 2c granules),
// then swaps between the most and the least loaded rank, each the one that brings the larger of
// the two loads down the most (each strictly lowers the sum of squared loads, so it ends).
struct Assignment {
  std::vector<std::vector<int64_t>> granules;
  double max_load = 0;
};
Assignment assign(const std::vector<double>& prefix, int64_t granule, int cp_size) {
  const int64_t n = static_cast<int64_t>(prefix.size() - 1) / granule;
  std::vector<double> w(static_cast<std::size_t>(n));
  for (int64_t g = 0; g < n; ++g)
    w[static_cast<std::size_t>(g)] =
        prefix[static_cast<std::size_t>((g + 1) * granule)] - prefix[static_cast<std::size_t>(g * granule)];
  std::vector<int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const double wa = w[static_cast<std::size_t>(a)], wb = w[static_cast<std::size_t>(b)];
    return wa != wb ? wa > wb : a > b;
  });
  Assignment out;
  std::vector<std::vector<int64_t>>& granules = out.granules;
  granules.resize(static_cast<std::size_t>(cp_size));
  std::vector<double> load(static_cast<std::size_t>(cp_size), 0.0);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t round = k / cp_size, at = k % cp_size;
    const auto r = static_cast<std::size_t>(round % 2 == 0 ? at : cp_size - 1 - at);
    granules[r].push_back(order[static_cast<std::size_t>(k)]);
    load[r] += w[static_cast<std::size_t>(order[static_cast<std::size_t>(k)])];
  }
  const auto work = [&](int64_t g) { return w[static_cast<std::size_t>(g)]; };
  for (int64_t iter = 0; iter < 8 * n; ++iter) {
    const auto hi = static_cast<std::size_t>(std::max_element(load.begin(), load.end()) - load.begin());
    const auto lo = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    const double gap = load[hi] - load[lo];
    double best = load[hi] - 1e-9 * load[hi];
    std::size_t ba = 0, bb = 0;
    bool found = false;
    for (std::size_t a = 0; a < granules[hi].size(); ++a)
      for (std::size_t b = 0; b < granules[lo].size(); ++b) {
        const double d = work(granules[hi][a]) - work(granules[lo][b]);
        if (d <= 0 || d >= gap) continue;
        const double top = std::max(load[hi] - d, load[lo] + d);
        if (top < best) {
          best = top;
          ba = a;
          bb = b;
          found = true;
        }
      }
    if (!found) break;
    const double d = work(granules[hi][ba]) - work(granules[lo][bb]);
    std::swap(granules[hi][ba], granules[lo][bb]);
    load[hi] -= d;
    load[lo] += d;
  }
  out.max_load = *std::max_element(load.begin(), load.end());
  return out;
}

}  // namespace

Layout balanced_layout(const Tensor& doc_start, int64_t seq, int cp_size, const std::vector<LayerMix>& mix,
                       int64_t min_granule) {
  Layout zigzag = Layout::zigzag(seq, cp_size);
  const bool windowed = std::any_of(mix.begin(), mix.end(), [](const LayerMix& m) { return m.window > 0; });
  if (cp_size == 1 || (!doc_start.defined() && !windowed)) return zigzag;
  const std::vector<double> work = position_work(doc_start, seq, mix);
  std::vector<double> prefix(work.size() + 1, 0.0);
  for (std::size_t p = 0; p < work.size(); ++p) prefix[p + 1] = prefix[p] + work[p];
  const double mean = prefix.back() / cp_size;
  const std::vector<double> zig = loads_of(zigzag, work);
  double best_max = *std::max_element(zig.begin(), zig.end());
  if (best_max <= kZigzagTolerance * mean) return zigzag;
  // The fewest granules that balance within the tolerance (fewer, larger attention calls), else
  // the best balance found; the zigzag unless that is better by more than the tolerance.
  std::vector<std::vector<int64_t>> best;
  int64_t best_granule = 0;
  for (int64_t m = 2; m <= 16; ++m) {
    if (seq % (2 * cp_size * m) != 0 || seq / (2 * cp_size * m) < min_granule) continue;
    const int64_t granule = seq / (2 * cp_size * m);
    Assignment a = assign(prefix, granule, cp_size);
    if (a.max_load * kBalanceTolerance < best_max) {
      best_max = a.max_load;
      best = std::move(a.granules);
      best_granule = granule;
    }
    if (best_max <= kBalanceTolerance * mean) break;
  }
  if (best.empty()) return zigzag;
  return Layout(seq, cp_size, best_granule, std::move(best));
}

}  // namespace parallel::cp
