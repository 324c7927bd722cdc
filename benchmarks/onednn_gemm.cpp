// onednn_gemm: the GEMMs of a GPT training step through oneDNN alone, the way kernels/cpu/gemm.cpp
// calls it, so that two oneDNN releases can be timed side by side on the same shapes.
//
//   OMP_NUM_THREADS=2 onednn_gemm [--reps N] [--models mini,gpt2] [--dtypes f32,bf16]
//
// It links oneDNN and OpenMP only, not libparallel: two oneDNN releases export the same C symbols
// (dnnl_*), so a process must hold exactly one, and libparallel holds Debian's 2.6. The build makes
// it against the oneDNN the library uses (target onednn_gemm); benchmarks/compare_onednn.sh also
// compiles it against a second oneDNN (e.g. 3.x) and alternates the two, with the peak measured by
// libparallel (cpu_peak) in between.
//
// Shapes: a linear layer y = x W^T, W [out, in], over T = batch * seq tokens, as the model calls
// ops::gemm (src/tp/*_linear.cpp, src/model/output_layer.cpp):
//   fwd    gemm(x, W^T)          m = T,   n = out, k = in   b transposed (row-major W)
//   dgrad  gemm(dy, W)           m = T,   n = in,  k = out  no transpose
//   wgrad  gemm(dy^T, x, beta 1) m = out, n = in,  k = T    a transposed, accumulated (beta = 1)
// for qkv (h -> 3h), proj (h -> h), fc1 (h -> 4h), fc2 (4h -> h) and the lm head (h -> vocab).
//
// Per dtype, mirroring gemm.cpp:
//   f32   the no-transpose product through dnnl_sgemm, the others through the matmul primitive with
//         the operands in place (transposition as strides), fp32 destination.
//   bf16  the matmul primitive with bf16 source and weights; the weight (b of fwd and dgrad) packed
//         once into the primitive's layout (format_tag::any; inside a training step the library packs
//         each weight once per step, ops::WeightPackingScope), so packing is not timed; destination
//         bf16 for fwd and dgrad (activations), fp32 for wgrad (the main gradient, beta = 1). Where
//         oneDNN has no bf16 matmul for this CPU (below AVX-512 in 2.6) the library widens a and b
//         to fp32 and runs the f32 path: timed here the same way, widening included, impl "widened".
//
// Output: one line per case, whitespace-separated, for the script to parse:
//   case MODEL NAME DTYPE M N K best_s median_s cpu_s IMPL
// best_s is the fastest of --reps calls in wall-clock time (the cores are shared: the fastest call is
// the one that had them), median_s the median; cpu_s the smallest process CPU time of a call divided
// by the OpenMP threads (CLOCK_PROCESS_CPUTIME_ID: time the process was descheduled by other jobs
// does not count, as in hardware_peak.cpp's peak; run it with OMP_WAIT_POLICY=passive so that
// threads waiting at a barrier sleep instead of spinning into that time). Lines starting with '#'
// are comments (version, ISA, threading runtime).
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using Clock = std::chrono::steady_clock;

struct Model {
  const char* name;
  int64_t tokens, hidden, vocab;
};

// The two models: mini GPT (6 x 384, vocab 8192) and GPT-2 124M (12 x 768, vocab 50257),
// both at seq 256, batch 4 (layers do not change the shapes).
const Model kModels[] = {{"mini", 4 * 256, 384, 8192}, {"gpt2", 4 * 256, 768, 50257}};

struct Case {
  std::string model, name;
  int64_t m, n, k;
  bool trans_a, trans_b;
  float beta;
  bool b_is_weight;  // fwd and dgrad: b is the layer's weight (packed for bf16)
  bool f32_dst;      // wgrad: the fp32 gradient; else the operands' dtype
};

std::vector<Case> cases_of(const Model& md) {
  struct Linear {
    const char* name;
    int64_t in, out;
  };
  const int64_t h = md.hidden, T = md.tokens;
  const Linear linears[] = {
      {"qkv", h, 3 * h}, {"proj", h, h}, {"fc1", h, 4 * h}, {"fc2", 4 * h, h}, {"lm_head", h, md.vocab}};
  std::vector<Case> out;
  for (const Linear& l : linears) {
    const std::string n = l.name;
    out.push_back({md.name, n + "_fwd", T, l.out, l.in, false, true, 0.0f, true, false});
    out.push_back({md.name, n + "_dgrad", T, l.in, l.out, false, false, 0.0f, true, false});
    out.push_back({md.name, n + "_wgrad", l.out, l.in, T, true, false, 1.0f, false, true});
  }
  return out;
}

