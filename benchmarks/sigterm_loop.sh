#!/usr/bin/env bash
# Not a ctest (hours for the issue's 500 loops): trainer_resume's SIGTERM scenario in a loop
# (tests/scripts/trainer_resume.sh, part 3). Each loop starts 2 ranks of the tiny config with 4
# layers and a checkpoint directory, sends SIGTERM to both ranks once 3 steps are logged, and
# requires exit 0, "stopping at step" and a `latest` that names the saved step. Every RESUME_EVERY-th
# loop also resumes from that checkpoint for 2 steps. Prints one line per failure and a summary.
#   benchmarks/sigterm_loop.sh BUILD_DIR [LOOPS]      RESUME_EVERY (10)
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$1" && pwd)
loops=${2:-500} resume_every=${RESUME_EVERY:-10}
source "$src/scripts/mpi_launcher.sh"
mpiexec=(mpiexec $(mpi_launcher_flags mpiexec))
while read -r kv; do export "${kv?}"; done < <(mpi_launcher_env mpiexec)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$src/configs/tiny.yaml" --set train.log_interval=1 --set optimizer.lr_decay=constant
  --set optimizer.warmup_steps=0 --set model.num_layers=4)

failed=0 start=$(date +%s)
for loop in $(seq 1 "$loops"); do
  rm -rf "$work/ckpt" "$work/term" "$work/resumed"
  "${mpiexec[@]}" -np 2 "$build/bin/pretrain_gpt" "${common[@]}" --set train.steps=100000 \
    --set checkpoint.dir="$work/ckpt" --set train.output_dir="$work/term" >"$work/term.log" 2>&1 &
  job=$!
  for _ in $(seq 1 600); do
    [[ -f $work/term/metrics.jsonl ]] && (($(wc -l <"$work/term/metrics.jsonl") >= 3)) && break
    sleep 0.1
  done
  kill -TERM $(mpi_rank_pids "$job")
  status=0
  wait "$job" || status=$?
  why=""
  if [[ $status -ne 0 ]]; then
    why="exit status $status: $(grep -m1 -E 'corrupted|free\(\)|malloc|Segmentation|Aborted|error' "$work/term.log")"
  elif ! grep -q "stopping at step" "$work/term.log"; then
    why="no stop message"
  else
    step=$(sed -n 's/^step_0*\([0-9][0-9]*\)$/\1/p' "$work/ckpt/latest")
    if [[ -z $step ]]; then
      why="no latest"
    elif ((loop % resume_every == 0)); then
      "${mpiexec[@]}" -np 2 "$build/bin/pretrain_gpt" "${common[@]}" --set train.steps=$((step + 2)) \
        --set checkpoint.load="$work/ckpt" --set train.output_dir="$work/resumed" >"$work/resumed.log" 2>&1 &&
        grep -q "resuming at step $step" "$work/resumed.log" || why="did not resume at step $step"
    fi
  fi
  if [[ -n $why ]]; then
    failed=$((failed + 1))
    cp "$work/term.log" "/tmp/sigterm_loop_failure_$loop.log"
    echo "loop $loop: $why (log: /tmp/sigterm_loop_failure_$loop.log)"
  fi
  if ((loop % 10 == 0)); then
    echo "sigterm_loop: $loop loops, $failed failed, $(($(date +%s) - start)) s"
  fi
done
echo "sigterm_loop: $failed of $loops loops failed"
