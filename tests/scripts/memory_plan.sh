#!/usr/bin/env bash
# The memory plan through pretrain_gpt (issue 16, item 1):
#  1. the quick-start config with model.seq_length=10000000, model.num_layers=1000000 or
#     train.global_batch_size=2147483646 (as given: the config's divisibility rule refuses it; with
#     micro-batches of 2: the memory plan, for the schedule's size) ends within 5 s with exit 2 and one
#     line naming the total, the limit, the biggest term and the key that drives it;
#  2. --plan writes plan.json (every rank's terms and peak_bytes), prints the table, trains nothing;
#  3. a short run records mem_peak_bytes in metrics.jsonl, within 10 % of the largest planned peak;
#  4. --plan --meta (the trainer's step run on the meta device) plans the same run within 10 % too,
#     and a million layers within 5 s (two short runs, extrapolated); --meta without --plan: refused;
#  5. multi-head latent attention (configs/mla_tiny.yaml) at tp 2 + sp and cp 2, and the
#     DeepSeek-V3-shaped model (configs/deepseek_v3_tiny.yaml: MLA + sigmoid group-limited MoE, a
#     shared expert, layer 0 dense) at ep 2 x etp 2 and pp 2: --plan --meta within 10 % of the
#     run's mem_peak_bytes.
#   memory_plan.sh SOURCE_DIR PRETRAIN_GPT MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2
shift 2
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PARALLEL_LOG_LEVEL=warn
fail() {
  echo "FAIL: $1"
  [[ -n ${2:-} && -f $2 ]] && tail -20 "$2"
  exit 1
}

# 1. Refusals, each within 5 s, exactly one line from the program.
refuse() {  # NAME EXPECTED_REGEX OVERRIDES...
  local name=$1 expected=$2
  shift 2
  local sets=()
  for o in "$@"; do sets+=(--set "$o"); done
  local start status=0
  start=$(date +%s.%N)
  "${mpiexec[@]}" -np 4 "$pretrain" --config "$src/configs/quickstart.yaml" "${sets[@]}" \
    --set train.output_dir="$work/$name" --set checkpoint.dir="$work/$name/ckpt" >"$work/$name.out" \
    2>"$work/$name.err" || status=$?
  local seconds
  seconds=$(echo "$(date +%s.%N) - $start" | bc)
  [[ $status -eq 2 ]] || fail "$name: exit status $status, expected 2" "$work/$name.err"
  (($(echo "$seconds < 5" | bc))) || fail "$name: took $seconds s, expected < 5 s" "$work/$name.err"
  local lines
  lines=$(grep -cE '^(memory plan|config): ' "$work/$name.err" || true)
  [[ $lines -eq 1 ]] || fail "$name: $lines refusal lines, expected 1" "$work/$name.err"
  grep -qE "$expected" "$work/$name.err" || fail "$name: the refusal does not match $expected" "$work/$name.err"
  ! grep -q "GPT: " "$work/$name.err" "$work/$name.out" || fail "$name: the model was built" "$work/$name.err"
  echo "1. $name: ${seconds:0:4} s: $(grep -E '^(memory plan|config): ' "$work/$name.err")"
}
plan_line='^memory plan: rank [0-9]+ needs [0-9.]+ GiB at its peak, more than the [0-9.]+ GiB it can use \(.*\); biggest term: '
refuse seq_length "${plan_line}activations [0-9.]+ GiB \(.*model.seq_length" model.seq_length=10000000
refuse num_layers "${plan_line}activations [0-9.]+ GiB \(model.num_layers" model.num_layers=1000000
refuse global_batch "^config: train.global_batch_size = 2147483646: must be divisible" \
  train.global_batch_size=2147483646
refuse global_batch_mbs2 "${plan_line}schedule [0-9.]+ GiB \(train.global_batch_size" \
  train.global_batch_size=2147483646 train.micro_batch_size=2

