// LD_PRELOAD tool: memcpy / memmove calls by calling address (count and bytes), for copies that a
// profile shows but cannot attribute (glibc's memmove has no unwind info for perf's call graphs).
//   gcc -O2 -shared -fPIC benchmarks/memcpy_callers.c -o /tmp/memcpy_callers.so -ldl
//   MEMCOUNT_OUT=/tmp/m LD_PRELOAD=/tmp/memcpy_callers.so build/bin/pretrain_gpt ...
// writes /tmp/m.PID: count, bytes, symbol, object, offset (addr2line -f -C -e OBJECT OFFSET).
// Run two step counts and subtract to get the calls of one step.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
typedef void* (*cp_t)(void*, const void*, size_t);
static cp_t rcpy, rmove;
static int resolving;
#define MAXC 4096
static void* addr[MAXC];
static long cnt[MAXC];
static double bytes[MAXC];
static int n;
static void rec(void* a, size_t len) {
  int i;
  for (i = 0; i < n; i++)
    if (addr[i] == a) break;
  if (i == n) {
    if (n < MAXC)
      n++;
    else
      i = MAXC - 1;
    addr[i] = a;
  }
  __atomic_add_fetch(&cnt[i], 1, __ATOMIC_RELAXED);
  bytes[i] += len;
}
static void* slow(void* d, const void* s, size_t k) {
  char* dd = d;
  const char* ss = s;
  if (dd < ss)
    for (size_t i = 0; i < k; i++) dd[i] = ss[i];
  else
    for (size_t i = k; i-- > 0;) dd[i] = ss[i];
  return d;
}
static void init() {
  if (rcpy || resolving) return;
  resolving = 1;
  rcpy = (cp_t)dlsym(RTLD_NEXT, "memcpy");
  rmove = (cp_t)dlsym(RTLD_NEXT, "memmove");
  resolving = 0;
}
void* memcpy(void* d, const void* s, size_t k) {
  init();
  if (!rcpy) return slow(d, s, k);
  rec(__builtin_return_address(0), k);
  return rcpy(d, s, k);
}
void* memmove(void* d, const void* s, size_t k) {
  init();
  if (!rmove) return slow(d, s, k);
  rec(__builtin_return_address(0), k);
  return rmove(d, s, k);
}
__attribute__((destructor)) static void dump() {
  const char* p = getenv("MEMCOUNT_OUT");
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
    if (dladdr(addr[i], &di)) {
      if (di.dli_sname) s = di.dli_sname;
      fn = di.dli_fname;
      off = (uintptr_t)addr[i] - (uintptr_t)di.dli_fbase;
    }
    fprintf(o, "%ld %.0f %s %s 0x%lx\n", cnt[i], bytes[i], s, fn, (unsigned long)off);
  }
  fclose(o);
}
