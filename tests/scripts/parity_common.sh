# shellcheck shell=bash disable=SC2154 # mpiexec, pretrain, common and work come from the sourcing script
# Sourced by the trainer parity scripts (trainer_mla.sh, trainer_deepseek.sh, trainer_mtp.sh,
# trainer_overlap_update.sh, hf_deepseek_v3_mtp.sh, trainer_sharding.sh, trainer_muon.sh,
# trainer_context_parallel.sh, trainer_moe.sh, trainer_moe_routing.sh): run a layout and compare
# its logged losses, gradient norms and MoE expert biases with a reference run's. The caller sets
#   mpiexec   the launcher and its options (array),
#   pretrain  the pretrain_gpt program,
#   common    the options every run shares (array),
#   work      a scratch folder it removes on exit,
# and may set parity_losses (below).

# run NAME RANKS [OPTION...]: one training run into $work/NAME; its log is shown when it fails.
run() {
  local name=$1 ranks=$2
  shift 2
  "${mpiexec[@]}" -np "$ranks" "$pretrain" "${common[@]}" --set train.output_dir="$work/$name" "$@" \
    >"$work/$name.log" 2>&1 || { echo "$name failed:"; tail -20 "$work/$name.log"; exit 1; }
}

# field RUN KEY: KEY's value on every line of RUN's metrics.jsonl.
field() { grep -o "\"$2\":[^,}]*" "$work/$1/metrics.jsonl" | cut -d: -f2; }

# What compare holds to the loss's tolerance (parity_losses) and to the gradient norm's
# (parity_norms). A caller may add losses (trainer_mtp.sh: loss mtp_loss) or compare the losses
# alone (trainer_sharding.sh: parity_norms=()).
parity_losses=(loss)
parity_norms=(grad_norm)

# values RUN: one line per step RUN logged: the step, each of parity_losses, each of parity_norms.
values() {
  local out key
  out=$(field "$1" step)
  for key in "${parity_losses[@]}" "${parity_norms[@]}"; do
    out=$(paste -d' ' <(echo "$out") <(field "$1" "$key"))
  done
  echo "$out"
}

# compare REF RUN TOL [GRAD_TOL [MIN_STEPS]]: each step RUN logged against the same step of REF,
# relative: parity_losses within TOL, parity_norms within GRAD_TOL (default TOL). At least
# MIN_STEPS steps (default 6; fewer for a run resumed part way), each one logged by REF too.
compare() {
  local ref=$1 run=$2 tol=$3 gtol=${4:-$3} min=${5:-6}
  awk -v name="$run" -v ref="$ref" -v tol="$tol" -v gtol="$gtol" -v min="$min" \
    -v losses="${#parity_losses[@]}" -v keys="${parity_losses[*]} ${parity_norms[*]}" '
    function rel(a, b) { d = a - b; if (d < 0) d = -d; s = (a < 0 ? -a : a); return d / s }
    BEGIN { k = split(keys, key, " ") }
    NR == FNR { logged[$1] = $0; next }
    !($1 in logged) { printf "%s: step %s not logged by %s\n", name, $1, ref; bad = 1; next }
    { n++; split(logged[$1], r, " "); over = 0; said = ""
      for (i = 1; i <= k; i++) {
        x = rel(r[i + 1], $(i + 1)); if (x > worst[i]) worst[i] = x
        if (x > (i > losses ? gtol : tol)) over = 1
        said = said sprintf(" %s %s vs %s", key[i], $(i + 1), r[i + 1]) }
      if (over) { printf "%s: step %s%s (tolerance %g / %g)\n", name, $1, said, tol, gtol; bad = 1 } }
    END { if (n < min) { printf "%s: %d steps compared\n", name, n; bad = 1 }
          if (bad) exit 1
          names = largest = ""
          for (i = 1; i <= k; i++) {
            names = names (i > 1 ? " " : "") key[i]; largest = largest sprintf("%s%.2g", i > 1 ? " / " : "", worst[i]) }
          printf "%s: %d steps of %s equal %s within %g / %g (largest differences %s)\n", name, n, names, ref, tol, gtol, largest }' \
    <(values "$ref") <(values "$run")
}

# compare_field REF RUN KEY [MIN_STEPS]: compare for KEY alone, relative 1e-5 (trainer_moe.sh's
# resumed runs compare their losses so).
compare_field() {
  local parity_losses=("$3") parity_norms=()
  compare "$1" "$2" 1e-5 1e-5 "${4:-6}"
}

# The MoE expert bias (moe_expert_bias in metrics.jsonl): bias RUN [STEPS] prints RUN's last STEPS
# (6) logged biases; same_bias REF RUN [STEPS]: RUN's equal REF's at each of those steps, and one
# value over the ranks (moe_expert_bias_spread 0).
bias() { grep -o '"moe_expert_bias":\[\[[]0-9.e,[-]*\]\]' "$work/$1/metrics.jsonl" | tail -"${2:-6}"; }
same_bias() {
  local steps=${3:-6}
  [[ $(bias "$2" "$steps" | wc -l) == "$steps" ]] || { echo "$2: no moe_expert_bias in every line"; exit 1; }
  diff <(bias "$1" "$steps") <(bias "$2" "$steps") >/dev/null ||
    { echo "$2: expert bias differs from $1:"; paste -d'\n' <(bias "$1" "$steps") <(bias "$2" "$steps"); exit 1; }
  field "$2" moe_expert_bias_spread | awk -v name="$2" '$1 != 0 { print name ": bias differs between ranks by " $1; exit 1 }'
  echo "$2: expert bias equal to $1's at every step and on every rank"
}
