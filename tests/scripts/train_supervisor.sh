#!/usr/bin/env bash
# train_supervisor with real jobs (issue 24, item 2; docs/restart.md):
#  1. kill -9 of one rank of a 2-rank job under the supervisor: it relaunches from the latest
#     checkpoint in the same layout, the job finishes all its steps, and every loss after the restart
#     equals an uninterrupted run's bitwise (the failed attempt's, kept as metrics.attempt_1.jsonl,
#     too); the restart line names the cause, the layouts and the steps lost, which match the files.
#  2. elastic, 4 ranks -> 2: the host probe (--hosts-cmd) loses a node of 2 ranks and a rank is
#     killed; the supervisor
#     relaunches dp4 as dp2 with twice the micro-batches per rank, and the losses equal the
#     uninterrupted 4-rank run's within the layout tolerance (relative 1e-5).
#     Below --min-ranks it gives up instead, saying why.
#  3. a job that fails every time: --max-restarts 2 relaunches twice, after back-offs of 1 and 2 s,
#     then gives up with one line naming the limit, the cause and the checkpoint, and its exit status.
#  4. a requested stop: SIGTERM to the ranks, and to the supervisor (which forwards SIGUSR1), ends the
#     job with a checkpoint and exit 0 and no relaunch.
#  5. bad use: one line on stderr and exit 2, nothing launched.
#   train_supervisor.sh SOURCE_DIR PRETRAIN_GPT TRAIN_SUPERVISOR MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2 supervisor=$3
shift 3
mpiexec=("$@")
source "$src/scripts/mpi_launcher.sh"  # mpi_rank_pids
work=$(mktemp -d)
sup_pid=
cleanup() {
  [[ -n $sup_pid ]] && kill -KILL "$sup_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
common=(--config "$src/configs/tiny.yaml" --set train.log_interval=1 --set optimizer.lr_decay=constant
  --set optimizer.warmup_steps=0)

fail() {
  echo "FAIL: $*"
  exit 1
}
# "STEP LOSS" per training line of a metrics.jsonl (the keys in any order; eval lines have no "loss").
losses() {
  awk 'match($0, /"loss":[^,}]*/) { l = substr($0, RSTART + 7, RLENGTH - 7)
       if (match($0, /"step":[0-9]+/)) print substr($0, RSTART + 7, RLENGTH - 7), l }' "$1"
}
# same_losses A B TOL: every step of metrics file B has A's loss there (relative TOL; 0: the same
# text, so bitwise); prints how many were compared.
same_losses() {
  join <(losses "$1" | sort -k1,1) <(losses "$2" | sort -k1,1) | awk -v tol="$3" -v b="$2" '
    { n++; if (tol == 0) { if ($2 != $3) { printf "%s: step %d loss %s, uninterrupted %s\n", b, $1, $3, $2; bad = 1 } }
      else { d = $2 - $3; if (d < 0) d = -d; s = $2 < 0 ? -$2 : $2; if (d > tol * s) { printf "%s: step %d loss %s, uninterrupted %s\n", b, $1, $3, $2; bad = 1 } } }
    END { if (bad) exit 1; print n }'
}
# wait_for_progress DIR: until DIR's checkpoint root has a step and metrics.jsonl holds a few more.
wait_for_progress() {
  for _ in $(seq 1 1200); do
    if [[ -f $1/ckpt/latest && -f $1/metrics.jsonl ]] && (($(wc -l <"$1/metrics.jsonl") >= 14)); then return 0; fi
    kill -0 "$sup_pid" 2>/dev/null || fail "the supervisor ended before the job made progress: $(tail -5 "$1.out")"
    sleep 0.05
  done
  fail "no checkpoint in $1 after 60 s"
}
straight() {  # straight NAME RANKS STEPS: the uninterrupted run
  "${mpiexec[@]}" -np "$2" "$pretrain" "${common[@]}" --set train.steps="$3" --set train.output_dir="$work/$1" \
    >"$work/$1.log" 2>&1 || { tail -20 "$work/$1.log"; fail "$1 failed"; }
}

