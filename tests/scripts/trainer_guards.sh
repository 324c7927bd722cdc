#!/usr/bin/env bash
# Issue 24: the training guards (item 4) and the probe's defects through the real programs (item 6),
# each seen by its one-line message:
#  1. a NaN loss injected on rank 1 at step 3 (PARALLEL_INJECT_LOSS_SCALE): the run stops there,
#     exit 3, one line naming the step, the rule and rank 1; metrics.jsonl counts it;
#  2. the same with train.nonfinite_policy=skip: step 3's update is skipped, the run finishes;
#  3. a loss spike (x1e4 at step 6) with train.spike_factor=5 over a 3-step window: skipped, counted;
#  4. the probe's model.moe_aux_loss_coeff=1e30 (an infinite gradient norm every step, silently):
#     stops at step 1 naming the gradient norm;
#  5. model.rope_scaling_factor=1e-310 (passed "> 0", NaN losses from step 2): refused at once;
#  6. --plan with model.num_layers=2147483647 (OOM-killed after 77 s): refused at once naming the key;
#  7. --plan into an unwritable folder: names train.output_dir (it said "filesystem error");
#  8. checkpoint.dir/latest a directory: refused at start-up, before the model is built;
#  9. checkpoint extras: consumed_samples and config_yaml that disagree are refused naming index.json;
# 10. preprocess_data: a JSONL object with a key given twice names the line.
#   trainer_guards.sh SOURCE_DIR PRETRAIN_GPT PREPROCESS_DATA MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2 preprocess=$3
shift 3
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$src/configs/tiny.yaml" --set train.log_interval=1)
fail() {
  echo "FAIL: $1"
  [[ -n ${2:-} && -f $2 ]] && tail -20 "$2"
  exit 1
}
# Runs pretrain_gpt; sets $status. NAME NP ARGS...
run() {
  local name=$1 np=$2
  shift 2
  status=0
  "${mpiexec[@]}" -np "$np" "$pretrain" "${common[@]}" --set train.output_dir="$work/$name" "$@" \
    >"$work/$name.log" 2>"$work/$name.err" || status=$?
}
# metrics.jsonl's line for STEP holds every FIELD (e.g. '"spikes":1'; keys are in any order).
metrics_has() {  # FILE STEP FIELD...
  local line
  line=$(grep -E "\"step\":$2[,}]" "$1" | grep -v eval_loss | tail -1) || return 1
  shift 2
  for field in "$@"; do [[ $line == *"$field"* ]] || return 1; done
}
# The one line a refused or stopped run prints on stderr: exactly one line matches, and nothing
# else of ours is there (PARALLEL_LOG_LEVEL=error silences the logs; mpiexec's own box about the
# non-zero exit status may follow).
one_line() {  # FILE REGEX
  [[ $(grep -Ec "$2" "$1") -eq 1 ]] && ! grep -Eq "fatal|critical|\[error\]" "$1"
}

# 1. NaN on rank 1 at step 3: stop.
PARALLEL_INJECT_LOSS_SCALE=3:nan:1 PARALLEL_LOG_LEVEL=error run nan_stop 2 --set train.steps=6
[[ $status -eq 3 ]] || fail "NaN stop: exit status $status, expected 3" "$work/nan_stop.err"
one_line "$work/nan_stop.err" \
  '^train: step 3: the loss is nan and the gradient norm nan: stopping \(train.nonfinite_policy = stop\); the loss is not finite on rank 1; the gradients are not finite on ranks 0,1$' ||
  fail "NaN stop: not one line naming step 3, the rule and rank 1" "$work/nan_stop.err"
metrics_has "$work/nan_stop/metrics.jsonl" 3 '"nonfinite_steps":1' '"loss":null' &&
  ! grep -q '"step":4' "$work/nan_stop/metrics.jsonl" ||
  fail "NaN stop: metrics.jsonl does not end at step 3 counting it" "$work/nan_stop/metrics.jsonl"
echo "1. NaN at step 3: $(grep '^train: ' "$work/nan_stop.err")"

