#!/usr/bin/env bash
# Not a ctest (minutes): what an asynchronous checkpoint costs the steps it overlaps (issue 24: a
# step during an asynchronous save costs at most 1.2x a normal step), and what it saves against a
# synchronous save. Two runs of the same job side by side, one rank (a GPT of hidden 512, 6 layers,
# sequence 128: 19M parameters, 0.23 GB of parameters and AdamW moments per checkpoint), a save
# every SAVE_EVERY steps into a fresh directory:
#   async: checkpoint.async=true. Steps are sorted by the log's "written in the background while
#          step(s) A[-B] ran" into steps during a write and the others (the first 2 left out: warm-up);
#          the ratio of their mean step_time_ms (metrics.jsonl) is the figure; the save step's own
#          stall is the "copied to host memory in X ms" of each save;
#   sync:  checkpoint.async=false, the same steps; its "saved checkpoint ... in X ms" is the stall
#          an asynchronous save replaces.
#   benchmarks/async_checkpoint.sh BUILD_DIR [STEPS] [SAVE_EVERY]     (40, 8)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$1" && pwd)
steps=${2:-40} every=${3:-8}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$src/configs/tiny.yaml" --set model.hidden_size=512 --set model.num_layers=6
  --set model.num_attention_heads=8 --set model.seq_length=128 --set train.steps="$steps"
  --set train.log_interval=1 --set checkpoint.save_interval="$every")
for mode in async sync; do
  "$build/bin/pretrain_gpt" "${common[@]}" --set checkpoint.async=$([[ $mode == async ]] && echo true || echo false) \
    --set checkpoint.dir="$work/ckpt_$mode" --set train.output_dir="$work/$mode" >"$work/$mode.log" 2>&1 ||
    { echo "$mode run failed:"; tail -5 "$work/$mode.log"; exit 1; }
done
python3 - "$work" <<'EOF'
import json, re, statistics, sys
work = sys.argv[1]
def times(mode):
    out = {}
    for line in open(f"{work}/{mode}/metrics.jsonl"):
        j = json.loads(line)
        if "step_time_ms" in j: out[j["step"]] = j["step_time_ms"]
    return out
log = open(f"{work}/async.log").read()
during = set()
for a, b in re.findall(r"while steps? (\d+)(?:-(\d+))? ran", log):
    during.update(range(int(a), int(b or a) + 1))
t = times("async")
busy = [t[s] for s in sorted(t) if s in during]
normal = [t[s] for s in sorted(t) if s not in during and s > 2]
copy = [float(x) for x in re.findall(r"copied to host memory in (\d+) ms", log)]
sync = [float(x) for x in re.findall(r"saved checkpoint \S+ in (\d+) ms", open(f"{work}/sync.log").read())]
ts = times("sync")
sync_steps = [ts[s] for s in sorted(ts) if s > 2]
print(f"steps during a background write: {sorted(s for s in t if s in during)}")
print(f"async: {len(busy)} steps during a background write, mean {statistics.mean(busy):.1f} ms "
      f"(median {statistics.median(busy):.1f}); {len(normal)} other steps, mean {statistics.mean(normal):.1f} ms "
      f"(median {statistics.median(normal):.1f})")
print(f"ratio (step during a write / normal step): mean {statistics.mean(busy) / statistics.mean(normal):.3f}, "
      f"median {statistics.median(busy) / statistics.median(normal):.3f}")
print(f"save stall: async copy to host {statistics.mean(copy):.0f} ms per save ({len(copy)} saves); "
      f"sync save {statistics.mean(sync):.0f} ms per save ({len(sync)} saves); sync run's mean step "
      f"{statistics.mean(sync_steps):.1f} ms")
EOF
