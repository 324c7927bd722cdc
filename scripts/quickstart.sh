#!/usr/bin/env bash
# One command from a fresh Debian machine to the main job: installs what is missing, builds, and
# runs on 4 ranks under mpirun (tensor 2 x pipeline 2). Output goes to runs/quickstart/.
#
# Until the GPT trainer lands (issue 6) the main job is the most complete thing that runs: the
# quick-start config is validated and every process group is built and checked with real
# collectives.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
mkdir -p runs/quickstart
mpi_flags=(--oversubscribe --bind-to none)
[[ $(id -u) -eq 0 ]] && mpi_flags+=(--allow-run-as-root)
OMP_NUM_THREADS=1 mpirun "${mpi_flags[@]}" -np 4 build/bin/parallel_layout --config configs/quickstart.yaml \
  --set train.output_dir=runs/quickstart "$@" 2>&1 | tee runs/quickstart/log.txt
