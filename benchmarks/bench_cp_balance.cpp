// Load balance of context parallelism over packed documents (parallel.context_layout;
// include/parallel/context_parallel.hpp): for sequences packed from documents of a long-tailed
// length distribution, the attention work of each cp rank (visible (query, key) pairs of its
// queries, cp::rank_load) under the zigzag and the balanced layout, as max / mean over the ranks,
// and the fraction of ring blocks (rank pairs) that ring attention skips because no query of one
// sees a key of the other (cp::block_calls). Counting only, no attention is run: one process.
//
//   ./bin/bench_cp_balance [--text FILE] [--samples N]
//
// Distributions: lognormal lengths (median 512 tokens, sigma 1.5: a web-text-like tail); with
// --text, the paragraphs (blank-line separated) of a real text as byte-level documents (the Jargon
// File: zcat /usr/share/doc/jargon-text/jargon.txt.gz > jargon.txt); and one long document (half
// the sequence) among short ones (lognormal median 128). Samples are windows over the concatenated
// documents (each ending with its eod), as the GPT dataset cuts them, micro-batch size 1.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "parallel/context_parallel.hpp"

namespace parallel {
namespace {

struct Stats {
  double mean_ratio = 0, worst_ratio = 0, skipped = 0, calls = 0;
};

// doc_start [1, S] of the window [offset, offset + S) over documents of `lengths` laid end to end.
Tensor window_doc_start(const std::vector<int64_t>& starts, int64_t offset, int64_t S) {
  Tensor ds = Tensor::empty({1, S}, DType::I32);
  int32_t* out = ds.data<int32_t>();
  auto it = std::upper_bound(starts.begin(), starts.end(), offset);
  int64_t start = *(it - 1);
  for (int64_t p = 0; p < S; ++p) {
    while (it != starts.end() && *it <= offset + p) start = *it++;
    out[p] = static_cast<int32_t>(std::max<int64_t>(start - offset, 0));
  }
  return ds;
}

Stats measure(const std::vector<Tensor>& samples, int64_t S, int c, bool balanced, int64_t window) {
  Stats st;
  const std::vector<cp::LayerMix> mix{{window, 1.0}};
  for (const Tensor& ds : samples) {
    const Tensor docs = window > 0 && !ds.defined() ? Tensor() : ds;
    const cp::Layout layout = balanced ? cp::balanced_layout(docs, S, c, mix) : cp::Layout::zigzag(S, c);
    const std::vector<double> load = cp::rank_load(layout, docs, mix);
    double mean = 0, top = 0;
    for (double l : load) {
      mean += l / c;
      top = std::max(top, l);
    }
    st.mean_ratio += top / mean / static_cast<double>(samples.size());
    st.worst_ratio = std::max(st.worst_ratio, top / mean);
    int64_t skipped = 0, calls = 0;
    for (int i = 0; i < c; ++i)
      for (int j = 0; j < c; ++j) {
        const auto blk = cp::block_calls(layout, i, j, window, docs);
        skipped += blk.empty();
        calls += static_cast<int64_t>(blk.size());
      }
    st.skipped += static_cast<double>(skipped) / (c * c) / static_cast<double>(samples.size());
    st.calls += static_cast<double>(calls) / c / static_cast<double>(samples.size());
  }
  return st;
}

std::vector<int64_t> starts_of(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> starts{0};
  for (int64_t n : lengths) starts.push_back(starts.back() + n);
  return starts;
}

void report(const char* name, const std::vector<int64_t>& lengths, int samples, int64_t window) {
  const std::vector<int64_t> starts = starts_of(lengths);
  for (int64_t S : {4096, 8192, 16384, 32768}) {
    std::vector<Tensor> windows;
    for (int k = 0; k < samples; ++k) {
      const int64_t offset = static_cast<int64_t>(k) * S;
      if (offset + S > starts.back()) break;
      windows.push_back(
          window > 0 && std::string(name) == "no documents" ? Tensor() : window_doc_start(starts, offset, S));
    }
    for (int c : {2, 4, 8}) {
      const Stats z = measure(windows, S, c, false, window), b = measure(windows, S, c, true, window);
      std::printf("| %s | %lld | %d | %.3f (%.3f) | %.3f (%.3f) | %.2f | %.2f | %.1f | %.1f |\n", name,
                  static_cast<long long>(S), c, z.mean_ratio, z.worst_ratio, b.mean_ratio, b.worst_ratio,
                  z.skipped, b.skipped, z.calls, b.calls);
    }
  }
}

std::vector<int64_t> lognormal(double median, double sigma, int64_t total, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::lognormal_distribution<double> dist(std::log(median), sigma);
  std::vector<int64_t> lengths;
  int64_t sum = 0;
  while (sum < total) {
    const int64_t n = std::max<int64_t>(2, std::llround(dist(gen)));
    lengths.push_back(n);
    sum += n;
  }
  return lengths;
}

}  // namespace
}  // namespace parallel

