#!/usr/bin/env bash
# Page faults, conversion bytes and time of a training step after the first (issue 28, items 2 and
# 5): the mini GPT (6 x 384, 6 heads, vocab 8192, seq 256, batch 4) on one rank, bf16 and fp32,
# as pretrain_gpt reports them per step in metrics.jsonl (minor_faults, conversion_bytes,
# step_time_ms). Two builds of the library run side by side through LD_LIBRARY_PATH with the same
# pretrain_gpt binary (so both must export the same ABI), alternating, ROUNDS rounds; each figure is
# the median over steps 3.. of a run, and the table gives the median of those over the rounds.
#
#   benchmarks/step_faults.sh BUILD_DIR BASE_LIB_DIR NEW_LIB_DIR [ROUNDS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?BUILD_DIR}
base_lib=${2:?BASE_LIB_DIR}
new_lib=${3:?NEW_LIB_DIR}
rounds=${4:-3}
steps=${5:-8}
threads=${OMP_NUM_THREADS:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One run: prints "faults conversion_bytes step_ms", medians over steps 3..steps.
run() {
  local lib=$1 prec=$2
  rm -rf "$work/run"
  LD_LIBRARY_PATH=$lib OMP_NUM_THREADS=$threads "$build/bin/pretrain_gpt" --config configs/tiny.yaml \
    --set model.num_layers=6 --set model.hidden_size=384 --set model.num_attention_heads=6 \
    --set model.vocab_size=8192 --set model.seq_length=256 --set train.micro_batch_size=4 \
    --set train.global_batch_size=4 --set train.steps="$steps" --set train.log_interval=1 \
    --set train.precision="$prec" --set optimizer.warmup_steps=0 --set train.output_dir="$work/run" \
    >/dev/null 2>&1
  python3 - "$work/run/metrics.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_sec"' in l]
later = [r for r in rows if r["step"] >= 3]
med = lambda k: statistics.median(r[k] for r in later)
print(med("minor_faults"), med("conversion_bytes"), med("step_time_ms"))
EOF
}

for prec in bf16 fp32; do
  : >"$work/$prec.base"
  : >"$work/$prec.new"
  for ((r = 0; r < rounds; r++)); do
    run "$base_lib" "$prec" >>"$work/$prec.base"
    run "$new_lib" "$prec" >>"$work/$prec.new"
  done
  python3 - "$prec" "$work/$prec.base" "$work/$prec.new" <<'EOF'
import statistics, sys
prec, base, new = sys.argv[1], [l.split() for l in open(sys.argv[2])], [l.split() for l in open(sys.argv[3])]
med = lambda rows, i: statistics.median(float(r[i]) for r in rows)
print(f"{prec}: minor faults/step {med(base,0):.0f} -> {med(new,0):.0f}; conversion MB/step "
      f"{med(base,1)/1e6:.1f} -> {med(new,1)/1e6:.1f}; step ms {med(base,2):.0f} -> {med(new,2):.0f} "
      f"(new/base {med(new,2)/med(base,2):.3f}); per round base {[r[2] for r in base]} new {[r[2] for r in new]}")
EOF
done
