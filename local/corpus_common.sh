# Shared by local/<corpus>.sh (sourced, not run): logging, the project's Python, the
# "corpus missing -> try to download -> else say which db.sh variable to set" rule, validation.
# Expects: set -euo pipefail, and the options download / download_timeout declared.

log() {
    local fname=${BASH_SOURCE[1]##*/}
    echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"
}

spkflow_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "${spkflow_root}/utils/spkflow_python.sh"   # $SPKFLOW_PYTHON, else python (path.sh's venv), else .venv
python=${spkflow_python}
export PYTHONPATH=${spkflow_root}${PYTHONPATH:+:${PYTHONPATH}}
export LC_ALL=C

# ensure_corpus DIR MARKER VAR URL
#   Return if DIR/MARKER exists.  Otherwise, when ${download} is true and URL is given, clone the
#   public release into DIR (a reachability probe bounded by ${download_timeout} seconds first, so
#   a machine without network fails in seconds; the clone goes to DIR.download.PID and is renamed
#   only when complete).  Otherwise fail, naming the db.sh variable VAR to point at a copy.
ensure_corpus() {
    local dir=$1 marker=$2 var=$3 url=${4:-}
    [ -e "${dir}/${marker}" ] && return 0
    if [ -e "${dir}" ] && [ -n "$(ls -A "${dir}" 2>/dev/null)" ]; then
        log "Error: ${var}=${dir} exists but has no ${marker}: is it a copy of the corpus?"
        exit 1
    fi
    if ${download} && [ -n "${url}" ]; then
        local tmp=${dir%/}.download.$$
        log "${var}=${dir} not found: trying to download ${url} (connect timeout ${download_timeout}s)"
        if command -v git >/dev/null 2>&1 \
            && timeout "${download_timeout}" env GIT_TERMINAL_PROMPT=0 git ls-remote "${url}" HEAD >/dev/null 2>&1 \
            && mkdir -p "$(dirname "${tmp}")" \
            && GIT_TERMINAL_PROMPT=0 git -c http.lowSpeedLimit=1000 -c "http.lowSpeedTime=${download_timeout}" \
                clone --depth 1 --quiet "${url}" "${tmp}"; then
            rmdir "${dir}" 2>/dev/null || true
            mv "${tmp}" "${dir}"
            if [ -e "${dir}/${marker}" ]; then
                log "downloaded ${url} to ${dir}"
                return 0
            fi
            log "Error: the download of ${url} in ${dir} has no ${marker}"
            exit 1
        fi
        rm -rf "${tmp}"
        log "download of ${url} failed (no network, or the host is unreachable)"
    fi
    log "Error: corpus not found at ${var}=${dir}. Point ${var} at a copy of the corpus:" \
        "export ${var}=/path/to/copy before running, or edit db.sh (egs/TEMPLATE/spk1/db.sh)${url:+; the public release is ${url}}"
    exit 1
}

# validate_dir DIR: utils/validate_data_dir.sh (Kaldi's checks) without feats/text
validate_dir() {
    if [ -x "${spkflow_root}/utils/validate_data_dir.sh" ]; then
        "${spkflow_root}/utils/validate_data_dir.sh" --no-feats --no-text "$1"
    else  # same checks through the library
        "${python}" -c 'import sys; from spkflow.datadir import DataDir; DataDir(sys.argv[1]).validate(no_feats=True, no_text=True); print("validated", sys.argv[1])' "$1"
    fi
}

# prepare CORPUS CORPUS_DIR OUT [prepare_corpus options...]: write the data dir, trials when
# ${trials} is true, then validate it.
prepare() {
    local corpus=$1 corpus_dir=$2 out=$3
    shift 3
    local opts=("$@")
    if ${trials}; then
        opts+=(--trials --nontarget-ratio "${nontarget_ratio}" --seed "${trials_seed}")
    fi
    ${utt2dur} || opts+=(--no-utt2dur)
    log "${corpus}: ${corpus_dir} -> ${out}"
    "${python}" -m spkflow.bin.prepare_corpus "${opts[@]}" "${corpus}" "${corpus_dir}" "${out}"
    validate_dir "${out}"
}
