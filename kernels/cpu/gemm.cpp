// gemm on the CPU through oneDNN: the matmul primitive, except for the no-transpose case.
//
// Measured on the 2-core AVX-512 build machine, OMP_NUM_THREADS=2, GPT-2 small shapes (1024 tokens,
// h = 768), fastest of 30-40 interleaved calls (the cores are shared, means are noise):
// - op(b) = W^T (forward) and op(a) = dy^T (weight gradient): the matmul primitive
//   (brg:avx512_core) is as fast as dnnl_sgemm or faster, up to 1.3x on [1024x3072]x[3072x768]^T
//   (sgemm 154-350 vs matmul 195-427 GFLOP/s); both reach ~400-440 GFLOP/s on the others.
// - neither transposed (input gradient dy @ W): dnnl_sgemm is faster, 420-440 vs 330-340 GFLOP/s on
//   [1024x3072]x[3072x768], so that case calls it (it needs no primitive and no cache).
// Primitives are created once per (M, N, K, transposes, alpha, beta, threads) and cached.
//
// 16-bit operands (bf16, fp16) go to the same matmul primitive with 16-bit source and weights and
// an fp32 or 16-bit destination: oneDNN accumulates in fp32 and picks the best kernel for the CPU
// (AMX, AVX512-BF16 dot products, or its own bf16 emulation on plain AVX-512; gemm_isa() names it).
// Where oneDNN has no implementation (fp16 on CPUs without AVX512-FP16, anything below AVX-512),
// the library's own AVX2/FMA GEMM runs (gemm_avx2.hpp): it widens the 16-bit operands while
// packing them for its micro-kernel and narrows c once in its epilogue. Since its loops were
// reordered (BLIS's order, 2026-11-27) it also beats oneDNN's fp32 gemm:jit on this class of CPU
// (AVX2 + FMA, no AVX-512) in the GEMM benchmark's process CPU time with warm caches, but not in
// wall time with the cold caches a training step leaves (mini 0.95 of oneDNN's tokens/s), so fp32
// stays on oneDNN unless PARALLEL_CPU_FP32_GEMM=own (own_fp32_gemm; docs/benchmarks.md, "The own
// fp32 GEMM inside the step"). A CPU without
// AVX2 + FMA + F16C still runs the fp32 path tile by tile on operands widened in cache
// (widened_gemm): slower, same contract.
//
// Packed weights: inside an ops::WeightPackingScope, a b operand that lies in one of the scope's
// buffers (the model's parameters) is reordered once into the layout the primitive wants
// (format_tag::any) and the packed copy is reused by every later GEMM on the same b until the scope
// closes: the micro-batches of a step pack each weight once per orientation (x W^T forward, dy W
// backward) instead of once per call. The scope's owner guarantees nothing writes those buffers
// while it is open (the optimizer writes them after it), which is what makes a cache keyed by
// address correct without a version counter on the tensor. Outside a scope, and for every other
// operand, operands are used in place, row-major, transposition expressed as strides.
//
// Signals: oneDNN's JIT f32 kernels move the stack pointer into a heap buffer (oneDNN issue 4845),
// so a signal handled on a thread running one writes its frame into the heap. Every entry point
// calls guard_signals() (include/parallel/signal_handler.hpp): the handled signals are blocked in
// the calling thread and its OpenMP team, and delivered on the library's signal thread instead.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cpu/cpu_ops.hpp"
#include "cpu/gemm_avx2.hpp"
#include "cpu/gemm_times.hpp"
#include "cpu/widen.hpp"
#include "parallel/error.hpp"
#include "parallel/signal_handler.hpp"

