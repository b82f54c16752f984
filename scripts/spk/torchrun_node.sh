#!/usr/bin/env bash
# One node's share of a multi-node training job: run torchrun with a c10d rendezvous whose
# endpoint every task of the Slurm job computes alike. Started once per task by
# `slurm.pl --num-nodes K` (scripts/spk/train.sh does that), never by hand outside a job.
#
#   scripts/spk/torchrun_node.sh [--python python] [--port 0] [--join-timeout 600] \
#       --nnodes K --nproc-per-node P -m spkflow.bin.train ARGS...
#
# What it guarantees:
#   * the rendezvous is torch's own (torchrun --rdzv_backend c10d): HEAD = the first host of
#     `scontrol show hostnames "$SLURM_JOB_NODELIST"` (never SLURM_LAUNCH_NODE_IPADDR, which
#     is the submit host), PORT = 20000 + job id mod 10000 (below Linux's ephemeral ports, and
#     two jobs sharing a node get different ports) unless --port, rdzv id = the job id;
#   * --max_restarts 0: a failing worker fails its torchrun, srun --kill-on-bad-exit then ends
#     the other tasks, so the job fails instead of hanging, and the next run resumes from
#     the checkpoint (spkflow.train.trainer);
#   * refuses to start, saying why, outside a Slurm job or when the job does not have K tasks
#     (a silent fallback to a local endpoint would make each node train alone).
# Node ranks are left to the rendezvous (torchrun ignores --node_rank under c10d); workers
# read RANK / LOCAL_RANK / WORLD_SIZE, never SLURM_PROCID.
set -euo pipefail

python=             # python interpreter (default: utils/spkflow_python.sh)
port=0              # rendezvous port (0: 20000 + SLURM_JOB_ID % 10000)
join_timeout=600    # seconds the first agent waits for the others to join
nnodes=             # K: tasks of the job, one torchrun agent each
nproc_per_node=1    # P: worker processes per task (GPUs per node, or CPU processes)

me=$(basename "$0")
usage() {
    echo "Usage: $0 [--python PY] [--port PORT] [--join-timeout S] --nnodes K --nproc-per-node P PROGRAM ARGS..." >&2
    echo "  e.g. (in a Slurm job of K tasks) $0 --nnodes 2 --nproc-per-node 4 -m spkflow.bin.train --config ..." >&2
    exit 1
}
die() { echo "${me}: error: $*" >&2; exit 1; }

# Options before the program; everything from the first unknown word on goes to torchrun.
while [ $# -gt 0 ]; do
    case "$1" in
        --python) python=$2; shift 2 ;;
        --port) port=$2; shift 2 ;;
        --join-timeout) join_timeout=$2; shift 2 ;;
        --nnodes) nnodes=$2; shift 2 ;;
        --nproc-per-node) nproc_per_node=$2; shift 2 ;;
        --help|-h) usage ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || usage
[[ "${nnodes}" =~ ^[1-9][0-9]*$ ]] || die "--nnodes '${nnodes}': want a positive integer"
[[ "${nproc_per_node}" =~ ^[1-9][0-9]*$ ]] || die "--nproc-per-node '${nproc_per_node}': want a positive integer"
[[ "${port}" =~ ^[0-9]+$ ]] || die "--port '${port}': want an integer"

[ -n "${SLURM_JOB_ID:-}" ] && [ -n "${SLURM_JOB_NODELIST:-}" ] && [ -n "${SLURM_PROCID:-}" ] \
    || die "not inside a Slurm job step (SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_PROCID unset): start it with slurm.pl --num-nodes ${nnodes}"
[ "${SLURM_NTASKS:-1}" = "${nnodes}" ] \
    || die "--nnodes ${nnodes} but Slurm job ${SLURM_JOB_ID} has ${SLURM_NTASKS:-1} task(s) (slurm.pl --num-nodes ${nnodes} gives ${nnodes})"

head=$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | head -n 1)
[ -n "${head}" ] || die "scontrol show hostnames '${SLURM_JOB_NODELIST}' named no host"
[ "${port}" -gt 0 ] || port=$((20000 + SLURM_JOB_ID % 10000))

if [ -z "${python}" ]; then
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    spkflow_python=
    # shellcheck source=utils/spkflow_python.sh
    . "${root}/utils/spkflow_python.sh"
    python=${spkflow_python}
fi

echo "${me}: task ${SLURM_PROCID} of ${SLURM_NTASKS:-1} on $(hostname): torchrun --nnodes ${nnodes}" \
    "--nproc_per_node ${nproc_per_node}, c10d rendezvous ${head}:${port} id ${SLURM_JOB_ID}" >&2
exec "${python}" -m torch.distributed.run --nnodes "${nnodes}" --nproc_per_node "${nproc_per_node}" \
    --rdzv_backend c10d --rdzv_endpoint "${head}:${port}" --rdzv_id "${SLURM_JOB_ID}" \
    --rdzv_conf "join_timeout=${join_timeout}" --max_restarts 0 "$@"
