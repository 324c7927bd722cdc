#!/usr/bin/env bash
# Know before you launch, never stall in silence (issue 16, items 3-5), through the real programs:
#  1. an unwritable checkpoint.dir ends the run before the model is built: exit 2, one line naming
#     the key, the path and the errno text;
#  2. checkpoint.load: latest with no checkpoint yet: a warning, then training from step 0;
#  3. a full disk under train.output_dir (a file-size limit on the rank: ulimit -f with SIGXFSZ
#     ignored, so writes fail with EFBIG; no root needed): training finishes with one warning naming
#     metrics.jsonl and the errno, and metrics.jsonl holds only whole lines;
#  4. SIGUSR1 (Slurm's early warning) to rank 1 only: the job stops, and rank 0's stop message names
#     SIGUSR1 (it said "signal 0" for SIGTERM; trainer_resume sends SIGTERM to every rank);
#  5. SIGTERM during start-up (a model that takes long to build): the job ends at once;
#  6. a checkpoint whose extras say step -5: the error names the checkpoint's index.json;
#  7. preprocess_data --workers 0: the valid range, plainly.
#   trainer_early_checks.sh SOURCE_DIR PRETRAIN_GPT PREPROCESS_DATA MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2 preprocess=$3
shift 3
mpiexec=("$@")
source "$src/scripts/mpi_launcher.sh"  # mpi_rank_pids
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$src/configs/tiny.yaml" --set train.log_interval=1)
fail() {
  echo "FAIL: $1"
  [[ -n ${2:-} && -f $2 ]] && tail -20 "$2"
  exit 1
}

# 1. Unwritable checkpoint.dir: below a regular file, which no one (root included) can create.
echo x >"$work/a_file"
status=0
"${mpiexec[@]}" -np 2 "$pretrain" "${common[@]}" --set train.output_dir="$work/one" \
  --set checkpoint.dir="$work/a_file/ckpt" >"$work/one.log" 2>&1 || status=$?
[[ $status -eq 2 ]] || fail "unwritable checkpoint.dir: exit status $status, expected 2" "$work/one.log"
grep -q "^config: checkpoint.dir = \"$work/a_file/ckpt\": not writable: .*Not a directory$" "$work/one.log" ||
  fail "unwritable checkpoint.dir: no one-line error naming key, path and errno" "$work/one.log"
! grep -q "GPT: " "$work/one.log" || fail "unwritable checkpoint.dir: the model was built first" "$work/one.log"
echo "1. unwritable checkpoint.dir refused before the model is built"

# 2. load: latest, nothing saved yet.
"${mpiexec[@]}" -np 1 "$pretrain" "${common[@]}" --set train.steps=2 --set train.output_dir="$work/two" \
  --set checkpoint.dir="$work/ckpt" --set checkpoint.load=latest >"$work/two.log" 2>&1 ||
  fail "load: latest with no checkpoint failed" "$work/two.log"
grep -q "warning.*checkpoint.load = latest: no checkpoint under $work/ckpt yet; starting from scratch" \
  "$work/two.log" || fail "load: latest with no checkpoint: no warning" "$work/two.log"
grep -q "step 2/2" "$work/two.log" || fail "load: latest with no checkpoint: did not train" "$work/two.log"
echo "2. load: latest with no checkpoint starts from scratch with a warning"

# 3. Full disk: 3 KiB per file for the rank (config.yaml fits, metrics.jsonl fills up after ~17 lines).
#    UCX (MPICH's transport here) backs its shared-memory transport with files the limit would refuse
#    at MPI_Init; one rank needs no shared memory.
"${mpiexec[@]}" -np 1 bash -c 'trap "" XFSZ; ulimit -f 3; UCX_TLS=self,tcp exec "$@"' limited "$pretrain" "${common[@]}" \
  --set train.steps=40 --set train.output_dir="$work/full" >"$work/full.log" 2>&1 ||
  fail "full disk: training did not finish" "$work/full.log"
grep -q "step 40/40" "$work/full.log" || fail "full disk: training did not go on to step 40" "$work/full.log"
# One warning per failing stretch: a shorter line can still fit in the last bytes, and LineFile then
# says writing works again before the next failure warns anew (the count depends on line lengths).
warnings=$(grep -c "warning.*cannot write to $work/full/metrics.jsonl: File too large" "$work/full.log" || true)
recovered=$(grep -c "writing to $work/full/metrics.jsonl works again" "$work/full.log" || true)
((warnings >= 1 && warnings == recovered + 1)) ||
  fail "full disk: $warnings warnings naming metrics.jsonl and the errno after $recovered recoveries, expected one more warning than recoveries" "$work/full.log"
