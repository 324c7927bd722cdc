#!/usr/bin/env bash
# Several nodes, for real, on one machine (issue 24, item 1). Two "nodes" are Linux network
# namespaces, each with a veth link into a bridge that lives in a third namespace, on private
# addresses that exist only inside these namespaces (so concurrent runs never collide: only the
# namespace names are global, and they carry this run's id). ONE Open MPI job is launched across
# them from a hostfile: mpirun runs inside node 0, and its remote agent (netns_agent.sh, instead of
# ssh) starts Open MPI's daemon inside node 1, each node with a host name of its own (UTS namespace).
# Ranks on one node talk over shared memory (vader), ranks on different nodes over TCP on the veth
# only (btl tcp,self,vader; btl_tcp_if_include and oob_tcp_if_include = the veth).
#
# Checked:
#  1. what each rank sees (node_groups, 2 nodes x 2 ranks): its host name, the launcher's local
#     rank and size, MPI's node map (node_map.hpp), and its groups, from the library's communicators
#     and from the rank grid's arithmetic: tp2 inside a node and dp across; at dp4 with ep2 and the
#     HSDP shard group of 2 (optimizer.sharding_group_size), ep and the shard group inside a node,
#     expert-dp and the replicas across;
#  2. pretrain_gpt at tp2 inside each node x dp2 across the nodes (parallel.node_local=tp), HSDP
#     at dp4 with the shard group of 2 inside each node (parallel.node_local=shard, ZeRO-3), and a
#     MoE model (4 experts, top-2) at ep2 inside each node x expert-dp 2 across
#     (parallel.node_local=ep) log the same 10 fp32 losses as one rank, within 1e-5 relative each
#     (trainer_parity.sh's tolerance); the trainer's node line names both hosts and the groups
#     inside and across;
#  3. the bytes node 1's veth link received during the tp2 x dp2 run: at least what dp's gradient
#     all-reduce must bring it from node 0 (10 steps x the parameters x 4 bytes);
#  4. parallel.node_local=dp at tp2 x dp2 is refused on every rank with exit 2 and one line that
#     names the key, the group's ranks and both nodes;
#  5. a lost node: after the first logged step every rank of node 1 is killed (kill -9); the job
#     ends within 60 s, not 0, and the launcher's message names a lost rank (2 or 3) and node 1;
#  6. the same loss under train_supervisor --elastic (docs/restart.md): node 1's ranks are killed
#     and the host probe stops listing node 1, as a scheduler would; the supervisor relaunches on
#     node 0 alone at dp2 (twice the micro-batches) from the latest checkpoint, and the job
#     finishes every step with one rank's losses (relative 1e-5) before and after the restart.
#
# Skipped (exit 77, one line) without Open MPI's launcher, without root or CAP_NET_ADMIN and
# CAP_SYS_ADMIN, without ip(8) and unshare(1), or where the kernel refuses namespaces or veth links.
#   multinode.sh SOURCE_DIR PRETRAIN_GPT NODE_GROUPS TRAIN_SUPERVISOR MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2 node_groups=$3 supervisor=$4
shift 4
mpiexec=("$@")
source "$src/scripts/mpi_launcher.sh"
skip() {
  echo "SKIPPED: $*"
  exit 77
}
kind=$(mpi_launcher_kind "${mpiexec[0]}")
[[ $kind == openmpi ]] || skip "namespace nodes need Open MPI's remote agent (plm_rsh_agent); ${mpiexec[0]} is $kind"
[[ $(id -u) -eq 0 ]] || skip "network namespaces need root (running as uid $(id -u))"
caps=$((16#$(awk '/^CapEff:/ { print $2 }' /proc/self/status)))
((caps >> 12 & 1 && caps >> 21 & 1)) || skip "network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN"
for tool in ip unshare; do command -v $tool >/dev/null || skip "network namespaces need $tool, not installed"; done

# This run's namespaces: <id>sw (the bridge), <id>n0 and <id>n1 (the nodes). Removed on exit, by name.
id=lpmn$$x$RANDOM
nodes=2 per_node=2
work=$(mktemp -d)
job=
cleanup() {
  [[ -n $job ]] && kill -9 "$job" 2>/dev/null || true
  [[ -n ${sup_pid:-} ]] && kill -9 "$sup_pid" 2>/dev/null || true
  for ns in "${id}sw" $(seq -f "${id}n%g" 0 $((nodes - 1))); do
    # Whatever still runs inside (a daemon of a failed job) goes with its node.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

setup_error=$(ip netns add "${id}sw" 2>&1) || skip "the kernel refuses network namespaces: ${setup_error//$'\n'/ }"
setup() {
  ip -n "${id}sw" link add br0 type bridge
  ip -n "${id}sw" link set br0 up
  for ((n = 0; n < nodes; n++)); do
    local ns=${id}n$n addr=10.77.0.$((n + 1))
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add mn0 netns "$ns" type veth peer name "p$n" netns "${id}sw"
    ip -n "${id}sw" link set "p$n" master br0
    ip -n "${id}sw" link set "p$n" up
    ip -n "$ns" addr add "$addr/24" dev mn0
    ip -n "$ns" link set mn0 up
    echo "$addr $ns ${id}-node$n" >>"$work/nodes.map"
    echo "$addr slots=$per_node" >>"$work/hostfile"
  done
  ip netns exec "${id}n0" unshare --uts true
}
setup_error=$(setup 2>&1) || skip "the kernel refuses veth links, bridges or UTS namespaces: ${setup_error//$'\n'/ }"
host() { echo "${id}-node$1"; }

# mpirun inside node 0 (host name node0), the daemons of the other nodes through the agent.
export NETNS_AGENT_MAP=$work/nodes.map OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
cluster=(ip netns exec "${id}n0" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$(host 0)"
  "${mpiexec[0]}" --hostfile "$work/hostfile" --map-by slot --bind-to none -x OMP_NUM_THREADS
  --mca plm_rsh_agent "$src/tests/scripts/netns_agent.sh"
  --mca oob_tcp_if_include mn0 --mca btl tcp,self,vader --mca btl_tcp_if_include mn0)
[[ $(id -u) -eq 0 ]] && cluster+=(--allow-run-as-root)
ranks=$((nodes * per_node))

# Bytes node N's veth link has received.
rx_bytes() { ip netns exec "${id}n$1" cat /sys/class/net/mn0/statistics/rx_bytes; }

# 1. What each rank sees.
# groups TENSOR EXPERT SHARDING_GROUP_SIZE: node_groups across the nodes, one JSON file per rank.
groups() {
  rm -rf "$work/groups" && mkdir "$work/groups"
  "${cluster[@]}" -np $ranks "$node_groups" "$work/groups" "$@" >"$work/groups.log" 2>&1 ||
    { echo "node_groups $* across the nodes failed:"; tail -20 "$work/groups.log"; exit 1; }
}
# expect RANK FIELD VALUE: rank's JSON FIELD (a jq-like path of keys) equals VALUE (compact JSON).
expect() {
  python3 - "$work/groups/rank_$1.json" "$2" "$3" <<'EOF'
import json, sys
got = json.load(open(sys.argv[1]))
for key in sys.argv[2].split("."):
    got = got[key]
if got != json.loads(sys.argv[3]):
    sys.exit(f"rank {sys.argv[1].rsplit('_', 1)[1][:-5]}: {sys.argv[2]} is {json.dumps(got)}, expected {sys.argv[3]}")
EOF
}
command -v python3 >/dev/null || skip "the per-rank checks need python3"
groups 2 1 0
for ((r = 0; r < ranks; r++)); do
  n=$((r / per_node)) l=$((r % per_node))
  expect $r host "\"$(host $n)\""
  expect $r launcher.source '"open-mpi"'
  expect $r launcher.local_rank $l
  expect $r launcher.local_size $per_node
  expect $r node $n
  expect $r node_local_rank $l
  expect $r node_size $per_node
  expect $r nodes "\"2 nodes x 2 ranks: $(host 0) ranks 0-1, $(host 1) ranks 2-3\""
  expect $r tp "[$((n * 2)),$((n * 2 + 1))]"
  expect $r grid.tp "[$((n * 2)),$((n * 2 + 1))]"
  expect $r dp "[$l,$((l + 2))]"
  expect $r grid.dp "[$l,$((l + 2))]"
  expect $r inside_node '{"tp":true,"dp":false,"shard":false}'
done
echo "2 nodes x 2 ranks, tp2: every rank on its node's host, local rank and size from Open MPI and from MPI's node map agree, tp {0,1} {2,3} inside a node, dp {0,2} {1,3} across"
groups 1 2 2
for ((r = 0; r < ranks; r++)); do
  n=$((r / per_node)) l=$((r % per_node))
  expect $r ep "[$((n * 2)),$((n * 2 + 1))]"
  expect $r grid.ep "[$((n * 2)),$((n * 2 + 1))]"
  expect $r shard "[$((n * 2)),$((n * 2 + 1))]"
  expect $r grid.shard "[$((n * 2)),$((n * 2 + 1))]"
  expect $r dp '[0,1,2,3]'
  expect $r inside_node '{"dp":false,"ep":true,"edp":false,"shard":true}'
done
echo "2 nodes x 2 ranks, dp4 ep2, HSDP shard groups of 2: ep and shard groups {0,1} {2,3} inside a node, expert-dp and dp across"

# 2-4. The trainer across the nodes against one rank.
common=(--config "$src/configs/tiny.yaml" --set train.steps=10 --set train.log_interval=1)
losses() { grep -o '"loss":[^,}]*' "$1/metrics.jsonl" | cut -d: -f2; }
compare() {  # compare NAME [REF]: the run's losses against the single-rank run REF (ref), relative 1e-5 each
  paste <(losses "$work/${2:-ref}") <(losses "$work/$1") | awk -v name="$1" '
    { n++; d = $1 - $2; if (d < 0) d = -d; s = ($1 < 0 ? -$1 : $1); if (d / s > worst) worst = d / s
      if (d > 1e-5 * s) { printf "%s: step %d loss %s vs single rank %s\n", name, n, $2, $1; bad = 1 } }
    END { if (n != 10) { printf "%s: %d losses, expected 10\n", name, n; bad = 1 }
          if (bad) exit 1
          printf "%s across 2 nodes: 10 losses equal the single-rank run within 1e-5 (largest difference %.2g)\n", name, worst }'
}
moe=(--set model.num_experts=4 --set model.moe_router_topk=2 --set model.moe_ffn_hidden_size=96
  --set model.moe_aux_loss_coeff=0.01)
for ref in ref ref_moe; do
  extra=()
  [[ $ref == ref_moe ]] && extra=("${moe[@]}")
  "${mpiexec[@]}" -np 1 "$pretrain" "${common[@]}" "${extra[@]}" --set train.output_dir="$work/$ref" \
    >"$work/$ref.log" 2>&1 || { echo "the single-rank run $ref failed:"; tail -20 "$work/$ref.log"; exit 1; }
done
train() {  # train NAME [--set ...]: pretrain_gpt on every rank of the nodes
  local name=$1
  shift
  "${cluster[@]}" -np $ranks "$pretrain" "${common[@]}" --set train.output_dir="$work/$name" "$@" \
    >"$work/$name.log" 2>&1 || { echo "$name across the nodes failed:"; tail -20 "$work/$name.log"; exit 1; }
}
before=$(rx_bytes 1)
train tp2dp2 --set parallel.tensor=2 --set parallel.node_local=tp
moved=$(($(rx_bytes 1) - before))
compare tp2dp2
grep -qF "nodes: 2 nodes x 2 ranks: $(host 0) ranks 0-1, $(host 1) ranks 2-3; inside a node: tp (2); across nodes: dp (2), shard (2)" \
  "$work/tp2dp2.log" || { echo "tp2dp2: no node line naming both hosts and the groups:"; grep "nodes:" "$work/tp2dp2.log"; exit 1; }
if grep -q "the launcher (.*) says local rank" "$work/tp2dp2.log"; then
  echo "tp2dp2: the launcher's local ranks disagree with MPI's node map:"
  grep "says local rank" "$work/tp2dp2.log"
  exit 1
fi
# Each step's dp all-reduce must hand every rank of node 1 node 0's part of each gradient element it
# holds, and node 1's two tp ranks hold every parameter at least once: at least 10 x parameters x 4
# bytes into node 1 (the log's count is rounded to 0.01M: its lower end is taken).
millions=$(grep -o 'GPT: [0-9.]*M parameters' "$work/ref.log" | head -1 | tr -dc 0-9.)
[[ -n $millions ]] || { echo "the single-rank run logs no parameter count"; exit 1; }
need=$(awk -v m="$millions" 'BEGIN { printf "%d", 10 * (m - 0.005) * 1e6 * 4 }')
((moved >= need)) || { echo "tp2dp2: node 1's veth link received $moved bytes, less than dp's gradients from node 0 ($need)"; exit 1; }
echo "tp2dp2: node 1's veth link received $moved bytes (dp's gradient all-reduce needs at least $need: 10 steps x ${millions}M parameters x 4 bytes)"

train hsdp --set optimizer.sharding=optim_grads_params --set optimizer.sharding_group_size=2 \
  --set parallel.node_local=shard
compare hsdp
grep -qF "inside a node: shard (2); across nodes: dp (4)" "$work/hsdp.log" ||
  { echo "hsdp: the node line does not put the shard group inside a node:"; grep "nodes:" "$work/hsdp.log"; exit 1; }

# PARALLEL_LOG_LEVEL=error silences the logs; mpirun's own box about the exit status may follow.
train moe "${moe[@]}" --set parallel.expert=2 --set parallel.node_local=ep
compare moe ref_moe
grep -qF "inside a node: ep (2); across nodes: dp (4), edp (2), shard (4)" "$work/moe.log" ||
  { echo "moe: the node line does not put the ep group inside a node:"; grep "nodes:" "$work/moe.log"; exit 1; }

rc=0
PARALLEL_LOG_LEVEL=error "${cluster[@]}" -x PARALLEL_LOG_LEVEL -np $ranks "$pretrain" "${common[@]}" \
  --set parallel.tensor=2 --set parallel.node_local=dp --set train.output_dir="$work/refused" \
  >"$work/refused.log" 2>"$work/refused.err" || rc=$?
expected="config: parallel.node_local = dp: group dp (world ranks 0,2) spans nodes (2 nodes x 2 ranks: $(host 0) ranks 0-1, $(host 1) ranks 2-3)"
if [[ $rc -ne 2 || $(grep -Fxc "$expected" "$work/refused.err") -ne 1 ]] || grep -Eq "fatal|critical|\[error\]" "$work/refused.err"; then
  echo "parallel.node_local=dp at tp2 x dp2: exit $rc (expected 2), stderr (expected the one line '$expected'):"
  cat "$work/refused.err" "$work/refused.log" | head -20
  exit 1
fi
echo "parallel.node_local=dp at tp2 x dp2: refused with exit 2 and one line: $expected"

# 5. A lost node: every rank of node 1 killed once the job has logged a step.
"${cluster[@]}" -np $ranks "$pretrain" "${common[@]}" --set parallel.tensor=2 --set train.steps=100000 \
  --set train.output_dir="$work/lost" >"$work/lost.log" 2>&1 &
job=$!
for ((i = 0; i < 600; i++)); do
  grep -q "step  *1/" "$work/lost.log" && break
  kill -0 $job 2>/dev/null || { echo "lost node: the job ended before its first step:"; tail -20 "$work/lost.log"; exit 1; }
  sleep 0.1
done
lost=()
for pid in $(ip netns pids "${id}n1"); do
  grep -qz '^OMPI_COMM_WORLD_RANK=' "/proc/$pid/environ" 2>/dev/null && lost+=("$pid")
done
((${#lost[@]} == per_node)) || {
  echo "lost node: found ${#lost[@]} ranks in node 1's namespace, expected $per_node:"
  ps -o pid,args -p "$(ip netns pids "${id}n1" | paste -sd,)" | cut -c1-120
  exit 1
}
start=$SECONDS
kill -9 "${lost[@]}"
for ((i = 0; i < 600; i++)); do
  kill -0 $job 2>/dev/null || break
  sleep 0.1
done
if kill -0 $job 2>/dev/null; then
  echo "lost node: the job still runs 60 s after node 1's ranks were killed"
  exit 1
fi
rc=0
wait $job || rc=$?
job=
took=$((SECONDS - start))
((rc != 0)) || { echo "lost node: the job exited 0"; exit 1; }
grep -qE "process rank [23] .*on node 10\.77\.0\.2" "$work/lost.log" ||
  { echo "lost node: no message naming a rank of node 1:"; grep -v "step " "$work/lost.log" | tail -20; exit 1; }
echo "lost node: killing node 1's ranks ended the job in ${took} s (exit $rc): $(grep -oE "process rank [23] .*on node [^ ]*" "$work/lost.log")"

# 6. The supervisor survives the lost node: it relaunches on the node it still has.
steps=30
"${mpiexec[@]}" -np 1 "$pretrain" "${common[@]}" --set train.steps=$steps --set train.output_dir="$work/ref30" \
  >"$work/ref30.log" 2>&1 || { echo "the single-rank run ref30 failed:"; tail -20 "$work/ref30.log"; exit 1; }
printf '10.77.0.1 slots=2\n10.77.0.2 slots=2\n' >"$work/alive"
sup_cluster=("${cluster[@]}")
for i in "${!sup_cluster[@]}"; do [[ ${sup_cluster[$i]} == "$work/hostfile" ]] && sup_cluster[$i]='{hostfile}'; done
run=$work/supervised
"$supervisor" --elastic --hosts-cmd "cat '$work/alive'" --ranks-per-node 2 --min-ranks 2 --backoff 0 -- \
  "${sup_cluster[@]}" -np '{ranks}' "$pretrain" "${common[@]}" --set train.steps=$steps \
  --set train.output_dir="$run" --set checkpoint.dir="$run/ckpt" --set checkpoint.save_interval=2 \
  >"$run.out" 2>&1 &
sup_pid=$!
for _ in $(seq 1 1200); do
  [[ -f $run/ckpt/latest && -f $run/metrics.jsonl ]] && (($(wc -l <"$run/metrics.jsonl") >= 4)) && break
  kill -0 $sup_pid 2>/dev/null || { echo "supervised: ended before its first checkpoint:"; tail -20 "$run.out"; exit 1; }
  sleep 0.05
done
echo "10.77.0.1 slots=2   # node 1 is gone" >"$work/alive"
lost=()
for pid in $(ip netns pids "${id}n1"); do
  grep -qz '^OMPI_COMM_WORLD_RANK=' "/proc/$pid/environ" 2>/dev/null && lost+=("$pid")
done
((${#lost[@]} == per_node)) || { echo "supervised: found ${#lost[@]} ranks in node 1, expected $per_node"; exit 1; }
kill -9 "${lost[@]}"
status=0
for _ in $(seq 1 240); do kill -0 $sup_pid 2>/dev/null || break; sleep 0.5; done
kill -0 $sup_pid 2>/dev/null && { echo "supervised: still running 120 s after the node was lost:"; tail -20 "$run.out"; exit 1; }
wait $sup_pid || status=$?
sup_pid=
((status == 0)) || { echo "supervised: the supervisor exited $status:"; tail -30 "$run.out"; exit 1; }
grep -q "restart 1 of" "$run/restarts.log" || { echo "supervised: no restart logged:"; cat "$run/restarts.log"; exit 1; }
grep -q "finished: step $steps of $steps" "$run/restarts.log" ||
  { echo "supervised: did not finish:"; cat "$run/restarts.log"; exit 1; }
grep -q "launch: 2 rank(s)" "$run.out" || { echo "supervised: the relaunch did not run on 2 ranks"; exit 1; }
step_losses() {
  awk 'match($0, /"loss":[^,}]*/) { l = substr($0, RSTART + 7, RLENGTH - 7)
       if (match($0, /"step":[0-9]+/)) print substr($0, RSTART + 7, RLENGTH - 7), l }' "$1"
}
checked=0
for m in "$run"/metrics.attempt_*.jsonl "$run/metrics.jsonl"; do
  n=$(join <(step_losses "$work/ref30/metrics.jsonl" | sort -k1,1) <(step_losses "$m" | sort -k1,1) | awk -v m="$m" '
    { n++; d = $2 - $3; if (d < 0) d = -d; s = $2 < 0 ? -$2 : $2
      if (d > 1e-5 * s) { printf "%s: step %d loss %s vs one rank %s\n", m, $1, $3, $2; bad = 1 } }
    END { if (bad) exit 1; print n }') || { echo "$n"; exit 1; }
  checked=$((checked + n))
done
after=$(step_losses "$run/metrics.jsonl" | wc -l)
echo "supervised: node 1 lost; relaunched on node 0 at dp2 for the last $after of $steps steps; $checked losses equal one rank's (relative 1e-5): $(grep "restart 1 of" "$run/restarts.log")"
