#!/usr/bin/env bash
# Tokens/s, step time and page faults of multi-rank steps after warm-up (issue 28 item 5 on the
# layouts that reduce gradients between ranks): mini dp2, mini dp2 bf16 and mini cp2 by default, and
# on request groups of four and eight (mini dp4, dp8, tp2 dp2), each rank one OpenMP thread, as
# benchmarks/plan_validation.sh runs them. Two builds run side by side, each with
# its own pretrain_gpt, alternating, ROUNDS rounds; each figure is the median over steps
# WARMUP+1..STEPS of rank 0's metrics.jsonl (tokens_per_sec, step_time_ms, minor_faults), and the
# table gives the median over the rounds.
#
#   benchmarks/multirank_step_faults.sh BASE_BUILD NEW_BUILD [ROUNDS] [STEPS]
# ONLY=REGEX picks layouts by label (grep -E), e.g. ONLY='dp4|dp8|tp2 dp2'; by default the first three
# run.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?BASE_BUILD}
new=${2:?NEW_BUILD}
rounds=${3:-3}
steps=${4:-8}
warmup=${WARMUP:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mini=(--set model.num_layers=6 --set model.hidden_size=384 --set model.num_attention_heads=6
      --set model.vocab_size=8192 --set model.seq_length=256 --set train.micro_batch_size=2
      --set train.global_batch_size=4 --set data.path=synthetic --set train.log_interval=1
      --set train.eval_interval=0)
# The last one holds Megatron's bucket (40M elements: the whole 56 MB of gradients in one) against
# PyTorch DDP's 25 MiB; run it with ONLY=buckets.
# label | ranks | overrides
layouts=("mini dp2|2|" "mini dp2 bf16|2|--set train.precision=bf16" "mini cp2|2|--set parallel.context=2"
         "mini dp2, 25 MiB buckets|2|--set optimizer.bucket_size=6553600"
         "mini dp4|4|--set train.global_batch_size=8" "mini dp4 bf16|4|--set train.global_batch_size=8 --set train.precision=bf16"
         "mini dp8|8|--set train.global_batch_size=16" "mini tp2 dp2|4|--set parallel.tensor=2")

# One run: prints "tokens_per_s step_ms faults".
run() {
  local build=$1 np=$2 extra=$3
  rm -rf "$work/run"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 mpirun -np "$np" --oversubscribe --allow-run-as-root --bind-to none \
    "$build/bin/pretrain_gpt" --config configs/tiny.yaml "${mini[@]}" --set train.steps="$steps" $extra \
    --set train.output_dir="$work/run" >"$work/out.txt" 2>&1 || { cat "$work/out.txt" >&2; exit 1; }
  python3 - "$work/run/metrics.jsonl" "$warmup" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_sec"' in l]
later = [r for r in rows if r["step"] > int(sys.argv[2])]
med = lambda k: statistics.median(r[k] for r in later)
print(med("tokens_per_sec"), med("step_time_ms"), med("minor_faults"))
PY
}

echo "command: benchmarks/multirank_step_faults.sh $base $new $rounds $steps (WARMUP=$warmup)"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC')"
echo
echo "| layout | tokens/s base | tokens/s new | new/base | step ms base / new | faults/step base / new | load (1 min) |"
echo "|---|---|---|---|---|---|---|"
for entry in "${layouts[@]}"; do
  IFS='|' read -r label np extra <<<"$entry"
  if ! grep -Eq -- "${ONLY:-^mini (dp2|dp2 bf16|cp2)$}" <<<"$label"; then continue; fi
  : >"$work/base" && : >"$work/new"
  for ((r = 0; r < rounds; r++)); do
    run "$base" "$np" "$extra" >>"$work/base"
    run "$new" "$np" "$extra" >>"$work/new"
  done
  python3 - "$label" "$work/base" "$work/new" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import statistics, sys
label, load = sys.argv[1], sys.argv[4]
base = [list(map(float, l.split())) for l in open(sys.argv[2])]
new = [list(map(float, l.split())) for l in open(sys.argv[3])]
med = lambda rows, i: statistics.median(r[i] for r in rows)
print(f"| {label} | {med(base,0):.0f} | {med(new,0):.0f} | {med(new,0)/med(base,0):.2f} | "
      f"{med(base,1):.0f} / {med(new,1):.0f} | {med(base,2):.0f} / {med(new,2):.0f} | {load} |")
PY
done
