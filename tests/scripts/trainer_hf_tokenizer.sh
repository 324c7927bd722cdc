#!/usr/bin/env bash
# The trainer with a Hugging Face tokenizer.json (data.tokenizer: HuggingFace, data.tokenizer_file;
# docs/configuration.md, docs/data.md), through the real programs:
#  1. text preprocessed with the Llama 3 layout fixture (tests/reference/fixtures/hf_tokenizer_llama3.json:
#     702 ids, <|begin_of_text|> before each document, eod <|end_of_text|> = 1) trains with packed
#     documents, the end-of-document id read from the tokenizer.json: the losses equal those of the
#     same run given data.eod_token=1 (bitwise), differ from a run splitting at another id, and dp 2
#     logs one rank's losses (relative 1e-5);
#  2. bad settings end the run before the model is built, exit 2, one line naming the key and the
#     rule: no tokenizer_file, a missing file, a malformed one, a vocabulary larger than
#     model.vocab_size, a tokenizer_file with another tokenizer;
#  3. convert_checkpoint --from hf writes data.tokenizer: HuggingFace and the folder's tokenizer.json
#     (absolute) into the training config, which then trains 2 steps on data preprocessed with it;
#     a folder without tokenizer.json leaves the default tokenizer.
#   trainer_hf_tokenizer.sh SOURCE_DIR PREPROCESS_DATA CONVERT_CHECKPOINT PRETRAIN_GPT MPIEXEC...
set -euo pipefail
src=$1 preprocess=$2 convert=$3 pretrain=$4
shift 4
mpiexec=("$@")
fx=$src/tests/reference/fixtures
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $1"
  [[ -n ${2:-} && -f $2 ]] && tail -20 "$2"
  exit 1
}
losses() { grep -o '"loss":[^,}]*' "$1/metrics.jsonl" | cut -d: -f2; }

# 1. Packed documents with the tokenizer.json's end-of-document id.
tokenizer=$fx/hf_tokenizer_llama3.json
"$preprocess" --input "$src/tests/data/sample.txt" --output-prefix "$work/sample" --tokenizer-type HuggingFace \
  --tokenizer-file "$tokenizer" --append-eod >"$work/pre.log" 2>&1 || fail "preprocess" "$work/pre.log"
common=(--config "$src/configs/tiny.yaml" --set train.steps=4 --set train.log_interval=1
  --set data.path="$work/sample_text_document" --set data.split=100,0,0 --set model.vocab_size=702
  --set model.seq_length=32 --set data.reset_position_ids=true --set data.reset_attention_mask=true
  --set data.eod_mask_loss=true)
hf=(--set data.tokenizer=HuggingFace --set data.tokenizer_file="$tokenizer")
run() {  # run NAME RANKS [--set ...]
  local name=$1 ranks=$2
  shift 2
  "${mpiexec[@]}" -np "$ranks" "$pretrain" "${common[@]}" --set train.output_dir="$work/$name" "$@" \
    >"$work/$name.log" 2>&1 || fail "$name: training failed" "$work/$name.log"
  [[ $(losses "$work/$name" | wc -l) -eq 4 ]] || fail "$name: not 4 losses" "$work/$name/metrics.jsonl"
}
run hf 1 "${hf[@]}"
run explicit 1 --set data.eod_token=1
run other 1 --set data.eod_token=296
run hf_dp2 2 "${hf[@]}"
grep -q "GPT: " "$work/hf.log" || fail "no 'GPT: ' line: the refusals below could not tell the model was not built" "$work/hf.log"
cmp -s <(losses "$work/hf") <(losses "$work/explicit") ||
  fail "the tokenizer.json's eod gives other losses than data.eod_token=1: $(losses "$work/hf" | tr '\n' ' ')"
! cmp -s <(losses "$work/hf") <(losses "$work/other") || fail "splitting at another id did not change the loss"
paste <(losses "$work/hf") <(losses "$work/hf_dp2") | awk '
  { d = $1 - $2; if (d < 0) d = -d; s = ($1 < 0 ? -$1 : $1); if (d > 1e-5 * s) bad = 1 }
  END { exit bad }' || fail "dp 2 losses differ from one rank's: $(paste <(losses "$work/hf") <(losses "$work/hf_dp2"))"
echo "1. HuggingFace tokenizer: losses $(losses "$work/hf" | tr '\n' ' ')= data.eod_token=1's; eod 296 differs; dp 2 within 1e-5"

