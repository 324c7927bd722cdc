#!/usr/bin/env bash
# The library as a library: examples/custom_model (an encoder classifier that is not GPT, built
# from libparallel's public parts) is built against the *installed* package and trained
#   ref  1 rank,
#   big  tp2 x pp2 x dp2 (8 ranks) with ZeRO-3 (optim_grads_params), sequence parallelism, 1F1B,
# over 4 steps; their losses and gradient norms must agree within 1e-5 relative (fp32: only the order of reductions
# differs between the layouts). Then each layout resumes from the other's checkpoint of step 2 and
# its losses and gradient norms of steps 3 and 4 must equal the uninterrupted single-rank run's (same tolerance): the
# checkpoints reshard both ways, optimizer state included. Bad flags end with one line and exit 2.
#   custom_model.sh BUILD_DIR SOURCE_DIR CXX MPIEXEC...
set -euo pipefail
build_dir=$1 source_dir=$2 cxx=$3
shift 3
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$source_dir/examples/custom_model" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build" -j2 >/dev/null
exe=$work/build/custom_model
export LD_LIBRARY_PATH="$work/prefix/lib:$work/prefix/lib64:${LD_LIBRARY_PATH:-}"
# It must run on the installed libparallel, not the build tree's.
if ldd "$exe" | grep -q 'libparallel\.so'; then
  ldd "$exe" | grep 'libparallel\.so' | grep -q "$work/prefix" || { echo "custom_model does not use the installed libparallel"; exit 1; }
fi

run() {  # run NAME RANKS FLAGS...
  local name=$1 ranks=$2
  shift 2
  "${mpiexec[@]}" -np "$ranks" "$exe" --steps 4 --out "$work/$name" "$@" >"$work/$name.log" 2>&1 ||
    { echo "$name failed:"; tail -20 "$work/$name.log"; exit 1; }
}
field() { grep -o "\"$2\":[^,}]*" "$work/$1/metrics.jsonl" | cut -d: -f2; }  # field RUN NAME
steps() { field "$1" step | tr '\n' ' '; }

# compare NAME FIRST_STEP: NAME's losses and gradient norms against ref's from FIRST_STEP on,
# relative 1e-5 each. The gradient norm of a step checks its gradients directly; the loss checks
# the updates before it.
compare() {
  local name=$1 first=$2 what
  for what in loss grad_norm; do
    paste <(field ref $what | tail -n +"$first") <(field "$name" $what) | awk -v name="$name" -v first="$first" -v what=$what '
      { n++; d = $1 - $2; if (d < 0) d = -d; s = ($1 < 0 ? -$1 : $1); if (d / s > worst) worst = d / s
        if (d > 1e-5 * s) { printf "%s: step %d %s %s vs one rank %s (tolerance 1e-5)\n", name, first + n - 1, what, $2, $1; bad = 1 } }
      END { if (n != 5 - first) { printf "%s: %d values of %s, expected %d\n", name, n, what, 5 - first; bad = 1 }
            if (bad) exit 1
            printf "%s: %d values of %s equal the single-rank run within 1e-5 (largest difference %.2g)\n", name, n, what, worst }'
  done
}

big=(--tp 2 --pp 2 --sharding optim_grads_params --sequence-parallel --schedule 1f1b)
run ref 1 --save "$work/ckpt_ref" --save-at 2 --tensorboard "$work/tb"
run big 8 "${big[@]}" --save "$work/ckpt_big" --save-at 2
[[ $(steps ref) == "1 2 3 4 " ]] || { echo "ref logged steps $(steps ref)"; exit 1; }
compare big 1
# Not a test that cannot fail: the model learns, so a wrong gradient would show.
field ref loss | awk 'NR == 1 { first = $1 } END { if (!($1 < first)) { printf "ref: loss %s after 4 steps, not below %s\n", $1, first; exit 1 } }'
grep -q '"layout"' "$work"/ckpt_big/step_00000002/index.json
ls "$work"/tb/events.out.tfevents.* >/dev/null || { echo "ref wrote no TensorBoard event file"; exit 1; }

run big_from_ref 8 "${big[@]}" --load "$work/ckpt_ref"
run ref_from_big 1 --load "$work/ckpt_big"
for name in big_from_ref ref_from_big; do
  grep -q "resumed at step 2" "$work/$name.log" || { echo "$name did not resume at step 2"; tail -5 "$work/$name.log"; exit 1; }
  [[ $(steps "$name") == "3 4 " ]] || { echo "$name logged steps $(steps "$name")"; exit 1; }
  compare "$name" 3
done

# Bad input: one line naming the problem, exit 2.
bad() {  # bad EXPECTED_TEXT FLAGS...
  local want=$1 rc=0
  shift
  "${mpiexec[@]}" -np 1 "$exe" "$@" >"$work/bad.log" 2>&1 || rc=$?
  # One line from the program (the launcher may add its own lines about the exit status).
  [[ $rc == 2 && $(grep -c '^custom_model:' "$work/bad.log") == 1 ]] && grep -q -- "$want" "$work/bad.log" || { echo "custom_model $*: exit $rc"; cat "$work/bad.log"; exit 1; }
}
bad "unknown pipeline schedule 'zb-h2'" --schedule zb-h2
bad "unknown sharding mode 'zero3'" --sharding zero3
bad "does not divide 1 ranks" --tp 2
bad "zb-h1 splits the backward" --schedule zb-h1
bad "unknown flag --bogus (see --help)" --bogus 1
echo "custom_model: OK"
