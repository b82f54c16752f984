#!/usr/bin/env bash
# Install the Debian packages of a real single-node Slurm and Sun Grid Engine, used by the
# job-runner tests (test/schedulers/test_slurm_pl.py, test/schedulers/test_queue_pl.py) to check utils/slurm.pl
# and utils/queue.pl against the real schedulers.
#   sudo bash tools/install_schedulers.sh [--slurm-only|--sge-only]
# Idempotent and quick when everything is installed (it only asks dpkg). Needs root.
# The install does not configure or start any daemon: test/helpers/schedulers.py does that in a
# temporary state directory at test time and stops them afterwards.
set -euo pipefail

log() { echo "$(basename "$0"): $*"; }

want_slurm=true
want_sge=true
case "${1:-}" in
    "") ;;
    --slurm-only) want_sge=false ;;
    --sge-only) want_slurm=false ;;
    *) echo "usage: $0 [--slurm-only|--sge-only]" >&2; exit 1 ;;
esac

if [ "$(id -u)" != 0 ]; then
    echo "$(basename "$0"): must run as root (apt-get install)" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null || ! command -v dpkg-query >/dev/null; then
    echo "$(basename "$0"): needs a Debian/Ubuntu system (apt-get, dpkg-query)" >&2
    exit 1
fi

pkgs=()
${want_slurm} && pkgs+=(munge slurmctld slurmd slurm-client)
${want_sge} && pkgs+=(gridengine-master gridengine-exec gridengine-client)

missing=()
for p in "${pkgs[@]}"; do
    if ! dpkg-query -W -f='${Status}' "${p}" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("${p}")
    fi
done
if [ ${#missing[@]} -eq 0 ]; then
    log "already installed: ${pkgs[*]}"
    exit 0
fi
log "installing: ${missing[*]}"

export DEBIAN_FRONTEND=noninteractive
# Grid Engine's debconf questions: without them the master name is written empty and the
# cell is not configured (see test/helpers/schedulers.py for the rest of the single-host set-up).
if ${want_sge}; then
    host=$(hostname)
    debconf-set-selections <<EOF
gridengine-common shared/gridenginemaster string ${host}
gridengine-common shared/gridenginecell string default
gridengine-common shared/gridengineconfig boolean true
gridengine-client shared/gridenginemaster string ${host}
gridengine-client shared/gridenginecell string default
gridengine-client shared/gridengineconfig boolean true
gridengine-master shared/gridenginemaster string ${host}
gridengine-master shared/gridenginecell string default
gridengine-master shared/gridengineconfig boolean true
EOF
fi

# Keep the packages' maintainer scripts from starting daemons: the tests start their own,
# with their own configuration. Only add a policy if the system has none, and remove it after.
policy=/usr/sbin/policy-rc.d
own_policy=false
if [ ! -e "${policy}" ]; then
    printf '#!/bin/sh\nexit 101\n' > "${policy}"
    chmod 755 "${policy}"
    own_policy=true
fi
cleanup() { if ${own_policy}; then rm -f "${policy}"; fi; }
trap cleanup EXIT

install() {
    apt-get install -y -q --no-install-recommends \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@"
}
# Try with the current package lists first (fast); refresh them only when that fails.
if ! install "${missing[@]}"; then
    log "refreshing package lists (apt-get update)"
    apt-get update -q
    install "${missing[@]}"
fi

for p in "${missing[@]}"; do
    dpkg-query -W -f='${Status}' "${p}" | grep -q "install ok installed" || {
        echo "$(basename "$0"): package ${p} did not install" >&2
        exit 1
    }
done
log "done"