# 2. Refusals: exit 2, one line, before the model is built.
refused() {  # refused NAME EXPECTED [--set ...]
  local name=$1 expected=$2
  shift 2
  local status=0
  "${mpiexec[@]}" -np 1 "$pretrain" "${common[@]}" --set train.output_dir="$work/$name" "$@" \
    >"$work/$name.log" 2>&1 || status=$?
  [[ $status -eq 2 ]] || fail "$name: exit $status, expected 2" "$work/$name.log"
  grep -qF -- "$expected" "$work/$name.log" || fail "$name: no '$expected'" "$work/$name.log"
  [[ $(grep -cF -- "$expected" "$work/$name.log") -eq 1 ]] || fail "$name: said more than once" "$work/$name.log"
  ! grep -q "GPT: " "$work/$name.log" || fail "$name: the model was built first" "$work/$name.log"
  echo "2. $(grep -F -- "$expected" "$work/$name.log")"
}
echo '{"model": {"type": "BPE", ' >"$work/broken.json"
refused no_file 'data.tokenizer_file = "": is needed with data.tokenizer = HuggingFace' --set data.tokenizer=HuggingFace
refused missing "config: data.tokenizer_file = \"$work/missing.json\": " --set data.tokenizer=HuggingFace \
  --set data.tokenizer_file="$work/missing.json"
refused broken "config: data.tokenizer_file = \"$work/broken.json\": " --set data.tokenizer=HuggingFace \
  --set data.tokenizer_file="$work/broken.json"
refused too_large \
  "config: data.tokenizer_file = \"$tokenizer\": the vocabulary (702 ids) is larger than model.vocab_size (512)" \
  "${hf[@]}" --set model.vocab_size=512
refused other_tokenizer "data.tokenizer_file = \"$tokenizer\": is read only with data.tokenizer = HuggingFace, not ByteLevel" \
  --set data.tokenizer=ByteLevel --set data.tokenizer_file="$tokenizer"

# 3. convert_checkpoint --from hf points the training config at the folder's tokenizer.json.
"$convert" --from hf --input "$fx/hf_sft_tiny" --output "$work/init" >"$work/import.log" 2>&1 ||
  fail "import" "$work/import.log"
folder_tokenizer=$(cd "$fx/hf_sft_tiny" && pwd)/tokenizer.json
grep -Eq '^  tokenizer: "?HuggingFace"?$' "$work/init.yaml" || fail "init.yaml: no data.tokenizer HuggingFace" "$work/init.yaml"
grep -Eq "^  tokenizer_file: \"?$folder_tokenizer\"?$" "$work/init.yaml" ||
  fail "init.yaml: no data.tokenizer_file $folder_tokenizer" "$work/init.yaml"
"$preprocess" --input "$src/tests/data/sample.txt" --output-prefix "$work/tiny" --tokenizer-type HuggingFace \
  --tokenizer-file "$folder_tokenizer" --append-eod >"$work/pre_tiny.log" 2>&1 || fail "preprocess" "$work/pre_tiny.log"
"${mpiexec[@]}" -np 1 "$pretrain" --config "$work/init.yaml" --set checkpoint.load="$work/init" \
  --set data.path="$work/tiny_text_document" --set data.split=1,0,0 --set model.seq_length=32 \
  --set train.global_batch_size=2 --set train.micro_batch_size=1 --set train.steps=2 --set train.log_interval=1 \
  --set data.reset_position_ids=true --set data.eod_mask_loss=true --set train.output_dir="$work/converted" \
  >"$work/converted.log" 2>&1 || fail "training from the converted config" "$work/converted.log"
[[ $(losses "$work/converted" | wc -l) -eq 2 ]] || fail "converted: not 2 losses" "$work/converted.log"
mkdir "$work/no_tokenizer"
cp "$fx/hf_sft_tiny/config.json" "$fx/hf_sft_tiny/model.safetensors" "$work/no_tokenizer/"
"$convert" --from hf --input "$work/no_tokenizer" --output "$work/init2" >"$work/import2.log" 2>&1 ||
  fail "import without tokenizer.json" "$work/import2.log"
! grep -q "HuggingFace\|tokenizer_file: \"\?/" "$work/init2.yaml" || fail "init2.yaml names a tokenizer.json" "$work/init2.yaml"
echo "3. convert_checkpoint --from hf: data.tokenizer_file $folder_tokenizer, trained 2 steps (losses" \
  "$(losses "$work/converted" | tr '\n' ' ')); without tokenizer.json the default stays"
