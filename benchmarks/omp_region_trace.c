// LD_PRELOAD tool: every top-level OpenMP parallel region (GOMP_parallel) of a process, by the
// address that opened it, with its wall time and the thread-seconds its team spent inside the
// region's body (CLOCK_THREAD_CPUTIME_ID: time a thread slept at a barrier or waited for a core is
// not counted). Regions that ran on one thread (an `if` clause false) are marked [1thr].
//   gcc -O2 -shared -fPIC benchmarks/omp_region_trace.c -o /tmp/omp_region_trace.so -ldl
//   OMPCOUNT_OUT=/tmp/r LD_PRELOAD=/tmp/omp_region_trace.so OMP_NUM_THREADS=2 build/bin/pretrain_gpt ...
// writes /tmp/r.PID (count, wall s, busy thread-s, symbol, object, offset per region site; resolve
// a static symbol with addr2line -f -C -e OBJECT OFFSET) and /tmp/r.PID.ev (start, end, site of
// every region, for per-step sums). docs/benchmarks.md, issue 28 "Between the kernels".
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
typedef void (*fn_t)(void*);
typedef void (*gp_t)(fn_t, void*, unsigned, unsigned);
#define MAXC 4096
static void* addr[MAXC];
static long cnt[MAXC];
static double secs[MAXC];
static int n;
static double now() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
static int slot(void* a) {
  for (int i = 0; i < n; i++)
    if (addr[i] == a) return i;
  if (n < MAXC) {
    addr[n] = a;
    return n++;
  }
  return MAXC - 1;
}
static int depth;
static double busy[MAXC];
static double ev0[2000000], ev1[2000000];
static short evs[2000000];
static long nev;
struct tr {
  fn_t f;
  void* d;
  long acc;
};
static double tcpu() {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
static void tramp(void* p) {
  struct tr* r = p;
  double a = tcpu();
  r->f(r->d);
  double b = tcpu();
  __atomic_fetch_add(&r->acc, (long)((b - a) * 1e9), __ATOMIC_RELAXED);
}
void GOMP_parallel(fn_t f, void* d, unsigned nt, unsigned fl) {
  static gp_t real;
  if (!real) real = (gp_t)dlsym(RTLD_NEXT, "GOMP_parallel");
  void* ra = (void*)((uintptr_t)__builtin_return_address(0) | (nt == 1 ? 1ul << 62 : 0));
  int top = depth++ == 0;
  double t0 = top ? now() : 0;
  struct tr r = {f, d, 0};
  if (top)
    real(tramp, &r, nt, fl);
  else
    real(f, d, nt, fl);
  depth--;
  if (top) {
    int s = slot(ra);
    double t1 = now();
    cnt[s]++;
    secs[s] += t1 - t0;
    busy[s] += r.acc * 1e-9;
    if (nev < 2000000) {
      ev0[nev] = t0;
      ev1[nev] = t1;
      evs[nev] = s;
      nev++;
    }
  }
}
__attribute__((destructor)) static void dump() {
  const char* p = getenv("OMPCOUNT_OUT");
  if (!p || n == 0) return;
  char fnm[512];
  snprintf(fnm, 512, "%s.%d", p, getpid());
  FILE* o = fopen(fnm, "w");
  if (!o) return;
  for (int i = 0; i < n; i++) {
    Dl_info di;
    const char* s = "?";
    const char* fn = "?";
    uintptr_t off = 0;
    void* a = (void*)((uintptr_t)addr[i] & ~(1ul << 62));
    int one = ((uintptr_t)addr[i] >> 62) & 1;
    if (dladdr(a, &di)) {
      if (di.dli_sname) s = di.dli_sname;
      fn = di.dli_fname;
      off = (uintptr_t)a - (uintptr_t)di.dli_fbase;
    }
    fprintf(o, "%ld %.6f %.6f %s%s %s 0x%lx\n", cnt[i], secs[i], busy[i], s, one ? "[1thr]" : "", fn,
            (unsigned long)off);
  }
  fclose(o);
  snprintf(fnm, 512, "%s.%d.ev", p, getpid());
  o = fopen(fnm, "w");
  for (long i = 0; i < nev; i++) fprintf(o, "%.7f %.7f %d\n", ev0[i], ev1[i], evs[i]);
  fclose(o);
}
