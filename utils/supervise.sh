# shellcheck shell=bash
# Sourced first thing by spkflow's entry scripts (a recipe's run.sh, spk.sh, sid.sh, scripts/*/*.sh):
#
#     . utils/supervise.sh                # recipe scripts, run from the recipe dir
#     . "${root}/utils/supervise.sh"      # stage scripts
#
# The script then re-runs itself under `python -m spkflow.bin.supervise` (spkflow.core.procs),
# with `exec`, so the pid its caller knows is the supervisor's: SIGINT, SIGTERM or SIGHUP sent to
# that pid stops everything the script started (its children, run.pl / queue.pl / slurm.pl jobs,
# DataLoader workers) within SPKFLOW_STOP_GRACE seconds (default 5), after which what is left is
# killed (later while the trainer writes its checkpoint at the signal: spkflow.core.procs).
# Under the supervisor it sets
#
#     spkflow_run_pid    the pid to name as this run's (the supervisor's; $$ when unsupervised),
#                        e.g. as the holder of an output dir's lock (scripts/lib/jobs.sh)
#
# Not supervised: SPKFLOW_SUPERVISE=false (debugging), or a script that is not a file (bash -c).
# The interpreter needs the standard library only: SPKFLOW_PYTHON, else this checkout's .venv,
# else python3.  Works under `set -euo pipefail`; a script run with bash -x keeps -x.
# shellcheck disable=SC2034  # spkflow_run_pid is for the sourcing script (scripts/lib/jobs.sh reads it)
if [ "${SPKFLOW_SUPERVISOR:-}" = "${PPID}" ]; then
    spkflow_run_pid=${PPID}
elif [ "${SPKFLOW_SUPERVISE:-true}" != false ] && [ -f "$0" ]; then
    _spkflow_root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd -P)
    _spkflow_py=${SPKFLOW_PYTHON:-}
    if [ -z "${_spkflow_py}" ]; then
        _spkflow_py=python3
        [ -x "${_spkflow_root}/.venv/bin/python" ] && _spkflow_py=${_spkflow_root}/.venv/bin/python
    fi
    _spkflow_bash=("${BASH}")
    [[ $- == *x* ]] && _spkflow_bash+=(-x)
    exec env PYTHONPATH="${_spkflow_root}${PYTHONPATH:+:${PYTHONPATH}}" "${_spkflow_py}" -m spkflow.bin.supervise \
        --grace "${SPKFLOW_STOP_GRACE:-5}" --name "${0##*/}" -- "${_spkflow_bash[@]}" "$0" "$@"
else
    spkflow_run_pid=$$
fi
