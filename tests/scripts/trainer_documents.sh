#!/usr/bin/env bash
# End-to-end: packed documents (data.reset_position_ids, data.reset_attention_mask,
# data.eod_mask_loss; docs/data.md) through pretrain_gpt on real text (tests/data/sample.txt, one
# document per line, byte-level tokens with the eod appended): every layout logs the losses of one
# rank (fp32, relative 1e-5) -- pp 2, dp 2 with the distributed optimizer, dp 2 with ZeRO-3,
# tp 2 + sp, cp 2 for each exchange, rope and learned positions, cp 2 on the balanced layout -- and
# the keys change the loss (documents do fall inside the 32-token windows), and the memory plan
# stays within 10 % of the measured peak on a packed, windowed run. The model-level proof that a
# packed document gets exactly the loss and gradients it has alone is test_packed_documents.
#   trainer_documents.sh SOURCE_DIR PRETRAIN_GPT PREPROCESS_DATA MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2 preprocess=$3
shift 3
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$preprocess" --input "$src/tests/data/sample.txt" --output-prefix "$work/sample" --tokenizer-type ByteLevel \
  --append-eod >/dev/null
common=(--config "$src/configs/tiny.yaml" --set train.steps=6 --set train.log_interval=1
  --set data.path="$work/sample_text_document" --set model.vocab_size=257 --set data.split=100,0,0
  --set data.tokenizer=ByteLevel --set model.seq_length=32)
docs=(--set data.reset_position_ids=true --set data.reset_attention_mask=true --set data.eod_mask_loss=true)

losses() { grep -o '"loss":[^,}]*' "$1/metrics.jsonl" | cut -d: -f2; }

# compare REF NAME: the run's losses against the reference's, relative 1e-5 each.
compare() {
  paste <(losses "$work/$1") <(losses "$work/$2") | awk -v name="$2" -v tol=1e-5 '
    { n++; d = $1 - $2; if (d < 0) d = -d; s = ($1 < 0 ? -$1 : $1); if (d / s > worst) worst = d / s
      if (d > tol * s) { printf "%s: step %d loss %s vs one rank %s\n", name, n, $2, $1; bad = 1 } }
    END { if (n != 6) { printf "%s: %d losses, expected 6\n", name, n; bad = 1 }
          if (bad) exit 1
          printf "%s: 6 losses equal one rank within %g (largest difference %.2g)\n", name, tol, worst }'
}

run() {  # run NAME RANKS [--set ...]
  local name=$1 ranks=$2
  shift 2
  "${mpiexec[@]}" -np "$ranks" "$pretrain" "${common[@]}" --set train.output_dir="$work/$name" "$@" \
    >"$work/$name.log" 2>&1 || { echo "$name failed:"; tail -20 "$work/$name.log"; exit 1; }
}

run plain 1
for pos in learned rope; do
  run "ref_$pos" 1 "${docs[@]}" --set model.position_embedding=$pos
  if paste <(losses "$work/plain") <(losses "$work/ref_$pos") | awk '{ if ($1 != $2) diff = 1 } END { exit diff }'; then
    echo "$pos: the document keys did not change the loss"
    exit 1
  fi
  run "pp2_$pos" 2 "${docs[@]}" --set model.position_embedding=$pos --set parallel.pipeline=2
  run "tp2sp_$pos" 2 "${docs[@]}" --set model.position_embedding=$pos --set parallel.tensor=2 \
    --set parallel.sequence_parallel=true
  run "cp2p2p_$pos" 2 "${docs[@]}" --set model.position_embedding=$pos --set parallel.context=2
  for layout in pp2 tp2sp cp2p2p; do compare "ref_$pos" "${layout}_$pos"; done
done
run dp2_dist 2 "${docs[@]}" --set model.position_embedding=rope --set optimizer.distributed=true
run dp2_zero3 2 "${docs[@]}" --set model.position_embedding=rope --set optimizer.sharding=optim_grads_params \
  --set optimizer.distributed=true
run cp2a2a 2 "${docs[@]}" --set model.position_embedding=rope --set parallel.context=2 \
  --set parallel.context_comm=a2a
run cp2allgather 2 "${docs[@]}" --set model.position_embedding=rope --set parallel.context=2 \
  --set parallel.context_comm=allgather
for layout in dp2_dist dp2_zero3 cp2a2a cp2allgather; do compare ref_rope "$layout"; done

# The balanced cp layout (parallel.context_layout, docs/parallelism.md) on 256-token windows, where
# the documents unbalance the zigzag: the log names the granules it chose, and cp 2 with p2p
# (balanced named) and allgather (auto) logs one rank's losses.
long=("${docs[@]}" --set model.position_embedding=rope --set model.seq_length=256)
run long_ref 1 "${long[@]}"
run long_cp2p2p 2 "${long[@]}" --set parallel.context=2 --set parallel.context_layout=balanced
run long_cp2allgather 2 "${long[@]}" --set parallel.context=2 --set parallel.context_comm=allgather
for layout in long_cp2p2p long_cp2allgather; do
  grep -q "context layout: balanced; first micro-batch: [0-9]* granules" "$work/$layout.log" ||
    { echo "$layout: no balanced layout in the log:"; grep "context layout" "$work/$layout.log"; exit 1; }
  compare long_ref "$layout"
done
grep -o "context layout: .*" "$work/long_cp2p2p.log"

# The memory plan (train.check_memory's figures) stays within 10 % of the measured peak on a packed,
# windowed run (pp 2: both the attention workspace and the schedule's activations counted).
plan_run=("${docs[@]}" --set model.position_embedding=rope --set model.sliding_window=8 --set parallel.pipeline=2)
run plan 2 "${plan_run[@]}" --plan
run planned 2 "${plan_run[@]}"
measured=$(tail -1 "$work/planned/metrics.jsonl" | grep -o '"mem_peak_bytes":[0-9]*' | cut -d: -f2)
planned=$(grep -o '"peak_bytes": [0-9]*' "$work/plan/plan.json" | cut -d' ' -f2 | sort -n | tail -1)
[[ -n $measured && $measured -gt 0 && -n $planned ]] || { echo "no mem_peak_bytes or plan"; exit 1; }
awk -v p="$planned" -v m="$measured" 'BEGIN { e = p / m - 1; if (e < 0) e = -e; exit !(e <= 0.10) }' ||
  { echo "packed + window: mem_peak_bytes $measured is not within 10 % of the planned peak $planned"; exit 1; }
echo "packed + window: mem_peak_bytes $measured, planned peak $planned"