# 2. --plan: plan.json for every rank, the table, no training.
tiny=(--config "$src/configs/tiny.yaml" --set parallel.tensor=2 --set parallel.pipeline=2
  --set train.steps=3 --set train.peak_tflops=1)
"${mpiexec[@]}" -np 4 "$pretrain" "${tiny[@]}" --set train.output_dir="$work/plan" --plan >"$work/plan.out" 2>&1 ||
  fail "--plan failed" "$work/plan.out"
plan=$work/plan/plan.json
[[ -s $plan ]] || fail "--plan wrote no plan.json" "$work/plan.out"
[[ $(grep -c '"peak_bytes"' "$plan") -eq 4 ]] || fail "plan.json: not 4 ranks" "$plan"
# Pipeline messages and kernel workspaces are part of the activations term on the meta device.
for term in parameters gradients optimizer activations schedule; do
  [[ $(grep -c "\"$term\": [0-9]" "$plan") -eq 4 ]] || fail "plan.json: no $term on every rank" "$plan"
done
grep -q "^memory plan (MiB per rank)" "$work/plan.out" || fail "--plan printed no table" "$work/plan.out"
[[ ! -e $work/plan/metrics.jsonl ]] || fail "--plan trained"
echo "2. --plan: $plan with 4 ranks"
# ... and for a job of 64 ranks from one process (--world-size).
"$pretrain" --config "$src/configs/gpt2_124m.yaml" --set parallel.tensor=2 --set parallel.pipeline=4 \
  --set train.output_dir="$work/plan64" --plan --world-size 64 >"$work/plan64.out" 2>&1 ||
  fail "--plan --world-size 64 failed" "$work/plan64.out"
[[ $(grep -c '"peak_bytes"' "$work/plan64/plan.json") -eq 64 ]] || fail "--world-size 64: not 64 ranks" "$work/plan64.out"
status=0
"$pretrain" --config "$src/configs/tiny.yaml" --set train.output_dir="$work/ws" --world-size 4 >"$work/ws.out" 2>&1 ||
  status=$?
[[ $status -eq 2 ]] && grep -q "^pretrain_gpt: --world-size is for --plan only" "$work/ws.out" ||
  fail "--world-size without --plan: exit $status" "$work/ws.out"
echo "2. --plan --world-size 64 from one process: 64 ranks; without --plan: refused"

# 3. mem_peak_bytes in metrics.jsonl, against the largest planned peak.
"${mpiexec[@]}" -np 4 "$pretrain" "${tiny[@]}" --set train.output_dir="$work/plan" >"$work/train.out" 2>&1 ||
  fail "training failed" "$work/train.out"
measured=$(tail -1 "$work/plan/metrics.jsonl" | grep -o '"mem_peak_bytes":[0-9]*' | cut -d: -f2)
planned=$(grep -o '"peak_bytes": [0-9]*' "$plan" | cut -d' ' -f2 | sort -n | tail -1)
[[ -n $measured && $measured -gt 0 ]] || fail "metrics.jsonl has no mem_peak_bytes" "$work/plan/metrics.jsonl"
awk -v p="$planned" -v m="$measured" 'BEGIN { e = p / m - 1; if (e < 0) e = -e; exit !(e <= 0.10) }' ||
  fail "mem_peak_bytes $measured is not within 10 % of the largest planned peak $planned"
echo "3. mem_peak_bytes $measured, largest planned peak $planned"

# 4. --plan --meta: the same run planned by running its step on the meta device.
"$pretrain" "${tiny[@]}" --set train.output_dir="$work/meta" --plan --world-size 4 --meta >"$work/meta.out" 2>&1 ||
  fail "--plan --meta failed" "$work/meta.out"
meta_plan=$work/meta/plan.json
[[ $(grep -c '"peak_bytes"' "$meta_plan") -eq 4 ]] || fail "--meta plan.json: not 4 ranks" "$meta_plan"
for term in parameters gradients optimizer activations schedule; do
  [[ $(grep -c "\"$term\": [0-9]" "$meta_plan") -eq 4 ]] || fail "--meta plan.json: no $term on every rank" "$meta_plan"
