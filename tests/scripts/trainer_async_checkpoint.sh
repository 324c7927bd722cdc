#!/usr/bin/env bash
# checkpoint.async through the trainer (issue 24, item 3), on 2 ranks (dp2, distributed optimizer):
#  1. asynchronous saves write the same bytes as synchronous ones (every file of every step), and
#     training is not disturbed (the losses are bitwise those of the synchronous run); each write
#     is slowed (PARALLEL_INJECT_CHECKPOINT_DELAY_MS) so that it overlaps the following steps, and
#     the next save must wait for it;
#  2. a resume from a checkpoint written in the background is exact (bitwise losses);
#  3. kill -9 of one rank during each of 8 asynchronous saves: `latest` always names a complete
#     step, never the one in flight, the next job resumes from it, and the last resume is exact;
#  4. a failed background write (PARALLEL_INJECT_CHECKPOINT_FAIL: a full disk on rank 1) is logged
#     on every rank, training goes on, and `latest` stays at the previous checkpoint; the same failure
#     of the final save ends the run with an error;
#  5. SIGTERM while a save is in flight: the stop waits for it, saves, and exits 0.
# The learning rate is constant so that runs of different lengths follow the same schedule.
#   trainer_async_checkpoint.sh SOURCE_DIR PRETRAIN_GPT MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2
shift 2
mpiexec=("$@")
source "$src/scripts/mpi_launcher.sh"  # mpi_rank_pids
work=$(mktemp -d)
job=""
# A failure while a long job runs (parts 3 and 5) must not leave it training on.
trap '[[ -n $job ]] && kill "$job" 2>/dev/null; rm -rf "$work"' EXIT
common=(--config "$src/configs/tiny.yaml" --set train.log_interval=1 --set optimizer.lr_decay=constant
  --set optimizer.warmup_steps=0 --set model.num_layers=4 --set optimizer.distributed=true)
fail() {
  echo "FAIL: $1"
  [[ -n ${2:-} && -f $2 ]] && grep -v "\] \[info\]" "$2" | tail -20
  exit 1
}
run() {  # run NAME [--set ...]: 2 ranks, must succeed
  local name=$1
  shift
  "${mpiexec[@]}" -np 2 "$pretrain" "${common[@]}" --set train.output_dir="$work/$name" "$@" \
    >"$work/$name.log" 2>&1 || fail "$name: exit status $?" "$work/$name.log"
}
losses() { grep -o '"loss":[^,}]*' "$work/$1/metrics.jsonl" | cut -d: -f2; }
latest_step() { sed -n 's/^step_0*\([0-9][0-9]*\)$/\1/p' "$1/latest"; }
# same_losses A B N: the last N losses of run B equal run A's at the same steps, bitwise.
same_losses() {
  local a=$1 b=$2 n=$3 total
  total=$(losses "$b" | wc -l)
  [[ $total -ge $n ]] || fail "$b: $total losses, expected at least $n"
  local skip=$(($(losses "$a" | wc -l) - n))
  [[ "$(losses "$a" | sed -n "$((skip + 1)),$((skip + n))p")" == "$(losses "$b" | tail -"$n")" ]] ||
    fail "$b: the last $n losses differ from $a's" "$work/$b.log"
}
slow=(env PARALLEL_INJECT_CHECKPOINT_DELAY_MS=300)  # each background write sleeps 300 ms first
async=(--set checkpoint.async=true)

# 1. The same bytes as a synchronous save; training undisturbed.
run sync --set train.steps=7 --set checkpoint.save_interval=3 --set checkpoint.dir="$work/ckpt_sync"
PARALLEL_INJECT_CHECKPOINT_DELAY_MS=300 run async --set train.steps=7 --set checkpoint.save_interval=3 \
  --set checkpoint.dir="$work/ckpt_async" "${async[@]}"
steps=$(cd "$work/ckpt_async" && ls -d step_* | tr '\n' ' ')
[[ $steps == "step_00000003 step_00000006 step_00000007 " ]] ||
  fail "async: step directories '$steps'" "$work/async.log"
