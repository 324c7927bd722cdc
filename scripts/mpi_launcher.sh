#!/usr/bin/env bash
# The one place that knows how to drive an MPI launcher: Open MPI's mpirun/mpiexec and Hydra, the
# mpiexec of MPICH and its family (Intel MPI, MVAPICH2). Everything that starts ranks goes through
# it: the ctest launcher (cmake/ParallelMPILauncher.cmake runs this file at configure time), the test
# scripts (tests/scripts/*.sh source it), scripts/quickstart.sh and scripts/gpu_check.sh.
#
# As a command:  mpi_launcher.sh WHAT MPIEXEC   prints one item per line:
#   kind   openmpi | hydra | unknown
#   flags  flags for N ranks on one machine: oversubscribe the cores, no binding (several ranks per
#          core must not be pinned to the same one), run as root (CI containers)
#   env    VAR=VALUE the launcher needs in the environment for the same
#   tcp    flags that leave TCP as the ranks' only path to each other (no shared memory, no RDMA)
#   rank-var  the environment variable holding a rank's world rank
# Sourced:  mpi_launcher_kind MPIEXEC, mpi_launcher_flags MPIEXEC, ... (the same, as functions that
# print), mpi_env_flags MPIEXEC VAR... (flags that forward VARs to every rank), and
# mpi_rank_pids JOB_PID [RANK] (the rank processes a launcher started: Open MPI's are its children,
# Hydra's the children of its proxy).

mpi_launcher_kind() {
  local version
  version=$("$1" --version 2>&1 || true)
  if grep -qiE "open ?mpi|open-mpi|openrte" <<<"$version"; then
    echo openmpi
  elif grep -qiE "hydra|mpich|intel\(r\) mpi" <<<"$version"; then
    echo hydra
  else
    echo unknown
  fi
}

mpi_launcher_flags() {
  case $(mpi_launcher_kind "$1") in
    openmpi)
      echo --oversubscribe
      echo --bind-to
      echo none
      [[ $(id -u) -eq 0 ]] && echo --allow-run-as-root
      ;;
    hydra)  # runs any number of ranks on the local host and as root by default
      echo -bind-to
      echo none
      ;;
  esac
  return 0
}

mpi_launcher_env() {
  case $(mpi_launcher_kind "$1") in
    openmpi)
      echo OMPI_ALLOW_RUN_AS_ROOT=1
      echo OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
      echo OMPI_MCA_rmaps_base_oversubscribe=1
      ;;
  esac
  return 0
}

# TCP only. Open MPI: the ob1 point-to-point layer over the tcp and self transports. MPICH (ch4):
# every peer treated as remote (no shared memory), the network module on TCP whichever it is
# (UCX or libfabric).
mpi_launcher_tcp() {
  case $(mpi_launcher_kind "$1") in
    openmpi) printf '%s\n' --mca pml ob1 --mca btl tcp,self ;;
    hydra) printf '%s\n' -genv MPIR_CVAR_NOLOCAL 1 -genv UCX_TLS self,tcp -genv FI_PROVIDER tcp ;;
  esac
  return 0
}

mpi_launcher_rank_var() {
  case $(mpi_launcher_kind "$1") in
    openmpi) echo OMPI_COMM_WORLD_RANK ;;
    *) echo PMI_RANK ;;
  esac
}

mpi_env_flags() {  # mpi_env_flags MPIEXEC VAR...: forward these variables to every rank
  local exe=$1 kind var
  shift
  kind=$(mpi_launcher_kind "$exe")
  for var in "$@"; do
    case $kind in
      openmpi) printf '%s\n' -x "$var" ;;
      *) printf '%s\n' -genv "$var" "${!var}" ;;
    esac
  done
}

# The rank processes under JOB_PID (a launcher started in the background), world rank RANK only
# when given: the first descendants whose environment holds a world rank (Open MPI's or PMI's).
mpi_rank_pids() {
  local job=$1 rank=${2:-} pid env queue=("$1")
  while ((${#queue[@]})); do
    pid=${queue[0]}
    queue=("${queue[@]:1}")
    for child in $(pgrep -P "$pid" || true); do
      env=$(tr '\0' '\n' <"/proc/$child/environ" 2>/dev/null) || continue
      if ! grep -q "^OMPI_COMM_WORLD_RANK=\|^PMI_RANK=" <<<"$env"; then
        queue+=("$child")  # a launcher's helper (Hydra's proxy): the ranks are below it
      elif [[ -z $rank ]] || grep -qx "OMPI_COMM_WORLD_RANK=$rank\|PMI_RANK=$rank" <<<"$env"; then
        echo "$child"
      fi
    done
  done
  return 0
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -euo pipefail
  if [[ $# -ne 2 ]]; then
    echo "usage: mpi_launcher.sh kind|flags|env|tcp|rank-var MPIEXEC" >&2
    exit 2
  fi
  case $1 in
    kind) mpi_launcher_kind "$2" ;;
    flags) mpi_launcher_flags "$2" ;;
    env) mpi_launcher_env "$2" ;;
    tcp) mpi_launcher_tcp "$2" ;;
    rank-var) mpi_launcher_rank_var "$2" ;;
    *)
      echo "mpi_launcher.sh: unknown query '$1' (kind, flags, env, tcp, rank-var)" >&2
      exit 2
      ;;
  esac
fi
