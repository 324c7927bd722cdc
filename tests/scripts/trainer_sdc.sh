#!/usr/bin/env bash
# The silent-data-corruption check through the trainer (issue 24, item 4): train.sdc_check_interval
# re-runs a step's forward and backward from the same state and each rank compares its loss and
# gradients bitwise.
#  1. no false positive: dp2 with overlapped gradient reduction and pp2, every step checked for 16
#     steps, not one suspicion, and the losses are bitwise those of the runs without the check;
#  2. one bit flipped in rank 1's gradients at step 4 (PARALLEL_INJECT_BITFLIP): the run stops there,
#     exit 3, one line naming the step and rank 1;
#  3. the same on rank 0 at step 6 with train.sdc_policy=warn: one warning naming rank 0, and the run
#     goes on with the re-run's (clean) results: its losses equal the clean run's.
#   trainer_sdc.sh SOURCE_DIR PRETRAIN_GPT MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2
shift 2
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$src/configs/tiny.yaml" --set train.log_interval=1 --set train.steps=16)
fail() {
  echo "FAIL: $1"
  [[ -n ${2:-} && -f $2 ]] && tail -20 "$2"
  exit 1
}
run() {  # run NAME ARGS...; sets $status
  local name=$1
  shift
  status=0
  "${mpiexec[@]}" -np 2 "$pretrain" "${common[@]}" --set train.output_dir="$work/$name" "$@" \
    >"$work/$name.log" 2>"$work/$name.err" || status=$?
}
losses() { grep -o '"loss":[^,}]*' "$work/$1/metrics.jsonl" | cut -d: -f2; }
suspected="silent data corruption suspected"

# 1. No false positive; the check does not change training.
dp=(--set optimizer.overlap_grad_reduce=true --set optimizer.bucket_size=20000)
pp=(--set parallel.pipeline=2)
for layout in dp pp; do
  declare -n flags=$layout
  run "${layout}_off" "${flags[@]}"
  [[ $status -eq 0 ]] || fail "$layout without the check: exit $status" "$work/${layout}_off.err"
  run "${layout}_on" "${flags[@]}" --set train.sdc_check_interval=1
  [[ $status -eq 0 ]] || fail "$layout with the check: exit $status" "$work/${layout}_on.err"
  grep -q "silent data corruption check: every 1 steps" "$work/${layout}_on.err" ||
    fail "$layout: the check is not announced" "$work/${layout}_on.err"
  ! grep -q "$suspected" "$work/${layout}_on.err" || fail "$layout: a false positive" "$work/${layout}_on.err"
  [[ $(losses "${layout}_on" | wc -l) -eq 16 && "$(losses "${layout}_on")" == "$(losses "${layout}_off")" ]] ||
    fail "$layout: the losses with the check differ from those without" "$work/${layout}_on.err"
  echo "1. $layout: 16 steps each checked, no suspicion, losses bitwise equal to the run without the check"
done

# 2. A flipped bit on rank 1 at step 4: stop, exit 3, one line.
PARALLEL_INJECT_BITFLIP=4:1 PARALLEL_LOG_LEVEL=error run flip_stop --set train.sdc_check_interval=2
[[ $status -eq 3 ]] || fail "bit flip: exit status $status, expected 3" "$work/flip_stop.err"
line='^train: step 4: silent data corruption suspected on rank 1: the step re-run from the same state gave other gradients on rank 1 \(train.sdc_policy = stop\)$'
[[ $(grep -Ec "$line" "$work/flip_stop.err") -eq 1 ]] || fail "bit flip: not one line naming step 4 and rank 1" \
  "$work/flip_stop.err"
! grep -q '"step":5' "$work/flip_stop/metrics.jsonl" || fail "bit flip: the run went past step 4"
echo "2. $(grep "^train: " "$work/flip_stop.err")"

# 3. train.sdc_policy=warn: named, and training goes on with the re-run's results.
PARALLEL_INJECT_BITFLIP=6:0 run flip_warn --set train.sdc_check_interval=3 --set train.sdc_policy=warn
[[ $status -eq 0 ]] || fail "bit flip, warn: exit status $status" "$work/flip_warn.err"
[[ $(grep -c "step 6: $suspected on rank 0: .*training goes on" "$work/flip_warn.err") -eq 1 &&
  $(grep -c "$suspected" "$work/flip_warn.err") -eq 1 ]] || fail "bit flip, warn: not one warning" "$work/flip_warn.err"
run clean
[[ "$(losses flip_warn)" == "$(losses clean)" ]] || fail "bit flip, warn: the losses differ from the clean run"
echo "3. warn: $(grep -o "step 6: $suspected.*" "$work/flip_warn.err")"
