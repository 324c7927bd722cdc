#!/usr/bin/env bash
# One command from a fresh Debian machine to the main job: installs what is missing, builds,
# prepares real text (the Jargon File, shipped by Debian's jargon-text package) and trains a small
# GPT on 4 ranks under mpirun with tensor 2 x pipeline 2 (configs/quickstart.yaml). The run lands
# in runs/quickstart/ (metrics.jsonl, log.txt, config.yaml, checkpoints/). Extra arguments go to
# pretrain_gpt (e.g. --set train.steps=100).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
BUILD_TARGETS="pretrain_gpt preprocess_data" ./scripts/build.sh

mkdir -p data runs/quickstart
if [[ ! -f data/jargon_text_document.idx ]]; then
  zcat /usr/share/doc/jargon-text/jargon.txt.gz >data/jargon.txt
  build/bin/preprocess_data --input data/jargon.txt --output-prefix data/jargon --tokenizer-type ByteLevel \
    --append-eod
fi

source scripts/mpi_launcher.sh  # the launcher flags for one machine, Open MPI's or MPICH's
mapfile -t mpi_flags < <(mpi_launcher_flags mpirun)
# Four ranks share two cores: one thread each, and OpenMP threads that sleep rather than spin
# while they wait (spinning steals the cores other ranks need).
OMP_NUM_THREADS=1 OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} mpirun "${mpi_flags[@]}" -np 4 build/bin/pretrain_gpt --config configs/quickstart.yaml "$@" \
  2>&1 | tee runs/quickstart/log.txt