namespace parallel::cpu {
namespace {

struct GemmKey {
  int64_t m, n, k;
  bool trans_a, trans_b;
  uint32_t alpha_bits, beta_bits;  // the bit patterns: exact, and NaN-safe as map keys
  int threads;                     // a primitive is tuned for the thread count it was created with
  DType in, out;                   // operand and destination dtypes
  DType bias = DType::U8;          // the bias dtype; U8: no bias
  bool packed_b = false;           // b in the primitive's own layout (a packed weight)
  auto tie() const {
    return std::tie(m, n, k, trans_a, trans_b, alpha_bits, beta_bits, threads, in, out, bias, packed_b);
  }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
};

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// A weight in a primitive's layout: the packed bytes live in a tensor from the library allocator,
// so memory statistics and the memory plan see them.
struct PackedWeight {
  const void* source;
  bool trans;  // the source's orientation: a square W packs to the same layout both ways
  dnnl::memory::desc layout;
  Tensor bytes;
};

struct DnnlContext {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mutex;
  // An empty optional: oneDNN has no implementation for this key (16-bit on an older CPU).
  std::map<GemmKey, std::optional<dnnl::matmul>> cache;
  // The open WeightPackingScope's buffers ([begin, end) byte ranges) and what it packed so far.
  bool packing = false;
  std::vector<std::pair<const char*, const char*>> weight_ranges;
  std::vector<PackedWeight> packed;
  int64_t packs_made = 0;
};

DnnlContext& context() {
  static DnnlContext ctx;  // thread-safe initialisation; never destroyed before the last gemm
  return ctx;
}

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

dt dnnl_type(DType d) {
  switch (d) {
    case DType::BF16:
      return dt::bf16;
    case DType::F16:
      return dt::f16;
    default:
      return dt::f32;
  }
}

// op(x) as a [rows, cols] descriptor over row-major storage: trans means storage is [cols, rows].
dnnl::memory::desc operand_desc(int64_t rows, int64_t cols, bool trans, DType d) {
  return dnnl::memory::desc({rows, cols}, dnnl_type(d), trans ? tag::ba : tag::ab);
}

dnnl::matmul::primitive_desc matmul_desc(const GemmKey& key, const dnnl::engine& engine) {
  dnnl::primitive_attr attr;
  if (key.alpha_bits != bits_of(1.0f)) {
    float alpha;
    std::memcpy(&alpha, &key.alpha_bits, sizeof alpha);
    attr.set_output_scales(0, {alpha});
  }
  if (key.beta_bits != bits_of(0.0f)) {
    float beta;
    std::memcpy(&beta, &key.beta_bits, sizeof beta);
    dnnl::post_ops ops;
    ops.append_sum(beta);  // dst = alpha * a @ b + beta * dst
    attr.set_post_ops(ops);
  }
  const auto src = operand_desc(key.m, key.k, key.trans_a, key.in);
  const auto wei = key.packed_b ? dnnl::memory::desc({key.k, key.n}, dnnl_type(key.in), tag::any)
                                : operand_desc(key.k, key.n, key.trans_b, key.in);
  const auto dst = operand_desc(key.m, key.n, false, key.out);
  if (key.bias != DType::U8) {
    const dnnl::memory::desc bias({1, key.n}, dnnl_type(key.bias), tag::ab);
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, bias, dst), attr, engine);
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), attr, engine);
}

std::optional<dnnl::matmul> make_matmul(const GemmKey& key, const dnnl::engine& engine) {
  try {
    return dnnl::matmul(matmul_desc(key, engine));
  } catch (const dnnl::error& e) {
    if (key.in == DType::F32) throw;  // fp32 always has an implementation: a real failure
    return std::nullopt;              // unimplemented for this CPU: the caller widens
  }
}

// A cached primitive for the key, or nullopt when oneDNN cannot run it.
std::optional<dnnl::matmul> cached_matmul(const GemmKey& key) {
  DnnlContext& ctx = context();
  // Primitive creation is the expensive part (JIT); execution of a cached primitive is reentrant.
  std::lock_guard<std::mutex> lock(ctx.mutex);
  auto it = ctx.cache.find(key);
  if (it == ctx.cache.end()) it = ctx.cache.emplace(key, make_matmul(key, ctx.engine)).first;
  return it->second;
}

