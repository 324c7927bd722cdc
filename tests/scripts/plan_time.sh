#!/usr/bin/env bash
# The step-time plan through pretrain_gpt (issue 26, items 3-4): --plan --hardware adds the predicted
# time to plan.json and prints it; bad flags are one line each.
#   plan_time.sh SOURCE_DIR PRETRAIN_GPT MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PARALLEL_LOG_LEVEL=warn
fail() {
  echo "FAIL: $1"
  [[ -n ${2:-} && -f $2 ]] && tail -20 "$2"
  exit 1
}
hw=$src/configs/hardware/dgx_a100_80gb.yaml

# A 16-rank job (tp 2 x pp 2 x dp 4) planned from one process on a DGX A100.
"$pretrain" --config "$src/configs/tiny.yaml" --set parallel.tensor=2 --set parallel.pipeline=2 \
  --set train.global_batch_size=32 --set train.output_dir="$work/p" --plan --world-size 16 --hardware "$hw" \
  >"$work/p.out" 2>&1 || fail "--plan --hardware failed" "$work/p.out"
plan=$work/p/plan.json
python3 - "$plan" <<'PY' || fail "plan.json lacks the time fields" "$plan"
import json, sys
p = json.load(open(sys.argv[1]))
for key in ("step_time_s", "tokens_per_s", "mfu", "bubble_fraction", "model_tflops_per_device"):
    assert p[key] > 0, key
assert set(p["exposed_communication_s"]) == {"tp", "cp", "dp", "pp", "ep"}
assert p["exposed_communication_s"]["tp"] > 0 and p["exposed_communication_s"]["dp"] > 0
assert len(p["time_per_stage"]) == 2 and len(p["ranks"]) == 16  # the memory plan's ranks stay
assert abs(p["tokens_per_s"] * p["step_time_s"] / (32 * 32) - 1) < 1e-4  # 6 digits printed
assert not p["oversubscribed"]
PY
grep -q "^step time .* s, .* tokens/s, MFU" "$work/p.out" || fail "no time printed" "$work/p.out"
echo "1. --plan --world-size 16 --hardware: $(grep '^step time' "$work/p.out")"

# Four ranks on a node of two devices: oversubscribed, said so.
cat >"$work/two.yaml" <<YAML
name: two
device: {matmul_tflops: {fp32: 0.1}, vector_tflops: 0.001, memory_bandwidth_GBps: 10, op_overhead_us: 1}
node: {devices: 2}
links: {node: {bandwidth_GBps: 5, latency_us: 1}, cluster: {bandwidth_GBps: 5, latency_us: 1}}
YAML
"$pretrain" --config "$src/configs/tiny.yaml" --set train.output_dir="$work/o" --plan --world-size 4 \
  --hardware "$work/two.yaml" --ranks-per-node 4 >"$work/o.out" 2>&1 || fail "oversubscribed plan failed" "$work/o.out"
grep -q "^oversubscribed: 4 ranks per node share its devices; each rank gets 0.5 of one" "$work/o.out" ||
  fail "oversubscription not said" "$work/o.out"
echo "2. 4 ranks on 2 devices: $(grep '^oversubscribed' "$work/o.out")"

# Refusals: one line each, exit 2.
refuse() {  # NAME EXPECTED ARGS...
  local name=$1 expected=$2 status=0
  shift 2
  "$pretrain" --config "$src/configs/tiny.yaml" --set train.output_dir="$work/$name" "$@" >"$work/$name.out" 2>&1 ||
    status=$?
  [[ $status -ne 0 ]] || fail "$name: accepted" "$work/$name.out"
  grep -q "$expected" "$work/$name.out" || fail "$name: no '$expected'" "$work/$name.out"
  echo "3. $name: exit $status: $(grep "$expected" "$work/$name.out" | head -1)"
}
refuse without_plan "pretrain_gpt: --hardware and --ranks-per-node are for --plan only" --hardware "$hw"
refuse without_hardware "pretrain_gpt: --ranks-per-node needs --hardware FILE" --plan --ranks-per-node 2
sed 's/memory_bandwidth_GBps: 10/memory_bandwidth_GBps: -1/' "$work/two.yaml" >"$work/bad.yaml"
refuse bad_yaml "bad.yaml: device.memory_bandwidth_GBps must be a number > 0, got -1" --plan --hardware "$work/bad.yaml"