# 1. Same layout, bitwise. 120 steps of ~20 ms: the kill (at about step 15) lands long before the end.
steps=120
straight straight2 2 $steps
run=$work/kill
"$supervisor" --ranks 2 --max-restarts 2 --backoff 0 -- "${mpiexec[@]}" -np '{ranks}' "$pretrain" "${common[@]}" \
  --set train.steps=$steps --set train.output_dir="$run" --set checkpoint.dir="$run/ckpt" \
  --set checkpoint.save_interval=10 >"$run.out" 2>&1 &
sup_pid=$!
wait_for_progress "$run"
victim=$(mpi_rank_pids "$sup_pid" 1)
[[ -n $victim ]] || fail "no rank 1 under the supervisor"
kill -KILL "$victim"
status=0
wait "$sup_pid" || status=$?
sup_pid=
[[ $status -eq 0 ]] || { tail -30 "$run.out"; fail "kill: the supervisor exited with $status"; }
grep -q "finished: step $steps of $steps saved after 1 restart$" "$run/restarts.log" ||
  { cat "$run/restarts.log"; fail "kill: no 'finished' line after 1 restart"; }
line=$(grep "restart 1 of 2:" "$run/restarts.log") || { cat "$run/restarts.log"; fail "kill: no restart line"; }
echo "$line"
grep -q "rank 1" <<<"$line" || fail "kill: the cause does not name rank 1"
layout="tp1 cp1 pp1 dp2 ep1: 2 ranks, 2 micro-batches of 2 per rank"
grep -qF "layout $layout -> $layout" <<<"$line" || fail "kill: the layouts are not both dp2"
reached=$(losses "$run/metrics.attempt_1.jsonl" | tail -1 | cut -d' ' -f1)
resumed=$(($(losses "$run/metrics.jsonl" | head -1 | cut -d' ' -f1) - 1))
grep -qF "steps lost: $((reached - resumed)) (reached step $reached, the checkpoint holds step $resumed)" <<<"$line" ||
  fail "kill: the steps lost do not match the metrics (reached $reached, resumed after $resumed)"
((resumed > 0 && resumed < steps)) || fail "kill: resumed after step $resumed"
n=$(same_losses "$work/straight2/metrics.jsonl" "$run/metrics.jsonl" 0) || fail "kill: losses differ after the restart"
((n == steps - resumed)) || fail "kill: $n steps after the restart, expected $((steps - resumed))"
same_losses "$work/straight2/metrics.jsonl" "$run/metrics.attempt_1.jsonl" 0 >/dev/null || fail "kill: attempt 1 differs"
echo "kill -9: resumed from step $resumed, $n losses after the restart equal the uninterrupted run bitwise"

# 2. Elastic: 4 ranks, then 2.
steps=100
straight straight4 4 $steps
run=$work/elastic
printf 'localhost\nlocalhost\n' >"$work/hosts"  # two "nodes" of 2 ranks, as a Slurm probe would list them
"$supervisor" --elastic --hosts-cmd "cat '$work/hosts'" --ranks-per-node 2 --min-ranks 2 --backoff 0 -- \
  "${mpiexec[@]}" -np '{ranks}' \
  "$pretrain" "${common[@]}" --set train.steps=$steps --set train.output_dir="$run" --set checkpoint.dir="$run/ckpt" \
  --set checkpoint.save_interval=10 >"$run.out" 2>&1 &
