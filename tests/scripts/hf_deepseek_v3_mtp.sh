#!/usr/bin/env bash
# DeepSeek-V3's multi-token prediction layer through convert_checkpoint and the trainer
# (tests/reference/make_hf_deepseek_v3.py's hf_deepseek_v3_mtp_tiny: the tiny DeepSeek-V3 with
# num_nextn_predict_layers 1, its MTP layer model.layers.4.* in a shard of its own):
#  1. --from hf imports it as model.mtp_num_layers 1 (no warning); --to hf writes it back equal to the
#     folder bit for bit (the MTP tensors, embed_tokens / shared_head.head copies included) with
#     num_nextn_predict_layers 1, and that export imports again;
#  2. the imported model trains 3 steps with its MTP loss on one rank and on pp2 (losses, MTP
#     losses and gradient norms equal, relative 1e-5); the trained export imports again (its copies
#     follow the model);
#  3. the config with transformers' save of the model (no MTP tensors) imports without MTP, said in
#     one line; one-line refusals: a partial MTP set (num_nextn_predict_layers 2 with one layer's tensors), MTP
#     with num_nextn_predict_layers 0 (unexpected tensors), and an export of MTP as another
#     architecture (a Llama with model.mtp_num_layers 1), before reading a weight.
#   hf_deepseek_v3_mtp.sh SOURCE_DIR CONVERT_CHECKPOINT PRETRAIN_GPT HF_COMPARE MPIEXEC...
set -euo pipefail
src=$1 convert=$2 pretrain=$3 hf_compare=$4
shift 4
mpiexec=("$@")
fx=$src/tests/reference/fixtures
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PARALLEL_LOG_LEVEL=warn

# quiet and expect_error.
# shellcheck source=convert_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/convert_common.sh"

# 1. Import with MTP, export, compare, import the export.
in=$work/in
mkdir -p "$in"
cp "$fx/hf_deepseek_v3_mtp_tiny/"* "$in/"
cp "$fx/hf_deepseek_v3_tiny/model.safetensors" "$in/model-00001-of-00002.safetensors"
"$convert" --from hf --input "$in" --output "$work/ckpt" >"$work/import.out" 2>"$work/import.err" ||
  { echo "import failed"; cat "$work/import.err"; exit 1; }
[[ ! -s $work/import.err ]] || { echo "import: expected no warning"; cat "$work/import.err"; exit 1; }
grep -qx '  mtp_num_layers: 1' "$work/ckpt.yaml" || { echo "ckpt.yaml lacks mtp_num_layers: 1"; exit 1; }
quiet "$work/export.log" "$convert" --to hf --input "$work/ckpt" --output "$work/hf"
grep -qF '"num_nextn_predict_layers": 1' "$work/hf/config.json" ||
  { echo "the export lacks num_nextn_predict_layers 1"; cat "$work/hf/config.json"; exit 1; }
echo -n "import, export: "
"$hf_compare" equal "$work/hf" "$in"
quiet "$work/import2.log" "$convert" --from hf --input "$work/hf" --output "$work/ckpt2"
diff <(grep -v '^#' "$work/ckpt.yaml") <(grep -v '^#' "$work/ckpt2.yaml") ||
  { echo "the export reads as another model"; exit 1; }

# 2. Train 3 steps on one rank and on pp2 (make_hf_llama.py's settings), export, import again.
train=(--set model.seq_length=8 --set train.global_batch_size=2 --set train.micro_batch_size=1
  --set train.steps=3 --set train.log_interval=1 --set train.eval_interval=0
  --set data.path="$fx/hf_tokens_text_document" --set data.split=1,0,0 --set data.shuffle=false
  --set optimizer.lr=0.01 --set optimizer.lr_decay=constant --set optimizer.warmup_steps=0
  --set optimizer.weight_decay=0.1 --set optimizer.clip_grad=0 --set model.dropout=0)
common=(--config "$work/ckpt.yaml" --set checkpoint.load="$work/ckpt" "${train[@]}")
# run, field and compare (the MTP loss to the loss's tolerance too).
# shellcheck source=parity_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/parity_common.sh"
parity_losses=(loss mtp_loss)
for pp in 1 2; do
  run "pp$pp" "$pp" --set checkpoint.dir="$work/pp$pp/ckpt" --set parallel.pipeline="$pp"
  [[ $(field "pp$pp" mtp_loss | wc -l) == 3 ]] || { echo "pp$pp: no MTP loss"; cat "$work/pp$pp/metrics.jsonl"; exit 1; }
done
echo -n "train pp1 vs pp2: "
compare pp1 pp2 1e-5 1e-5 3
quiet "$work/export3.log" "$convert" --to hf --input "$work/pp1/ckpt" --output "$work/hf3"
quiet "$work/import3.log" "$convert" --from hf --input "$work/hf3" --output "$work/ckpt3"
grep -qx '  mtp_num_layers: 1' "$work/ckpt3.yaml" || { echo "the trained export lost its MTP layer"; exit 1; }

# The same config.json with transformers' save of the model (no MTP tensors): imported without MTP,
# said in one line.
mkdir -p "$work/plain"
cp "$in/config.json" "$work/plain/" && cp "$fx/hf_deepseek_v3_tiny/model.safetensors" "$work/plain/"
"$convert" --from hf --input "$work/plain" --output "$work/plain_ckpt" >/dev/null 2>"$work/plain.err" ||
  { echo "plain: import failed"; cat "$work/plain.err"; exit 1; }
[[ $(wc -l <"$work/plain.err") == 1 ]] && grep -qx '  mtp_num_layers: 0' "$work/plain_ckpt.yaml" &&
  grep -qF 'num_nextn_predict_layers = 1, but the folder holds no multi-token prediction tensors (model.layers.4.*)' "$work/plain.err" ||
  { echo "plain: expected an import without MTP and one line saying so"; cat "$work/plain.err"; exit 1; }
echo "plain: $(sed 's/.*hf: //' "$work/plain.err")"

# 3. Refusals.
mkdir -p "$work/partial"
cp "$in/"*.safetensors "$in/model.safetensors.index.json" "$work/partial/"
sed 's/"num_nextn_predict_layers": 1/"num_nextn_predict_layers": 2/' "$in/config.json" >"$work/partial/config.json"
expect_error partial "num_nextn_predict_layers = 2: the multi-token prediction tensors (model.layers.4.* to model.layers.5.*) are incomplete" \
  --from hf --input "$work/partial" --output "$work/e1"
mkdir -p "$work/no_mtp"
cp "$in/"*.safetensors "$in/model.safetensors.index.json" "$work/no_mtp/"
sed 's/"num_nextn_predict_layers": 1/"num_nextn_predict_layers": 0/' "$in/config.json" >"$work/no_mtp/config.json"
expect_error no_mtp "unexpected tensor 'model.layers.4." --from hf --input "$work/no_mtp" --output "$work/e2"
quiet "$work/llama.log" "$convert" --from hf --input "$fx/hf_llama_tiny" --output "$work/llama"
sed 's/^  mtp_num_layers: .*/  mtp_num_layers: 1/' "$work/llama.yaml" >"$work/llama_mtp.yaml"
grep -qx '  mtp_num_layers: 1' "$work/llama_mtp.yaml" || { echo "the edit did not apply"; exit 1; }
expect_error llama_mtp "LlamaForCausalLM cannot hold this model: model.mtp_num_layers = 1" \
  --to hf --input "$work/llama" --output "$work/e3" --config "$work/llama_mtp.yaml"
echo "hf_deepseek_v3_mtp: all checks passed"
