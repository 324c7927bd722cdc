#!/usr/bin/env bash
# TensorBoard's own reader on the trainer's event files (issue 29, item 4): tensorboard's Python
# package loads train.tensorboard_dir (tensorboard_load.py: EventAccumulator and the raw event
# loader) and holds every scalar of metrics.jsonl at the same step with the same value; a run
# resumed from a checkpoint into the same directory shows each step once.
# The package is not a dependency: install it into a side folder and put that on PYTHONPATH,
#   python3 -m pip install --target /tmp/tb tensorboard
#   PYTHONPATH=/tmp/tb ctest -R tensorboard_python
# Without it the test is skipped (exit 77).
#   tensorboard_python.sh SOURCE_DIR PRETRAIN_GPT MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2
shift 2
mpiexec=("$@")
if ! version=$(python3 -c 'import tensorboard; print(tensorboard.__version__)' 2>/dev/null); then
  echo "SKIPPED: python3 cannot import tensorboard (python3 -m pip install --target /tmp/tb tensorboard;" \
    "then PYTHONPATH=/tmp/tb ctest -R tensorboard_python)"
  exit 77
fi
echo "tensorboard $version"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$src/configs/tiny.yaml" --set train.log_interval=1 --set train.output_dir="$work/run"
  --set train.tensorboard_dir="$work/tb" --set checkpoint.dir="$work/ckpt" --set train.precision=fp16
  --set train.eval_interval=2)

train() {  # train NAME [--set ...]
  local name=$1
  shift
  "${mpiexec[@]}" -np 2 "$pretrain" "${common[@]}" "$@" >"$work/$name.log" 2>&1 ||
    { echo "$name failed:"; tail -20 "$work/$name.log"; exit 1; }
}
train first --set train.steps=4 --set checkpoint.save_interval=2
python3 "$src/tests/scripts/tensorboard_load.py" "$work/run/metrics.jsonl" "$work/tb" 1
# Resumed at step 2 into the same directory: a second event file; TensorBoard drops the first
# run's steps 3 and 4 (SessionLog START at step 3), so each step shows once.
train resumed --set train.steps=4 --set checkpoint.load="$work/ckpt/step_00000002"
python3 "$src/tests/scripts/tensorboard_load.py" "$work/run/metrics.jsonl" "$work/tb" 2
echo "1 passed, 0 failed"
