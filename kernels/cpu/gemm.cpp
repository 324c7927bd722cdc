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
// Weight pre-packing (format_tag::any + reorder) was measured too: within noise of the plain
// primitive except on the no-transpose case, which sgemm covers. A correct cache of packed weights
// would need a version counter on the tensor (the optimizer updates weights in place at the same
// address), which Tensor does not have, so operands are used in place, row-major, transposition
// expressed as strides, and nothing is packed.
#include <omp.h>

#include <cstring>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

#include "cpu/cpu_ops.hpp"
#include "parallel/error.hpp"

namespace parallel::cpu {
namespace {

struct GemmKey {
  int64_t m, n, k;
  bool trans_a, trans_b;
  uint32_t alpha_bits, beta_bits;  // the bit patterns: exact, and NaN-safe as map keys
  int threads;                     // a primitive is tuned for the thread count it was created with
  auto tie() const { return std::tie(m, n, k, trans_a, trans_b, alpha_bits, beta_bits, threads); }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
};

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

struct DnnlContext {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mutex;
  std::map<GemmKey, dnnl::matmul> cache;
};

DnnlContext& context() {
  static DnnlContext ctx;  // thread-safe initialisation; never destroyed before the last gemm
  return ctx;
}

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// op(x) as a [rows, cols] descriptor over row-major storage: trans means storage is [cols, rows].
dnnl::memory::desc operand_desc(int64_t rows, int64_t cols, bool trans) {
  return dnnl::memory::desc({rows, cols}, dt::f32, trans ? tag::ba : tag::ab);
}

dnnl::matmul make_matmul(const GemmKey& key, const dnnl::engine& engine) {
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
  auto desc = dnnl::matmul::desc(operand_desc(key.m, key.k, key.trans_a),
                                 operand_desc(key.k, key.n, key.trans_b), operand_desc(key.m, key.n, false));
  return dnnl::matmul(dnnl::matmul::primitive_desc(desc, attr, engine));
}

}  // namespace

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta) {
  const int64_t m = c.size(0), n = c.size(1), k = trans_a ? a.size(0) : a.size(1);
  float* C = c.data<float>();
  if (m == 0 || n == 0) return;
  if (k == 0) {  // empty sum: only the beta term is left (oneDNN would reject zero-sized operands)
    for (int64_t i = 0; i < m * n; i++) C[i] = beta == 0.0f ? 0.0f : beta * C[i];
    return;
  }
  if (!trans_a && !trans_b) {
    dnnl_status_t st =
        dnnl_sgemm('N', 'N', m, n, k, alpha, a.data<float>(), k, b.data<float>(), n, beta, C, n);
    PARALLEL_CHECK(st == dnnl_success, "dnnl_sgemm failed with status {} for [{}, {}] x [{}, {}]",
                   static_cast<int>(st), m, k, k, n);
    return;
  }
  const GemmKey key{m, n, k, trans_a, trans_b, bits_of(alpha), bits_of(beta), omp_get_max_threads()};
  DnnlContext& ctx = context();
  dnnl::matmul prim;
  {
    // Primitive creation is the expensive part (JIT); execution of a cached primitive is reentrant.
    std::lock_guard<std::mutex> lock(ctx.mutex);
    auto it = ctx.cache.find(key);
    if (it == ctx.cache.end()) it = ctx.cache.emplace(key, make_matmul(key, ctx.engine)).first;
    prim = it->second;
  }
  dnnl::memory am(operand_desc(m, k, trans_a), ctx.engine, a.data<float>());
  dnnl::memory bm(operand_desc(k, n, trans_b), ctx.engine, b.data<float>());
  dnnl::memory cm(operand_desc(m, n, false), ctx.engine, C);
  // A stream per call is cheap on the CPU and keeps concurrent callers independent.
  dnnl::stream stream(ctx.engine);
  prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  stream.wait();
}

}  // namespace parallel::cpu