int main(int argc, char** argv) {
  using namespace parallel;
  std::string text;
  int samples = 32;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--text") text = argv[i + 1];
    if (std::string(argv[i]) == "--samples") samples = std::atoi(argv[i + 1]);
  }
  const int64_t total = static_cast<int64_t>(samples) * 32768 + 32768;
  std::printf(
      "max / mean attention load over cp ranks, mean over %d samples (worst in brackets); ring blocks "
      "skipped; attention calls per rank per layer (forward)\n\n",
      samples);
  std::printf(
      "| documents | seq | cp | zigzag | balanced | skipped zigzag | skipped balanced | calls zigzag | "
      "calls balanced |\n|---|---|---|---|---|---|---|---|---|\n");
  report("lognormal 512", lognormal(512, 1.5, total, 1), samples, 0);
  if (!text.empty()) {
    std::ifstream in(text);
    std::vector<int64_t> lengths;
    std::string line;
    int64_t n = 0, sum = 0;
    while (sum < total && std::getline(in, line)) {
      if (line.empty()) {
        if (n > 0) lengths.push_back(n + 1), sum += n + 1;
        n = 0;
      } else {
        n += static_cast<int64_t>(line.size()) + 1;
      }
    }
    while (sum < total && !lengths.empty()) {  // the text again, to fill every sample
      const std::size_t k = lengths.size();
      for (std::size_t i = 0; i < k && sum < total; ++i) lengths.push_back(lengths[i]), sum += lengths[i];
    }
    report("text paragraphs", lengths, samples, 0);
  }
  // One long document (half of each sample) among short ones: the zigzag's worst case.
  for (int64_t S : {4096, 8192, 16384, 32768}) {
    std::vector<int64_t> lengths;
    for (int k = 0; k < samples; ++k) {
      std::vector<int64_t> shorts = lognormal(128, 1.0, S / 2, 100 + k);
      int64_t sum = 0;
      for (int64_t& x : shorts) {
        x = std::min(x, S / 2 - sum);
        sum += x;
        if (x > 0) lengths.push_back(x);
        if (sum == S / 2) break;
      }
      lengths.push_back(S / 2);
    }
    const std::vector<int64_t> starts = starts_of(lengths);
    std::vector<Tensor> windows;
    for (int k = 0; k < samples; ++k)
      windows.push_back(window_doc_start(starts, static_cast<int64_t>(k) * S, S));
    for (int c : {2, 4, 8}) {
      const Stats z = measure(windows, S, c, false, 0), b = measure(windows, S, c, true, 0);
      std::printf(
          "| short + one long | %lld | %d | %.3f (%.3f) | %.3f (%.3f) | %.2f | %.2f | %.1f | %.1f |\n",
          static_cast<long long>(S), c, z.mean_ratio, z.worst_ratio, b.mean_ratio, b.worst_ratio, z.skipped,
          b.skipped, z.calls, b.calls);
    }
  }
  // Sliding window without documents (Mistral-style 4096, or 1024 below 8k tokens).
  report("no documents, window", std::vector<int64_t>{total}, samples, 1024);
  return 0;
}
