#!/usr/bin/env bash
# Blends through the trainer (issue 27, item 1; docs/data.md "Blends"), on two real datasets
# (tests/data/sample.txt and the same text upper-cased, byte-level tokens) at 0.7 / 0.3:
#  1. the same sample order on 1 rank and on tp2 x pp2 x dp2 (8 ranks): equal losses (relative 1e-5,
#     as trainer_parity), the YAML list form on one and Megatron's flat string on the other, which
#     name the same blend and so share one cache file (written by the first run, loaded by the
#     second); another blend (0.3 / 0.7) logs other losses, so the comparison does see the data;
#  2. exact resume: 4 steps, save, resume to 8 gives the last 4 losses of the straight run bitwise;
#  3. a tampered cache file (one flipped byte) is caught, rebuilt with a warning naming the file and
#     the checksum, the run's losses unchanged and the file back to its bytes;
#  4. per-split blends: data.valid_path as a blend, evaluated;
#  5. an invalid blend and a missing dataset end the run with one line naming the key.
#   trainer_blend.sh SOURCE_DIR PRETRAIN_GPT PREPROCESS_DATA MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2 preprocess=$3
shift 3
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$preprocess" --input "$src/tests/data/sample.txt" --output-prefix "$work/lower" --tokenizer-type ByteLevel \
  --append-eod >/dev/null
tr 'a-z' 'A-Z' <"$src/tests/data/sample.txt" >"$work/upper.txt"
"$preprocess" --input "$work/upper.txt" --output-prefix "$work/upper" --tokenizer-type ByteLevel --append-eod >/dev/null
a=$work/lower_text_document b=$work/upper_text_document
list="[{weight: 0.7, path: $a}, {weight: 0.3, path: $b}]"
flat="0.7 $a 0.3 $b"
common=(--config "$src/configs/tiny.yaml" --set train.log_interval=1 --set model.vocab_size=257
  --set model.seq_length=16 --set data.split=100,0,0 --set optimizer.lr_decay=constant
  --set optimizer.warmup_steps=0)

run() {  # run NAME RANKS [--set ...]
  local name=$1 ranks=$2
  shift 2
  "${mpiexec[@]}" -np "$ranks" "$pretrain" "${common[@]}" --set train.output_dir="$work/$name" "$@" \
    >"$work/$name.log" 2>&1 || { echo "$name failed:"; tail -20 "$work/$name.log"; exit 1; }
}
losses() { grep -o '"loss":[^,}]*' "$work/$1/metrics.jsonl" | cut -d: -f2; }
# compare A B TOL [LAST]: B's losses against A's (A's last LAST lines when given), relative TOL.
compare() {
  local last=${4:-0}
  paste <(if ((last)); then losses "$1" | tail -"$last"; else losses "$1"; fi) <(losses "$2") |
    awk -v name="$2" -v ref="$1" -v tol="$3" -v want="$(losses "$2" | wc -l)" '
    { n++; d = $1 - $2; if (d < 0) d = -d; s = ($1 < 0 ? -$1 : $1); if (d / s > worst) worst = d / s
      if (d > tol * s) { printf "%s: loss %d = %s, %s has %s (tolerance %s)\n", name, n, $2, ref, $1, tol; bad = 1 } }
    END { if (n == 0 || n != want) { printf "%s: %d losses compared\n", name, n; bad = 1 }
          if (bad) exit 1
          printf "%s: %d losses equal %s within %s (largest relative difference %.2g)\n", name, n, ref, tol, worst }'
}
expect_log() {  # expect_log NAME PATTERN WHAT
  grep -q -- "$2" "$work/$1.log" || { echo "$1: $3 (no \"$2\" in its log)"; tail -20 "$work/$1.log"; exit 1; }
}

