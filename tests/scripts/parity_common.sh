# shellcheck shell=bash disable=SC2154 # mpiexec, pretrain, common and work come from the sourcing script
# Sourced by the trainer parity scripts (trainer_mla.sh, trainer_deepseek.sh, trainer_mtp.sh,
# trainer_overlap_update.sh, hf_deepseek_v3_mtp.sh): run a layout and compare its logged losses and
# gradient norms with a reference run's. The caller sets
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

# The metrics compare holds to the loss's tolerance; the gradient norm is compared after them, to
# its own. A caller may add losses (trainer_mtp.sh: loss mtp_loss).
parity_losses=(loss)

# values RUN: one line per step RUN logged: the step, each of parity_losses, the gradient norm.
values() {
  local out key
  out=$(field "$1" step)
  for key in "${parity_losses[@]}" grad_norm; do out=$(paste -d' ' <(echo "$out") <(field "$1" "$key")); done
  echo "$out"
}

# compare REF RUN TOL [GRAD_TOL [MIN_STEPS]]: each step RUN logged against the same step of REF,
# relative: parity_losses within TOL, the gradient norm within GRAD_TOL (default TOL). At least
# MIN_STEPS steps (default 6; fewer for a run resumed part way), each one logged by REF too.
compare() {
  local ref=$1 run=$2 tol=$3 gtol=${4:-$3} min=${5:-6}
  awk -v name="$run" -v ref="$ref" -v tol="$tol" -v gtol="$gtol" -v min="$min" \
    -v keys="${parity_losses[*]} grad_norm" '
    function rel(a, b) { d = a - b; if (d < 0) d = -d; s = (a < 0 ? -a : a); return d / s }
    BEGIN { k = split(keys, key, " ") }
    NR == FNR { logged[$1] = $0; next }
    !($1 in logged) { printf "%s: step %s not logged by %s\n", name, $1, ref; bad = 1; next }
    { n++; split(logged[$1], r, " "); over = 0; said = ""
      for (i = 1; i <= k; i++) {
        x = rel(r[i + 1], $(i + 1)); if (x > worst[i]) worst[i] = x
        if (x > (i == k ? gtol : tol)) over = 1
        said = said sprintf(" %s %s vs %s", key[i], $(i + 1), r[i + 1]) }
      if (over) { printf "%s: step %s%s (tolerance %g / %g)\n", name, $1, said, tol, gtol; bad = 1 } }
    END { if (n < min) { printf "%s: %d steps compared\n", name, n; bad = 1 }
          if (bad) exit 1
          largest = ""; for (i = 1; i <= k; i++) largest = largest sprintf("%s%.2g", i > 1 ? " / " : "", worst[i])
          printf "%s: %d steps of %s equal %s within %g / %g (largest differences %s)\n", name, n, keys, ref, tol, gtol, largest }' \
    <(values "$ref") <(values "$run")
}