# 2. The same, skipped.
PARALLEL_INJECT_LOSS_SCALE=3:nan:1 run nan_skip 2 --set train.steps=6 --set train.nonfinite_policy=skip
[[ $status -eq 0 ]] || fail "NaN skip: exit status $status" "$work/nan_skip.err"
grep -q "warning.*step 3: the loss is nan and the gradient norm nan: update skipped (train.nonfinite_policy = skip)" "$work/nan_skip.err" ||
  fail "NaN skip: no warning naming step 3" "$work/nan_skip.err"
metrics_has "$work/nan_skip/metrics.jsonl" 3 '"skipped":true' '"skip_reason":"nonfinite"' ||
  fail "NaN skip: step 3 not marked skipped in metrics.jsonl" "$work/nan_skip/metrics.jsonl"
metrics_has "$work/nan_skip/metrics.jsonl" 6 '"skipped_steps":1' '"spikes":0' '"nonfinite_steps":1' ||
  fail "NaN skip: the last metrics line does not count one skipped step" "$work/nan_skip/metrics.jsonl"
grep -E '"step":4[,}]' "$work/nan_skip/metrics.jsonl" | grep -q '"loss":[0-9]' || fail "NaN skip: step 4's loss is not finite" \
  "$work/nan_skip/metrics.jsonl"
echo "2. NaN at step 3 with nonfinite_policy=skip: skipped, trained on to step 6"

# 3. A loss spike at step 6, factor 5 over the median of 3 steps.
PARALLEL_INJECT_LOSS_SCALE=6:1e4 run spike 1 --set train.steps=8 --set train.spike_factor=5 \
  --set train.spike_window=3
[[ $status -eq 0 ]] || fail "spike: exit status $status" "$work/spike.err"
grep -q "warning.*step 6: the loss [0-9.e+]* is [0-9.]*x the median [0-9.]* of the last 3 steps (train.spike_factor = 5): update skipped (train.spike_policy = skip)" \
  "$work/spike.err" || fail "spike: no warning naming step 6 and the rule" "$work/spike.err"
metrics_has "$work/spike/metrics.jsonl" 6 '"skip_reason":"spike"' '"skipped_steps":1' '"spikes":1' ||
  fail "spike: step 6 not counted in metrics.jsonl" "$work/spike/metrics.jsonl"
[[ $(grep -c '"spikes":1' "$work/spike/metrics.jsonl") -eq 3 ]] ||
  fail "spike: other steps were taken for spikes" "$work/spike/metrics.jsonl"
echo "3. loss spike at step 6: skipped and counted"

# 4. The probe's MoE case: an infinite gradient norm at every step.
PARALLEL_LOG_LEVEL=error run moe_inf 1 --set train.steps=4 --set model.num_experts=4 \
  --set model.moe_aux_loss_coeff=1e30
[[ $status -eq 3 ]] || fail "moe_aux_loss_coeff=1e30: exit status $status, expected 3" "$work/moe_inf.err"
one_line "$work/moe_inf.err" '^train: step 1: the (gradient norm is (inf|nan)|loss is (inf|nan)).*stopping \(train.nonfinite_policy = stop\)' ||
  fail "moe_aux_loss_coeff=1e30: not one line naming step 1" "$work/moe_inf.err"
echo "4. moe_aux_loss_coeff=1e30: $(grep '^train: ' "$work/moe_inf.err")"

# 5. A subnormal rope scaling factor.
run rope 1 --set model.position_embedding=rope --set model.rope_scaling=linear --set model.rope_scaling_factor=1e-310
[[ $status -eq 2 ]] || fail "rope_scaling_factor=1e-310: exit status $status, expected 2" "$work/rope.err"
grep -q '^config: model.rope_scaling_factor = 1.0e-310: must be in \[0.001, 1000.0\]$' "$work/rope.err" ||
  fail "rope_scaling_factor=1e-310: no one-line refusal naming the key" "$work/rope.err"
echo "5. $(grep '^config: ' "$work/rope.err")"

# 6. --plan with 2^31 - 1 layers: at once.
start=$SECONDS
run layers 1 --plan --set model.num_layers=2147483647
((SECONDS - start <= 20)) || fail "num_layers=2147483647: took $((SECONDS - start)) s"
[[ $status -eq 2 ]] || fail "num_layers=2147483647: exit status $status, expected 2" "$work/layers.err"
one_line "$work/layers.err" '^config: model.num_layers = 2147483647: must be <= 1048576$' ||
  fail "num_layers=2147483647: no one-line refusal naming the key" "$work/layers.err"