dnnl::memory::desc plain(int64_t rows, int64_t cols, bool trans, dt type) {
  return dnnl::memory::desc({rows, cols}, type, trans ? tag::ba : tag::ab);
}

dnnl::matmul::primitive_desc matmul_pd(const dnnl::engine& eng, const dnnl::memory::desc& src,
                                       const dnnl::memory::desc& wei, const dnnl::memory::desc& dst,
                                       float beta) {
  dnnl::primitive_attr attr;
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::matmul::primitive_desc(eng, src, wei, dst, attr);
#else
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), attr, eng);
#endif
}

// bf16 <-> fp32 by bits: round to nearest even on the way down (as the library's narrow does).
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

void widen(const uint16_t* src, float* dst, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(&dst[i], &u, 4);
  }
}

void narrow(const float* src, uint16_t* dst, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]);
}

// Buffers with deterministic contents in [-1, 1).
std::vector<float> random_f32(int64_t n, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t s = seed * 2654435761u + 1u;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(s >> 8) / 8388608.0f - 1.0f;
  }
  return v;
}

std::vector<uint16_t> random_bf16(int64_t n, uint32_t seed) {
  const std::vector<float> f = random_f32(n, seed);
  std::vector<uint16_t> v(f.size());
  for (size_t i = 0; i < f.size(); ++i) v[i] = to_bf16(f[i]);
  return v;
}

struct Result {
  double best = 1e30, median = 0, cpu = 1e30;
  std::string impl;
};

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

template <typename F>
Result time_calls(int reps, F&& call) {
  call();  // warm-up: first-touch pages, JIT caches
  Result res;
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double cpu0 = process_cpu_seconds();
    const auto start = Clock::now();
    call();
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    res.cpu = std::min(res.cpu, (process_cpu_seconds() - cpu0) / omp_get_max_threads());
  }
  std::sort(t.begin(), t.end());
  res.best = t.front();
  res.median = t[t.size() / 2];
  return res;
}

// f32: gemm.cpp's fp32_gemm. a, b, c fp32 row-major (op by strides).
struct F32Gemm {
  dnnl::engine& eng;
  const Case& c;
  std::optional<dnnl::matmul> prim;
  std::string impl = "dnnl_sgemm";

  F32Gemm(dnnl::engine& e, const Case& cs) : eng(e), c(cs) {
    if (c.trans_a || c.trans_b) {
      const auto pd = matmul_pd(eng, plain(c.m, c.k, c.trans_a, dt::f32), plain(c.k, c.n, c.trans_b, dt::f32),
                                plain(c.m, c.n, false, dt::f32), c.beta);
      impl = pd.impl_info_str();
      prim.emplace(pd);
    }
  }
  void run(const float* A, const float* B, float* C) {
    if (!prim) {
      const dnnl_status_t st = dnnl_sgemm('N', 'N', c.m, c.n, c.k, 1.0f, A, c.k, B, c.n, c.beta, C, c.n);
      if (st != dnnl_success) {
        std::fprintf(stderr, "dnnl_sgemm failed (%d)\n", static_cast<int>(st));
        std::exit(1);
      }
      return;
    }
    dnnl::stream s(eng);
    dnnl::memory am(plain(c.m, c.k, c.trans_a, dt::f32), eng, const_cast<float*>(A));
    dnnl::memory bm(plain(c.k, c.n, c.trans_b, dt::f32), eng, const_cast<float*>(B));
    dnnl::memory cm(plain(c.m, c.n, false, dt::f32), eng, C);
    prim->execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    s.wait();
  }
};

Result run_f32(dnnl::engine& eng, const Case& c, int reps) {
  const std::vector<float> A = random_f32(c.m * c.k, 1), B = random_f32(c.k * c.n, 2);
  std::vector<float> C(static_cast<size_t>(c.m * c.n), 0.0f);
  F32Gemm g(eng, c);
  Result r = time_calls(reps, [&] { g.run(A.data(), B.data(), C.data()); });
  r.impl = g.impl;
  return r;
}

