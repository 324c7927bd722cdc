#!/usr/bin/env bash
# README.md's "Fine-tune a Hugging Face model": the first ```sh block of that section, run as it
# stands (mpirun being the test's launcher, build/bin these programs) in a scratch copy of the paths
# it names; then the run logged 20 steps whose loss fell, the export is an HF folder that imports
# again, and its weights moved away from the model it started from.
#   readme_sft.sh SOURCE_DIR PREPROCESS_DATA CONVERT_CHECKPOINT PRETRAIN_GPT HF_COMPARE MPIEXEC...
set -euo pipefail
src=$1 preprocess=$2 convert=$3 pretrain=$4 compare=$5
shift 5
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PARALLEL_LOG_LEVEL=warn
fail() {
  echo "FAIL: $1"
  [[ -n ${2:-} && -f $2 ]] && tail -20 "$2"
  exit 1
}

commands=$(awk '/^## Fine-tune a Hugging Face model/ { in_section = 1; next }
  in_section && /^## / { exit }
  in_section && /^```sh$/ { in_block = 1; next }
  in_section && in_block && /^```$/ { exit }
  in_block { print }' "$src/README.md")
[[ -n $commands ]] || fail "no sh block under '## Fine-tune a Hugging Face model' in README.md"
echo "$commands" >"$work/readme.sh"

mkdir -p "$work/build/bin"
ln -s "$preprocess" "$work/build/bin/preprocess_data"
ln -s "$convert" "$work/build/bin/convert_checkpoint"
ln -s "$pretrain" "$work/build/bin/pretrain_gpt"
ln -s "$src/tests" "$work/tests"
ln -s "$src/examples" "$work/examples"
printf -v launcher '%q ' "$@"
(cd "$work" && bash -euo pipefail -c "mpirun() { $launcher \"\$@\"; }; source readme.sh") >"$work/readme.log" 2>&1 ||
  fail "the README commands failed" "$work/readme.log"

metrics=$work/runs/sft/metrics.jsonl
[[ -f $metrics ]] || fail "no runs/sft/metrics.jsonl"
mapfile -t losses < <(grep -o '"loss":[^,}]*' "$metrics" | cut -d: -f2)
[[ ${#losses[@]} -eq 20 ]] || fail "${#losses[@]} losses, expected 20" "$work/readme.log"
awk -v a="${losses[0]}" -v b="${losses[19]}" 'BEGIN { exit !(b < 0.9 * a) }' ||
  fail "the loss did not fall: ${losses[0]} -> ${losses[19]}"
[[ -f $work/runs/sft/hf/config.json && -f $work/runs/sft/hf/model.safetensors ]] || fail "no exported folder"
"$convert" --from hf --input "$work/runs/sft/hf" --output "$work/again" >"$work/again.log" 2>&1 ||
  fail "the exported folder does not import" "$work/again.log"
if "$compare" equal "$work/runs/sft/hf" "$src/tests/reference/fixtures/hf_sft_tiny" >"$work/equal.log" 2>&1; then
  fail "the exported weights equal the initial ones"
fi
grep -q "differs from" "$work/equal.log" || fail "the export could not be compared" "$work/equal.log"

echo "README fine-tuning: 20 steps, loss ${losses[0]} -> ${losses[19]}; exported to an HF folder that imports again"
