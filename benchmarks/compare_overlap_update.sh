#!/usr/bin/env bash
# Side by side, dp2 under mpirun: tokens/s of the mini GPT's training step (6 x 384, vocab 8192,
# seq 256; 2 micro-batches of 1 sequence per rank, no clipping, overlap_grad_reduce, buckets of
# BUCKET elements) with optimizer.overlap_update true against false (docs/optimizer.md#the-overlapped-update),
# under plain AdamW (all-reduce) and ZeRO-1 (with overlap_param_gather), in PRECISION, runs
# alternating, median of each run's steps after the first two, then the median over the rounds.
#   benchmarks/compare_overlap_update.sh [BUILD_DIR] [ROUNDS]
#   env: PRECISION (fp32), THREADS per rank (1), BUCKET (1000000), STEPS (8), MPIEXEC (mpirun)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build} rounds=${2:-3}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
THREADS=${THREADS:-1} PRECISION=${PRECISION:-fp32} BUCKET=${BUCKET:-1000000} STEPS=${STEPS:-8}
read -r -a mpiexec <<<"${MPIEXEC:-mpirun --oversubscribe --allow-run-as-root}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "date: $(date -u +%Y-%m-%d)"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; 2 ranks x $THREADS threads; $PRECISION; buckets of $BUCKET"

# run OVERLAP [--set ...]: median tokens/s over the steps after the first two.
run() {
  local overlap=$1
  shift
  OMP_NUM_THREADS=$THREADS "${mpiexec[@]}" -np 2 -x OMP_NUM_THREADS -x OMP_WAIT_POLICY "$build/bin/pretrain_gpt" \
    --config configs/tiny.yaml --set model.num_layers=6 --set model.hidden_size=384 \
    --set model.num_attention_heads=6 --set model.vocab_size=8192 --set model.seq_length=256 \
    --set train.micro_batch_size=1 --set train.global_batch_size=4 --set train.steps="$STEPS" \
    --set train.log_interval=1 --set train.precision="$PRECISION" --set optimizer.warmup_steps=0 \
    --set optimizer.clip_grad=0 --set optimizer.overlap_grad_reduce=true --set optimizer.bucket_size="$BUCKET" \
    --set optimizer.overlap_update="$overlap" --set train.output_dir="$work/run" "$@" >"$work/log" 2>&1 ||
    { tail -5 "$work/log" >&2; exit 1; }
  grep -q "overlapped update $([[ $overlap == true ]] && echo on || echo off)" "$work/log" ||
    { echo "the run did not say overlapped update $overlap" >&2; exit 1; }
  grep -o '"tokens_per_sec":[^,}]*' "$work/run/metrics.jsonl" | cut -d: -f2 | tail -n +3 | sort -g |
    awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
  rm -rf "$work/run"
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

z1=(--set optimizer.sharding=optim --set optimizer.overlap_param_gather=true)
printf "%-6s %14s %14s %14s %14s\n" round adamw-overlap adamw-unfused zero1-overlap zero1-unfused
a=() b=() c=() d=()
for r in $(seq 1 "$rounds"); do
  a+=("$(run true)") b+=("$(run false)") c+=("$(run true "${z1[@]}")") d+=("$(run false "${z1[@]}")")
  printf "%-6s %14.1f %14.1f %14.1f %14.1f\n" "$r" "${a[-1]}" "${b[-1]}" "${c[-1]}" "${d[-1]}"
done
ma=$(echo "${a[@]}" | median) mb=$(echo "${b[@]}" | median) mc=$(echo "${c[@]}" | median) md=$(echo "${d[@]}" | median)
printf "%-6s %14.1f %14.1f %14.1f %14.1f\n" median "$ma" "$mb" "$mc" "$md"
echo "overlapped / unfused (tokens/s): adamw $(echo "scale=3; $ma / $mb" | bc), zero1 $(echo "scale=3; $mc / $md" | bc)"