metrics=$work/full/metrics.jsonl
lines=$(wc -l <"$metrics")
((lines > 0 && lines < 40)) || fail "full disk: $lines lines in metrics.jsonl, expected some but not all"
[[ $(tail -c 1 "$metrics" | od -An -c | tr -d ' ') == '\n' ]] || fail "full disk: metrics.jsonl ends mid-line"
awk '!/^\{.*"step":[0-9]+.*\}$/ { bad = 1 } END { exit bad }' "$metrics" ||
  fail "full disk: metrics.jsonl holds a partial line"
echo "3. full disk: training went on with one warning; metrics.jsonl holds $lines whole lines"

# 4. SIGUSR1 to rank 1 only: the ranks agree on the stop, and rank 0 names the signal.
"${mpiexec[@]}" -np 2 "$pretrain" "${common[@]}" --set train.steps=100000 --set train.output_dir="$work/term" \
  >"$work/term.log" 2>&1 &
job=$!
for _ in $(seq 1 300); do
  [[ -f $work/term/metrics.jsonl ]] && (($(wc -l <"$work/term/metrics.jsonl") >= 3)) && break
  sleep 0.1
done
signalled=0
for pid in $(mpi_rank_pids "$job" 1); do
  kill -USR1 "$pid"
  signalled=1
done
[[ $signalled -eq 1 ]] || { kill -TERM "$job"; fail "SIGUSR1 to rank 1: rank 1 not found"; }
status=0
wait "$job" || status=$?
[[ $status -eq 0 ]] || fail "SIGUSR1 to rank 1: exit status $status" "$work/term.log"
grep -q "stopping at step [0-9]* on SIGUSR1" "$work/term.log" || fail "SIGUSR1 to rank 1: signal not named" "$work/term.log"
echo "4. SIGUSR1 to rank 1: $(grep -o 'stopping at step [0-9]* on SIGUSR1' "$work/term.log")"

# 5. SIGTERM while the model is being built (a million layers take minutes; a memory plan may also
#    refuse such a model at once, which is as prompt): the job must end within seconds.
"${mpiexec[@]}" -np 2 "$pretrain" "${common[@]}" --set model.num_layers=1000000 \
  --set train.output_dir="$work/startup" >"$work/startup.log" 2>&1 &
job=$!
sleep 3
start=$SECONDS
ranks=$(mpi_rank_pids "$job")
[[ -z $ranks ]] || kill -TERM $ranks 2>/dev/null || true
wait "$job" || true
((SECONDS - start <= 15)) || fail "SIGTERM during start-up: the job took $((SECONDS - start)) s to end" "$work/startup.log"
! grep -q "step 1/" "$work/startup.log" || fail "SIGTERM during start-up: training began" "$work/startup.log"
echo "5. SIGTERM during start-up: the job ended within $((SECONDS - start)) s"

# 6. A checkpoint's extras with a negative step (the first "step" in index.json is the extras').
sed -i '0,/"step": 2/s//"step": -5/' "$work/ckpt/step_00000002/index.json"
status=0
"${mpiexec[@]}" -np 1 "$pretrain" "${common[@]}" --set train.steps=4 --set train.output_dir="$work/six" \
  --set checkpoint.load="$work/ckpt" >"$work/six.log" 2>&1 || status=$?
[[ $status -ne 0 ]] || fail "extras step -5: accepted" "$work/six.log"
grep -q "checkpoint $work/ckpt/step_00000002/index.json: extras.step = -5: must be >= 0" "$work/six.log" ||
  fail "extras step -5: the message does not name the checkpoint file" "$work/six.log"
echo "6. extras step -5: refused naming $work/ckpt/step_00000002/index.json"

# 7. preprocess_data --workers 0.
status=0
"$preprocess" --input "$src/tests/data/sample.txt" --output-prefix "$work/pre" --tokenizer-type ByteLevel \
  --workers 0 2>"$work/pre.err" || status=$?
[[ $status -eq 2 ]] || fail "--workers 0: exit status $status, expected 2" "$work/pre.err"
grep -q -- "--workers: Value 0 not in range 1 to 1024" "$work/pre.err" || fail "--workers 0: unclear message" "$work/pre.err"
(($(wc -c <"$work/pre.err") < 120)) || fail "--workers 0: message too long" "$work/pre.err"
echo "7. --workers 0: $(cat "$work/pre.err")"
