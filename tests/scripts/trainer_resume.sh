#!/usr/bin/env bash
# Checkpoints through the trainer, end to end:
#  1. exact resume: 10 steps straight == 5 steps, save, resume, 5 more (same layout, bitwise losses);
#  2. reshard: 5 steps at tp2 x pp2 x dp2 with the distributed optimizer, then resume on one rank
#     and at tp4, and match the uninterrupted single-rank run (relative 1e-5);
#  3. SIGTERM: a long run told to stop saves a checkpoint at a step boundary and exits cleanly.
# The learning rate is constant so that a 5-step run follows the same schedule as a 10-step one.
#   trainer_resume.sh SOURCE_DIR PRETRAIN_GPT MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2
shift 2
mpiexec=("$@")
source "$src/scripts/mpi_launcher.sh"  # mpi_rank_pids
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$src/configs/tiny.yaml" --set train.log_interval=1 --set optimizer.lr_decay=constant
  --set optimizer.warmup_steps=0 --set model.num_layers=4)

run() {  # run NAME RANKS [--set ...]
  local name=$1 ranks=$2
  shift 2
  "${mpiexec[@]}" -np "$ranks" "$pretrain" "${common[@]}" --set train.output_dir="$work/$name" "$@" \
    >"$work/$name.log" 2>&1 || { echo "$name failed:"; tail -20 "$work/$name.log"; exit 1; }
}
losses() { grep -o '"loss":[^,}]*' "$work/$1/metrics.jsonl" | cut -d: -f2; }
# compare A B TOL: losses of run B (resumed: its 5 lines) against the last 5 lines of run A.
compare() {
  paste <(losses "$1" | tail -5) <(losses "$2") | awk -v name="$2" -v tol="$3" '
    { n++; d = $1 - $2; if (d < 0) d = -d; s = ($1 < 0 ? -$1 : $1);
      if (d > tol * s) { printf "%s: step %d loss %s vs uninterrupted %s\n", name, n + 5, $2, $1; bad = 1 } }
    END { if (n != 5) { printf "%s: %d losses, expected 5\n", name, n; bad = 1 }
          if (bad) exit 1; printf "%s: steps 6-10 equal the uninterrupted run (tolerance %s)\n", name, tol }'
}

# 1. Exact resume on 2 ranks (dp2, distributed optimizer).
dist=(--set optimizer.distributed=true)
run straight 2 --set train.steps=10 "${dist[@]}"
run first_half 2 --set train.steps=5 --set checkpoint.dir="$work/ckpt_dp2" "${dist[@]}"
run resumed 2 --set train.steps=10 --set checkpoint.load=latest --set checkpoint.dir="$work/ckpt_dp2" "${dist[@]}"
compare straight resumed 0

# 2. Save at tp2 x pp2 x dp2 (distributed optimizer), load at one rank and at tp4.
run single 1 --set train.steps=10
run saver 8 --set train.steps=5 --set parallel.tensor=2 --set parallel.pipeline=2 --set checkpoint.dir="$work/ckpt8" \
  "${dist[@]}"
run on_one_rank 1 --set train.steps=10 --set checkpoint.load="$work/ckpt8"
run on_tp4 4 --set train.steps=10 --set parallel.tensor=4 --set checkpoint.load="$work/ckpt8"
compare single on_one_rank 1e-5
compare single on_tp4 1e-5

# 3. SIGTERM to every rank, as a scheduler sends it before a job's time runs out: they agree on a
#    step, save and exit 0; the checkpoint then resumes.
"${mpiexec[@]}" -np 2 "$pretrain" "${common[@]}" --set train.steps=100000 --set checkpoint.dir="$work/ckpt_term" \
  --set train.output_dir="$work/term" >"$work/term.log" 2>&1 &
job=$!
for _ in $(seq 1 300); do
  [[ -f $work/term/metrics.jsonl ]] && (($(wc -l <"$work/term/metrics.jsonl") >= 3)) && break
  sleep 0.1
done
kill -TERM $(mpi_rank_pids "$job")
status=0
wait "$job" || status=$?
# On failure, the last 80 lines that are not info logs: an abort's backtrace starts above the last 20.
[[ $status -eq 0 ]] || { echo "SIGTERM: exit status $status"; grep -v "\] \[info\]" "$work/term.log" | tail -80; exit 1; }
grep -q "stopping at step" "$work/term.log" || { echo "SIGTERM: no stop message"; tail -5 "$work/term.log"; exit 1; }
step=$(sed -n 's/^step_0*\([0-9][0-9]*\)$/\1/p' "$work/ckpt_term/latest")
run term_resumed 2 --set train.steps=$((step + 2)) --set checkpoint.load="$work/ckpt_term"
grep -q "resuming at step $step" "$work/term_resumed.log" || { echo "SIGTERM: did not resume at $step"; exit 1; }
echo "SIGTERM: stopped cleanly at step $step, saved, and resumed from it"
