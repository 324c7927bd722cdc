#!/usr/bin/env bash
# train.tensorboard_dir through the trainer (issue 29, item 4): every scalar of metrics.jsonl is in
# the TensorBoard event file with the same step and value, read back by the tests' own reader
# (tensorboard_check: TFRecord framing, both CRCs, the Event fields), on 2 ranks (only rank 0
# writes: one event file) with fp16 (loss_scale) and evaluations (eval_loss), and on a MoE model (the
# router terms and tokens per expert); a full disk leaves whole records and training goes on; an
# unwritable directory is refused at start-up naming the key. tensorboard_python.sh reads such files with TensorBoard's own
# loader.
#   trainer_tensorboard.sh SOURCE_DIR PRETRAIN_GPT TENSORBOARD_CHECK MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2 check=$3
shift 3
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$src/configs/tiny.yaml" --set train.log_interval=1)

run() {  # run NAME RANKS [--set ...]
  local name=$1 ranks=$2
  shift 2
  "${mpiexec[@]}" -np "$ranks" "$pretrain" "${common[@]}" --set train.output_dir="$work/$name" \
    --set train.tensorboard_dir="$work/$name/tb" "$@" >"$work/$name.log" 2>&1 ||
    { echo "$name failed:"; tail -20 "$work/$name.log"; exit 1; }
  "$check" "$work/$name/metrics.jsonl" "$work/$name/tb" || { echo "$name: the event file does not match"; exit 1; }
}

run dp2_fp16_eval 2 --set train.steps=4 --set train.precision=fp16 --set train.eval_interval=2
run moe_log2 1 --set train.steps=3 --set train.log_interval=2 --set model.num_experts=4 --set model.moe_router_topk=2

# A full disk (3 KiB per file, as trainer_early_checks): training goes on to the last step with a
# warning naming the event file, which holds only whole records; the steps it holds match.
name=full_disk
"${mpiexec[@]}" -np 1 bash -c 'trap "" XFSZ; ulimit -f 3; UCX_TLS=self,tcp exec "$@"' limited "$pretrain" "${common[@]}" \
  --set train.steps=30 --set train.output_dir="$work/$name" --set train.tensorboard_dir="$work/$name/tb" \
  >"$work/$name.log" 2>&1 || { echo "$name: training did not finish"; tail -20 "$work/$name.log"; exit 1; }
grep -q "step 30/30" "$work/$name.log" || { echo "$name: training did not go on to step 30"; exit 1; }
grep -q "warning.*cannot write to $work/$name/tb/events.out.tfevents.*File too large" "$work/$name.log" ||
  { echo "$name: no warning naming the event file"; tail -20 "$work/$name.log"; exit 1; }
"$check" --subset "$work/$name/metrics.jsonl" "$work/$name/tb" || { echo "$name: the event file does not match"; exit 1; }

# An unwritable train.tensorboard_dir (below a regular file) ends the run at start-up, one line.
touch "$work/file"
set +e
"${mpiexec[@]}" -np 1 "$pretrain" "${common[@]}" --set train.output_dir="$work/unwritable" \
  --set train.tensorboard_dir="$work/file/tb" >"$work/unwritable.log" 2>&1
rc=$?
set -e
((rc != 0)) && grep -q "config: train.tensorboard_dir = \"$work/file/tb\": not writable" "$work/unwritable.log" ||
  { echo "unwritable: expected a failure naming train.tensorboard_dir (rc $rc)"; tail -5 "$work/unwritable.log"; exit 1; }
echo "unwritable train.tensorboard_dir: refused at start-up"
echo "1 passed, 0 failed"
