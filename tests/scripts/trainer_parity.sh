#!/usr/bin/env bash
# End-to-end: pretrain_gpt runs of the tiny model under several layouts log the same losses as one
# rank, on synthetic data and on real text (tests/data/sample.txt, byte-level tokens).
#   trainer_parity.sh SOURCE_DIR PRETRAIN_GPT PREPROCESS_DATA MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2 preprocess=$3
shift 3
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$preprocess" --input "$src/tests/data/sample.txt" --output-prefix "$work/sample" --tokenizer-type ByteLevel \
  --append-eod >/dev/null
common=(--config "$src/configs/tiny.yaml" --set train.steps=10 --set train.log_interval=1)
real=(--set data.path="$work/sample_text_document" --set model.vocab_size=257 --set data.split=100,0,0
  --set model.seq_length=16)

losses() { grep -o '"loss":[^,}]*' "$1/metrics.jsonl" | cut -d: -f2; }

# compare NAME: the run's losses against the single-rank reference, relative 1e-5 each.
compare() {
  paste <(losses "$work/ref_$1") <(losses "$work/$2") | awk -v name="$2" '
    { n++; d = $1 - $2; if (d < 0) d = -d; s = ($1 < 0 ? -$1 : $1);
      if (d > 1e-5 * s) { printf "%s: step %d loss %s vs single rank %s\n", name, n, $2, $1; bad = 1 } }
    END { if (n != 10) { printf "%s: %d losses, expected 10\n", name, n; bad = 1 }
          if (bad) exit 1; printf "%s: 10 losses equal the single-rank run\n", name }'
}

run() {  # run DATA NAME RANKS [--set ...]
  local data=$1 name=$2 ranks=$3
  shift 3
  local extra=()
  [[ $data == real ]] && extra=("${real[@]}")
  "${mpiexec[@]}" -np "$ranks" "$pretrain" "${common[@]}" "${extra[@]}" --set train.output_dir="$work/$name" "$@" \
    >"$work/$name.log" 2>&1 || { echo "$name failed:"; tail -20 "$work/$name.log"; exit 1; }
}

for data in synthetic real; do
  run $data "ref_$data" 1
  run $data "tp2pp2_$data" 4 --set parallel.tensor=2 --set parallel.pipeline=2
  run $data "dp2_$data" 2
  run $data "tp2pp2dp2_$data" 8 --set parallel.tensor=2 --set parallel.pipeline=2 --set optimizer.distributed=true
  for layout in tp2pp2 dp2 tp2pp2dp2; do compare $data "${layout}_$data"; done
done