// b in `prim`'s weight layout, packed at its first use in the open scope (under the context lock).
dnnl::memory packed_weight(const dnnl::matmul& prim, const GemmKey& key, const void* B) {
  DnnlContext& ctx = context();
  const dnnl_memory_desc_t* md =
      dnnl_primitive_desc_query_md(prim.get_primitive_desc(), dnnl_query_weights_md, 0);
  PARALLEL_CHECK(md != nullptr, "oneDNN matmul has no weights descriptor");
  const dnnl::memory::desc layout(*md);
  std::lock_guard<std::mutex> lock(ctx.mutex);
  for (PackedWeight& w : ctx.packed)
    if (w.source == B && w.trans == key.trans_b && w.layout == layout)
      return dnnl::memory(layout, ctx.engine, w.bytes.data_ptr());
  PackedWeight w{B, key.trans_b, layout, Tensor::empty({static_cast<int64_t>(layout.get_size())}, DType::U8)};
  dnnl::memory plain(operand_desc(key.k, key.n, key.trans_b, key.in), ctx.engine, const_cast<void*>(B));
  dnnl::memory packed(layout, ctx.engine, w.bytes.data_ptr());
  dnnl::stream stream(ctx.engine);
  dnnl::reorder(plain, packed).execute(stream, plain, packed);
  stream.wait();
  ctx.packed.push_back(std::move(w));
  ctx.packs_made++;
  return packed;
}

// Whether b (an operand of `bytes` bytes at B) is a weight of the open packing scope.
bool is_scope_weight(const void* B, int64_t bytes) {
  DnnlContext& ctx = context();
  std::lock_guard<std::mutex> lock(ctx.mutex);
  if (!ctx.packing) return false;
  const char* p = static_cast<const char*>(B);
  for (const auto& [begin, end] : ctx.weight_ranges)
    if (p >= begin && p + bytes <= end) return true;
  return false;
}

void run_matmul(const dnnl::matmul& prim, const GemmKey& key, const void* A, const void* B, void* C,
                const void* bias = nullptr) {
  DnnlContext& ctx = context();
  dnnl::memory am(operand_desc(key.m, key.k, key.trans_a, key.in), ctx.engine, const_cast<void*>(A));
  dnnl::memory bm = key.packed_b ? packed_weight(prim, key, B)
                                 : dnnl::memory(operand_desc(key.k, key.n, key.trans_b, key.in), ctx.engine,
                                                const_cast<void*>(B));
  dnnl::memory cm(operand_desc(key.m, key.n, false, key.out), ctx.engine, C);
  // A stream per call is cheap on the CPU and keeps concurrent callers independent.
  dnnl::stream stream(ctx.engine);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  if (key.bias != DType::U8)
    args.emplace(DNNL_ARG_BIAS, dnnl::memory(dnnl::memory::desc({1, key.n}, dnnl_type(key.bias), tag::ab),
                                             ctx.engine, const_cast<void*>(bias)));
  prim.execute(stream, args);
  stream.wait();
}

// `threads`: what the matmul primitive is made for (the key's); 1 inside a parallel region, where
// oneDNN runs sequentially.
void fp32_gemm(const float* A, bool trans_a, const float* B, bool trans_b, float* C, int64_t m, int64_t n,
               int64_t k, float alpha, float beta, int threads = omp_get_max_threads()) {
  if (!trans_a && !trans_b) {
    dnnl_status_t st = dnnl_sgemm('N', 'N', m, n, k, alpha, A, k, B, n, beta, C, n);
    PARALLEL_CHECK(st == dnnl_success, "dnnl_sgemm failed with status {} for [{}, {}] x [{}, {}]",
                   static_cast<int>(st), m, k, k, n);
    return;
  }
  const GemmKey key{m,       n,          k,         trans_a, trans_b, bits_of(alpha), bits_of(beta),
                    threads, DType::F32, DType::F32};
  run_matmul(*cached_matmul(key), key, A, B, C);
}

// 16-bit operands without a oneDNN implementation (fp16 on CPUs without AVX512-FP16, bf16 and
// fp16 below AVX-512): the product runs in fp32 tile by tile. A tile of c is [kTileM, kTileN] with
// the whole k: its rows of op(a) and its columns of op(b) are widened into per-thread scratch
// (kernels/cpu/widen.hpp), the fp32 product (and the bias) runs on them into an fp32 tile, and the
// tile is narrowed into c (or, for an fp32 c, copied back). No whole operand is ever converted as a
// pass of its own: each widened block is read by the product right after it is written, while it
// is still in cache. op(a)'s rows are widened once per row of tiles and op(b)'s columns once per
// tile, (m k + k n m / kTileM) conversions against 2 m n k flops: under 1 % of the work.
// Each tile computes the same sums in the same fp32 arithmetic as the whole product, but oneDNN
// may block k differently for a tile than for the whole matrix, so the last bit of an element can
// differ from a whole-matrix fp32 product of the widened operands (the op table's tolerances hold).
constexpr int64_t kTileM = 256, kTileN = 256;