Result run_bf16(dnnl::engine& eng, const Case& c, int reps) {
  const std::vector<uint16_t> A = random_bf16(c.m * c.k, 1), B = random_bf16(c.k * c.n, 2);
  const dt dst_type = c.f32_dst ? dt::f32 : dt::bf16;
  std::vector<char> C(static_cast<size_t>(c.m * c.n) * (c.f32_dst ? 4 : 2), 0);
  const auto src = plain(c.m, c.k, c.trans_a, dt::bf16), dst = plain(c.m, c.n, false, dst_type);
  const auto wei_plain = plain(c.k, c.n, c.trans_b, dt::bf16);
  const auto wei = c.b_is_weight ? dnnl::memory::desc({c.k, c.n}, dt::bf16, tag::any) : wei_plain;
  std::optional<dnnl::matmul::primitive_desc> pd;
  try {
    pd.emplace(matmul_pd(eng, src, wei, dst, c.beta));
  } catch (const dnnl::error&) {
  }
  if (!pd) {
    // gemm.cpp's widened_gemm: widen a and b (and c when it is 16-bit and accumulated; beta is 0
    // there), run the f32 product, narrow c.
    std::vector<float> Af(A.size()), Bf(B.size()), Cf(static_cast<size_t>(c.m * c.n), 0.0f);
    F32Gemm g(eng, c);
    Result r = time_calls(reps, [&] {
      widen(A.data(), Af.data(), c.m * c.k);
      widen(B.data(), Bf.data(), c.k * c.n);
      if (c.f32_dst) {
        g.run(Af.data(), Bf.data(), reinterpret_cast<float*>(C.data()));
      } else {
        g.run(Af.data(), Bf.data(), Cf.data());
        narrow(Cf.data(), reinterpret_cast<uint16_t*>(C.data()), c.m * c.n);
      }
    });
    r.impl = "widened:" + g.impl;
    return r;
  }
  dnnl::matmul prim(*pd);
  dnnl::memory am(src, eng, const_cast<uint16_t*>(A.data()));
  dnnl::memory bplain(wei_plain, eng, const_cast<uint16_t*>(B.data()));
  dnnl::memory bm = bplain;
  dnnl::stream s(eng);
  if (c.b_is_weight && pd->weights_desc() != wei_plain) {  // pack once, as a WeightPackingScope does
    bm = dnnl::memory(pd->weights_desc(), eng);
    dnnl::reorder(bplain, bm).execute(s, bplain, bm);
    s.wait();
  }
  dnnl::memory cm(dst, eng, C.data());
  Result r = time_calls(reps, [&] {
    dnnl::stream st(eng);
    prim.execute(st, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    st.wait();
  });
  r.impl = pd->impl_info_str();
  return r;
}

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "other";
  }
}

// DNNL_RUNTIME_* (dnnl_config.h): the CPU runtime (version struct) and the threading runtime the
// headers were configured with (these headers ship with the library they describe).
const char* runtime_name(unsigned r) {
  switch (r) {
    case DNNL_RUNTIME_SEQ:
      return "sequential";
    case DNNL_RUNTIME_OMP:
      return "OpenMP";
    case DNNL_RUNTIME_TBB:
      return "TBB";
    case DNNL_RUNTIME_THREADPOOL:
      return "threadpool";
#ifdef DNNL_RUNTIME_SYCL
    case DNNL_RUNTIME_SYCL:
      return "SYCL";
#endif
    default:
      return "other";
  }
}

bool listed(const std::string& list, const std::string& item) {
  std::stringstream ss(list);
  for (std::string x; std::getline(ss, x, ',');)
    if (x == item) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  std::string models = "mini,gpt2", dtypes = "f32,bf16";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--models" && i + 1 < argc)
      models = argv[++i];
    else if (a == "--dtypes" && i + 1 < argc)
      dtypes = argv[++i];
    else {
      std::fprintf(stderr, "usage: onednn_gemm [--reps N] [--models mini,gpt2] [--dtypes f32,bf16]\n");
      return 2;
    }
  }
  const dnnl_version_t* v = dnnl_version();
  std::printf("# oneDNN %d.%d.%d (%s), cpu runtime %s, threading %s, effective isa %s, omp threads %d\n",
              v->major, v->minor, v->patch, v->hash, runtime_name(v->cpu_runtime),
              runtime_name(DNNL_CPU_THREADING_RUNTIME), isa_name(dnnl::get_effective_cpu_isa()),
              omp_get_max_threads());
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  for (const Model& md : kModels) {
    if (!listed(models, md.name)) continue;
    for (const Case& c : cases_of(md)) {
      for (const char* d : {"f32", "bf16"}) {
        if (!listed(dtypes, d)) continue;
        const Result r = std::strcmp(d, "f32") == 0 ? run_f32(eng, c, reps) : run_bf16(eng, c, reps);
        std::printf("case %s %s %s %lld %lld %lld %.6e %.6e %.6e %s\n", c.model.c_str(), c.name.c_str(), d,
                    static_cast<long long>(c.m), static_cast<long long>(c.n), static_cast<long long>(c.k),
                    r.best, r.median, r.cpu, r.impl.c_str());
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