done
on_meta=$(grep -o '"peak_bytes": [0-9]*' "$meta_plan" | cut -d' ' -f2 | sort -n | tail -1)
awk -v p="$on_meta" -v m="$measured" 'BEGIN { e = p / m - 1; if (e < 0) e = -e; exit !(e <= 0.10) }' ||
  fail "mem_peak_bytes $measured is not within 10 % of the largest peak planned on meta $on_meta"
start=$(date +%s.%N)
"$pretrain" --config "$src/configs/quickstart.yaml" --set model.num_layers=1000000 \
  --set train.output_dir="$work/meta_layers" --plan --world-size 4 --meta >"$work/meta_layers.out" 2>&1 ||
  fail "--plan --meta with a million layers failed" "$work/meta_layers.out"
seconds=$(echo "$(date +%s.%N) - $start" | bc)
(($(echo "$seconds < 5" | bc))) || fail "--plan --meta with a million layers took $seconds s, expected < 5 s"
status=0
"$pretrain" --config "$src/configs/tiny.yaml" --set train.output_dir="$work/ms" --meta >"$work/ms.out" 2>&1 ||
  status=$?
[[ $status -eq 2 ]] && grep -q "^pretrain_gpt: --meta is for --plan only" "$work/ms.out" ||
  fail "--meta without --plan: exit $status" "$work/ms.out"
echo "4. --plan --meta: largest peak $on_meta; a million layers in ${seconds:0:4} s; without --plan: refused"

# 5. MLA and DeepSeek-V3 layouts: the plan on meta against the run's peak.
plan_vs_run() {  # NAME CONFIG RANKS [--set ...]
  local name=$1 config=$2 ranks=$3
  shift 3
  local args=(--config "$src/configs/$config.yaml" --set train.steps=3 "$@")
  "${mpiexec[@]}" -np "$ranks" "$pretrain" "${args[@]}" --set train.output_dir="$work/$name" >"$work/$name.out" 2>&1 ||
    fail "$name: training failed" "$work/$name.out"
  "$pretrain" "${args[@]}" --set train.output_dir="$work/${name}_meta" --plan --world-size "$ranks" --meta \
    >"$work/${name}_meta.out" 2>&1 || fail "$name: --plan --meta failed" "$work/${name}_meta.out"
  local measured planned
  measured=$(tail -1 "$work/$name/metrics.jsonl" | grep -o '"mem_peak_bytes":[0-9]*' | cut -d: -f2)
  planned=$(grep -o '"peak_bytes": [0-9]*' "$work/${name}_meta/plan.json" | cut -d' ' -f2 | sort -n | tail -1)
  [[ -n $measured && $measured -gt 0 ]] || fail "$name: metrics.jsonl has no mem_peak_bytes" "$work/$name/metrics.jsonl"
  awk -v p="$planned" -v m="$measured" 'BEGIN { e = p / m - 1; if (e < 0) e = -e; exit !(e <= 0.10) }' ||
    fail "$name: mem_peak_bytes $measured is not within 10 % of the largest peak planned on meta $planned"
  echo "5. $name: mem_peak_bytes $measured, planned on meta $planned ($(awk -v p="$planned" -v m="$measured" \
    'BEGIN { printf "%+.2f %%", 100 * (p / m - 1) }'))"
}
plan_vs_run mla_tp2_sp mla_tiny 2 --set parallel.tensor=2 --set parallel.sequence_parallel=true
plan_vs_run mla_cp2 mla_tiny 2 --set parallel.context=2
plan_vs_run deepseek_v3_ep2_etp2 deepseek_v3_tiny 4 --set parallel.expert=2 --set parallel.expert_tensor=2
plan_vs_run deepseek_v3_pp2 deepseek_v3_tiny 2 --set parallel.pipeline=2
