# shellcheck shell=bash
# Sourced (not run) by spkflow's shell scripts: the one place that chooses the Python
# interpreter for spkflow.
#
#     spkflow_python=${python}          # optional: a script's own override (e.g. --python)
#     . "${root}/utils/spkflow_python.sh"
#     python=${spkflow_python}
#
# Sets spkflow_python to the first of:
#   1. ${spkflow_python}, when already set by the caller (a script's --python option),
#   2. ${SPKFLOW_PYTHON}, when set in the environment,
#   3. python, when it imports spkflow and kaldiio (e.g. path.sh activated the venv),
#   4. <root>/.venv/bin/python, when executable, where <root> is the directory above this
#      file with symbolic links resolved (so it works through a recipe's utils link, from any cwd),
#   5. python3.
# Exports PYTHONPATH with <root> first, so that whichever interpreter is chosen imports spkflow
# from the checkout this file belongs to, even when the active venv holds an editable install of
# another checkout (tools/setup.sh there).  Exports nothing else, leaves the caller's shell
# options alone and works under `set -euo pipefail`.

_spkflow_python_root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd -P)
case ":${PYTHONPATH:-}:" in
    ":${_spkflow_python_root}:"*) ;;  # already first
    *) export PYTHONPATH=${_spkflow_python_root}${PYTHONPATH:+:${PYTHONPATH}} ;;
esac
spkflow_python=${spkflow_python:-${SPKFLOW_PYTHON:-}}
if [ -z "${spkflow_python}" ]; then
    if command -v python >/dev/null 2>&1 && python -c 'import spkflow, kaldiio' >/dev/null 2>&1; then
        spkflow_python=python
    elif [ -x "${_spkflow_python_root}/.venv/bin/python" ]; then
        spkflow_python=${_spkflow_python_root}/.venv/bin/python
    else
        spkflow_python=python3
    fi
fi
unset _spkflow_python_root
