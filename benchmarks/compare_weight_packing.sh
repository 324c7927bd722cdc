#!/usr/bin/env bash
# Side by side, one rank: tokens/s of the mini GPT's training step with 4 micro-batches of 1
# sequence, weights packed once per step (ops::WeightPackingScope, the default) against packed
# inside every GEMM call (PARALLEL_PACK_WEIGHTS=0), fp32 and bf16, runs alternating.
#   benchmarks/compare_weight_packing.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build} rounds=${2:-3}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
THREADS=${THREADS:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "date: $(date -u +%Y-%m-%d)"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; threads $THREADS"

# run PRECISION PACK: median tokens/s over the steps after the first two.
run() {
  PARALLEL_PACK_WEIGHTS=$2 OMP_NUM_THREADS=$THREADS "$build/bin/pretrain_gpt" --config configs/tiny.yaml \
    --set model.num_layers=6 --set model.hidden_size=384 --set model.num_attention_heads=6 \
    --set model.vocab_size=8192 --set model.seq_length=256 --set train.micro_batch_size=1 \
    --set train.global_batch_size=4 --set train.steps=10 --set train.log_interval=1 \
    --set train.precision="$1" --set optimizer.warmup_steps=0 --set train.output_dir="$work/run" \
    >"$work/log" 2>&1 || { tail -5 "$work/log" >&2; exit 1; }
  grep -o '"tokens_per_sec":[^,}]*' "$work/run/metrics.jsonl" | cut -d: -f2 | tail -n +3 | sort -g |
    awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
  rm -rf "$work/run"
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

printf "%-6s %14s %14s %14s %14s\n" round fp32-packed fp32-per-call bf16-packed bf16-per-call
a=() b=() c=() d=()
for r in $(seq 1 "$rounds"); do
  a+=("$(run fp32 1)") b+=("$(run fp32 0)") c+=("$(run bf16 1)") d+=("$(run bf16 0)")
  printf "%-6s %14.0f %14.0f %14.0f %14.0f\n" "$r" "${a[-1]}" "${b[-1]}" "${c[-1]}" "${d[-1]}"
done
ma=$(echo "${a[@]}" | median) mb=$(echo "${b[@]}" | median) mc=$(echo "${c[@]}" | median) md=$(echo "${d[@]}" | median)
printf "%-6s %14.0f %14.0f %14.0f %14.0f\n" median "$ma" "$mb" "$mc" "$md"
echo "packed / per call: fp32 $(echo "scale=3; $ma / $mb" | bc), bf16 $(echo "scale=3; $mc / $md" | bc)"
