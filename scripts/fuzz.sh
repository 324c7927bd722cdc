#!/usr/bin/env bash
# Fuzzes the file parsers with libFuzzer under AddressSanitizer + UBSan (docs/fuzzing.md).
#
#   scripts/fuzz.sh [--runs N] [--merge] [TARGET...]
#
# Builds the fuzz targets with clang into $BUILD_DIR (default build-fuzz; PARALLEL_FUZZ=ON), then
# runs each TARGET (default: all of fuzz/CMakeLists.txt's) for N executions (default 1000000), one
# after the other, seeded with its committed corpus fuzz/corpus/TARGET/. New inputs go to
# $BUILD_DIR/fuzz-work/TARGET/corpus, crash/timeout/OOM inputs to $BUILD_DIR/fuzz-work/TARGET/ and,
# so that ctest replays them once fixed, into fuzz/corpus/TARGET/ as crash-*, timeout-*, oom-*.
# --merge then replaces fuzz/corpus/TARGET/ by the minimized union (libFuzzer -set_cover_merge=1:
# few inputs that keep all the edge coverage), keeping every crash-*/timeout-*/oom-* file.
# A summary line per target (executions, seconds, exec/s, corpus, findings) goes to stdout and to
# $BUILD_DIR/fuzz-work/summary.txt. Exits 1 when any target found something.
# Needs clang and libFuzzer (scripts/install-deps.sh --with-fuzz). Runs at nice 19, one fuzzer at a
# time; FUZZ_ARGS adds libFuzzer flags (e.g. FUZZ_ARGS=-max_total_time=600).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build_dir=${BUILD_DIR:-build-fuzz}
runs=1000000
merge=0
targets=()
while (($#)); do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --merge) merge=1; shift ;;
    -h | --help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all=$(sed -n 's/^set(PARALLEL_FUZZ_TARGETS \(.*\))$/\1/p' fuzz/CMakeLists.txt)
((${#targets[@]})) || read -ra targets <<<"$all"
for t in "${targets[@]}"; do
  [[ " $all " == *" $t "* ]] || { echo "fuzz.sh: unknown target '$t' (known: $all)" >&2; exit 2; }
done

command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found: scripts/install-deps.sh --with-fuzz" >&2; exit 1; }
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
nice -n 10 cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}" -DPARALLEL_WITH_CUDA=OFF -DPARALLEL_FUZZ=ON \
  -DPARALLEL_BUILD_TESTS=OFF -DPARALLEL_BUILD_BENCHMARKS=OFF -DPARALLEL_BUILD_EXAMPLES=OFF >/dev/null
build_targets=()
for t in "${targets[@]}"; do build_targets+=(--target "fuzz_$t"); done
nice -n 10 cmake --build "$build_dir" -j2 "${build_targets[@]}"

work=$root/$build_dir/fuzz-work
# The targets write each input to a file for the parser to open: tmpfs keeps that off the disk.
[[ -z ${TMPDIR:-} && -w /dev/shm ]] && export TMPDIR=/dev/shm
mkdir -p "$work"
summary=$work/summary.txt
: >"$summary"
status=0
for t in "${targets[@]}"; do
  bin=$root/$build_dir/bin/fuzz_$t
  seeds=$root/fuzz/corpus/$t
  dir=$work/$t
  rm -rf "$dir"
  mkdir -p "$dir/corpus" "$seeds"
  # -timeout: one input taking 10 s is a hang. -rss_limit_mb / -malloc_limit_mb: a parser that
  # allocates 512 MB for an input of at most 4 KB trusted a size field it should have checked.
  # -error_exitcode stays 77 so that a finding is told apart from a broken build or script.
  echo "fuzz.sh: $t: $runs executions" >&2
  start=$(date +%s.%N)
  set +e
  (cd "$dir" && nice -n 19 "$bin" -runs="$runs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=512 -error_exitcode=77 -timeout_exitcode=77 -print_final_stats=1 \
    -artifact_prefix="$dir/" ${FUZZ_ARGS:-} "$dir/corpus" "$seeds" >"$dir/log" 2>&1)
  rc=$?
  set -e
  seconds=$(echo "$(date +%s.%N) - $start" | bc)
  executed=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
  findings=()
  for f in "$dir"/crash-* "$dir"/timeout-* "$dir"/oom-* "$dir"/leak-* "$dir"/slow-unit-*; do
    [[ -e $f ]] || continue
    findings+=("$(basename "$f")")
    cp "$f" "$seeds/"
  done
  if ((rc != 0)); then
    status=1
    grep -E "ERROR: |SUMMARY: |runtime error|violated|terminate called|what\(\)" "$dir/log" | head -5 >&2 || true
  fi
  if ((merge)); then
    rm -rf "$dir/merged"
    mkdir -p "$dir/merged"
    # -use_counters=0: cover every edge, not every hit-count bucket of every edge; set_cover_merge:
    # the greedy set cover rather than "smallest first", so that the committed corpus stays tens of
    # files per target rather than hundreds.
    nice -n 19 "$bin" -set_cover_merge=1 -use_counters=0 -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
      -malloc_limit_mb=512 -artifact_prefix="$dir/merge-" "$dir/merged" "$seeds" "$dir/corpus" >"$dir/merge.log" 2>&1
    find "$seeds" -maxdepth 1 -type f ! -name 'crash-*' ! -name 'timeout-*' ! -name 'oom-*' -delete
    cp "$dir"/merged/* "$seeds/" 2>/dev/null || true
  fi
  line=$(printf '%-24s executions %9s  seconds %7.0f  exec/s %6.0f  corpus %4d  rc %d  findings: %s' "$t" \
    "${executed:-?}" "$seconds" "$(echo "${executed:-0} / $seconds" | bc -l)" \
    "$(find "$seeds" -maxdepth 1 -type f | wc -l)" "$rc" "${findings[*]:-none}")
  echo "$line" | tee -a "$summary"
done
exit $status
