# shellcheck shell=bash disable=SC2154 # mpiexec, pretrain, common and work come from the sourcing script
# Sourced by the trainer parity scripts (trainer_mla.sh, trainer_deepseek.sh): run a layout and
# compare its logged losses and gradient norms with a reference run's. The caller sets
#   mpiexec   the launcher and its options (array),
#   pretrain  the pretrain_gpt program,
#   common    the options every run shares (array),
#   work      a scratch folder it removes on exit.

# run NAME RANKS [OPTION...]: one training run into $work/NAME; its log is shown when it fails.
run() {
  local name=$1 ranks=$2
  shift 2
  "${mpiexec[@]}" -np "$ranks" "$pretrain" "${common[@]}" --set train.output_dir="$work/$name" "$@" \
    >"$work/$name.log" 2>&1 || { echo "$name failed:"; tail -20 "$work/$name.log"; exit 1; }
}

# field RUN KEY: KEY's value on every line of RUN's metrics.jsonl.
field() { grep -o "\"$2\":[^,}]*" "$work/$1/metrics.jsonl" | cut -d: -f2; }

# compare REF RUN TOL [GRAD_TOL]: RUN's losses and gradient norms against REF's, step by step,
# relative; at least 6 steps.
compare() {
  local ref=$1 run=$2 tol=$3 gtol=${4:-$3}
  paste <(field "$ref" loss) <(field "$run" loss) <(field "$ref" grad_norm) <(field "$run" grad_norm) |
    awk -v name="$run" -v tol="$tol" -v gtol="$gtol" '
    function rel(a, b) { d = a - b; if (d < 0) d = -d; s = (a < 0 ? -a : a); return d / s }
    { n++; l = rel($1, $2); g = rel($3, $4); if (l > worst) worst = l; if (g > gworst) gworst = g
      if (l > tol || g > gtol) { printf "%s: step %d loss %s grad norm %s vs %s %s (tolerance %g / %g)\n", name, n, $2, $4, $1, $3, tol, gtol; bad = 1 } }
    END { if (n < 6) { printf "%s: %d steps compared\n", name, n; bad = 1 }
          if (bad) exit 1
          printf "%s: %d losses and grad norms equal the one-rank run within %g / %g (largest differences %.2g / %.2g)\n", name, n, tol, gtol, worst, gworst }'
}
