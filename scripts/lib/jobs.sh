#!/usr/bin/env bash
# Shared by the stage scripts that run nj parallel jobs and a merge (scripts/feats/make_fbank.sh,
# scripts/spk/extract_embeddings.sh; scoring may use jobs_lock). Source it where the script would
# source utils/parse_options.sh, with ${root} (the project root), ${help_message} and the option
# variables set (${python}: --python, may be empty).  It parses the options (shifting them off
# the script's arguments), sets ${python} to the interpreter utils/spkflow_python.sh chooses and
# defines log and the jobs_* functions:
#
#   jobs_command="$0 $*"                            # first: names the lock's holder
#   . "${root}/scripts/lib/jobs.sh"
#   [ $# -eq 2 ] || jobs_usage                      # prints ${help_message}, exits 1
#   jobs_lock "${out}"                              # one run per output dir, released on any exit
#   jobs_remove_on_exit "${out}/.tmp"               # removed on any exit too (after jobs_lock)
#   nj=$(jobs_clamp_nj "${nj}" "${data}/utt2spk")   # no more jobs than utterances
#   ${cmd} JOB=1:"${nj}" "${out}/log/x.JOB.log" ... || { jobs_report_failed "${out}/log/x"; exit 1; }

# shellcheck disable=SC2154  # root and help_message are the sourcing script's
. "${root}/utils/parse_options.sh"
spkflow_python=${python:-}   # --python wins; else utils/spkflow_python.sh chooses
. "${root}/utils/spkflow_python.sh"
python=${spkflow_python}

# Time-stamped message on stderr, naming the calling script, line and function.
log() {
    local fname=${BASH_SOURCE[1]##*/}
    echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*" >&2
}

# jobs_usage: the script's ${help_message} on stderr, exit 1 (wrong number of arguments).
jobs_usage() {
    # shellcheck disable=SC2154  # the sourcing script's usage text
    echo "${help_message}" >&2
    exit 1
}

# jobs_clamp_nj NJ UTT2SPK: prints NJ, or the number of utterances when there are fewer.
jobs_clamp_nj() {
    local nj=$1 num_utts
    num_utts=$(wc -l < "$2")
    if [ "${nj}" -gt "${num_utts}" ]; then
        log "nj=${nj} is more than the ${num_utts} utterances of $(dirname "$2"): using nj=${num_utts}"
        nj=${num_utts}
    fi
    echo "${nj}"
}

# jobs_report_failed LOG_PREFIX: for each LOG_PREFIX.*.log of a failed or unfinished job, names
# the log and shows its ERROR lines (or its tail).
jobs_report_failed() {
    local l
    for l in "$1".*.log; do
        if grep -q "ERROR" "${l}" 2>/dev/null || ! grep -q "Ended (code 0)" "${l}" 2>/dev/null; then
            log "Error: job failed, see ${l}:"
            grep "ERROR" "${l}" | head -n 3 >&2 || tail -n 5 "${l}" >&2 || true
        fi
    done
}

# jobs_remove_on_exit PATH...: removed (rm -rf) when the script exits, however it exits; needs jobs_lock first.
_jobs_remove=()
jobs_remove_on_exit() {
    _jobs_remove+=("$@")
}

# jobs_lock DIR: lock DIR for this script (spkflow/core/lock.py), or exit 1 naming the run that holds
# it; a stale lock (its run was killed on this host) is taken over, saying so.  Released on
# every exit: normal, error (set -e) and INT/TERM/HUP.  The holder named is the script's pid as
# its caller knows it: utils/supervise.sh's ${spkflow_run_pid} (the pid that a signal stops
# whole), else $$.
jobs_lock() {
    _jobs_lock_dir=$1
    _jobs_lock_pid=${spkflow_run_pid:-$$}
    # armed before the lock exists (release only removes a lock naming that pid): a signal that
    # comes while the acquiring python runs is acted on when it returns, not swallowed, and releases
    trap '[ ${#_jobs_remove[@]} -eq 0 ] || rm -rf "${_jobs_remove[@]}"; "${python}" -m spkflow.bin.lock release --pid "${_jobs_lock_pid}" "${_jobs_lock_dir}" || true' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    trap 'exit 129' HUP
    "${python}" -m spkflow.bin.lock acquire --pid "${_jobs_lock_pid}" --command "${jobs_command:-$0}" \
        "${_jobs_lock_dir}" || exit 1
}
