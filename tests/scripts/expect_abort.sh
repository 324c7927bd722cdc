#!/usr/bin/env bash
# Usage: expect_abort.sh MPIEXEC [MPIEXEC ARGS...] PROGRAM
# Runs PROGRAM on 4 ranks; one rank fails mid-run. Passes when the job ends by itself, soon, with a
# non-zero status, and the log names the failure and the rank it happened on.
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 MPIEXEC [ARGS...] PROGRAM" >&2
  exit 2
fi
program="${*: -1}"
mpiexec=("${@:1:$#-1}")
log=$(mktemp)
trap 'rm -f "$log"' EXIT

start=$(date +%s)
# A hang is the failure mode this guards against, so the outer timeout is generous and the
# duration is checked separately.
timeout --kill-after=10 60 "${mpiexec[@]}" -np 4 "$program" >"$log" 2>&1
status=$?
elapsed=$(($(date +%s) - start))
cat "$log"

fail() {
  echo "expect_abort: FAIL: $*" >&2
  exit 1
}
[ "$status" -ne 0 ] || fail "the job exited with status 0"
[ "$status" -ne 124 ] && [ "$status" -ne 137 ] || fail "the job hung and was killed by timeout (status $status)"
[ "$elapsed" -le 20 ] || fail "the job took ${elapsed}s to end (limit 20s)"
grep -q "injected failure on rank 1" "$log" || fail "the log lacks the failure message"
grep -q "rank 1" "$log" || fail "the log does not name rank 1"
echo "expect_abort: OK (status $status after ${elapsed}s)"
