#!/usr/bin/env bash
# The layout search through pretrain_gpt (issue 26, docs/planner.md "Search"): --plan --search on
# 4 ranks of the tiny model writes plan.json with the top layouts ranked by predicted step time, the
# first one's step time equals a plain --plan of that layout, and --search without --plan or
# --hardware is refused with one line.
#   plan_search.sh SOURCE_DIR PRETRAIN_GPT MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PARALLEL_LOG_LEVEL=warn
hw=$src/configs/hardware/dgx_a100_80gb.yaml
fail() {
  echo "FAIL: $1"
  [[ -n ${2:-} && -f $2 ]] && tail -20 "$2"
  exit 1
}

"$pretrain" --config "$src/configs/tiny.yaml" --set train.output_dir="$work/search" --plan --search \
  --world-size 4 --hardware "$hw" --top 4 >"$work/search.log" 2>&1 || fail "--search failed" "$work/search.log"
grep -q "layouts enumerated" "$work/search.log" || fail "no search summary" "$work/search.log"
# Ranked by time, at least two layouts, and the first layout's flags for a plain --plan.
python3 - "$work/search/plan.json" >"$work/first.txt" <<'PY' || fail "plan.json" "$work/search.log"
import json, sys
p = json.load(open(sys.argv[1]))
layouts = p["layouts"]
assert len(layouts) >= 2, layouts
times = [l["step_time_s"] for l in layouts]
assert times == sorted(times), times
assert p["search"]["rejected_by_rules"] > 0, p["search"]
f = layouts[0]
sets = [f"parallel.tensor={f['tensor']}", f"parallel.sequence_parallel={str(f['sequence_parallel']).lower()}",
        f"parallel.pipeline={f['pipeline']}", f"parallel.virtual_stages={f['virtual_stages']}",
        f"parallel.pipeline_schedule={f['pipeline_schedule']}", f"parallel.context={f['context']}",
        f"parallel.expert={f['expert']}", f"parallel.expert_tensor={f['expert_tensor']}",
        f"parallel.context_comm={f['context_comm']}",
        f"optimizer.sharding={f['sharding']}", f"optimizer.sharding_group_size={f['sharding_group_size']}",
        f"train.recompute={f['recompute']}", f"train.micro_batch_size={f['micro_batch_size']}"]
print(repr(f["step_time_s"]))
print(" ".join("--set " + s for s in sets))
PY
expected=$(sed -n 1p "$work/first.txt")
read -r -a sets <<<"$(sed -n 2p "$work/first.txt")"
"$pretrain" --config "$src/configs/tiny.yaml" --set train.output_dir="$work/plan" "${sets[@]}" --plan \
  --world-size 4 --hardware "$hw" >"$work/plan.log" 2>&1 || fail "--plan of the first layout failed" "$work/plan.log"
got=$(python3 -c "import json,sys; print(repr(json.load(open(sys.argv[1]))['step_time_s']))" "$work/plan/plan.json")
[[ "$got" == "$expected" ]] || fail "the first layout's searched time $expected != its --plan time $got"

# Refusals: one line each, exit 2.
for args in "--search --hardware $hw" "--plan --search --world-size 4"; do
  # shellcheck disable=SC2086
  if "$pretrain" --config "$src/configs/tiny.yaml" $args >"$work/refuse.log" 2>&1; then
    fail "accepted: $args"
  fi
  grep -q -- "--search needs --plan and --hardware" "$work/refuse.log" || fail "no reason for: $args" "$work/refuse.log"
done
echo "OK: search ranked $(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['layouts']))" "$work/search/plan.json") layouts; first = --plan ($got s)"