void widened_gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha,
                  float beta, const Tensor* bias = nullptr) {
  const int64_t m = c.size(0), n = c.size(1), k = trans_a ? a.size(0) : a.size(1);
  const DType at = a.dtype(), bt = b.dtype(), ct = c.dtype();
  const DType bias_t = bias != nullptr ? bias->dtype() : DType::F32;
  const char* A = static_cast<const char*>(a.data_ptr());
  const char* B = static_cast<const char*>(b.data_ptr());
  const char* bias_p = bias != nullptr ? static_cast<const char*>(bias->data_ptr()) : nullptr;
  char* C = static_cast<char*>(c.data_ptr());
  const int64_t as = static_cast<int64_t>(dtype_size(at)), bs = static_cast<int64_t>(dtype_size(bt)),
                cs = static_cast<int64_t>(dtype_size(ct)), bias_s = static_cast<int64_t>(dtype_size(bias_t));
  const int64_t tiles_m = (m + kTileM - 1) / kTileM, tiles_n = (n + kTileN - 1) / kTileN;
  // Tiles are independent (each writes its own block of c): one thread per tile, each tile's
  // product single-threaded (oneDNN runs sequentially inside a parallel region), so the widening is
  // spread over the threads as the product is. Every thread of the team sizes its scratch for the
  // largest tile before any tile is handed out: which thread gets which tile changes from call to
  // call (dynamic schedule), and a thread growing its scratch in a later step would take fresh pages
  // inside that step.
  const int64_t tm_max = std::min(m, kTileM), tn_max = std::min(n, kTileN);
#pragma omp parallel
  {
    float* Aw = scratch_f32(0, tm_max * k);       // op(a)[i0:i0+tm, :], in a's orientation
    float* Bw = scratch_f32(1, k * tn_max);       // op(b)[:, j0:j0+tn], in b's orientation
    float* Cw = scratch_f32(2, tm_max * tn_max);  // the tile of c, fp32
    float* bias_w = scratch_f32(3, tn_max);
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t ti = 0; ti < tiles_m; ti++) {
      for (int64_t tj = 0; tj < tiles_n; tj++) {
        const int64_t i0 = ti * kTileM, j0 = tj * kTileN;
        const int64_t tm = std::min(kTileM, m - i0), tn = std::min(kTileN, n - j0);
        // op(a) = a: rows i0.. of a, one block; op(a) = a^T: columns i0.. of every row of a ([k, tm]).
        if (!trans_a)
          widen_to_f32(A + i0 * k * as, at, Aw, tm * k);
        else
          for (int64_t kk = 0; kk < k; kk++) widen_to_f32(A + (kk * m + i0) * as, at, Aw + kk * tm, tm);
        // op(b) = b^T: rows j0.. of b ([tn, k]); op(b) = b: columns j0.. of every row of b ([k, tn]).
        if (trans_b)
          widen_to_f32(B + j0 * k * bs, bt, Bw, tn * k);
        else
          for (int64_t kk = 0; kk < k; kk++) widen_to_f32(B + (kk * n + j0) * bs, bt, Bw + kk * tn, tn);
        if (beta != 0.0f)
          for (int64_t i = 0; i < tm; i++) widen_to_f32(C + ((i0 + i) * n + j0) * cs, ct, Cw + i * tn, tn);
        if (k == 0) {  // empty sum (gemm_bias only; oneDNN rejects zero-sized operands): beta c + bias
          for (int64_t i = 0; i < tm * tn; i++) Cw[i] = beta != 0.0f ? beta * Cw[i] : 0.0f;
          if (bias != nullptr)
            for (int64_t i = 0; i < tm; i++)
              for (int64_t j = 0; j < tn; j++) Cw[i * tn + j] += load_f32(bias_p, bias_t, j0 + j);
        } else if (bias != nullptr) {
          widen_to_f32(bias_p + j0 * bias_s, bias_t, bias_w, tn);
          GemmKey key{tm, tn, k, trans_a, trans_b, bits_of(1.0f), bits_of(0.0f), 1, DType::F32, DType::F32};
          key.bias = DType::F32;
          run_matmul(*cached_matmul(key), key, Aw, Bw, Cw, bias_w);
        } else {
          fp32_gemm(Aw, trans_a, Bw, trans_b, Cw, tm, tn, k, alpha, beta, 1);
        }
        for (int64_t i = 0; i < tm; i++) narrow_from_f32(Cw + i * tn, ct, C + ((i0 + i) * n + j0) * cs, tn);
      }
    }
  }
}

