#!/usr/bin/env bash
# The communication watchdog (issue 16, item 2): a rank that stops answering ends the job, and the
# log says which operation on which group was pending.
#  1. watchdog_stall (2 s deadline), rank 1 asleep: rank 0 waiting in an all-reduce over the group
#     "pair", in a receive from world rank 1, and every other rank in a world barrier: each job ends
#     within 15 s with the one-line watchdog message naming the operation, the group and its ranks.
#  2. pretrain_gpt, tiny model on 4 ranks (tensor 2 x pipeline 2), train.comm_timeout_s = 5: after
#     the first progress line one rank is stopped (SIGSTOP); the job must end within 30 s, and the
#     log must name the pending operation and group.
#   watchdog.sh SOURCE_DIR PRETRAIN_GPT WATCHDOG_STALL MPIEXEC...
set -uo pipefail
src=$1 pretrain=$2 stall=$3
shift 3
mpiexec=("$@")
source "$src/scripts/mpi_launcher.sh"  # mpi_rank_pids
work=$(mktemp -d)
job=
stopped=
cleanup() {
  # Only what this script started: the stopped rank (continued, then killed) and the launcher.
  [[ -n $stopped ]] && kill -CONT "$stopped" 2>/dev/null && kill -KILL "$stopped" 2>/dev/null
  [[ -n $job ]] && kill -KILL "$job" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $1"
  [[ -n ${2:-} && -f $2 ]] && tail -30 "$2"
  exit 1
}
now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }  # bash 5
seconds() { printf '%d.%d' $(($1 / 1000)) $(($1 % 1000 / 100)); }
line_re='watchdog: .* on group [a-z]+ \(world ranks? [0-9,]+\) pending for [0-9.]+ s \(train\.comm_timeout_s = [0-9.]+\): aborting the job'

# 1. The stall program: the operation and group named exactly.
expect_stall() {  # expect_stall OP RANKS PATTERN
  local op=$1 ranks=$2 pattern=$3 log=$work/stall_$1.log start status elapsed
  start=$(now_ms)
  timeout --kill-after=5 60 "${mpiexec[@]}" -np "$ranks" "$stall" "$op" 2 >"$log" 2>&1
  status=$?
  elapsed=$(($(now_ms) - start))
  [[ $status -ne 0 ]] || fail "stall $op: the job exited with status 0" "$log"
  [[ $status -ne 124 && $status -ne 137 ]] || fail "stall $op: the job hung (killed by timeout)" "$log"
  ((elapsed < 15000)) || fail "stall $op: the job took $(seconds $elapsed) s to end (limit 15 s)" "$log"
  grep -qE "$line_re" "$log" || fail "stall $op: no watchdog line" "$log"
  grep -qF "$pattern" "$log" || fail "stall $op: the watchdog line does not say '$pattern'" "$log"
  echo "1. stall $op: the job ended after $(seconds $elapsed) s: $(grep -oE "watchdog: .*" "$log" | head -1)"
}
expect_stall all_reduce 2 "watchdog: all_reduce on group pair (world ranks 0,1) pending for 2."
expect_stall recv 2 "watchdog: recv from world rank 1 (tag 7) on group pair (world ranks 0,1) pending"
expect_stall barrier 4 "watchdog: barrier on group world (world ranks 0,1,2,3) pending"

# 2. The trainer, one rank of four stopped.
log=$work/train.log
"${mpiexec[@]}" -np 4 "$pretrain" --config "$src/configs/tiny.yaml" --set parallel.tensor=2 \
  --set parallel.pipeline=2 --set train.steps=100000 --set train.log_interval=1 \
  --set train.comm_timeout_s=5 --set train.output_dir="$work/run" >"$log" 2>&1 &
job=$!
for _ in $(seq 600); do  # up to 60 s for start-up and the first step
  grep -q "step .*| loss" "$log" && break
  kill -0 "$job" 2>/dev/null || fail "trainer: ended before the first step" "$log"
  sleep 0.1
done
grep -q "step .*| loss" "$log" || fail "trainer: no progress line within 60 s" "$log"
grep -q "straggler" "$log" && echo "   (a straggler warning before the stop, on a shared machine: $(grep -o 'straggler.*' "$log" | head -1))"

# The rank to stop: world rank 2 (by the launcher's environment), else any rank.
stopped=$(mpi_rank_pids "$job" 2 | head -1)
[[ -n $stopped ]] || stopped=$(mpi_rank_pids "$job" | head -1)
[[ -n $stopped ]] || fail "trainer: could not find a rank's process" "$log"
kill -STOP "$stopped"
start=$(now_ms)
while kill -0 "$job" 2>/dev/null; do
  (($(now_ms) - start < 60000)) || fail "trainer: still running 60 s after SIGSTOP" "$log"
  sleep 0.2
done
wait "$job"
status=$?
job=
elapsed=$(($(now_ms) - start))
kill -CONT "$stopped" 2>/dev/null
stopped=
[[ $status -ne 0 ]] || fail "trainer: exit status 0 after a rank was stopped" "$log"
((elapsed < 30000)) || fail "trainer: the job took $(seconds $elapsed) s to end after SIGSTOP (limit 30 s)" "$log"
grep -qE "$line_re" "$log" || fail "trainer: no watchdog line naming the operation and group" "$log"
grep -qF "(train.comm_timeout_s = 5)" "$log" || fail "trainer: the watchdog line does not give the timeout" "$log"
echo "2. trainer: one rank of 4 stopped; the job ended after $(seconds $elapsed) s (status $status)"
grep -oE "watchdog: .*" "$log" | sed 's/^/   /'
echo "OK"
