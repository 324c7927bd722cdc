#!/usr/bin/env bash
# scripts/plot_metrics.py on two small runs written here (train and eval lines as the trainer writes
# them, plus a malformed line, nulls, a line without the step, a repeated step and an unknown
# field): a PNG must be written (its 8-byte signature checked); a directory without metrics.jsonl
# must fail with exit 1 and one line naming it.
# Without python3 or matplotlib (Debian's python3-matplotlib, `install-deps.sh --with-plots`, which
# scripts/test.sh runs) the test is skipped (exit 77).
#   plot_metrics.sh SOURCE_DIR
set -euo pipefail
src=$1
script=$src/scripts/plot_metrics.py

# The script's own interpreter is Debian's /usr/bin/python3; accept any python3 that has matplotlib.
find_python() {
  python=
  for candidate in /usr/bin/python3 "$(command -v python3 || true)"; do
    if [[ -n $candidate && -x $candidate ]] && "$candidate" -c 'import matplotlib' 2>/dev/null; then
      python=$candidate
      return
    fi
  done
}
find_python
# A PYTHONPATH side folder meant for another test (PYTHONPATH=/tmp/tb for tensorboard_python brings
# a numpy that Debian's matplotlib cannot import) must not turn this test into a skip.
if [[ -z $python && -n ${PYTHONPATH:-} ]]; then
  unset PYTHONPATH
  find_python
fi
if [[ -z $python ]]; then
  echo "SKIPPED: no python3 with matplotlib (install python3-matplotlib: ./scripts/install-deps.sh --with-plots)"
  exit 77
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/run_a" "$work/run_b" "$work/empty"

cat >"$work/run_a/metrics.jsonl" <<'EOF'
{"step":1,"loss":5.55,"lr":1e-05,"grad_norm":1.2,"tokens_per_sec":1200.0,"step_time_ms":50.0,"mfu":0.31,"peak_flops_per_rank":1e11,"host_reads":2}
{"step":2,"loss":4.9,"lr":2e-05,"grad_norm":1.1,"tokens_per_sec":2100.0,"step_time_ms":30.0,"mfu":0.52,"peak_flops_per_rank":1e11,"host_reads":2}
{"step":3,"loss":null,"lr":3e-05,"grad_norm":null,"tokens_per_sec":2150.0,"step_time_ms":29.0,"mfu":0.53,"peak_flops_per_rank":1e11,"host_reads":2,"loss_scale":65536.0,"skipped":true}
{"step":4,"loss":4.1,"lr":4e-05,"grad_norm":0.9,"tokens_per_sec":2120.0,"step_time_ms":29.5,"mfu":0.52,"peak_flops_per_rank":1e11,"host_reads":2}
{"step":4,"eval_loss":4.3}
{"step":5,"loss":3.6,"lr":5e-05,"grad_norm":0.8,"tokens_per_sec":2130.0,"step_time_ms":29.4,"mfu":0.52,"peak_flops_per_rank":1e11,"host_reads":2}
{"step":6,"loss":3.2,"lr":6e-05,"grad_norm
not json at all
{"loss":3.0}
[1,2,3]
{"step":"seven","loss":3.0}
EOF
cat >"$work/run_b/metrics.jsonl" <<'EOF'
{"step":1,"loss":5.54,"tokens_per_sec":900.0,"mfu":0.22}
{"step":2,"loss":5.0,"tokens_per_sec":1800.0}
{"step":3,"loss":4.4,"tokens_per_sec":true,"mfu":0.45}
{"step":4,"loss":3.9,"tokens_per_sec":1850.0,"mfu":0.46,"something_new":1}
{"step":4,"eval_loss":null}
{"step":2,"loss":4.95,"tokens_per_sec":1810.0,"mfu":0.44}
{"step":4,"eval_loss":4.0}
EOF

out=$work/compare.png
"$python" "$script" "$work/run_a" "$work/run_b/metrics.jsonl" --output "$out" 2>"$work/err"
cat "$work/err"
test -s "$out" || { echo "no PNG written"; exit 1; }
signature=$(head -c 8 "$out" | od -An -tx1 | tr -d ' \n')
[[ $signature == 89504e470d0a1a0a ]] || { echo "not a PNG: signature $signature"; exit 1; }
grep -q "run_a/metrics.jsonl: skipped 5 line" "$work/err" || { echo "expected 5 skipped lines in run_a"; exit 1; }
echo "wrote a PNG of $(stat -c %s "$out") bytes from two runs"

# A directory without metrics.jsonl: exit 1, one line that names it, no image.
set +e
"$python" "$script" "$work/run_a" "$work/empty" --output "$work/none.png" >"$work/out" 2>"$work/err"
rc=$?
set -e
cat "$work/err"
[[ $rc -eq 1 && $(wc -l <"$work/err") -eq 1 ]] && grep -q "empty: no metrics.jsonl" "$work/err" &&
  [[ ! -e $work/none.png ]] || { echo "expected exit 1 and one line for a directory without metrics.jsonl (rc $rc)"; exit 1; }
echo "plot_metrics: ok"