sup_pid=$!
wait_for_progress "$run"
echo "localhost   # the other node is gone" >"$work/hosts"
victim=$(mpi_rank_pids "$sup_pid" 3)
[[ -n $victim ]] || fail "no rank 3 under the supervisor"
kill -KILL "$victim"
status=0
wait "$sup_pid" || status=$?
sup_pid=
[[ $status -eq 0 ]] || { tail -30 "$run.out"; fail "elastic: the supervisor exited with $status"; }
line=$(grep "restart 1 of 3:" "$run/restarts.log") || { cat "$run/restarts.log"; fail "elastic: no restart line"; }
echo "$line"
grep -qF "layout tp1 cp1 pp1 dp4 ep1: 4 ranks, 1 micro-batch of 2 per rank -> tp1 cp1 pp1 dp2 ep1: 2 ranks, 2 micro-batches of 2 per rank" <<<"$line" ||
  fail "elastic: not dp4 -> dp2 with twice the micro-batches"
grep -q "launch: 2 rank(s)" "$run.out" || fail "elastic: the relaunch did not run on 2 ranks"
grep -q "finished: step $steps of $steps" "$run/restarts.log" || fail "elastic: did not finish"
resumed=$(($(losses "$run/metrics.jsonl" | head -1 | cut -d' ' -f1) - 1))
n=$(same_losses "$work/straight4/metrics.jsonl" "$run/metrics.jsonl" 1e-5) || fail "elastic: losses differ on dp2"
((n == steps - resumed)) || fail "elastic: $n steps on 2 ranks, expected $((steps - resumed))"
echo "elastic: dp4 -> dp2 from step $resumed, $n losses equal the uninterrupted 4-rank run (relative 1e-5)"

# 2b. Elastic below --min-ranks: the supervisor gives up, saying why, with the launcher's status.
run=$work/too_few
printf 'localhost\nlocalhost\n' >"$work/hosts"
"$supervisor" --elastic --hosts-cmd "cat '$work/hosts'" --ranks-per-node 2 --min-ranks 4 --backoff 0 -- \
  "${mpiexec[@]}" -np '{ranks}' "$pretrain" "${common[@]}" --set train.steps=$steps --set train.output_dir="$run" \
  --set checkpoint.dir="$run/ckpt" --set checkpoint.save_interval=10 >"$run.out" 2>&1 &
sup_pid=$!
wait_for_progress "$run"
echo "localhost" >"$work/hosts"
kill -KILL "$(mpi_rank_pids "$sup_pid" 2)"
status=0
wait "$sup_pid" || status=$?
sup_pid=
[[ $status -ne 0 ]] || fail "too few: the supervisor exited 0"
line=$(grep "giving up" "$run/restarts.log") || { cat "$run/restarts.log"; fail "too few: no give-up line"; }
grep -qF "no layout fits the ranks left: 2 ranks available, fewer than the minimum 4" <<<"$line" ||
  fail "too few: the give-up line does not say why: $line"
(($(grep -c "attempt [0-9]: tp1" "$run/restarts.log") == 1)) || fail "too few: relaunched"
echo "too few: gave up with exit status $status: ${line#*giving up: }" | cut -c1-200

# 3. The restart limit and the back-off: the job cannot load its checkpoint.load (no such
#    directory), every time.
run=$work/limit
start=$(date +%s.%N)
status=0
"$supervisor" --ranks 2 --max-restarts 2 --backoff 1 --backoff-max 5 -- "${mpiexec[@]}" -np '{ranks}' "$pretrain" "${common[@]}" \
  --set train.output_dir="$run" --set checkpoint.dir="$run/ckpt" --set checkpoint.load="$work/no_such_checkpoint" \
  >"$run.out" 2>&1 || status=$?
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
[[ $status -ne 0 ]] || fail "limit: the supervisor exited 0"
(($(grep -c "attempt [0-9]: tp1" "$run/restarts.log") == 3)) || { cat "$run/restarts.log"; fail "limit: not 3 attempts"; }
grep -q "attempt 1 failed: .*relaunching in 1 s" "$run/restarts.log" || fail "limit: first back-off not 1 s"
grep -q "attempt 2 failed: .*relaunching in 2 s" "$run/restarts.log" || fail "limit: second back-off not 2 s"
(($(echo "$elapsed >= 3" | bc))) || fail "limit: the back-offs took $elapsed s, less than 1 + 2"
give_up=$(grep "giving up" "$run/restarts.log") || fail "limit: no give-up line"
echo "$give_up"
grep -qF "giving up after 2 restarts (--max-restarts 2): attempt 3 failed: exit status $status" <<<"$give_up" ||
  fail "limit: the give-up line does not name the limit and the exit status $status"
