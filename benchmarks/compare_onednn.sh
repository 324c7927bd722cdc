#!/usr/bin/env bash
# Side by side: the training step's GEMMs (benchmarks/onednn_gemm.cpp) through the oneDNN the library
# links (the build's onednn_gemm) and through a second oneDNN installed under PREFIX (PREFIX/include,
# PREFIX/lib/libdnnl.so), as a fraction of the measured peak per dtype (benchmarks/cpu_peak).
#
#   benchmarks/compare_onednn.sh PREFIX [BUILD_DIR] [ROUNDS]
#   env: THREADS (2), REPS (calls per case and round, 5), MODELS (mini,gpt2), DTYPES (f32,bf16),
#        CXX (c++), OMP_WAIT_POLICY (passive); B_LDFLAGS (extra link flags for the second oneDNN,
#        e.g. -Wl,-rpath-link,DIR for its own dependencies) and B_ENV (VAR=value ... set for its runs
#        only, e.g. LD_LIBRARY_PATH for a build that needs a SYCL or TBB runtime)
#
# Rounds alternate the two programs (ABAB..., the order flipped every round) with the peak measured
# before each round, so that both see the same load. Per case and round the fastest call counts;
# the table gives the median over rounds. Rates are over CPU time (onednn_gemm's cpu_s: the process
# CPU time of a call over its threads), like the peak, so that other jobs on a shared machine slow
# the run but do not lower the figures; the fastest wall-clock call is shown beside it.
#
# The second oneDNN must use the same threading runtime as the library (GNU OpenMP, libgomp): one
# built for Intel's libiomp5 would put two OpenMP runtimes in one process. The script prints what
# each library needs (readelf) and stops on a libiomp5 build.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:?usage: benchmarks/compare_onednn.sh PREFIX [BUILD_DIR] [ROUNDS]}
build=${2:-build} rounds=${3:-3}
THREADS=${THREADS:-2} REPS=${REPS:-5} MODELS=${MODELS:-mini,gpt2} DTYPES=${DTYPES:-f32,bf16}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} OMP_NUM_THREADS=$THREADS
for f in "$build/bin/onednn_gemm" "$build/bin/cpu_peak" "$prefix/include/oneapi/dnnl/dnnl.hpp" "$prefix/lib/libdnnl.so"; do
  [[ -e $f ]] || { echo "compare_onednn.sh: $f is missing (build targets onednn_gemm cpu_peak; PREFIX holds include/ and lib/)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
other="$work/onednn_gemm_other"
# The flags of a Release build (CMake's -O3 -DNDEBUG), as the build's onednn_gemm: with -O2 the
# bf16 rows' widening loops ran slower in B than in A with the same oneDNN (A/A control, 2026-11-27).
# shellcheck disable=SC2086 # B_LDFLAGS is a list of flags
"${CXX:-c++}" -O3 -DNDEBUG -std=c++20 -fopenmp -I"$prefix/include" benchmarks/onednn_gemm.cpp -L"$prefix/lib" -ldnnl \
  -Wl,-rpath,"$prefix/lib" ${B_LDFLAGS:-} -o "$other"

runtime() { readelf -d "$1" | sed -n 's/.*NEEDED.*\[\(lib\(gomp\|iomp5\|omp\|tbb\|sycl\)[^]]*\)\].*/\1/p' | tr '\n' ' '; }
base_lib=$(ldd "$build/bin/onednn_gemm" | awk '/libdnnl/ {print $3}')
echo "date: $(date -u +%Y-%m-%d\ %H:%M) UTC"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p')), $(nproc) CPUs, threads $THREADS, OMP_WAIT_POLICY=$OMP_WAIT_POLICY"
echo "cpu flags: $(grep -m1 -o -w 'avx[0-9a-z_]*\|fma\|f16c\|amx[a-z_]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "A: $base_lib needs $(runtime "$base_lib")"
echo "B: $prefix/lib/libdnnl.so needs $(runtime "$prefix/lib/libdnnl.so")"
if [[ $(runtime "$prefix/lib/libdnnl.so") == *iomp5* ]]; then
  echo "compare_onednn.sh: $prefix/lib/libdnnl.so uses Intel's OpenMP (libiomp5); the library uses libgomp" >&2
  exit 1
fi

args=(--reps "$REPS" --models "$MODELS" --dtypes "$DTYPES")
for r in $(seq 1 "$rounds"); do
  "$build/bin/cpu_peak" | sed "s/^/$r /" >>"$work/peak"
  if ((r % 2)); then order="A B"; else order="B A"; fi
  for v in $order; do
    if [[ $v == A ]]; then
      "$build/bin/onednn_gemm" "${args[@]}" | sed "s/^/$r $v /" >>"$work/runs"
    else
      # shellcheck disable=SC2086 # B_ENV is a list of VAR=value words
      env ${B_ENV:-} "$other" "${args[@]}" | sed "s/^/$r $v /" >>"$work/runs"
    fi
  done
  echo "round $r done ($(cut -d' ' -f1 /proc/loadavg) load)" >&2
done
grep '^1 A #\|^1 B #' "$work/runs" | cut -d' ' -f2- | sed 's/^/version /'
grep '^1 #' "$work/peak" | cut -d' ' -f2-
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$work/peak" "$work/runs" "$rounds" <<'EOF'
import statistics, sys
peak_file, runs_file, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
peaks = {"f32": [], "bf16": []}
for line in open(peak_file):
    f = line.split()
    if len(f) > 3 and f[1] == "peak":
        peaks["f32"].append(float(f[2])); peaks["bf16"].append(float(f[3]))
peak = {d: statistics.median(v) for d, v in peaks.items()}
print(f"peak (median of {rounds} rounds, GFLOP/s): fp32 {peak['f32']:.1f}, bf16 {peak['bf16']:.1f}")
layers = {"mini": 6, "gpt2": 12}  # onednn_gemm.cpp's models
rows, impl = {}, {}
for line in open(runs_file):
    f = line.split()
    if len(f) < 12 or f[2] != "case":
        continue
    _, v, _, model, name, dt, m, n, k, best, _, cpu = f[:12]
    key = (model, name, dt)
    flop = 2.0 * int(m) * int(n) * int(k)
    rows.setdefault(key, {"A": [], "B": [], "shape": f"{m}x{n}x{k}"})
    rows[key][v].append((flop / float(cpu) / 1e9, flop / float(best) / 1e9))
    impl[(key, v)] = f[12] if len(f) > 12 else "?"
print()
print("| model | GEMM | dtype | m x n x k | A % of peak | B % of peak | B / A | A wall-clock best | B wall-clock best | A impl | B impl |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
totals = {}
for key, r in rows.items():
    model, name, dt = key
    a = statistics.median(x[0] for x in r["A"]); b = statistics.median(x[0] for x in r["B"])
    aw = statistics.median(x[1] for x in r["A"]); bw = statistics.median(x[1] for x in r["B"])
    p = peak[dt]
    print(f"| {model} | {name} | {dt} | {r['shape']} | {100*a/p:.0f} % | {100*b/p:.0f} % | {b/a:.2f} | "
          f"{100*aw/p:.0f} % | {100*bw/p:.0f} % | {impl[(key,'A')]} | {impl[(key,'B')]} |")
    m, n, k = map(int, r["shape"].split("x"))
    w = 1 if name.startswith("lm_head") else layers[model]  # GFLOP of this GEMM in one step
    fl = w * 2.0 * m * n * k / 1e9
    t = totals.setdefault((model, dt), [0.0, 0.0, 0.0])
    t[0] += fl; t[1] += fl / a; t[2] += fl / b
print()
print("A step's GEMMs together (every layer's four linears and the lm head: total FLOP over total time):")
for (model, dt), (fl, ta, tb) in totals.items():
    print(f"  {model} {dt}: {fl:.0f} GFLOP, A {100*fl/ta/peak[dt]:.0f} % of peak, B {100*fl/tb/peak[dt]:.0f} %, B / A {ta/tb:.2f}")
EOF