# 1. One rank (YAML list) and tp2 x pp2 x dp2 with the distributed optimizer (flat string).
run ref 1 --set train.steps=8 --set data.path="$list"
expect_log ref "data: train blend of 2 datasets (0.7 $a, 0.3 $b); index of 64 samples built and written" \
  "rank 0 did not write the blend index"
cache_files=("$work"/cache/blend_train_*.idx)
[[ ${#cache_files[@]} -eq 1 && -f ${cache_files[0]} ]] || { echo "expected one index file in $work/cache"; exit 1; }
cache=${cache_files[0]}
run tp2pp2dp2 8 --set train.steps=8 --set data.path="$flat" --set parallel.tensor=2 --set parallel.pipeline=2 \
  --set optimizer.distributed=true
expect_log tp2pp2dp2 "index of 64 samples loaded: $cache" "the flat string did not find the list form's index"
compare ref tp2pp2dp2 1e-5
run swapped 1 --set train.steps=2 --set data.path="0.3 $a 0.7 $b"
if [[ $(losses swapped | head -1) == $(losses ref | head -1) ]]; then
  echo "0.3 / 0.7 logs the same first loss as 0.7 / 0.3: the losses do not see which data is drawn"
  exit 1
fi
echo "swapped weights: first loss $(losses swapped | head -1), not $(losses ref | head -1)"

# 2. Exact resume, same layout: bitwise.
run first_half 1 --set train.steps=4 --set data.path="$list" --set checkpoint.dir="$work/ckpt"
run resumed 1 --set train.steps=8 --set data.path="$list" --set checkpoint.dir="$work/ckpt" \
  --set checkpoint.load=latest
expect_log resumed "resuming at step 4" "did not resume"
compare ref resumed 0 4

# 3. A tampered index: the last byte before the checksum (the high byte of the last dataset id).
cp "$cache" "$work/index.good"
size=$(stat -c %s "$cache")
printf '\x7f' | dd of="$cache" bs=1 seek=$((size - 5)) conv=notrunc status=none
cmp -s "$cache" "$work/index.good" && { echo "tampering changed nothing"; exit 1; }
run tampered 1 --set train.steps=8 --set data.path="$list"
expect_log tampered "\[warning\] data: blend index $cache is not usable: checksum mismatch" "the tampered index was not caught"
expect_log tampered "index of 64 samples rebuilt and written" "the tampered index was not rebuilt"
compare ref tampered 0
cmp -s "$cache" "$work/index.good" || { echo "the rebuilt index differs from the original"; exit 1; }
echo "tampered index: caught by its checksum, rebuilt byte for byte, same losses"

# 4. The validation split's own blend (every document of its datasets; data.split does not apply).
run valid 1 --set train.steps=2 --set data.path="$a" --set data.valid_path="[1, $a, 1, $b]" \
  --set train.eval_interval=2 --set train.eval_steps=2
expect_log valid "data: valid blend of 2 datasets (0.5 $a, 0.5 $b); index of 16 samples built and written" \
  "no validation blend"
expect_log valid "eval loss" "no evaluation"
echo "data.valid_path: a blend of its own, evaluated"

# 5. One-line errors naming the key.
fails() {  # fails NAME EXPECTED [--set ...]: the run fails and its log has EXPECTED
  local name=$1 expected=$2
  shift 2
  if "${mpiexec[@]}" -np 1 "$pretrain" "${common[@]}" --set train.output_dir="$work/$name" "$@" >"$work/$name.log" 2>&1; then
    echo "$name: ran"
    exit 1
  fi
  expect_log "$name" "$expected" "wrong message"
  echo "$name: $(grep -o -- "$expected.*" "$work/$name.log" | head -1)"
}
fails negative "config: data.path = \"0.7 $a -0.3 $b\": the weight of \"$b\" is -0.3: weights must be >= 0" \
  --set data.path="0.7 $a -0.3 $b"
fails missing "data.train_path: indexed dataset $work/absent.idx" --set data.train_path="0.5 $a 0.5 $work/absent"
