# shellcheck shell=bash disable=SC2154 # convert and work come from the sourcing script
# Sourced by the Hugging Face import/export scripts (hf_llama.sh, hf_deepseek_v3_mtp.sh, lora.sh).
# The caller sets
#   convert   the convert_checkpoint program,
#   work      a scratch folder it removes on exit.

# quiet LOG CMD...: run, keep the output in LOG, show its tail on failure.
quiet() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 || { echo "failed: $*"; tail -20 "$log"; exit 1; }
}

# expect_error NAME FRAGMENT ARGS...: convert_checkpoint ARGS ends with exit 1 and one line that
# holds FRAGMENT; the line is shown.
expect_error() {
  local name=$1 fragment=$2
  shift 2
  local status=0
  # Under a timeout: each refusal comes at once (num_hidden_layers 1e9 used to run 65 s into an OOM kill).
  timeout 30 "$convert" "$@" >"$work/$name.out" 2>"$work/$name.err" || status=$?
  if [[ $status -ne 1 || $(wc -l <"$work/$name.err") -ne 1 ]] || ! grep -qF -- "$fragment" "$work/$name.err"; then
    echo "$name: expected exit 1 and one line with '$fragment', got exit $status:"
    cat "$work/$name.err"
    exit 1
  fi
  echo "$name: $(cat "$work/$name.err")"
}
