#!/usr/bin/env bash
# Create the virtual environment used only by the Resemblyzer comparison (local/peer_resemblyzer.sh):
#   .venv_resemblyzer/  (gitignored) with Resemblyzer (its pretrained GE2E LSTM weights ship in the
#   wheel, nothing is downloaded at run time) and webrtcvad (wheels build of the same module).
# spkflow's own environment is not touched. With --share_project_venv true (default) the project
# venv's site-packages (torch, librosa, numpy, scipy, soundfile, kaldiio, spkflow's deps) are put
# on this venv's path *after* its own, so torch (~1 GB from PyPI) is not installed twice.
set -euo pipefail

log() {
    local fname=${BASH_SOURCE[1]##*/}
    echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"
}

venv=.venv_resemblyzer          # where the environment goes (relative to the recipe dir)
resemblyzer_version=0.1.4       # PyPI Resemblyzer (pretrained encoder in the wheel)
webrtcvad_version=2.0.14.post1  # PyPI webrtcvad-wheels (provides the `webrtcvad` module Resemblyzer imports)
share_project_venv=true         # reuse the project venv's packages (torch, librosa, ...) instead of installing them

help_message="Usage: $0 [--venv ${venv}] [--resemblyzer-version ${resemblyzer_version}] [--share-project-venv true|false]"

. utils/parse_options.sh
if [ $# -ne 0 ]; then
    echo "${help_message}" >&2
    exit 1
fi
case ${share_project_venv} in true | false) ;; *) echo "${help_message}" >&2; exit 1 ;; esac

MAIN_ROOT=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../../../.." && pwd)
project_python=${MAIN_ROOT}/.venv/bin/python
[ -x "${project_python}" ] || { log "Error: ${project_python} not found (the project venv)"; exit 1; }

if [ -x "${venv}/bin/python" ] && "${venv}/bin/python" -c 'import resemblyzer, webrtcvad, spkflow' >/dev/null 2>&1; then
    log "${venv} is ready"
    exit 0
fi
base_python=$("${project_python}" -c 'import sys, os; print(os.path.join(sys.base_prefix, "bin", "python3"))')
log "Creating ${venv} with ${base_python}"
"${base_python}" -m venv "${venv}"
own=$("${venv}/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')   # its site-packages
if ${share_project_venv}; then
    shared=$("${project_python}" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    # a .pth line appends the directory to sys.path, after the venv's own site-packages
    echo "${shared}" > "${own}/zz_project_venv.pth"
    "${venv}/bin/pip" install -q --no-deps "resemblyzer==${resemblyzer_version}" "webrtcvad-wheels==${webrtcvad_version}"
else
    "${venv}/bin/pip" install -q "webrtcvad-wheels==${webrtcvad_version}" librosa numpy scipy soundfile torch kaldiio pyyaml
    "${venv}/bin/pip" install -q --no-deps "resemblyzer==${resemblyzer_version}"
fi
# this checkout's spkflow (scoring, AudioReader): the project venv holds it as an editable install,
# whose import hook a plain path line does not carry over
echo "${MAIN_ROOT}" > "${own}/spkflow_checkout.pth"
"${venv}/bin/python" -c 'import resemblyzer, webrtcvad, spkflow; print("resemblyzer", resemblyzer.__file__)'
log "Successfully finished: ${venv}"