// The own AVX2 GEMM's problem for these operands (bias: nullptr for none).
GemmAvx2Problem avx2_problem(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
                             float alpha, float beta, const Tensor* bias = nullptr) {
  GemmAvx2Problem p;
  p.m = c.size(0), p.n = c.size(1), p.k = trans_a ? a.size(0) : a.size(1);
  p.a = a.data_ptr(), p.a_type = a.dtype(), p.trans_a = trans_a;
  p.b = b.data_ptr(), p.b_type = b.dtype(), p.trans_b = trans_b;
  p.c = c.data_ptr(), p.c_type = c.dtype();
  p.alpha = alpha, p.beta = beta;
  if (bias != nullptr) p.bias = bias->data_ptr(), p.bias_type = bias->dtype();
  return p;
}

// 16-bit weights only: oneDNN re-lays a 16-bit b out in pairs along k on every call, which a
// packed copy saves; fp32 b is used as it is (benchmarks/compare_weight_packing.sh measured fp32
// steps 4 % slower packed: the no-transpose product then leaves dnnl_sgemm for the matmul).
bool packable(const Tensor& b) {
  return b.dtype() != DType::F32 &&
         is_scope_weight(b.data_ptr(), b.numel() * static_cast<int64_t>(dtype_size(b.dtype())));
}

// fp32 on a CPU whose best oneDNN kernel is its AVX2 sgemm (AVX2 + FMA, no AVX-512): the own
// GEMM, except for a forward product wider than one of its column panels (op(b) = W^T, n > 4096:
// the LM head's forward, where it repacks op(a) once per panel and oneDNN measured faster).
// Measured on the Zen 3 build machine over the GPT step's shapes, medians of 3 rounds of process
// CPU time (docs/benchmarks.md, "Issue 28: the own GEMM for fp32 too"): the own kernel at 86-87 %
// of the FMA peak over a step's GEMMs against oneDNN's 84 %, ahead most on the weight gradients
// (op(a) = dy^T: 86-89 % against 71-85 %); oneDNN 86 % against 82 % on GPT-2's head forward.
// Changes fp32 rounding against oneDNN in the last bits (another blocking of k); the choice
// depends only on the CPU, the shape and the environment, so a run is deterministic.
// Off by default: inside the mini GPT's fp32 step the route measured 0.90-0.94 of oneDNN's
// tokens/s on an idle machine (2026-11-27 15:53), and 0.89-0.95 (3 rounds) and a tie (7 rounds)
// after the kernel's barriers were replaced by shared counters (18:10-18:28, load 6-7): never
// reliably ahead. Why the benchmark's lead did not carry over
// (docs/benchmarks.md, "The own fp32 GEMM inside the step"): that benchmark timed process CPU time
// with the operands in the L3; in wall time, with the operands cold from memory as the step leaves
// them (bench_cpu_kernels --cold), the own kernel's micro-kernel and packing run ~5-15 % behind
// oneDNN's JIT sgemm on most of the step's shapes. PARALLEL_CPU_FP32_GEMM=own turns it on,
// =onednn or unset keeps oneDNN.
bool own_fp32_gemm_requested() {
  static const bool own = [] {
    const char* v = std::getenv("PARALLEL_CPU_FP32_GEMM");
    if (v == nullptr || std::string(v) == "onednn") return false;
    if (std::string(v) == "own") return true;
    PARALLEL_CHECK(false, "PARALLEL_CPU_FP32_GEMM must be 'onednn' or 'own', got '{}'", v);
    return false;
  }();
  return own;
}

