#!/usr/bin/env bash
# A skipped gtest exits 0: on a GPU machine whose GPU is not visible, every GPU test would look
# green. With PARALLEL_REQUIRE_GPU=1 (the GPU check sets it) REQUIRE_GPU() must fail instead.
# Usage: require_gpu.sh TEST_BINARY (a tests/cuda binary; one REQUIRE_GPU test of it is run).
# Honest on both kinds of machine: without a GPU the run must fail and name the variable; with one
# the test must run (not skip) and pass.
set -uo pipefail
bin=$1
filter='CudaAllocator.ZeroBytesIsNull'

out=$(PARALLEL_REQUIRE_GPU=1 "$bin" --gtest_filter="$filter" 2>&1)
rc=$?
if grep -q '\[  SKIPPED \]' <<<"$out"; then
  echo "FAIL: $filter skipped with PARALLEL_REQUIRE_GPU=1 (exit $rc):"
  echo "$out"
  exit 1
fi
if [[ $rc -eq 0 ]]; then
  if ! grep -q '\[  PASSED  \] 1 test' <<<"$out"; then
    echo "FAIL: exit 0 but $filter did not pass:"
    echo "$out"
    exit 1
  fi
  echo "ok: a GPU is visible and $filter ran and passed"
  exit 0
fi
if ! grep -q 'PARALLEL_REQUIRE_GPU=1' <<<"$out"; then
  echo "FAIL: exit $rc without naming PARALLEL_REQUIRE_GPU:"
  echo "$out"
  exit 1
fi
echo "ok: no GPU and PARALLEL_REQUIRE_GPU=1: exit $rc with the message"

# Without the variable a GPU-less machine still skips and exits 0 (the build machines and CI).
out=$(env -u PARALLEL_REQUIRE_GPU "$bin" --gtest_filter="$filter" 2>&1)
rc=$?
if [[ $rc -ne 0 ]] || ! grep -q '\[  SKIPPED \]' <<<"$out"; then
  echo "FAIL: without PARALLEL_REQUIRE_GPU a GPU-less run should skip and exit 0 (exit $rc):"
  echo "$out"
  exit 1
fi
echo "ok: without the variable the test skips and exits 0"
