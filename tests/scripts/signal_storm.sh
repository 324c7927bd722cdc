#!/usr/bin/env bash
# Signals during GEMMs must never corrupt memory (issue 24; oneDNN issue 4845). signal_storm runs
# ColumnParallelLinear -> RowParallelLinear forward and backward on one rank while a child process
# sends it a storm of signals; every configuration below must survive every run with every step's
# results equal to the first's:
#   - SIGTERM and SIGUSR1 into the library's StopFlag (a scheduler's stop, Slurm's --signal=USR1);
#   - SIGUSR2 into an empty handler installed before the library starts, with plain sigaction (a
#     profiler or a host program: no SA_ONSTACK);
#   - the same through ops::gemm alone, no Runtime and no MPI (--bare);
# each with one and two OpenMP threads. Before the signal guard, RUNS=1 (8 runs) lost 4: two heap
# aborts (glibc's "free(): invalid pointer" family) and two to SIGUSR1, which nothing handled then.
#   signal_storm.sh SOURCE_DIR SIGNAL_STORM MPIEXEC...
#   RUNS (default 3): runs per configuration; SIGNALS (default 1500): signals per run.
set -euo pipefail
src=$1 storm=$2
shift 2
mpiexec=("$@")
runs=${RUNS:-3} signals=${SIGNALS:-1500}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

failed=0 total=0
one() {  # one THREADS ARGS...: a run; a failure prints its status and the end of its output
  local threads=$1 status=0
  shift
  total=$((total + 1))
  OMP_NUM_THREADS=$threads timeout 120 "$@" >"$work/out" 2>&1 || status=$?
  if [[ $status -ne 0 ]]; then
    failed=$((failed + 1))
    echo "FAILED (status $status, $threads threads): ${*##*/}"
    grep -v "\] \[info\]" "$work/out" | tail -15
  fi
}

for threads in 1 2; do
  for _ in $(seq 1 "$runs"); do
    one "$threads" "${mpiexec[@]}" -np 1 "$storm" --signals "$signals" --gap-us 50 --handler stopflag --signal TERM
    one "$threads" "${mpiexec[@]}" -np 1 "$storm" --signals "$signals" --gap-us 50 --handler stopflag --signal USR1
    one "$threads" "${mpiexec[@]}" -np 1 "$storm" --signals "$signals" --gap-us 50 --handler external --signal USR2
    one "$threads" "$storm" --bare --signals "$signals" --gap-us 50 --handler external --signal USR2
  done
done
echo "signal_storm: $((total - failed)) of $total runs survived $signals signals each"
[[ $failed -eq 0 ]]
