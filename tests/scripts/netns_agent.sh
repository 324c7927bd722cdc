#!/usr/bin/env bash
# Open MPI's remote agent (--mca plm_rsh_agent) for "nodes" that are Linux network namespaces on
# this machine: where mpirun would run `ssh HOST COMMAND...`, this runs COMMAND inside HOST's
# namespace, with a UTS namespace of its own whose host name is the node's (so that every rank's
# host name, log lines and Open MPI's session directory are the node's, as on a real machine).
#   netns_agent.sh HOST COMMAND...
# NETNS_AGENT_MAP names a file of lines "HOST NAMESPACE HOSTNAME" (tests/scripts/multinode.sh
# writes it). Like ssh, the words of COMMAND are joined and run by a shell.
set -euo pipefail
host=${1:?usage: netns_agent.sh HOST COMMAND...}
shift
map=${NETNS_AGENT_MAP:?netns_agent.sh: NETNS_AGENT_MAP is not set}
read -r _ ns name < <(awk -v h="$host" '$1 == h' "$map") || {
  echo "netns_agent.sh: no node '$host' in $map" >&2
  exit 255
}
exec ip netns exec "$ns" unshare --uts /bin/sh -c 'hostname "$1" && exec /bin/sh -c "$2"' sh "$name" "$*"
