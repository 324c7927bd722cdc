#!/usr/bin/env bash
# One change's cost to the training step: the same pretrain_gpt binary with two libparallel builds,
# rounds alternating so both see the same machine load.
#   benchmarks/compare_libs.sh BASE_LIB_DIR [BUILD_DIR] [ROUNDS] [fp32|bf16] [mini|gpt2]
# BASE_LIB_DIR holds the baseline's libparallel.so* (copy BUILD_DIR/lib/libparallel.so* aside before
# rebuilding); it is put first on LD_LIBRARY_PATH, which the binary's RUNPATH does not override. The
# other side is BUILD_DIR's own library. Models as in compare_pytorch2.sh: "mini" 6 layers x 384,
# vocab 8192, seq 256, batch 4; "gpt2" 12 x 768, vocab 50257. One rank, $THREADS threads (default 2),
# 10 timed steps after 2 warm-up ones. Prints a row per run (median tokens/s and MFU of the timed
# steps) and the ratio of the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || {
  echo "usage: benchmarks/compare_libs.sh BASE_LIB_DIR [BUILD_DIR] [ROUNDS] [fp32|bf16] [mini|gpt2]" >&2
  exit 2
}
base=$(readlink -f "$1") build=${2:-build} rounds=${3:-3} prec=${4:-fp32} model=${5:-mini}
THREADS=${THREADS:-2}
compgen -G "$base/libparallel.so*" >/dev/null || { echo "compare_libs: no libparallel.so in $base" >&2; exit 1; }
case $model in
  mini) shape=(6 384 6 8192 256 4 10) ;;
  gpt2) shape=(12 768 12 50257 256 4 10) ;;
  *) echo "compare_libs: model is mini or gpt2, not $model" >&2; exit 2 ;;
esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source benchmarks/ours_step.sh

echo "date: $(date -u '+%Y-%m-%d %H:%M') UTC; machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; $model $prec, $THREADS threads"
printf "%-6s %-5s %12s %8s\n" round lib tokens/s mfu
for r in $(seq 1 "$rounds"); do
  for side in base new; do
    prefix=()
    [[ $side == base ]] && prefix=(env "LD_LIBRARY_PATH=$base${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
    out=$(ours_step "$build" "$work" "${shape[@]}" "$prec" "${prefix[@]}")
    read -r tps mfu <<<"$out"
    printf "%-6s %-5s %12.1f %8.3f\n" "$r" $side "$tps" "$mfu"
    echo "$tps" >>"$work/$side"
  done
done
b=$(median <"$work/base") n=$(median <"$work/new")
echo "median tokens/s: base $b, new $n, new/base $(awk -v n="$n" -v b="$b" 'BEGIN {printf "%.3f", n / b}')"
