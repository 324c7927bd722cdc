#!/usr/bin/env bash
# Side-by-side tokens/s of one training step: pretrain_gpt (one rank) against the same model and
# step in PyTorch CPU (benchmarks/pytorch_gpt_step.py), both on the same number of threads,
# alternating runs so both see the same machine load. Needs python3-torch (/usr/bin/python3).
#   benchmarks/compare_pytorch.sh [BUILD_DIR] [ROUNDS]
# Model of issue 6: 6 layers, width 384, 6 heads, vocab 8192, seq 256, batch 4, fp32, 2 threads.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build} rounds=${2:-3}
# Both sides use libgomp; on a shared machine its default spin-waiting threads steal cores, so both
# run with passive waiting unless the caller chose a policy.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
L=6 H=384 HEADS=6 V=8192 S=256 B=4 STEPS=12 THREADS=2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

ours() {
  OMP_NUM_THREADS=$THREADS "$build/bin/pretrain_gpt" --config configs/tiny.yaml \
    --set model.num_layers=$L --set model.hidden_size=$H --set model.num_attention_heads=$HEADS \
    --set model.vocab_size=$V --set model.seq_length=$S --set train.micro_batch_size=$B \
    --set train.global_batch_size=$B --set train.steps=$((STEPS + 2)) --set train.log_interval=1 \
    --set optimizer.warmup_steps=0 --set train.output_dir="$work/run" >/dev/null 2>&1
  # Median tokens/s over the steps after the first two (warm-up), as the PyTorch side does.
  grep -o '"tokens_per_sec":[^,}]*' "$work/run/metrics.jsonl" | cut -d: -f2 | tail -n +3 | sort -g |
    awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
  rm -rf "$work/run"
}
torch_step() { /usr/bin/python3 benchmarks/pytorch_gpt_step.py $L $H $HEADS $V $S $B $STEPS $THREADS; }

# Debian's python3-torch uses the system BLAS; the reference BLAS would make it several times
# slower and the comparison meaningless. Install OpenBLAS (scripts/install-deps.sh --with-torch).
blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 || true)
if [[ $blas != *openblas* && $blas != *blis* && $blas != *mkl* ]]; then
  echo "compare_pytorch: the system BLAS is $blas (reference BLAS?): install libopenblas0-openmp first" >&2
  exit 1
fi
echo "PyTorch BLAS: $blas"
echo "model: $L layers, width $H, $HEADS heads, vocab $V, seq $S, batch $B, fp32, $THREADS threads, OMP_WAIT_POLICY=$OMP_WAIT_POLICY"
printf "%-6s %14s %14s %8s\n" round "ours tok/s" "pytorch tok/s" ratio
for r in $(seq 1 "$rounds"); do
  a=$(ours)
  b=$(torch_step)
  awk -v r="$r" -v a="$a" -v b="$b" 'BEGIN { printf "%-6s %14.0f %14.0f %8.2f\n", r, a, b, a / b }'
done
