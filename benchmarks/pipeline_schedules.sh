#!/usr/bin/env bash
# Pipeline schedules side by side with real processes (docs/benchmarks.md, "Pipeline schedules"):
# p = 4 ranks, m = 8 micro-batches; per rank the step time, busy and idle time, the idle fraction and
# the allocator's peak during the step (activation memory) for 1f1b, interleaved (v = 2), zb-h1,
# zb-v and dualpipe-v. One thread per rank; prints the machine and the date first.
#   benchmarks/pipeline_schedules.sh [BUILD_DIR] [extra bench_pipeline_bubble arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift $(($# > 0 ? 1 : 0))
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "command: OMP_NUM_THREADS=1 mpirun -np 4 --oversubscribe --bind-to none $build/bin/bench_pipeline_bubble --micro-batches 8 $*"
OMP_NUM_THREADS=1 mpirun -np 4 --oversubscribe --allow-run-as-root --bind-to none \
  "$build/bin/bench_pipeline_bubble" --micro-batches 8 "$@"