echo "6. --plan: $(grep '^config: ' "$work/layers.err")"

# 7. --plan into a folder below a regular file.
echo x >"$work/a_file"
status=0
"${mpiexec[@]}" -np 1 "$pretrain" "${common[@]}" --plan --set train.output_dir="$work/a_file/out" \
  >"$work/plan.log" 2>"$work/plan.err" || status=$?
[[ $status -eq 2 ]] || fail "--plan into an unwritable folder: exit status $status, expected 2" "$work/plan.err"
one_line "$work/plan.err" "^config: train.output_dir = \"$work/a_file/out\": not writable: .*Not a directory$" ||
  fail "--plan into an unwritable folder: train.output_dir not named" "$work/plan.err"
echo "7. --plan: $(grep '^config: ' "$work/plan.err")"

# 8. latest is a directory: found before the model is built.
mkdir -p "$work/ckpt_dir/latest"
run latest_dir 1 --set checkpoint.dir="$work/ckpt_dir"
[[ $status -eq 2 ]] || fail "latest a directory: exit status $status, expected 2" "$work/latest_dir.err"
grep -q "^config: checkpoint.dir = \"$work/ckpt_dir\": $work/ckpt_dir/latest is a directory; it must be the file naming the latest checkpoint (remove or rename it)$" \
  "$work/latest_dir.err" || fail "latest a directory: no one-line refusal" "$work/latest_dir.err"
! grep -q "GPT: " "$work/latest_dir.err" || fail "latest a directory: the model was built first" "$work/latest_dir.err"
echo "8. $(grep '^config:' "$work/latest_dir.err")"

# 9. Checkpoint extras that disagree with each other.
run save 1 --set train.steps=2 --set checkpoint.dir="$work/ckpt"
[[ $status -eq 0 ]] || fail "saving a checkpoint failed" "$work/save.err"
index=$work/ckpt/step_00000002/index.json
cp "$index" "$work/index.json.orig"
sed -i 's/"consumed_samples": *16/"consumed_samples":12345/' "$index"
grep -q '"consumed_samples":12345' "$index" || fail "the test could not edit consumed_samples" "$index"
run extras 1 --set train.steps=4 --set checkpoint.load="$work/ckpt"
[[ $status -ne 0 ]] || fail "extras consumed_samples 12345: accepted" "$work/extras.err"
grep -q "checkpoint $index: extras.consumed_samples = 12345: must be extras.step \* train.global_batch_size of extras.config_yaml (2 \* 8 = 16)" \
  "$work/extras.err" || fail "extras consumed_samples 12345: not named" "$work/extras.err"
cp "$work/index.json.orig" "$index"
sed -i 's/"config_yaml": *"model:/"config_yaml":"model: [:/' "$index"
run extras_yaml 1 --set train.steps=4 --set checkpoint.load="$work/ckpt"
[[ $status -ne 0 ]] || fail "extras config_yaml broken: accepted" "$work/extras_yaml.err"
grep -q "checkpoint $index: extras.config_yaml is not a valid config of the saving job (1 ranks): config: extras.config_yaml" \
  "$work/extras_yaml.err" || fail "extras config_yaml broken: not named" "$work/extras_yaml.err"
echo "9. checkpoint extras: consumed_samples and config_yaml checked, naming $index"

# 10. preprocess_data: a key given twice.
printf '{"text": "one"}\n{"text": "a", "text": "b"}\n' >"$work/dup.jsonl"
status=0
"$preprocess" --input "$work/dup.jsonl" --output-prefix "$work/dup" --tokenizer-type ByteLevel \
  2>"$work/dup.err" || status=$?
[[ $status -eq 1 ]] || fail "JSONL duplicate key: exit status $status, expected 1" "$work/dup.err"
one_line "$work/dup.err" "$work/dup.jsonl:2: key \"text\" appears twice in one object" ||
  fail "JSONL duplicate key: not one line naming the line" "$work/dup.err"
echo "10. $(cat "$work/dup.err")"