# Every rank file byte for byte; each index.json too, but for the config it stores (the runs' own
# output and checkpoint directories and checkpoint.async differ).
for dir in $steps; do
  for f in "$work/ckpt_sync/$dir"/*.safetensors; do
    cmp "$f" "$work/ckpt_async/$dir/${f##*/}" || fail "async: $dir/${f##*/} differs from the sync save"
  done
  [[ $(ls "$work/ckpt_sync/$dir") == "$(ls "$work/ckpt_async/$dir")" ]] || fail "async: $dir holds other files"
  without_config() { sed 's/"config_yaml": ".*",$/"config_yaml": "",/' "$1"; }
  [[ "$(without_config "$work/ckpt_sync/$dir/index.json")" == "$(without_config "$work/ckpt_async/$dir/index.json")" ]] ||
    fail "async: $dir/index.json differs from the sync save beyond the config"
done
[[ $(cat "$work/ckpt_sync/latest") == "$(cat "$work/ckpt_async/latest")" ]] || fail "async: latest differs"
grep -q "written in the background while step" "$work/async.log" ||
  fail "async: no write overlapped a step" "$work/async.log"
same_losses sync async 7
echo "1. async saves: $steps identical to sync saves (rank files byte for byte, the index but for the config); losses bitwise equal"

# 2. Resume from step 3, written in the background while steps 4.. changed the parameters.
run resumed --set train.steps=7 --set checkpoint.load="$work/ckpt_async/step_00000003" "${async[@]}"
grep -q "resuming at step 3" "$work/resumed.log" || fail "resume: not at step 3" "$work/resumed.log"
same_losses sync resumed 4
echo "2. resume from an asynchronous checkpoint: steps 4-7 bitwise equal to the uninterrupted run"

# 3. kill -9 of one rank while a save is being written (each write slowed by 1 s), 8 times; each job
#    resumes from `latest`.
kill_ckpt=$work/ckpt_kill
for i in $(seq 1 8); do
  log=$work/kill_$i.log
  PARALLEL_INJECT_CHECKPOINT_DELAY_MS=1000 "${mpiexec[@]}" -np 2 "$pretrain" "${common[@]}" --set train.steps=100000 \
    "${async[@]}" --set checkpoint.save_interval=2 --set checkpoint.keep_last=2 --set checkpoint.dir="$kill_ckpt" \
    --set checkpoint.load=latest --set train.output_dir="$work/kill_$i" >"$log" 2>&1 &
  job=$!
  # The job's second save: its first one has been published by then (a save waits for the last).
  for _ in $(seq 1 1200); do
    (($(grep -c "writing in the background" "$log") >= 2)) && break
    kill -0 "$job" 2>/dev/null || fail "kill $i: the job ended before its second save" "$log"
    sleep 0.05
  done
  (($(grep -c "writing in the background" "$log") >= 2)) || fail "kill $i: no second save started" "$log"
  in_flight=$(grep -o "checkpoint of step [0-9]*" "$log" | tail -1 | grep -o "[0-9]*$")
  sleep "0.$(printf %02d $((RANDOM % 50)))"  # 0 to 0.49 s: within the write's 1 s (slowed)
  victim=$(mpi_rank_pids "$job" $((i % 2)))
  [[ -n $victim ]] || fail "kill $i: no rank $((i % 2)) process" "$log"
  kill -9 $victim
  status=0
  wait "$job" || status=$?
  job=""
  [[ $status -ne 0 ]] || fail "kill $i: the job exited 0 after kill -9" "$log"
  [[ -f $kill_ckpt/latest ]] || fail "kill $i: no latest" "$log"
  step=$(latest_step "$kill_ckpt")
  [[ -f $kill_ckpt/step_$(printf %08d "$step")/index.json ]] || fail "kill $i: latest names an incomplete step"
  ((step < in_flight)) || fail "kill $i: latest names step $step, the save in flight was $in_flight" "$log"
  echo "   kill $i: rank $((i % 2)) killed while step $in_flight was being written; latest = step $step"
  if ((i > 1)); then
    grep -q "resuming at step $previous" "$log" || fail "kill $i: did not resume at step $previous" "$log"
  fi
  previous=$step
done
[[ -n ${previous:-} ]] || fail "kill: no checkpoint was ever published"
final=$((previous + 3))
run kill_resumed --set train.steps=$final --set checkpoint.load=latest --set checkpoint.dir="$kill_ckpt" "${async[@]}"
grep -q "resuming at step $previous" "$work/kill_resumed.log" || fail "kill: no resume at $previous" "$work/kill_resumed.log"
run straight --set train.steps=$final
same_losses straight kill_resumed 3
[[ -z $(find "$kill_ckpt" -maxdepth 1 -name '.tmp_step_*') ]] || fail "kill: a staging directory is left"
echo "3. kill -9 during 8 asynchronous saves: latest always complete; resumed at $previous, steps $((previous + 1))-$final exact"

# 4. A failed background write (rank 1's disk full at step 4): logged on both ranks, training goes on.
PARALLEL_INJECT_CHECKPOINT_FAIL=4:1 run failed --set train.steps=8 --set checkpoint.save_interval=2 \
  --set checkpoint.dir="$work/ckpt_fail" "${async[@]}"
message="the background write of step 4 failed on rank 1: .*No space left on device.*latest still names step_00000002; training goes on"
[[ $(grep -c "$message" "$work/failed.log") -eq 2 ]] || fail "failure: not logged once per rank" "$work/failed.log"
[[ ! -e $work/ckpt_fail/step_00000004 && -z $(find "$work/ckpt_fail" -maxdepth 1 -name '.tmp_step_*') ]] ||
  fail "failure: step 4 or its staging directory exists" "$work/failed.log"
[[ $(latest_step "$work/ckpt_fail") -eq 8 ]] && grep -q '"step":8' "$work/failed/metrics.jsonl" ||
  fail "failure: training did not go on to step 8" "$work/failed.log"
[[ "$(losses failed | head -7)" == "$(losses sync)" ]] || fail "failure: the losses differ from the sync run's"
echo "4. failed write: $(grep -o "\[error\].*failed on rank 1" "$work/failed.log" | head -1)... (x2); latest kept, training went on"
status=0
PARALLEL_INJECT_CHECKPOINT_FAIL=4 "${mpiexec[@]}" -np 2 "$pretrain" "${common[@]}" --set train.steps=4 \
  --set checkpoint.save_interval=2 --set checkpoint.dir="$work/ckpt_fail_end" "${async[@]}" \
  --set train.output_dir="$work/fail_end" >"$work/fail_end.log" 2>&1 || status=$?
[[ $status -ne 0 ]] && grep -q "failed on ranks 0,1: .*latest still names step_00000002" "$work/fail_end.log" &&
  [[ $(latest_step "$work/ckpt_fail_end") -eq 2 ]] || fail "final save failure: status $status" "$work/fail_end.log"
echo "   a failed final save ends the run (status $status) and latest stays at step 2"

# 5. SIGTERM with a save in flight: the stop waits for it, saves the stop step, exits 0.
"${slow[@]}" "${mpiexec[@]}" -np 2 "$pretrain" "${common[@]}" --set train.steps=100000 "${async[@]}" \
  --set checkpoint.save_interval=2 --set checkpoint.dir="$work/ckpt_term" --set train.output_dir="$work/term" \
  >"$work/term.log" 2>&1 &
job=$!
for _ in $(seq 1 600); do
  grep -q "writing in the background" "$work/term.log" && break
  sleep 0.05
done
kill -TERM $(mpi_rank_pids "$job")
status=0
wait "$job" || status=$?
job=""
[[ $status -eq 0 ]] || fail "SIGTERM: exit status $status" "$work/term.log"
stop=$(grep -o "stopping at step [0-9]*" "$work/term.log" | grep -o "[0-9]*$")
[[ $(latest_step "$work/ckpt_term") -eq $stop ]] || fail "SIGTERM: latest is not the stop step $stop" "$work/term.log"
echo "5. SIGTERM during an asynchronous save: stopped at step $stop, latest = step $stop"
