# shellcheck shell=bash
# Sourced by compare_pytorch2.sh and compare_libs.sh: how one of our training steps is timed.
# Needs THREADS set; run from the repository root.

# The median of numbers given one per line or separated by spaces.
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

# ours_step BUILD_DIR WORK_DIR L H HEADS V S B STEPS PRECISION [PREFIX...]: pretrain_gpt on one rank
# (configs/tiny.yaml reshaped, batch B of sequences S, STEPS timed steps after 2 warm-up ones),
# started through PREFIX (e.g. env LD_LIBRARY_PATH=...) when given. Prints "tokens/s mfu", the
# medians of the timed steps; the MFU is against the peak the trainer measured at its start.
ours_step() {
  local build=$1 work=$2 L=$3 H=$4 HEADS=$5 V=$6 S=$7 B=$8 STEPS=$9 prec=${10}
  shift 10
  "$@" env OMP_NUM_THREADS="$THREADS" "$build/bin/pretrain_gpt" --config configs/tiny.yaml \
    --set model.num_layers="$L" --set model.hidden_size="$H" --set model.num_attention_heads="$HEADS" \
    --set model.vocab_size="$V" --set model.seq_length="$S" --set train.micro_batch_size="$B" \
    --set train.global_batch_size="$B" --set train.steps=$((STEPS + 2)) --set train.log_interval=1 \
    --set train.precision="$prec" --set optimizer.warmup_steps=0 --set train.output_dir="$work/run" \
    >"$work/ours.log" 2>&1 || { tail -5 "$work/ours.log" >&2; return 1; }
  local tps mfu
  tps=$(grep -o '"tokens_per_sec":[^,}]*' "$work/run/metrics.jsonl" | cut -d: -f2 | tail -n +3 | median)
  mfu=$(grep -o '"mfu":[^,}]*' "$work/run/metrics.jsonl" | cut -d: -f2 | tail -n +3 | median)
  rm -rf "$work/run"
  echo "$tps $mfu"
}