bool own_fp32_gemm(const GemmAvx2Problem& p) {
  static const bool avx2_class = [] {
    GemmAvx2Problem probe;
    probe.m = probe.n = probe.k = 1;
    return gemm_avx2_can_implement(probe) && !__builtin_cpu_supports("avx512f");
  }();
  if (!own_fp32_gemm_requested() || !avx2_class || !gemm_avx2_can_implement(p)) return false;
  return !(p.trans_b && p.n > 4096);
}

}  // namespace

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta) {
  guard_signals();  // a thread-local load after the first call in this thread
  const int64_t m = c.size(0), n = c.size(1), k = trans_a ? a.size(0) : a.size(1);
  if (m == 0 || n == 0) return;
  GemmTimer timer(m, n, k, trans_a, trans_b, false);
  if (k == 0) {  // empty sum: only the beta term is left (oneDNN would reject zero-sized operands)
    std::vector<float> C(static_cast<size_t>(m * n), 0.0f);
    if (beta != 0.0f) {
      widen_to_f32(c.data_ptr(), c.dtype(), C.data(), m * n);
      for (float& v : C) v *= beta;
    }
    narrow_from_f32(C.data(), c.dtype(), c.data_ptr(), m * n);
    return;
  }
  if (a.dtype() == DType::F32 && b.dtype() == DType::F32 && c.dtype() == DType::F32) {
    if (const GemmAvx2Problem p = avx2_problem(a, trans_a, b, trans_b, c, alpha, beta); own_fp32_gemm(p)) {
      timer.set_route("own");
      return gemm_avx2_run(p);
    }
  }
  if (a.dtype() == DType::F32)
    return fp32_gemm(a.data<float>(), trans_a, b.data<float>(), trans_b, c.data<float>(), m, n, k, alpha,
                     beta);
  GemmKey key{m,         n,        k, trans_a, trans_b, bits_of(alpha), bits_of(beta), omp_get_max_threads(),
              a.dtype(), c.dtype()};
  key.packed_b = packable(b);
  if (auto prim = cached_matmul(key)) return run_matmul(*prim, key, a.data_ptr(), b.data_ptr(), c.data_ptr());
  if (const GemmAvx2Problem p = avx2_problem(a, trans_a, b, trans_b, c, alpha, beta);
      gemm_avx2_can_implement(p))
    return gemm_avx2_run(p);
  widened_gemm(a, trans_a, b, trans_b, c, alpha, beta);
}

void gemm_onednn_f32(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha,
                     float beta) {
  guard_signals();
  PARALLEL_CHECK(a.dtype() == DType::F32 && b.dtype() == DType::F32 && c.dtype() == DType::F32,
                 "gemm_onednn_f32: every operand must be fp32");
  const int64_t m = c.size(0), n = c.size(1), k = trans_a ? a.size(0) : a.size(1);
  if (m == 0 || n == 0 || k == 0) return gemm(a, trans_a, b, trans_b, c, alpha, beta);
  fp32_gemm(a.data<float>(), trans_a, b.data<float>(), trans_b, c.data<float>(), m, n, k, alpha, beta);
}

// c = op(a) op(b) + bias in one primitive: the bias is added to the fp32 accumulator before the
// single rounding to c's dtype (a separate add after a 16-bit GEMM would round twice), and the
// pass over c that a separate add costs is gone. Where oneDNN has no kernel, the product and the
// bias run widened to fp32 and c is still rounded once.
void gemm_bias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias, Tensor& c) {
  guard_signals();
  const int64_t m = c.size(0), n = c.size(1), k = trans_a ? a.size(0) : a.size(1);
  GemmTimer timer(m, n, k, trans_a, trans_b, true);
  if (a.dtype() == DType::F32 && b.dtype() == DType::F32 && c.dtype() == DType::F32) {
    // The own GEMM adds the bias in its epilogue (after the whole fp32 sum, as oneDNN's matmul does).
    if (const GemmAvx2Problem p = avx2_problem(a, trans_a, b, trans_b, c, 1.0f, 0.0f, &bias);
        own_fp32_gemm(p)) {
      timer.set_route("own");
      return gemm_avx2_run(p);
    }
  }
  if (m > 0 && n > 0 && k > 0) {
    GemmKey key{m,         n,        k, trans_a, trans_b, bits_of(1.0f), bits_of(0.0f), omp_get_max_threads(),
                a.dtype(), c.dtype()};
    key.bias = bias.dtype();
    key.packed_b = packable(b);
    if (auto prim = cached_matmul(key))
      return run_matmul(*prim, key, a.data_ptr(), b.data_ptr(), c.data_ptr(), bias.data_ptr());
  }
  if (c.dtype() == DType::F32) {
    gemm(a, trans_a, b, trans_b, c, 1.0f, 0.0f);
    add_bias(c, bias);
    return;
  }
  // 16-bit without a oneDNN kernel: the product and the bias in fp32, then one rounding.
  if (const GemmAvx2Problem p = avx2_problem(a, trans_a, b, trans_b, c, 1.0f, 0.0f, &bias);
      gemm_avx2_can_implement(p))
    return gemm_avx2_run(p);
  widened_gemm(a, trans_a, b, trans_b, c, 1.0f, 0.0f, &bias);
}

