#!/usr/bin/env bash
# One command for the whole test suite on a fresh Debian machine: installs what is missing (with
# matplotlib, so that the test plot_metrics runs rather than skips: about 2 minutes the first time),
# builds (with the CUDA backend when nvcc is present; GPU tests skip without a GPU) and runs ctest.
# Extra arguments go to ctest (e.g. -R collectives, -L mpi).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh --with-plots
./scripts/build.sh
cd "${BUILD_DIR:-build}"
# Multi-rank tests oversubscribe the cores on their own; run them one at a time.
ctest --output-on-failure --timeout 600 "$@"