grep -qF "no_such_checkpoint does not exist" <<<"$give_up" || fail "limit: the give-up line does not name the cause"
grep -qF "nothing was saved in $run/ckpt" <<<"$give_up" || fail "limit: the give-up line does not say what was saved"
grep -q "train_supervisor: giving up after 2 restarts" "$run.out" || fail "limit: the give-up line is not on stdout"
echo "limit: 3 attempts, back-offs 1 s and 2 s, gave up with exit status $status in ${elapsed%.*} s"

# 4. Requested stops: no relaunch, exit 0, a checkpoint before train.steps.
for who in ranks supervisor; do
  run=$work/stop_$who
  "$supervisor" --ranks 2 --max-restarts 2 --backoff 0 -- "${mpiexec[@]}" -np '{ranks}' "$pretrain" "${common[@]}" \
    --set train.steps=100000 --set train.output_dir="$run" --set checkpoint.dir="$run/ckpt" \
    --set checkpoint.save_interval=10 >"$run.out" 2>&1 &
  sup_pid=$!
  wait_for_progress "$run"
  if [[ $who == ranks ]]; then kill -TERM $(mpi_rank_pids "$sup_pid"); else kill -TERM "$sup_pid"; fi
  status=0
  wait "$sup_pid" || status=$?
  sup_pid=
  [[ $status -eq 0 ]] || { tail -30 "$run.out"; fail "stop ($who): the supervisor exited with $status"; }
  grep -q "stopped on request at step [0-9]* of 100000 (exit status 0); not relaunching" "$run/restarts.log" ||
    { cat "$run/restarts.log"; fail "stop ($who): no 'stopped on request' line"; }
  (($(grep -c "attempt [0-9]: tp1" "$run/restarts.log") == 1)) || fail "stop ($who): relaunched"
  grep -q "stopping at step" "$run.out" || fail "stop ($who): the trainer did not stop at a step boundary"
  echo "stop ($who): $(grep -o 'stopped on request at step [0-9]*' "$run/restarts.log"), no relaunch"
done

# 5. Bad use, refused before anything is launched.
refused() {  # refused WHAT ARGS...: exit 2 with one line naming WHAT
  local what=$1 status=0
  shift
  "$supervisor" "$@" >"$work/refused.out" 2>"$work/refused.err" || status=$?
  [[ $status -eq 2 && $(wc -l <"$work/refused.err") -eq 1 ]] && grep -qF -- "$what" "$work/refused.err" ||
    { cat "$work/refused.out" "$work/refused.err"; fail "refused: expected exit 2 and one line naming '$what', got $status"; }
  echo "refused: $(cat "$work/refused.err")"
}
job=(-- "${mpiexec[@]}" -np '{ranks}' "$pretrain" "${common[@]}" --set train.output_dir="$work/refused")
refused "checkpoint.dir is not set" --ranks 2 "${job[@]}"
refused "--elastic needs --hostfile or --hosts-cmd" --elastic --ranks 2 "${job[@]}" --set checkpoint.dir="$work/c"
printf 'node1 slots=two\n' >"$work/bad_hosts"
refused "line 1: 'two' is not a slot count" --elastic --hostfile "$work/bad_hosts" "${job[@]}" --set checkpoint.dir="$work/c"
refused "model.num_attention_heads" --ranks 3 "${job[@]}" --set checkpoint.dir="$work/c" --set parallel.tensor=3
refused "--elastic needs {ranks}" --elastic --hostfile "$work/hosts" -- "${mpiexec[@]}" -np 2 "$pretrain" \
  "${common[@]}" --set checkpoint.dir="$work/c"
