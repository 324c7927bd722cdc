#!/usr/bin/env bash
# The planner's step time against measured runs on this machine (docs/planner.md "Validation").
#
#   benchmarks/plan_validation.sh [build-dir] [hardware.yaml]
#
# For each layout of the tiny and mini models on 1 to 8 ranks: the predicted step time
# (pretrain_gpt --plan --hardware, every rank on this one node: --ranks-per-node N) and the measured
# one (mpirun -np N pretrain_gpt, the median step_time_ms of steps WARMUP+1..STEPS (defaults 3 and 8):
# the tiny model's third step still takes twice a later one's time, so the first three warm up). Every rank runs one OpenMP thread, as the calibrated description assumes (its device
# is one core): one or two ranks get a core each, four or eight time-share the two.
# Prints a markdown table and the median and worst |predicted / measured - 1|.
# ONLY=REGEX runs the layouts whose label matches (grep -E), e.g. ONLY='^mini' or ONLY='tp2 pp2';
# PREDICT_ONLY=1 plans without running (the measured column is left empty).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
hw=${2:-configs/hardware/this_cpu.yaml}
steps=${STEPS:-8}
warmup=${WARMUP:-3}
bin=$build/bin/pretrain_gpt
cores=$(nproc)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mini=(--set model.num_layers=6 --set model.hidden_size=384 --set model.num_attention_heads=6
      --set model.vocab_size=8192 --set model.seq_length=256)
# label | ranks | model | overrides
layouts=(
  "tiny 1 rank|1|tiny|"
  "tiny dp2|2|tiny|"
  "tiny tp2|2|tiny|--set parallel.tensor=2"
  "tiny pp2|2|tiny|--set parallel.pipeline=2"
  "tiny tp2 pp2|4|tiny|--set parallel.tensor=2 --set parallel.pipeline=2"
  "tiny dp4|4|tiny|"
  "tiny tp2 dp2 distributed|4|tiny|--set parallel.tensor=2 --set optimizer.distributed=true"
  "tiny tp2 pp2 dp2|8|tiny|--set parallel.tensor=2 --set parallel.pipeline=2 --set train.global_batch_size=16"
  "mini 1 rank|1|mini|"
  "mini dp2|2|mini|"
  "mini tp2 sp|2|mini|--set parallel.tensor=2 --set parallel.sequence_parallel=true"
  "mini pp2|2|mini|--set parallel.pipeline=2"
  "mini cp2|2|mini|--set parallel.context=2"
  "mini tp2 pp2|4|mini|--set parallel.tensor=2 --set parallel.pipeline=2"
  "mini pp2 dp2 bf16|4|mini|--set parallel.pipeline=2 --set train.precision=bf16"
  "mini 1 rank bf16|1|mini|--set train.precision=bf16"
  "mini dp2 bf16|2|mini|--set train.precision=bf16"
  "mini tp2 dp2, recompute|4|mini|--set parallel.tensor=2 --set train.recompute=full"
  "mini pp4 interleaved|4|mini|--set parallel.pipeline=4 --set parallel.virtual_stages=2 --set model.num_layers=8 --set train.global_batch_size=16"
  "mini dp8|8|mini|--set train.global_batch_size=16"
)

echo "command: benchmarks/plan_validation.sh $build $hw (STEPS=$steps WARMUP=$warmup)"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $cores cores; $(date -u '+%Y-%m-%d %H:%M UTC'); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| layout | ranks | predicted (s) | measured (s) | predicted / measured | load (1 min) |"
echo "|---|---|---|---|---|---|"
errors=()
i=0
for entry in "${layouts[@]}"; do
  IFS='|' read -r label n model extra <<<"$entry"
  i=$((i + 1))
  if [[ -n ${ONLY:-} ]] && ! grep -Eq -- "$ONLY" <<<"$label"; then continue; fi
  # shellcheck disable=SC2206
  sets=(--set data.path=synthetic --set train.log_interval=1 --set train.eval_interval=0 --set train.steps=$steps $extra)
  [[ $model == mini ]] && sets=("${mini[@]}" --set train.micro_batch_size=2 --set train.global_batch_size=4 "${sets[@]}")
  pdir=$work/p$i mdir=$work/m$i
  mkdir -p "$pdir" "$mdir"
  "$bin" --config configs/tiny.yaml "${sets[@]}" --set train.output_dir="$pdir" --plan --world-size "$n" \
    --hardware "$hw" --ranks-per-node "$n" >"$pdir/out.txt"
  predicted=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['step_time_s'])" "$pdir/plan.json")
  if [[ -n ${PREDICT_ONLY:-} ]]; then
    printf '| %s | %s | %.4f | | | |\n' "$label" "$n" "$predicted"
    continue
  fi
  OMP_NUM_THREADS=1 mpirun -np "$n" --oversubscribe --allow-run-as-root --bind-to none \
    "$bin" --config configs/tiny.yaml "${sets[@]}" --set train.output_dir="$mdir" >"$mdir/out.txt" 2>&1
  measured=$(python3 - "$mdir/metrics.jsonl" "$warmup" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
times = [r["step_time_ms"] / 1e3 for r in rows if "step_time_ms" in r and r.get("step", 0) > int(sys.argv[2])]
print(statistics.median(times))
PY
)
  load=$(cut -d' ' -f1 /proc/loadavg)
  ratio=$(python3 -c "print(f'{$predicted / $measured:.3f}')")
  errors+=("$(python3 -c "print(abs($predicted / $measured - 1))")")
  printf '| %s | %s | %.4f | %.4f | %s | %s |\n' "$label" "$n" "$predicted" "$measured" "$ratio" "$load"
done
[[ ${#errors[@]} -eq 0 ]] && exit 0
python3 - "${errors[@]}" <<'PY'
import statistics, sys
e = [float(x) for x in sys.argv[1:]]
print(f"\n{len(e)} layouts: median |error| {100 * statistics.median(e):.1f} %, worst {100 * max(e):.1f} %")
PY
