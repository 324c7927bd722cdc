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
  mini) shape=(6 384 6 8192) ;;
  gpt2) shape=(12 768 12 50257) ;;
  *) echo "compare_libs: model is mini or gpt2, not $model" >&2; exit 2 ;;
esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

echo "date: $(date -u '+%Y-%m-%d %H:%M') UTC; machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; $model $prec, $THREADS threads"
run() {  # run base|new: prints tokens/s and MFU
  local lib=()
  [[ $1 == base ]] && lib=(env "LD_LIBRARY_PATH=$base${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  "${lib[@]}" env OMP_NUM_THREADS="$THREADS" "$build/bin/pretrain_gpt" --config configs/tiny.yaml \
    --set model.num_layers="${shape[0]}" --set model.hidden_size="${shape[1]}" \
    --set model.num_attention_heads="${shape[2]}" --set model.vocab_size="${shape[3]}" \
    --set model.seq_length=256 --set train.micro_batch_size=4 --set train.global_batch_size=4 \
    --set train.steps=12 --set train.log_interval=1 --set train.precision="$prec" \
    --set optimizer.warmup_steps=0 --set train.output_dir="$work/run" >"$work/log" 2>&1 ||
    { tail -5 "$work/log" >&2; exit 1; }
  local tps mfu
  tps=$(grep -o '"tokens_per_sec":[^,}]*' "$work/run/metrics.jsonl" | cut -d: -f2 | tail -n +3 | median)
  mfu=$(grep -o '"mfu":[^,}]*' "$work/run/metrics.jsonl" | cut -d: -f2 | tail -n +3 | median)
  rm -rf "$work/run"
  echo "$tps $mfu"
}
printf "%-6s %-5s %12s %8s\n" round lib tokens/s mfu
for r in $(seq 1 "$rounds"); do
  for side in base new; do
    read -r tps mfu < <(run $side)
    printf "%-6s %-5s %12.1f %8.3f\n" "$r" $side "$tps" "$mfu"
    echo "$tps" >>"$work/$side"
  done
done
b=$(median <"$work/base") n=$(median <"$work/new")
echo "median tokens/s: base $b, new $n, new/base $(awk -v n="$n" -v b="$b" 'BEGIN {printf "%.3f", n / b}')"