std::string gemm_implementation(DType operands) {
  if (operands == DType::F32) {
    GemmAvx2Problem p;
    p.m = p.n = p.k = 256;
    if (own_fp32_gemm(p))
      return "own avx2/fma GEMM (oneDNN gemm:jit for forward products with n > 4096), this CPU has no "
             "AVX-512";
  }
  const GemmKey key{
      256, 256, 256, false, true, bits_of(1.0f), bits_of(0.0f), omp_get_max_threads(), operands, DType::F32};
  const char* isa = "";
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx:
      isa = "avx512_core_amx";
      break;
    case dnnl::cpu_isa::avx512_core_bf16:
      isa = "avx512_core_bf16";
      break;
    case dnnl::cpu_isa::avx512_core_vnni:
      isa = "avx512_core_vnni";
      break;
    case dnnl::cpu_isa::avx512_core:
      isa = "avx512_core";
      break;
    case dnnl::cpu_isa::avx2:
      isa = "avx2";
      break;
    default:
      isa = "other";
  }
  try {
    return fmt::format("{} (oneDNN {}, isa {})", matmul_desc(key, context().engine).impl_info_str(),
                       dnnl_type(operands) == dt::bf16  ? "bf16"
                       : dnnl_type(operands) == dt::f16 ? "fp16"
                                                        : "fp32",
                       isa);
  } catch (const dnnl::error&) {
    GemmAvx2Problem p;
    p.m = p.n = p.k = 1;
    p.a_type = p.b_type = operands;
    if (gemm_avx2_can_implement(p))
      return "own avx2/fma GEMM, widened while packing (no oneDNN implementation on this CPU)";
    return "widened to fp32 (no oneDNN implementation on this CPU)";
  }
}

bool native_gemm(DType operands) {
  if (operands == DType::F32) return true;
  // Asked once per dtype: the answer is the CPU's (its ISA), and building a primitive descriptor
  // (which throws where there is none) costs tens of microseconds - the meta ops ask on every GEMM.
  static std::mutex mutex;
  static std::map<DType, bool> known;
  std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = known.find(operands); it != known.end()) return it->second;
  const GemmKey key{
      256, 256, 256, false, true, bits_of(1.0f), bits_of(0.0f), omp_get_max_threads(), operands, DType::F32};
  bool native = true;
  try {
    (void)matmul_desc(key, context().engine);
  } catch (const dnnl::error&) {
    native = false;
  }
  known[operands] = native;
  return native;
}

void open_weight_packing(const std::vector<std::pair<const void*, int64_t>>& buffers) {
  DnnlContext& ctx = context();
  std::lock_guard<std::mutex> lock(ctx.mutex);
  PARALLEL_CHECK(!ctx.packing, "a WeightPackingScope is already open (scopes do not nest)");
  ctx.packing = true;
  ctx.weight_ranges.clear();
  for (const auto& [ptr, bytes] : buffers) {
    const char* p = static_cast<const char*>(ptr);
    ctx.weight_ranges.emplace_back(p, p + bytes);
  }
}

void close_weight_packing() {
  DnnlContext& ctx = context();
  std::vector<PackedWeight> drop;  // freed outside the lock
  {
    std::lock_guard<std::mutex> lock(ctx.mutex);
    ctx.packing = false;
    ctx.weight_ranges.clear();
    drop.swap(ctx.packed);
  }
}

int64_t weight_packs_made() {
  DnnlContext& ctx = context();
  std::lock_guard<std::mutex> lock(ctx.mutex);
  return ctx.packs_made;
}

}  // namespace parallel::cpu
