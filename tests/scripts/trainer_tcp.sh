#!/usr/bin/env bash
# The trainer on 2 ranks whose only path to each other is TCP, as between nodes without InfiniBand:
# Open MPI with the ob1 point-to-point layer over the tcp and self transports only (no shared
# memory, no UCX), the tiny model with tensor 2 (all-reduces), pipeline 2 (sends and receives) and
# data 2 with the distributed optimizer (reduce-scatter, all-gather). Each logs the losses of one
# rank within 1e-5 relative. Were TCP unusable, ob1 would find no route between the ranks and the
# job would fail; the tcp transport's start-up is also checked in Open MPI's verbose log.
# The TCP-only flags come from scripts/mpi_launcher.sh (under MPICH: no shared memory, UCX or
# libfabric on TCP); the start-up check of the transport reads Open MPI's log only.
#   trainer_tcp.sh SOURCE_DIR PRETRAIN_GPT MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2
shift 2
mpiexec=("$@")
source "$src/scripts/mpi_launcher.sh"
kind=$(mpi_launcher_kind "${mpiexec[0]}")
mapfile -t tcp_only < <(mpi_launcher_tcp "${mpiexec[0]}")
if ((${#tcp_only[@]} == 0)); then
  echo "SKIPPED: no TCP-only flags known for ${mpiexec[0]} ($kind)"
  exit 77
fi
verbose=()
[[ $kind == openmpi ]] && verbose=(--mca btl_base_verbose 30)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$src/configs/tiny.yaml" --set train.steps=10 --set train.log_interval=1)
losses() { grep -o '"loss":[^,}]*' "$1/metrics.jsonl" | cut -d: -f2; }

run() {  # run NAME RANKS [mpiexec flags] -- [--set ...]
  local name=$1 ranks=$2 flags=()
  shift 2
  while [[ $# -gt 0 && $1 != -- ]]; do flags+=("$1"); shift; done
  [[ $# -gt 0 ]] && shift
  "${mpiexec[@]}" -np "$ranks" "${flags[@]}" "$pretrain" "${common[@]}" --set train.output_dir="$work/$name" "$@" \
    >"$work/$name.log" 2>&1 || { echo "$name failed:"; tail -20 "$work/$name.log"; exit 1; }
}

compare() {  # compare NAME: the run's losses against the single-rank reference, relative 1e-5
  paste <(losses "$work/ref") <(losses "$work/$1") | awk -v name="$1" '
    { n++; d = $1 - $2; if (d < 0) d = -d; s = ($1 < 0 ? -$1 : $1); if (d / s > worst) worst = d / s
      if (d > 1e-5 * s) { printf "%s: step %d loss %s vs single rank %s\n", name, n, $2, $1; bad = 1 } }
    END { if (n != 10) { printf "%s: %d losses, expected 10\n", name, n; bad = 1 }
          if (bad) exit 1
          printf "%s over TCP only: 10 losses equal the single-rank run within 1e-5 (largest difference %.2g)\n", name, worst }'
}

run ref 1 --
run tp2 2 "${tcp_only[@]}" "${verbose[@]}" -- --set parallel.tensor=2
run pp2 2 "${tcp_only[@]}" -- --set parallel.pipeline=2
run dp2 2 "${tcp_only[@]}" -- --set optimizer.distributed=true

# Open MPI: both ranks brought up the tcp transport, and no shared-memory one (vader) was even opened.
if [[ $kind == openmpi ]]; then
  [[ $(grep -c "select: init of component tcp returned success" "$work/tp2.log") -eq 2 ]] ||
    { echo "tp2: Open MPI's log does not show the tcp transport starting on both ranks:"; grep -i "btl" "$work/tp2.log" | head; exit 1; }
  if grep -q "component vader" "$work/tp2.log"; then echo "tp2: the shared-memory transport was loaded"; exit 1; fi
fi
for layout in tp2 pp2 dp2; do compare $layout; done
